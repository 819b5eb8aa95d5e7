//! The axes along which two answers differ, and the distance between two answers on each.
//!
//! Text similarity alone misses what people act on ("the answer went from yes to no", "the JSON
//! stopped parsing"), so an answer is also described by its categorical axes: the extracted
//! answer, which checks pass, whether it declines, and its length. Each distance is in [0, 1].

use std::time::Duration;

use similar::{Algorithm, TextDiff};

use crate::checks::{Check, evaluate_all, extract_answer, is_refusal};

/// Longest a similarity computation may take; huge outputs get an approximate ratio instead.
const SIMILARITY_TIME_LIMIT: Duration = Duration::from_millis(500);
/// Words of an answer compared by the text axis: long answers are judged on their opening (the
/// length axis still sees the whole), so a test over many samples stays fast.
pub const TEXT_WORDS: usize = 2_000;
/// A length ratio of this much (or more) is the largest length distance.
const LENGTH_RATIO_AT_MOST: f64 = 4.0;
/// Words of an answer's opening compared position by position.
pub const OPENING_WORDS: usize = 4;

/// One axis of comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Axis {
    /// The answer the prompt's `answer` check extracts.
    Answer,
    /// Which pass/fail checks pass.
    Checks,
    /// Whether the answer declines.
    Refusal,
    /// Length in characters (on a log scale).
    Length,
    /// The first words, position by position: where a sampled answer branches, so where a
    /// change of sampler or weights shows first.
    Opening,
    /// Word-level similarity of the texts.
    Text,
}

impl Axis {
    /// Every axis, in the order reasons are preferred when they are equally significant: the
    /// categorical ones first, because people act on them.
    pub const ALL: [Axis; 6] = [
        Axis::Answer,
        Axis::Checks,
        Axis::Refusal,
        Axis::Length,
        Axis::Opening,
        Axis::Text,
    ];

    /// Name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Axis::Answer => "answer",
            Axis::Checks => "checks",
            Axis::Refusal => "refusal",
            Axis::Length => "length",
            Axis::Opening => "opening",
            Axis::Text => "text",
        }
    }
}

/// What the axes look at in one answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Features {
    /// The first [`TEXT_WORDS`] words.
    pub words: Vec<String>,
    /// The extracted answer: `None` without an `answer` check, `Some(None)` when nothing matched.
    pub answer: Option<Option<String>>,
    /// Pass/fail of each check, in the prompt's order.
    pub checks: Vec<bool>,
    /// Whether it declines.
    pub refusal: bool,
    /// Length in characters.
    pub chars: usize,
}

impl Features {
    /// The features of `text` under a prompt's `checks`.
    pub fn of(checks: &[Check], text: &str) -> Features {
        Features {
            words: text
                .split_whitespace()
                .take(TEXT_WORDS)
                .map(str::to_string)
                .collect(),
            answer: extract_answer(checks, text),
            checks: evaluate_all(checks, text)
                .iter()
                .map(|c| c.passed)
                .collect(),
            refusal: is_refusal(text),
            chars: text.chars().count(),
        }
    }
}

/// The axes that can tell answers of a prompt apart: `answer` only with an `answer` check,
/// `checks` only with pass/fail checks.
pub fn axes_for(checks: &[Check]) -> Vec<Axis> {
    let has_answer = checks.iter().any(|c| matches!(c, Check::Answer(_)));
    let has_checks = checks.iter().any(|c| !matches!(c, Check::Answer(_)));
    Axis::ALL
        .into_iter()
        .filter(|axis| match axis {
            Axis::Answer => has_answer,
            Axis::Checks => has_checks,
            _ => true,
        })
        .collect()
}

/// The distance between two answers on one axis, in [0, 1].
pub fn distance(axis: Axis, a: &Features, b: &Features) -> f64 {
    match axis {
        Axis::Answer => f64::from(u8::from(a.answer != b.answer)),
        Axis::Checks => {
            let differ = a
                .checks
                .iter()
                .zip(&b.checks)
                .filter(|(x, y)| x != y)
                .count();
            differ as f64 / a.checks.len().max(1) as f64
        }
        Axis::Refusal => f64::from(u8::from(a.refusal != b.refusal)),
        Axis::Length => {
            let ratio = ((a.chars + 1) as f64 / (b.chars + 1) as f64).ln().abs();
            (ratio / LENGTH_RATIO_AT_MOST.ln()).min(1.0)
        }
        Axis::Opening => {
            let differ = (0..OPENING_WORDS)
                .filter(|&i| a.words.get(i) != b.words.get(i))
                .count();
            differ as f64 / OPENING_WORDS as f64
        }
        Axis::Text => 1.0 - similarity_of_words(&words(a), &words(b)),
    }
}

fn words(features: &Features) -> Vec<&str> {
    features.words.iter().map(String::as_str).collect()
}

/// Word-level similarity of two texts after whitespace normalisation, in [0, 1].
pub fn similarity(a: &str, b: &str) -> f64 {
    // Words only: whitespace tokens would match almost everywhere and inflate the ratio.
    let a: Vec<&str> = a.split_whitespace().collect();
    let b: Vec<&str> = b.split_whitespace().collect();
    similarity_of_words(&a, &b)
}

/// Similarity of two word sequences, in [0, 1].
pub fn similarity_of_words(a: &[&str], b: &[&str]) -> f64 {
    if a == b {
        return 1.0;
    }
    TextDiff::configure()
        .algorithm(Algorithm::Patience)
        .timeout(SIMILARITY_TIME_LIMIT)
        .diff_slices(a, b)
        .ratio() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompts::parse_file;
    use std::path::Path;

    fn checks(yaml: &str) -> Vec<Check> {
        let text = format!("- id: p\n  prompt: x\n  checks:\n{yaml}");
        parse_file(Path::new("p.yaml"), &text)
            .unwrap()
            .remove(0)
            .checks
    }

    #[test]
    fn each_axis_measures_its_own_difference() {
        let c = checks("    - answer: '(?i)\\b(yes|no)\\b'\n    - json: true\n");
        let yes = Features::of(&c, "Yes, it is prime.");
        let no = Features::of(&c, "No, it is not prime.");
        let json = Features::of(&c, "{\"prime\": true}");
        assert_eq!(distance(Axis::Answer, &yes, &no), 1.0);
        assert_eq!(distance(Axis::Answer, &yes, &yes), 0.0);
        assert_eq!(
            distance(Axis::Checks, &yes, &no),
            0.0,
            "neither parses as JSON"
        );
        assert_eq!(distance(Axis::Checks, &yes, &json), 1.0);
        assert_eq!(distance(Axis::Refusal, &yes, &no), 0.0);
        let declines = Features::of(&c, "I can't help with that.");
        assert_eq!(distance(Axis::Refusal, &yes, &declines), 1.0);
        let text = distance(Axis::Text, &yes, &no);
        assert!(text > 0.0 && text < 1.0, "{text}");
    }

    #[test]
    fn the_opening_compares_the_first_words_position_by_position() {
        let c = Vec::new();
        let a = Features::of(&c, "A warm bowl of oatmeal with honey.");
        let b = Features::of(&c, "A warm cup of tea.");
        let c2 = Features::of(&c, "Eggs.");
        assert_eq!(
            distance(Axis::Opening, &a, &b),
            0.25,
            "one of four words differs"
        );
        assert_eq!(
            distance(Axis::Opening, &a, &c2),
            1.0,
            "a missing word differs too"
        );
        assert_eq!(distance(Axis::Opening, &a, &a), 0.0);
    }

    #[test]
    fn length_is_compared_on_a_log_scale_and_capped() {
        let c = Vec::new();
        let short = Features::of(&c, &"a".repeat(99));
        let double = Features::of(&c, &"a".repeat(199));
        let huge = Features::of(&c, &"a".repeat(10_000));
        assert!((distance(Axis::Length, &short, &double) - 0.5).abs() < 1e-9);
        assert_eq!(distance(Axis::Length, &short, &huge), 1.0);
        assert_eq!(
            distance(Axis::Length, &short, &double),
            distance(Axis::Length, &double, &short)
        );
    }

    #[test]
    fn only_the_axes_a_prompt_can_use_are_used() {
        assert_eq!(
            axes_for(&[]),
            [Axis::Refusal, Axis::Length, Axis::Opening, Axis::Text]
        );
        assert_eq!(axes_for(&checks("    - answer: '(yes|no)'\n")).len(), 5);
        assert_eq!(
            axes_for(&checks("    - answer: '(yes|no)'\n    - max_chars: 9\n")),
            Axis::ALL
        );
    }

    #[test]
    fn similarity_ignores_whitespace_and_counts_words() {
        assert_eq!(similarity("a  b\nc", "a b c"), 1.0);
        assert!((similarity("a b c d", "a b x d") - 0.75).abs() < 1e-9);
    }
}
