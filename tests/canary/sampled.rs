//! Lanes whose answers vary: sample counts chosen from the baseline, the two-sample test with its
//! numbers, exact prompts kept exact, and alerts held until `drift.confirm` runs agree.
//!
//! The servers draw answers from fixed distributions with a seeded generator keyed by the request
//! number, so each run is reproducible while the answers still vary the way a sampled lane's do.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::smtp::{SmtpOptions, SmtpServer};
use crate::stores::on_both_stores;
use crate::support::{LaneSpec, Project, Reply, TestServer, canary_with_env, prompt_of, text};

/// Six fair answers to one question, drawn uniformly.
const BREAKFASTS: [&str; 6] = [
    "Scrambled eggs on toast with a glass of orange juice.",
    "Oatmeal with sliced banana and a spoon of honey.",
    "Greek yogurt with berries and a handful of granola.",
    "Two boiled eggs, rye bread and a cup of black coffee.",
    "Pancakes with maple syrup and fresh strawberries.",
    "Avocado toast topped with a poached egg.",
];

/// What the fake provider does now.
#[derive(Clone)]
struct Provider {
    /// Share of "No" answers to the yes/no question (0 to 100).
    no_percent: u64,
    /// Answer of the deterministic question.
    capital: &'static str,
    /// Seed of the draws, so two phases draw different samples.
    seed: u64,
}

fn provider() -> Arc<Mutex<Provider>> {
    Arc::new(Mutex::new(Provider {
        no_percent: 10,
        capital: "The capital of France is Paris.",
        seed: 1,
    }))
}

/// A provider serving a sampled breakfast question, a sampled yes/no question and a
/// deterministic one; counts the requests per question.
async fn server(provider: Arc<Mutex<Provider>>, counts: Arc<[AtomicUsize; 3]>) -> TestServer {
    TestServer::start(move |n, seen| {
        let p = provider.lock().unwrap().clone();
        let mut rng = fastrand::Rng::with_seed(p.seed.wrapping_mul(1_000_003) ^ n as u64);
        let prompt = prompt_of(seen);
        let answer = if prompt.contains("breakfast") {
            counts[0].fetch_add(1, Ordering::SeqCst);
            BREAKFASTS[rng.usize(..BREAKFASTS.len())].to_string()
        } else if prompt.contains("bridge") {
            counts[1].fetch_add(1, Ordering::SeqCst);
            let closing = ["today", "this week", "for now"][rng.usize(..3)];
            if rng.u64(..100) < p.no_percent {
                format!("No, the bridge is closed {closing}.")
            } else {
                format!("Yes, the bridge is open {closing}.")
            }
        } else {
            counts[2].fetch_add(1, Ordering::SeqCst);
            p.capital.to_string()
        };
        Reply::completion(&answer, "m")
    })
    .await
}

const PROMPTS: &str = r#"
- id: breakfast
  prompt: "Suggest a breakfast in one sentence."
  params: { temperature: 0.8 }
- id: bridge
  prompt: "Is the bridge open? Answer yes or no, then say when."
  params: { temperature: 0.8 }
  checks:
    - answer: '(?i)\b(yes|no)\b'
- id: capital
  prompt: "What is the capital of France?"
"#;

fn project(url: String, top: &[&str]) -> Project {
    let project = Project::new(top, &[LaneSpec::new("free", url).with("max_inflight: 1")]);
    project.write_prompts("set.yaml", PROMPTS);
    project
}

async fn canary(project: &Project, args: &[&str]) -> std::process::Output {
    canary_with_env(project, args, &[]).await
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON:\n{}{}", text(&out.stdout), text(&out.stderr)))
}

fn item<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["lanes"][0]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap()
}

fn counts() -> Arc<[AtomicUsize; 3]> {
    Arc::new([
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ])
}

fn taken(counts: &[AtomicUsize; 3]) -> [usize; 3] {
    [0, 1, 2].map(|i| counts[i].swap(0, Ordering::SeqCst))
}

/// A project whose first run is accepted as the baseline.
async fn baselined(
    provider: &Arc<Mutex<Provider>>,
    top: &[&str],
) -> (TestServer, Arc<[AtomicUsize; 3]>, Project) {
    let counts = counts();
    let server = server(provider.clone(), counts.clone()).await;
    let project = project(server.base_url(), top);
    let first = canary(&project, &["run", "--format", "json"]).await;
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let accepted = canary(&project, &["accept"]).await;
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        text(&accepted.stderr)
    );
    (server, counts, project)
}

on_both_stores! {
async fn the_baseline_s_own_samples_decide_how_many_each_run_takes() {
    let provider = provider();
    let (_server, counts, project) = baselined(&provider, &[]).await;
    assert_eq!(
        taken(&counts),
        [30, 30, 10],
        "new prompts get 10 samples; those whose answers vary get 30 for their baseline"
    );
    let sampled = std::fs::read_to_string(project.file("snapshots/free/breakfast.snap")).unwrap();
    assert!(sampled.contains("samples: 30\ncounts: ["), "{sampled}");
    assert!(
        sampled.contains("~~~~ canary answer 1 of 6: "),
        "every distinct answer is kept, readable: {sampled}"
    );
    let exact = std::fs::read_to_string(project.file("snapshots/free/capital.snap")).unwrap();
    assert!(
        exact.contains("samples: 10\ncounts: [10]\n")
            && exact.ends_with("---\nThe capital of France is Paris."),
        "{exact}"
    );

    provider.lock().unwrap().seed = 2;
    let nightly = canary(&project, &["run", "--format", "json"]).await;
    let report = json(&nightly);
    assert_eq!(nightly.status.code(), Some(0), "{report}");
    assert_eq!(
        taken(&counts),
        [10, 10, 1],
        "sampled prompts get 10, the exact one a single answer"
    );
    assert_eq!(item(&report, "capital")["mode"], "exact");
    assert_eq!(item(&report, "capital")["verdict"], "unchanged");
    assert_eq!(item(&report, "breakfast")["mode"], "sampled");
    assert_eq!(item(&report, "breakfast")["baseline_samples"], 30);
    let lane = &report["lanes"][0];
    assert_eq!(lane["sampled_prompts"], 2);
    assert_eq!(lane["alpha"], 0.01);
    assert!(lane["p_value"].as_f64().unwrap() > 0.01, "{lane}");
    assert!(
        lane["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("its 2 sampled prompts are within noise: p = "),
        "{lane}"
    );
}
}

#[tokio::test]
async fn accepting_a_routine_run_keeps_baselines_that_hold_more_samples() {
    let provider = provider();
    let (_server, _counts, project) = baselined(&provider, &[]).await;
    provider.lock().unwrap().seed = 7;
    let nightly = canary(&project, &["run"]).await;
    assert_eq!(nightly.status.code(), Some(0), "{}", text(&nightly.stdout));
    let before = std::fs::read_to_string(project.file("snapshots/free/breakfast.snap")).unwrap();

    let accepted = canary(&project, &["accept"]).await;
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        text(&accepted.stderr)
    );
    let shown = text(&accepted.stdout);
    assert!(
        shown.contains("kept      ") && shown.contains("breakfast.snap (its 30 samples"),
        "{shown}"
    );
    assert_eq!(
        std::fs::read_to_string(project.file("snapshots/free/breakfast.snap")).unwrap(),
        before,
        "ten samples that agree do not replace thirty"
    );
    let exact = std::fs::read_to_string(project.file("snapshots/free/capital.snap")).unwrap();
    assert!(
        exact.contains("samples: 10\n"),
        "one answer does not replace ten: {exact}"
    );
}

#[tokio::test]
async fn unchanged_sampled_answers_raise_no_alarm_run_after_run() {
    let provider = provider();
    let (_server, _counts, project) = baselined(&provider, &[]).await;
    for seed in 10..16 {
        provider.lock().unwrap().seed = seed;
        let out = canary(&project, &["run", "--format", "json"]).await;
        let report = json(&out);
        assert_eq!(out.status.code(), Some(0), "seed {seed}: {report}");
        for id in ["breakfast", "bridge"] {
            let verdict = item(&report, id)["verdict"].as_str().unwrap().to_string();
            assert!(
                verdict == "within_noise" || verdict == "unchanged",
                "{id}: {report}"
            );
        }
    }
}

on_both_stores! {
async fn a_shift_in_the_share_of_answers_is_drift_with_its_rates_and_p_value() {
    let provider = provider();
    let (_server, counts, project) = baselined(&provider, &["metrics_file: canary.prom"]).await;
    {
        let mut p = provider.lock().unwrap();
        p.no_percent = 80;
        p.seed = 3;
    }
    taken(&counts);
    let out = canary(&project, &["run", "--format", "json"]).await;
    let report = json(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let bridge = item(&report, "bridge");
    assert_eq!(bridge["verdict"], "drifted", "{bridge}");
    assert_eq!(
        taken(&counts),
        [30, 30, 1],
        "when a lane's sampled answers move, each sampled prompt is confirmed on 30 samples"
    );
    let reason = bridge["reasons"][0].as_str().unwrap();
    assert!(
        reason.starts_with("answers \"no\" in ")
            && reason.contains(" of 30 samples vs ")
            && reason.contains(" of 30 in the baseline, p = 0.0"),
        "{bridge}"
    );
    assert!(bridge["p_value"].as_f64().unwrap() <= 0.01, "{bridge}");
    assert_eq!(item(&report, "capital")["verdict"], "unchanged");
    let lane = &report["lanes"][0];
    assert!(
        lane["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains("sampled prompts moved: p = ")),
        "{lane}"
    );

    let metrics = std::fs::read_to_string(project.file("canary.prom")).unwrap();
    let p: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("canary_lane_drift_p_value{lane=\"free\"} "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .parse()
        .unwrap();
    assert_eq!(
        Some(p),
        lane["p_value"].as_f64(),
        "the metric is the lane's p-value"
    );

    // diff shows each different answer against the closest baseline answer, not the first.
    let diff = canary(&project, &["diff", "--prompt", "bridge"]).await;
    assert_eq!(diff.status.code(), Some(1));
    let shown = text(&diff.stdout);
    assert!(shown.contains("-No, the bridge is closed"), "{shown}");
    assert!(shown.contains("+No, the bridge is closed"), "{shown}");
    assert!(
        shown.contains("answer ") && shown.contains(" of 30 samples)"),
        "{shown}"
    );

    // history shows the lane's p-value run by run.
    let history = canary(&project, &["history", "--lane", "free", "--format", "json"]).await;
    let runs = json(&history)["runs"].as_array().unwrap().clone();
    assert!(runs[0]["p_value"].as_f64().unwrap() <= 0.01, "{runs:?}");
    assert!(
        runs[1]["p_value"].is_null(),
        "the baseline run had nothing to test: {runs:?}"
    );
    let table = text(
        &canary(&project, &["history", "--lane", "free"])
            .await
            .stdout,
    );
    assert!(table.lines().next().unwrap().contains("  p  "), "{table}");
}
}

#[tokio::test]
async fn an_exact_answer_that_changes_is_drift_at_once_and_confirmed_in_the_same_run() {
    let provider = provider();
    let (_server, counts, project) = baselined(&provider, &[]).await;
    provider.lock().unwrap().capital = "Paris is the capital of France, and Lyon is second.";
    taken(&counts);
    let out = canary(&project, &["run", "--format", "json"]).await;
    let report = json(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let capital = item(&report, "capital");
    assert_eq!(capital["verdict"], "drifted", "{capital}");
    assert_eq!(capital["mode"], "exact");
    assert_eq!(
        taken(&counts)[2],
        10,
        "one answer, then nine more to confirm"
    );
    assert_eq!(capital["samples"], 10);
}

#[tokio::test]
async fn a_lane_that_only_looked_exact_is_not_called_drifted_for_one_odd_answer() {
    // Deterministic until request 40 of the lane's life, which answers differently once.
    let odd_request = Arc::new(AtomicUsize::new(usize::MAX));
    let server = {
        let odd = odd_request.clone();
        TestServer::start(move |n, _| {
            let text = if n == odd.load(Ordering::SeqCst) {
                "France's capital city is Paris, on the Seine."
            } else {
                "The capital of France is Paris."
            };
            Reply::completion(text, "m")
        })
        .await
    };
    let project = Project::new(
        &[],
        &[LaneSpec::new("free", server.base_url()).with("max_inflight: 1")],
    );
    project.write_prompts(
        "set.yaml",
        "- id: capital\n  prompt: What is the capital of France?\n",
    );
    canary(&project, &["run"]).await;
    canary(&project, &["accept"]).await;
    odd_request.store(server.requests(), Ordering::SeqCst);

    let out = canary(&project, &["run", "--format", "json"]).await;
    let report = json(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    let capital = item(&report, "capital");
    assert_eq!(capital["verdict"], "within_noise", "{capital}");
    assert_eq!(capital["samples"], 10);
    assert!(
        capital["reasons"]
            .to_string()
            .contains("does not answer this prompt exactly"),
        "{capital}"
    );
}

on_both_stores! {
async fn drift_confirm_holds_the_alert_until_consecutive_runs_drift() {
    let smtp = SmtpServer::start(SmtpOptions::default());
    let smtp_line = format!(
        "    smtp: {{ host: 127.0.0.1, port: {}, security: none }}",
        smtp.port
    );
    let top = [
        "drift:",
        "  confirm: 2",
        "alerts:",
        "  email:",
        &smtp_line,
        "    from: canary@example.com",
        "    to: [oncall@example.com]",
    ];
    let provider = provider();
    let (_server, _counts, project) = baselined(&provider, &top).await;
    provider.lock().unwrap().capital = "Lyon.";

    let first = canary(&project, &["run"]).await;
    assert_eq!(
        first.status.code(),
        Some(1),
        "the run still says what it saw"
    );
    assert!(
        text(&first.stdout).contains(
            "free: drifted in 1 consecutive run of the 2 drift.confirm asks for before alerting"
        ),
        "{}",
        text(&first.stdout)
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(smtp.received().len(), 0, "no alert after one drifted run");

    let second = canary(&project, &["run", "--format", "json"]).await;
    assert_eq!(json(&second)["lanes"][0]["drift_streak"], 2);
    let mut mail = smtp.received();
    for _ in 0..100 {
        if !mail.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        mail = smtp.received();
    }
    assert_eq!(mail.len(), 1, "the second drifted run in a row alerts");
}
}

#[tokio::test]
async fn an_older_snapshot_with_one_answer_and_a_noise_band_still_judges() {
    let server = TestServer::always(Reply::completion("Paris.", "m")).await;
    let project = Project::new(&[], &[LaneSpec::new("free", server.base_url())]);
    project.write_prompts(
        "set.yaml",
        "- id: capital\n  prompt: What is the capital of France?\n",
    );
    let hash = canary::prompts::PromptSet::load(&project.file("prompts"))
        .unwrap()
        .prompts[0]
        .hash
        .clone();
    std::fs::create_dir_all(project.file("snapshots/free")).unwrap();
    std::fs::write(
        project.file("snapshots/free/capital.snap"),
        format!(
            "---\nprompt_id: capital\nprompt_hash: {hash}\nlane: free\nmodel: m\naccepted_at: '2026-11-01T00:00:00Z'\naccepted_from_run: 1\nsamples: 1\nnoise:\n  similarity_floor: 1.0\n  length_ratio: [1.0, 1.0]\n---\nParis."
        ),
    )
    .unwrap();
    let out = canary(&project, &["run", "--format", "json"]).await;
    let report = json(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    let capital = item(&report, "capital");
    assert_eq!(
        (capital["verdict"].as_str(), capital["mode"].as_str()),
        (Some("unchanged"), Some("single"))
    );
}
