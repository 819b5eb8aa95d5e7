//! `canary.yaml`: loading, defaults and validation.
//!
//! Unknown keys are errors, because a typo must not silently turn a check off. Every error names
//! the file, the line and the column, and says what was expected. Relative paths resolve against
//! the folder of the config file, so `canary -c /etc/canary/canary.yaml` works from anywhere.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_saphyr::Spanned;

use crate::store::StoreLocation;

use crate::verdict::MinDrifted;

/// Default `max_response_bytes`: 4 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 4 * 1024 * 1024;

/// A configuration problem, located so the user can go straight to it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file we tried.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The file was read but something in it is wrong.
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// 1-based line of the offending text.
        line: u64,
        /// 1-based column of the offending text.
        column: u64,
        /// What was wrong and what was expected.
        message: String,
    },
}

/// The whole configuration, with defaults filled in and paths made absolute.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was loaded from.
    pub path: PathBuf,
    /// The store: a SQLite file, or a PostgreSQL database shared by several runners.
    pub store: crate::store::StoreLocation,
    /// How long runs are kept (`store.keep`); `None` keeps every run.
    pub store_keep: Option<Duration>,
    /// Folder of the pinned prompt set.
    pub prompts: PathBuf,
    /// Folder of the accepted baselines.
    pub snapshots: PathBuf,
    /// Audit log (JSON lines), if auditing is on.
    pub audit: Option<PathBuf>,
    /// Whether the audit log keeps prompt and answer bodies (off unless asked for).
    pub audit_bodies: bool,
    /// Prometheus text file rewritten after each run.
    pub metrics_file: Option<PathBuf>,
    /// The HTML report rewritten after each run, and where alerts link to it.
    pub report: Option<ReportConfig>,
    /// Budget of one job.
    pub deadline: Duration,
    /// Below this remaining budget a call fails fast without touching the network.
    pub floor: Duration,
    /// Lanes, in fallback order.
    pub lanes: Vec<LaneConfig>,
    /// How drift is judged.
    pub drift: DriftConfig,
    /// When `canary schedule` fires.
    pub schedule: Option<ScheduleConfig>,
    /// Who hears about drift.
    pub alerts: Option<AlertsConfig>,
}

/// The report `canary run` keeps up to date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportConfig {
    /// The HTML file, rewritten after each run.
    pub path: PathBuf,
    /// Where people open it (a web server serving `path`); alerts link to it.
    pub url: Option<String>,
}

/// What kind of endpoint a lane talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaneKind {
    /// OpenAI-compatible `POST {base_url}/chat/completions`.
    Openai,
}

/// One lane of the router.
#[derive(Debug, Clone)]
pub struct LaneConfig {
    /// Unique name, `[a-z0-9_-]+`.
    pub name: String,
    /// Endpoint kind.
    pub kind: LaneKind,
    /// Base URL; `/chat/completions` is appended.
    pub base_url: String,
    /// Model name sent with each request.
    pub model: String,
    /// Env var holding the bearer key, if the endpoint needs one.
    pub api_key_env: Option<String>,
    /// Env var whose value `off` switches the lane off for the process.
    pub kill_switch_env: String,
    /// `false` removes the lane; everything still starts and serves from the others.
    pub enabled: bool,
    /// Most requests in flight at once on this lane.
    pub max_inflight: usize,
    /// When to stop calling a failing lane, and for how long.
    pub breaker: BreakerConfig,
    /// Largest response body accepted; larger ones are refused while they stream in.
    pub max_response_bytes: u64,
    /// Extra request headers.
    pub headers: BTreeMap<String, String>,
    /// Most of the remaining budget this lane may spend while a later lane could still answer.
    pub max_share: f64,
}

/// Breaker settings of a lane.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failures: u32,
    /// First cooldown; it doubles on each repeated trip.
    pub cooldown: Duration,
    /// Ceiling of the growing cooldown.
    pub max_cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 3,
            cooldown: Duration::from_secs(60),
            max_cooldown: Duration::from_secs(600),
        }
    }
}

/// Drift judgement settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftConfig {
    /// Default minimum similarity to the baseline.
    pub threshold: f64,
    /// Control lane: drift seen there too is for review, not an alert.
    pub control: Option<String>,
    /// How many drifted prompts (judged one by one: exact or single baselines) make a lane
    /// drifted.
    pub min_drifted: MinDrifted,
    /// False-alarm rate of a lane's two-sample test, per lane per run.
    pub alpha: f64,
    /// Consecutive drifted runs of a lane before its drift is alerted.
    pub confirm: u32,
    /// Samples per prompt when the prompt does not say.
    pub samples: SampleCount,
}

/// How many samples a run takes of a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleCount {
    /// One where the baseline shows the lane answers the prompt exactly, [`AUTO_SAMPLES`]
    /// everywhere else (no baseline yet, one of a single sample, one whose samples differ), and
    /// more where the first answers show they are needed (see [`crate::run::more_samples`]).
    Auto,
    /// This many, always.
    Fixed(u32),
}

/// Samples `auto` takes where one is not known to be enough.
pub const AUTO_SAMPLES: u32 = 10;
/// Samples `auto` takes of answers that vary, where there is no baseline of several samples yet
/// (or to confirm a drift): a baseline of this many represents the lane's spread well enough that
/// a run of [`AUTO_SAMPLES`] compared with it keeps the false-alarm rate near `drift.alpha`.
pub const AUTO_BASELINE_SAMPLES: u32 = 30;
/// Most samples a prompt may ask for.
pub const MAX_SAMPLES: u32 = 1000;
/// Default false-alarm rate of a lane's two-sample test.
pub const DEFAULT_ALPHA: f64 = 0.01;

/// Schedule of `canary schedule`.
#[derive(Debug, Clone)]
pub struct ScheduleConfig {
    /// Cron expression as written (6/7-field cron syntax or a 5-field crontab line).
    pub cron: String,
    /// The expression, parsed (numeric days of the week read as crontab reads them).
    pub schedule: cron::Schedule,
    /// IANA time zone the expression is read in.
    pub timezone: chrono_tz::Tz,
    /// A fire missed while canary was down runs once at start if it is at most this old.
    pub catch_up: Duration,
    /// On SIGTERM/SIGINT, how long the run in progress may take to finish before it is stopped.
    pub grace: Duration,
}

/// Alert routing.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertsConfig {
    /// Lanes whose drift alerts (default: every non-control lane).
    pub lanes: Option<Vec<String>>,
    /// The same drift is not sent again before this has passed.
    pub repeat_after: Duration,
    /// Email channel.
    pub email: Option<EmailConfig>,
    /// Slack-compatible webhook channel.
    pub webhook: Option<WebhookConfig>,
    /// Heartbeat pinged at run start, success and failure (healthchecks.io convention).
    pub heartbeat: Option<HeartbeatConfig>,
}

/// A Slack-compatible incoming webhook: `POST {"text": ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Env var holding the webhook URL (such URLs are secrets).
    pub url_env: String,
}

/// A heartbeat URL: `{url}/start` when a run starts, `{url}` when it measured everything,
/// `{url}/fail` when it could not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// The URL, when it is not a secret.
    pub url: Option<String>,
    /// Env var holding the URL.
    pub url_env: Option<String>,
}

/// Email channel settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmailConfig {
    /// SMTP server.
    pub smtp: SmtpConfig,
    /// Sender address.
    pub from: String,
    /// Recipients.
    pub to: Vec<String>,
}

/// How to reach the SMTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpConfig {
    /// Host name.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Transport security.
    pub security: SmtpSecurity,
    /// Env var with the user name.
    pub username_env: Option<String>,
    /// Env var with the password.
    pub password_env: Option<String>,
    /// Extra PEM root certificate(s) to trust, for a relay with a private CA.
    pub ca_file: Option<PathBuf>,
    /// Longest a delivery may take.
    pub timeout: Duration,
}

/// Transport security of the SMTP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmtpSecurity {
    /// Plain text (loopback relays only).
    None,
    /// Upgrade with STARTTLS.
    Starttls,
    /// TLS from the first byte.
    Tls,
}

impl Config {
    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(path, &text)
    }

    /// Parses `text` as if read from `path` (paths resolve against `path`'s folder).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = serde_saphyr::from_str(text).map_err(|err| yaml_error(path, &err))?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        raw.resolve(path, &dir)
    }

    /// The lane called `name`.
    pub fn lane(&self, name: &str) -> Option<&LaneConfig> {
        self.lanes.iter().find(|lane| lane.name == name)
    }
}

/// Turns a YAML error into a located config error with a plain message.
fn yaml_error(path: &Path, err: &serde_saphyr::Error) -> ConfigError {
    let (line, column, message) = located(err);
    ConfigError::Invalid {
        path: path.to_path_buf(),
        line,
        column,
        message,
    }
}

/// Line, column and plain message of a YAML error, for `file:line:column: message` errors.
pub fn located(err: &serde_saphyr::Error) -> (u64, u64, String) {
    let (line, column) = err
        .location()
        .map(|loc| (loc.line(), loc.column()))
        .unwrap_or((0, 0));
    let message = err.without_snippet().to_string();
    // The library appends its own "at line L column C"; ours is already in front.
    let message = match message.rfind(" at line ") {
        Some(cut) => message[..cut].to_string(),
        None => message,
    };
    (line, column, message)
}

fn invalid_at<T>(path: &Path, spanned: &Spanned<T>, message: String) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_path_buf(),
        line: spanned.referenced.line(),
        column: spanned.referenced.column(),
        message,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_raw_store")]
    store: Spanned<RawStore>,
    #[serde(default = "default_prompts")]
    prompts: PathBuf,
    #[serde(default = "default_snapshots")]
    snapshots: PathBuf,
    #[serde(default = "default_audit")]
    audit: Option<PathBuf>,
    #[serde(default)]
    audit_bodies: bool,
    #[serde(default)]
    metrics_file: Option<PathBuf>,
    #[serde(default)]
    report: Option<RawReport>,
    #[serde(default)]
    deadline: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    floor: Option<Spanned<HumanDuration>>,
    lanes: Spanned<Vec<RawLane>>,
    #[serde(default)]
    drift: Option<RawDrift>,
    #[serde(default)]
    schedule: Option<RawSchedule>,
    #[serde(default)]
    alerts: Option<RawAlerts>,
}

fn default_raw_store() -> Spanned<RawStore> {
    Spanned::new(
        RawStore::default(),
        serde_saphyr::Location::UNKNOWN,
        serde_saphyr::Location::UNKNOWN,
    )
}

fn default_store() -> PathBuf {
    PathBuf::from(".canary/canary.db")
}

/// `store:` is the store's path or PostgreSQL URL, or a table of it, how long runs are kept,
/// and (for PostgreSQL) where the password comes from, extra CA certificates and the lease.
struct RawStore {
    location: String,
    password_env: Option<String>,
    ca_file: Option<PathBuf>,
    lease: Option<Spanned<HumanDuration>>,
    keep: Option<Spanned<HumanDuration>>,
}

impl Default for RawStore {
    fn default() -> RawStore {
        RawStore {
            location: default_store().display().to_string(),
            password_env: None,
            ca_file: None,
            lease: None,
            keep: None,
        }
    }
}

impl<'de> Deserialize<'de> for RawStore {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            #[serde(default)]
            path: Option<String>,
            #[serde(default)]
            url: Option<String>,
            #[serde(default)]
            password_env: Option<String>,
            #[serde(default)]
            ca_file: Option<PathBuf>,
            #[serde(default)]
            lease: Option<Spanned<HumanDuration>>,
            #[serde(default)]
            keep: Option<Spanned<HumanDuration>>,
        }
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawStore;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a path such as .canary/canary.db, a URL such as postgres://canary@db/canary, or a table with `path` or `url` and `keep`, `lease`, `password_env`, `ca_file`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawStore, E> {
                Ok(RawStore {
                    location: v.to_owned(),
                    ..RawStore::default()
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawStore, A::Error> {
                let table = Table::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                let location = match (table.path, table.url) {
                    (Some(_), Some(_)) => {
                        return Err(serde::de::Error::custom(
                            "`store` takes `path` (SQLite) or `url` (PostgreSQL), not both",
                        ));
                    }
                    (Some(path), None) => path,
                    (None, Some(url)) if crate::store::location::is_postgres_url(&url) => url,
                    (None, Some(url)) => {
                        return Err(serde::de::Error::custom(format!(
                            "expected `store.url` to be a postgres:// or postgresql:// URL, found {}",
                            crate::store::location::redact(&url)
                        )));
                    }
                    (None, None) => RawStore::default().location,
                };
                Ok(RawStore {
                    location,
                    password_env: table.password_env,
                    ca_file: table.ca_file,
                    lease: table.lease,
                    keep: table.keep,
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The shortest `store.lease`.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// The shortest `store.keep`: a day, so a typo cannot empty the history.
pub const MIN_KEEP: Duration = Duration::from_secs(24 * 60 * 60);
fn default_prompts() -> PathBuf {
    PathBuf::from("prompts")
}
fn default_snapshots() -> PathBuf {
    PathBuf::from("snapshots")
}
fn default_audit() -> Option<PathBuf> {
    Some(PathBuf::from(".canary/audit.jsonl"))
}
/// Default budget of one job.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// Default floor.
pub const DEFAULT_FLOOR: Duration = Duration::from_millis(50);
/// Longest budget a job may be given.
pub const MAX_DEADLINE: Duration = Duration::from_secs(24 * 60 * 60);
/// Most in-flight requests a lane may allow.
pub const MAX_INFLIGHT: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLane {
    name: Spanned<LaneName>,
    kind: LaneKind,
    base_url: BaseUrl,
    model: String,
    #[serde(default)]
    api_key_env: Option<EnvName>,
    #[serde(default)]
    kill_switch_env: Option<EnvName>,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    max_inflight: Option<InFlight>,
    #[serde(default)]
    breaker: RawBreaker,
    #[serde(default)]
    max_response_bytes: Option<ByteCount>,
    #[serde(default)]
    headers: BTreeMap<HeaderName, HeaderValue>,
    #[serde(default)]
    max_share: Option<Share>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    #[serde(default)]
    failures: Option<Failures>,
    #[serde(default)]
    cooldown: Option<HumanDuration>,
    #[serde(default)]
    max_cooldown: Option<Spanned<HumanDuration>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReport {
    path: PathBuf,
    #[serde(default)]
    url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDrift {
    #[serde(default)]
    threshold: Option<Similarity>,
    #[serde(default)]
    control: Option<Spanned<String>>,
    #[serde(default)]
    min_drifted: Option<MinDriftedValue>,
    #[serde(default)]
    alpha: Option<Alpha>,
    #[serde(default)]
    confirm: Option<Confirm>,
    #[serde(default)]
    samples: Option<SamplesValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule {
    cron: Spanned<String>,
    #[serde(default)]
    timezone: Option<Spanned<String>>,
    #[serde(default)]
    catch_up: Option<HumanDuration>,
    #[serde(default)]
    grace: Option<HumanDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlerts {
    #[serde(default)]
    lanes: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    repeat_after: Option<HumanDuration>,
    #[serde(default)]
    email: Option<RawEmail>,
    #[serde(default)]
    webhook: Option<RawWebhook>,
    #[serde(default)]
    heartbeat: Option<Spanned<RawHeartbeat>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEmail {
    smtp: RawSmtp,
    from: Address,
    to: Vec<Address>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    url_env: EnvName,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeartbeat {
    #[serde(default)]
    url: Option<BaseUrl>,
    #[serde(default)]
    url_env: Option<EnvName>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSmtp {
    host: String,
    #[serde(default = "default_smtp_port")]
    port: u16,
    #[serde(default = "default_smtp_security")]
    security: SmtpSecurity,
    #[serde(default)]
    username_env: Option<EnvName>,
    #[serde(default)]
    password_env: Option<EnvName>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    timeout: Option<HumanDuration>,
}

fn default_smtp_port() -> u16 {
    587
}
fn default_smtp_security() -> SmtpSecurity {
    SmtpSecurity::Starttls
}

impl RawConfig {
    /// `store:` read: a SQLite file relative to the config's folder, or a PostgreSQL URL with
    /// its password env var, CA file and lease.
    fn store_location(&self, path: &Path, dir: &Path) -> Result<StoreLocation, ConfigError> {
        let raw = &self.store.value;
        let location = StoreLocation::parse(&raw.location, dir)
            .map_err(|message| invalid_at(path, &self.store, message))?;
        match location {
            StoreLocation::Sqlite(file) => {
                if raw.password_env.is_some() || raw.ca_file.is_some() || raw.lease.is_some() {
                    return Err(invalid_at(
                        path,
                        &self.store,
                        "`password_env`, `ca_file` and `lease` are for a PostgreSQL store (`url: postgres://...`), not a SQLite file".into(),
                    ));
                }
                Ok(StoreLocation::Sqlite(file))
            }
            StoreLocation::Postgres(mut target) => {
                if let Some(var) = &raw.password_env
                    && (var.is_empty() || var.contains('='))
                {
                    return Err(invalid_at(
                        path,
                        &self.store,
                        format!(
                            "expected `password_env` to name an environment variable, found {var:?}"
                        ),
                    ));
                }
                target.password_env = raw.password_env.clone();
                target.ca_file = raw
                    .ca_file
                    .clone()
                    .map(|p| if p.is_absolute() { p } else { dir.join(p) });
                if let Some(lease) = &raw.lease {
                    if lease.value.0 < MIN_LEASE {
                        return Err(invalid_at(
                            path,
                            lease,
                            format!(
                                "expected `store.lease` of at least 1s, found {}",
                                humantime::format_duration(lease.value.0)
                            ),
                        ));
                    }
                    target.lease = lease.value.0;
                }
                Ok(StoreLocation::Postgres(target))
            }
        }
    }

    fn resolve(self, path: &Path, dir: &Path) -> Result<Config, ConfigError> {
        if self.lanes.value.is_empty() {
            return Err(invalid_at(
                path,
                &self.lanes,
                "expected at least one lane under `lanes:`".into(),
            ));
        }
        let deadline = self
            .deadline
            .as_ref()
            .map_or(DEFAULT_DEADLINE, |d| d.value.0);
        let floor = self.floor.as_ref().map_or(DEFAULT_FLOOR, |f| f.value.0);
        let store = self.store_location(path, dir)?;
        if let Some(keep) = &self.store.value.keep
            && keep.value.0 < MIN_KEEP
        {
            return Err(invalid_at(
                path,
                keep,
                format!(
                    "expected `store.keep` of at least 1d (runs younger than it are kept), found {}",
                    humantime::format_duration(keep.value.0)
                ),
            ));
        }
        if let Some(spanned) = &self.deadline
            && (deadline.is_zero() || deadline > MAX_DEADLINE)
        {
            return Err(invalid_at(
                path,
                spanned,
                format!(
                    "expected a deadline above 0 and at most 24h, found {}",
                    humantime::format_duration(deadline)
                ),
            ));
        }
        if floor >= deadline {
            let message = format!(
                "floor ({}) must be below deadline ({}): otherwise every job fails before it starts",
                humantime::format_duration(floor),
                humantime::format_duration(deadline)
            );
            return Err(match (&self.floor, &self.deadline) {
                (Some(at), _) => invalid_at(path, at, message),
                (None, Some(at)) => invalid_at(path, at, message),
                (None, None) => invalid_at(path, &self.lanes, message),
            });
        }
        for lane in &self.lanes.value {
            if let (Some(max), Some(cooldown)) =
                (&lane.breaker.max_cooldown, &lane.breaker.cooldown)
                && max.value.0 < cooldown.0
            {
                return Err(invalid_at(
                    path,
                    max,
                    format!(
                        "breaker max_cooldown ({}) must not be below cooldown ({})",
                        humantime::format_duration(max.value.0),
                        humantime::format_duration(cooldown.0)
                    ),
                ));
            }
        }
        let mut seen = HashSet::new();
        for lane in &self.lanes.value {
            if !seen.insert(lane.name.value.0.clone()) {
                return Err(invalid_at(
                    path,
                    &lane.name,
                    format!(
                        "duplicate lane name `{}`: lane names must be unique",
                        lane.name.value.0
                    ),
                ));
            }
        }
        let known = |name: &Spanned<String>, key: &str| {
            if seen.contains(&name.value) {
                Ok(name.value.clone())
            } else {
                Err(invalid_at(
                    path,
                    name,
                    format!(
                        "{key} names lane `{}`, but no lane has that name (lanes: {})",
                        name.value,
                        self.lanes
                            .value
                            .iter()
                            .map(|l| l.name.value.0.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ))
            }
        };
        let drift = match &self.drift {
            None => DriftConfig {
                threshold: 0.85,
                control: None,
                min_drifted: MinDrifted::Count(1),
                alpha: DEFAULT_ALPHA,
                confirm: 1,
                samples: SampleCount::Auto,
            },
            Some(raw) => DriftConfig {
                alpha: raw.alpha.map_or(DEFAULT_ALPHA, |a| a.0),
                confirm: raw.confirm.map_or(1, |c| c.0),
                samples: raw.samples.map_or(SampleCount::Auto, |s| s.0),
                threshold: raw.threshold.map_or(0.85, |t| t.0),
                control: raw
                    .control
                    .as_ref()
                    .map(|c| known(c, "drift.control"))
                    .transpose()?,
                min_drifted: raw
                    .min_drifted
                    .as_ref()
                    .map_or(MinDrifted::Count(1), |m| m.0),
            },
        };
        let resolve_path = |p: &PathBuf| {
            if p.is_absolute() {
                p.clone()
            } else {
                dir.join(p)
            }
        };
        let alerts = match &self.alerts {
            None => None,
            Some(raw) => Some(AlertsConfig {
                lanes: raw
                    .lanes
                    .as_ref()
                    .map(|lanes| {
                        lanes
                            .iter()
                            .map(|l| known(l, "alerts.lanes"))
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .transpose()?,
                repeat_after: raw
                    .repeat_after
                    .map_or(Duration::from_secs(24 * 60 * 60), |d| d.0),
                email: raw.email.as_ref().map(|e| EmailConfig {
                    smtp: SmtpConfig {
                        host: e.smtp.host.clone(),
                        port: e.smtp.port,
                        security: e.smtp.security,
                        username_env: e.smtp.username_env.as_ref().map(|v| v.0.clone()),
                        password_env: e.smtp.password_env.as_ref().map(|v| v.0.clone()),
                        ca_file: e.smtp.ca_file.as_ref().map(resolve_path),
                        timeout: e.smtp.timeout.map_or(Duration::from_secs(30), |d| d.0),
                    },
                    from: e.from.0.clone(),
                    to: e.to.iter().map(|a| a.0.clone()).collect(),
                }),
                webhook: raw.webhook.as_ref().map(|w| WebhookConfig {
                    url_env: w.url_env.0.clone(),
                }),
                heartbeat: match &raw.heartbeat {
                    None => None,
                    Some(spanned) => {
                        let h = &spanned.value;
                        if h.url.is_some() == h.url_env.is_some() {
                            return Err(invalid_at(
                                path,
                                spanned,
                                "alerts.heartbeat needs exactly one of `url` or `url_env`".into(),
                            ));
                        }
                        Some(HeartbeatConfig {
                            url: h.url.as_ref().map(|u| u.0.clone()),
                            url_env: h.url_env.as_ref().map(|e| e.0.clone()),
                        })
                    }
                },
            }),
        };
        let schedule = match &self.schedule {
            None => None,
            Some(raw) => {
                let schedule = crate::schedule::parse_expression(&raw.cron.value)
                    .map_err(|message| invalid_at(path, &raw.cron, message))?;
                let timezone = match &raw.timezone {
                    None => chrono_tz::Tz::UTC,
                    Some(tz) => crate::schedule::parse_timezone(&tz.value)
                        .map_err(|message| invalid_at(path, tz, message))?,
                };
                Some(ScheduleConfig {
                    cron: raw.cron.value.clone(),
                    schedule,
                    timezone,
                    catch_up: raw.catch_up.map_or(Duration::from_secs(60 * 60), |d| d.0),
                    grace: raw.grace.map_or(Duration::from_secs(60), |d| d.0),
                })
            }
        };
        let lanes = self
            .lanes
            .value
            .into_iter()
            .map(|raw| {
                let name = raw.name.value.0;
                let defaults = BreakerConfig::default();
                let cooldown = raw.breaker.cooldown.map_or(defaults.cooldown, |d| d.0);
                LaneConfig {
                    kill_switch_env: raw
                        .kill_switch_env
                        .map(|e| e.0)
                        .unwrap_or_else(|| default_kill_switch_env(&name)),
                    name,
                    kind: raw.kind,
                    base_url: raw.base_url.0,
                    model: raw.model,
                    api_key_env: raw.api_key_env.map(|e| e.0),
                    enabled: raw.enabled,
                    max_inflight: raw.max_inflight.map_or(4, |n| n.0),
                    breaker: BreakerConfig {
                        failures: raw.breaker.failures.map_or(defaults.failures, |f| f.0),
                        cooldown,
                        max_cooldown: raw
                            .breaker
                            .max_cooldown
                            .map_or(defaults.max_cooldown.max(cooldown), |d| d.value.0),
                    },
                    max_response_bytes: raw
                        .max_response_bytes
                        .map_or(DEFAULT_MAX_RESPONSE_BYTES, |b| b.0),
                    headers: raw.headers.into_iter().map(|(k, v)| (k.0, v.0)).collect(),
                    max_share: raw.max_share.map_or(0.5, |s| s.0),
                }
            })
            .collect();
        let at = |p: PathBuf| if p.is_absolute() { p } else { dir.join(p) };
        Ok(Config {
            path: path.to_path_buf(),
            store_keep: self.store.value.keep.map(|k| k.value.0),
            store,
            prompts: at(self.prompts),
            snapshots: at(self.snapshots),
            audit: self.audit.map(at),
            audit_bodies: self.audit_bodies,
            metrics_file: self.metrics_file.map(at),
            report: self.report.map(|r| ReportConfig {
                path: at(r.path),
                url: r.url,
            }),
            deadline,
            floor,
            lanes,
            drift,
            schedule,
            alerts,
        })
    }
}

/// `CANARY_LANE_<NAME>`, with the name upper-cased and dashes made underscores.
pub fn default_kill_switch_env(lane: &str) -> String {
    format!(
        "CANARY_LANE_{}",
        lane.to_ascii_uppercase().replace('-', "_")
    )
}

/// Implements `Deserialize` for a newtype over a string-parsed value; `parse` says what is
/// expected when it fails, and serde-saphyr puts the location in front.
macro_rules! parsed_scalar {
    ($name:ident($inner:ty), $parse:expr) => {
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = ScalarText::deserialize(deserializer)?.0;
                let parse: fn(&str) -> Result<$inner, String> = $parse;
                parse(&text).map($name).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A scalar read as text whether YAML typed it as a number, a bool or a string.
struct ScalarText(String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ScalarText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar value")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A humantime duration such as `50ms`, `30s` or `2m`.
#[derive(Debug, Clone, Copy)]
struct HumanDuration(Duration);
parsed_scalar!(HumanDuration(Duration), |text| {
    humantime::parse_duration(text.trim())
        .map_err(|_| format!("expected a duration such as 50ms, 30s or 2m, found `{text}`"))
});

/// A size such as `4MiB`, `512KiB` or a plain byte count.
struct ByteCount(u64);
parsed_scalar!(ByteCount(u64), |text| {
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .ok()
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("expected a size such as 4MiB, 512KiB or 65536, found `{text}`"))
});

/// A lane name, `[a-z0-9_-]+`.
struct LaneName(String);
parsed_scalar!(LaneName(String), |text| {
    let ok = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!(
            "expected a lane name of lower-case letters, digits, `_` and `-`, found `{text}`"
        ))
    }
});

/// The name of an environment variable (never its value).
struct EnvName(String);
parsed_scalar!(EnvName(String), |text| {
    let ok = !text.is_empty()
        && !text.starts_with(|c: char| c.is_ascii_digit())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!(
            "expected the name of an environment variable (letters, digits, `_`), found `{text}`; \
             secrets never go in this file, only the name of the variable that holds them"
        ))
    }
});

/// An `http://` or `https://` base URL.
struct BaseUrl(String);
parsed_scalar!(BaseUrl(String), |text| {
    match reqwest::Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
            Ok(text.trim_end_matches('/').to_string())
        }
        _ => Err(format!(
            "expected an http:// or https:// URL such as http://127.0.0.1:8080/v1, found `{text}`"
        )),
    }
});

/// A per-lane in-flight cap, 1 to [`MAX_INFLIGHT`].
struct InFlight(usize);
parsed_scalar!(InFlight(usize), |text| {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_INFLIGHT).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a whole number of requests from 1 to {MAX_INFLIGHT}, found `{text}`"
        )),
    }
});

/// An HTTP header name for `headers:`.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct HeaderName(String);

impl<'de> Deserialize<'de> for HeaderName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.eq_ignore_ascii_case("authorization") {
            return Err(serde::de::Error::custom(
                "the Authorization header is set from api_key_env; secrets never go in this file",
            ));
        }
        reqwest::header::HeaderName::from_bytes(text.as_bytes())
            .map(|_| HeaderName(text.clone()))
            .map_err(|_| {
                serde::de::Error::custom(format!("expected an HTTP header name, found `{text}`"))
            })
    }
}

/// An HTTP header value for `headers:`.
struct HeaderValue(String);
parsed_scalar!(HeaderValue(String), |text| {
    reqwest::header::HeaderValue::from_str(text)
        .map(|_| text.to_string())
        .map_err(|_| {
            format!(
                "expected a header value without control characters, found `{}`",
                text.escape_debug()
            )
        })
});

/// An email address (`oncall@example.com` or `On-call <oncall@example.com>`).
struct Address(String);
parsed_scalar!(Address(String), |text| {
    text.parse::<lettre::message::Mailbox>()
        .map(|_| text.to_string())
        .map_err(|_| {
            format!("expected an email address such as oncall@example.com, found `{text}`")
        })
});

/// A fraction in (0, 1].
#[derive(Clone, Copy)]
struct Share(f64);
parsed_scalar!(Share(f64), |text| {
    match text.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!(
            "expected a fraction of the remaining budget above 0 and at most 1, found `{text}`"
        )),
    }
});

/// A similarity in [0, 1].
#[derive(Clone, Copy)]
struct Similarity(f64);
parsed_scalar!(Similarity(f64), |text| {
    match text.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a similarity between 0 and 1, found `{text}`"
        )),
    }
});

/// `3` (prompts) or `25%` (of the judged prompts).
struct MinDriftedValue(MinDrifted);
parsed_scalar!(MinDriftedValue(MinDrifted), |text| {
    let text = text.trim();
    let bad = || {
        format!("expected a number of prompts (e.g. 1) or a percentage (e.g. 25%), found `{text}`")
    };
    match text.strip_suffix('%') {
        Some(percent) => match percent.trim().parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(MinDrifted::Fraction(p / 100.0)),
            _ => Err(bad()),
        },
        None => match text.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(MinDrifted::Count(n)),
            _ => Err(bad()),
        },
    }
});

/// Smallest `drift.alpha`: the permutation test's p-values go down to 1/5000, so a smaller rate
/// could never be met and would switch the test off without a word.
pub const MIN_ALPHA: f64 = 0.001;

/// A false-alarm rate in [0.001, 0.5].
#[derive(Clone, Copy)]
struct Alpha(f64);
parsed_scalar!(Alpha(f64), |text| {
    match text.trim().parse::<f64>() {
        Ok(v) if (MIN_ALPHA..=0.5).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a false-alarm rate from {MIN_ALPHA} to 0.5 (e.g. 0.01: one false alarm in a hundred runs), found `{text}`"
        )),
    }
});

/// A number of consecutive runs, at least one.
#[derive(Clone, Copy)]
struct Confirm(u32);
parsed_scalar!(Confirm(u32), |text| {
    match text.trim().parse::<u32>() {
        Ok(v) if (1..=100).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected how many consecutive drifted runs to wait for before alerting (1 to 100), found `{text}`"
        )),
    }
});

/// `auto` or a number of samples.
#[derive(Clone, Copy)]
struct SamplesValue(SampleCount);
parsed_scalar!(SamplesValue(SampleCount), |text| {
    let text = text.trim();
    if text == "auto" {
        return Ok(SampleCount::Auto);
    }
    match text.parse::<u32>() {
        Ok(n) if (1..=MAX_SAMPLES).contains(&n) => Ok(SampleCount::Fixed(n)),
        _ => Err(format!(
            "expected `auto` or a number of samples from 1 to {MAX_SAMPLES}, found `{text}`"
        )),
    }
});

/// A failure count of at least one.
#[derive(Clone, Copy)]
struct Failures(u32);
parsed_scalar!(Failures(u32), |text| {
    match text.trim().parse::<u32>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(format!(
            "expected a whole number of failures, at least 1, found `{text}`"
        )),
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/srv/canary/canary.yaml"), text)
    }

    const MINIMAL: &str = "lanes:\n  - name: free\n    kind: openai\n    base_url: http://127.0.0.1:8080/v1\n    model: smollm2\n";

    #[test]
    fn defaults_fill_in_and_paths_resolve_against_the_config_folder() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(
            config.store,
            StoreLocation::from(PathBuf::from("/srv/canary/.canary/canary.db"))
        );
        assert_eq!(config.prompts, PathBuf::from("/srv/canary/prompts"));
        assert_eq!(config.deadline, Duration::from_secs(30));
        assert_eq!(config.floor, Duration::from_millis(50));
        let lane = &config.lanes[0];
        assert_eq!(lane.kill_switch_env, "CANARY_LANE_FREE");
        assert_eq!(lane.max_inflight, 4);
        assert_eq!(lane.max_response_bytes, 4 * 1024 * 1024);
        assert_eq!(lane.breaker, BreakerConfig::default());
        assert!(lane.enabled);
    }

    #[test]
    fn the_contract_example_parses() {
        let text = include_str!("../canary.example.yaml");
        let config = parse(text).unwrap();
        assert_eq!(config.lanes.len(), 2);
        assert_eq!(config.lanes[0].kill_switch_env, "FREE_LANE");
        assert_eq!(config.drift.control.as_deref(), Some("paid"));
        let email = config.alerts.unwrap().email.unwrap();
        assert_eq!(email.smtp.security, SmtpSecurity::Starttls);
        assert_eq!(email.smtp.password_env.as_deref(), Some("SMTP_PASSWORD"));
    }

    #[test]
    fn the_store_is_a_path_or_a_table_with_how_long_runs_are_kept() {
        let config = parse(&format!("store: /var/lib/canary.db\n{MINIMAL}")).unwrap();
        assert_eq!(
            config.store,
            StoreLocation::from(PathBuf::from("/var/lib/canary.db"))
        );
        assert_eq!(config.store_keep, None);
        let config = parse(&format!("store:\n  keep: 400d\n{MINIMAL}")).unwrap();
        assert_eq!(
            config.store,
            StoreLocation::from(PathBuf::from("/srv/canary/.canary/canary.db"))
        );
        assert_eq!(
            config.store_keep,
            Some(Duration::from_secs(400 * 24 * 60 * 60))
        );
        let err = parse(&format!("store:\n  path: c.db\n  kep: 400d\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/srv/canary/canary.yaml:3:3: "), "{err}");
        assert!(err.contains("kep"), "{err}");
        let err = parse(&format!("store:\n  keep: 2h\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/srv/canary/canary.yaml:2:9: "), "{err}");
        assert!(err.contains("at least 1d"), "{err}");
    }

    #[test]
    fn a_postgres_store_takes_its_options_and_refuses_what_does_not_fit() {
        let config = parse(&format!(
            "store:\n  url: postgres://canary@db/canary?sslmode=verify-full\n  password_env: DB_PASS\n  ca_file: ca.pem\n  lease: 30s\n  keep: 400d\n{MINIMAL}"
        ))
        .unwrap();
        let StoreLocation::Postgres(target) = &config.store else {
            panic!("{:?}", config.store)
        };
        assert_eq!(target.password_env.as_deref(), Some("DB_PASS"));
        assert_eq!(target.ca_file, Some(PathBuf::from("/srv/canary/ca.pem")));
        assert_eq!(target.lease, Duration::from_secs(30));
        assert!(config.store_keep.is_some());
        for (yaml, expected) in [
            (
                "store:\n  url: postgress://canary@db/canary\n",
                "postgres:// or postgresql:// URL",
            ),
            (
                "store:\n  path: c.db\n  lease: 30s\n",
                "are for a PostgreSQL store",
            ),
            (
                "store:\n  url: postgres://canary@db/c\n  lease: 10ms\n",
                "at least 1s",
            ),
            (
                "store: postgres://canary:hunter2@db/c\n",
                "carries a password",
            ),
            (
                "store:\n  path: a.db\n  url: postgres://canary@db/c\n",
                "not both",
            ),
        ] {
            let err = parse(&format!("{yaml}{MINIMAL}")).unwrap_err().to_string();
            assert!(err.starts_with("/srv/canary/canary.yaml:"), "{err}");
            assert!(err.contains(expected), "{yaml}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn unknown_key_is_an_error_with_line_and_column() {
        let text = format!("{MINIMAL}    max_inflite: 2\n");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.starts_with("/srv/canary/canary.yaml:6:5: "), "{err}");
        assert!(err.contains("max_inflite"), "{err}");
    }

    #[test]
    fn bad_duration_names_what_was_expected() {
        let err = parse(&format!("deadline: soon\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/srv/canary/canary.yaml:1:"), "{err}");
        assert!(err.contains("expected a duration such as 50ms"), "{err}");
    }

    #[test]
    fn duplicate_lane_names_point_at_the_second() {
        let text = format!(
            "{MINIMAL}  - name: free\n    kind: openai\n    base_url: http://h/v1\n    model: m\n"
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.starts_with("/srv/canary/canary.yaml:6:"), "{err}");
        assert!(err.contains("duplicate lane name `free`"), "{err}");
    }

    #[test]
    fn control_lane_must_exist() {
        let err = parse(&format!("{MINIMAL}drift:\n  control: paid\n"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/srv/canary/canary.yaml:7:"), "{err}");
        assert!(err.contains("no lane has that name (lanes: free)"), "{err}");
    }

    #[test]
    fn zero_inflight_and_bad_names_are_rejected() {
        let err = parse(&format!("{MINIMAL}    max_inflight: 0\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(":6:"), "{err}");
        let err = parse(&MINIMAL.replace("name: free", "name: Free Lane"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a lane name"), "{err}");
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let err = parse(&format!("deadline: 1s\ndeadline: 2s\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(":2:"), "{err}");
    }

    #[test]
    fn the_lane_drift_rule_takes_a_count_or_a_percentage() {
        let config = parse(&format!("{MINIMAL}drift:\n  min_drifted: 25%\n")).unwrap();
        assert_eq!(config.drift.min_drifted, MinDrifted::Fraction(0.25));
        let config = parse(&format!("{MINIMAL}drift:\n  min_drifted: 2\n")).unwrap();
        assert_eq!(config.drift.min_drifted, MinDrifted::Count(2));
        let err = parse(&format!("{MINIMAL}drift:\n  min_drifted: 0\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(":7:") && err.contains("percentage"), "{err}");
    }

    #[test]
    fn the_false_alarm_budget_and_sampling_default_and_validate() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(config.drift.alpha, 0.01);
        assert_eq!(config.drift.confirm, 1);
        assert_eq!(config.drift.samples, SampleCount::Auto);
        let config = parse(&format!(
            "{MINIMAL}drift:\n  alpha: 0.001\n  confirm: 2\n  samples: 5\n"
        ))
        .unwrap();
        assert_eq!(config.drift.alpha, 0.001);
        assert_eq!(config.drift.confirm, 2);
        assert_eq!(config.drift.samples, SampleCount::Fixed(5));
        let auto = parse(&format!("{MINIMAL}drift:\n  samples: auto\n")).unwrap();
        assert_eq!(auto.drift.samples, SampleCount::Auto);
        for (bad, expected) in [
            ("alpha: 0", "false-alarm rate"),
            ("alpha: 0.0001", "from 0.001 to 0.5"),
            ("alpha: 0.7", "from 0.001 to 0.5"),
            ("confirm: 0", "consecutive drifted runs"),
            ("samples: 0", "`auto` or a number"),
            ("samples: many", "`auto` or a number"),
        ] {
            let err = parse(&format!("{MINIMAL}drift:\n  {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(":7:") && err.contains(expected),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn settings_that_cannot_work_are_located_errors() {
        let err = parse(&format!("deadline: 40ms\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/srv/canary/canary.yaml:1:")
                && err.contains("floor (50ms) must be below"),
            "{err}"
        );
        let err = parse(&format!("deadline: 300000000000y\n{MINIMAL}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(":1:") && err.contains("at most 24h"), "{err}");
        let err = parse("lanes: []\n").unwrap_err().to_string();
        assert!(
            err.contains(":1:") && err.contains("at least one lane"),
            "{err}"
        );
        let err = parse(&format!(
            "{MINIMAL}    max_inflight: 18446744073709551615\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(":6:") && err.contains("from 1 to 10000"),
            "{err}"
        );
        let err = parse(&format!(
            "{MINIMAL}    breaker: {{ cooldown: 60s, max_cooldown: 10s }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains(":6:") && err.contains("max_cooldown"), "{err}");
    }

    #[test]
    fn headers_are_checked_where_they_are_written() {
        let err = parse(&format!("{MINIMAL}    headers: {{ \"bad header\": x }}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(":6:") && err.contains("header name"), "{err}");
        let err = parse(&format!(
            "{MINIMAL}    headers: {{ Authorization: Bearer sk-x }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("api_key_env"), "{err}");
        let ok = parse(&format!(
            "{MINIMAL}    headers: {{ HTTP-Referer: https://example.com }}\n"
        ))
        .unwrap();
        assert_eq!(ok.lanes[0].headers["HTTP-Referer"], "https://example.com");
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        let config = parse(&format!("{MINIMAL}    max_response_bytes: 64KiB\n")).unwrap();
        assert_eq!(config.lanes[0].max_response_bytes, 64 * 1024);
    }
}
