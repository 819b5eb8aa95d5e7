//! `canary check`: validate the config, and with `--probe` ask each lane whether it is up.

use anyhow::Context;
use serde::Serialize;

use super::{EXIT_OK, EXIT_UNANSWERED, load_config, process_env};
use crate::cli::{CheckArgs, Cli, Format};
use crate::config::Config;
use crate::deadline::Deadline;
use crate::prompts::PromptSet;
use crate::router::Router;
use crate::snapshot::Snapshot;
use crate::verdict::{Mode, mode_of};

#[derive(Debug, Serialize)]
struct CheckJson {
    config: String,
    valid: bool,
    prompts: usize,
    prompt_set_hash: String,
    baselines: usize,
    /// Baselines by how they judge: `exact`, `sampled`, `single`.
    baseline_modes: BaselineModes,
    lanes: Vec<LaneJson>,
}

/// How many baselines judge each way.
#[derive(Debug, Default, Serialize)]
struct BaselineModes {
    exact: usize,
    sampled: usize,
    single: usize,
}

#[derive(Debug, Serialize)]
struct LaneJson {
    lane: String,
    base_url: String,
    model: String,
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    probe: Option<ProbeJson>,
}

#[derive(Debug, Serialize)]
struct ProbeJson {
    ok: bool,
    detail: String,
}

/// Runs `canary check`.
pub async fn run(cli: &Cli, args: &CheckArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let set = PromptSet::load(&config.prompts).context("invalid prompt set")?;
    let modes = baseline_modes(&config, &set)?;
    let baselines = modes.exact + modes.sampled + modes.single;
    let router = Router::new(&config, &process_env)?;
    let probes = if args.probe {
        // One deadline for the whole check: a hung lane cannot make `check` hang.
        Some(router.probe_all(Deadline::after(config.deadline)).await)
    } else {
        None
    };
    let statuses = router.statuses();
    let lanes: Vec<LaneJson> = config
        .lanes
        .iter()
        .zip(&statuses)
        .enumerate()
        .map(|(i, (lane, (_, status)))| LaneJson {
            lane: lane.name.clone(),
            base_url: lane.base_url.clone(),
            model: lane.model.clone(),
            status: status.as_str().to_string(),
            probe: probes.as_ref().map(|p| match &p[i].1 {
                Ok(what) => ProbeJson {
                    ok: true,
                    detail: what.clone(),
                },
                Err(why) => ProbeJson {
                    ok: false,
                    detail: why.clone(),
                },
            }),
        })
        .collect();
    // Switched-off lanes are meant to be off: their probe does not fail the check.
    let unanswered = lanes
        .iter()
        .any(|lane| lane.status != "disabled" && lane.probe.as_ref().is_some_and(|p| !p.ok));
    match cli.format {
        Format::Json => {
            let json = CheckJson {
                config: config.path.display().to_string(),
                valid: true,
                prompts: set.prompts.len(),
                prompt_set_hash: set.hash.clone(),
                baselines,
                baseline_modes: modes,
                lanes,
            };
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
        Format::Text => {
            print_text(&config, &lanes);
            println!(
                "  prompts: {} in {} (set {}), {baselines} baselines in {}",
                set.prompts.len(),
                config.prompts.display(),
                &set.hash[..12],
                config.snapshots.display()
            );
            if baselines > 0 {
                println!(
                    "  baselines: {} exact (answered alike in every sample), {} sampled (answers vary: judged by a two-sample test at alpha {}), {} of one sample",
                    modes.exact, modes.sampled, config.drift.alpha, modes.single
                );
            }
            if modes.single > 0 {
                println!(
                    "  note: a baseline of one sample cannot show whether the lane answers exactly; accept a run of several samples (canary accept --samples 10)"
                );
            }
        }
    }
    Ok(if unanswered { EXIT_UNANSWERED } else { EXIT_OK })
}

/// Reads every baseline of every (lane, prompt), so a broken snapshot fails the check, and
/// counts how each judges.
fn baseline_modes(config: &Config, set: &PromptSet) -> anyhow::Result<BaselineModes> {
    let mut modes = BaselineModes::default();
    for lane in &config.lanes {
        for prompt in &set.prompts {
            if let Some(snapshot) = Snapshot::load(&config.snapshots, &lane.name, &prompt.id)? {
                match mode_of(&snapshot.answers, snapshot.header.noise.as_ref()) {
                    Mode::Exact => modes.exact += 1,
                    Mode::Sampled => modes.sampled += 1,
                    Mode::Single => modes.single += 1,
                }
            }
        }
    }
    Ok(modes)
}

fn print_text(config: &Config, lanes: &[LaneJson]) {
    println!(
        "{}: valid ({} lanes, deadline {}, floor {})",
        config.path.display(),
        lanes.len(),
        humantime::format_duration(config.deadline),
        humantime::format_duration(config.floor)
    );
    let width = lanes.iter().map(|l| l.lane.len()).max().unwrap_or(4);
    for lane in lanes {
        let probe = match &lane.probe {
            None => String::new(),
            Some(p) if p.ok => format!("  up: {}", p.detail),
            Some(p) => format!("  DOWN: {}", p.detail),
        };
        println!(
            "  {:width$}  {:13}  {} ({}){probe}",
            lane.lane, lane.status, lane.base_url, lane.model
        );
    }
}
