//! The circuit breaker of one lane: closed, open, half-open.
//!
//! After `failures` consecutive failures the breaker opens and the lane is skipped without a
//! request. Each trip in a row doubles the cooldown (capped, jittered so a fleet of canaries does
//! not probe in lockstep). After the cooldown exactly one probe goes through: its success closes
//! the breaker, its failure opens it again for longer.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::BreakerConfig;

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls are refused until the instant.
    Open {
        /// When the cooldown ends.
        until: Instant,
    },
    /// The cooldown is over; one probe may go through.
    HalfOpen {
        /// The probe handed out and not yet reported, if any.
        probe: Option<u64>,
    },
}

/// What the breaker says to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerAdmission {
    /// Go ahead.
    Allowed,
    /// Go ahead as the one probe; report its result (or release it by this number) without fail.
    Probe(u64),
    /// Refused until the instant (or until the probe in flight reports).
    Refused {
        /// When the lane may be tried again, if known.
        until: Option<Instant>,
    },
}

/// A lane's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    policy: BreakerConfig,
    state: BreakerState,
    consecutive_failures: u32,
    trips_in_a_row: u32,
    probes_issued: u64,
}

impl Breaker {
    /// A closed breaker with the lane's policy.
    pub fn new(policy: BreakerConfig) -> Self {
        Breaker {
            policy,
            state: BreakerState::Closed,
            consecutive_failures: 0,
            trips_in_a_row: 0,
            probes_issued: 0,
        }
    }

    /// The state at `now`, with an expired cooldown read as half-open.
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.state {
            BreakerState::Open { until } if now >= until => BreakerState::HalfOpen { probe: None },
            state => state,
        }
    }

    /// Asks to make one call at `now`.
    pub fn admit(&mut self, now: Instant) -> BreakerAdmission {
        self.state = self.state(now);
        match self.state {
            BreakerState::Closed => BreakerAdmission::Allowed,
            BreakerState::Open { until } => BreakerAdmission::Refused { until: Some(until) },
            BreakerState::HalfOpen { probe: Some(_) } => BreakerAdmission::Refused { until: None },
            BreakerState::HalfOpen { probe: None } => {
                self.probes_issued += 1;
                self.state = BreakerState::HalfOpen {
                    probe: Some(self.probes_issued),
                };
                BreakerAdmission::Probe(self.probes_issued)
            }
        }
    }

    /// Whether a call at `now` would be admitted, without taking the probe.
    pub fn would_admit(&self, now: Instant) -> bool {
        matches!(
            self.state(now),
            BreakerState::Closed | BreakerState::HalfOpen { probe: None }
        )
    }

    /// A call succeeded: the lane is healthy again.
    pub fn record_success(&mut self) {
        self.state = BreakerState::Closed;
        self.consecutive_failures = 0;
        self.trips_in_a_row = 0;
    }

    /// A call failed in a way that says the lane is sick. Returns the new cooldown when this
    /// failure opened the breaker.
    pub fn record_failure(&mut self, now: Instant) -> Option<Duration> {
        self.consecutive_failures += 1;
        let probe_failed = matches!(self.state, BreakerState::HalfOpen { .. });
        if probe_failed || self.consecutive_failures >= self.policy.failures {
            self.trips_in_a_row += 1;
            self.consecutive_failures = 0;
            let cooldown = self.cooldown(self.trips_in_a_row);
            self.state = BreakerState::Open {
                until: now + cooldown,
            };
            return Some(cooldown);
        }
        None
    }

    /// Probe `probe` never reported (its queue wait timed out, the job was dropped): hand the
    /// probe to the next caller instead of leaving the breaker stuck half-open. A probe that is
    /// no longer the current one (the breaker moved on since) releases nothing.
    pub fn release_probe(&mut self, probe: u64) {
        if self.state == (BreakerState::HalfOpen { probe: Some(probe) }) {
            self.state = BreakerState::HalfOpen { probe: None };
        }
    }

    /// Cooldown of the `trip`-th trip in a row: doubling, capped, then jittered by up to a tenth
    /// either way (never above the cap).
    fn cooldown(&self, trip: u32) -> Duration {
        let doubling = 2u32.saturating_pow(trip.saturating_sub(1).min(20));
        let grown = self
            .policy
            .cooldown
            .saturating_mul(doubling)
            .min(self.policy.max_cooldown);
        let jitter = 0.9 + fastrand::f64() * 0.2;
        grown.mul_f64(jitter).min(self.policy.max_cooldown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BreakerConfig {
        BreakerConfig {
            failures: 2,
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(100),
        }
    }

    #[test]
    fn opens_after_consecutive_failures_and_admits_one_probe_after_cooldown() {
        let start = Instant::now();
        let mut breaker = Breaker::new(policy());
        assert_eq!(breaker.record_failure(start), None);
        let cooldown = breaker.record_failure(start).expect("second failure opens");
        assert!(cooldown >= Duration::from_secs(27) && cooldown <= Duration::from_secs(33));
        assert!(matches!(
            breaker.admit(start + Duration::from_secs(1)),
            BreakerAdmission::Refused { .. }
        ));
        let later = start + Duration::from_secs(34);
        assert_eq!(breaker.admit(later), BreakerAdmission::Probe(1));
        assert_eq!(
            breaker.admit(later),
            BreakerAdmission::Refused { until: None }
        );
        breaker.record_success();
        assert_eq!(breaker.admit(later), BreakerAdmission::Allowed);
    }

    #[test]
    fn a_success_resets_the_count() {
        let now = Instant::now();
        let mut breaker = Breaker::new(policy());
        breaker.record_failure(now);
        breaker.record_success();
        assert_eq!(breaker.record_failure(now), None);
        assert_eq!(breaker.admit(now), BreakerAdmission::Allowed);
    }

    #[test]
    fn repeated_trips_grow_the_cooldown_up_to_the_cap() {
        let mut now = Instant::now();
        let mut breaker = Breaker::new(policy());
        breaker.record_failure(now);
        let first = breaker.record_failure(now).unwrap();
        now += first;
        assert!(matches!(breaker.admit(now), BreakerAdmission::Probe(_)));
        let second = breaker.record_failure(now).expect("a failed probe reopens");
        assert!(second >= Duration::from_secs(54), "{second:?}");
        now += second;
        assert!(matches!(breaker.admit(now), BreakerAdmission::Probe(_)));
        let third = breaker.record_failure(now).unwrap();
        assert!(
            third <= Duration::from_secs(100) && third >= Duration::from_secs(90),
            "{third:?}"
        );
    }

    #[test]
    fn a_released_probe_goes_to_the_next_caller() {
        let now = Instant::now();
        let mut breaker = Breaker::new(policy());
        breaker.record_failure(now);
        let cooldown = breaker.record_failure(now).unwrap();
        let later = now + cooldown;
        assert_eq!(breaker.admit(later), BreakerAdmission::Probe(1));
        breaker.release_probe(1);
        assert_eq!(breaker.admit(later), BreakerAdmission::Probe(2));
    }

    #[test]
    fn a_stale_probe_cannot_release_the_current_one() {
        let now = Instant::now();
        let mut breaker = Breaker::new(policy());
        breaker.record_failure(now);
        let cooldown = breaker.record_failure(now).unwrap();
        let later = now + cooldown;
        assert_eq!(breaker.admit(later), BreakerAdmission::Probe(1));
        // Probe 1 is still out when an older request fails and the breaker trips again.
        let again = breaker.record_failure(later).unwrap();
        let much_later = later + again;
        assert_eq!(breaker.admit(much_later), BreakerAdmission::Probe(2));
        breaker.release_probe(1);
        assert_eq!(
            breaker.admit(much_later),
            BreakerAdmission::Refused { until: None }
        );
    }
}
