//! The two-sample test behind sampled verdicts: an energy statistic per prompt, a stratified
//! permutation test for its p-value, and a combination of the prompts of a lane into one p-value.
//!
//! Nothing here knows about text: it works on distance matrices between the pooled answers of a
//! prompt (the baseline's first, then the run's), one matrix per axis plus their sum.
//!
//! Why these choices:
//! - The energy statistic `2·mean d(B,R) − mean d(B,B') − mean d(R,R')` compares how far the run's
//!   answers are from the baseline's with how far each set is from itself, using every pair, so a
//!   lane whose answers always vary is judged against its own spread.
//! - Under "nothing changed", baseline and run answers of a prompt are exchangeable, so shuffling
//!   the labels within each prompt (never across prompts) gives the statistic's null distribution
//!   whatever the distances are. The p-value `(1 + #{permuted ≥ observed}) / (1 + permutations)`
//!   is valid for any number of permutations.
//! - A provider change usually moves many prompts a little, or one prompt a lot. Fisher's
//!   combination (sum of −ln p) catches the first, Tippett's (smallest p) the second; the lane's
//!   statistic is the better of the two, calibrated by the same permutations (nonparametric
//!   combination, Pesarin 2001), so using both costs no false alarms.

/// Permutations per test: the smallest p-value a test can give is 1 / (PERMUTATIONS + 1).
pub const PERMUTATIONS: usize = 4999;

/// Relative slack when comparing statistics, so float noise does not break ties.
const TIE: f64 = 1e-9;

/// The pooled answers of one prompt: `base` baseline answers first, then `run` answers, and the
/// distances between every pair, under several measures (the first is what the test decides on;
/// the others are only reported).
#[derive(Debug, Clone)]
pub struct Stratum {
    base: usize,
    run: usize,
    measures: usize,
    /// `distances[(i * size + j) * measures + m]`: symmetric, zero on the diagonal, the measures
    /// of one pair side by side so one pass over the pairs serves them all.
    distances: Vec<f64>,
    /// Sum over unordered pairs, per measure: what is not within a side is between the sides.
    totals: Vec<f64>,
}

impl Stratum {
    /// A stratum of `base` baseline answers followed by `run` answers, whose pairwise distances
    /// under each of `measures` measures are `distance(i, j)[m]`.
    pub fn new(
        base: usize,
        run: usize,
        measures: usize,
        distance: impl Fn(usize, usize) -> Vec<f64>,
    ) -> Stratum {
        let size = base + run;
        let mut distances = vec![0.0; size * size * measures];
        let mut totals = vec![0.0; measures];
        for i in 0..size {
            for j in (i + 1)..size {
                let d = distance(i, j);
                for (m, total) in totals.iter_mut().enumerate() {
                    let value = d.get(m).copied().unwrap_or(0.0);
                    distances[(i * size + j) * measures + m] = value;
                    distances[(j * size + i) * measures + m] = value;
                    *total += value;
                }
            }
        }
        Stratum {
            base,
            run,
            measures,
            distances,
            totals,
        }
    }

    /// Baseline answers.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Run answers.
    pub fn run(&self) -> usize {
        self.run
    }

    fn size(&self) -> usize {
        self.base + self.run
    }

    /// The energy statistic of every measure when `order[..base]` are the baseline's answers,
    /// written to `out`. Only the pairs within each side are summed: the pairs between them are
    /// the rest of the total.
    fn energies(&self, order: &[usize], out: &mut [f64]) {
        let (size, measures) = (self.size(), self.measures);
        let (b, r) = order.split_at(self.base);
        let mut within_b = vec![0.0; measures];
        let mut within_r = vec![0.0; measures];
        for (group, sums) in [(b, &mut within_b), (r, &mut within_r)] {
            for (x, &i) in group.iter().enumerate() {
                for &j in &group[x + 1..] {
                    let pair = &self.distances[(i * size + j) * measures..][..measures];
                    for (sum, d) in sums.iter_mut().zip(pair) {
                        *sum += d;
                    }
                }
            }
        }
        let (nb, nr) = (self.base as f64, self.run as f64);
        for m in 0..measures {
            let cross = self.totals[m] - within_b[m] - within_r[m];
            out[m] = 2.0 * cross / (nb * nr)
                - 2.0 * within_b[m] / (nb * nb)
                - 2.0 * within_r[m] / (nr * nr);
        }
    }

    /// The energy statistic of measure `m` under `order`.
    #[cfg(test)]
    fn energy(&self, m: usize, order: &[usize]) -> f64 {
        let mut out = vec![0.0; self.measures];
        self.energies(order, &mut out);
        out[m]
    }

    /// Mean distances of measure `m`: between a baseline and a run sample, and between two
    /// samples of the baseline, and of the run (samples, not texts: two samples with the same
    /// text are at distance 0).
    pub fn means(&self, m: usize) -> Means {
        let size = self.size();
        let at = |i: usize, j: usize| self.distances[(i * size + j) * self.measures + m];
        let mean = |rows: std::ops::Range<usize>,
                    cols: &dyn Fn(usize) -> std::ops::Range<usize>| {
            let (mut sum, mut pairs) = (0.0, 0usize);
            for i in rows {
                for j in cols(i) {
                    sum += at(i, j);
                    pairs += 1;
                }
            }
            (pairs > 0).then(|| sum / pairs as f64)
        };
        Means {
            cross: mean(0..self.base, &|_| self.base..size).unwrap_or(0.0),
            within_base: mean(0..self.base, &|i| (i + 1)..self.base),
            within_run: mean(self.base..size, &|i| (i + 1)..size),
        }
    }
}

/// Mean distances within and between the two sides of a stratum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Means {
    /// Between a baseline sample and a run sample.
    pub cross: f64,
    /// Between two baseline samples (none with one sample).
    pub within_base: Option<f64>,
    /// Between two run samples (none with one sample).
    pub within_run: Option<f64>,
}

/// What the test found for one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct StratumTest {
    /// Observed energy statistic per measure.
    pub statistic: Vec<f64>,
    /// Each measure's own permutation p-value.
    pub p_values: Vec<f64>,
    /// The prompt's p-value: the smallest of its measures' p-values, judged against the smallest
    /// under every permutation (so looking at several measures costs no false alarms).
    pub p_value: f64,
}

/// What the test found for a lane.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneTest {
    /// The lane's p-value: the combination of its prompts, calibrated by permutation.
    pub p_value: f64,
    /// Each prompt's result, in the order given.
    pub strata: Vec<StratumTest>,
    /// Permutations drawn.
    pub permutations: usize,
}

/// Tests "nothing changed" for every stratum and for all of them together, with `permutations`
/// random relabellings from a generator seeded with `seed` (the same inputs give the same
/// p-values, so `canary diff` shows what `canary run` decided).
pub fn permutation_test(strata: &[Stratum], permutations: usize, seed: u64) -> LaneTest {
    let mut rng = fastrand::Rng::with_seed(seed);
    let draws = permutations + 1; // the observed labelling counts as one
    let mut results = Vec::with_capacity(strata.len());
    // Each stratum's p-value under every labelling; index 0 is the observed one.
    let mut null: Vec<Vec<f64>> = Vec::with_capacity(strata.len());
    for stratum in strata {
        let measures = stratum.measures;
        if stratum.base == 0 || stratum.run == 0 || measures == 0 {
            // Nothing to compare: no evidence either way, and no NaN to slip through.
            results.push(StratumTest {
                statistic: vec![0.0; measures],
                p_values: vec![1.0; measures],
                p_value: 1.0,
            });
            null.push(vec![1.0; draws]);
            continue;
        }
        // values[m][b]: measure m under labelling b.
        let mut values = vec![Vec::with_capacity(draws); measures];
        let mut order: Vec<usize> = (0..stratum.size()).collect();
        let mut energies = vec![0.0; measures];
        for b in 0..draws {
            if b > 0 {
                rng.shuffle(&mut order);
            }
            stratum.energies(&order, &mut energies);
            for (column, value) in values.iter_mut().zip(&energies) {
                column.push(*value);
            }
        }
        let ranks: Vec<Vec<f64>> = values.iter().map(|v| upper_tail_p_values(v)).collect();
        let smallest: Vec<f64> = (0..draws)
            .map(|b| -ranks.iter().map(|r| r[b]).fold(1.0, f64::min))
            .collect();
        let prompt = upper_tail_p_values(&smallest);
        results.push(StratumTest {
            statistic: values.iter().map(|v| v[0]).collect(),
            p_values: ranks.iter().map(|r| r[0]).collect(),
            p_value: prompt[0],
        });
        null.push(prompt);
    }
    LaneTest {
        p_value: combine(&null),
        strata: results,
        permutations,
    }
}

/// The combined p-value of strata whose p-values under every labelling are `null[s][b]`
/// (`b = 0` observed): the strata combine by Fisher and by Tippett, and the better of the two
/// is judged against its own permutation distribution.
fn combine(null: &[Vec<f64>]) -> f64 {
    let Some(draws) = null.first().map(Vec::len) else {
        return 1.0;
    };
    if draws == 0 {
        return 1.0;
    }
    let mut fisher = vec![0.0; draws];
    let mut tippett = vec![1.0f64; draws];
    for p in null {
        for b in 0..draws {
            fisher[b] -= p[b].ln();
            tippett[b] = tippett[b].min(p[b]);
        }
    }
    let fisher_p = upper_tail_p_values(&fisher);
    let negated: Vec<f64> = tippett.iter().map(|p| -p).collect();
    let tippett_p = upper_tail_p_values(&negated);
    let best: Vec<f64> = fisher_p
        .iter()
        .zip(&tippett_p)
        .map(|(f, t)| -f.min(*t))
        .collect();
    upper_tail_p_values(&best)[0]
}

/// For each value, the share of all values at least as large (its permutation p-value).
fn upper_tail_p_values(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = values.len() as f64;
    values
        .iter()
        .map(|&v| {
            let low = v - TIE * v.abs().max(1.0);
            let below = sorted.partition_point(|&x| x < low);
            (sorted.len() - below) as f64 / n
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stratum of numbers on a line, distance |x − y|.
    fn line(base: &[f64], run: &[f64]) -> Stratum {
        let all: Vec<f64> = base.iter().chain(run).copied().collect();
        Stratum::new(base.len(), run.len(), 1, |i, j| {
            vec![(all[i] - all[j]).abs()]
        })
    }

    #[test]
    fn energy_of_identical_groups_is_zero_and_of_separated_groups_positive() {
        let same = line(&[1.0, 2.0], &[1.0, 2.0]);
        let order: Vec<usize> = (0..4).collect();
        assert!(same.energy(0, &order).abs() < 1e-12);
        // Baseline {0, 0}, run {1, 1}: cross mean 1, within 0: E = 2.
        let apart = line(&[0.0, 0.0], &[1.0, 1.0]);
        assert!((apart.energy(0, &order) - 2.0).abs() < 1e-12);
        // Baseline {0, 2}, run {1}: cross mean 1, within-baseline mean (0+2+2+0)/4 = 1: E = 1.
        let inside = line(&[0.0, 2.0], &[1.0]);
        assert!((inside.energy(0, &(0..3).collect::<Vec<_>>()) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn the_p_value_of_a_complete_split_matches_the_exact_count() {
        // Three baseline answers at 0, three run answers at 1: of the C(6,3) = 20 labellings only
        // the observed one and its mirror reach the observed statistic, so p = 2/20 = 0.1.
        let stratum = line(&[0.0, 0.0, 0.0], &[1.0, 1.0, 1.0]);
        let test = permutation_test(&[stratum], 20_000, 7);
        let p = test.strata[0].p_value;
        assert!((p - 0.1).abs() < 0.01, "p = {p}");
        assert!(
            (test.p_value - p).abs() < 0.01,
            "one stratum: the lane is the prompt"
        );
    }

    #[test]
    fn a_single_answer_that_moved_has_p_one_in_k_plus_one() {
        // Baseline of four identical answers, one run answer elsewhere: the moved answer is
        // equally likely to be any of the five under the null, so p = 1/5.
        let stratum = line(&[0.0, 0.0, 0.0, 0.0], &[3.0]);
        let p = permutation_test(&[stratum], 20_000, 1).strata[0].p_value;
        assert!((p - 0.2).abs() < 0.01, "p = {p}");
    }

    #[test]
    fn answers_that_did_not_move_are_not_significant() {
        let stratum = line(&[0.0, 1.0, 2.0, 3.0, 4.0], &[0.5, 1.5, 2.5, 3.5, 4.5]);
        let test = permutation_test(&[stratum], 2_000, 3);
        assert!(test.strata[0].p_value > 0.5, "{test:?}");
        // A constant stratum never moves at all.
        let constant = line(&[1.0, 1.0], &[1.0, 1.0]);
        assert_eq!(permutation_test(&[constant], 100, 3).strata[0].p_value, 1.0);
    }

    #[test]
    fn many_prompts_moving_a_little_combine_into_a_small_lane_p_value() {
        // Ten prompts, each shifted by two thirds of its spread: no single prompt is convincing,
        // together they are.
        let strata: Vec<Stratum> = (0..10)
            .map(|_| line(&[0.0, 1.0, 2.0, 3.0], &[2.0, 3.0, 4.0, 5.0]))
            .collect();
        let test = permutation_test(&strata, 4_999, 11);
        let smallest = test.strata.iter().map(|s| s.p_value).fold(1.0, f64::min);
        assert!(
            smallest > 0.05,
            "no single prompt is significant: {smallest}"
        );
        assert!(test.p_value < 0.01, "together they are: {}", test.p_value);
    }

    #[test]
    fn one_prompt_moving_a_lot_among_quiet_ones_is_still_seen() {
        let mut strata: Vec<Stratum> = (0..12)
            .map(|_| line(&[0.0, 1.0, 2.0, 3.0, 4.0], &[0.5, 1.5, 2.5, 3.5, 4.5]))
            .collect();
        strata.push(line(
            &[0.0, 0.1, 0.2, 0.1, 0.0, 0.2, 0.1, 0.0],
            &[9.0, 9.1, 9.2, 9.1, 9.0, 9.2, 9.1, 9.0],
        ));
        let test = permutation_test(&strata, 4_999, 5);
        assert!(test.p_value < 0.01, "lane p = {}", test.p_value);
    }

    #[test]
    fn one_measure_that_moved_is_seen_among_others_that_did_not() {
        // Measure 0 separates the sides completely; measure 1 is the same spread on both sides.
        let first: [f64; 8] = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let second: [f64; 8] = [0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0];
        let stratum = Stratum::new(4, 4, 2, |i, j| {
            vec![(first[i] - first[j]).abs(), (second[i] - second[j]).abs()]
        });
        let test = permutation_test(&[stratum], 20_000, 4);
        let result = &test.strata[0];
        // C(8,4) = 70 labellings, 2 as extreme as the observed on measure 0.
        assert!((result.p_values[0] - 2.0 / 70.0).abs() < 0.01, "{result:?}");
        assert!(result.p_values[1] > 0.5, "{result:?}");
        assert!(
            result.p_value < 0.1 && result.p_value >= result.p_values[0] - 0.01,
            "the prompt's p-value pays a little for looking at two measures: {result:?}"
        );
    }

    #[test]
    fn a_stratum_with_an_empty_side_is_no_evidence() {
        let empty = line(&[0.0, 1.0, 2.0], &[]);
        let test = permutation_test(&[empty, line(&[0.0, 1.0], &[0.5])], 200, 9);
        assert_eq!(test.strata[0].p_value, 1.0);
        assert!(test.p_value > 0.1, "{test:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_p_values() {
        let strata = [line(&[0.0, 1.0, 2.0], &[1.0, 2.0, 5.0])];
        assert_eq!(
            permutation_test(&strata, 500, 42),
            permutation_test(&strata, 500, 42)
        );
    }

    #[test]
    fn the_false_alarm_rate_is_at_most_alpha_when_nothing_changed() {
        // Both groups drawn from the same distribution, many times: the share of p ≤ alpha must
        // not exceed alpha (beyond sampling error of the simulation itself).
        let mut rng = fastrand::Rng::with_seed(2026);
        let trials = 400;
        let mut alarms = 0;
        for trial in 0..trials {
            let strata: Vec<Stratum> = (0..4)
                .map(|_| {
                    let draw = |rng: &mut fastrand::Rng| (rng.u8(0..4)) as f64;
                    let base: Vec<f64> = (0..6).map(|_| draw(&mut rng)).collect();
                    let run: Vec<f64> = (0..6).map(|_| draw(&mut rng)).collect();
                    line(&base, &run)
                })
                .collect();
            if permutation_test(&strata, 199, trial).p_value <= 0.05 {
                alarms += 1;
            }
        }
        // Expected at most 20 of 400; allow three binomial standard deviations (≈ 13).
        assert!(
            alarms <= 33,
            "{alarms} alarms in {trials} trials at alpha 0.05"
        );
    }

    #[test]
    fn upper_tail_p_values_count_ties_as_at_least_as_large() {
        assert_eq!(
            upper_tail_p_values(&[2.0, 1.0, 2.0, 3.0]),
            vec![0.75, 1.0, 0.75, 0.25]
        );
    }
}
