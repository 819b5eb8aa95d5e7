//! The commands, one file each. Each returns the process exit code; errors that should exit 2
//! come back as `Err` and are printed once by `main`.

pub mod accept;
pub mod alert;
pub mod ask;
pub mod check;
pub mod diff;
pub mod history;
pub mod init;
pub mod prune;
pub mod report;
pub mod review;
pub mod run;
pub mod schedule;
pub mod store;

use std::path::Path;

use std::io::IsTerminal;

use anyhow::Context;

use crate::cli::{AlertCommand, Cli, ColorChoice, Command, StoreCommand};
use crate::config::Config;

/// Exit code: success.
pub const EXIT_OK: i32 = 0;
/// Exit code: usage, config or store error.
pub const EXIT_ERROR: i32 = 2;
/// Exit code: nothing drifted, but something could not be measured or answered.
pub const EXIT_UNANSWERED: i32 = 3;

/// Runs the parsed command line and returns the exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match &cli.command {
        Command::Ask(args) => ask::run(&cli, args).await,
        Command::Check(args) => check::run(&cli, args).await,
        Command::Run(args) => run::run(&cli, args).await,
        Command::Diff(args) => diff::run(&cli, args),
        Command::Accept(args) => accept::run(&cli, args).await,
        Command::Review(args) => review::run(&cli, args),
        Command::History(args) => history::run(&cli, args),
        Command::Report(args) => report::run(&cli, args),
        Command::Init(args) => init::run(args),
        Command::Prune(args) => prune::run(&cli, args),
        Command::Schedule => schedule::run(&cli).await,
        Command::Alert(AlertCommand::Test) => alert::test(&cli).await,
        Command::Store(StoreCommand::Copy(args)) => store::copy(&cli, args),
    }
}

/// Loads the config named on the command line.
pub fn load_config(path: &Path) -> anyhow::Result<Config> {
    if !path.exists() {
        anyhow::bail!(
            "config file {} not found: pass -c PATH, set CANARY_CONFIG, or start from canary.example.yaml",
            path.display()
        );
    }
    Config::load(path).context("invalid configuration")
}

/// Resolves on Ctrl-C or SIGTERM: how `run` and `schedule` learn they should stop.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Writes `text` to stdout. A reader that went away (`canary diff | head`) is not an error.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => Err(err.into()),
        _ => Ok(()),
    }
}

/// Whether to colour stdout: `--color`, then `NO_COLOR`, then whether stdout is a terminal.
pub fn color_enabled(choice: ColorChoice) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::io::stdout().is_terminal()
        }
    }
}

/// Reads an environment variable, as the router's `env` seam expects.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
