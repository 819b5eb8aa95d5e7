//! The heartbeat: a canary that stopped running is noticed too.
//!
//! The healthchecks.io convention: `GET {url}/start` when a run starts, `GET {url}` when it
//! measured every lane (exit 0 or 1: drift is the canary working), `GET {url}/fail` when it
//! could not (exit 2, 3 or an interrupted run). A missed ping is logged, never fatal.

use crate::config::HeartbeatConfig;

/// Longest one ping may take.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// A run started.
    Start,
    /// A run measured every lane.
    Success,
    /// A run could not measure something, or failed.
    Failure,
}

/// A configured heartbeat.
pub struct Heartbeat {
    url: String,
    client: reqwest::Client,
}

impl Heartbeat {
    /// The heartbeat of the config; `env` reads `url_env`.
    pub fn new(
        config: &HeartbeatConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Heartbeat, String> {
        let url = match (&config.url, &config.url_env) {
            (Some(url), _) => url.clone(),
            (None, Some(var)) => env(var)
                .filter(|u| !u.is_empty())
                .ok_or_else(|| format!("heartbeat: env var {var} is not set"))?,
            (None, None) => return Err("heartbeat: no url".into()),
        };
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|err| format!("heartbeat: cannot build HTTP client: {err}"))?;
        Ok(Heartbeat {
            url: url.trim_end_matches('/').to_string(),
            client,
        })
    }

    /// The beat for a run's exit code.
    pub fn for_exit_code(code: i32) -> Beat {
        if code == 0 || code == 1 {
            Beat::Success
        } else {
            Beat::Failure
        }
    }

    /// Pings; failures are returned for logging, without the URL (it may be a secret).
    pub async fn ping(&self, beat: Beat) -> Result<(), String> {
        let url = match beat {
            Beat::Start => format!("{}/start", self.url),
            Beat::Success => self.url.clone(),
            Beat::Failure => format!("{}/fail", self.url),
        };
        let response = self
            .client
            .get(&url)
            .send()
            .await
            .map_err(|err| format!("heartbeat: {}", err.without_url()))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("heartbeat: HTTP {}", response.status().as_u16()))
        }
    }
}
