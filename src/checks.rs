//! Deterministic checks of an answer, and the answer's shape: extracted answer, refusal, length.
//!
//! Checks make drift concrete: "the JSON stopped parsing" or "the answer went from yes to no" is
//! a reason a person acts on, where a similarity score alone is not.

use std::fmt;

use regex::Regex;
use serde::{Deserialize, Deserializer};

/// One check from a prompt's `checks:` list.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    /// Extracts the answer (first capture group, else the whole match); a changed answer is drift.
    Answer(Pattern),
    /// The output contains this text (case-insensitive).
    Contains(String),
    /// The output does not contain this text (case-insensitive).
    NotContains(String),
    /// The output matches this regex.
    Regex(Pattern),
    /// `true`: the output (trimmed) parses as JSON.
    Json(bool),
    /// At most this many characters.
    MaxChars(usize),
    /// At least this many characters.
    MinChars(usize),
    /// At most this many words.
    MaxWords(usize),
    /// `true`: the answer declines; `false`: it does not.
    Refuses(bool),
}

/// A compiled regex, checked when the prompt file loads.
#[derive(Debug, Clone)]
pub struct Pattern(pub Regex);

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Regex::new(&text)
            .map(Pattern)
            .map_err(|err| serde::de::Error::custom(format!("invalid regex `{text}`: {err}")))
    }
}

/// The outcome of one pass/fail check on one output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// The check, as a person reads it (`contains "yes"`).
    pub name: String,
    /// Whether the output passed.
    pub passed: bool,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Check::Answer(p) => write!(f, "answer /{}/", p.0.as_str()),
            Check::Contains(s) => write!(f, "contains {s:?}"),
            Check::NotContains(s) => write!(f, "not_contains {s:?}"),
            Check::Regex(p) => write!(f, "regex /{}/", p.0.as_str()),
            Check::Json(b) => write!(f, "json: {b}"),
            Check::MaxChars(n) => write!(f, "max_chars {n}"),
            Check::MinChars(n) => write!(f, "min_chars {n}"),
            Check::MaxWords(n) => write!(f, "max_words {n}"),
            Check::Refuses(b) => write!(f, "refuses: {b}"),
        }
    }
}

impl Check {
    /// Runs a pass/fail check; `None` for `answer`, which extracts rather than judges.
    pub fn evaluate(&self, output: &str) -> Option<CheckResult> {
        let lower = || output.to_lowercase();
        let passed = match self {
            Check::Answer(_) => return None,
            Check::Contains(s) => lower().contains(&s.to_lowercase()),
            Check::NotContains(s) => !lower().contains(&s.to_lowercase()),
            Check::Regex(p) => p.0.is_match(output),
            Check::Json(want) => {
                serde_json::from_str::<serde_json::Value>(output.trim()).is_ok() == *want
            }
            Check::MaxChars(n) => output.chars().count() <= *n,
            Check::MinChars(n) => output.chars().count() >= *n,
            Check::MaxWords(n) => output.split_whitespace().count() <= *n,
            Check::Refuses(want) => is_refusal(output) == *want,
        };
        Some(CheckResult {
            name: self.to_string(),
            passed,
        })
    }
}

/// Runs every pass/fail check of a prompt on `output`.
pub fn evaluate_all(checks: &[Check], output: &str) -> Vec<CheckResult> {
    checks.iter().filter_map(|c| c.evaluate(output)).collect()
}

/// The answer the prompt's `answer` check extracts, normalised (trimmed, lower-case, inner
/// whitespace collapsed). `None` when the prompt has no `answer` check; `Some(None)` when it has
/// one and nothing matched.
pub fn extract_answer(checks: &[Check], output: &str) -> Option<Option<String>> {
    let pattern = checks.iter().find_map(|c| match c {
        Check::Answer(p) => Some(&p.0),
        _ => None,
    })?;
    let found = pattern.captures(output).map(|caps| {
        let m = caps
            .get(1)
            .or_else(|| caps.get(0))
            .map_or("", |m| m.as_str());
        normalize_whitespace(m).to_lowercase()
    });
    Some(found)
}

/// Collapses every run of whitespace to one space and trims the ends.
pub fn normalize_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether an answer declines the request. Looks only at the opening of the answer, where
/// models put their refusals, so an answer that merely mentions "I can't" deep inside is not
/// taken for one.
pub fn is_refusal(output: &str) -> bool {
    const MARKERS: [&str; 16] = [
        "i can't",
        "i cannot",
        "i can not",
        "i won't",
        "i will not",
        "i'm not able to",
        "i am not able to",
        "i'm unable to",
        "i am unable to",
        "i'm sorry, but",
        "i am sorry, but",
        "sorry, but i",
        "i must decline",
        "i'm not comfortable",
        "as an ai",
        "i apologize, but",
    ];
    let opening: String = output
        .trim_start()
        .chars()
        .take(160)
        .collect::<String>()
        .to_lowercase()
        .replace('\u{2019}', "'");
    MARKERS.iter().any(|marker| opening.contains(marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(yaml: &str) -> Vec<Check> {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn each_check_passes_and_fails_on_its_own_terms() {
        let list = checks(
            "- contains: \"YES\"\n- not_contains: maybe\n- regex: '^\\s*(yes|no)'\n- json: true\n- max_chars: 5\n- min_chars: 2\n- max_words: 1\n- refuses: false\n",
        );
        let results = evaluate_all(&list, "yes");
        assert_eq!(
            results
                .iter()
                .filter(|r| !r.passed)
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>(),
            ["json: true"]
        );
        let results = evaluate_all(&list, "{\"a\": 1}");
        let failed: Vec<_> = results
            .iter()
            .filter(|r| !r.passed)
            .map(|r| r.name.clone())
            .collect();
        assert_eq!(
            failed,
            [
                "contains \"YES\"",
                "regex /^\\s*(yes|no)/",
                "max_chars 5",
                "max_words 1"
            ]
        );
    }

    #[test]
    fn the_answer_is_the_first_group_normalised() {
        let list = checks("- answer: '(?i)\\b(yes|no)\\b'\n");
        assert_eq!(
            extract_answer(&list, "Yes, 17077 is prime."),
            Some(Some("yes".into()))
        );
        assert_eq!(extract_answer(&list, "It is composite."), Some(None));
        assert_eq!(extract_answer(&[], "Yes"), None);
    }

    #[test]
    fn refusals_are_seen_at_the_opening_only() {
        assert!(is_refusal("I'm sorry, but I can't help with that."));
        assert!(is_refusal("I can\u{2019}t provide instructions for that."));
        assert!(!is_refusal("Sure. Here is how a lock works: ..."));
        let long = format!("{} Some say I can't be sure.", "Word ".repeat(60));
        assert!(!is_refusal(&long));
    }
}
