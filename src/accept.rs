//! Turning a run's answers into baselines.

use std::path::{Path, PathBuf};

use crate::judge::{RunJudgement, sample_of};
use crate::prompts::PromptSet;
use crate::snapshot::{Snapshot, SnapshotError, SnapshotHeader, distinct_answers};
use crate::store::{Store, StoreError, StoredResult};
use crate::verdict::Verdict;

/// Accepting failed.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A snapshot could not be written.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
}

/// What accepting one (lane, prompt) did.
#[derive(Debug, Clone, PartialEq)]
pub enum Acceptance {
    /// The baseline was written.
    Written {
        /// Lane.
        lane: String,
        /// Prompt id.
        prompt_id: String,
        /// The snapshot file.
        path: PathBuf,
        /// Samples behind it.
        samples: usize,
        /// Distinct answers among them.
        distinct: usize,
    },
    /// The run's answers agree with a baseline of more samples: that baseline stays, since it
    /// says the same with more evidence.
    Kept {
        /// Lane.
        lane: String,
        /// Prompt id.
        prompt_id: String,
        /// The snapshot file.
        path: PathBuf,
        /// Samples behind it.
        samples: usize,
    },
    /// Nothing was written, and why.
    Refused {
        /// Lane.
        lane: String,
        /// Prompt id.
        prompt_id: String,
        /// Why.
        why: String,
    },
}

/// Writes the baselines of the judged run (optionally only some lanes and prompts). Never from
/// a failed result, and never for a prompt that changed since the run.
///
/// Accepting makes what the lane answers now the reference. Where it answers as its baseline
/// already does (the item is unchanged or within noise) on fewer samples than the baseline holds,
/// the baseline stays: it says the same with more evidence, and a nightly run of one answer must
/// not shrink an exact baseline of ten, nor ten samples replace a sampled baseline of thirty.
/// Only its identity (model, fingerprint) is refreshed when that changed.
///
/// Without a `judgement` (the baselines could not be read to judge the run), every answer is
/// written as it is.
pub fn accept_run(
    store: &Store,
    set: &PromptSet,
    snapshots: &Path,
    run_id: i64,
    judgement: Option<&RunJudgement>,
    lanes: &[String],
    prompts: &[String],
) -> Result<Vec<Acceptance>, AcceptError> {
    let results = store.results(run_id)?;
    let mut groups: Vec<(String, String, Vec<StoredResult>)> = Vec::new();
    for result in results {
        if (!lanes.is_empty() && !lanes.contains(&result.lane))
            || (!prompts.is_empty() && !prompts.contains(&result.prompt_id))
        {
            continue;
        }
        match groups.last_mut() {
            Some((lane, id, group)) if *lane == result.lane && *id == result.prompt_id => {
                group.push(result)
            }
            _ => groups.push((result.lane.clone(), result.prompt_id.clone(), vec![result])),
        }
    }
    let mut done = Vec::new();
    for (lane, prompt_id, group) in groups {
        let refuse = |why: String| Acceptance::Refused {
            lane: lane.clone(),
            prompt_id: prompt_id.clone(),
            why,
        };
        let Some(prompt) = set.get(&prompt_id) else {
            done.push(refuse("the prompt is no longer in the prompt set".into()));
            continue;
        };
        let served: Vec<&StoredResult> = group.iter().filter(|r| r.output.is_some()).collect();
        let Some(first) = served.first() else {
            let why = sample_of(&group[0]).error.unwrap_or_default();
            done.push(refuse(format!(
                "no answer in run {run_id} ({why}); a failed result is never a baseline"
            )));
            continue;
        };
        if first.prompt_hash != prompt.hash {
            done.push(refuse(format!(
                "the prompt changed since run {run_id}; run it again and accept that run"
            )));
            continue;
        }
        let texts: Vec<&str> = served.iter().filter_map(|r| r.output.as_deref()).collect();
        let mut answers = distinct_answers(texts.iter().copied());
        let agrees = judgement
            .iter()
            .flat_map(|j| &j.lanes)
            .filter(|l| l.lane == lane)
            .flat_map(|l| &l.items)
            .any(|i| {
                i.judgement.id == prompt_id
                    && matches!(
                        i.judgement.verdict,
                        Verdict::Unchanged | Verdict::WithinNoise
                    )
            });
        let current = match Snapshot::load(snapshots, &lane, &prompt_id) {
            Ok(current) => current,
            Err(err) => {
                tracing::warn!("{err}; it is replaced by run {run_id}'s answers");
                None
            }
        };
        if let Some(current) = current.filter(|c| {
            agrees
                && c.header.prompt_hash == prompt.hash
                && (c.header.samples as usize) > texts.len()
        }) {
            if current.header.model == first.model
                && current.header.fingerprint == first.fingerprint
            {
                done.push(Acceptance::Kept {
                    lane,
                    prompt_id: prompt_id.clone(),
                    path: crate::snapshot::path_for(snapshots, &current.header.lane, &prompt_id),
                    samples: current.header.samples as usize,
                });
                continue;
            }
            // The same answers from a renamed model: keep the evidence, take the new identity.
            answers = current.answers;
        }
        let snapshot = Snapshot::new(
            SnapshotHeader {
                prompt_id: prompt_id.clone(),
                prompt_hash: prompt.hash.clone(),
                lane: lane.clone(),
                model: first.model.clone(),
                fingerprint: first.fingerprint.clone(),
                params: prompt.request.params.clone(),
                accepted_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                accepted_from_run: run_id,
                samples: 0,
                counts: Vec::new(),
                separator: None,
                noise: None,
            },
            answers,
        );
        let path = snapshot.write(snapshots)?;
        done.push(Acceptance::Written {
            lane,
            prompt_id,
            path,
            samples: snapshot.header.samples as usize,
            distinct: snapshot.answers.len(),
        });
    }
    Ok(done)
}
