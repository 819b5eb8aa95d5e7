//! The alert: canary's voice when a lane drifts.
//!
//! Alerts go out on state changes, not every night: a lane that starts drifting, one that
//! recovers, or a drift whose content changed (another prompt, the model swapped). The same
//! drift is not sent again before `alerts.repeat_after`. Each alert is stored (one row per
//! channel) before it is sent and stays pending with its error until a delivery succeeds; the
//! next run retries what is pending. Delivery never changes a run's exit code.

pub mod email;
pub mod heartbeat;
pub mod message;
pub mod webhook;

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::Config;
use crate::judge::{JudgedLane, RunJudgement};
use crate::lane::BoxFuture;
use crate::store::{AlertRow, NewAlert, Store, StoreError};
use crate::verdict::{Mode, Verdict};
use message::Message;

/// The seam to the outside world for alerts: one implementation per channel.
pub trait Channel: Send + Sync {
    /// Short name stored with each alert (`email`, `webhook`).
    fn name(&self) -> &'static str;

    /// Delivers one message; the error says what failed, never a secret.
    fn send<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), String>>;
}

/// The channels the config sets up. `env` reads the env vars that hold their secrets.
///
/// Each channel is set up on its own: one that cannot be (a missing env var, an unreadable CA
/// file) is returned among the errors and the others still work.
pub fn channels(
    config: &Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> (Vec<Box<dyn Channel>>, Vec<String>) {
    let mut channels: Vec<Box<dyn Channel>> = Vec::new();
    let mut broken = Vec::new();
    let Some(alerts) = &config.alerts else {
        return (channels, broken);
    };
    if let Some(email) = &alerts.email {
        match email::EmailChannel::new(email, env) {
            Ok(channel) => channels.push(Box::new(channel)),
            Err(err) => broken.push(err),
        }
    }
    if let Some(webhook) = &alerts.webhook {
        match webhook::WebhookChannel::new(webhook, env) {
            Ok(channel) => channels.push(Box::new(channel)),
            Err(err) => broken.push(err),
        }
    }
    (channels, broken)
}

/// Lanes whose drift alerts: `alerts.lanes`, or every lane but the control lane.
pub fn alerting_lanes(config: &Config) -> Vec<String> {
    match config.alerts.as_ref().and_then(|a| a.lanes.clone()) {
        Some(lanes) => lanes,
        None => config
            .lanes
            .iter()
            .map(|l| l.name.clone())
            .filter(|name| config.drift.control.as_deref() != Some(name))
            .collect(),
    }
}

/// What alerting did after a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Alerts raised by this run (one per lane, whatever the number of channels).
    pub raised: Vec<String>,
    /// Deliveries that succeeded (this run's and retried ones).
    pub delivered: usize,
    /// Deliveries still pending, with their errors.
    pub pending: Vec<String>,
}

/// After a run is committed: retries pending alerts, raises this run's, and delivers them.
/// `complete` is false when the run covered only some prompts (`--prompt`): such a run can
/// raise a lane's first drift alert, never a recovery or a changed-drift alert.
pub async fn after_run(
    config: &Config,
    store: &Store,
    judgement: &RunJudgement,
    channels: &[Box<dyn Channel>],
    now: DateTime<Utc>,
    complete: bool,
) -> Result<Outcome, StoreError> {
    let mut outcome = Outcome::default();
    if channels.is_empty() {
        return Ok(outcome);
    }
    let repeat_after = config
        .alerts
        .as_ref()
        .map_or(Duration::from_secs(24 * 60 * 60), |a| a.repeat_after);
    let lanes = alerting_lanes(config);
    for lane in judgement.lanes.iter().filter(|l| lanes.contains(&l.lane)) {
        // Decided against the lane's newest alert and stored only if that is still the newest:
        // when two runners judge the same lane at once, the second decides again seeing the
        // first one's alert, so the lane's news goes out once.
        for _ in 0..8 {
            let last = store.last_alert(&lane.lane)?;
            let Some(alerts) = raise(
                config,
                store,
                judgement,
                lane,
                last.as_ref(),
                complete,
                repeat_after,
                now,
            )?
            else {
                break;
            };
            let rows: Vec<NewAlert<'_>> = alerts.rows(judgement.run_id, &lane.lane, channels);
            if store
                .insert_alerts_if_last(&lane.lane, last.as_ref().map(|a| a.id), &rows)?
                .is_some()
            {
                outcome.raised.push(alerts.message.subject.clone());
                break;
            }
            tracing::debug!(
                "lane {}: another runner raised an alert meanwhile; deciding again",
                lane.lane
            );
        }
    }
    // This run's alerts were just stored as pending: one pass delivers them with the old ones.
    for alert in store.pending_alerts()? {
        let Some(channel) = channels.iter().find(|c| c.name() == alert.channel) else {
            continue;
        };
        // Claimed first: of two runners delivering pending alerts at once, one sends each.
        if !store.claim_alert(alert.id, CLAIM)? {
            continue;
        }
        let message = Message {
            subject: alert.subject.clone(),
            text: alert.body_text.clone(),
            html: alert.body_html.clone(),
        };
        match channel.send(&message).await {
            Ok(()) => {
                store.record_delivery(alert.id, None)?;
                outcome.delivered += 1;
                tracing::info!("alert sent by {}: {}", alert.channel, alert.subject);
            }
            Err(error) => {
                store.record_delivery(alert.id, Some(&error))?;
                tracing::warn!(
                    "alert not sent by {} ({error}); kept as pending, the next run retries it: {}",
                    alert.channel,
                    alert.subject
                );
                outcome.pending.push(format!("{}: {error}", alert.channel));
            }
        }
    }
    Ok(outcome)
}

/// How long a runner's claim on an alert it is sending lasts: longer than any send takes, so
/// only a runner that died mid-send leaves an alert for another to send.
const CLAIM: Duration = Duration::from_secs(10 * 60);

/// An alert this run raises for one lane, to be stored once per channel.
struct Raised {
    kind: Kind,
    signature: String,
    message: Message,
}

impl Raised {
    fn rows<'a>(
        &'a self,
        run_id: i64,
        lane: &'a str,
        channels: &'a [Box<dyn Channel>],
    ) -> Vec<NewAlert<'a>> {
        channels
            .iter()
            .map(|channel| NewAlert {
                run_id,
                lane,
                kind: self.kind.as_str(),
                signature: &self.signature,
                channel: channel.name(),
                subject: &self.message.subject,
                body_text: &self.message.text,
                body_html: &self.message.html,
            })
            .collect()
    }
}

/// What this run says about `lane`, given its newest alert `last`: nothing, or an alert.
#[allow(clippy::too_many_arguments)]
fn raise(
    config: &Config,
    store: &Store,
    judgement: &RunJudgement,
    lane: &JudgedLane,
    last: Option<&AlertRow>,
    complete: bool,
    repeat_after: Duration,
    now: DateTime<Utc>,
) -> Result<Option<Raised>, StoreError> {
    let Some(kind) = decide(lane, last, repeat_after, now) else {
        return Ok(None);
    };
    if kind == Kind::Drift {
        let confirm = config.drift.confirm;
        let streak = drift_streak(store, &lane.lane, judgement.run_id, confirm)?;
        if streak < confirm {
            tracing::info!(
                "lane {}: drifted in {streak} consecutive run{} of the {confirm} drift.confirm asks for; no alert yet",
                lane.lane,
                if streak == 1 { "" } else { "s" }
            );
            return Ok(None);
        }
    }
    let drifting = last.is_some_and(|a| a.kind == Kind::Drift.as_str());
    if !complete && (kind == Kind::Recovered || drifting) {
        // Some prompts only: news when a quiet lane drifts, but it cannot show a drifting
        // lane recovered or its drift changed, since the other prompts were not asked.
        return Ok(None);
    }
    let message = match kind {
        Kind::Drift => message::drift(judgement.run_id, lane, report_link(config).as_deref()),
        Kind::Recovered => message::recovered(judgement.run_id, lane),
    };
    Ok(Some(Raised {
        kind,
        signature: signature(lane),
        message,
    }))
}

/// How many consecutive runs up to `through_run` (included, its verdicts stored) the lane
/// drifted in, counting at most `enough`. Runs that could not judge the lane (it failed, or its
/// prompts were new or stale) neither confirm nor clear a drift; a run that judged it without
/// drift ends the streak.
pub fn drift_streak(
    store: &Store,
    lane: &str,
    through_run: i64,
    enough: u32,
) -> Result<u32, StoreError> {
    let mut streak = 0;
    let mut before = through_run + 1;
    // Pages of history, since skipped runs do not count toward `enough`.
    while streak < enough.max(1) {
        let page = store.lane_history(lane, before, 64)?;
        let Some(last) = page.last() else {
            break;
        };
        before = last.run_id;
        for row in &page {
            match row.verdict.as_str() {
                "drifted" => streak += 1,
                "unchanged" | "within_noise" => return Ok(streak),
                _ => {}
            }
            if streak >= enough.max(1) {
                return Ok(streak);
            }
        }
    }
    Ok(streak)
}

/// Where people find the report `canary run` keeps: its URL, else its file.
fn report_link(config: &Config) -> Option<String> {
    let report = config.report.as_ref()?;
    Some(
        report
            .url
            .clone()
            .unwrap_or_else(|| report.path.display().to_string()),
    )
}

/// Kinds of alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The lane drifted (its prompts, or its identity).
    Drift,
    /// The lane drifted before and no longer does.
    Recovered,
}

impl Kind {
    /// Stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Drift => "drift",
            Kind::Recovered => "recovered",
        }
    }
}

/// Whether this run's verdict of a lane is news, given the lane's last alert.
pub fn decide(
    lane: &JudgedLane,
    last: Option<&AlertRow>,
    repeat_after: Duration,
    now: DateTime<Utc>,
) -> Option<Kind> {
    let was_drifting = last.is_some_and(|a| a.kind == Kind::Drift.as_str());
    match lane.verdict {
        Verdict::Drifted => {
            let same = last
                .is_some_and(|a| a.kind == Kind::Drift.as_str() && a.signature == signature(lane));
            let recent = last
                .and_then(|a| DateTime::parse_from_rfc3339(&a.created_at).ok())
                .is_some_and(|at| {
                    now.signed_duration_since(at).to_std().unwrap_or_default() < repeat_after
                });
            (!(same && recent)).then_some(Kind::Drift)
        }
        Verdict::Unchanged | Verdict::WithinNoise if was_drifting => Some(Kind::Recovered),
        // A lane that failed, or whose items are new or stale, has not recovered: no news.
        _ => None,
    }
}

/// What drifted: the lane's identity reasons, the ids of its drifted prompts that were judged
/// one by one, and whether its sampled prompts moved. Which sampled prompts stand out changes
/// from run to run with the samples drawn, so they are not part of it: a lane whose answers keep
/// drifting is the same news every night.
pub fn signature(lane: &JudgedLane) -> String {
    let mut parts: Vec<String> = lane
        .reasons
        .iter()
        .filter(|r| r.contains(" changed on "))
        .map(|r| r.split(" changed on ").next().unwrap_or(r).to_string())
        .collect();
    let mut drifted: Vec<&str> = lane
        .items
        .iter()
        .filter(|i| i.judgement.verdict == Verdict::Drifted && !i.judgement.review)
        .filter(|i| i.judgement.mode != Some(Mode::Sampled))
        .map(|i| i.judgement.id.as_str())
        .collect();
    drifted.sort_unstable();
    parts.extend(drifted.into_iter().map(str::to_string));
    if lane.test.is_some_and(|t| t.rejected()) {
        parts.push("sampled".into());
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::ItemJudgement;

    fn lane(verdict: Verdict, drifted: &[&str]) -> JudgedLane {
        let items = drifted
            .iter()
            .map(|id| crate::judge::JudgedItem {
                judgement: ItemJudgement {
                    id: id.to_string(),
                    verdict: Verdict::Drifted,
                    similarity: Some(0.1),
                    reasons: vec![],
                    review: false,
                    samples: 1,
                    answered: 1,
                    mode: Some(Mode::Exact),
                    baseline_samples: Some(10),
                    p_value: None,
                    statistic: None,
                },
                baseline: None,
                samples: vec![],
            })
            .collect();
        JudgedLane {
            lane: "free".into(),
            verdict,
            reasons: vec![],
            items,
            test: None,
        }
    }

    fn sent(kind: Kind, signature: &str, hours_ago: i64, now: DateTime<Utc>) -> AlertRow {
        AlertRow {
            id: 1,
            run_id: 1,
            lane: "free".into(),
            kind: kind.as_str().into(),
            signature: signature.into(),
            channel: "email".into(),
            status: "sent".into(),
            subject: String::new(),
            body_text: String::new(),
            body_html: String::new(),
            error: None,
            attempts: 1,
            created_at: (now - chrono::Duration::hours(hours_ago)).to_rfc3339(),
        }
    }

    #[test]
    fn alerts_follow_state_changes_and_repeat_after() {
        let now = Utc::now();
        let day = Duration::from_secs(24 * 3600);
        let drifting = lane(Verdict::Drifted, &["b", "a"]);
        assert_eq!(signature(&drifting), "a,b");
        assert_eq!(
            decide(&drifting, None, day, now),
            Some(Kind::Drift),
            "ok → drifted"
        );
        let same = sent(Kind::Drift, "a,b", 2, now);
        assert_eq!(
            decide(&drifting, Some(&same), day, now),
            None,
            "the same drift, recently sent"
        );
        let old = sent(Kind::Drift, "a,b", 25, now);
        assert_eq!(
            decide(&drifting, Some(&old), day, now),
            Some(Kind::Drift),
            "repeat_after passed"
        );
        let other = sent(Kind::Drift, "a", 2, now);
        assert_eq!(
            decide(&drifting, Some(&other), day, now),
            Some(Kind::Drift),
            "the drift changed"
        );
        let fine = lane(Verdict::Unchanged, &[]);
        assert_eq!(decide(&fine, Some(&same), day, now), Some(Kind::Recovered));
        assert_eq!(
            decide(&fine, Some(&sent(Kind::Recovered, "", 1, now)), day, now),
            None
        );
        assert_eq!(decide(&fine, None, day, now), None);
        let failed = lane(Verdict::Failed, &[]);
        assert_eq!(
            decide(&failed, Some(&same), day, now),
            None,
            "a failed lane has not recovered"
        );
    }
}
