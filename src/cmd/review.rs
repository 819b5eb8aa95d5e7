//! `canary review`: walk drifted, new and stale items one key at a time.

use std::io::{IsTerminal, Write};

use anyhow::Context;
use console::{Key, Term};

use super::{EXIT_ERROR, color_enabled, load_config};
use crate::accept::{Acceptance, accept_run};
use crate::cli::{Cli, ReviewArgs};
use crate::judge::{Against, Judge, JudgedItem};
use crate::prompts::PromptSet;
use crate::report;
use crate::store::Store;
use crate::verdict::Verdict;

/// What the reviewer decided for one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Make the output the baseline.
    Accept,
    /// Keep the baseline.
    Reject,
    /// Decide later.
    Skip,
}

/// Runs `canary review`.
pub fn run(cli: &Cli, args: &ReviewArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let set = PromptSet::load(&config.prompts).context("invalid prompt set")?;
    let store = Store::open(&config.store)?;
    let run = store.run(args.run)?;
    let judgement = Judge::new(&config, &store, &set).run(run.id, Against::Baselines)?;
    let pending: Vec<(&str, &JudgedItem)> = judgement
        .lanes
        .iter()
        .flat_map(|lane| {
            lane.items
                .iter()
                .filter(|i| {
                    matches!(
                        i.judgement.verdict,
                        Verdict::Drifted | Verdict::New | Verdict::Stale
                    )
                })
                .map(move |i| (lane.lane.as_str(), i))
        })
        .collect();
    if pending.is_empty() {
        println!(
            "run {}: nothing to review (no drifted, new or stale items)",
            run.id
        );
        return Ok(0);
    }
    let term = Term::stdout();
    if !term.is_term() || !std::io::stdin().is_terminal() {
        eprintln!("canary review needs a terminal. Without one, decide item by item with:");
        for (lane, item) in &pending {
            eprintln!(
                "  canary accept --run {} --lane {lane} --prompt {}   # {}",
                run.id, item.judgement.id, item.judgement.verdict
            );
        }
        eprintln!(
            "or see the diffs first with: canary diff --run {} --all",
            run.id
        );
        return Ok(EXIT_ERROR);
    }
    let color = color_enabled(cli.color);
    let mut out = std::io::stdout();
    let decisions = review_loop(&pending, run.id, color, &mut out, || term.read_key())?;
    let mut accepted = 0;
    for ((lane, item), decision) in pending.iter().zip(&decisions) {
        if *decision == Decision::Accept {
            let done = accept_run(
                &store,
                &set,
                &config.snapshots,
                run.id,
                Some(&judgement),
                &[lane.to_string()],
                std::slice::from_ref(&item.judgement.id),
            )?;
            for acceptance in done {
                match acceptance {
                    Acceptance::Written { path, .. } | Acceptance::Kept { path, .. } => {
                        accepted += 1;
                        writeln!(out, "accepted  {}", path.display())?;
                    }
                    Acceptance::Refused {
                        lane,
                        prompt_id,
                        why,
                    } => {
                        writeln!(out, "refused   {lane}/{prompt_id}: {why}")?;
                    }
                }
            }
        }
    }
    let count = |d: Decision| decisions.iter().filter(|x| **x == d).count();
    writeln!(
        out,
        "review of run {}: {accepted} accepted, {} rejected (baseline kept), {} skipped",
        run.id,
        count(Decision::Reject),
        count(Decision::Skip)
    )?;
    Ok(0)
}

/// The loop itself: shows each item and reads one key per decision. `read_key` is the terminal
/// in production and a scripted list of keys in tests.
pub fn review_loop(
    pending: &[(&str, &JudgedItem)],
    run_id: i64,
    color: bool,
    out: &mut dyn Write,
    mut read_key: impl FnMut() -> std::io::Result<Key>,
) -> anyhow::Result<Vec<Decision>> {
    let mut decisions = vec![Decision::Skip; pending.len()];
    let mut index = 0;
    let mut show_diff = true;
    while index < pending.len() {
        let (lane, item) = pending[index];
        writeln!(out, "\n[{}/{}] ", index + 1, pending.len())?;
        if show_diff {
            write!(out, "{}", report::item(lane, item, run_id, color))?;
        } else {
            writeln!(
                out,
                "{lane} / {}: {}",
                item.judgement.id, item.judgement.verdict
            )?;
        }
        if item.baseline.is_none()
            && let Some(output) = item.samples.iter().find_map(|s| s.output.as_deref())
        {
            writeln!(out, "  new output:\n{}", indent(output))?;
        }
        writeln!(
            out,
            "  a accept · r reject (keep baseline) · s skip · A accept all remaining · R reject all remaining · d toggle diff · q quit"
        )?;
        out.flush()?;
        match read_key()? {
            Key::Char('a') => {
                decisions[index] = Decision::Accept;
                index += 1;
            }
            Key::Char('r') => {
                decisions[index] = Decision::Reject;
                index += 1;
            }
            Key::Char('s') | Key::Enter => index += 1,
            Key::Char('A') => {
                decisions[index..].fill(Decision::Accept);
                break;
            }
            Key::Char('R') => {
                decisions[index..].fill(Decision::Reject);
                break;
            }
            Key::Char('d') => show_diff = !show_diff,
            Key::Char('q') | Key::Escape => break,
            _ => writeln!(out, "  (unknown key)")?,
        }
    }
    Ok(decisions)
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    │ {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
