//! When `canary schedule` fires: cron expressions, read the way their writers mean them.
//!
//! Two syntaxes are accepted: the cron crate's 6/7 fields (`sec min hour dom month dow [year]`)
//! and a plain 5-field crontab line (`min hour dom month dow`). The cron crate numbers the days
//! of the week from 1 = Sunday, a crontab from 0 = Sunday (1 = Monday). A numeric day of the
//! week is always read as a crontab user means it and rewritten to day names before the cron
//! crate sees it, so `1-5` is Monday to Friday in either syntax, never silently a day off.

use std::str::FromStr;

/// Day names by crontab number (0 and 7 are both Sunday).
const DAYS: [&str; 8] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];

/// Parses a schedule expression; the error quotes the offending text and says what to write.
pub fn parse_expression(text: &str) -> Result<cron::Schedule, String> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let mut fields: Vec<String> = match fields.len() {
        // A crontab line has no seconds: fire at second 0.
        5 => std::iter::once("0")
            .chain(fields.iter().copied())
            .map(str::to_string)
            .collect(),
        6 | 7 => fields.iter().map(|f| f.to_string()).collect(),
        n => {
            return Err(format!(
                "cron expression `{text}` has {n} fields; expected a 5-field crontab line \
                 (min hour dom month dow, e.g. `0 3 * * *`) or 6/7 fields \
                 (sec min hour dom month dow [year], e.g. `0 0 3 * * *`)"
            ));
        }
    };
    fields[5] = day_names(&fields[5]).map_err(|why| format!("cron expression `{text}`: {why}"))?;
    let normalised = fields.join(" ");
    cron::Schedule::from_str(&normalised)
        .map_err(|err| format!("cron expression `{text}` is not valid: {err}"))
}

/// Parses an IANA time zone name.
pub fn parse_timezone(text: &str) -> Result<chrono_tz::Tz, String> {
    text.parse::<chrono_tz::Tz>().map_err(|_| {
        format!("unknown time zone `{text}`: expected an IANA name such as UTC, Europe/Berlin or America/New_York")
    })
}

/// Rewrites the numbers of a day-of-week field to day names, crontab-style.
fn day_names(field: &str) -> Result<String, String> {
    if !field.bytes().any(|b| b.is_ascii_digit()) {
        return Ok(field.to_string());
    }
    let mut days: Vec<usize> = Vec::new();
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => {
                let step: usize =
                    step.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                        format!("day-of-week step `{item}` is not a positive number")
                    })?;
                (range, step)
            }
            None => (item, 1),
        };
        let (first, last) = match range {
            "*" | "?" => (0, 6),
            _ => match range.split_once('-') {
                Some((a, b)) => (day_number(a, item)?, day_number(b, item)?),
                None if step > 1 => (day_number(range, item)?, 6),
                None => {
                    let day = day_number(range, item)?;
                    (day, day)
                }
            },
        };
        if first > last {
            return Err(format!(
                "day-of-week range `{item}` runs backwards; write it as a list (e.g. `FRI,SAT,SUN`)"
            ));
        }
        days.extend((first..=last).step_by(step));
    }
    let mut names: Vec<&str> = days.into_iter().map(|d| DAYS[d]).collect();
    names.dedup();
    let mut unique = Vec::new();
    for name in names {
        if !unique.contains(&name) {
            unique.push(name);
        }
    }
    Ok(unique.join(","))
}

/// A day given as a crontab number (0-7) or a name.
fn day_number(text: &str, item: &str) -> Result<usize, String> {
    if let Ok(number) = text.parse::<usize>() {
        return if number <= 7 {
            Ok(number)
        } else {
            Err(format!(
                "day of week `{number}` in `{item}` is out of range: use 0-7 (0 and 7 are Sunday, 1 is Monday) or names MON-SUN"
            ))
        };
    }
    DAYS.iter()
        .position(|d| d.eq_ignore_ascii_case(text))
        .ok_or_else(|| format!("`{text}` in `{item}` is not a day of the week"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, TimeZone, Timelike, Utc, Weekday};

    fn next_after(expr: &str, after: chrono::DateTime<Utc>) -> chrono::DateTime<Utc> {
        parse_expression(expr)
            .unwrap()
            .after(&after)
            .next()
            .unwrap()
    }

    #[test]
    fn numeric_day_one_is_monday_in_both_syntaxes() {
        // 2026-11-29 is a Sunday.
        let sunday = Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap();
        assert_eq!(next_after("0 3 * * 1", sunday).weekday(), Weekday::Mon);
        assert_eq!(next_after("0 0 3 * * 1", sunday).weekday(), Weekday::Mon);
        assert_eq!(next_after("0 3 * * 0", sunday).weekday(), Weekday::Sun);
        assert_eq!(next_after("0 3 * * 7", sunday).weekday(), Weekday::Sun);
        let weekdays: Vec<Weekday> = parse_expression("0 3 * * 1-5")
            .unwrap()
            .after(&sunday)
            .take(5)
            .map(|t| t.weekday())
            .collect();
        assert_eq!(
            weekdays,
            [
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri
            ]
        );
    }

    #[test]
    fn a_crontab_line_fires_at_second_zero() {
        let start = Utc.with_ymd_and_hms(2026, 11, 30, 1, 0, 0).unwrap();
        let next = next_after("30 2 * * *", start);
        assert_eq!((next.hour(), next.minute(), next.second()), (2, 30, 0));
    }

    #[test]
    fn names_steps_and_lists_are_understood() {
        assert_eq!(day_names("MON-FRI").unwrap(), "MON-FRI");
        assert_eq!(day_names("1,3,5").unwrap(), "MON,WED,FRI");
        assert_eq!(day_names("*/2").unwrap(), "SUN,TUE,THU,SAT");
        assert_eq!(day_names("5-7").unwrap(), "FRI,SAT,SUN");
        assert_eq!(day_names("0,7").unwrap(), "SUN");
    }

    #[test]
    fn bad_expressions_quote_the_text() {
        let err = parse_expression("0 3 * *").unwrap_err();
        assert!(err.contains("`0 3 * *` has 4 fields"), "{err}");
        let err = parse_expression("0 3 * * 8").unwrap_err();
        assert!(
            err.contains("`0 3 * * 8`") && err.contains("out of range"),
            "{err}"
        );
        let err = parse_expression("0 61 * * *").unwrap_err();
        assert!(err.contains("`0 61 * * *` is not valid"), "{err}");
        let err = parse_timezone("Mars/Olympus").unwrap_err();
        assert!(err.contains("`Mars/Olympus`"), "{err}");
    }
}
