//! `canary schedule`: when it fires, that runs never overlap, that a missed fire is caught up
//! once, that a failed run does not stop it, and that it stops gracefully.
//!
//! The loop is driven by tokio's paused clock through the scheduler's `Clock` seam, so hours of
//! schedule pass in milliseconds; one end-to-end test runs the real daemon for a few seconds.

use std::cell::{Cell, RefCell};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::Duration;

use canary::config::ScheduleConfig;
use canary::schedule::{
    Clock, Runner, Scheduler, Stop, missed_fire, next_fire, parse_expression, parse_timezone,
    sleep_until,
};
use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;

use crate::support::{LaneSpec, Project, Reply, TestServer, canary_with_env, text};

/// A wall clock that moves with tokio's (paused) time, and can be set forward or back.
#[derive(Clone)]
struct PausedClock {
    wall: DateTime<Utc>,
    started: tokio::time::Instant,
    /// How far the clock has been set, as an operator or NTP would.
    jumped: Rc<Cell<TimeDelta>>,
}

impl PausedClock {
    fn at(wall: DateTime<Utc>) -> PausedClock {
        PausedClock {
            wall,
            started: tokio::time::Instant::now(),
            jumped: Rc::new(Cell::new(TimeDelta::zero())),
        }
    }

    fn set_forward(&self, by: Duration) {
        self.jumped
            .set(self.jumped.get() + TimeDelta::from_std(by).unwrap());
    }
}

impl Clock for PausedClock {
    fn now(&self) -> DateTime<Utc> {
        self.wall + TimeDelta::from_std(self.started.elapsed()).unwrap() + self.jumped.get()
    }
}

fn utc(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

fn zone(name: &str) -> Tz {
    parse_timezone(name).unwrap()
}

fn config(cron: &str, catch_up: Duration, grace: Duration) -> ScheduleConfig {
    ScheduleConfig {
        cron: cron.to_string(),
        schedule: parse_expression(cron).unwrap(),
        timezone: Tz::UTC,
        catch_up,
        grace,
    }
}

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(60 * 60);

/// What the fake runs saw, shared with the test.
#[derive(Default)]
struct Runs {
    started: RefCell<Vec<DateTime<Utc>>>,
    running: Cell<usize>,
    most_at_once: Cell<usize>,
    finished: Cell<usize>,
    stopped: Cell<usize>,
}

impl Runs {
    fn started_at(&self) -> Vec<String> {
        self.started
            .borrow()
            .iter()
            .map(|t| t.format("%H:%M:%S").to_string())
            .collect()
    }
}

/// A run that takes `takes` of (paused) time and exits `exit`, or stops early when told to.
struct FakeRun {
    runs: Rc<Runs>,
    clock: PausedClock,
    takes: Duration,
    exit: i32,
}

impl FakeRun {
    fn new(clock: &PausedClock, takes: Duration) -> (FakeRun, Rc<Runs>) {
        let runs = Rc::new(Runs::default());
        let runner = FakeRun {
            runs: runs.clone(),
            clock: clock.clone(),
            takes,
            exit: 0,
        };
        (runner, runs)
    }
}

impl Runner for FakeRun {
    async fn run(&mut self, mut stop: Stop) -> std::io::Result<i32> {
        let runs = &self.runs;
        runs.started.borrow_mut().push(self.clock.now());
        runs.running.set(runs.running.get() + 1);
        runs.most_at_once
            .set(runs.most_at_once.get().max(runs.running.get()));
        let code = tokio::select! {
            () = tokio::time::sleep(self.takes) => {
                runs.finished.set(runs.finished.get() + 1);
                self.exit
            }
            () = stop.raised() => {
                runs.stopped.set(runs.stopped.get() + 1);
                130
            }
        };
        runs.running.set(runs.running.get() - 1);
        Ok(code)
    }
}

#[test]
fn a_nightly_time_in_berlin_is_two_utc_in_winter_and_one_utc_in_summer() {
    // Berlin moves from CET (UTC+1) to CEST (UTC+2) at 01:00 UTC on Sunday 2026-03-29.
    let schedule = parse_expression("0 0 3 * * *").unwrap();
    let berlin = zone("Europe/Berlin");
    let winter = next_fire(&schedule, berlin, utc("2026-03-27T12:00:00Z")).unwrap();
    assert_eq!(winter, utc("2026-03-28T02:00:00Z"));
    let summer = next_fire(&schedule, berlin, winter).unwrap();
    assert_eq!(summer, utc("2026-03-29T01:00:00Z"));
}

#[test]
fn a_crontab_line_fires_in_its_own_zone_on_the_days_it_names() {
    // Friday 2026-01-09, noon UTC; New York is on EST (UTC-5).
    let schedule = parse_expression("30 2 * * 1-5").unwrap();
    let new_york = zone("America/New_York");
    let fire = next_fire(&schedule, new_york, utc("2026-01-09T12:00:00Z")).unwrap();
    assert_eq!(fire, utc("2026-01-12T07:30:00Z"), "Monday 02:30 EST");
}

#[test]
fn a_local_time_skipped_by_the_spring_change_does_not_fire_that_day() {
    // 02:30 does not exist in Berlin on 2026-03-29 (02:00 CET jumps to 03:00 CEST).
    let schedule = parse_expression("0 30 2 * * *").unwrap();
    let fire = next_fire(
        &schedule,
        zone("Europe/Berlin"),
        utc("2026-03-28T12:00:00Z"),
    )
    .unwrap();
    assert_eq!(fire, utc("2026-03-30T00:30:00Z"));
}

#[test]
fn a_local_time_repeated_by_the_autumn_change_fires_once() {
    // 02:30 happens twice in Berlin on 2026-10-25: at 00:30 UTC (CEST) and 01:30 UTC (CET).
    let schedule = parse_expression("0 30 2 * * *").unwrap();
    let berlin = zone("Europe/Berlin");
    let first = next_fire(&schedule, berlin, utc("2026-10-24T12:00:00Z")).unwrap();
    assert_eq!(first, utc("2026-10-25T00:30:00Z"));
    let after_a_short_run = first + TimeDelta::minutes(5);
    let next = next_fire(&schedule, berlin, after_a_short_run).unwrap();
    assert_eq!(
        next,
        utc("2026-10-26T01:30:00Z"),
        "the next night, not 01:30 UTC"
    );
}

#[test]
fn the_missed_fire_is_the_latest_since_the_last_run_and_only_within_the_window() {
    let hourly = parse_expression("0 0 * * * *").unwrap();
    let now = utc("2026-01-10T10:20:00Z");
    let last_run = Some(utc("2026-01-10T07:00:05Z"));
    assert_eq!(
        missed_fire(&hourly, Tz::UTC, last_run, now, 4 * HOUR),
        Some(utc("2026-01-10T10:00:00Z"))
    );
    assert_eq!(
        missed_fire(&hourly, Tz::UTC, last_run, now, 10 * MINUTE),
        None
    );
    assert_eq!(missed_fire(&hourly, Tz::UTC, None, now, 4 * HOUR), None);
    let on_the_hour = utc("2026-01-10T10:00:00Z");
    assert_eq!(
        missed_fire(&hourly, Tz::UTC, last_run, on_the_hour, MINUTE),
        Some(on_the_hour),
        "a fire exactly now counts as missed"
    );
    let ran_since = Some(utc("2026-01-10T10:00:02Z"));
    assert_eq!(
        missed_fire(&hourly, Tz::UTC, ran_since, now, 4 * HOUR),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn runs_never_overlap_and_fires_passed_during_a_run_are_skipped_not_queued() {
    let clock = PausedClock::at(utc("2026-01-10T10:00:30Z"));
    let (mut runner, runs) = FakeRun::new(&clock, Duration::from_secs(150));
    let scheduler = Scheduler::new(&config("0 * * * * *", HOUR, HOUR), clock.clone());

    // Shutdown at 10:10:30, while the run that started at 10:10:00 is in progress.
    let shutdown = tokio::time::sleep(Duration::from_secs(600));
    scheduler.run(&mut runner, None, shutdown).await;

    assert_eq!(runs.most_at_once.get(), 1);
    assert_eq!(
        runs.started_at(),
        ["10:01:00", "10:04:00", "10:07:00", "10:10:00"]
    );
    assert_eq!(runs.finished.get(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_fire_missed_inside_the_catch_up_window_runs_once_at_start() {
    let clock = PausedClock::at(utc("2026-01-10T10:20:00Z"));
    let (mut runner, runs) = FakeRun::new(&clock, MINUTE);
    let scheduler = Scheduler::new(&config("0 0 * * * *", 4 * HOUR, MINUTE), clock.clone());

    // Down since the 07:00 run: the 08:00, 09:00 and 10:00 fires were missed.
    let last_run = Some(utc("2026-01-10T07:00:05Z"));
    scheduler
        .run(&mut runner, last_run, tokio::time::sleep(10 * MINUTE))
        .await;

    assert_eq!(runs.started_at(), ["10:20:00"]);
}

#[tokio::test(start_paused = true)]
async fn a_fire_missed_outside_the_catch_up_window_waits_for_the_next_one() {
    let clock = PausedClock::at(utc("2026-01-10T10:20:00Z"));
    let (mut runner, runs) = FakeRun::new(&clock, MINUTE);
    let scheduler = Scheduler::new(&config("0 0 * * * *", 10 * MINUTE, MINUTE), clock.clone());

    let last_run = Some(utc("2026-01-10T07:00:05Z"));
    scheduler
        .run(&mut runner, last_run, tokio::time::sleep(HOUR))
        .await;

    assert_eq!(runs.started_at(), ["11:00:00"]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_does_not_stop_the_schedule() {
    let clock = PausedClock::at(utc("2026-01-10T10:00:30Z"));
    let scheduler = Scheduler::new(&config("0 * * * * *", HOUR, MINUTE), clock);
    let attempts = Cell::new(0);
    let mut failing = |_stop: Stop| {
        attempts.set(attempts.get() + 1);
        let n = attempts.get();
        async move {
            if n % 2 == 0 {
                Err(std::io::Error::other("the executable is gone"))
            } else {
                Ok(2)
            }
        }
    };

    // Five fires, 10:01 to 10:05, before shutdown at 10:05:45.
    let shutdown = tokio::time::sleep(Duration::from_secs(315));
    scheduler.run(&mut failing, None, shutdown).await;

    assert_eq!(attempts.get(), 5);
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_a_run_waits_for_it_to_finish_within_grace() {
    let clock = PausedClock::at(utc("2026-01-10T10:59:50Z"));
    let (mut runner, runs) = FakeRun::new(&clock, Duration::from_secs(30));
    let scheduler = Scheduler::new(&config("0 0 * * * *", HOUR, MINUTE), clock.clone());

    // The run starts at 11:00:00; shutdown comes at 11:00:10.
    let shutdown = tokio::time::sleep(Duration::from_secs(20));
    scheduler.run(&mut runner, None, shutdown).await;

    assert_eq!(runs.finished.get(), 1);
    assert_eq!(runs.stopped.get(), 0);
    assert_eq!(
        clock.now(),
        utc("2026-01-10T11:00:30Z"),
        "returned as it ended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_that_outlives_grace_is_told_to_stop() {
    let clock = PausedClock::at(utc("2026-01-10T10:59:50Z"));
    let (mut runner, runs) = FakeRun::new(&clock, HOUR);
    let grace = Duration::from_secs(20);
    let scheduler = Scheduler::new(&config("0 0 * * * *", HOUR, grace), clock.clone());

    let shutdown = tokio::time::sleep(Duration::from_secs(20));
    scheduler.run(&mut runner, None, shutdown).await;

    assert_eq!(runs.stopped.get(), 1);
    assert_eq!(runs.finished.get(), 0);
    assert_eq!(
        clock.now(),
        utc("2026-01-10T11:00:30Z"),
        "stopped when grace ran out"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_no_run_in_progress_returns_at_once() {
    let clock = PausedClock::at(utc("2026-01-10T10:00:30Z"));
    let (mut runner, runs) = FakeRun::new(&clock, MINUTE);
    let scheduler = Scheduler::new(&config("0 0 3 * * *", HOUR, HOUR), clock.clone());

    scheduler
        .run(&mut runner, None, tokio::time::sleep(MINUTE))
        .await;

    assert!(runs.started_at().is_empty());
    assert_eq!(clock.now(), utc("2026-01-10T10:01:30Z"));
}

#[tokio::test(start_paused = true)]
async fn a_clock_set_forward_past_the_fire_is_noticed_within_a_minute() {
    let clock = PausedClock::at(utc("2026-01-10T10:00:00Z"));
    let fire = utc("2026-01-10T12:00:00Z");
    let set_forward = {
        let clock = clock.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            clock.set_forward(3 * HOUR);
            std::future::pending::<()>().await;
        }
    };
    let started = tokio::time::Instant::now();

    tokio::select! {
        () = sleep_until(&clock, fire) => {}
        () = set_forward => unreachable!(),
    }

    assert!(clock.now() >= fire);
    assert!(
        started.elapsed() <= Duration::from_secs(90),
        "{:?}",
        started.elapsed()
    );
}

/// Kills the daemon if a test fails before it has exited, so no scheduler outlives the test.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[tokio::test]
async fn the_daemon_runs_on_schedule_and_exits_0_on_sigterm_leaving_no_run_unfinished() {
    let server = TestServer::always(Reply::completion("Paris.", "test-model")).await;
    let project = Project::new(
        &["schedule:", "  cron: \"* * * * * *\"", "  grace: 5s"],
        &[LaneSpec::new("local", server.base_url())],
    );
    project.write_prompts(
        "set.yaml",
        "- id: capital\n  prompt: \"What is the capital of France?\"\n",
    );
    // Create the store before the daemon and its runs open it, so nobody migrates it at once.
    drop(project.store());
    let log_path = project.file("schedule.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_canary"))
            .arg("-c")
            .arg(project.path())
            .arg("schedule")
            .env_remove("FREE_LANE")
            .env_remove("CANARY_CONFIG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let log = || text(&std::fs::read(&log_path).unwrap_or_default());

    let waiting_since = std::time::Instant::now();
    while !project
        .store()
        .runs(5)
        .unwrap()
        .iter()
        .any(|run| run.status == "finished")
    {
        assert!(
            waiting_since.elapsed() < Duration::from_secs(8),
            "no run finished:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = nix::unistd::Pid::from_raw(daemon.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();

    let stopping_since = std::time::Instant::now();
    let status = loop {
        if let Some(status) = daemon.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopping_since.elapsed() < Duration::from_secs(5),
            "still running 5s after SIGTERM:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let log = log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("next run at"), "{log}");
    let runs = project.store().runs(100).unwrap();
    assert!(
        runs.iter().all(|run| run.status == "finished"),
        "{:?}\n{log}",
        runs.iter()
            .map(|run| (run.id, &run.status))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn without_a_schedule_section_it_exits_2_and_says_what_to_add() {
    let server = TestServer::always(Reply::completion("Paris.", "test-model")).await;
    let project = Project::new(&[], &[LaneSpec::new("local", server.base_url())]);

    let out = canary_with_env(&project, &["schedule"], &[]).await;

    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("no `schedule:` section") && err.contains("cron: \"0 0 3 * * *\""),
        "{err}"
    );
}
