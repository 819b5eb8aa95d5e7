//! `canary prune`: the store keeps `store.keep` of history, and the runs the baselines need.

use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use super::load_config;
use crate::cli::{Cli, Format, PruneArgs};
use crate::config::Config;
use crate::snapshot::Snapshot;
use crate::store::lock::RunGuard;
use crate::store::{Pruned, Store};

/// What one prune did.
#[derive(Debug)]
pub struct PruneReport {
    /// Runs started before this were removed (RFC 3339).
    pub cutoff: String,
    /// What went.
    pub pruned: Pruned,
    /// The baselines' source runs, kept whatever their age.
    pub baseline_runs: Vec<i64>,
    /// Store size before and after.
    pub bytes: (u64, u64),
}

/// Runs `canary prune`.
pub fn run(cli: &Cli, args: &PruneArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let Some(keep) = args.keep.or(config.store_keep) else {
        anyhow::bail!(
            "nothing says how long to keep runs: set `store: {{ path: ..., keep: 400d }}` in {} or pass --keep 400d",
            config.path.display()
        );
    };
    // A prune never removes a run still `running`; the file lock also keeps a SQLite store's
    // run from starting halfway through.
    let _guard = RunGuard::take(&config.store)?;
    let mut store = Store::open(&config.store)?;
    let report = prune(&config, &mut store, keep, args.dry_run)?;
    let mut after = report.bytes.1;
    if args.vacuum && !args.dry_run {
        store.vacuum()?;
        after = store.disk_bytes();
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    match cli.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "dry_run": args.dry_run,
                "cutoff": report.cutoff,
                "runs": report.pruned.runs,
                "results": report.pruned.results,
                "answers": report.pruned.texts,
                "baseline_runs": report.baseline_runs,
                "bytes_before": report.bytes.0,
                "bytes_after": after,
            }))?
        ),
        Format::Text => {
            println!(
                "{verb} {} runs started before {} ({} results, {} answers no other run gave)",
                report.pruned.runs,
                &report.cutoff[..10],
                report.pruned.results,
                report.pruned.texts
            );
            println!(
                "kept the baselines' source runs: {}",
                if report.baseline_runs.is_empty() {
                    "none (no snapshots yet)".to_string()
                } else {
                    report
                        .baseline_runs
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            );
            if !args.dry_run {
                println!(
                    "store {}: {} → {}{}",
                    config.store.display(),
                    bytesize::ByteSize(report.bytes.0),
                    bytesize::ByteSize(after),
                    if args.vacuum || report.pruned.runs == 0 {
                        ""
                    } else if config.store.is_shared() {
                        " (freed space is reused by later runs)"
                    } else {
                        " (freed pages are reused by later runs; --vacuum shrinks the file)"
                    }
                );
            }
        }
    }
    Ok(0)
}

/// Prunes runs older than `keep`, holding the baselines' source runs. The caller holds the run
/// lock.
pub fn prune(
    config: &Config,
    store: &mut Store,
    keep: Duration,
    dry_run: bool,
) -> anyhow::Result<PruneReport> {
    let baseline_runs = Snapshot::source_runs(&config.snapshots).with_context(|| {
        format!(
            "cannot tell which runs the baselines in {} come from, so nothing was pruned",
            config.snapshots.display()
        )
    })?;
    // A keep reaching before the calendar begins keeps everything.
    let cutoff = chrono::Duration::from_std(keep)
        .ok()
        .and_then(|keep| chrono::Utc::now().checked_sub_signed(keep))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
    let cutoff = cutoff.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let before = store.disk_bytes();
    let pruned = store.prune(&cutoff, &baseline_runs, dry_run)?;
    Ok(PruneReport {
        cutoff,
        pruned,
        baseline_runs,
        bytes: (before, store.disk_bytes()),
    })
}
