//! Judging a stored run: against the accepted baselines (`snapshots/`) or against another run.
//!
//! The store is the source of truth for what a run produced; this module reads it back, finds
//! each (lane, prompt)'s baseline, and applies the rules of [`crate::verdict`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::Config;
use crate::drift::{PromptSamples, test_lane};
use crate::prompts::{Prompt, PromptSet};
use crate::snapshot::{Answer, Snapshot, SnapshotError, distinct_answers};
use crate::store::{Store, StoreError, StoredResult};
use crate::verdict::{
    Baseline, Identity, ItemJudgement, LaneCall, LaneTest, Mode, Rules, Sample, Verdict,
    apply_test, identity_changes, judge_item, judge_lane,
};

/// What a run is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Against {
    /// The accepted snapshots as they are now.
    Baselines,
    /// Another run's outputs.
    Run(i64),
}

/// Judging failed.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A snapshot could not be read.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
}

/// One judged (lane, prompt), with what it was judged on.
#[derive(Debug, Clone)]
pub struct JudgedItem {
    /// The judgement.
    pub judgement: ItemJudgement,
    /// The baseline, when there is one.
    pub baseline: Option<Baseline>,
    /// The run's samples.
    pub samples: Vec<Sample>,
}

/// A run answer shown against the baseline answer closest to it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffPair<'a> {
    /// The run's samples that gave this answer (0-based).
    pub samples: Vec<usize>,
    /// The answer.
    pub output: &'a str,
    /// The closest baseline answer.
    pub baseline: &'a Answer,
    /// Their similarity.
    pub similarity: f64,
}

impl JudgedItem {
    /// The run's distinct answers that are not the baseline's, each against its closest baseline
    /// answer, least similar first: at most `limit` of them, and how many more there are.
    pub fn diff_pairs(&self, limit: usize) -> (Vec<DiffPair<'_>>, usize) {
        let Some(baseline) = &self.baseline else {
            return (Vec::new(), 0);
        };
        let mut pairs: Vec<DiffPair<'_>> = Vec::new();
        for (index, sample) in self.samples.iter().enumerate() {
            let Some(output) = sample.output.as_deref() else {
                continue;
            };
            if let Some(pair) = pairs.iter_mut().find(|p| p.output == output) {
                pair.samples.push(index);
                continue;
            }
            if baseline.answers.iter().any(|a| a.text == output) {
                continue;
            }
            let (closest, similarity) = baseline.closest(output);
            pairs.push(DiffPair {
                samples: vec![index],
                output,
                baseline: closest,
                similarity,
            });
        }
        pairs.sort_by(|a, b| a.similarity.total_cmp(&b.similarity));
        let more = pairs.len().saturating_sub(limit);
        pairs.truncate(limit);
        (pairs, more)
    }
}

/// One judged lane.
#[derive(Debug, Clone)]
pub struct JudgedLane {
    /// Lane name.
    pub lane: String,
    /// Lane verdict.
    pub verdict: Verdict,
    /// Why.
    pub reasons: Vec<String>,
    /// Items, in prompt order.
    pub items: Vec<JudgedItem>,
    /// The two-sample test of its sampled prompts, when it has any.
    pub test: Option<LaneTest>,
}

impl JudgedLane {
    /// How many of the lane's prompts got `verdict`.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.items
            .iter()
            .filter(|i| i.judgement.verdict == verdict)
            .count()
    }
}

/// A judged run.
#[derive(Debug, Clone)]
pub struct RunJudgement {
    /// The run.
    pub run_id: i64,
    /// What it was compared with.
    pub against: Against,
    /// Lanes in config order.
    pub lanes: Vec<JudgedLane>,
}

/// The one-word status of a judged run, matching its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Nothing drifted and everything was measured (exit 0).
    Ok,
    /// Some lane drifted (exit 1).
    Drifted,
    /// No drift seen, but some lane or prompt could not be measured (exit 3).
    Unmeasured,
}

impl RunJudgement {
    /// Status: drift wins over unmeasured.
    pub fn status(&self) -> RunStatus {
        if self.lanes.iter().any(|l| l.verdict == Verdict::Drifted) {
            RunStatus::Drifted
        } else if self.lanes.iter().any(|l| {
            l.verdict == Verdict::Failed
                || l.items
                    .iter()
                    .any(|i| i.judgement.verdict == Verdict::Failed)
        }) {
            RunStatus::Unmeasured
        } else {
            RunStatus::Ok
        }
    }

    /// The exit code the contract gives the status.
    pub fn exit_code(&self) -> i32 {
        match self.status() {
            RunStatus::Ok => 0,
            RunStatus::Drifted => 1,
            RunStatus::Unmeasured => 3,
        }
    }
}

/// Everything a run is judged with: the store, the prompt set, the baselines and the rules.
pub struct Judge<'a> {
    store: &'a Store,
    set: &'a PromptSet,
    snapshots: PathBuf,
    rules: Rules,
    lane_order: Vec<String>,
    control: Option<String>,
    /// Several runners write the store, so the control lane may be another runner's.
    shared: bool,
}

impl<'a> Judge<'a> {
    /// A judge with the config's snapshots folder, drift rules, lane order and control lane.
    pub fn new(config: &Config, store: &'a Store, set: &'a PromptSet) -> Judge<'a> {
        Judge {
            store,
            set,
            snapshots: config.snapshots.clone(),
            rules: Rules {
                threshold: config.drift.threshold,
                min_drifted: config.drift.min_drifted,
                alpha: config.drift.alpha,
            },
            lane_order: config.lanes.iter().map(|l| l.name.clone()).collect(),
            control: config.drift.control.clone(),
            shared: config.store.is_shared(),
        }
    }

    /// Judges `run_id` as stored.
    pub fn run(&self, run_id: i64, against: Against) -> Result<RunJudgement, JudgeError> {
        judge_run(self, run_id, against)
    }
}

fn judge_run(judge: &Judge<'_>, run_id: i64, against: Against) -> Result<RunJudgement, JudgeError> {
    let results = judge.store.results(run_id)?;
    let reference = match against {
        Against::Baselines => None,
        Against::Run(other) => Some(group(judge.store.results(other)?)),
    };
    let grouped = group(results);
    let mut lanes: Vec<&String> = grouped.keys().map(|(lane, _)| lane).collect();
    lanes.dedup();
    lanes.sort_by_key(|lane| {
        judge
            .lane_order
            .iter()
            .position(|l| l == *lane)
            .unwrap_or(usize::MAX)
    });
    // The control lane first: what drifted there is for review, not an alert, on the others.
    let control = judge.control.as_deref();
    let mut judged: BTreeMap<&String, JudgedLane> = BTreeMap::new();
    let mut control_drifted: Vec<String> = Vec::new();
    for lane in lanes.iter().filter(|l| Some(l.as_str()) == control) {
        let scope = Scope {
            run_id,
            against,
            for_review: &[],
        };
        let judged_lane = judge_one_lane(judge, lane, &scope, &grouped, &reference)?;
        control_drifted = judged_lane
            .items
            .iter()
            .filter(|i| i.judgement.verdict == Verdict::Drifted)
            .map(|i| i.judgement.id.clone())
            .collect();
        judged.insert(lane, judged_lane);
    }
    if let Some(control) = control
        && judge.shared
        && !lanes.iter().any(|l| l.as_str() == control)
        && judge.lane_order.iter().any(|l| l == control)
    {
        // Measured by another runner (a shared store): what it judged of the same night.
        control_drifted = control_drift_elsewhere(judge, control, run_id)?;
    }
    for lane in lanes.iter().filter(|l| Some(l.as_str()) != control) {
        let scope = Scope {
            run_id,
            against,
            for_review: &control_drifted,
        };
        let judged_lane = judge_one_lane(judge, lane, &scope, &grouped, &reference)?;
        judged.insert(lane, judged_lane);
    }
    Ok(RunJudgement {
        run_id,
        against,
        lanes: lanes.iter().filter_map(|l| judged.remove(l)).collect(),
    })
}

/// How far apart two runs may start and still be one night's measurement of the lanes.
const SAME_NIGHT: chrono::Duration = chrono::Duration::hours(12);

/// The prompts that drifted on the control lane in the run another runner made of it closest
/// before or after `run_id` (within [`SAME_NIGHT`]); none when no such run is stored.
fn control_drift_elsewhere(
    judge: &Judge<'_>,
    control: &str,
    run_id: i64,
) -> Result<Vec<String>, JudgeError> {
    let run = judge.store.run(Some(run_id))?;
    let Ok(started) = chrono::DateTime::parse_from_rfc3339(&run.started_at) else {
        return Ok(Vec::new());
    };
    let at = |t: chrono::DateTime<chrono::FixedOffset>| {
        t.to_utc()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    let found = judge.store.latest_verdicts_of_lane(
        control,
        &at(started - SAME_NIGHT),
        &at(started + SAME_NIGHT),
        run_id,
    )?;
    Ok(match found {
        Some((other, verdicts)) => {
            tracing::debug!("control lane {control}: judged by run {other}");
            verdicts
                .into_iter()
                .filter(|v| v.verdict == Verdict::Drifted.as_str())
                .map(|v| v.prompt_id)
                .collect()
        }
        None => {
            tracing::info!(
                "control lane {control} was not measured within {} h of run {run_id}; drift here is not compared with it",
                SAME_NIGHT.num_hours()
            );
            Vec::new()
        }
    })
}

type Grouped = BTreeMap<(String, String), Vec<StoredResult>>;

/// What one lane is judged within.
struct Scope<'a> {
    run_id: i64,
    against: Against,
    /// Prompts that drifted on the control lane: for review here, and out of the lane's test.
    for_review: &'a [String],
}

/// Judges one lane of a run.
fn judge_one_lane(
    judge: &Judge<'_>,
    lane: &str,
    scope: &Scope<'_>,
    grouped: &Grouped,
    reference: &Option<Grouped>,
) -> Result<JudgedLane, JudgeError> {
    let Scope {
        run_id,
        against,
        for_review,
    } = *scope;
    let snapshots = judge.snapshots.as_path();
    let mut items = Vec::new();
    let mut identity_pairs = Vec::new();
    let mut prompts: Vec<&Prompt> = Vec::new();
    for prompt in &judge.set.prompts {
        let Some(stored) = grouped.get(&(lane.to_string(), prompt.id.clone())) else {
            continue;
        };
        let baseline = match reference {
            None => Snapshot::load(snapshots, lane, &prompt.id)?
                .map(|snap| baseline_from_snapshot(snapshots, snap)),
            Some(other) => other
                .get(&(lane.to_string(), prompt.id.clone()))
                .and_then(|results| baseline_from_run(results)),
        };
        let samples: Vec<Sample> = stored.iter().map(sample_of).collect();
        // Judge the run by the prompt as it was sent then: a baseline of another version
        // of the prompt is stale for this run, whatever the prompt says today.
        let as_run = Prompt {
            hash: stored[0].prompt_hash.clone(),
            ..(*prompt).clone()
        };
        let judgement = judge_item(&as_run, &judge.rules, baseline.as_ref(), &samples);
        if let Some(baseline) = &baseline
            && baseline.prompt_hash == as_run.hash
        {
            for sample in samples.iter().filter(|s| s.output.is_some()) {
                identity_pairs.push([
                    baseline.model.clone(),
                    sample.model.clone(),
                    baseline.fingerprint.clone(),
                    sample.fingerprint.clone(),
                ]);
            }
        }
        prompts.push(prompt);
        items.push(JudgedItem {
            judgement,
            baseline,
            samples,
        });
    }

    // Exact and single items that drifted on the control lane too are for review.
    for item in &mut items {
        if item.judgement.verdict == Verdict::Drifted
            && item.judgement.mode != Some(Mode::Sampled)
            && for_review.contains(&item.judgement.id)
        {
            mark_for_review(&mut item.judgement, judge.control.as_deref());
        }
    }

    // The sampled items, tested together; those that drifted on the control lane apart.
    let alpha = judge.rules.alpha;
    let sampled: Vec<usize> = (0..items.len())
        .filter(|&i| {
            items[i].judgement.mode == Some(Mode::Sampled)
                && items[i].judgement.verdict != Verdict::Failed
        })
        .collect();
    let (tested, apart): (Vec<usize>, Vec<usize>) = sampled
        .into_iter()
        .partition(|&i| !for_review.contains(&items[i].judgement.id));
    let seed = |part: &str| {
        let against = match against {
            Against::Baselines => "baselines".to_string(),
            Against::Run(id) => format!("run {id}"),
        };
        format!("{lane}\0{run_id}\0{against}\0{part}")
    };
    let mut test = None;
    if !tested.is_empty() {
        let finding = test_lane(&samples_of(&items, &prompts, &tested), &seed("lane"));
        let lane_test = LaneTest {
            p_value: finding.p_value,
            prompts: tested.len(),
            alpha,
        };
        let most_significant = finding
            .prompts
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.p_value.total_cmp(&b.1.p_value))
            .map(|(k, _)| k);
        for (k, (&i, prompt_finding)) in tested.iter().zip(&finding.prompts).enumerate() {
            let call = if !lane_test.rejected() {
                LaneCall::Quiet
            } else if prompt_finding.p_value <= alpha || Some(k) == most_significant {
                LaneCall::Moved
            } else {
                LaneCall::MovedElsewhere
            };
            apply_test(&mut items[i].judgement, prompt_finding, call, alpha);
        }
        test = Some(lane_test);
    }
    if !apart.is_empty() {
        let finding = test_lane(&samples_of(&items, &prompts, &apart), &seed("review"));
        for (&i, prompt_finding) in apart.iter().zip(&finding.prompts) {
            let judgement = &mut items[i].judgement;
            let call = if prompt_finding.p_value <= alpha {
                LaneCall::Moved
            } else {
                LaneCall::Quiet
            };
            apply_test(judgement, prompt_finding, call, alpha);
            if judgement.verdict == Verdict::Drifted {
                mark_for_review(judgement, judge.control.as_deref());
            }
        }
    }

    let pairs: Vec<Identity<'_>> = identity_pairs
        .iter()
        .map(
            |[baseline_model, model, baseline_fingerprint, fingerprint]| Identity {
                baseline_model: baseline_model.as_deref(),
                model: model.as_deref(),
                baseline_fingerprint: baseline_fingerprint.as_deref(),
                fingerprint: fingerprint.as_deref(),
            },
        )
        .collect();
    let identity = identity_changes(&pairs);
    let judgements: Vec<ItemJudgement> = items.iter().map(|i| i.judgement.clone()).collect();
    let (verdict, reasons) = judge_lane(&judgements, &identity, test.as_ref(), &judge.rules);
    Ok(JudgedLane {
        lane: lane.to_string(),
        verdict,
        reasons,
        items,
        test,
    })
}

fn mark_for_review(judgement: &mut ItemJudgement, control: Option<&str>) {
    judgement.review = true;
    judgement.reasons.push(format!(
        "also drifted on the control lane `{}`: for review, not an alert",
        control.unwrap_or_default()
    ));
}

/// The samples of the items at `indices` for the two-sample test.
fn samples_of<'a>(
    items: &'a [JudgedItem],
    prompts: &[&'a Prompt],
    indices: &[usize],
) -> Vec<PromptSamples<'a>> {
    indices
        .iter()
        .map(|&i| {
            let item = &items[i];
            PromptSamples {
                checks: &prompts[i].checks,
                baseline: item
                    .baseline
                    .iter()
                    .flat_map(|b| b.answers.iter().map(|a| (a.text.as_str(), a.count)))
                    .collect(),
                run: item
                    .samples
                    .iter()
                    .filter_map(|s| s.output.as_deref())
                    .collect(),
            }
        })
        .collect()
}

fn group(results: Vec<StoredResult>) -> BTreeMap<(String, String), Vec<StoredResult>> {
    let mut grouped: BTreeMap<(String, String), Vec<StoredResult>> = BTreeMap::new();
    for result in results {
        grouped
            .entry((result.lane.clone(), result.prompt_id.clone()))
            .or_default()
            .push(result);
    }
    grouped
}

/// The sample a stored result stands for.
pub fn sample_of(result: &StoredResult) -> Sample {
    Sample {
        output: result.output.clone(),
        model: result.model.clone(),
        fingerprint: result.fingerprint.clone(),
        error: match (&result.output, &result.error) {
            (None, Some(error)) => Some(format!("{}: {error}", result.outcome)),
            (None, None) => Some(result.outcome.clone()),
            _ => None,
        },
    }
}

fn baseline_from_snapshot(snapshots: &Path, snapshot: Snapshot) -> Baseline {
    let header = snapshot.header;
    let file = crate::snapshot::path_for(snapshots, &header.lane, &header.prompt_id);
    let name = file
        .strip_prefix(snapshots.parent().unwrap_or(snapshots))
        .unwrap_or(&file)
        .display()
        .to_string();
    Baseline {
        answers: snapshot.answers,
        prompt_hash: header.prompt_hash,
        model: header.model,
        fingerprint: header.fingerprint,
        noise: header.noise,
        origin: format!("{name}, accepted from run {}", header.accepted_from_run),
    }
}

/// A baseline made from another run's served samples of the same (lane, prompt).
fn baseline_from_run(results: &[StoredResult]) -> Option<Baseline> {
    let served: Vec<&StoredResult> = results.iter().filter(|r| r.output.is_some()).collect();
    let first = served.first()?;
    Some(Baseline {
        answers: distinct_answers(served.iter().filter_map(|r| r.output.as_deref())),
        prompt_hash: first.prompt_hash.clone(),
        model: first.model.clone(),
        fingerprint: first.fingerprint.clone(),
        noise: None,
        origin: format!("run {}", first.run_id),
    })
}
