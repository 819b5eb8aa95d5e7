//! The vocabulary of what happened to one attempt on one lane.
//!
//! Text output, JSON, the audit log and the metrics all use these names, so a user can grep for
//! `queue_timeout` in any of them and find the same event.

use std::fmt;

use serde::Serialize;

/// What one lane did with one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The lane answered inside the deadline.
    Served,
    /// The lane did not finish before its share of the deadline ran out.
    Timeout,
    /// Less than the floor was left, so the lane was not called at all.
    BudgetExhausted,
    /// The deadline ran out while waiting for one of the lane's in-flight permits.
    QueueTimeout,
    /// The provider said 429 / quota; the lane is skipped until its reset time.
    Exhausted,
    /// The lane's breaker is open after repeated failures; it was not called.
    BreakerOpen,
    /// The lane is switched off (config or kill-switch env var) for this process.
    Disabled,
    /// The provider refused our credentials (401/403), or the lane's key is missing.
    Misconfigured,
    /// 5xx, an error body, a body that is not a completion, or a refused or reset connection.
    Error,
}

impl Outcome {
    /// Every outcome, in the order reports list them.
    pub const ALL: [Outcome; 9] = [
        Outcome::Served,
        Outcome::Timeout,
        Outcome::BudgetExhausted,
        Outcome::QueueTimeout,
        Outcome::Exhausted,
        Outcome::BreakerOpen,
        Outcome::Disabled,
        Outcome::Misconfigured,
        Outcome::Error,
    ];

    /// The contract's name for this outcome.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Timeout => "timeout",
            Outcome::BudgetExhausted => "budget_exhausted",
            Outcome::QueueTimeout => "queue_timeout",
            Outcome::Exhausted => "exhausted",
            Outcome::BreakerOpen => "breaker_open",
            Outcome::Disabled => "disabled",
            Outcome::Misconfigured => "misconfigured",
            Outcome::Error => "error",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
