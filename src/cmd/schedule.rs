//! `canary schedule`: the foreground scheduler.

use crate::cli::Cli;

/// Runs `canary schedule`.
pub async fn run(cli: &Cli) -> anyhow::Result<i32> {
    let _ = cli;
    anyhow::bail!("canary schedule is not built yet")
}
