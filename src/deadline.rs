//! The one absolute deadline a job carries from the edge to every hop.
//!
//! A deadline is minted once, where the job enters canary, on the monotonic clock. Everything
//! below reads what is left of it; nothing below mints another or passes a fixed duration down,
//! so layers cannot stack their timeouts and a wall-clock jump cannot turn a timeout into a hang.

use std::time::Duration;

use tokio::time::Instant;

/// The longest budget a deadline holds; larger ones are cut to this.
pub const MAX_BUDGET: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// An absolute point on the monotonic clock by which a job must be finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    /// Mints the deadline of a new job: `budget` from now. Call this only at the edge.
    pub fn after(budget: Duration) -> Self {
        let now = Instant::now();
        // A budget too large for the clock is as good as no deadline: cap it at a year.
        let at = now.checked_add(budget.min(MAX_BUDGET)).unwrap_or(now);
        Deadline { at }
    }

    /// The deadline at an absolute instant, for callers that already hold one.
    pub fn at(at: Instant) -> Self {
        Deadline { at }
    }

    /// The instant the budget runs out.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// Budget left now; zero once the deadline has passed.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether less than `floor` is left: too little to start work that could finish.
    pub fn is_below(&self, floor: Duration) -> bool {
        self.remaining() < floor
    }

    /// A deadline for one part of the job that ends after at most `share` of what is left,
    /// never later than this one. Used so a lane cannot spend the time later lanes need.
    pub fn share(&self, share: f64) -> Deadline {
        if share >= 1.0 {
            return *self;
        }
        let part = self.remaining().mul_f64(share.clamp(0.0, 1.0));
        Deadline {
            at: (Instant::now() + part).min(self.at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn remaining_counts_down_and_stops_at_zero() {
        let deadline = Deadline::after(Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(deadline.remaining(), Duration::from_millis(50));
        assert!(!deadline.is_below(Duration::from_millis(50)));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(deadline.remaining(), Duration::ZERO);
        assert!(deadline.is_below(Duration::from_millis(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_share_never_ends_after_the_whole() {
        let deadline = Deadline::after(Duration::from_secs(10));
        let half = deadline.share(0.5);
        assert_eq!(half.remaining(), Duration::from_secs(5));
        assert_eq!(deadline.share(1.0), deadline);
        assert!(deadline.share(2.0) <= deadline);
    }
}
