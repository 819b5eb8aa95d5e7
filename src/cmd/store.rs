//! `canary store copy`: a history moved between SQLite and PostgreSQL, verified.

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use super::{EXIT_OK, load_config};
use crate::cli::{Cli, Format, StoreCopyArgs};
use crate::store::copy::copy as copy_store;
use crate::store::{Store, StoreLocation};

/// Runs `canary store copy`.
pub fn copy(cli: &Cli, args: &StoreCopyArgs) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let here = config.path.parent().unwrap_or(Path::new("."));
    let named = |value: &str| -> anyhow::Result<StoreLocation> {
        let mut location = StoreLocation::parse(value, here).map_err(anyhow::Error::msg)?;
        if let StoreLocation::Postgres(target) = &mut location {
            target.password_env = args.password_env.clone();
        }
        Ok(location)
    };
    let from = match &args.from {
        Some(value) => named(value)?,
        None => config.store.clone(),
    };
    let to = named(&args.to)?;
    if from == to {
        anyhow::bail!("--to names the store being copied ({from})");
    }
    if let Some(path) = from.sqlite_path()
        && !path.exists()
    {
        anyhow::bail!("no store at {}: nothing to copy", path.display());
    }
    let source = Store::open(&from).with_context(|| format!("cannot open the source {from}"))?;
    let target = Store::open(&to).with_context(|| format!("cannot open the target {to}"))?;
    let started = std::time::Instant::now();
    let copied = copy_store(&source, &target, &|table, rows| {
        tracing::info!("{table}: {rows} rows copied");
    })?;
    let took = started.elapsed();
    match cli.format {
        Format::Json => println!(
            "{}",
            json!({
                "from": from.to_string(),
                "to": to.to_string(),
                "verified": true,
                "seconds": took.as_secs_f64(),
                "tables": copied.tables.iter().map(|(name, rows, sha256)| json!({
                    "table": name, "rows": rows, "sha256": sha256,
                })).collect::<Vec<_>>(),
            })
        ),
        Format::Text => {
            println!(
                "copied {from} to {to} in {:.1} s, verified:",
                took.as_secs_f64()
            );
            for (name, rows, sha256) in &copied.tables {
                println!("  {name:<16} {rows:>9} rows  sha256 {}", &sha256[..16]);
            }
        }
    }
    Ok(EXIT_OK)
}
