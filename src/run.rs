//! The canary run: every enabled lane × every pinned prompt (× samples) through the shared
//! router, each lane measured by its own answers, every result committed as it arrives.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;

use crate::checks::normalize_whitespace;
use crate::completion::Completion;
use crate::config::{AUTO_BASELINE_SAMPLES, AUTO_SAMPLES, Config, SampleCount};
use crate::deadline::Deadline;
use crate::judge::RunJudgement;
use crate::metrics::LaneStatus;
use crate::prompts::{Prompt, PromptSet};
use crate::router::{Attempt, Router};
use crate::snapshot::Snapshot;
use crate::store::writer::{GroupWriter, OwnedResult};
use crate::store::{Store, StoreError};
use crate::verdict::{Mode, Verdict, mode_of};

/// What a run will do.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// Lanes to measure, with their in-flight caps, in config order.
    pub lanes: Vec<(String, usize)>,
    /// Lanes skipped because they are switched off, with why.
    pub skipped: Vec<(String, String)>,
    /// Prompts to send.
    pub prompts: Vec<&'a Prompt>,
    /// How many samples of each (lane, prompt), lane by lane in prompt order.
    pub items: Vec<PlannedItem<'a>>,
    /// Baselines that could not be read (what is wrong with each); their prompts are sized as
    /// if they had none.
    pub unreadable: Vec<String>,
}

/// The samples of one (lane, prompt) in a run.
#[derive(Debug, Clone)]
pub struct PlannedItem<'a> {
    /// Lane.
    pub lane: String,
    /// Prompt.
    pub prompt: &'a Prompt,
    /// First sample number (above 0 when more samples are added to a run).
    pub first: u32,
    /// Samples to take.
    pub samples: u32,
    /// Whether canary chose the number (`auto`), so it may take more to confirm a change.
    pub auto: bool,
}

impl Plan<'_> {
    /// Jobs in all.
    pub fn jobs(&self) -> usize {
        self.items.iter().map(|i| i.samples as usize).sum()
    }

    /// The most samples any (lane, prompt) gets.
    pub fn max_samples(&self) -> u32 {
        self.items.iter().map(|i| i.samples).max().unwrap_or(1)
    }
}

/// How many samples a (lane, prompt) gets: `--samples`, else the prompt's `samples:`, else
/// `drift.samples` (`auto`: one where the lane's baseline shows it answers the prompt exactly,
/// [`AUTO_SAMPLES`] everywhere else). Returns the count and whether canary chose it.
pub fn samples_for(
    config: &Config,
    prompt: &Prompt,
    baseline: Option<&Snapshot>,
    flag: Option<u32>,
) -> (u32, bool) {
    if let Some(n) = flag.or(prompt.samples) {
        return (n.max(1), false);
    }
    match config.drift.samples {
        SampleCount::Fixed(n) => (n, false),
        SampleCount::Auto => {
            let exact = baseline.is_some_and(|snapshot| {
                snapshot.header.prompt_hash == prompt.hash
                    && mode_of(&snapshot.answers, snapshot.header.noise.as_ref()) == Mode::Exact
            });
            (if exact { 1 } else { AUTO_SAMPLES }, true)
        }
    }
}

/// More samples of an item of a run, and why.
#[derive(Debug, Clone)]
pub struct MoreSamples<'a> {
    /// The samples to add.
    pub item: PlannedItem<'a>,
    /// Why, for the log.
    pub why: &'static str,
}

/// More samples for the items of `plan` whose number canary chose (`auto`), where the first
/// answers show they are needed:
/// - an answer that left its **exact** baseline: up to [`AUTO_SAMPLES`], to tell a lane that
///   changed (every sample differs) from one that is not as exact as its baseline looked;
/// - the **sampled** prompts of a lane whose test rejected: up to [`AUTO_BASELINE_SAMPLES`], to
///   confirm the drift on more answers (the lane is then judged on them all; more samples can
///   clear a false alarm but not raise one, since none are taken unless the lane already
///   rejected), and so that the run can be accepted as baselines of that many;
/// - answers that **vary** with no baseline of several samples to judge them (a new or stale
///   prompt, a one-sample baseline): up to [`AUTO_BASELINE_SAMPLES`], so that accepting this run
///   gives a baseline that represents the lane's spread well.
pub fn more_samples<'a>(plan: &Plan<'a>, preview: &RunJudgement) -> Vec<MoreSamples<'a>> {
    let mut more = Vec::new();
    for item in plan.items.iter().filter(|item| item.auto) {
        let Some(lane) = preview.lanes.iter().find(|l| l.lane == item.lane) else {
            continue;
        };
        let Some(judged) = lane
            .items
            .iter()
            .find(|judged| judged.judgement.id == item.prompt.id)
        else {
            continue;
        };
        let j = &judged.judgement;
        let varies = {
            let mut answers: Vec<String> = judged
                .samples
                .iter()
                .filter_map(|s| s.output.as_deref().map(normalize_whitespace))
                .collect();
            answers.sort_unstable();
            answers.dedup();
            answers.len() > 1
        };
        let lane_moved = lane.test.is_some_and(|t| t.rejected());
        let (target, why) = match (j.mode, j.verdict) {
            (Some(Mode::Exact), Verdict::Drifted) => (
                AUTO_SAMPLES,
                "the answer left its exact baseline; more samples confirm it",
            ),
            (Some(Mode::Sampled), verdict)
                if lane_moved && !j.review && verdict != Verdict::Failed =>
            {
                (
                    AUTO_BASELINE_SAMPLES,
                    "the lane's sampled answers moved; more samples confirm it",
                )
            }
            (None, Verdict::New | Verdict::Stale) | (Some(Mode::Single), _) if varies => (
                AUTO_BASELINE_SAMPLES,
                "the answers vary; more samples make a baseline that shows how much",
            ),
            _ => continue,
        };
        if target > item.samples {
            more.push(MoreSamples {
                item: PlannedItem {
                    first: item.first + item.samples,
                    samples: target - item.samples,
                    ..item.clone()
                },
                why,
            });
        }
    }
    more
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

/// Works out which lanes and prompts a run covers, and how many samples of each.
pub fn plan<'a>(
    config: &Config,
    router: &Router,
    set: &'a PromptSet,
    only_lanes: &[String],
    only_prompts: &[String],
    samples: Option<u32>,
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
    let prompts: Vec<&Prompt> = set
        .prompts
        .iter()
        .filter(|p| only_prompts.is_empty() || only_prompts.contains(&p.id))
        .collect();
    let mut items = Vec::new();
    let mut unreadable = Vec::new();
    for (lane, _) in &lanes {
        for prompt in &prompts {
            let baseline =
                Snapshot::load(&config.snapshots, lane, &prompt.id).unwrap_or_else(|err| {
                    unreadable.push(err.to_string());
                    None
                });
            let (count, auto) = samples_for(config, prompt, baseline.as_ref(), samples);
            items.push(PlannedItem {
                lane: lane.clone(),
                prompt,
                first: 0,
                samples: count,
                auto,
            });
        }
    }
    Ok(Plan {
        lanes,
        skipped,
        prompts,
        items,
        unreadable,
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
    let total = plan.jobs();
    let progress = progress_bar(total as u64);
    let (sender, mut receiver) = mpsc::unbounded_channel::<Finished<'_>>();

    let mut workers = Vec::new();
    for (lane, max_inflight) in &plan.lanes {
        let queue: Mutex<VecDeque<(&Prompt, u32)>> = Mutex::new(
            plan.items
                .iter()
                .filter(|item| &item.lane == lane)
                .flat_map(|item| {
                    (item.first..item.first + item.samples).map(move |s| (item.prompt, s))
                })
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
    // The workers never wait for the disk: a thread of its own commits, in groups.
    let writer = GroupWriter::start(store.location(), run_id)?;
    let handing_over = async {
        let mut handed = 0;
        while let Some(done) = receiver.recv().await {
            let line = format!(
                "{}/{} #{}: {} in {} ms",
                done.lane,
                done.prompt.id,
                done.sample,
                done.attempt
                    .as_ref()
                    .map_or("error", |a| a.outcome.as_str()),
                done.attempt.as_ref().map_or(0, |a| a.call_ms)
            );
            if !writer.send(owned(done)) {
                // The writer stopped on an error (`finish` says which): stop the workers too
                // rather than make calls whose results cannot be kept.
                receiver.close();
                break;
            }
            handed += 1;
            progress.inc(1);
            if progress.is_hidden() {
                // Under cron this would be a line per answer in someone's inbox every night:
                // the summary says what matters, and -v shows each result.
                tracing::debug!("run {run_id}: {line} ({handed}/{total})");
            } else {
                progress.set_message(line);
            }
        }
    };
    tokio::join!(sending, handing_over);
    let stored = writer.finish();
    progress.finish_and_clear();
    stored
}

fn owned(done: Finished<'_>) -> OwnedResult {
    let attempt = done.attempt.as_ref();
    let completion = done.completion;
    let error = match &completion {
        None => attempt.and_then(|a| a.detail.clone()),
        Some(_) => None,
    };
    let (output, model, fingerprint, finish_reason, prompt_tokens, completion_tokens) =
        match completion {
            Some(c) => (
                Some(c.text),
                c.model,
                c.fingerprint,
                c.finish_reason,
                c.usage.prompt_tokens,
                c.usage.completion_tokens,
            ),
            None => (None, None, None, None, None, None),
        };
    OwnedResult {
        lane: done.lane.to_string(),
        prompt_id: done.prompt.id.clone(),
        prompt_hash: done.prompt.hash.clone(),
        sample: i64::from(done.sample),
        outcome: attempt.map_or("error", |a| a.outcome.as_str()).to_string(),
        output,
        model,
        fingerprint,
        finish_reason,
        prompt_tokens,
        completion_tokens,
        queue_ms: attempt.map_or(0, |a| a.queue_ms),
        call_ms: attempt.map_or(0, |a| a.call_ms),
        error,
    }
}

/// A progress bar on a terminal; hidden under cron, where `-v` logs each result instead.
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
