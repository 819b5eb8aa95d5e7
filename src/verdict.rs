//! Where drift is decided.
//!
//! How a (lane, prompt) is judged depends on what its baseline's own samples show:
//! - **exact**: two or more samples, all the same answer. The lane answers this prompt
//!   deterministically, so each answer of the run is judged on its own against that answer, on
//!   several axes, each reported with its reason: text similarity, checks that stopped passing, a
//!   changed extracted answer, length far outside the baseline's, a refusal flip;
//! - **single**: one sample (or an older snapshot that kept one answer and a noise band): judged
//!   the same way, since one sample cannot show whether the lane varies;
//! - **sampled**: samples that differ. The lane's answers vary, so no single answer can be judged
//!   on its own; the run's samples and the baseline's are compared as distributions by the
//!   two-sample test of [`crate::drift`], every sampled prompt of the lane at once, with the
//!   false-alarm rate `drift.alpha`.
//!
//! Identity (model, fingerprint) is judged per lane across the whole run, because some
//! providers' fingerprints flicker answer to answer.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;

use crate::checks::{evaluate_all, extract_answer, is_refusal, normalize_whitespace};
use crate::drift::{PromptFinding, format_p};
use crate::prompts::Prompt;
use crate::snapshot::{Answer, Noise};

pub use crate::drift::axes::similarity;

/// Length ratios inside this band are never drift on their own.
pub const DEFAULT_LENGTH_BAND: [f64; 2] = [0.5, 2.0];
/// Length changes smaller than this many characters are never drift (short answers are noisy).
const LENGTH_SLACK_CHARS: usize = 16;

/// The verdict of a (lane, prompt) in a run, or of a lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The same text as the baseline.
    Unchanged,
    /// Different text, every axis inside the baseline's tolerance.
    WithinNoise,
    /// Outside tolerance on at least one axis.
    Drifted,
    /// No baseline yet.
    New,
    /// The prompt changed since its baseline was accepted.
    Stale,
    /// The lane gave no answer.
    Failed,
}

impl Verdict {
    /// Every verdict, in table order.
    pub const ALL: [Verdict; 6] = [
        Verdict::Unchanged,
        Verdict::WithinNoise,
        Verdict::Drifted,
        Verdict::New,
        Verdict::Stale,
        Verdict::Failed,
    ];

    /// The contract's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Unchanged => "unchanged",
            Verdict::WithinNoise => "within_noise",
            Verdict::Drifted => "drifted",
            Verdict::New => "new",
            Verdict::Stale => "stale",
            Verdict::Failed => "failed",
        }
    }

    /// Parses a stored name.
    pub fn parse(name: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.as_str() == name)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a (lane, prompt) is judged, decided by its baseline's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Two or more samples, all the same answer: each run answer is judged on its own.
    Exact,
    /// Samples that differ: the run's samples are tested against the baseline's.
    Sampled,
    /// One sample: each run answer is judged on its own, as for an exact baseline.
    Single,
}

impl Mode {
    /// The name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exact => "exact",
            Mode::Sampled => "sampled",
            Mode::Single => "single",
        }
    }
}

/// How answers are judged against a baseline of these answers (and, for an older snapshot that
/// kept one answer, its noise band).
pub fn mode_of(answers: &[Answer], noise: Option<&Noise>) -> Mode {
    let samples: u32 = answers.iter().map(|a| a.count).sum();
    if let Some(noise) = noise {
        // An older snapshot: one answer kept; its band says whether the samples agreed.
        return if samples >= 2 && noise.similarity_floor >= 1.0 {
            Mode::Exact
        } else {
            Mode::Single
        };
    }
    if samples < 2 {
        return Mode::Single;
    }
    let first = answers
        .first()
        .map(|a| normalize_whitespace(&a.text))
        .unwrap_or_default();
    if answers
        .iter()
        .all(|a| normalize_whitespace(&a.text) == first)
    {
        Mode::Exact
    } else {
        Mode::Sampled
    }
}

/// What a lane's verdict is judged against: a baseline's answers and identity.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    /// Its distinct answers, most frequent first, with how many samples gave each.
    pub answers: Vec<Answer>,
    /// Prompt hash it was made from.
    pub prompt_hash: String,
    /// Model reported then.
    pub model: Option<String>,
    /// Fingerprint reported then.
    pub fingerprint: Option<String>,
    /// The noise band of an older snapshot that kept only its first answer of several samples.
    pub noise: Option<Noise>,
    /// Where it came from, for people (`snapshots/free/x.snap (run 4)`, `run 9`).
    pub origin: String,
}

impl Baseline {
    /// The most frequent answer.
    pub fn primary(&self) -> &str {
        self.answers.first().map_or("", |a| a.text.as_str())
    }

    /// Samples behind it.
    pub fn samples(&self) -> u32 {
        self.answers.iter().map(|a| a.count).sum()
    }

    /// How answers are judged against it.
    pub fn mode(&self) -> Mode {
        mode_of(&self.answers, self.noise.as_ref())
    }

    /// The baseline answer closest to `output`, and its similarity.
    pub fn closest(&self, output: &str) -> (&Answer, f64) {
        let mut best: Option<(&Answer, f64)> = None;
        for answer in &self.answers {
            let sim = similarity(&answer.text, output);
            if best.is_none_or(|(_, s)| sim > s) {
                best = Some((answer, sim));
            }
        }
        best.unwrap_or((&self.answers[0], 0.0))
    }
}

/// One answer of the run to judge.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Output text, when the lane answered.
    pub output: Option<String>,
    /// Model reported.
    pub model: Option<String>,
    /// Fingerprint reported.
    pub fingerprint: Option<String>,
    /// Why there is no output (`timeout: ...`).
    pub error: Option<String>,
}

/// The judgement of one (lane, prompt).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ItemJudgement {
    /// Prompt id.
    pub id: String,
    /// Verdict.
    pub verdict: Verdict,
    /// Lowest similarity of a sample to its closest baseline answer.
    pub similarity: Option<f64>,
    /// Why, one reason per axis that moved (or why it could not be judged).
    pub reasons: Vec<String>,
    /// Drifted on the control lane too: for review, not an alert.
    pub review: bool,
    /// Answers received / samples sent.
    pub samples: usize,
    /// Samples that answered.
    pub answered: usize,
    /// How it was judged (absent for new, stale and failed items).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Samples behind the baseline it was judged against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_samples: Option<u32>,
    /// The two-sample test's p-value, for sampled items.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p_value: Option<f64>,
    /// The energy distance between the run's samples and the baseline's (all axes), for sampled
    /// items: 0 when they are spread alike, larger the further apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statistic: Option<f64>,
}

/// Settings that shape the judgement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    /// Default similarity threshold.
    pub threshold: f64,
    /// Drifted prompts (exact or single) that make a lane drifted.
    pub min_drifted: MinDrifted,
    /// False-alarm rate of the two-sample test of a lane's sampled prompts.
    pub alpha: f64,
}

/// How many drifted prompts make a lane drifted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MinDrifted {
    /// At least this many.
    Count(u32),
    /// At least this fraction of the judged prompts (0..=1).
    Fraction(f64),
}

impl MinDrifted {
    fn reached(self, drifted: usize, judged: usize) -> bool {
        match self {
            MinDrifted::Count(n) => drifted >= n.max(1) as usize,
            MinDrifted::Fraction(f) => drifted > 0 && drifted as f64 >= f * judged as f64,
        }
    }
}

/// Judges the samples of one (lane, prompt) against its baseline.
///
/// Exact and single baselines are decided here. A sampled item comes back `unchanged` or
/// `within_noise` with its mode set: its verdict is the lane test's, applied by [`apply_test`].
pub fn judge_item(
    prompt: &Prompt,
    rules: &Rules,
    baseline: Option<&Baseline>,
    samples: &[Sample],
) -> ItemJudgement {
    let answered: Vec<&str> = samples.iter().filter_map(|s| s.output.as_deref()).collect();
    let mut judgement = ItemJudgement {
        id: prompt.id.clone(),
        verdict: Verdict::Failed,
        similarity: None,
        reasons: Vec::new(),
        review: false,
        samples: samples.len(),
        answered: answered.len(),
        mode: None,
        baseline_samples: None,
        p_value: None,
        statistic: None,
    };
    if answered.is_empty() {
        let mut errors: Vec<String> = samples.iter().filter_map(|s| s.error.clone()).collect();
        errors.dedup();
        judgement.reasons = if errors.is_empty() {
            vec!["no answer".into()]
        } else {
            errors
        };
        return judgement;
    }
    let Some(baseline) = baseline else {
        judgement.verdict = Verdict::New;
        judgement
            .reasons
            .push("no baseline yet: review and accept it".into());
        return judgement;
    };
    if baseline.prompt_hash != prompt.hash {
        judgement.verdict = Verdict::Stale;
        judgement.reasons.push(format!(
            "the prompt changed since its baseline ({}) was accepted: re-accept it",
            baseline.origin
        ));
        return judgement;
    }
    let mode = baseline.mode();
    judgement.mode = Some(mode);
    judgement.baseline_samples = Some(baseline.samples());
    let known: Vec<String> = baseline
        .answers
        .iter()
        .map(|a| normalize_whitespace(&a.text))
        .collect();
    let identical = answered
        .iter()
        .filter(|o| known.contains(&normalize_whitespace(o)))
        .count();
    let lowest = answered
        .iter()
        .map(|o| baseline.closest(o).1)
        .fold(1.0, f64::min);
    judgement.similarity = Some(round3(lowest));
    let failed = samples.len() - answered.len();
    let mut reasons: Vec<String> = Vec::new();
    if mode == Mode::Sampled {
        judgement.verdict = if identical == answered.len() {
            Verdict::Unchanged
        } else {
            Verdict::WithinNoise
        };
        if failed > 0 {
            reasons.push(format!(
                "{failed} of {} samples gave no answer",
                samples.len()
            ));
        }
        judgement.reasons = reasons;
        return judgement;
    }

    let threshold = prompt.threshold.unwrap_or(rules.threshold);
    let noise = baseline
        .noise
        .clone()
        .unwrap_or_else(|| noise_band(prompt, &[baseline.primary()]));
    let mut drifted = 0;
    for output in &answered {
        let sample_reasons = judge_sample(prompt, threshold, baseline.primary(), &noise, output);
        if !sample_reasons.is_empty() {
            drifted += 1;
            for reason in sample_reasons {
                if !reasons.contains(&reason) {
                    reasons.push(reason);
                }
            }
        }
    }
    if failed > 0 {
        reasons.push(format!(
            "{failed} of {} samples gave no answer",
            samples.len()
        ));
    }
    // Most samples must agree before an item is called drifted: one odd sample is noise.
    judgement.verdict = if drifted * 2 > answered.len() {
        Verdict::Drifted
    } else if identical == answered.len() {
        Verdict::Unchanged
    } else {
        Verdict::WithinNoise
    };
    if judgement.verdict != Verdict::Drifted && drifted > 0 {
        reasons.insert(
            0,
            format!(
                "{drifted} of {} samples outside tolerance (not a majority)",
                answered.len()
            ),
        );
        if mode == Mode::Exact && identical > 0 {
            reasons.push(format!(
                "the lane gave its baseline's answer in {identical} of {} samples and others besides: it does not answer this prompt exactly; accept this run to judge it by its samples",
                answered.len()
            ));
        }
    }
    judgement.reasons = reasons;
    judgement
}

/// What the lane's two-sample test says of one of its sampled items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneCall {
    /// The lane's test did not reject: its sampled answers are within noise.
    Quiet,
    /// The lane's test rejected, and this item is one that moved: its own p-value is at most
    /// alpha, or it is the lane's most significant item when none is (the lane moved a little
    /// on many prompts, and the one that moved most is what to look at).
    Moved,
    /// The lane's test rejected; this item is not one that stands out.
    MovedElsewhere,
}

/// Applies the lane's two-sample test to a sampled item: drifted when `call` is
/// [`LaneCall::Moved`]; the reasons give its own numbers either way.
pub fn apply_test(
    judgement: &mut ItemJudgement,
    finding: &PromptFinding,
    call: LaneCall,
    alpha: f64,
) {
    judgement.p_value = Some(finding.p_value);
    judgement.statistic = Some((finding.statistic * 10_000.0).round() / 10_000.0);
    let (base, run) = finding.sizes;
    let summary = format!(
        "{run} samples against the baseline's {base}: energy distance {:.3}, p = {}",
        finding.statistic,
        format_p(finding.p_value)
    );
    let mut reasons = Vec::new();
    match call {
        LaneCall::Moved => {
            judgement.verdict = Verdict::Drifted;
            reasons.extend(finding.reasons(alpha));
            reasons.push(summary);
        }
        LaneCall::MovedElsewhere => {
            reasons.push(format!(
                "{summary}: not significant on its own, though the lane's sampled answers moved"
            ));
            reasons.extend(finding.reasons(alpha));
        }
        LaneCall::Quiet => {
            reasons.push(if finding.p_value <= alpha {
                format!("{summary} on its own, but the lane's test over all its sampled prompts is above alpha {alpha}: not drift")
            } else {
                format!("{summary}, within the spread of the baseline's own samples")
            });
            if judgement.verdict == Verdict::WithinNoise {
                reasons.extend(finding.reasons(alpha));
            }
        }
    }
    reasons.append(&mut judgement.reasons);
    judgement.reasons = reasons;
}

/// Judges one output against an exact or single baseline's answer; returns the reasons it is
/// outside tolerance.
fn judge_sample(
    prompt: &Prompt,
    threshold: f64,
    baseline: &str,
    noise: &Noise,
    output: &str,
) -> Vec<String> {
    let mut reasons = Vec::new();
    let sim = similarity(baseline, output);
    let floor = threshold.min(noise.similarity_floor);
    if sim < floor {
        reasons.push(if noise.similarity_floor < threshold {
            format!("similarity {sim:.2} below the baseline's noise floor {floor:.2}")
        } else {
            format!("similarity {sim:.2} below the threshold {threshold:.2}")
        });
    }

    let before = evaluate_all(&prompt.checks, baseline);
    let after = evaluate_all(&prompt.checks, output);
    for (was, now) in before.iter().zip(&after) {
        if was.passed && !now.passed && !noise.flaky_checks.contains(&was.name) {
            reasons.push(format!(
                "check `{}` passed on the baseline and fails now",
                was.name
            ));
        }
    }

    if let Some(found) = extract_answer(&prompt.checks, output) {
        let known: Vec<String> = if noise.answers.is_empty() {
            extract_answer(&prompt.checks, baseline)
                .flatten()
                .into_iter()
                .collect()
        } else {
            noise.answers.clone()
        };
        if !known.is_empty() {
            match found {
                Some(answer) if !known.contains(&answer) => {
                    reasons.push(format!("answer changed: {} → {answer}", known.join(" / ")));
                }
                None => reasons.push(format!("no answer found (baseline: {})", known.join(" / "))),
                Some(_) => {}
            }
        }
    }

    let (old_len, new_len) = (baseline.chars().count(), output.chars().count());
    let ratio = new_len as f64 / old_len.max(1) as f64;
    let band = [
        DEFAULT_LENGTH_BAND[0].min(noise.length_ratio[0] * 0.8),
        DEFAULT_LENGTH_BAND[1].max(noise.length_ratio[1] * 1.25),
    ];
    if (ratio < band[0] || ratio > band[1]) && old_len.abs_diff(new_len) > LENGTH_SLACK_CHARS {
        reasons.push(format!(
            "length {new_len} chars is {ratio:.2}× the baseline's {old_len} (tolerated {:.2}–{:.2}×)",
            band[0], band[1]
        ));
    }

    let baseline_refused = noise.refusal.unwrap_or_else(|| is_refusal(baseline));
    if noise.refusal.is_some() || noise.similarity_floor >= 1.0 {
        match (baseline_refused, is_refusal(output)) {
            (false, true) => reasons.push("declines where the baseline answered".into()),
            (true, false) => reasons.push("answers where the baseline declined".into()),
            _ => {}
        }
    }
    reasons
}

/// The noise band of a set of accepted samples (the first is the primary).
pub fn noise_band(prompt: &Prompt, samples: &[&str]) -> Noise {
    let Some(primary) = samples.first() else {
        return Noise::default();
    };
    let primary_len = primary.chars().count().max(1) as f64;
    let mut noise = Noise::default();
    let mut refusals = Vec::new();
    let primary_checks = evaluate_all(&prompt.checks, primary);
    for sample in samples {
        noise.similarity_floor = noise
            .similarity_floor
            .min(round3(similarity(primary, sample)));
        let ratio = round3(sample.chars().count() as f64 / primary_len);
        noise.length_ratio = [
            noise.length_ratio[0].min(ratio),
            noise.length_ratio[1].max(ratio),
        ];
        if let Some(Some(answer)) = extract_answer(&prompt.checks, sample)
            && !noise.answers.contains(&answer)
        {
            noise.answers.push(answer);
        }
        refusals.push(is_refusal(sample));
        for (was, now) in primary_checks
            .iter()
            .zip(evaluate_all(&prompt.checks, sample))
        {
            if was.passed != now.passed && !noise.flaky_checks.contains(&was.name) {
                noise.flaky_checks.push(was.name.clone());
            }
        }
    }
    noise.refusal = if refusals.iter().all(|r| *r == refusals[0]) {
        Some(refusals[0])
    } else {
        None
    };
    noise
}

/// What a baseline and one answer of the run say about who answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Identity<'a> {
    /// Model recorded in the baseline.
    pub baseline_model: Option<&'a str>,
    /// Model the answer reports.
    pub model: Option<&'a str>,
    /// Fingerprint recorded in the baseline.
    pub baseline_fingerprint: Option<&'a str>,
    /// Fingerprint the answer reports.
    pub fingerprint: Option<&'a str>,
}

/// Whether a lane's identity moved: the model (or fingerprint) most of its answers report differs
/// from the one most of its baselines recorded. Returns the reasons.
pub fn identity_changes(pairs: &[Identity<'_>]) -> Vec<String> {
    let mut reasons = Vec::new();
    let models: Vec<(&str, &str)> = pairs
        .iter()
        .filter_map(|p| Some((p.baseline_model?, p.model?)))
        .collect();
    if let Some(reason) = majority_change("model", &models) {
        reasons.push(reason);
    }
    let fingerprints: Vec<(&str, &str)> = pairs
        .iter()
        .filter_map(|p| Some((p.baseline_fingerprint?, p.fingerprint?)))
        .collect();
    if let Some(reason) = majority_change("system_fingerprint", &fingerprints) {
        reasons.push(reason);
    }
    reasons
}

fn majority_change(what: &str, pairs: &[(&str, &str)]) -> Option<String> {
    let changed: Vec<&(&str, &str)> = pairs.iter().filter(|(was, now)| was != now).collect();
    if pairs.is_empty() || changed.len() * 2 <= pairs.len() {
        return None;
    }
    let before = most_common(changed.iter().map(|(was, _)| *was));
    let after = most_common(changed.iter().map(|(_, now)| *now));
    Some(format!(
        "{what} changed on {} of {} answers: {before} → {after}",
        changed.len(),
        pairs.len()
    ))
}

fn most_common<'a>(values: impl Iterator<Item = &'a str>) -> &'a str {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for value in values {
        *counts.entry(value).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
        .map_or("", |(value, _)| value)
}

/// A lane's two-sample test over its sampled prompts, as the lane verdict needs it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LaneTest {
    /// The lane's p-value.
    pub p_value: f64,
    /// Sampled prompts it covered.
    pub prompts: usize,
    /// The false-alarm rate it was judged at.
    pub alpha: f64,
}

impl LaneTest {
    /// Whether the lane's answers moved: p at most alpha.
    pub fn rejected(&self) -> bool {
        self.p_value <= self.alpha
    }
}

/// The verdict of a whole lane from its items, identity reasons and the test of its sampled
/// prompts.
pub fn judge_lane(
    items: &[ItemJudgement],
    identity: &[String],
    test: Option<&LaneTest>,
    rules: &Rules,
) -> (Verdict, Vec<String>) {
    let mut counts: BTreeMap<Verdict, usize> = BTreeMap::new();
    for item in items {
        *counts.entry(item.verdict).or_default() += 1;
    }
    let count = |v: Verdict| counts.get(&v).copied().unwrap_or(0);
    let drifted = |i: &&ItemJudgement| i.verdict == Verdict::Drifted && !i.review;
    let alerting = items.iter().filter(drifted).count();
    // Sampled prompts are decided together by the test, not counted one by one.
    let decided_alone = items
        .iter()
        .filter(drifted)
        .filter(|i| i.mode != Some(Mode::Sampled))
        .count();
    let review = items
        .iter()
        .filter(|i| i.verdict == Verdict::Drifted && i.review)
        .count();
    let is_judged = |i: &&ItemJudgement| {
        matches!(
            i.verdict,
            Verdict::Unchanged | Verdict::WithinNoise | Verdict::Drifted
        )
    };
    let judged = items.iter().filter(is_judged).count();
    let judged_alone = items
        .iter()
        .filter(is_judged)
        .filter(|i| i.mode != Some(Mode::Sampled))
        .count();
    let mut reasons: Vec<String> = identity.to_vec();
    if alerting > 0 {
        reasons.push(format!("{alerting} of {judged} judged prompts drifted"));
    }
    if let Some(test) = test {
        reasons.push(if test.rejected() {
            format!(
                "the answers of its {} sampled prompts moved: p = {} ≤ alpha {}",
                test.prompts,
                format_p(test.p_value),
                test.alpha
            )
        } else {
            format!(
                "its {} sampled prompts are within noise: p = {} (alpha {})",
                test.prompts,
                format_p(test.p_value),
                test.alpha
            )
        });
    }
    if review > 0 {
        reasons.push(format!(
            "{review} prompts drifted on the control lane too: for review, not an alert"
        ));
    }
    if count(Verdict::Failed) > 0 {
        reasons.push(format!("{} prompts got no answer", count(Verdict::Failed)));
    }
    let sampled_moved = test.is_some_and(LaneTest::rejected);
    let verdict = if !identity.is_empty()
        || rules.min_drifted.reached(decided_alone, judged_alone)
        || sampled_moved
    {
        Verdict::Drifted
    } else if count(Verdict::Failed) > 0 {
        Verdict::Failed
    } else if count(Verdict::Stale) > 0 {
        Verdict::Stale
    } else if count(Verdict::New) > 0 {
        Verdict::New
    } else if count(Verdict::Unchanged) == items.len() {
        Verdict::Unchanged
    } else {
        Verdict::WithinNoise
    };
    if verdict != Verdict::Drifted && decided_alone > 0 {
        reasons.push("below the lane's drift rule (drift.min_drifted)".into());
    }
    (verdict, reasons)
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompts::parse_file;
    use std::path::Path;

    fn prompt(yaml_checks: &str) -> Prompt {
        let text = format!("- id: p\n  prompt: Is 17077 prime?\n{yaml_checks}");
        parse_file(Path::new("p.yaml"), &text).unwrap().remove(0)
    }

    fn rules() -> Rules {
        Rules {
            threshold: 0.85,
            min_drifted: MinDrifted::Count(1),
            alpha: 0.01,
        }
    }

    fn baseline(prompt: &Prompt, text: &str) -> Baseline {
        baseline_of(prompt, &[text])
    }

    fn baseline_of(prompt: &Prompt, texts: &[&str]) -> Baseline {
        Baseline {
            answers: crate::snapshot::distinct_answers(texts.iter().copied()),
            prompt_hash: prompt.hash.clone(),
            model: Some("m".into()),
            fingerprint: None,
            noise: None,
            origin: "test".into(),
        }
    }

    fn served(text: &str) -> Sample {
        Sample {
            output: Some(text.into()),
            model: Some("m".into()),
            fingerprint: None,
            error: None,
        }
    }

    #[test]
    fn the_same_text_is_unchanged_and_whitespace_does_not_count() {
        let p = prompt("");
        let b = baseline(&p, "Yes, 17077 is a prime number.");
        let j = judge_item(
            &p,
            &rules(),
            Some(&b),
            &[served("Yes,  17077 is a prime\nnumber. ")],
        );
        assert_eq!(j.verdict, Verdict::Unchanged);
        assert_eq!(j.similarity, Some(1.0));
    }

    #[test]
    fn small_rewording_is_within_noise_and_large_rewording_drifts() {
        let p = prompt("");
        let base = "The quick brown fox jumps over the lazy dog near the quiet river bank today.";
        let b = baseline(&p, base);
        let close = judge_item(
            &p,
            &rules(),
            Some(&b),
            &[served(
                "The quick brown fox jumps over the lazy dog near the quiet river bank.",
            )],
        );
        assert_eq!(close.verdict, Verdict::WithinNoise, "{close:?}");
        let far = judge_item(
            &p,
            &rules(),
            Some(&b),
            &[served("A slow red cat sleeps under a busy table in town.")],
        );
        assert_eq!(far.verdict, Verdict::Drifted);
        assert!(
            far.reasons[0].starts_with("similarity"),
            "{:?}",
            far.reasons
        );
    }

    #[test]
    fn a_changed_answer_is_drift_even_when_the_text_is_close() {
        let p = prompt("  checks:\n    - answer: '(?i)\\b(yes|no)\\b'\n");
        let b = baseline(&p, "Yes, 17077 is a prime number.");
        let j = judge_item(
            &p,
            &rules(),
            Some(&b),
            &[served("No, 17077 is a prime number.")],
        );
        assert_eq!(j.verdict, Verdict::Drifted);
        assert!(
            j.reasons.iter().any(|r| r == "answer changed: yes → no"),
            "{:?}",
            j.reasons
        );
    }

    #[test]
    fn a_check_that_stops_passing_is_drift() {
        let p = prompt("  threshold: 0.1\n  checks:\n    - json: true\n");
        let b = baseline(&p, "{\"prime\": true}");
        let j = judge_item(
            &p,
            &rules(),
            Some(&b),
            &[served("{\"prime\": true} (I think)")],
        );
        assert_eq!(j.verdict, Verdict::Drifted);
        assert!(
            j.reasons.iter().any(|r| r.contains("json: true")),
            "{:?}",
            j.reasons
        );
    }

    #[test]
    fn a_refusal_flip_and_a_length_blowup_are_drift() {
        let p = prompt("  threshold: 0.0\n");
        let b = baseline(
            &p,
            "Here is a short recipe for bread: flour, water, salt, yeast.",
        );
        let refused = judge_item(
            &p,
            &rules(),
            Some(&b),
            &[served("I'm sorry, but I can't help with that.")],
        );
        assert!(
            refused.reasons.iter().any(|r| r.contains("declines")),
            "{:?}",
            refused.reasons
        );
        let long = "Here is a recipe. ".repeat(40);
        let j = judge_item(&p, &rules(), Some(&b), &[served(&long)]);
        assert!(
            j.reasons.iter().any(|r| r.starts_with("length")),
            "{:?}",
            j.reasons
        );
    }

    #[test]
    fn outputs_inside_the_baselines_noise_band_are_not_drift() {
        let p = prompt("");
        let samples = [
            "The sea is blue because water absorbs red light.",
            "Water absorbs red light, so the sea looks blue to us.",
            "The ocean appears blue since water soaks up the red part of sunlight.",
        ];
        let noise = noise_band(&p, &samples);
        assert!(noise.similarity_floor < 0.85, "{noise:?}");
        // An older snapshot: the first answer and the band of all three.
        let b = Baseline {
            noise: Some(noise),
            ..baseline(&p, samples[0])
        };
        assert_eq!(b.mode(), Mode::Single);
        let j = judge_item(
            &p,
            &rules(),
            Some(&b),
            &[served("Because water absorbs red light, the sea is blue.")],
        );
        assert_eq!(j.verdict, Verdict::WithinNoise, "{j:?}");
    }

    #[test]
    fn new_stale_and_failed() {
        let p = prompt("");
        assert_eq!(
            judge_item(&p, &rules(), None, &[served("x")]).verdict,
            Verdict::New
        );
        let mut old = baseline(&p, "x");
        old.prompt_hash = "old".into();
        assert_eq!(
            judge_item(&p, &rules(), Some(&old), &[served("x")]).verdict,
            Verdict::Stale
        );
        let none = Sample {
            output: None,
            model: None,
            fingerprint: None,
            error: Some("timeout".into()),
        };
        let failed = judge_item(&p, &rules(), Some(&baseline(&p, "x")), &[none]);
        assert_eq!(failed.verdict, Verdict::Failed);
        assert_eq!(failed.reasons, ["timeout"]);
    }

    #[test]
    fn identity_is_judged_across_the_run_not_on_one_answer() {
        let seen = |model: &'static str, fingerprint: Option<&'static str>| Identity {
            baseline_model: Some("m"),
            model: Some(model),
            baseline_fingerprint: fingerprint.map(|_| "fp1"),
            fingerprint,
        };
        let one_flicker = [
            seen("m", Some("fp2")),
            seen("m", Some("fp1")),
            seen("m", Some("fp1")),
        ];
        assert!(identity_changes(&one_flicker).is_empty());
        let swapped = [seen("m2", None), seen("m2", None), seen("m", None)];
        assert_eq!(
            identity_changes(&swapped),
            ["model changed on 2 of 3 answers: m → m2"]
        );
    }

    #[test]
    fn the_lane_rule_counts_drifted_prompts_except_those_for_review() {
        let item = |verdict, review| ItemJudgement {
            id: "x".into(),
            verdict,
            similarity: None,
            reasons: vec![],
            review,
            samples: 1,
            answered: 1,
            mode: Some(Mode::Exact),
            baseline_samples: Some(2),
            p_value: None,
            statistic: None,
        };
        let two = Rules {
            min_drifted: MinDrifted::Count(2),
            ..rules()
        };
        let items = [
            item(Verdict::Drifted, false),
            item(Verdict::Unchanged, false),
        ];
        assert_eq!(judge_lane(&items, &[], None, &rules()).0, Verdict::Drifted);
        assert_eq!(judge_lane(&items, &[], None, &two).0, Verdict::WithinNoise);
        let reviewed = [
            item(Verdict::Drifted, true),
            item(Verdict::Unchanged, false),
        ];
        assert_eq!(
            judge_lane(&reviewed, &[], None, &rules()).0,
            Verdict::WithinNoise
        );
        let failed = [
            item(Verdict::Failed, false),
            item(Verdict::Unchanged, false),
        ];
        assert_eq!(judge_lane(&failed, &[], None, &rules()).0, Verdict::Failed);
        assert_eq!(
            judge_lane(
                &[item(Verdict::Unchanged, false)],
                &["model changed".into()],
                None,
                &rules()
            )
            .0,
            Verdict::Drifted
        );
    }

    #[test]
    fn the_baseline_s_own_samples_decide_how_it_is_judged() {
        let p = prompt("");
        assert_eq!(baseline_of(&p, &["a"]).mode(), Mode::Single);
        assert_eq!(baseline_of(&p, &["a b", "a  b", "a b"]).mode(), Mode::Exact);
        assert_eq!(baseline_of(&p, &["a", "b"]).mode(), Mode::Sampled);
        let older = Baseline {
            answers: vec![Answer {
                text: "a".into(),
                count: 5,
            }],
            noise: Some(Noise::default()),
            ..baseline(&p, "a")
        };
        assert_eq!(older.mode(), Mode::Exact, "five samples, all alike");
    }

    #[test]
    fn against_an_exact_baseline_a_changed_answer_is_drift_at_once() {
        let p = prompt("  checks:\n    - answer: '(?i)\\b(yes|no)\\b'\n");
        let exact = baseline_of(&p, &["Yes."; 10]);
        let j = judge_item(&p, &rules(), Some(&exact), &[served("No.")]);
        assert_eq!(j.verdict, Verdict::Drifted);
        assert_eq!(j.mode, Some(Mode::Exact));
        assert_eq!(j.baseline_samples, Some(10));
        assert!(
            j.reasons.contains(&"answer changed: yes → no".to_string()),
            "{j:?}"
        );
    }

    #[test]
    fn an_exact_baseline_that_the_lane_does_not_keep_is_named_not_alarmed() {
        let p = prompt("  checks:\n    - answer: '(?i)\\b(yes|no)\\b'\n");
        let exact = baseline_of(&p, &["Yes."; 10]);
        let mut samples = vec![served("No.")];
        samples.extend((0..9).map(|_| served("Yes.")));
        let j = judge_item(&p, &rules(), Some(&exact), &samples);
        assert_eq!(j.verdict, Verdict::WithinNoise, "{j:?}");
        assert!(
            j.reasons
                .iter()
                .any(|r| r.contains("does not answer this prompt exactly")),
            "{j:?}"
        );
    }

    #[test]
    fn a_sampled_item_waits_for_the_lane_test_and_takes_its_verdict() {
        let p = prompt("");
        let sampled = baseline_of(&p, &["one answer", "another answer", "one answer"]);
        let mut j = judge_item(
            &p,
            &rules(),
            Some(&sampled),
            &[served("one answer"), served("one reply")],
        );
        assert_eq!(
            (j.verdict, j.mode),
            (Verdict::WithinNoise, Some(Mode::Sampled))
        );
        assert_eq!(
            j.similarity,
            Some(0.5),
            "the closest baseline answer counts"
        );
        let finding = PromptFinding {
            p_value: 0.004,
            statistic: 0.3,
            axes: vec![crate::drift::AxisFinding {
                axis: crate::drift::axes::Axis::Text,
                p_value: 0.004,
                description: "similarity to the baseline 0.21 vs 0.47 within the baseline".into(),
            }],
            sizes: (3, 2),
        };
        let mut quiet = j.clone();
        apply_test(&mut quiet, &finding, LaneCall::Quiet, 0.01);
        assert_eq!(quiet.verdict, Verdict::WithinNoise);
        assert!(
            quiet.reasons[0].contains("on its own, but the lane's test"),
            "{quiet:?}"
        );
        let mut elsewhere = j.clone();
        apply_test(&mut elsewhere, &finding, LaneCall::MovedElsewhere, 0.01);
        assert_eq!(elsewhere.verdict, Verdict::WithinNoise);
        assert!(
            elsewhere.reasons[0]
                .ends_with("not significant on its own, though the lane's sampled answers moved"),
            "{elsewhere:?}"
        );
        apply_test(&mut j, &finding, LaneCall::Moved, 0.01);
        assert_eq!(j.verdict, Verdict::Drifted);
        assert_eq!(j.p_value, Some(0.004));
        assert_eq!(
            j.reasons,
            [
                "similarity to the baseline 0.21 vs 0.47 within the baseline, p = 0.004",
                "2 samples against the baseline's 3: energy distance 0.300, p = 0.004"
            ]
        );
    }

    #[test]
    fn a_percentage_rule_counts_only_the_prompts_judged_one_by_one() {
        let item = |verdict, mode| ItemJudgement {
            id: "x".into(),
            verdict,
            similarity: None,
            reasons: vec![],
            review: false,
            samples: 1,
            answered: 1,
            mode: Some(mode),
            baseline_samples: Some(10),
            p_value: None,
            statistic: None,
        };
        let quarter = Rules {
            min_drifted: MinDrifted::Fraction(0.25),
            ..rules()
        };
        let mut items = vec![item(Verdict::Drifted, Mode::Exact)];
        items.extend((0..3).map(|_| item(Verdict::Unchanged, Mode::Exact)));
        items.extend((0..4).map(|_| item(Verdict::WithinNoise, Mode::Sampled)));
        assert_eq!(judge_lane(&items, &[], None, &quarter).0, Verdict::Drifted);
    }

    #[test]
    fn a_lane_drifts_when_its_sampled_test_rejects_and_says_so_either_way() {
        let item = ItemJudgement {
            id: "x".into(),
            verdict: Verdict::WithinNoise,
            similarity: None,
            reasons: vec![],
            review: false,
            samples: 5,
            answered: 5,
            mode: Some(Mode::Sampled),
            baseline_samples: Some(5),
            p_value: Some(0.03),
            statistic: Some(0.1),
        };
        let moved = LaneTest {
            p_value: 0.004,
            prompts: 3,
            alpha: 0.01,
        };
        let (verdict, reasons) =
            judge_lane(std::slice::from_ref(&item), &[], Some(&moved), &rules());
        assert_eq!(verdict, Verdict::Drifted);
        assert_eq!(
            reasons,
            ["the answers of its 3 sampled prompts moved: p = 0.004 ≤ alpha 0.01"]
        );
        let quiet = LaneTest {
            p_value: 0.2,
            ..moved
        };
        let (verdict, reasons) = judge_lane(&[item], &[], Some(&quiet), &rules());
        assert_eq!(verdict, Verdict::WithinNoise);
        assert_eq!(
            reasons,
            ["its 3 sampled prompts are within noise: p = 0.20 (alpha 0.01)"]
        );
    }
}
