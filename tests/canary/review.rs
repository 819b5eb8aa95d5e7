//! The review loop, driven key by key as a person at a terminal would.

use console::Key;

use canary::cmd::review::{Decision, review_loop};
use canary::judge::JudgedItem;
use canary::snapshot::distinct_answers;
use canary::verdict::{Baseline, ItemJudgement, Mode, Sample, Verdict};

fn item(id: &str, baseline: Option<&str>, output: &str) -> JudgedItem {
    JudgedItem {
        judgement: ItemJudgement {
            id: id.into(),
            verdict: if baseline.is_some() {
                Verdict::Drifted
            } else {
                Verdict::New
            },
            similarity: baseline.map(|_| 0.4),
            reasons: vec!["similarity 0.40 below the threshold 0.85".into()],
            review: false,
            samples: 1,
            answered: 1,
            mode: baseline.map(|_| Mode::Exact),
            baseline_samples: baseline.map(|_| 10),
            p_value: None,
            statistic: None,
        },
        baseline: baseline.map(|text| Baseline {
            answers: distinct_answers(std::iter::repeat_n(text, 10)),
            prompt_hash: "h".into(),
            model: Some("m".into()),
            fingerprint: None,
            noise: None,
            origin: "snapshots/free/x.snap".into(),
        }),
        samples: vec![Sample {
            output: Some(output.into()),
            model: Some("m".into()),
            fingerprint: None,
            error: None,
        }],
    }
}

fn drive(keys: &[Key], items: &[JudgedItem]) -> (Vec<Decision>, String) {
    let pending: Vec<(&str, &JudgedItem)> = items.iter().map(|i| ("free", i)).collect();
    let mut keys = keys.iter().cloned();
    let mut screen = Vec::new();
    let decisions = review_loop(&pending, 7, false, &mut screen, || {
        Ok(keys.next().unwrap_or(Key::Char('q')))
    })
    .unwrap();
    (decisions, String::from_utf8(screen).unwrap())
}

#[test]
fn one_key_per_decision_and_the_diff_is_shown() {
    let items = [
        item("a", Some("Yes."), "No."),
        item("b", Some("old"), "new"),
        item("c", None, "fresh"),
    ];
    let (decisions, screen) = drive(&[Key::Char('a'), Key::Char('r'), Key::Char('s')], &items);
    assert_eq!(
        decisions,
        [Decision::Accept, Decision::Reject, Decision::Skip]
    );
    assert!(
        screen.contains("[1/3]") && screen.contains("-Yes.") && screen.contains("+No."),
        "{screen}"
    );
    assert!(
        screen.contains("new output:") && screen.contains("│ fresh"),
        "{screen}"
    );
}

#[test]
fn accept_all_and_reject_all_cover_the_rest() {
    let items = [
        item("a", Some("x"), "y"),
        item("b", Some("x"), "y"),
        item("c", Some("x"), "y"),
    ];
    let (decisions, _) = drive(&[Key::Char('s'), Key::Char('A')], &items);
    assert_eq!(
        decisions,
        [Decision::Skip, Decision::Accept, Decision::Accept]
    );
    let (decisions, _) = drive(&[Key::Char('R')], &items);
    assert_eq!(decisions, [Decision::Reject; 3]);
}

#[test]
fn quitting_leaves_the_rest_undecided_and_d_toggles_the_diff() {
    let items = [item("a", Some("Yes."), "No."), item("b", Some("x"), "y")];
    let (decisions, screen) = drive(&[Key::Char('d'), Key::Char('a'), Key::Char('q')], &items);
    assert_eq!(decisions, [Decision::Accept, Decision::Skip]);
    assert_eq!(
        screen.matches("-Yes.").count(),
        1,
        "the second showing of item a had no diff: {screen}"
    );
}
