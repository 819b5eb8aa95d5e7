//! The commands, one file each. Each returns the process exit code; errors that should exit 2
//! come back as `Err` and are printed once by `main`.

pub mod ask;
pub mod check;

use std::path::Path;

use anyhow::Context;

use crate::cli::{Cli, Command};
use crate::config::Config;

/// Exit code: success.
pub const EXIT_OK: i32 = 0;
/// Exit code: usage, config or store error.
pub const EXIT_ERROR: i32 = 2;
/// Exit code: nothing drifted, but something could not be measured or answered.
pub const EXIT_UNANSWERED: i32 = 3;

/// Runs the parsed command line and returns the exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match &cli.command {
        Command::Ask(args) => ask::run(&cli, args).await,
        Command::Check(args) => check::run(&cli, args).await,
    }
}

/// Loads the config named on the command line.
pub fn load_config(path: &Path) -> anyhow::Result<Config> {
    if !path.exists() {
        anyhow::bail!(
            "config file {} not found: pass -c PATH, set CANARY_CONFIG, or start from canary.example.yaml",
            path.display()
        );
    }
    Config::load(path).context("invalid configuration")
}

/// Reads an environment variable, as the router's `env` seam expects.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
