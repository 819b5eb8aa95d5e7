//! When `canary schedule` fires, and the loop that fires it.
//!
//! Cron expressions are read the way their writers mean them (below); [`next_fire`] and
//! [`missed_fire`] say when, in the schedule's time zone; [`Scheduler`] fires a [`Runner`] at
//! those times, one run at a time, and stops gracefully. Time comes in through the [`Clock`]
//! seam so tests can drive the whole loop with tokio's paused clock.
//!
//! Two syntaxes are accepted: the cron crate's 6/7 fields (`sec min hour dom month dow [year]`)
//! and a plain 5-field crontab line (`min hour dom month dow`). The cron crate numbers the days
//! of the week from 1 = Sunday, a crontab from 0 = Sunday (1 = Monday). A numeric day of the
//! week is always read as a crontab user means it and rewritten to day names before the cron
//! crate sees it, so `1-5` is Monday to Friday in either syntax, never silently a day off.

use std::future::Future;
use std::pin::{Pin, pin};
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use chrono_tz::Tz;
use tokio::sync::watch;

use crate::config::ScheduleConfig;

/// Day names by crontab number (0 and 7 are both Sunday).
const DAYS: [&str; 8] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];

/// Parses a schedule expression; the error quotes the offending text and says what to write.
pub fn parse_expression(text: &str) -> Result<cron::Schedule, String> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let mut fields: Vec<String> = match fields.len() {
        // A crontab line has no seconds: fire at second 0.
        5 => std::iter::once("0")
            .chain(fields.iter().copied())
            .map(str::to_string)
            .collect(),
        6 | 7 => fields.iter().map(|f| f.to_string()).collect(),
        n => {
            return Err(format!(
                "cron expression `{text}` has {n} fields; expected a 5-field crontab line \
                 (min hour dom month dow, e.g. `0 3 * * *`) or 6/7 fields \
                 (sec min hour dom month dow [year], e.g. `0 0 3 * * *`)"
            ));
        }
    };
    fields[5] = day_names(&fields[5]).map_err(|why| format!("cron expression `{text}`: {why}"))?;
    let normalised = fields.join(" ");
    cron::Schedule::from_str(&normalised)
        .map_err(|err| format!("cron expression `{text}` is not valid: {err}"))
}

/// Parses an IANA time zone name.
pub fn parse_timezone(text: &str) -> Result<chrono_tz::Tz, String> {
    text.parse::<chrono_tz::Tz>().map_err(|_| {
        format!("unknown time zone `{text}`: expected an IANA name such as UTC, Europe/Berlin or America/New_York")
    })
}

/// Rewrites the numbers of a day-of-week field to day names, crontab-style.
fn day_names(field: &str) -> Result<String, String> {
    if !field.bytes().any(|b| b.is_ascii_digit()) {
        return Ok(field.to_string());
    }
    let mut days: Vec<usize> = Vec::new();
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => {
                let step: usize =
                    step.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                        format!("day-of-week step `{item}` is not a positive number")
                    })?;
                (range, step)
            }
            None => (item, 1),
        };
        let (first, last) = match range {
            "*" | "?" => (0, 6),
            _ => match range.split_once('-') {
                Some((a, b)) => (day_number(a, item)?, day_number(b, item)?),
                None if step > 1 => (day_number(range, item)?, 6),
                None => {
                    let day = day_number(range, item)?;
                    (day, day)
                }
            },
        };
        if first > last {
            return Err(format!(
                "day-of-week range `{item}` runs backwards; write it as a list (e.g. `FRI,SAT,SUN`)"
            ));
        }
        days.extend((first..=last).step_by(step));
    }
    let mut names: Vec<&str> = days.into_iter().map(|d| DAYS[d]).collect();
    names.dedup();
    let mut unique = Vec::new();
    for name in names {
        if !unique.contains(&name) {
            unique.push(name);
        }
    }
    Ok(unique.join(","))
}

/// A day given as a crontab number (0-7) or a name.
fn day_number(text: &str, item: &str) -> Result<usize, String> {
    if let Ok(number) = text.parse::<usize>() {
        return if number <= 7 {
            Ok(number)
        } else {
            Err(format!(
                "day of week `{number}` in `{item}` is out of range: use 0-7 (0 and 7 are Sunday, 1 is Monday) or names MON-SUN"
            ))
        };
    }
    DAYS.iter()
        .position(|d| d.eq_ignore_ascii_case(text))
        .ok_or_else(|| format!("`{text}` in `{item}` is not a day of the week"))
}

/// Longest single sleep while waiting for a fire. The wall clock can jump (NTP step, suspend,
/// an operator fixing the date) while a monotonic sleep cannot see it, so the wait wakes at
/// least this often to read the clock again.
pub const MAX_SLEEP_CHUNK: Duration = Duration::from_secs(60);

/// Most fires counted when reporting how many were skipped during a long run; an every-second
/// schedule behind an hour-long run should not spend time counting.
const SKIPPED_COUNT_CAP: usize = 10_000;

/// Where the scheduler reads the wall-clock time: the system clock in production, a clock
/// driven by tokio's paused time in tests.
pub trait Clock {
    /// The current wall-clock time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Waits until `clock` reads `when` or later.
///
/// Sleeps in chunks of at most [`MAX_SLEEP_CHUNK`], re-reading the clock after each, so a clock
/// set back does not fire early and a clock set forward (or a host waking from suspend) fires
/// within a minute instead of after the full monotonic wait.
pub async fn sleep_until(clock: &impl Clock, when: DateTime<Utc>) {
    loop {
        let left = match (when - clock.now()).to_std() {
            Ok(left) if !left.is_zero() => left,
            // Negative or zero: the time has come.
            _ => return,
        };
        tokio::time::sleep(left.min(MAX_SLEEP_CHUNK)).await;
    }
}

/// The first fire of `schedule`, read in `timezone`, strictly after `after`; `None` if the
/// expression never fires again (e.g. a year field in the past).
///
/// Fires are computed on the local calendar of `timezone` and returned in UTC, so `0 0 3 * * *`
/// in Europe/Berlin is 02:00 UTC in winter and 01:00 UTC in summer. Around daylight-saving
/// changes the cron crate's rules apply: a local time that does not exist (skipped by the spring
/// change) does not fire that day; a local time that happens twice (autumn) fires at its first
/// occurrence, and its second is chosen only when `after` lies in the repeated hour before it.
pub fn next_fire(
    schedule: &cron::Schedule,
    timezone: Tz,
    after: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    schedule
        .after(&after.with_timezone(&timezone))
        // An ambiguous local time yields both of its instants, the earlier first, and the
        // earlier one can lie before `after`; a couple of candidates is always enough.
        .take(3)
        .map(|fire| fire.with_timezone(&Utc))
        .find(|fire| *fire > after)
}

/// The latest fire of `schedule` in `(after, upto]`, if any.
pub fn last_fire_between(
    schedule: &cron::Schedule,
    timezone: Tz,
    after: DateTime<Utc>,
    upto: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    // The cron crate looks strictly before its starting point and fires are whole seconds, so
    // start one second past `upto` rounded down to include a fire exactly at `upto`.
    let start = upto.with_nanosecond(0).unwrap_or(upto) + TimeDelta::seconds(1);
    schedule
        .after(&start.with_timezone(&timezone))
        .rev()
        // Walking back, an ambiguous local time yields its later instant first, which can lie
        // after `upto`; a couple of candidates is always enough.
        .take(3)
        .map(|fire| fire.with_timezone(&Utc))
        .find(|fire| *fire <= upto)
        .filter(|fire| *fire > after)
}

/// The fire to catch up at start: the latest fire after `last_run` and at most `now`, if it is
/// no older than `catch_up`. Only the latest counts, so a long downtime runs once, not once per
/// missed fire. With no run on record there is nothing to catch up.
pub fn missed_fire(
    schedule: &cron::Schedule,
    timezone: Tz,
    last_run: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    catch_up: Duration,
) -> Option<DateTime<Utc>> {
    let fire = last_fire_between(schedule, timezone, last_run?, now)?;
    let age = (now - fire).to_std().unwrap_or(Duration::ZERO);
    (age <= catch_up).then_some(fire)
}

/// Raised by the [`Scheduler`] when the run in progress must stop: shutdown was asked and the
/// run did not finish within the grace period.
#[derive(Debug, Clone)]
pub struct Stop(watch::Receiver<bool>);

impl Stop {
    /// A stop signal and the sender that raises it (by sending `true`); for runners driven
    /// outside a [`Scheduler`], such as tests of a runner.
    pub fn channel() -> (watch::Sender<bool>, Stop) {
        let (raise, stop) = watch::channel(false);
        (raise, Stop(stop))
    }

    /// Resolves once the stop is raised.
    pub async fn raised(&mut self) {
        // An error means the scheduler is gone, and nobody is left to wait for the run: stop.
        let _ = self.0.wait_for(|raised| *raised).await;
    }

    /// Whether the stop has been raised.
    pub fn is_raised(&self) -> bool {
        *self.0.borrow()
    }
}

/// What the scheduler fires: one `canary run`, to completion.
///
/// Closures `FnMut(Stop) -> impl Future<Output = io::Result<i32>>` are runners, so tests can
/// count invocations and make runs take (paused) time.
pub trait Runner {
    /// Runs once and returns the run's exit code, or why it could not be started or awaited.
    /// When `stop` is raised the run must wind down promptly (committing what it has) and
    /// return.
    fn run(&mut self, stop: Stop) -> impl Future<Output = std::io::Result<i32>>;
}

impl<F, Fut> Runner for F
where
    F: FnMut(Stop) -> Fut,
    Fut: Future<Output = std::io::Result<i32>>,
{
    fn run(&mut self, stop: Stop) -> impl Future<Output = std::io::Result<i32>> {
        self(stop)
    }
}

/// Whether the loop goes on after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Schedule the next fire.
    Continue,
    /// Shutdown was asked; return.
    Stop,
}

/// The `canary schedule` loop: fires a [`Runner`] at each time of a cron schedule.
///
/// Runs are sequential, so they never overlap; fires that come due while a run is in progress
/// are skipped, not queued. A failed run is logged and the schedule goes on.
#[derive(Debug, Clone)]
pub struct Scheduler<C> {
    /// The expression as written, for the logs.
    cron: String,
    schedule: cron::Schedule,
    timezone: Tz,
    catch_up: Duration,
    grace: Duration,
    clock: C,
}

impl<C: Clock> Scheduler<C> {
    /// A scheduler for `config`, reading the time from `clock`.
    pub fn new(config: &ScheduleConfig, clock: C) -> Scheduler<C> {
        Scheduler {
            cron: config.cron.clone(),
            schedule: config.schedule.clone(),
            timezone: config.timezone,
            catch_up: config.catch_up,
            grace: config.grace,
            clock,
        }
    }

    /// Fires `runner` on schedule until `shutdown` resolves, then returns.
    ///
    /// `last_run` is when the latest run on record started; a fire missed since then runs once
    /// at start if it is within `catch_up`. On shutdown no further run starts; a run in
    /// progress gets up to `grace` to finish, then its [`Stop`] is raised and it is awaited.
    pub async fn run<R: Runner>(
        &self,
        runner: &mut R,
        last_run: Option<DateTime<Utc>>,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut shutdown = pin!(shutdown);
        tracing::info!(
            "scheduling `canary run` at `{}` in {}",
            self.cron,
            self.timezone
        );
        if self.catch_up(runner, last_run, shutdown.as_mut()).await == Next::Stop {
            return;
        }
        let mut after = self.clock.now();
        loop {
            let Some(fire) = next_fire(&self.schedule, self.timezone, after) else {
                tracing::warn!(
                    "`{}` never fires again after {}; nothing left to schedule",
                    self.cron,
                    self.local(after)
                );
                // Stay up until asked to stop, like any service with nothing to do.
                shutdown.as_mut().await;
                tracing::info!("shutting down");
                return;
            };
            let wait = (fire - self.clock.now()).to_std().unwrap_or(Duration::ZERO);
            tracing::info!(
                "next run at {} ({}), in {}",
                self.local(fire),
                self.timezone,
                rounded(wait)
            );
            tokio::select! {
                () = sleep_until(&self.clock, fire) => {}
                () = shutdown.as_mut() => {
                    tracing::info!("shutting down: no run in progress");
                    return;
                }
            }
            tracing::info!("starting the run due at {}", self.local(fire));
            if self.run_once(runner, shutdown.as_mut()).await == Next::Stop {
                return;
            }
            let finished = self.clock.now();
            let skipped = self
                .schedule
                .after(&fire.with_timezone(&self.timezone))
                .map(|f| f.with_timezone(&Utc))
                .take_while(|f| *f <= finished)
                .take(SKIPPED_COUNT_CAP)
                .count();
            if skipped > 0 {
                tracing::info!(
                    "skipped {skipped} fire(s) that came due while the run was in progress \
                     (runs never overlap)"
                );
            }
            // Never earlier than the fire just served, even if the clock was set back meanwhile.
            after = finished.max(fire);
        }
    }

    /// Runs the missed fire, if there is one to catch up.
    async fn catch_up<R: Runner>(
        &self,
        runner: &mut R,
        last_run: Option<DateTime<Utc>>,
        shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Next {
        let Some(last_run) = last_run else {
            tracing::info!("no earlier run on record; nothing to catch up");
            return Next::Continue;
        };
        let now = self.clock.now();
        let Some(missed) = last_fire_between(&self.schedule, self.timezone, last_run, now) else {
            tracing::info!(
                "last run started {}; no fire missed since",
                self.local(last_run)
            );
            return Next::Continue;
        };
        let age = (now - missed).to_std().unwrap_or(Duration::ZERO);
        if age > self.catch_up {
            tracing::info!(
                "the run due at {} was missed {} ago, longer than catch_up ({}); \
                 waiting for the next fire",
                self.local(missed),
                rounded(age),
                humantime::format_duration(self.catch_up)
            );
            return Next::Continue;
        }
        tracing::info!(
            "the run due at {} was missed {} ago (within catch_up {}); running it once now",
            self.local(missed),
            rounded(age),
            humantime::format_duration(self.catch_up)
        );
        self.run_once(runner, shutdown).await
    }

    /// Runs `runner` to completion, or, if shutdown comes first, for up to the grace period and
    /// then until it has stopped.
    async fn run_once<R: Runner>(
        &self,
        runner: &mut R,
        shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Next {
        let (raise_stop, stop) = Stop::channel();
        let mut run = pin!(runner.run(stop));
        tokio::select! {
            result = run.as_mut() => {
                log_result(result);
                return Next::Continue;
            }
            () = shutdown => {}
        }
        tracing::info!(
            "shutting down: letting the run in progress finish (up to {})",
            humantime::format_duration(self.grace)
        );
        // Grace is a span of elapsed time, so it is measured on the monotonic clock.
        let result = match tokio::time::timeout(self.grace, run.as_mut()).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    "the run did not finish within {}; stopping it",
                    humantime::format_duration(self.grace)
                );
                let _ = raise_stop.send(true);
                run.await
            }
        };
        match result {
            Ok(code) => tracing::info!("the run ended: exit {code}"),
            Err(err) => tracing::warn!("the run failed: {err}"),
        }
        tracing::info!("shutting down");
        Next::Stop
    }

    /// `when` on the schedule's local calendar, e.g. `2026-03-29 03:00:00 CEST`.
    fn local(&self, when: DateTime<Utc>) -> String {
        when.with_timezone(&self.timezone)
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string()
    }
}

/// Logs how a scheduled run ended. A failed run is only logged: the schedule goes on.
fn log_result(result: std::io::Result<i32>) {
    match result {
        Ok(code @ (0 | 1 | 3)) => {
            let meaning = match code {
                0 => "no drift",
                1 => "drift",
                _ => "no drift seen, but something could not be measured",
            };
            tracing::info!("run finished: exit {code} ({meaning})");
        }
        Ok(code) => tracing::warn!("run failed: exit {code}; the schedule goes on"),
        Err(err) => tracing::warn!("run failed: {err}; the schedule goes on"),
    }
}

/// A wait for the logs, to the second (`5h 3m 12s`, not nanoseconds).
fn rounded(wait: Duration) -> humantime::FormattedDuration {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() >= 500_000_000);
    humantime::format_duration(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, TimeZone, Timelike, Utc, Weekday};

    fn next_after(expr: &str, after: chrono::DateTime<Utc>) -> chrono::DateTime<Utc> {
        parse_expression(expr)
            .unwrap()
            .after(&after)
            .next()
            .unwrap()
    }

    #[test]
    fn numeric_day_one_is_monday_in_both_syntaxes() {
        // 2026-11-29 is a Sunday.
        let sunday = Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap();
        assert_eq!(next_after("0 3 * * 1", sunday).weekday(), Weekday::Mon);
        assert_eq!(next_after("0 0 3 * * 1", sunday).weekday(), Weekday::Mon);
        assert_eq!(next_after("0 3 * * 0", sunday).weekday(), Weekday::Sun);
        assert_eq!(next_after("0 3 * * 7", sunday).weekday(), Weekday::Sun);
        let weekdays: Vec<Weekday> = parse_expression("0 3 * * 1-5")
            .unwrap()
            .after(&sunday)
            .take(5)
            .map(|t| t.weekday())
            .collect();
        assert_eq!(
            weekdays,
            [
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri
            ]
        );
    }

    #[test]
    fn a_crontab_line_fires_at_second_zero() {
        let start = Utc.with_ymd_and_hms(2026, 11, 30, 1, 0, 0).unwrap();
        let next = next_after("30 2 * * *", start);
        assert_eq!((next.hour(), next.minute(), next.second()), (2, 30, 0));
    }

    #[test]
    fn names_steps_and_lists_are_understood() {
        assert_eq!(day_names("MON-FRI").unwrap(), "MON-FRI");
        assert_eq!(day_names("1,3,5").unwrap(), "MON,WED,FRI");
        assert_eq!(day_names("*/2").unwrap(), "SUN,TUE,THU,SAT");
        assert_eq!(day_names("5-7").unwrap(), "FRI,SAT,SUN");
        assert_eq!(day_names("0,7").unwrap(), "SUN");
    }

    #[test]
    fn bad_expressions_quote_the_text() {
        let err = parse_expression("0 3 * *").unwrap_err();
        assert!(err.contains("`0 3 * *` has 4 fields"), "{err}");
        let err = parse_expression("0 3 * * 8").unwrap_err();
        assert!(
            err.contains("`0 3 * * 8`") && err.contains("out of range"),
            "{err}"
        );
        let err = parse_expression("0 61 * * *").unwrap_err();
        assert!(err.contains("`0 61 * * *` is not valid"), "{err}");
        let err = parse_timezone("Mars/Olympus").unwrap_err();
        assert!(err.contains("`Mars/Olympus`"), "{err}");
    }
}
