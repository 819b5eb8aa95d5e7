//! `canary diff`: the manual review of a run.

use anyhow::Context;

use super::{color_enabled, emit, load_config};
use crate::cli::{Cli, DiffArgs, Format};
use crate::judge::{Against, Judge, RunStatus};
use crate::prompts::PromptSet;
use crate::report;
use crate::store::Store;
use crate::verdict::Verdict;

/// Runs `canary diff`.
pub fn run(cli: &Cli, args: &DiffArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let set = PromptSet::load(&config.prompts).context("invalid prompt set")?;
    let store = Store::open(&config.store)?;
    let run = store.run(args.run)?;
    let against = match args.against.as_str() {
        "baseline" | "baselines" => Against::Baselines,
        other => {
            let id: i64 = other.parse().map_err(|_| {
                anyhow::anyhow!("--against takes `baseline` or a run id, found `{other}`")
            })?;
            store.run(Some(id))?;
            Against::Run(id)
        }
    };
    for lane in &args.lanes {
        if config.lane(lane).is_none() {
            anyhow::bail!("no lane named `{lane}` in the config");
        }
    }
    for id in &args.prompts {
        if set.get(id).is_none() {
            anyhow::bail!("no prompt with id `{id}` in the prompt set");
        }
    }
    let mut judgement = Judge::new(&config, &store, &set).run(run.id, against)?;
    judgement
        .lanes
        .retain(|lane| args.lanes.is_empty() || args.lanes.contains(&lane.lane));
    if !args.prompts.is_empty() {
        for lane in &mut judgement.lanes {
            lane.items
                .retain(|i| args.prompts.contains(&i.judgement.id));
        }
    }
    let latency = report::latency(&store.results(run.id)?);
    // The same rule as `canary run` (lane verdicts: the drift rule, identity, control-lane
    // review); narrowed to some prompts, drift is one of those prompts drifting.
    let drifted = if args.prompts.is_empty() {
        judgement.status() == RunStatus::Drifted
    } else {
        judgement.lanes.iter().any(|lane| {
            lane.items
                .iter()
                .any(|i| i.judgement.verdict == Verdict::Drifted && !i.judgement.review)
        })
    };
    match cli.format {
        Format::Json => emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report::to_json(&judgement, &latency))?
        ))?,
        Format::Text => {
            let color = color_enabled(cli.color);
            let against_text = match against {
                Against::Baselines => "the baselines".to_string(),
                Against::Run(id) => format!("run {id}"),
            };
            let mut text = format!(
                "run {} ({}, {}) against {against_text}\n\n",
                run.id, run.started_at, run.status
            );
            text.push_str(&report::table(&judgement, &latency));
            for lane in &judgement.lanes {
                for item in lane
                    .items
                    .iter()
                    .filter(|i| report::shows_diff(i, args.all))
                {
                    text.push('\n');
                    text.push_str(&report::item(&lane.lane, item, run.id, color));
                }
            }
            if drifted {
                text.push_str(&format!(
                    "\naccept what is right with: canary accept --run {} [--lane L] [--prompt ID]\n",
                    run.id
                ));
            }
            emit(&text)?;
        }
    }
    Ok(i32::from(drifted))
}
