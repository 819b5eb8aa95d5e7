//! Judging a stored run: against the accepted baselines (`snapshots/`) or against another run.
//!
//! The store is the source of truth for what a run produced; this module reads it back, finds
//! each (lane, prompt)'s baseline, and applies the rules of [`crate::verdict`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::Config;
use crate::prompts::{Prompt, PromptSet};
use crate::snapshot::{Snapshot, SnapshotError};
use crate::store::{Store, StoreError, StoredResult};
use crate::verdict::{
    Baseline, Identity, ItemJudgement, Rules, Sample, Verdict, identity_changes, judge_item,
    judge_lane, noise_band,
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
            },
            lane_order: config.lanes.iter().map(|l| l.name.clone()).collect(),
            control: config.drift.control.clone(),
        }
    }

    /// Judges `run_id` as stored.
    pub fn run(&self, run_id: i64, against: Against) -> Result<RunJudgement, JudgeError> {
        judge_run(self, run_id, against)
    }
}

fn judge_run(judge: &Judge<'_>, run_id: i64, against: Against) -> Result<RunJudgement, JudgeError> {
    let Judge {
        store,
        set,
        snapshots,
        rules,
        lane_order,
        control,
    } = judge;
    let snapshots = snapshots.as_path();
    let control = control.as_deref();
    let results = store.results(run_id)?;
    let reference = match against {
        Against::Baselines => None,
        Against::Run(other) => Some(group(store.results(other)?)),
    };
    let grouped = group(results);
    let mut lanes: Vec<&String> = grouped.keys().map(|(lane, _)| lane).collect();
    lanes.dedup();
    lanes.sort_by_key(|lane| {
        lane_order
            .iter()
            .position(|l| l == *lane)
            .unwrap_or(usize::MAX)
    });

    let mut judged_lanes = Vec::new();
    for lane in lanes {
        let mut items = Vec::new();
        let mut identity_pairs = Vec::new();
        for prompt in &set.prompts {
            let Some(stored) = grouped.get(&(lane.clone(), prompt.id.clone())) else {
                continue;
            };
            let baseline = match &reference {
                None => Snapshot::load(snapshots, lane, &prompt.id)?
                    .map(|snap| baseline_from_snapshot(snapshots, snap)),
                Some(other) => other
                    .get(&(lane.clone(), prompt.id.clone()))
                    .and_then(|results| baseline_from_run(prompt, results)),
            };
            let samples: Vec<Sample> = stored.iter().map(sample_of).collect();
            // Judge the run by the prompt as it was sent then: a baseline of another version
            // of the prompt is stale for this run, whatever the prompt says today.
            let as_run = Prompt {
                hash: stored[0].prompt_hash.clone(),
                ..(*prompt).clone()
            };
            let prompt = &as_run;
            let judgement = judge_item(prompt, rules, baseline.as_ref(), &samples);
            if let Some(baseline) = &baseline
                && baseline.prompt_hash == prompt.hash
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
            items.push(JudgedItem {
                judgement,
                baseline,
                samples,
            });
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
        judged_lanes.push((lane.clone(), items, identity));
    }

    // Drift the control lane shows too is the prompt or the world changing, not the lane.
    if let Some(control) = control {
        let control_drifted: Vec<String> = judged_lanes
            .iter()
            .filter(|(lane, _, _)| lane == control)
            .flat_map(|(_, items, _)| items.iter())
            .filter(|item| item.judgement.verdict == Verdict::Drifted)
            .map(|item| item.judgement.id.clone())
            .collect();
        for (_, items, _) in judged_lanes
            .iter_mut()
            .filter(|(lane, _, _)| lane != control)
        {
            for item in items.iter_mut() {
                if item.judgement.verdict == Verdict::Drifted
                    && control_drifted.contains(&item.judgement.id)
                {
                    item.judgement.review = true;
                    item.judgement.reasons.push(format!(
                        "also drifted on the control lane `{control}`: for review, not an alert"
                    ));
                }
            }
        }
    }

    let lanes = judged_lanes
        .into_iter()
        .map(|(lane, items, identity)| {
            let judgements: Vec<ItemJudgement> =
                items.iter().map(|i| i.judgement.clone()).collect();
            let (verdict, reasons) = judge_lane(&judgements, &identity, rules);
            JudgedLane {
                lane,
                verdict,
                reasons,
                items,
            }
        })
        .collect();
    Ok(RunJudgement {
        run_id,
        against,
        lanes,
    })
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
        text: snapshot.body,
        prompt_hash: header.prompt_hash,
        model: header.model,
        fingerprint: header.fingerprint,
        noise: header.noise,
        origin: format!("{name}, accepted from run {}", header.accepted_from_run),
    }
}

/// A baseline made from another run's served samples of the same (lane, prompt).
fn baseline_from_run(prompt: &Prompt, results: &[StoredResult]) -> Option<Baseline> {
    let served: Vec<&StoredResult> = results.iter().filter(|r| r.output.is_some()).collect();
    let first = served.first()?;
    let texts: Vec<&str> = served.iter().filter_map(|r| r.output.as_deref()).collect();
    Some(Baseline {
        text: first.output.clone().unwrap_or_default(),
        prompt_hash: first.prompt_hash.clone(),
        model: first.model.clone(),
        fingerprint: first.fingerprint.clone(),
        noise: noise_band(prompt, &texts),
        origin: format!("run {}", first.run_id),
    })
}
