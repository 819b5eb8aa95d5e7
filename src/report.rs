//! How a judged run is shown: a verdict table, per-item reasons and diffs, and the contract's
//! JSON object. Used by `run`, `diff`, `review` and the alerts.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::diff::render_text;
use crate::judge::{Against, DiffPair, JudgedItem, RunJudgement};
use crate::store::{Attempt, StoredResult};
use crate::verdict::Verdict;

/// Served call latency per lane: (p50, p95) in ms, nearest rank.
pub fn latency(results: &[StoredResult]) -> BTreeMap<String, (i64, i64)> {
    latency_of(
        results
            .iter()
            .map(|r| (r.lane.as_str(), r.outcome.as_str(), r.call_ms)),
    )
}

/// [`latency`] of a window's attempts.
pub fn attempt_latency(attempts: &[Attempt]) -> BTreeMap<String, (i64, i64)> {
    latency_of(attempts.iter().map(|a| (&*a.lane, &*a.outcome, a.call_ms)))
}

/// [`latency`] of attempts given as (lane, outcome, call ms).
fn latency_of<'a>(
    attempts: impl IntoIterator<Item = (&'a str, &'a str, i64)>,
) -> BTreeMap<String, (i64, i64)> {
    let mut per_lane: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    // Served calls only; the texts themselves may not have been read.
    for (lane, _, call_ms) in attempts
        .into_iter()
        .filter(|(_, outcome, _)| *outcome == "served")
    {
        per_lane.entry(lane).or_default().push(call_ms);
    }
    per_lane
        .into_iter()
        .map(|(lane, mut ms)| {
            ms.sort_unstable();
            let rank = |q: f64| ms[((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
            (lane.to_string(), (rank(0.5), rank(0.95)))
        })
        .collect()
}

/// The contract's object for `run --format json` and `diff --format json`.
pub fn to_json(judgement: &RunJudgement, latency: &BTreeMap<String, (i64, i64)>) -> Value {
    let lanes: Vec<Value> = judgement
        .lanes
        .iter()
        .map(|lane| {
            let counts: serde_json::Map<String, Value> = Verdict::ALL
                .iter()
                .map(|v| {
                    let n = lane.count(*v);
                    (v.as_str().to_string(), json!(n))
                })
                .collect();
            let mut value = json!({
                "lane": lane.lane,
                "verdict": lane.verdict,
                "reasons": lane.reasons,
                "counts": counts,
                "prompts": lane.items.iter().map(|i| &i.judgement).collect::<Vec<_>>(),
            });
            if let Some((p50, p95)) = latency.get(&lane.lane) {
                value["latency_ms"] = json!({"p50": p50, "p95": p95});
            }
            if let Some(test) = &lane.test {
                value["p_value"] = json!(test.p_value);
                value["alpha"] = json!(test.alpha);
                value["sampled_prompts"] = json!(test.prompts);
            }
            value
        })
        .collect();
    json!({
        "run_id": judgement.run_id,
        "status": judgement.status(),
        "exit_code": judgement.exit_code(),
        "against": match judgement.against {
            Against::Baselines => json!("baseline"),
            Against::Run(id) => json!(id),
        },
        "lanes": lanes,
    })
}

/// The verdict table: one row per lane, counts per verdict, and latency.
pub fn table(judgement: &RunJudgement, latency: &BTreeMap<String, (i64, i64)>) -> String {
    let width = judgement
        .lanes
        .iter()
        .map(|l| l.lane.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!(
        "{:width$}  {:12}  {:>9}  {:>12}  {:>7}  {:>3}  {:>5}  {:>6}  {:>7}  {:>7}\n",
        "lane",
        "verdict",
        "unchanged",
        "within_noise",
        "drifted",
        "new",
        "stale",
        "failed",
        "p50 ms",
        "p95 ms"
    );
    for lane in &judgement.lanes {
        let count = |v: Verdict| lane.count(v);
        let (p50, p95) = latency
            .get(&lane.lane)
            .map_or(("-".to_string(), "-".to_string()), |(a, b)| {
                (a.to_string(), b.to_string())
            });
        out.push_str(&format!(
            "{:width$}  {:12}  {:>9}  {:>12}  {:>7}  {:>3}  {:>5}  {:>6}  {:>7}  {:>7}\n",
            lane.lane,
            lane.verdict.as_str(),
            count(Verdict::Unchanged),
            count(Verdict::WithinNoise),
            count(Verdict::Drifted),
            count(Verdict::New),
            count(Verdict::Stale),
            count(Verdict::Failed),
            p50,
            p95
        ));
    }
    for lane in &judgement.lanes {
        for reason in &lane.reasons {
            out.push_str(&format!("  {}: {reason}\n", lane.lane));
        }
    }
    out
}

/// Whether an item gets a diff: drifted ones always, the others that differ with `--all`.
pub fn shows_diff(item: &JudgedItem, all: bool) -> bool {
    match item.judgement.verdict {
        Verdict::Drifted => true,
        Verdict::WithinNoise | Verdict::Stale => all,
        _ => false,
    }
}

/// Distinct run answers shown per item; the rest are counted.
pub const DIFFS_PER_ITEM: usize = 3;

/// One item: heading, reasons, and a diff of each distinct run answer that is not the
/// baseline's against its closest baseline answer (least similar first).
pub fn item(lane: &str, item: &JudgedItem, run_id: i64, color: bool) -> String {
    let judgement = &item.judgement;
    let mut out = format!("{lane} / {}: {}", judgement.id, judgement.verdict);
    if let Some(sim) = judgement.similarity {
        out.push_str(&format!(" (similarity {sim:.2})"));
    }
    if judgement.review {
        out.push_str(" [for review]");
    }
    out.push('\n');
    for reason in &judgement.reasons {
        out.push_str(&format!("  - {reason}\n"));
    }
    let (pairs, more) = item.diff_pairs(DIFFS_PER_ITEM);
    for pair in &pairs {
        let (old_label, new_label) = diff_labels(item, pair, run_id);
        out.push_str(&render_text(
            &pair.baseline.text,
            pair.output,
            &old_label,
            &new_label,
            color,
        ));
    }
    if more > 0 {
        out.push_str(&format!("  ({more} more distinct answers not shown)\n"));
    }
    out
}

/// The labels of the two sides of a diff: which baseline answer, which run samples.
pub fn diff_labels(item: &JudgedItem, pair: &DiffPair<'_>, run_id: i64) -> (String, String) {
    let model = |m: Option<&str>| m.map(|m| format!(", model {m}")).unwrap_or_default();
    let Some(baseline) = &item.baseline else {
        return (String::new(), String::new());
    };
    let which = if baseline.answers.len() > 1 {
        let rank = baseline
            .answers
            .iter()
            .position(|a| a.text == pair.baseline.text)
            .map_or(0, |i| i + 1);
        format!(
            ", answer {rank} of {}, given by {} of {} samples",
            baseline.answers.len(),
            pair.baseline.count,
            baseline.samples()
        )
    } else {
        String::new()
    };
    let old = format!(
        "baseline ({}{}{which})",
        baseline.origin,
        model(baseline.model.as_deref())
    );
    let first = pair.samples[0];
    let samples = if pair.samples.len() == 1 {
        format!("sample {first}")
    } else {
        format!(
            "samples {} ({} of {})",
            pair.samples
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            pair.samples.len(),
            item.samples.len()
        )
    };
    let new = format!(
        "run {run_id} {samples}{}",
        model(item.samples[first].model.as_deref())
    );
    (old, new)
}
