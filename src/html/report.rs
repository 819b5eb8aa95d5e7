//! The report page of `canary report`: one self-contained HTML file (no script, no network, no
//! external asset) that opens from a mail attachment as well as from a web server.
//!
//! For the run it reports, per lane: the verdict and its reasons; the drift of the last runs
//! (share of prompts drifted, the sampled prompts' p-value against alpha, the verdict of each
//! run); a prompts × runs grid of verdicts, so the night a drift started shows at a glance;
//! latency (p50, p95) and attempts by outcome per run; and each drifted item with its reasons
//! and its answers beside the baseline's, changed words marked.

use std::collections::{BTreeMap, BTreeSet};

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::chart::{self, DriftPoint, LatencyPoint};
use super::{item, verdict_color};
use crate::drift::format_p;
use crate::judge::{JudgedLane, RunJudgement};
use crate::report::attempt_latency;
use crate::store::{RunRow, Store, StoreError};
use crate::verdict::Verdict;

/// One run of one lane, as the report shows it over time.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPoint {
    /// Run id.
    pub run: i64,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// The lane's verdict, as the run stored it.
    pub verdict: Option<String>,
    /// Its sampled prompts' p-value.
    pub p_value: Option<f64>,
    /// Each prompt's verdict.
    pub items: BTreeMap<String, String>,
    /// Median and 95th percentile of served call times (ms).
    pub latency: Option<(i64, i64)>,
    /// Attempts by outcome.
    pub outcomes: BTreeMap<String, usize>,
}

impl RunPoint {
    /// Share of the judged prompts that drifted.
    fn drifted_share(&self) -> Option<f64> {
        let judged = self
            .items
            .values()
            .filter(|v| matches!(v.as_str(), "unchanged" | "within_noise" | "drifted"))
            .count();
        let drifted = self.items.values().filter(|v| *v == "drifted").count();
        (judged > 0).then(|| drifted as f64 / judged as f64)
    }
}

/// A lane over the last runs, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneHistory {
    /// Lane name.
    pub lane: String,
    /// The runs that measured it.
    pub runs: Vec<RunPoint>,
}

/// The history of `lanes` over the last `limit` runs up to `through` (included), as stored.
pub fn history(
    store: &Store,
    lanes: &[String],
    through: i64,
    limit: usize,
) -> Result<Vec<LaneHistory>, StoreError> {
    let mut histories: Vec<LaneHistory> = lanes
        .iter()
        .map(|lane| LaneHistory {
            lane: lane.clone(),
            runs: Vec::new(),
        })
        .collect();
    let mut runs = store.runs_through(through, limit)?;
    runs.reverse();
    // Outcomes and timings only: the texts of past runs are not shown.
    let window = store.window(&runs, None)?;
    for run in runs {
        let verdicts = window.verdicts(run.id);
        let lane_verdicts = window.lane_verdicts(run.id);
        let attempts = window.attempts(run.id);
        let latency = attempt_latency(attempts);
        for history in &mut histories {
            if !run.lanes.contains(&history.lane) {
                continue;
            }
            let lane_row = lane_verdicts.iter().find(|l| l.lane == history.lane);
            let mut outcomes = BTreeMap::new();
            for attempt in attempts.iter().filter(|a| *a.lane == *history.lane) {
                *outcomes.entry(attempt.outcome.to_string()).or_insert(0) += 1;
            }
            history.runs.push(RunPoint {
                run: run.id,
                started_at: run.started_at.clone(),
                verdict: lane_row.map(|l| l.verdict.clone()),
                p_value: lane_row.and_then(|l| l.p_value),
                items: verdicts
                    .iter()
                    .filter(|v| *v.lane == *history.lane)
                    .map(|v| (v.prompt_id.to_string(), v.verdict.to_string()))
                    .collect(),
                latency: latency.get(&history.lane).copied(),
                outcomes,
            });
        }
    }
    Ok(histories)
}

/// The style sheet of the page; components carry their own inline styles as well, for mail.
const STYLE: &str = "
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; font-size: 14px;
       color: #1f2328; max-width: 1120px; margin: 0 auto; padding: 16px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 6px;
border-bottom: 1px solid #d0d7de; padding-bottom: 4px; } h3 { font-size: 15px; }
.muted { color: #57606a; }
table.summary td, table.summary th { padding: 3px 14px 3px 0; text-align: right; }
table.summary td:first-child, table.summary th:first-child { text-align: left; }
table.grid { border-collapse: separate; border-spacing: 2px; font-size: 11px; }
table.grid th { font-weight: normal; color: #57606a; padding: 0 3px; }
table.grid th.prompt { text-align: right; white-space: nowrap; max-width: 18em;
  overflow: hidden; text-overflow: ellipsis; }
table.grid td.cell { width: 16px; height: 16px; text-align: center; color: #fff;
  border-radius: 2px; }
.chart { max-width: 100%; height: auto; display: block; }
details { margin: 8px 0; } summary { cursor: pointer; color: #0969da; }
";

/// Symbol of a verdict in the grid, so the grid reads without colour too.
fn symbol(verdict: &str) -> &'static str {
    match verdict {
        "unchanged" => "·",
        "within_noise" => "~",
        "drifted" => "✕",
        "new" => "+",
        "stale" => "s",
        "failed" => "!",
        _ => "",
    }
}

/// The whole page.
pub fn page(
    run: &RunRow,
    judgement: &RunJudgement,
    histories: &[LaneHistory],
    alpha: f64,
) -> String {
    let status = serde_json::to_value(judgement.status())
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let latency_now: BTreeMap<&str, (i64, i64)> = histories
        .iter()
        .filter_map(|h| {
            h.runs
                .iter()
                .find(|r| r.run == run.id)
                .and_then(|r| r.latency)
                .map(|l| (h.lane.as_str(), l))
        })
        .collect();
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "canary run " (run.id) ": " (status) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    h1 { "canary · run " (run.id) }
                    p class="muted" {
                        "started " (run.started_at) ", " (run.status) "; status "
                        b style=(format!("color:{}", if judgement.exit_code() == 1 { "#cf222e" } else { "#1f2328" })) { (status) }
                        " (exit " (judgement.exit_code()) "). Items are judged against the baselines as they are now; the charts and the grid show the last "
                        (histories.iter().map(|h| h.runs.len()).max().unwrap_or(0)) " runs as they were judged."
                    }
                }
                table class="summary" {
                    tr {
                        th { "lane" } th { "verdict" }
                        @for verdict in Verdict::ALL { th { (verdict) } }
                        th { "p" } th { "p50 ms" } th { "p95 ms" }
                    }
                    @for lane in &judgement.lanes {
                        tr {
                            td { a href=(format!("#lane-{}", lane.lane)) { (lane.lane) } }
                            td style=(format!("color:{};font-weight:bold", verdict_color(lane.verdict.as_str()))) { (lane.verdict) }
                            @for verdict in Verdict::ALL { td { (lane.count(verdict)) } }
                            td { (lane.test.map_or("–".to_string(), |t| format_p(t.p_value))) }
                            @let latency = latency_now.get(lane.lane.as_str());
                            td { (latency.map_or("–".to_string(), |l| l.0.to_string())) }
                            td { (latency.map_or("–".to_string(), |l| l.1.to_string())) }
                        }
                    }
                }
                @for lane in &judgement.lanes {
                    @let history = histories.iter().find(|h| h.lane == lane.lane);
                    (lane_section(lane, history, run.id, alpha))
                }
                footer class="muted" style="margin-top:32px;font-size:12px" {
                    "canary " (env!("CARGO_PKG_VERSION")) " · written "
                    (chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                }
            }
        }
    }
    .into_string()
}

fn lane_section(
    lane: &JudgedLane,
    history: Option<&LaneHistory>,
    run_id: i64,
    alpha: f64,
) -> Markup {
    let runs: &[RunPoint] = history.map_or(&[], |h| h.runs.as_slice());
    let drift_points: Vec<DriftPoint> = runs
        .iter()
        .map(|r| DriftPoint {
            run: r.run,
            verdict: r.verdict.clone(),
            p_value: r.p_value,
            drifted_share: r.drifted_share(),
        })
        .collect();
    let latency_points: Vec<LatencyPoint> = runs
        .iter()
        .map(|r| LatencyPoint {
            run: r.run,
            p50: r.latency.map(|l| l.0 as f64),
            p95: r.latency.map(|l| l.1 as f64),
            outcomes: r.outcomes.iter().map(|(o, c)| (o.clone(), *c)).collect(),
        })
        .collect();
    let prompts: BTreeSet<&str> = runs
        .iter()
        .flat_map(|r| r.items.keys().map(String::as_str))
        .chain(lane.items.iter().map(|i| i.judgement.id.as_str()))
        .collect();
    let (drifted, others): (Vec<_>, Vec<_>) = lane
        .items
        .iter()
        .partition(|i| i.judgement.verdict == Verdict::Drifted);
    html! {
        section class="lane" id=(format!("lane-{}", lane.lane)) {
            h2 {
                "lane " (lane.lane) ": "
                span style=(format!("color:{}", verdict_color(lane.verdict.as_str()))) { (lane.verdict) }
            }
            @if !lane.reasons.is_empty() {
                ul { @for reason in &lane.reasons { li { (reason) } } }
            }
            h3 { "Drift, run by run" }
            (chart::drift(&drift_points, lane.test.map_or(alpha, |t| t.alpha)))
            p class="muted" style="font-size:12px;margin:2px 0 10px" {
                "Bars: share of judged prompts that drifted. Line: p-value of the sampled prompts' two-sample test (log scale; drift at or below the dashed alpha). Strip: the lane's verdict."
            }
            h3 { "Verdicts by prompt" }
            @if runs.is_empty() {
                p class="muted" { "No stored verdicts yet." }
            } @else {
                div style="overflow-x:auto" {
                    table class="grid" {
                        tr {
                            th class="prompt" { "prompt \\ run" }
                            @for r in runs { th { (r.run) } }
                        }
                        @for prompt in &prompts {
                            tr {
                                th class="prompt" title=(prompt) { (prompt) }
                                @for r in runs {
                                    @let verdict = r.items.get(*prompt).map_or("", String::as_str);
                                    td class=(format!("cell v-{verdict}")) style=(format!("background:{}", verdict_color(verdict))) title=(format!("run {} · {prompt}: {}", r.run, if verdict.is_empty() { "not run" } else { verdict })) { (symbol(verdict)) }
                                }
                            }
                        }
                    }
                }
                p class="muted" style="font-size:12px" {
                    @for verdict in Verdict::ALL {
                        span style=(format!("color:{}", verdict_color(verdict.as_str()))) { "■ " (symbol(verdict.as_str())) " " (verdict) } "  "
                    }
                }
            }
            h3 { "Latency and outcomes" }
            (chart::latency(&latency_points))
            h3 { "What changed in run " (run_id) }
            @if drifted.is_empty() {
                p class="muted" { "Nothing drifted on this lane." }
            }
            @for judged in &drifted { (item(&lane.lane, judged, run_id)) }
            @if !others.is_empty() {
                details {
                    summary { (others.len()) " other prompts (unchanged, within noise, new, stale or failed)" }
                    @for judged in &others { (item(&lane.lane, judged, run_id)) }
                }
            }
        }
    }
}
