//! When does an exhausted lane get its capacity back?
//!
//! Providers say it in several dialects: `Retry-After` (seconds or an HTTP date),
//! `retry-after-ms`, OpenAI's `x-ratelimit-reset-requests: 6m0s` durations, epoch stamps in
//! `X-RateLimit-Reset` (OpenRouter sends milliseconds, nested in a 200 body), and Anthropic's
//! RFC 3339 `anthropic-ratelimit-*-reset`. This module reads all of them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest a provider's reset time is believed: a bogus header must not park a lane forever.
pub const MAX_RESET: Duration = Duration::from_secs(24 * 60 * 60);

/// Reads the reset time out of response headers (or header-like pairs from an error body).
///
/// `Retry-After` style headers are authoritative when present; otherwise the latest of the
/// `*ratelimit*reset*` headers wins, because retrying before the last limit resets only earns
/// another 429. The result is never before `now` nor more than [`MAX_RESET`] after it.
pub fn reset_time<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    now: SystemTime,
) -> Option<SystemTime> {
    let mut retry_after = None;
    let mut latest_reset: Option<SystemTime> = None;
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        let value = value.trim();
        if name == "retry-after-ms" {
            if let Ok(ms) = value.parse::<f64>() {
                retry_after = Some(after(now, seconds(ms / 1000.0)));
            }
        } else if name == "retry-after" {
            // retry-after-ms is more precise; keep it when both are sent.
            if retry_after.is_none() {
                retry_after = parse_retry_after(value, now);
            }
        } else if name.contains("ratelimit")
            && name.contains("reset")
            && let Some(at) = parse_reset(value, now)
        {
            latest_reset = Some(latest_reset.map_or(at, |prev| prev.max(at)));
        }
    }
    retry_after.or(latest_reset).map(|at| clamp(at, now))
}

fn clamp(at: SystemTime, now: SystemTime) -> SystemTime {
    at.max(now).min(now + MAX_RESET)
}

fn after(now: SystemTime, delta: Duration) -> SystemTime {
    now.checked_add(delta).unwrap_or(now + MAX_RESET)
}

/// `Retry-After: 120` or `Retry-After: Wed, 21 Oct 2015 07:28:00 GMT`.
fn parse_retry_after(value: &str, now: SystemTime) -> Option<SystemTime> {
    if let Ok(value_seconds) = value.parse::<f64>() {
        return Some(after(now, seconds(value_seconds)));
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    Some(system_time_from_unix_ms(date.timestamp_millis()))
}

/// A reset stamp: epoch milliseconds, epoch seconds, seconds from now, a duration such as
/// `6m0s` or `120ms`, or an RFC 3339 timestamp.
fn parse_reset(value: &str, now: SystemTime) -> Option<SystemTime> {
    if let Ok(number) = value.parse::<f64>() {
        if number >= 1e12 {
            return Some(system_time_from_unix_ms(number as i64));
        }
        if number >= 1e9 {
            return Some(system_time_from_unix_ms((number * 1000.0) as i64));
        }
        return Some(after(now, seconds(number)));
    }
    if let Ok(delta) = humantime::parse_duration(value) {
        return Some(after(now, delta));
    }
    let stamp = chrono::DateTime::parse_from_rfc3339(value).ok()?;
    Some(system_time_from_unix_ms(stamp.timestamp_millis()))
}

/// Seconds from a header as a duration: negative is zero, and anything too large or not a number
/// at all (`1e300`, `inf`, `NaN`) is the longest reset we believe.
fn seconds(value: f64) -> Duration {
    if value.is_nan() {
        return MAX_RESET;
    }
    Duration::try_from_secs_f64(value.max(0.0)).unwrap_or(MAX_RESET)
}

fn system_time_from_unix_ms(ms: i64) -> SystemTime {
    if ms <= 0 {
        UNIX_EPOCH
    } else {
        UNIX_EPOCH + Duration::from_millis(ms as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn reset(headers: &[(&str, &str)]) -> Option<Duration> {
        reset_time(headers.iter().copied(), now()).map(|at| at.duration_since(now()).unwrap())
    }

    #[test]
    fn retry_after_seconds() {
        assert_eq!(
            reset(&[("Retry-After", "20")]),
            Some(Duration::from_secs(20))
        );
    }

    #[test]
    fn retry_after_http_date() {
        // 1_800_000_000 is 2027-01-15T08:00:00Z.
        let got = reset(&[("retry-after", "Fri, 15 Jan 2027 08:01:30 GMT")]);
        assert_eq!(got, Some(Duration::from_secs(90)));
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        let got = reset(&[("retry-after", "20"), ("retry-after-ms", "1500")]);
        assert_eq!(got, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn openai_durations_take_the_latest() {
        let got = reset(&[
            ("x-ratelimit-reset-requests", "6m0s"),
            ("x-ratelimit-reset-tokens", "120ms"),
        ]);
        assert_eq!(got, Some(Duration::from_secs(360)));
    }

    #[test]
    fn openrouter_epoch_milliseconds() {
        let stamp = (1_800_000_000_000u64 + 45_000).to_string();
        assert_eq!(
            reset(&[("X-RateLimit-Reset", stamp.as_str())]),
            Some(Duration::from_secs(45))
        );
    }

    #[test]
    fn epoch_seconds_and_rfc3339() {
        assert_eq!(
            reset(&[("x-ratelimit-reset", "1800000010")]),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            reset(&[("anthropic-ratelimit-requests-reset", "2027-01-15T08:00:05Z")]),
            Some(Duration::from_secs(5))
        );
    }

    #[test]
    fn nonsense_and_the_past_are_bounded() {
        assert_eq!(reset(&[("retry-after", "soon")]), None);
        assert_eq!(
            reset(&[("x-ratelimit-reset", "1000000000")]),
            Some(Duration::ZERO)
        );
        assert_eq!(reset(&[("retry-after", "99999999")]), Some(MAX_RESET));
        assert_eq!(reset(&[("content-type", "application/json")]), None);
        for hostile in ["1e20", "inf", "NaN", "-inf"] {
            let got = reset(&[("retry-after", hostile)]).unwrap();
            assert!(got <= MAX_RESET, "{hostile}: {got:?}");
            let got = reset(&[("retry-after-ms", hostile)]).unwrap();
            assert!(got <= MAX_RESET, "{hostile}: {got:?}");
        }
    }
}
