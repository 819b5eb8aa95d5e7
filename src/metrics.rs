//! Router metrics: latency split by lane and outcome, queue wait per lane, counts per outcome.
//!
//! A single p95 across lanes hides exactly the difference a free lane is there to show, so every
//! histogram is per lane, and queue wait is kept apart from call time. Percentiles for people
//! come from HDR histograms; the Prometheus exposition is written by `prometheus-client`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use hdrhistogram::Histogram;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram as PromHistogram;
use prometheus_client::registry::Registry;

use crate::outcome::Outcome;

/// Bucket bounds (seconds) of the Prometheus histograms.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Where a lane stands, as the metrics and `check` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneStatus {
    /// Serving normally.
    Closed,
    /// Breaker open: skipped until its cooldown ends.
    Open,
    /// Cooldown over, waiting for its probe.
    HalfOpen,
    /// Rate-limited until a reset time.
    Exhausted,
    /// 401/403 or a missing key.
    Misconfigured,
    /// Switched off by config or kill switch.
    Disabled,
}

impl LaneStatus {
    /// Every status, in the order the metrics list them.
    pub const ALL: [LaneStatus; 6] = [
        LaneStatus::Closed,
        LaneStatus::Open,
        LaneStatus::HalfOpen,
        LaneStatus::Exhausted,
        LaneStatus::Misconfigured,
        LaneStatus::Disabled,
    ];

    /// The name used in metrics and text output.
    pub fn as_str(self) -> &'static str {
        match self {
            LaneStatus::Closed => "closed",
            LaneStatus::Open => "open",
            LaneStatus::HalfOpen => "half_open",
            LaneStatus::Exhausted => "exhausted",
            LaneStatus::Misconfigured => "misconfigured",
            LaneStatus::Disabled => "disabled",
        }
    }
}

/// A latency distribution in microseconds, for the quantiles of the run summary (Prometheus
/// gets its own histogram).
struct Distribution {
    histogram: Histogram<u64>,
}

impl Distribution {
    fn new() -> Self {
        Distribution {
            // 1 µs to 1 h at 3 significant digits; the bounds are constants, so this cannot fail.
            histogram: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!())),
        }
    }

    fn record(&mut self, value: Duration) {
        let us = (value.as_micros() as u64).max(1);
        self.histogram.saturating_record(us);
    }

    fn quantile_ms(&self, q: f64) -> f64 {
        self.histogram.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Metrics of one router, shared by all its jobs.
pub struct Metrics {
    inner: Mutex<Inner>,
    exposed: Exposed,
}

/// Labels of a lane's attempts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneOutcome {
    lane: String,
    outcome: String,
}

/// Labels of one lane.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabel {
    /// Lane name.
    pub lane: String,
}

/// Labels of one lane in one state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneState {
    lane: String,
    state: String,
}

/// A float gauge.
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// What the Prometheus exposition shows, recorded as attempts happen.
struct Exposed {
    calls: Family<LaneOutcome, PromHistogram>,
    queue: Family<LaneLabel, PromHistogram>,
    attempts: Family<LaneOutcome, Counter>,
}

impl Exposed {
    fn new() -> Exposed {
        let histogram = || PromHistogram::new(BUCKETS);
        Exposed {
            calls: Family::new_with_constructor(histogram),
            queue: Family::new_with_constructor(histogram),
            attempts: Family::default(),
        }
    }
}

/// The series recorded so far, by lane. `record` runs on every attempt, so each series keeps its
/// own handles into the Prometheus families: recording then neither allocates labels nor hashes
/// them (a cloned handle shares the family's series).
#[derive(Default)]
struct Inner {
    lanes: BTreeMap<String, LaneSeries>,
}

/// One lane's series.
#[derive(Default)]
struct LaneSeries {
    calls: BTreeMap<Outcome, CallSeries>,
    queue: Option<QueueSeries>,
}

/// Attempts of one lane with one outcome.
struct CallSeries {
    distribution: Distribution,
    seconds: PromHistogram,
    attempts: Counter,
}

impl CallSeries {
    fn new(exposed: &Exposed, lane: &str, outcome: Outcome) -> CallSeries {
        let labels = LaneOutcome {
            lane: lane.to_string(),
            outcome: outcome.to_string(),
        };
        CallSeries {
            distribution: Distribution::new(),
            seconds: exposed.calls.get_or_create(&labels).clone(),
            attempts: exposed.attempts.get_or_create(&labels).clone(),
        }
    }

    fn record(&mut self, call: Duration) {
        self.distribution.record(call);
        self.seconds.observe(call.as_secs_f64());
        self.attempts.inc();
    }
}

/// Queue waits of one lane.
struct QueueSeries {
    distribution: Distribution,
    seconds: PromHistogram,
}

impl QueueSeries {
    fn new(exposed: &Exposed, lane: &str) -> QueueSeries {
        let labels = LaneLabel {
            lane: lane.to_string(),
        };
        QueueSeries {
            distribution: Distribution::new(),
            seconds: exposed.queue.get_or_create(&labels).clone(),
        }
    }

    fn record(&mut self, queue: Duration) {
        self.distribution.record(queue);
        self.seconds.observe(queue.as_secs_f64());
    }
}

/// One lane's figures, for the printed summary.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneSummary {
    /// Lane name.
    pub lane: String,
    /// Attempts per outcome.
    pub outcomes: BTreeMap<Outcome, u64>,
    /// Call latency of served attempts: p50, p95, max (ms).
    pub served_ms: Option<(f64, f64, f64)>,
    /// Queue wait: p50, p95, max (ms).
    pub queue_ms: Option<(f64, f64, f64)>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Metrics {
            inner: Mutex::new(Inner::default()),
            exposed: Exposed::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records one attempt: its outcome, the time it queued for a permit (`None` when it was
    /// turned away before the queue, so refusals do not drag queue percentiles to zero) and the
    /// call time.
    pub fn record(&self, lane: &str, outcome: Outcome, queue: Option<Duration>, call: Duration) {
        let mut inner = self.lock();
        // Looked up by `&str`: the lane's name is copied only the first time it records.
        if !inner.lanes.contains_key(lane) {
            inner.lanes.insert(lane.to_string(), LaneSeries::default());
        }
        let Some(series) = inner.lanes.get_mut(lane) else {
            return;
        };
        series
            .calls
            .entry(outcome)
            .or_insert_with(|| CallSeries::new(&self.exposed, lane, outcome))
            .record(call);
        if let Some(queue) = queue {
            series
                .queue
                .get_or_insert_with(|| QueueSeries::new(&self.exposed, lane))
                .record(queue);
        }
    }

    /// Per-lane summary for text output.
    pub fn summary(&self) -> Vec<LaneSummary> {
        let inner = self.lock();
        let spread = |d: &Distribution| {
            (!d.histogram.is_empty()).then(|| {
                (
                    d.quantile_ms(0.5),
                    d.quantile_ms(0.95),
                    d.histogram.max() as f64 / 1000.0,
                )
            })
        };
        inner
            .lanes
            .iter()
            .map(|(lane, series)| LaneSummary {
                lane: lane.clone(),
                outcomes: series
                    .calls
                    .iter()
                    .map(|(outcome, calls)| (*outcome, calls.distribution.histogram.len()))
                    .collect(),
                served_ms: series
                    .calls
                    .get(&Outcome::Served)
                    .and_then(|calls| spread(&calls.distribution)),
                queue_ms: series
                    .queue
                    .as_ref()
                    .and_then(|queue| spread(&queue.distribution)),
            })
            .collect()
    }

    /// A registry of every router metric, with each lane's current status; callers add their
    /// own metrics to it before encoding it.
    pub fn registry(&self, statuses: &[(String, LaneStatus)]) -> Registry {
        let mut registry = Registry::default();
        registry.register(
            "canary_lane_call_seconds",
            "Time from request to last byte, by lane and outcome",
            self.exposed.calls.clone(),
        );
        registry.register(
            "canary_lane_queue_seconds",
            "Time spent waiting for an in-flight permit, by lane",
            self.exposed.queue.clone(),
        );
        registry.register(
            "canary_lane_attempts",
            "Attempts by lane and outcome",
            self.exposed.attempts.clone(),
        );
        let states = Family::<LaneState, Gauge>::default();
        for (lane, status) in statuses {
            for candidate in LaneStatus::ALL {
                states
                    .get_or_create(&LaneState {
                        lane: lane.clone(),
                        state: candidate.as_str().to_string(),
                    })
                    .set(i64::from(candidate == *status));
            }
        }
        registry.register(
            "canary_lane_state",
            "Current state of each lane (1 = in that state)",
            states,
        );
        registry
    }

    /// Prometheus text exposition (format 0.0.4) of every router metric.
    pub fn render_prometheus(&self, statuses: &[(String, LaneStatus)]) -> String {
        encode(&self.registry(statuses))
    }
}

/// A registry in the Prometheus text format (0.0.4), as node_exporter's textfile collector reads.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// Writes a Prometheus text file the way node_exporter's textfile collector expects: to a temp
/// file beside it, then renamed over it, so a scrape never reads half a file.
pub fn write_file(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut temp = path.as_os_str().to_os_string();
    temp.push(".tmp");
    std::fs::write(&temp, text)?;
    std::fs::rename(&temp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_split_by_lane_and_outcome() {
        let metrics = Metrics::new();
        let ms = Duration::from_millis;
        metrics.record("free", Outcome::Timeout, Some(Duration::ZERO), ms(200));
        metrics.record("free", Outcome::Disabled, None, Duration::ZERO);
        metrics.record("paid", Outcome::Served, Some(ms(3)), ms(40));
        metrics.record("paid", Outcome::Served, Some(ms(1)), ms(60));
        let text = metrics.render_prometheus(&[
            ("free".into(), LaneStatus::Disabled),
            ("paid".into(), LaneStatus::Closed),
        ]);
        assert!(
            text.contains("canary_lane_call_seconds_count{lane=\"paid\",outcome=\"served\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "canary_lane_call_seconds_bucket{lane=\"paid\",outcome=\"served\",le=\"0.05\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("canary_lane_call_seconds_count{lane=\"free\",outcome=\"timeout\"} 1")
        );
        assert!(text.contains("canary_lane_queue_seconds_count{lane=\"paid\"} 2"));
        assert!(
            text.contains("canary_lane_queue_seconds_count{lane=\"free\"} 1"),
            "refusals do not queue"
        );
        assert!(text.contains("canary_lane_attempts_total{lane=\"free\",outcome=\"timeout\"} 1"));
        assert!(text.contains("canary_lane_state{lane=\"free\",state=\"disabled\"} 1"));
        assert!(text.contains("canary_lane_state{lane=\"free\",state=\"closed\"} 0"));
        let summary = metrics.summary();
        let paid = summary.iter().find(|s| s.lane == "paid").unwrap();
        assert_eq!(paid.outcomes[&Outcome::Served], 2);
        let (p50, _, max) = paid.served_ms.unwrap();
        assert!((39.0..=41.0).contains(&p50), "{p50}");
        assert!((59.0..=61.0).contains(&max), "{max}");
    }
}
