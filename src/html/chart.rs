//! Charts as inline SVG: no script, no external asset, readable in a mail attachment or offline.
//! Every mark has a `<title>`, so hovering a point names the run and its value.

use maud::{Markup, html};

use super::verdict_color;
use crate::drift::format_p;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 190.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 64.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 38.0;
/// The smallest p-value drawn: 4,999 permutations cannot show a smaller one.
const P_FLOOR: f64 = 1e-4;

/// One run of a lane, as the drift chart shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftPoint {
    /// Run id.
    pub run: i64,
    /// The lane's verdict in that run.
    pub verdict: Option<String>,
    /// Its sampled prompts' p-value.
    pub p_value: Option<f64>,
    /// Share of its judged prompts that drifted (0 to 1).
    pub drifted_share: Option<f64>,
}

/// One run of a lane, as the latency chart shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyPoint {
    /// Run id.
    pub run: i64,
    /// Median call time of served answers (ms).
    pub p50: Option<f64>,
    /// 95th percentile (ms).
    pub p95: Option<f64>,
    /// Attempts by outcome.
    pub outcomes: Vec<(String, usize)>,
}

fn plot_width() -> f64 {
    WIDTH - LEFT - RIGHT
}

fn plot_height() -> f64 {
    HEIGHT - TOP - BOTTOM
}

/// The x of the i-th of n runs.
fn x_of(i: usize, n: usize) -> f64 {
    LEFT + (i as f64 + 0.5) * plot_width() / n.max(1) as f64
}

/// Run ids along the bottom, every one or every few when there are many.
fn run_axis(runs: &[i64]) -> Markup {
    let step = runs.len().div_ceil(20).max(1);
    html! {
        @for (i, run) in runs.iter().enumerate() {
            @if i % step == 0 || i + 1 == runs.len() {
                text x=(fmt(x_of(i, runs.len()))) y=(fmt(HEIGHT - BOTTOM + 26.0)) font-size="10" text-anchor="middle" fill="#57606a" { (run) }
            }
        }
        text x=(fmt(LEFT - 6.0)) y=(fmt(HEIGHT - BOTTOM + 26.0)) font-size="10" text-anchor="end" fill="#57606a" { "run" }
    }
}

fn fmt(value: f64) -> String {
    format!("{value:.1}")
}

/// Per run: the share of prompts that drifted (bars), the p-value of the sampled prompts' test
/// on a log scale against alpha (line), and the lane's verdict (the strip along the bottom).
pub fn drift(points: &[DriftPoint], alpha: f64) -> Markup {
    let n = points.len();
    let bottom = HEIGHT - BOTTOM;
    let bar = (plot_width() / n.max(1) as f64 * 0.6).max(2.0);
    let y_share = |share: f64| bottom - plot_height() * share.clamp(0.0, 1.0);
    let y_p = |p: f64| {
        let depth = -p.clamp(P_FLOOR, 1.0).log10() / -P_FLOOR.log10();
        bottom - plot_height() * depth
    };
    let line: Vec<String> = points
        .iter()
        .enumerate()
        .filter_map(|(i, point)| {
            point
                .p_value
                .map(|p| format!("{},{}", fmt(x_of(i, n)), fmt(y_p(p))))
        })
        .collect();
    let has_p = !line.is_empty();
    let runs: Vec<i64> = points.iter().map(|p| p.run).collect();
    html! {
        svg class="chart drift" xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(HEIGHT) viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" {
            title { "Drift per run: share of prompts drifted, and the p-value of the sampled prompts' test" }
            rect x=(LEFT) y=(TOP) width=(plot_width()) height=(plot_height()) fill="#f6f8fa" {}
            // Left axis: share of prompts drifted.
            @for share in [0.0, 0.5, 1.0] {
                line x1=(LEFT) x2=(WIDTH - RIGHT) y1=(fmt(y_share(share))) y2=(fmt(y_share(share))) stroke="#d0d7de" stroke-width="0.5" {}
                text x=(fmt(LEFT - 4.0)) y=(fmt(y_share(share) + 3.0)) font-size="10" text-anchor="end" fill="#cf222e" { (format!("{:.0}%", share * 100.0)) }
            }
            text x="12" y=(fmt(TOP + plot_height() / 2.0)) font-size="10" fill="#cf222e" transform=(format!("rotate(-90 12 {})", fmt(TOP + plot_height() / 2.0))) text-anchor="middle" { "prompts drifted" }
            @for (i, point) in points.iter().enumerate() {
                @if let Some(share) = point.drifted_share {
                    @if share > 0.0 {
                        rect class="bar" x=(fmt(x_of(i, n) - bar / 2.0)) y=(fmt(y_share(share))) width=(fmt(bar)) height=(fmt(bottom - y_share(share))) fill="#ff818266" {
                            title { "run " (point.run) ": " (format!("{:.0}%", share * 100.0)) " of judged prompts drifted" }
                        }
                    }
                }
            }
            // Right axis: p-value, log scale, with alpha.
            @if has_p {
                @for p in [1.0, 0.1, 0.01, 0.001, 0.0001] {
                    text x=(fmt(WIDTH - RIGHT + 4.0)) y=(fmt(y_p(p) + 3.0)) font-size="10" fill="#0969da" { (format_p(p)) }
                }
                line class="alpha" x1=(LEFT) x2=(WIDTH - RIGHT) y1=(fmt(y_p(alpha))) y2=(fmt(y_p(alpha))) stroke="#cf222e" stroke-dasharray="4 3" stroke-width="1" {}
                text x=(fmt(WIDTH - RIGHT - 4.0)) y=(fmt(y_p(alpha) - 3.0)) font-size="10" text-anchor="end" fill="#cf222e" { "alpha " (alpha) }
                polyline class="p-value" points=(line.join(" ")) fill="none" stroke="#0969da" stroke-width="1.5" {}
                @for (i, point) in points.iter().enumerate() {
                    @if let Some(p) = point.p_value {
                        circle cx=(fmt(x_of(i, n))) cy=(fmt(y_p(p))) r="3" fill=(if p <= alpha { "#cf222e" } else { "#0969da" }) {
                            title { "run " (point.run) ": p = " (format_p(p)) }
                        }
                    }
                }
                text x=(fmt(WIDTH - 6.0)) y=(fmt(TOP + plot_height() / 2.0)) font-size="10" fill="#0969da" transform=(format!("rotate(90 {} {})", fmt(WIDTH - 6.0), fmt(TOP + plot_height() / 2.0))) text-anchor="middle" { "p-value (log)" }
            }
            // The verdict of each run.
            @for (i, point) in points.iter().enumerate() {
                @let verdict = point.verdict.as_deref().unwrap_or("none");
                rect class=(format!("verdict {verdict}")) x=(fmt(x_of(i, n) - bar / 2.0)) y=(fmt(bottom + 3.0)) width=(fmt(bar)) height="8" fill=(verdict_color(verdict)) {
                    title { "run " (point.run) ": " (verdict) }
                }
            }
            (run_axis(&runs))
        }
    }
}

/// Colour of an outcome in the outcome chart.
fn outcome_color(outcome: &str) -> &'static str {
    match outcome {
        "served" => "#8fd19e",
        "timeout" | "queue_timeout" => "#fb8f44",
        "exhausted" => "#8250df",
        "breaker_open" | "budget_exhausted" => "#d4a72c",
        "misconfigured" | "error" => "#cf222e",
        _ => "#8c959f",
    }
}

/// Per run: p50 and p95 of served call times (lines, left axis) over the attempts by outcome
/// (stacked bars, right axis), so a slower or rate-limited lane shows beside its verdicts.
pub fn latency(points: &[LatencyPoint]) -> Markup {
    let n = points.len();
    let bottom = HEIGHT - BOTTOM;
    let bar = (plot_width() / n.max(1) as f64 * 0.6).max(2.0);
    let top_ms = points
        .iter()
        .filter_map(|p| p.p95.or(p.p50))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.15;
    let top_count = points
        .iter()
        .map(|p| p.outcomes.iter().map(|(_, c)| *c).sum::<usize>())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let y_ms = |ms: f64| bottom - plot_height() * (ms / top_ms);
    let y_count = |count: f64| bottom - plot_height() * (count / top_count);
    let series = |pick: fn(&LatencyPoint) -> Option<f64>| -> String {
        points
            .iter()
            .enumerate()
            .filter_map(|(i, p)| pick(p).map(|ms| format!("{},{}", fmt(x_of(i, n)), fmt(y_ms(ms)))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let runs: Vec<i64> = points.iter().map(|p| p.run).collect();
    // Each run's outcomes stacked: (x, outcome, count, top y, bottom y).
    let mut segments = Vec::new();
    for (i, point) in points.iter().enumerate() {
        let mut stacked = 0.0;
        for (outcome, count) in &point.outcomes {
            let (y0, y1) = (y_count(stacked), y_count(stacked + *count as f64));
            segments.push((point.run, x_of(i, n), outcome.as_str(), *count, y1, y0 - y1));
            stacked += *count as f64;
        }
    }
    let mut outcomes: Vec<&str> = points
        .iter()
        .flat_map(|p| p.outcomes.iter().map(|(o, _)| o.as_str()))
        .collect();
    outcomes.sort_unstable();
    outcomes.dedup();
    html! {
        svg class="chart latency" xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(HEIGHT) viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" {
            title { "Call time (p50, p95) and attempts by outcome per run" }
            rect x=(LEFT) y=(TOP) width=(plot_width()) height=(plot_height()) fill="#f6f8fa" {}
            @for (run, x, outcome, count, y, height) in &segments {
                rect class=(format!("outcome {outcome}")) x=(fmt(x - bar / 2.0)) y=(fmt(*y)) width=(fmt(bar)) height=(fmt(*height)) fill=(outcome_color(outcome)) fill-opacity="0.55" {
                    title { "run " (run) ": " (count) " " (outcome) }
                }
            }
            @for fraction in [0.0, 0.5, 1.0] {
                text x=(fmt(LEFT - 4.0)) y=(fmt(y_ms(top_ms * fraction) + 3.0)) font-size="10" text-anchor="end" fill="#0969da" { (format!("{:.0}", top_ms * fraction)) }
                text x=(fmt(WIDTH - RIGHT + 4.0)) y=(fmt(y_count(top_count * fraction) + 3.0)) font-size="10" fill="#57606a" { (format!("{:.0}", top_count * fraction)) }
            }
            text x="12" y=(fmt(TOP + plot_height() / 2.0)) font-size="10" fill="#0969da" transform=(format!("rotate(-90 12 {})", fmt(TOP + plot_height() / 2.0))) text-anchor="middle" { "call ms" }
            text x=(fmt(WIDTH - 6.0)) y=(fmt(TOP + plot_height() / 2.0)) font-size="10" fill="#57606a" transform=(format!("rotate(90 {} {})", fmt(WIDTH - 6.0), fmt(TOP + plot_height() / 2.0))) text-anchor="middle" { "attempts" }
            polyline class="p95" points=(series(|p| p.p95)) fill="none" stroke="#fb8f44" stroke-width="1.5" {}
            polyline class="p50" points=(series(|p| p.p50)) fill="none" stroke="#0969da" stroke-width="1.5" {}
            @for (i, point) in points.iter().enumerate() {
                @if let Some(ms) = point.p50 {
                    circle cx=(fmt(x_of(i, n))) cy=(fmt(y_ms(ms))) r="2.5" fill="#0969da" { title { "run " (point.run) ": p50 " (format!("{ms:.0}")) " ms" } }
                }
                @if let Some(ms) = point.p95 {
                    circle cx=(fmt(x_of(i, n))) cy=(fmt(y_ms(ms))) r="2.5" fill="#fb8f44" { title { "run " (point.run) ": p95 " (format!("{ms:.0}")) " ms" } }
                }
            }
            (run_axis(&runs))
        }
        p class="legend" style="font-size:12px;color:#57606a;margin:2px 0 10px" {
            span style="color:#0969da" { "— p50" } " · "
            span style="color:#fb8f44" { "— p95" }
            @for outcome in &outcomes {
                " · " span style=(format!("color:{}", outcome_color(outcome))) { "■ " (outcome) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(run: i64, verdict: &str, p: Option<f64>, share: f64) -> DriftPoint {
        DriftPoint {
            run,
            verdict: Some(verdict.into()),
            p_value: p,
            drifted_share: Some(share),
        }
    }

    #[test]
    fn the_drift_chart_draws_a_bar_a_point_and_a_verdict_per_run() {
        let svg = drift(
            &[
                point(1, "unchanged", Some(0.5), 0.0),
                point(2, "within_noise", Some(0.2), 0.0),
                point(3, "drifted", Some(0.0002), 0.25),
            ],
            0.01,
        )
        .into_string();
        assert_eq!(svg.matches("<circle").count(), 3, "{svg}");
        assert_eq!(svg.matches("class=\"bar\"").count(), 1, "{svg}");
        assert_eq!(svg.matches("class=\"verdict ").count(), 3, "{svg}");
        assert!(svg.contains("run 3: p = 0.0002"), "{svg}");
        assert!(svg.contains("alpha 0.01"), "{svg}");
        // p = 1 sits on the bottom of the plot, the floor on its top.
        assert!(svg.contains(&format!("fill=\"{}\"", verdict_color("drifted"))));
    }

    #[test]
    fn a_lane_without_sampled_prompts_has_no_p_value_axis() {
        let svg = drift(&[point(1, "unchanged", None, 0.0)], 0.01).into_string();
        assert!(!svg.contains("alpha"), "{svg}");
        assert!(!svg.contains("<polyline"), "{svg}");
    }

    #[test]
    fn the_latency_chart_stacks_outcomes_under_its_percentiles() {
        let svg = latency(&[
            LatencyPoint {
                run: 1,
                p50: Some(100.0),
                p95: Some(180.0),
                outcomes: vec![("served".into(), 9), ("timeout".into(), 1)],
            },
            LatencyPoint {
                run: 2,
                p50: Some(300.0),
                p95: Some(900.0),
                outcomes: vec![("exhausted".into(), 4), ("served".into(), 6)],
            },
        ])
        .into_string();
        assert!(svg.contains("run 2: 4 exhausted"), "{svg}");
        assert!(svg.contains("run 2: p95 900 ms"), "{svg}");
        assert_eq!(svg.matches("class=\"outcome ").count(), 4, "{svg}");
    }
}
