//! `canary report`: one self-contained HTML file for a run.

use std::fmt::Write as _;

use anyhow::Context;

use super::{EXIT_OK, load_config};
use crate::cli::{Cli, ReportArgs};
use crate::html;
use crate::judge::{Against, Judge, RunJudgement};
use crate::prompts::PromptSet;
use crate::store::{RunRow, Store};

/// Runs `canary report`.
pub fn run(cli: &Cli, args: &ReportArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let set = PromptSet::load(&config.prompts).context("invalid prompt set")?;
    let store = Store::open(&config.store)?;
    let run = store.run(args.run)?;
    let judgement = Judge::new(&config, &store, &set).run(run.id, Against::Baselines)?;
    let page = render(&run, &judgement);
    if let Some(dir) = args.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&args.output, page)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    println!(
        "report of run {} written to {}",
        run.id,
        args.output.display()
    );
    Ok(EXIT_OK)
}

/// The page: everything inline (no scripts, no external styles), model output escaped.
pub fn render(run: &RunRow, judgement: &RunJudgement) -> String {
    let mut body = format!(
        "<h1>canary run {}</h1><p>started {}, {}; status <b>{}</b> (exit {})</p>",
        run.id,
        html::escape(&run.started_at),
        html::escape(&run.status),
        serde_json::to_value(judgement.status())
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        judgement.exit_code()
    );
    for lane in &judgement.lanes {
        let _ = write!(
            body,
            "<h2>lane {}: {}</h2>",
            html::escape(&lane.lane),
            lane.verdict
        );
        if !lane.reasons.is_empty() {
            body.push_str("<ul>");
            for reason in &lane.reasons {
                let _ = write!(body, "<li>{}</li>", html::escape(reason));
            }
            body.push_str("</ul>");
        }
        body.push_str(&html::lane_table(lane));
        for item in &lane.items {
            body.push_str(&html::item(&lane.lane, item, run.id));
        }
    }
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>canary run {}</title></head>\
         <body style=\"font-family:sans-serif;max-width:1100px;margin:auto\">{body}</body></html>\n",
        run.id
    )
}
