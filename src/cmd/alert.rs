//! `canary alert test`.

use crate::cli::Cli;

/// Runs `canary alert test`.
pub async fn test(cli: &Cli) -> anyhow::Result<i32> {
    let _ = cli;
    anyhow::bail!("canary alert test is not built yet")
}
