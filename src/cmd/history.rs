//! `canary history`: runs over time.

use serde_json::json;

use super::load_config;
use crate::cli::{Cli, Format, HistoryArgs};
use crate::drift::format_p;
use crate::report;
use crate::store::Store;
use crate::verdict::Verdict;

/// Runs `canary history`.
pub fn run(cli: &Cli, args: &HistoryArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let store = Store::open(&config.store)?;
    if let Some(lane) = &args.lane
        && config.lane(lane).is_none()
    {
        anyhow::bail!("no lane named `{lane}` in the config");
    }
    let runs = store.runs(args.limit)?;
    let mut rows = Vec::new();
    // Only what the table shows: no output texts, one prompt's rows when asked for one.
    let window = store.window(&runs, args.prompt.as_deref())?;
    for run in &runs {
        let verdict_rows = window.verdicts(run.id);
        let attempts = window.attempts(run.id);
        let latency = report::attempt_latency(attempts);
        let lane_verdicts = window.lane_verdicts(run.id);
        for lane in &run.lanes {
            if args.lane.as_ref().is_some_and(|l| l != lane) {
                continue;
            }
            let items: Vec<_> = verdict_rows
                .iter()
                .filter(|v| *v.lane == **lane)
                .filter(|v| args.prompt.as_ref().is_none_or(|p| **p == *v.prompt_id))
                .collect();
            let lane_results: Vec<_> = attempts
                .iter()
                .filter(|a| {
                    *a.lane == **lane && args.prompt.as_ref().is_none_or(|p| **p == *a.prompt_id)
                })
                .collect();
            if args.prompt.is_some() && lane_results.is_empty() {
                continue;
            }
            let similarities: Vec<f64> = items.iter().filter_map(|v| v.similarity).collect();
            let mean_similarity = (!similarities.is_empty())
                .then(|| similarities.iter().sum::<f64>() / similarities.len() as f64);
            let lane_row = lane_verdicts.iter().find(|row| &row.lane == lane);
            let (verdict, p_value) = if args.prompt.is_some() {
                (
                    items.first().map(|v| v.verdict.to_string()),
                    items.first().and_then(|v| v.p_value),
                )
            } else {
                (
                    lane_row.map(|row| row.verdict.clone()),
                    lane_row.and_then(|row| row.p_value),
                )
            };
            let counts: serde_json::Map<String, serde_json::Value> = Verdict::ALL
                .iter()
                .map(|v| {
                    (
                        v.as_str().to_string(),
                        json!(items.iter().filter(|i| &*i.verdict == v.as_str()).count()),
                    )
                })
                .collect();
            let call_ms = if args.prompt.is_some() {
                lane_results.first().map(|r| r.call_ms)
            } else {
                latency.get(lane).map(|(p50, _)| *p50)
            };
            rows.push(json!({
                "run_id": run.id,
                "started_at": run.started_at,
                "status": run.status,
                "exit_code": run.exit_code,
                "lane": lane,
                "verdict": verdict,
                "counts": counts,
                "similarity": mean_similarity.map(|s| (s * 1000.0).round() / 1000.0),
                "p_value": p_value,
                "latency_p50_ms": call_ms,
                "outcome": if args.prompt.is_some() { lane_results.first().map(|r| r.outcome.to_string()) } else { None },
            }));
        }
    }
    match cli.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "runs": rows }))?
        ),
        Format::Text => {
            if rows.is_empty() {
                println!("no runs yet in {}", config.store.display());
                return Ok(0);
            }
            println!(
                "{:>5}  {:20}  {:11}  {:10}  {:12}  {:>7}  {:>5}  {:>6}  {:>10}  {:>6}  {:>7}",
                "run",
                "started",
                "status",
                "lane",
                "verdict",
                "drifted",
                "new",
                "failed",
                "similarity",
                "p",
                "p50 ms"
            );
            for row in &rows {
                let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
                let number =
                    |v: &serde_json::Value| v.as_i64().map_or("-".into(), |n| n.to_string());
                println!(
                    "{:>5}  {:20}  {:11}  {:10}  {:12}  {:>7}  {:>5}  {:>6}  {:>10}  {:>6}  {:>7}",
                    number(&row["run_id"]),
                    text(&row["started_at"])
                        .chars()
                        .take(19)
                        .collect::<String>(),
                    text(&row["status"]),
                    text(&row["lane"]),
                    text(&row["verdict"]),
                    number(&row["counts"]["drifted"]),
                    number(&row["counts"]["new"]),
                    number(&row["counts"]["failed"]),
                    row["similarity"]
                        .as_f64()
                        .map_or("-".into(), |s| format!("{s:.3}")),
                    row["p_value"].as_f64().map_or("-".into(), format_p),
                    number(&row["latency_p50_ms"]),
                );
            }
        }
    }
    Ok(0)
}
