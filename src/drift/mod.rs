//! Where drift is decided for answers that vary: "did this lane's distribution of answers
//! change?", asked of every sampled prompt of a lane at once, with a false-alarm rate the user
//! sets (`drift.alpha`).
//!
//! - [`axes`]: what two answers are compared on, and the distance on each axis.
//! - [`energy`]: the test itself, on distance matrices: energy statistic, stratified permutation,
//!   and the combination of a lane's prompts.
//!
//! This module turns a prompt's baseline answers and run answers into those matrices, and the
//! test's numbers back into reasons people read (`answers "no" in 4 of 5 samples vs 0 of 10 in
//! the baseline, p = 0.002`).

pub mod axes;
pub mod energy;

use std::collections::BTreeMap;

use axes::{Axis, Features, axes_for, distance};
use energy::{PERMUTATIONS, Stratum, permutation_test};

use crate::checks::{Check, evaluate_all};
use crate::completion::hex_sha256;

/// One prompt's answers to test: the baseline's distinct answers with how many samples gave each,
/// and the run's answers.
#[derive(Debug, Clone)]
pub struct PromptSamples<'a> {
    /// The prompt's checks (they define the categorical axes).
    pub checks: &'a [Check],
    /// Distinct baseline answers and their counts.
    pub baseline: Vec<(&'a str, u32)>,
    /// The run's answers, one per answered sample.
    pub run: Vec<&'a str>,
}

/// How one axis of a prompt moved.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisFinding {
    /// The axis.
    pub axis: Axis,
    /// Its own permutation p-value.
    pub p_value: f64,
    /// What moved, in words and numbers.
    pub description: String,
}

/// What the test says of one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptFinding {
    /// The prompt's p-value (all axes together).
    pub p_value: f64,
    /// The energy statistic of all axes together.
    pub statistic: f64,
    /// Every axis, most significant first.
    pub axes: Vec<AxisFinding>,
    /// Baseline samples and run samples compared.
    pub sizes: (usize, usize),
}

impl PromptFinding {
    /// Reasons for people: every axis significant at `alpha`, or the one that moved most.
    pub fn reasons(&self, alpha: f64) -> Vec<String> {
        let significant: Vec<&AxisFinding> =
            self.axes.iter().filter(|a| a.p_value <= alpha).collect();
        let shown = if significant.is_empty() {
            self.axes.iter().take(1).collect()
        } else {
            significant
        };
        shown
            .iter()
            .map(|a| format!("{}, p = {}", a.description, format_p(a.p_value)))
            .collect()
    }
}

/// What the test says of a lane's sampled prompts.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneFinding {
    /// The lane's p-value over all its sampled prompts.
    pub p_value: f64,
    /// Each prompt's finding, in the order given.
    pub prompts: Vec<PromptFinding>,
    /// Permutations drawn.
    pub permutations: usize,
}

/// Tests a lane's sampled prompts. `seed_text` names the comparison (lane, run, baseline) so the
/// same comparison always draws the same permutations.
pub fn test_lane(prompts: &[PromptSamples<'_>], seed_text: &str) -> LaneFinding {
    let prepared: Vec<Prepared> = prompts.iter().map(prepare).collect();
    let strata: Vec<Stratum> = prepared.iter().map(|p| p.stratum.clone()).collect();
    let seed = u64::from_str_radix(&hex_sha256(seed_text.as_bytes())[..16], 16).unwrap_or(0);
    let test = permutation_test(&strata, PERMUTATIONS, seed);
    let findings = prepared
        .iter()
        .zip(prompts)
        .zip(&test.strata)
        .map(|((prepared, prompt), result)| {
            let mut axes: Vec<AxisFinding> = prepared
                .axes
                .iter()
                .enumerate()
                .map(|(index, &axis)| AxisFinding {
                    axis,
                    p_value: result.p_values[index + 1],
                    description: describe(axis, prompt, prepared, index + 1),
                })
                .collect();
            // Most significant first; among equals, the order of Axis::ALL.
            axes.sort_by(|a, b| a.p_value.total_cmp(&b.p_value).then(a.axis.cmp(&b.axis)));
            PromptFinding {
                p_value: result.p_value,
                statistic: result.statistic[0],
                axes,
                sizes: (prepared.stratum.base(), prepared.stratum.run()),
            }
        })
        .collect();
    LaneFinding {
        p_value: test.p_value,
        prompts: findings,
        permutations: test.permutations,
    }
}

/// A p-value as people read it: two decimals, more for small ones, never rounded to zero.
pub fn format_p(p: f64) -> String {
    if p >= 0.01 {
        format!("{p:.2}")
    } else if p >= 0.001 {
        format!("{p:.3}")
    } else {
        format!("{p:.4}")
    }
}

/// A prompt's samples as a stratum: the baseline's samples (each distinct answer repeated by its
/// count), then the run's; measure 0 is the sum of the axes, then one measure per axis.
struct Prepared {
    stratum: Stratum,
    axes: Vec<Axis>,
    /// Features of every sample, baseline first.
    features: Vec<Features>,
}

fn prepare(prompt: &PromptSamples<'_>) -> Prepared {
    let axes = axes_for(prompt.checks);
    // Distinct texts once: a deterministic baseline of ten samples is one text.
    let mut distinct: Vec<&str> = Vec::new();
    let mut index_of: BTreeMap<&str, usize> = BTreeMap::new();
    let mut samples: Vec<usize> = Vec::new();
    let all = prompt
        .baseline
        .iter()
        .flat_map(|(text, count)| std::iter::repeat_n(*text, *count as usize))
        .chain(prompt.run.iter().copied());
    for text in all {
        let index = *index_of.entry(text).or_insert_with(|| {
            distinct.push(text);
            distinct.len() - 1
        });
        samples.push(index);
    }
    let features: Vec<Features> = distinct
        .iter()
        .map(|text| Features::of(prompt.checks, text))
        .collect();
    let n = distinct.len();
    let mut between = vec![Vec::new(); n * n];
    for i in 0..n {
        for j in (i + 1)..n {
            let d: Vec<f64> = axes
                .iter()
                .map(|&axis| distance(axis, &features[i], &features[j]))
                .collect();
            between[i * n + j] = d.clone();
            between[j * n + i] = d;
        }
    }
    let base: usize = prompt.baseline.iter().map(|(_, c)| *c as usize).sum();
    let stratum = Stratum::new(base, prompt.run.len(), axes.len() + 1, |i, j| {
        let (a, b) = (samples[i], samples[j]);
        if a == b {
            return vec![0.0; axes.len() + 1];
        }
        let d = &between[a * n + b];
        std::iter::once(d.iter().sum())
            .chain(d.iter().copied())
            .collect()
    });
    Prepared {
        stratum,
        axes,
        features: samples.iter().map(|&i| features[i].clone()).collect(),
    }
}

/// What moved on one axis, as a sentence with its numbers.
fn describe(axis: Axis, prompt: &PromptSamples<'_>, prepared: &Prepared, measure: usize) -> String {
    let (base, run) = prepared.features.split_at(prepared.stratum.base());
    let rates = |what: &str, run_hits: usize, base_hits: usize| {
        format!(
            "{what} in {run_hits} of {} samples vs {base_hits} of {} in the baseline",
            run.len(),
            base.len()
        )
    };
    match axis {
        Axis::Answer => {
            let mut values: Vec<Option<String>> = prepared
                .features
                .iter()
                .filter_map(|f| f.answer.clone())
                .collect();
            values.sort();
            values.dedup();
            let moved = most_moved(base, run, &values, |f, v| f.answer.as_ref() == Some(v));
            moved.map_or_else(String::new, |(value, r, b)| {
                let what = match value {
                    Some(v) => format!("answers {v:?}"),
                    None => "finds no answer".to_string(),
                };
                rates(&what, r, b)
            })
        }
        Axis::Checks => {
            let names: Vec<String> = evaluate_all(prompt.checks, "")
                .into_iter()
                .map(|c| c.name)
                .collect();
            let indices: Vec<usize> = (0..names.len()).collect();
            let moved = most_moved(base, run, &indices, |f, &i| f.checks.get(i) == Some(&true));
            moved.map_or_else(String::new, |(i, r, b)| {
                rates(&format!("check `{}` passes", names[i]), r, b)
            })
        }
        Axis::Refusal => {
            let count = |group: &[Features]| group.iter().filter(|f| f.refusal).count();
            rates("declines", count(run), count(base))
        }
        Axis::Length => {
            let median = |group: &[Features]| {
                let mut chars: Vec<usize> = group.iter().map(|f| f.chars).collect();
                chars.sort_unstable();
                chars.get(chars.len() / 2).copied().unwrap_or(0)
            };
            format!(
                "median length {} chars vs {} in the baseline",
                median(run),
                median(base)
            )
        }
        Axis::Opening => {
            let means = prepared.stratum.means(measure);
            let mut text = format!(
                "opening words shared with the baseline {:.2}",
                1.0 - means.cross
            );
            if let Some(within) = means.within_base {
                text.push_str(&format!(" vs {:.2} within the baseline", 1.0 - within));
            }
            if let Some(within) = means.within_run {
                text.push_str(&format!(" and {:.2} within this run", 1.0 - within));
            }
            text
        }
        Axis::Text => {
            let means = prepared.stratum.means(measure);
            let mut text = format!("similarity to the baseline {:.2}", 1.0 - means.cross);
            if let Some(within) = means.within_base {
                text.push_str(&format!(" vs {:.2} within the baseline", 1.0 - within));
            }
            if let Some(within) = means.within_run {
                text.push_str(&format!(" and {:.2} within this run", 1.0 - within));
            }
            text
        }
    }
}

/// The category whose share of samples changed most from the baseline to the run, with how many
/// run and baseline samples have it. Among equal changes, one the run gained: what the lane says
/// now reads better than what it stopped saying.
fn most_moved<K: Clone>(
    base: &[Features],
    run: &[Features],
    categories: &[K],
    has: impl Fn(&Features, &K) -> bool,
) -> Option<(K, usize, usize)> {
    let count = |group: &[Features], k: &K| group.iter().filter(|f| has(f, k)).count();
    categories
        .iter()
        .map(|k| {
            let (r, b) = (count(run, k), count(base, k));
            let change = r as f64 / run.len().max(1) as f64 - b as f64 / base.len().max(1) as f64;
            (change, k, r, b)
        })
        .max_by(|x, y| x.0.abs().total_cmp(&y.0.abs()).then(x.0.total_cmp(&y.0)))
        .map(|(_, k, r, b)| (k.clone(), r, b))
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

    const PHRASINGS: [&str; 4] = [
        "Yes. 17077 has no divisors other than 1 and itself.",
        "Yes, 17077 is prime: nothing but 1 and 17077 divides it.",
        "Yes: 17077 is a prime number.",
        "Yes, it is prime.",
    ];

    #[test]
    fn a_flipped_answer_is_named_with_its_rates_and_p_value() {
        let c = checks("    - answer: '(?i)\\b(yes|no)\\b'\n");
        let baseline: Vec<(&str, u32)> = PHRASINGS.iter().map(|p| (*p, 2)).collect();
        let run = vec!["No, 17077 is not prime."; 5];
        let finding = test_lane(
            &[PromptSamples {
                checks: &c,
                baseline,
                run,
            }],
            "t",
        );
        let prompt = &finding.prompts[0];
        assert_eq!(prompt.sizes, (8, 5));
        // All five run answers differ from all eight baseline ones: C(13,5) = 1287 labellings,
        // only the observed one is as extreme.
        assert!(prompt.p_value < 0.002, "{prompt:?}");
        assert_eq!(prompt.axes[0].axis, Axis::Answer);
        let reasons = prompt.reasons(0.01);
        assert!(
            reasons[0]
                .starts_with("answers \"no\" in 5 of 5 samples vs 0 of 8 in the baseline, p = 0.0"),
            "{reasons:?}"
        );
        assert!(finding.p_value < 0.002);
    }

    #[test]
    fn answers_drawn_from_the_baseline_s_own_spread_are_not_significant() {
        let c = Vec::new();
        let baseline: Vec<(&str, u32)> = PHRASINGS.iter().map(|p| (*p, 2)).collect();
        let run: Vec<&str> = PHRASINGS.iter().rev().copied().collect();
        let finding = test_lane(
            &[PromptSamples {
                checks: &c,
                baseline,
                run,
            }],
            "t",
        );
        assert!(finding.p_value > 0.5, "{finding:?}");
        let reasons = finding.prompts[0].reasons(0.01);
        assert_eq!(reasons.len(), 1, "{reasons:?}");
    }

    #[test]
    fn text_similarity_is_reported_against_the_baseline_s_own_spread() {
        let c = Vec::new();
        let baseline = vec![("the cat sat on the mat", 2), ("the cat sat on a mat", 2)];
        let run = vec![
            "completely different words here",
            "completely different words there",
        ];
        let finding = test_lane(
            &[PromptSamples {
                checks: &c,
                baseline,
                run,
            }],
            "t",
        );
        let text = finding.prompts[0]
            .axes
            .iter()
            .find(|a| a.axis == Axis::Text)
            .unwrap();
        // Within the baseline: pairs of the same text (2 of 6) at 1, the others at 5/6.
        assert_eq!(
            text.description,
            "similarity to the baseline 0.00 vs 0.89 within the baseline and 0.75 within this run"
        );
    }

    #[test]
    fn small_p_values_are_never_rounded_to_zero() {
        assert_eq!(format_p(0.4123), "0.41");
        assert_eq!(format_p(0.0042), "0.004");
        assert_eq!(format_p(0.0002), "0.0002");
    }
}
