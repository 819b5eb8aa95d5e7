//! The shared router: admission, per-lane caps, breakers, exhaustion, fallback and audit.
//!
//! A job is one request with one absolute deadline. Lanes are tried in order; each attempt goes
//! through admission before it may queue: kill switch, then lane state (misconfigured,
//! exhausted, breaker), then remaining budget, and only then a wait for one of the lane's
//! `max_inflight` permits, bounded by the deadline. The whole attempt (connect, headers and the
//! whole body) ends by the lane's share of the deadline. A lane that fails hands the job on with
//! whatever time is left.

pub mod breaker;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout_at};

use crate::audit::{AuditEntry, AuditLog};
use crate::completion::{ChatRequest, Completion, Timings};
use crate::config::{Config, LaneConfig, LaneKind};
use crate::deadline::Deadline;
use crate::lane::openai::OpenAiLane;
use crate::lane::{Lane, LaneFailure};
use crate::metrics::{LaneStatus, Metrics};
use crate::outcome::Outcome;
use breaker::{Breaker, BreakerAdmission, BreakerState};

/// The router could not be built from the config.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// A lane's settings cannot work (bad header, unusable key).
    #[error("{0}")]
    Lane(String),
    /// The audit log cannot be opened.
    #[error("cannot open audit log {path}: {source}")]
    Audit {
        /// The audit file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A job named a lane that does not exist.
    #[error("no lane named `{0}` in the config")]
    UnknownLane(String),
}

/// One attempt of a job on one lane, as text output, JSON and the audit log report it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// The lane tried.
    pub lane: String,
    /// How it ended.
    pub outcome: Outcome,
    /// Time waiting for a permit.
    pub queue_ms: u64,
    /// Time from request to last byte (or to giving up).
    pub call_ms: u64,
    /// What failed, in a few words; never a key or a body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For `exhausted`: when the lane may be tried again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
}

/// The result of one job.
#[derive(Debug, Clone)]
pub struct Routed {
    /// Id of the job, as written in the audit log.
    pub job_id: String,
    /// The answer, when a lane gave one inside the deadline.
    pub completion: Option<Completion>,
    /// Every attempt in order.
    pub attempts: Vec<Attempt>,
    /// Wall time of the whole job.
    pub elapsed: Duration,
}

/// The router shared by every job of a process.
pub struct Router {
    lanes: Vec<LaneSlot>,
    floor: Duration,
    audit: Option<AuditLog>,
    metrics: Metrics,
}

struct LaneSlot {
    name: String,
    lane: Box<dyn Lane>,
    /// Why the lane is switched off for this process, if it is.
    switched_off: Option<String>,
    permits: Semaphore,
    max_inflight: usize,
    max_share: f64,
    cooldown: Duration,
    /// Ends warning lines: what happens to jobs while this lane is out.
    fallback: &'static str,
    health: Mutex<Health>,
}

/// What the router knows of a lane's health right now.
struct Health {
    breaker: Breaker,
    /// Until when the provider said the lane is out of capacity.
    exhausted_until: Option<(Instant, DateTime<Utc>)>,
    /// Why the lane cannot work until its configuration is fixed.
    misconfigured: Option<String>,
    /// False after a failure was reported; keeps a dead lane to one warning line.
    healthy: bool,
}

/// What admission decided for one attempt.
enum Gate {
    Pass { probe: Option<u64> },
    Refuse(Outcome, String, Option<DateTime<Utc>>),
}

impl Router {
    /// Builds the router for `config`. `env` reads environment variables (kill switches and
    /// keys); production passes `std::env::var`, tests pass their own map.
    ///
    /// Nothing here touches the network: a dead lane cannot stop canary from starting.
    pub fn new(
        config: &Config,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Router, RouterError> {
        let mut lanes = Vec::with_capacity(config.lanes.len());
        let fallback = if config.lanes.len() > 1 {
            "; serving from the other lanes"
        } else {
            ""
        };
        for lane_config in &config.lanes {
            lanes.push(LaneSlot::new(lane_config, env, fallback)?);
        }
        let audit = match &config.audit {
            Some(path) => Some(AuditLog::open(path, config.audit_bodies).map_err(|source| {
                RouterError::Audit {
                    path: path.clone(),
                    source,
                }
            })?),
            None => None,
        };
        Ok(Router {
            lanes,
            floor: config.floor,
            audit,
            metrics: Metrics::new(),
        })
    }

    /// Names of the lanes, in fallback order.
    pub fn lane_names(&self) -> impl Iterator<Item = &str> {
        self.lanes.iter().map(|slot| slot.name.as_str())
    }

    /// The router's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Each lane's status now, in lane order.
    pub fn statuses(&self) -> Vec<(String, LaneStatus)> {
        let now = Instant::now();
        self.lanes
            .iter()
            .map(|slot| (slot.name.clone(), slot.status(now)))
            .collect()
    }

    /// Returns once the audit line of every job finished so far is in the audit file. Dropping
    /// the router does the same.
    pub fn flush_audit(&self) -> std::io::Result<()> {
        self.audit.as_ref().map_or(Ok(()), AuditLog::flush)
    }

    /// Prometheus text of the router's metrics, lane states included.
    pub fn render_prometheus(&self) -> String {
        crate::metrics::encode(&self.metrics_registry())
    }

    /// The router's metrics, lane states included, as a registry to add to and encode.
    pub fn metrics_registry(&self) -> prometheus_client::registry::Registry {
        self.metrics.registry(&self.statuses())
    }

    /// Routes a job through the lanes in order; the first answer inside `deadline` wins.
    pub async fn route(&self, request: &ChatRequest, deadline: Deadline) -> Routed {
        let order: Vec<usize> = (0..self.lanes.len()).collect();
        self.run(request, deadline, &order, None).await
    }

    /// Sends a job to one lane only: the canary measures each lane by its own answers, never
    /// by a fallback's.
    pub async fn route_to(
        &self,
        lane: &str,
        request: &ChatRequest,
        deadline: Deadline,
    ) -> Result<Routed, RouterError> {
        let index = self.index_of(lane)?;
        Ok(self.run(request, deadline, &[index], Some(lane)).await)
    }

    /// Routes through the named lanes only, in their configured order.
    pub async fn route_among(
        &self,
        lanes: &[String],
        request: &ChatRequest,
        deadline: Deadline,
    ) -> Result<Routed, RouterError> {
        let mut order = lanes
            .iter()
            .map(|l| self.index_of(l))
            .collect::<Result<Vec<_>, _>>()?;
        order.sort_unstable();
        order.dedup();
        Ok(self.run(request, deadline, &order, None).await)
    }

    /// Asks each lane's health endpoint, all at once, each bounded by `deadline`.
    pub async fn probe_all(&self, deadline: Deadline) -> Vec<(String, Result<String, String>)> {
        let probes = self.lanes.iter().map(|slot| async move {
            let result = if let Some(reason) = &slot.switched_off {
                Err(format!("disabled ({reason})"))
            } else if let Some(why) = &lock(&slot.health).misconfigured {
                Err(format!("misconfigured: {why}"))
            } else {
                match timeout_at(deadline.instant(), slot.lane.probe(deadline)).await {
                    Ok(Ok(what)) => Ok(what),
                    Ok(Err(failure)) => Err(format!("{}: {failure}", failure.outcome())),
                    Err(_) => Err(format!("timeout: {}", LaneFailure::Timeout)),
                }
            };
            (slot.name.clone(), result)
        });
        // Probes run concurrently so one hung lane cannot hold up the others' answers.
        futures_util::future::join_all(probes).await
    }

    fn index_of(&self, lane: &str) -> Result<usize, RouterError> {
        self.lanes
            .iter()
            .position(|slot| slot.name == lane)
            .ok_or_else(|| RouterError::UnknownLane(lane.to_string()))
    }

    async fn run(
        &self,
        request: &ChatRequest,
        deadline: Deadline,
        order: &[usize],
        pinned: Option<&str>,
    ) -> Routed {
        let mut record = JobRecord {
            router: self,
            request,
            pinned,
            job_id: new_job_id(),
            started: Instant::now(),
            attempts: Vec::with_capacity(order.len()),
            in_flight: None,
            completion: None,
            written: false,
        };
        for (position, &index) in order.iter().enumerate() {
            let later = &order[position + 1..];
            record.in_flight = Some((index, Instant::now()));
            let (attempt, answer) = self.attempt(index, request, deadline, later).await;
            record.in_flight = None;
            record.attempts.push(attempt);
            if answer.is_some() {
                record.completion = answer;
                break;
            }
        }
        record.finish()
    }

    fn write_audit(&self, record: &JobRecord<'_>) {
        let Some(audit) = &self.audit else { return };
        let (sha, bytes) = record.request.fingerprint();
        let bodies = audit.include_bodies();
        let entry = AuditEntry {
            ts: Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            job_id: &record.job_id,
            prompt_sha256: &sha,
            prompt_bytes: bytes,
            pinned_lane: record.pinned,
            attempts: &record.attempts,
            served_by: record.completion.as_ref().map(|c| c.lane.as_str()),
            elapsed_ms: millis(record.started.elapsed()),
            request: bodies.then_some(record.request),
            answer: record
                .completion
                .as_ref()
                .filter(|_| bodies)
                .map(|c| c.text.as_str()),
        };
        if let Err(err) = audit.record(&entry) {
            tracing::warn!("cannot write audit line for job {}: {err}", record.job_id);
        }
    }

    /// One attempt on one lane: admission, queue, call, and what the outcome does to the lane.
    async fn attempt(
        &self,
        index: usize,
        request: &ChatRequest,
        deadline: Deadline,
        later: &[usize],
    ) -> (Attempt, Option<Completion>) {
        let slot = &self.lanes[index];
        let refused = |outcome: Outcome,
                       detail: String,
                       until: Option<DateTime<Utc>>,
                       queue: Option<Duration>| {
            self.metrics
                .record(&slot.name, outcome, queue, Duration::ZERO);
            let attempt = Attempt {
                lane: slot.name.clone(),
                outcome,
                queue_ms: queue.map_or(0, millis),
                call_ms: 0,
                detail: Some(detail),
                until,
            };
            (attempt, None)
        };

        // Admission, cheapest first, before anything waits or touches the network.
        if let Some(reason) = &slot.switched_off {
            return refused(Outcome::Disabled, reason.clone(), None, None);
        }
        let probe = match slot.admit(Instant::now()) {
            Gate::Refuse(outcome, detail, until) => return refused(outcome, detail, until, None),
            Gate::Pass { probe } => ProbeGuard { slot, probe },
        };
        if deadline.is_below(self.floor) {
            return refused(
                Outcome::BudgetExhausted,
                budget_detail("the job has", deadline, self.floor),
                None,
                None,
            );
        }
        let now = Instant::now();
        let lane_deadline = if later.iter().any(|&j| self.lanes[j].could_serve(now)) {
            deadline.share(slot.max_share)
        } else {
            deadline
        };
        if lane_deadline.is_below(self.floor) {
            return refused(
                Outcome::BudgetExhausted,
                budget_detail("the lane's share has", lane_deadline, self.floor),
                None,
                None,
            );
        }

        // The queue: waiting for a permit spends the budget, so it is bounded and timed apart.
        let queued_at = Instant::now();
        let permit = match timeout_at(lane_deadline.instant(), slot.permits.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => {
                return refused(
                    Outcome::QueueTimeout,
                    format!("all {} permits busy until the deadline", slot.max_inflight),
                    None,
                    Some(queued_at.elapsed()),
                );
            }
        };
        let queued = queued_at.elapsed();
        if lane_deadline.is_below(self.floor) {
            return refused(
                Outcome::BudgetExhausted,
                budget_detail(
                    "after queueing, the lane's share has",
                    lane_deadline,
                    self.floor,
                ),
                None,
                Some(queued),
            );
        }

        // The call: connect, headers and the whole body must land before the lane's deadline.
        let called_at = Instant::now();
        let result = match timeout_at(
            lane_deadline.instant(),
            slot.lane.complete(request, lane_deadline),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(LaneFailure::Timeout),
        };
        let called = called_at.elapsed();
        drop(permit);

        let timings = Timings {
            queue_ms: millis(queued),
            call_ms: millis(called),
        };
        let (outcome, detail, until, completion) = match result {
            Ok(answer) => {
                probe.disarm();
                slot.record_success();
                let completion = Completion {
                    text: answer.text,
                    lane: slot.name.clone(),
                    model: answer.model,
                    fingerprint: answer.fingerprint,
                    finish_reason: answer.finish_reason,
                    usage: answer.usage,
                    timings,
                };
                (Outcome::Served, None, None, Some(completion))
            }
            Err(failure) => {
                if failure.counts_against_breaker() {
                    // The probe reported: its failure reopens the breaker.
                    probe.disarm();
                }
                let until = slot.record_failure(&failure);
                (failure.outcome(), Some(failure.to_string()), until, None)
            }
        };
        self.metrics
            .record(&slot.name, outcome, Some(queued), called);
        let attempt = Attempt {
            lane: slot.name.clone(),
            outcome,
            queue_ms: timings.queue_ms,
            call_ms: timings.call_ms,
            detail,
            until,
        };
        (attempt, completion)
    }
}

/// A job's record while it runs. It writes the job's audit line exactly once: when the job
/// finishes, or when it is dropped half-way (the caller gave up), so a prompt that left the
/// network is always audited.
struct JobRecord<'r> {
    router: &'r Router,
    request: &'r ChatRequest,
    pinned: Option<&'r str>,
    job_id: String,
    started: Instant,
    attempts: Vec<Attempt>,
    /// The lane being tried and since when.
    in_flight: Option<(usize, Instant)>,
    completion: Option<Completion>,
    written: bool,
}

impl JobRecord<'_> {
    fn finish(mut self) -> Routed {
        self.router.write_audit(&self);
        self.written = true;
        Routed {
            job_id: std::mem::take(&mut self.job_id),
            completion: self.completion.take(),
            attempts: std::mem::take(&mut self.attempts),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for JobRecord<'_> {
    fn drop(&mut self) {
        if self.written {
            return;
        }
        if let Some((index, since)) = self.in_flight.take() {
            let lane = &self.router.lanes[index].name;
            let spent = since.elapsed();
            self.router
                .metrics
                .record(lane, Outcome::Timeout, None, spent);
            self.attempts.push(Attempt {
                lane: lane.clone(),
                outcome: Outcome::Timeout,
                queue_ms: 0,
                call_ms: millis(spent),
                detail: Some("cancelled by the caller before the lane answered".into()),
                until: None,
            });
        }
        self.router.write_audit(self);
    }
}

impl LaneSlot {
    /// `fallback` ends the warning lines: what happens to jobs while this lane is out.
    fn new(
        config: &LaneConfig,
        env: &dyn Fn(&str) -> Option<String>,
        fallback: &'static str,
    ) -> Result<LaneSlot, RouterError> {
        let lane: Box<dyn Lane> = match config.kind {
            LaneKind::Openai => Box::new(OpenAiLane::new(config, env).map_err(RouterError::Lane)?),
        };
        let switched_off = if !config.enabled {
            Some("enabled: false in config".to_string())
        } else if env(&config.kill_switch_env).is_some_and(|v| v.trim().eq_ignore_ascii_case("off"))
        {
            Some(format!("{}=off", config.kill_switch_env))
        } else {
            None
        };
        let misconfigured = lane.misconfiguration().filter(|_| switched_off.is_none());
        if let Some(why) = &misconfigured {
            tracing::warn!("lane {}: misconfigured: {why}{fallback}", config.name);
        }
        if let Some(reason) = &switched_off {
            tracing::info!("lane {}: disabled ({reason}){fallback}", config.name);
        }
        Ok(LaneSlot {
            name: config.name.clone(),
            lane,
            switched_off,
            permits: Semaphore::new(config.max_inflight),
            max_inflight: config.max_inflight,
            max_share: config.max_share,
            cooldown: config.breaker.cooldown,
            fallback,
            health: Mutex::new(Health {
                breaker: Breaker::new(config.breaker),
                exhausted_until: None,
                misconfigured,
                healthy: true,
            }),
        })
    }

    fn status(&self, now: Instant) -> LaneStatus {
        if self.switched_off.is_some() {
            return LaneStatus::Disabled;
        }
        let health = lock(&self.health);
        if health.misconfigured.is_some() {
            return LaneStatus::Misconfigured;
        }
        if health.exhausted_until.is_some_and(|(until, _)| now < until) {
            return LaneStatus::Exhausted;
        }
        match health.breaker.state(now) {
            BreakerState::Closed => LaneStatus::Closed,
            BreakerState::Open { .. } => LaneStatus::Open,
            BreakerState::HalfOpen { .. } => LaneStatus::HalfOpen,
        }
    }

    /// Whether this lane could take a job now (used to decide whether an earlier lane must
    /// leave it time).
    fn could_serve(&self, now: Instant) -> bool {
        if self.switched_off.is_some() {
            return false;
        }
        let health = lock(&self.health);
        health.misconfigured.is_none()
            && health.exhausted_until.is_none_or(|(until, _)| now >= until)
            && health.breaker.would_admit(now)
    }

    fn admit(&self, now: Instant) -> Gate {
        let mut health = lock(&self.health);
        if let Some(why) = &health.misconfigured {
            return Gate::Refuse(Outcome::Misconfigured, why.clone(), None);
        }
        if let Some((until, wall)) = health.exhausted_until {
            if now < until {
                return Gate::Refuse(
                    Outcome::Exhausted,
                    format!(
                        "rate limited until {}",
                        wall.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                    Some(wall),
                );
            }
            health.exhausted_until = None;
        }
        match health.breaker.admit(now) {
            BreakerAdmission::Allowed => Gate::Pass { probe: None },
            BreakerAdmission::Probe(probe) => Gate::Pass { probe: Some(probe) },
            BreakerAdmission::Refused { until } => {
                let detail = match until {
                    Some(until) => format!(
                        "breaker open for another {}",
                        seconds(until.saturating_duration_since(now))
                    ),
                    None => "breaker half-open, probe in flight".to_string(),
                };
                Gate::Refuse(Outcome::BreakerOpen, detail, None)
            }
        }
    }

    fn record_success(&self) {
        let mut health = lock(&self.health);
        health.breaker.record_success();
        if !health.healthy {
            tracing::info!("lane {}: answering again", self.name);
            health.healthy = true;
        }
    }

    /// Applies a failure to the lane's state; returns the reset time for exhaustion.
    fn record_failure(&self, failure: &LaneFailure) -> Option<DateTime<Utc>> {
        let now = Instant::now();
        let mut health = lock(&self.health);
        let first = std::mem::replace(&mut health.healthy, false);
        match failure {
            LaneFailure::RateLimited { reset, message } => {
                let wall_now = SystemTime::now();
                let reset = reset.unwrap_or(wall_now + self.cooldown);
                let wait = reset.duration_since(wall_now).unwrap_or_default();
                let wall: DateTime<Utc> = reset.into();
                health.exhausted_until = Some((now + wait, wall));
                tracing::warn!(
                    "lane {}: exhausted until {} ({message}); skipping it without requests until then",
                    self.name,
                    wall.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                );
                return Some(wall);
            }
            LaneFailure::Misconfigured(why) => {
                health.misconfigured = Some(why.clone());
                tracing::warn!(
                    "lane {}: misconfigured: {why}; fix its settings{}",
                    self.name,
                    self.fallback
                );
            }
            counted if counted.counts_against_breaker() => {
                if first {
                    tracing::warn!("lane {}: {counted}{}", self.name, self.fallback);
                }
                if let Some(cooldown) = health.breaker.record_failure(now) {
                    tracing::info!("lane {}: breaker open for {}", self.name, seconds(cooldown));
                }
            }
            other => {
                // A request error: the lane is alive, our request was wrong.
                health.healthy = first;
                tracing::debug!("lane {}: {other}", self.name);
            }
        }
        None
    }
}

/// Releases a half-open probe that never reported, whatever path the attempt left by
/// (including the job being dropped mid-call).
struct ProbeGuard<'a> {
    slot: &'a LaneSlot,
    probe: Option<u64>,
}

impl ProbeGuard<'_> {
    /// The probe reported its result to the breaker; nothing to release.
    fn disarm(mut self) {
        self.probe = None;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some(probe) = self.probe {
            lock(&self.slot.health).breaker.release_probe(probe);
        }
    }
}

/// A random (version 4) UUID naming one job. A job id only has to be unique, so it comes from
/// the process's fast generator: `Uuid::new_v4` asks the kernel for randomness, a system call on
/// every job.
fn new_job_id() -> String {
    uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes())
        .into_uuid()
        .simple()
        .to_string()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis().min(u128::from(u64::MAX)) as u64
}

fn seconds(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

fn budget_detail(who: &str, deadline: Deadline, floor: Duration) -> String {
    format!(
        "{who} {} ms left, below the {} ms floor",
        millis(deadline.remaining()),
        millis(floor)
    )
}
