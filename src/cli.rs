//! Command-line arguments, parsed once into typed options.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// canary: the nightly quality-drift canary for the lanes of a shared LLM router.
///
/// It sends a pinned prompt set through every lane (a free endpoint you do not control, a paid
/// one you trust), keeps every answer, and tells you when a lane's answers drift.
#[derive(Debug, Parser)]
#[command(name = "canary", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    /// Config file.
    #[arg(
        short,
        long,
        global = true,
        env = "CANARY_CONFIG",
        default_value = "canary.yaml"
    )]
    pub config: PathBuf,

    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// When to colour output (NO_COLOR is honoured under `auto`).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,

    /// More log output (-v debug, -vv trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Less log output (-q warnings only, -qq errors only).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub quiet: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output format of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// One JSON object on stdout, for scripts.
    Json,
}

/// Colour choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// Colour when stdout is a terminal and NO_COLOR is unset.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send one prompt through the shared router: lanes in order, first answer inside the
    /// deadline wins.
    ///
    /// Exit codes: 0 served, 3 no lane answered in time, 2 usage or config error.
    #[command(
        after_help = "Examples:\n  canary ask \"Is 17077 a prime number? Answer yes or no.\"\n  \
        canary ask --lane paid --deadline 5s --format json \"Say hi\"\n  echo \"Summarise: ...\" | canary ask -"
    )]
    Ask(AskArgs),

    /// Validate the config; with --probe, ask each lane's endpoint whether it is up.
    ///
    /// Exit codes: 0 valid (and, with --probe, every enabled lane answered), 2 invalid,
    /// 3 valid but some enabled lane did not answer its probe.
    Check(CheckArgs),
}

/// Arguments of `canary ask`.
#[derive(Debug, Args)]
pub struct AskArgs {
    /// Only these lanes (repeatable), still in their configured order.
    #[arg(long = "lane", value_name = "LANE")]
    pub lanes: Vec<String>,

    /// Budget of the whole job, e.g. 800ms, 5s (default: `deadline` from the config).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub deadline: Option<Duration>,

    /// System message.
    #[arg(long)]
    pub system: Option<String>,

    /// Sampling temperature.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,

    /// Upper bound on generated tokens.
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u32>,

    /// The prompt; `-` reads it from standard input.
    pub prompt: String,
}

/// Arguments of `canary check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Also ask each enabled lane's endpoint (GET {base_url}/models), bounded by the deadline.
    #[arg(long)]
    pub probe: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|_| format!("expected a duration such as 800ms, 5s or 2m, found `{text}`"))
}
