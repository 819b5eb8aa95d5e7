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
    /// Send every pinned prompt to every enabled lane, store the answers, judge them against
    /// the baselines.
    ///
    /// Each lane is measured by its own answers, never substituted by another lane's. Results
    /// are committed to the store as they arrive; a second run on the same store exits 2 at once.
    ///
    /// Exit codes: 0 no drift, 1 drift, 2 error (config, store, lock held), 3 no drift seen but
    /// some lane or prompt could not be measured.
    #[command(
        after_help = "Examples:\n  canary run\n  canary run --lane free --samples 3\n  \
        canary run --prompt prime-17077 --format json"
    )]
    Run(RunArgs),

    /// Review a run: verdict table, then a diff of baseline vs output for each drifted item.
    ///
    /// Judges the run (latest by default) against the baselines as they are now, or against
    /// another run. Exit codes, like diff(1): 0 nothing drifted, 1 drift, 2 error.
    #[command(
        after_help = "Examples:\n  canary diff\n  canary diff --run 12 --lane free\n  \
        canary diff --against 11 --all\n  canary diff --format json"
    )]
    Diff(DiffArgs),

    /// Write a run's answers as the new baselines (snapshots/<lane>/<prompt-id>.snap).
    ///
    /// Never from a failed result. With --samples N, first runs the prompts N times and accepts
    /// that run, so the baseline carries its own noise band.
    #[command(
        after_help = "Examples:\n  canary accept\n  canary accept --run 12 --lane free --prompt prime-17077\n  \
        canary accept --samples 5"
    )]
    Accept(AcceptArgs),

    /// Walk the drifted, new and stale items of the latest run: accept, reject or skip each.
    ///
    /// Needs a terminal; without one it prints the non-interactive commands instead.
    Review(ReviewArgs),

    /// Runs over time: verdict counts, similarity and latency per lane, or one prompt's story.
    History(HistoryArgs),

    /// Write a self-contained HTML report of a run: per lane, drift and latency over the last runs,
    /// a prompts × runs grid of verdicts, and each drifted answer beside its baseline.
    ///
    /// One file, no script, nothing fetched: it opens offline and from a mail attachment. Model
    /// output is shown as text, never as markup.
    #[command(
        after_help = "Examples:\n  canary report -o report.html\n  canary report --run 12 --runs 60 -o /var/www/canary/latest.html"
    )]
    Report(ReportArgs),

    /// Remove runs older than `store.keep` (or --keep) from the store, with their results.
    ///
    /// Keeps the runs the baselines were accepted from, the newest run, and runs whose alerts
    /// still matter; then drops the answers no remaining run refers to. `canary run` prunes by
    /// itself after each run when `store.keep` is set. Freed space is reused by later runs;
    /// --vacuum also shrinks the file. Exit codes: 0 done, 2 error (or a run in progress).
    #[command(
        after_help = "Examples:\n  canary prune --keep 400d --dry-run\n  canary prune\n  canary prune --keep 90d --vacuum"
    )]
    Prune(PruneArgs),

    /// Scaffold a canary project: canary.yaml, the starter prompt set and snapshots/.
    ///
    /// Never overwrites: existing files are left alone and listed.
    Init(InitArgs),

    /// Stay in the foreground and fire `canary run` at each `schedule.cron` time.
    ///
    /// Never two runs at once; a failed run does not stop the schedule; a fire missed while
    /// canary was down runs once at start if it is within `schedule.catch_up`. On SIGTERM or
    /// SIGINT it stops scheduling, lets the run in progress finish (up to `schedule.grace`), and
    /// exits 0.
    Schedule,

    /// Alert channels.
    #[command(subcommand)]
    Alert(AlertCommand),

    /// The store as a whole: move a history between SQLite and PostgreSQL.
    #[command(subcommand)]
    Store(StoreCommand),

    /// Send one prompt through the shared router: lanes in order, first answer inside the
    /// deadline wins.
    ///
    /// Exit codes: 0 served, 3 no lane answered in time, 2 usage or config error.
    #[command(
        after_help = "Examples:\n  canary ask \"Is 17077 a prime number? Answer yes or no.\"\n  \
        canary ask --lane paid --deadline 5s --format json \"Say hi\"\n  echo \"Summarise: ...\" | canary ask -"
    )]
    Ask(AskArgs),

    /// Validate the config, the prompt set and the baselines; with --probe, ask each lane's
    /// endpoint whether it is up.
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

/// `canary alert ...`.
#[derive(Debug, Subcommand)]
pub enum AlertCommand {
    /// Send a test message through every configured channel (email, webhook, heartbeat).
    ///
    /// Exit codes: 0 every channel accepted it, 2 some channel failed (each failure is printed).
    Test,
}

/// `canary store ...`.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Copy every run, result, verdict and alert into another, empty store, then verify it.
    ///
    /// Row for row with the same run ids, between SQLite and PostgreSQL either way; the target
    /// is read back and each table's row count and content hash must equal the source's.
    /// The source is the config's `store` unless --from names another. A PostgreSQL URL takes
    /// its password from PGPASSWORD (or the env var --password-env names). Stop scheduled
    /// runs while copying: runs that start meanwhile are not copied. Exit codes: 0 copied and
    /// verified, 2 error (the target is not empty, or the copy does not verify).
    #[command(after_help = "Examples:
  canary store copy --to postgres://canary@db.internal/canary
          canary store copy --from postgres://canary@db.internal/canary --to backup.db")]
    Copy(StoreCopyArgs),
}

/// Arguments of `canary store copy`.
#[derive(Debug, Args)]
pub struct StoreCopyArgs {
    /// The empty store to copy into: a SQLite file or a postgres:// URL.
    #[arg(long, value_name = "PATH|URL")]
    pub to: String,

    /// The store to copy from (default: the config's `store`).
    #[arg(long, value_name = "PATH|URL")]
    pub from: Option<String>,

    /// The env var holding the password of a postgres:// URL given here (default PGPASSWORD).
    #[arg(long, value_name = "VAR")]
    pub password_env: Option<String>,
}

/// Arguments of `canary run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Only these lanes (repeatable).
    #[arg(long = "lane", value_name = "LANE")]
    pub lanes: Vec<String>,

    /// Only these prompts (repeatable).
    #[arg(long = "prompt", value_name = "ID")]
    pub prompts: Vec<String>,

    /// Answers per (lane, prompt), overriding the prompt's `samples:` and `drift.samples`
    /// (default `auto`: 1 where the baseline shows the lane answers exactly, 10 elsewhere).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub samples: Option<u32>,

    /// Do not send alerts for this run.
    #[arg(long)]
    pub no_alert: bool,

    /// Only the K-th of N equal shares of the prompt set (`2/4`), so several runners can
    /// split one set; a shard may raise a lane's first drift alert, never a recovery.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<Shard>,
}

/// One of N equal shares of the prompt set: prompts at positions K-1, K-1+N, ... in id order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// From 1.
    pub index: u32,
    /// How many shares.
    pub count: u32,
}

impl Shard {
    /// Keeps only this shard's prompts (the set is sorted by id).
    pub fn select<T>(&self, prompts: &mut Vec<T>) {
        let (index, count) = (self.index as usize - 1, self.count as usize);
        let mut position = 0;
        prompts.retain(|_| {
            let keep = position % count == index;
            position += 1;
            keep
        });
    }
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(value: &str) -> Result<Shard, String> {
        let bad = || format!("expected K/N with 1 <= K <= N, such as 2/4; found {value:?}");
        let (index, count) = value.split_once('/').ok_or_else(bad)?;
        let index: u32 = index.trim().parse().map_err(|_| bad())?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if index == 0 || count == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Arguments of `canary diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The run to review (default: the latest).
    #[arg(long, value_name = "ID")]
    pub run: Option<i64>,

    /// Compare with the baselines (default) or with another run's answers.
    #[arg(long, value_name = "baseline|RUN", default_value = "baseline")]
    pub against: String,

    /// Only these lanes (repeatable).
    #[arg(long = "lane", value_name = "LANE")]
    pub lanes: Vec<String>,

    /// Only these prompts (repeatable).
    #[arg(long = "prompt", value_name = "ID")]
    pub prompts: Vec<String>,

    /// Show a diff for every item that differs, not only the drifted ones.
    #[arg(long)]
    pub all: bool,
}

/// Arguments of `canary accept`.
#[derive(Debug, Args)]
pub struct AcceptArgs {
    /// The run to accept (default: the latest).
    #[arg(long, value_name = "ID", conflicts_with = "samples")]
    pub run: Option<i64>,

    /// Only these lanes (repeatable).
    #[arg(long = "lane", value_name = "LANE")]
    pub lanes: Vec<String>,

    /// Only these prompts (repeatable).
    #[arg(long = "prompt", value_name = "ID")]
    pub prompts: Vec<String>,

    /// Run the prompts N times now and accept that run, so the baseline holds N samples.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub samples: Option<u32>,
}

/// Arguments of `canary review`.
#[derive(Debug, Args)]
pub struct ReviewArgs {
    /// The run to review (default: the latest).
    #[arg(long, value_name = "ID")]
    pub run: Option<i64>,
}

/// Arguments of `canary report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The run to report (default: the latest).
    #[arg(long, value_name = "ID")]
    pub run: Option<i64>,

    /// Where to write the HTML file.
    #[arg(short, long, value_name = "FILE.html")]
    pub output: std::path::PathBuf,

    /// How many runs (up to the reported one) its charts and grid show.
    #[arg(long, value_name = "N", default_value_t = 30, value_parser = clap::value_parser!(usize))]
    pub runs: usize,
}

/// Arguments of `canary prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Keep runs younger than this, e.g. 400d, 26weeks (default: `store.keep` from the config).
    #[arg(long, value_parser = parse_keep, value_name = "DURATION")]
    pub keep: Option<Duration>,

    /// Count what would be removed; change nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Afterwards rewrite a SQLite file without its free space (takes a while on a big store);
    /// on PostgreSQL, a plain VACUUM (space is reused, not returned to the file system).
    #[arg(long)]
    pub vacuum: bool,
}

/// Arguments of `canary init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Folder of the new project (created if needed).
    #[arg(default_value = ".")]
    pub dir: std::path::PathBuf,
}

/// Arguments of `canary history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only this lane.
    #[arg(long, value_name = "LANE")]
    pub lane: Option<String>,

    /// One prompt's story across runs.
    #[arg(long, value_name = "ID")]
    pub prompt: Option<String>,

    /// How many runs, newest first.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

fn parse_keep(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d >= crate::config::MIN_KEEP => Ok(d),
        Ok(_) => Err(format!(
            "expected at least 1d (runs younger than it are kept), found `{text}`"
        )),
        Err(_) => Err(format!(
            "expected a duration such as 400d or 26weeks, found `{text}`"
        )),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() && d <= crate::config::MAX_DEADLINE => Ok(d),
        Ok(_) => Err(format!(
            "expected a duration above 0 and at most 24h, found `{text}`"
        )),
        Err(_) => Err(format!(
            "expected a duration such as 800ms, 5s or 2m, found `{text}`"
        )),
    }
}
