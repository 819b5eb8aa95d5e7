//! `canary accept`: a run's answers become the baselines.

use anyhow::Context;

use super::{load_config, process_env};
use crate::accept::{Acceptance, accept_run};
use crate::cli::{AcceptArgs, Cli, Format};
use crate::judge::{Against, Judge};
use crate::prompts::PromptSet;
use crate::router::Router;
use crate::run::{execute, plan};
use crate::store::Store;
use crate::store::lock::{LockError, RunGuard};

/// Runs `canary accept`.
pub async fn run(cli: &Cli, args: &AcceptArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let set = PromptSet::load(&config.prompts).context("invalid prompt set")?;
    let run_id = match args.samples {
        None => {
            let store = Store::open(&config.store)?;
            let run = store.run(args.run)?;
            match run.status.as_str() {
                // Opening a shared store marked the runs whose leases lapsed as interrupted:
                // one still running there is alive.
                "running" if config.store.is_shared() => anyhow::bail!(
                    "run {} is still in progress (its runner holds its lane leases); accept it when it has finished",
                    run.id
                ),
                "running" => match RunGuard::take(&config.store) {
                    Err(LockError::Held { holder, .. }) => anyhow::bail!(
                        "run {} is still in progress ({holder}); accept it when it has finished",
                        run.id
                    ),
                    _ => tracing::warn!(
                        "run {} did not finish (it was killed); accepting the results it has",
                        run.id
                    ),
                },
                "interrupted" => tracing::warn!(
                    "run {} was interrupted; accepting the results it has, the rest keep their baselines",
                    run.id
                ),
                _ => {}
            }
            run.id
        }
        Some(samples) => calibration_run(&config, &set, args, samples).await?,
    };
    let store = Store::open(&config.store)?;
    // Judged against the baselines as they are, so answers that only repeat a baseline of
    // more samples leave it in place.
    let judgement = match Judge::new(&config, &store, &set).run(run_id, Against::Baselines) {
        Ok(judgement) => Some(judgement),
        Err(err) => {
            tracing::warn!(
                "run {run_id} cannot be judged ({err}); its answers are written as they are"
            );
            None
        }
    };
    let done = accept_run(
        &store,
        &set,
        &config.snapshots,
        run_id,
        judgement.as_ref(),
        &args.lanes,
        &args.prompts,
    )?;
    let written = done
        .iter()
        .filter(|a| matches!(a, Acceptance::Written { .. }))
        .count();
    let kept = done
        .iter()
        .filter(|a| matches!(a, Acceptance::Kept { .. }))
        .count();
    match cli.format {
        Format::Json => {
            let items: Vec<serde_json::Value> = done
                .iter()
                .map(|a| match a {
                    Acceptance::Written {
                        lane,
                        prompt_id,
                        path,
                        samples,
                        distinct,
                    } => serde_json::json!({
                        "lane": lane, "id": prompt_id, "accepted": true,
                        "snapshot": path.display().to_string(), "samples": samples,
                        "distinct": distinct}),
                    Acceptance::Kept {
                        lane,
                        prompt_id,
                        path,
                        samples,
                    } => serde_json::json!({
                        "lane": lane, "id": prompt_id, "accepted": true, "kept": true,
                        "snapshot": path.display().to_string(), "samples": samples}),
                    Acceptance::Refused {
                        lane,
                        prompt_id,
                        why,
                    } => serde_json::json!({
                        "lane": lane, "id": prompt_id, "accepted": false, "why": why}),
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"run_id": run_id, "accepted": written, "kept": kept, "items": items})
                )?
            );
        }
        Format::Text => {
            for acceptance in &done {
                match acceptance {
                    Acceptance::Written {
                        path,
                        samples,
                        distinct,
                        ..
                    } => {
                        let shape = match (*samples, *distinct) {
                            (1, _) => "1 sample: whether the lane answers it exactly is not known yet, so the next runs sample it again".to_string(),
                            (n, 1) => format!("{n} samples, all the same answer: judged exactly"),
                            (n, d) => format!("{n} samples, {d} distinct answers: judged by its samples"),
                        };
                        println!("accepted  {} ({shape})", path.display());
                    }
                    Acceptance::Kept { path, samples, .. } => println!(
                        "kept      {} (its {samples} samples say the same with more evidence)",
                        path.display()
                    ),
                    Acceptance::Refused {
                        lane,
                        prompt_id,
                        why,
                    } => println!("refused   {lane}/{prompt_id}: {why}"),
                }
            }
            if kept > 0 {
                println!("{written} baselines written from run {run_id}, {kept} kept");
            } else {
                println!("{written} baselines written from run {run_id}");
            }
        }
    }
    if done.is_empty() {
        anyhow::bail!("run {run_id} has no results matching the given --lane/--prompt");
    }
    // Nothing written is a failure a script should see, not a quiet success.
    Ok(if written + kept == 0 {
        super::EXIT_ERROR
    } else {
        0
    })
}

/// `accept --samples N`: a fresh run of N samples per prompt, to accept with its noise band.
async fn calibration_run(
    config: &crate::config::Config,
    set: &PromptSet,
    args: &AcceptArgs,
    samples: u32,
) -> anyhow::Result<i64> {
    let mut guard = RunGuard::take(&config.store)?;
    let mut store = Store::open(&config.store)?;
    // A shared store marked the runs whose leases lapsed as it opened.
    if !config.store.is_shared() {
        store.mark_interrupted()?;
    }
    let router = Router::new(config, &process_env)?;
    let plan = plan(
        config,
        &router,
        set,
        &args.lanes,
        &args.prompts,
        Some(samples),
    )?;
    let lanes: Vec<String> = plan.lanes.iter().map(|(l, _)| l.clone()).collect();
    let run_id = store.begin_run(&set.hash, plan.max_samples(), &lanes)?;
    super::run::lease_lanes(config, &store, &mut guard, run_id, &lanes, None)?;
    tracing::info!("run {run_id}: calibrating with {samples} samples per prompt");
    execute(&plan, run_id, config, &router, &mut store).await?;
    store.finish_run(run_id, &[], &[], 0)?;
    Ok(run_id)
}
