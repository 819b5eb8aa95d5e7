//! The canary run: every enabled lane × every pinned prompt (× samples) through the shared
//! router, each lane measured by its own answers, every result committed as it arrives.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;

use crate::completion::Completion;
use crate::config::Config;
use crate::deadline::Deadline;
use crate::metrics::LaneStatus;
use crate::prompts::{Prompt, PromptSet};
use crate::router::{Attempt, Router};
use crate::store::{NewResult, Store, StoreError};

/// What a run will do.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// Lanes to measure, with their in-flight caps, in config order.
    pub lanes: Vec<(String, usize)>,
    /// Lanes skipped because they are switched off, with why.
    pub skipped: Vec<(String, String)>,
    /// Prompts to send.
    pub prompts: Vec<&'a Prompt>,
    /// Samples per (lane, prompt).
    pub samples: u32,
}

/// The run cannot be planned as asked.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// `--lane` named a lane the config does not have.
    #[error("no lane named `{0}` in the config (lanes: {1})")]
    UnknownLane(String, String),
    /// `--prompt` named a prompt the set does not have.
    #[error("no prompt with id `{0}` in the prompt set")]
    UnknownPrompt(String),
    /// Nothing is left to measure.
    #[error("no enabled lane to measure{0}")]
    NoLanes(String),
}

/// Works out which lanes and prompts a run covers.
pub fn plan<'a>(
    config: &Config,
    router: &Router,
    set: &'a PromptSet,
    only_lanes: &[String],
    only_prompts: &[String],
    samples: u32,
) -> Result<Plan<'a>, PlanError> {
    let names: Vec<&str> = config.lanes.iter().map(|l| l.name.as_str()).collect();
    for lane in only_lanes {
        if !names.contains(&lane.as_str()) {
            return Err(PlanError::UnknownLane(lane.clone(), names.join(", ")));
        }
    }
    for id in only_prompts {
        if set.get(id).is_none() {
            return Err(PlanError::UnknownPrompt(id.clone()));
        }
    }
    let statuses = router.statuses();
    let mut lanes = Vec::new();
    let mut skipped = Vec::new();
    for lane in &config.lanes {
        if !only_lanes.is_empty() && !only_lanes.contains(&lane.name) {
            continue;
        }
        let disabled = statuses
            .iter()
            .any(|(name, status)| name == &lane.name && *status == LaneStatus::Disabled);
        if disabled {
            let why = if lane.enabled {
                format!("{}=off", lane.kill_switch_env)
            } else {
                "enabled: false".to_string()
            };
            skipped.push((lane.name.clone(), why));
        } else {
            lanes.push((lane.name.clone(), lane.max_inflight));
        }
    }
    if lanes.is_empty() {
        let why = if skipped.is_empty() {
            String::new()
        } else {
            format!(
                ": switched off: {}",
                skipped
                    .iter()
                    .map(|(l, why)| format!("{l} ({why})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(PlanError::NoLanes(why));
    }
    let prompts = set
        .prompts
        .iter()
        .filter(|p| only_prompts.is_empty() || only_prompts.contains(&p.id))
        .collect();
    Ok(Plan {
        lanes,
        skipped,
        prompts,
        samples: samples.max(1),
    })
}

/// One finished job of the run.
struct Finished<'a> {
    lane: &'a str,
    prompt: &'a Prompt,
    sample: u32,
    completion: Option<Completion>,
    attempt: Option<Attempt>,
}

/// Sends every job of `plan` and commits each result to `store` the moment it arrives.
///
/// Each lane gets `max_inflight` workers, and each job's deadline is minted when a worker
/// takes it, so a long prompt set never spends its budget queueing. Lanes run side by side.
pub async fn execute(
    plan: &Plan<'_>,
    run_id: i64,
    config: &Config,
    router: &Router,
    store: &mut Store,
) -> Result<usize, StoreError> {
    let total = plan.lanes.len() * plan.prompts.len() * plan.samples as usize;
    let progress = progress_bar(total as u64);
    let (sender, mut receiver) = mpsc::unbounded_channel::<Finished<'_>>();

    let mut workers = Vec::new();
    for (lane, max_inflight) in &plan.lanes {
        let queue: Mutex<VecDeque<(&Prompt, u32)>> = Mutex::new(
            plan.prompts
                .iter()
                .flat_map(|p| (0..plan.samples).map(move |s| (*p, s)))
                .collect(),
        );
        let queue = std::sync::Arc::new(queue);
        for _ in 0..*max_inflight {
            let (queue, sender) = (queue.clone(), sender.clone());
            let lane = lane.as_str();
            workers.push(async move {
                loop {
                    let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                    let Some((prompt, sample)) = next else { break };
                    // The edge of this job: its one deadline is minted here.
                    let deadline = Deadline::after(config.deadline);
                    let routed = router.route_to(lane, &prompt.request, deadline).await;
                    let (completion, attempt) = match routed {
                        Ok(mut routed) => (routed.completion.take(), routed.attempts.pop()),
                        Err(_) => (None, None),
                    };
                    let finished = Finished {
                        lane,
                        prompt,
                        sample,
                        completion,
                        attempt,
                    };
                    if sender.send(finished).is_err() {
                        break;
                    }
                }
            });
        }
    }
    drop(sender);

    let sending = futures_util::future::join_all(workers);
    let committing = async {
        let mut stored = 0;
        while let Some(done) = receiver.recv().await {
            commit(store, run_id, &done)?;
            stored += 1;
            progress.inc(1);
            let outcome = done
                .attempt
                .as_ref()
                .map_or("error", |a| a.outcome.as_str());
            let call_ms = done.attempt.as_ref().map_or(0, |a| a.call_ms);
            let line = format!(
                "{}/{} #{}: {outcome} in {call_ms} ms",
                done.lane, done.prompt.id, done.sample
            );
            if progress.is_hidden() {
                tracing::info!("run {run_id}: {line} ({stored}/{total})");
            } else {
                progress.set_message(line);
            }
        }
        Ok::<usize, StoreError>(stored)
    };
    let (_, stored) = tokio::join!(sending, committing);
    progress.finish_and_clear();
    stored
}

fn commit(store: &mut Store, run_id: i64, done: &Finished<'_>) -> Result<(), StoreError> {
    let attempt = done.attempt.as_ref();
    let completion = done.completion.as_ref();
    let outcome = attempt.map_or("error", |a| a.outcome.as_str());
    store.insert_result(
        run_id,
        &NewResult {
            lane: done.lane,
            prompt_id: &done.prompt.id,
            prompt_hash: &done.prompt.hash,
            sample: i64::from(done.sample),
            outcome,
            output: completion.map(|c| c.text.as_str()),
            model: completion.and_then(|c| c.model.as_deref()),
            fingerprint: completion.and_then(|c| c.fingerprint.as_deref()),
            finish_reason: completion.and_then(|c| c.finish_reason.as_deref()),
            prompt_tokens: completion.and_then(|c| c.usage.prompt_tokens),
            completion_tokens: completion.and_then(|c| c.usage.completion_tokens),
            queue_ms: attempt.map_or(0, |a| a.queue_ms),
            call_ms: attempt.map_or(0, |a| a.call_ms),
            error: attempt
                .and_then(|a| a.detail.as_deref())
                .filter(|_| completion.is_none()),
        },
    )
}

/// A progress bar on a terminal; hidden under cron, where log lines take its place.
fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {elapsed} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
