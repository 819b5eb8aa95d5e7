//! `canary report`: one self-contained HTML file for a run and the runs before it.

use anyhow::Context;

use super::{EXIT_OK, load_config};
use crate::cli::{Cli, ReportArgs};
use crate::html::report::{history, page};
use crate::judge::{Against, Judge};
use crate::prompts::PromptSet;
use crate::store::Store;

/// Runs `canary report`.
pub fn run(cli: &Cli, args: &ReportArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let set = PromptSet::load(&config.prompts).context("invalid prompt set")?;
    let store = Store::open(&config.store)?;
    let run = store.run(args.run)?;
    let judgement = Judge::new(&config, &store, &set).run(run.id, Against::Baselines)?;
    let lanes: Vec<String> = judgement.lanes.iter().map(|l| l.lane.clone()).collect();
    let histories = history(&store, &lanes, run.id, args.runs)?;
    let page = page(&run, &judgement, &histories, config.drift.alpha);
    if let Some(dir) = args.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&args.output, page)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    println!(
        "report of run {} (and the {} runs before it) written to {}",
        run.id,
        histories
            .iter()
            .map(|h| h.runs.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1),
        args.output.display()
    );
    Ok(EXIT_OK)
}
