//! `canary schedule`: the foreground scheduler.
//!
//! Each fire runs `canary run` as a child process of this same executable: a scheduled run is
//! exactly what a user gets from the command line, takes the same store lock (so it never
//! overlaps a run started by hand either), and a crash in one run cannot take the scheduler down.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::ValueEnum;

use super::{EXIT_OK, load_config};
use crate::cli::Cli;
use crate::schedule::{Runner, Scheduler, Stop, SystemClock};
use crate::store::{Store, StoreLocation};

/// How long a run sent SIGTERM may take to commit what it has and exit before it is killed.
const TERM_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a running child is checked for exit. The runtime has no `process` support here,
/// and polling `try_wait` keeps the `Child` owned by us: it is reaped only here, so a signal we
/// send can never reach a pid the system has already reused.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Runs `canary schedule`.
pub async fn run(cli: &Cli) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let Some(schedule) = &config.schedule else {
        anyhow::bail!(
            "{} has no `schedule:` section, so canary schedule does not know when to run; \
             add one, e.g. `schedule: {{ cron: \"0 0 3 * * *\", timezone: UTC }}`",
            config.path.display()
        );
    };
    let last_run = last_run(&config.store)?;
    let mut runner = ProcessRunner::new(cli)?;
    Scheduler::new(schedule, SystemClock)
        .run(&mut runner, last_run, super::shutdown_signal())
        .await;
    Ok(EXIT_OK)
}

/// When the latest run on record started; none when there is no store or no run yet.
fn last_run(store: &StoreLocation) -> anyhow::Result<Option<DateTime<Utc>>> {
    // Opening would create an empty store; a store that is not there has no runs.
    if store.sqlite_path().is_some_and(|path| !path.exists()) {
        return Ok(None);
    }
    let runs = Store::open(store)
        .and_then(|store| store.runs(1))
        .context("cannot read the last run, needed to catch up a missed fire")?;
    let Some(latest) = runs.first() else {
        return Ok(None);
    };
    match DateTime::parse_from_rfc3339(&latest.started_at) {
        Ok(started) => Ok(Some(started.with_timezone(&Utc))),
        Err(err) => {
            tracing::warn!(
                "run {}: start time `{}` in {} is not an RFC 3339 time ({err}); \
                 no missed fire will be caught up",
                latest.id,
                latest.started_at,
                store
            );
            Ok(None)
        }
    }
}

/// Fires `canary -c <config> run` as a child process of this executable.
#[derive(Debug)]
struct ProcessRunner {
    /// This executable.
    exe: PathBuf,
    /// Everything after the executable: the config, forwarded log and colour options, `run`.
    args: Vec<OsString>,
}

impl ProcessRunner {
    /// The runner for this command line: same config (made absolute), verbosity and colour.
    fn new(cli: &Cli) -> anyhow::Result<ProcessRunner> {
        let exe = std::env::current_exe()
            .context("cannot find the canary executable to run on schedule")?;
        let config = std::path::absolute(&cli.config)
            .with_context(|| format!("cannot resolve config path {}", cli.config.display()))?;
        let mut args: Vec<OsString> = vec!["-c".into(), config.into_os_string()];
        if cli.verbose > 0 {
            args.push(format!("-{}", "v".repeat(usize::from(cli.verbose))).into());
        }
        if cli.quiet > 0 {
            args.push(format!("-{}", "q".repeat(usize::from(cli.quiet))).into());
        }
        if let Some(color) = cli.color.to_possible_value() {
            args.push("--color".into());
            args.push(color.get_name().into());
        }
        args.push("run".into());
        Ok(ProcessRunner { exe, args })
    }
}

impl Runner for ProcessRunner {
    async fn run(&mut self, mut stop: Stop) -> std::io::Result<i32> {
        let mut command = Command::new(&self.exe);
        command.args(&self.args).stdin(Stdio::null());
        // Its own process group: a Ctrl-C at the terminal reaches only the scheduler, which
        // then gives the run its grace period instead of the run stopping at once.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn()?;
        tracing::debug!("run started as pid {}", child.id());
        let status = tokio::select! {
            status = wait(&mut child) => status?,
            () = stop.raised() => {
                tracing::info!("sending SIGTERM to the run (pid {})", child.id());
                terminate(&mut child)?;
                match tokio::time::timeout(TERM_TIMEOUT, wait(&mut child)).await {
                    Ok(status) => status?,
                    Err(_) => {
                        tracing::warn!(
                            "the run (pid {}) did not exit within {} of SIGTERM; killing it",
                            child.id(),
                            humantime::format_duration(TERM_TIMEOUT)
                        );
                        child.kill()?;
                        wait(&mut child).await?
                    }
                }
            }
        };
        Ok(exit_code(status))
    }
}

/// Waits for `child` to exit without blocking the runtime.
async fn wait(child: &mut Child) -> std::io::Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Asks `child` to stop: SIGTERM, which `canary run` answers by committing what it has, marking
/// the run interrupted and exiting 130.
fn terminate(child: &mut Child) -> std::io::Result<()> {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        use nix::sys::signal::{Signal, kill};
        return kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM).map_err(Into::into);
    }
    child.kill()
}

/// The exit code of a finished child; a child killed by a signal gets 128 + the signal, as
/// shells report it.
fn exit_code(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
        return 128 + signal;
    }
    super::EXIT_ERROR
}
