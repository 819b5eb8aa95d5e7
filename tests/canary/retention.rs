//! `store.keep` and `canary prune`: old runs go, the baselines' source runs and the answers
//! still referred to stay, and the store stays sound.

use std::sync::{Arc, Mutex};

use crate::support::{LaneSpec, Project, Reply, TestServer, canary_with_env, text};

const PROMPTS: &str = r#"
- id: capital
  prompt: "What is the capital of France?"
- id: prime
  prompt: "Is 17077 a prime number? Answer yes or no."
"#;

async fn canary(project: &Project, args: &[&str]) -> std::process::Output {
    let out = canary_with_env(project, args, &[]).await;
    assert!(
        out.status.code().is_some_and(|c| c < 2),
        "canary {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// Moves a run's start `days` into the past, as if it had run then.
fn age(project: &Project, run: i64, days: i64) {
    let conn = rusqlite::Connection::open(project.config.store.sqlite_path().unwrap()).unwrap();
    let at = (chrono::Utc::now() - chrono::Duration::days(days))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let changed = conn
        .execute(
            "UPDATE runs SET started_at = ?1 WHERE id = ?2",
            rusqlite::params![at, run],
        )
        .unwrap();
    assert_eq!(changed, 1);
}

fn run_ids(project: &Project) -> Vec<i64> {
    let store = project.store();
    let mut ids: Vec<i64> = store.runs(100).unwrap().iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn old_runs_are_pruned_but_the_baselines_source_run_and_the_newest_stay() {
    let answer = Arc::new(Mutex::new("Paris."));
    let server = {
        let answer = answer.clone();
        TestServer::start(move |_, _| Reply::completion(*answer.lock().unwrap(), "m")).await
    };
    let project = Project::new(
        &["store:", "  keep: 30d"],
        &[LaneSpec::new("local", server.base_url())],
    );
    project.write_prompts("set.yaml", PROMPTS);

    canary(&project, &["run", "--samples", "1"]).await; // 1: the baseline
    canary(&project, &["accept"]).await;
    *answer.lock().unwrap() = "Lyon, I think."; // run 2 alone says this
    canary(&project, &["run", "--samples", "1", "--no-alert"]).await; // 2
    *answer.lock().unwrap() = "Paris.";
    canary(&project, &["run", "--samples", "1"]).await; // 3
    for run in [1, 2, 3] {
        age(&project, run, 100);
    }
    assert_eq!(project.store().counts().unwrap(), (6, 2));

    let dry = canary(&project, &["prune", "--dry-run", "--format", "json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    // Run 1 is the baselines' source, run 3 the newest: only run 2 can go.
    assert_eq!(json["runs"], 1, "{json}");
    assert_eq!(json["results"], 2, "{json}");
    assert_eq!(json["answers"], 1, "{json}");
    assert_eq!(json["baseline_runs"], serde_json::json!([1]));
    assert_eq!(
        run_ids(&project),
        vec![1, 2, 3],
        "a dry run changes nothing"
    );

    // The nightly run prunes by itself once it has stored its own results.
    let nightly = canary(&project, &["run", "--samples", "1"]).await; // 4
    assert!(
        text(&nightly.stderr).contains("store.keep 30days: removed 2 runs"),
        "{}",
        text(&nightly.stderr)
    );
    // Run 3 was the newest when run 4 began; now 4 is, and 3 is old enough to go too.
    assert_eq!(run_ids(&project), vec![1, 4]);
    let store = project.store();
    assert_eq!(store.counts().unwrap(), (4, 1), "Lyon went with run 2");
    assert_eq!(store.integrity_check().unwrap(), "ok");
    drop(store);

    let diff = canary(&project, &["diff", "--run", "4", "--against", "1"]).await;
    assert_eq!(diff.status.code(), Some(0), "{}", text(&diff.stdout));
    let history = canary(&project, &["history"]).await;
    let shown: Vec<String> = text(&history.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert_eq!(shown, vec!["4", "1"]);

    // History still shows each run's latency, read without the answer texts.
    let json = canary(&project, &["history", "--format", "json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        json["runs"][0]["latency_p50_ms"].is_i64(),
        "{}",
        json["runs"][0]
    );

    let again = canary(&project, &["prune", "--vacuum"]).await;
    assert!(
        text(&again.stdout).starts_with("removed 0 runs"),
        "{}",
        text(&again.stdout)
    );
}

#[tokio::test]
async fn a_keep_below_a_day_is_refused_where_it_is_written() {
    let server = TestServer::always(Reply::completion("Paris.", "m")).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("canary.yaml");
    std::fs::write(
        &config,
        format!(
            "store:\n  path: c.db\n  keep: 1h\nlanes:\n  - name: local\n    kind: openai\n    base_url: {}\n    model: m\n",
            server.base_url()
        ),
    )
    .unwrap();
    // prune never calls a lane: a blocking call is fine here.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
        .args(["-c", config.to_str().unwrap(), "prune"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("canary.yaml:3:") && err.contains("at least 1d"),
        "{err}"
    );

    // Without a keep anywhere, prune says how to give one.
    std::fs::write(
        &config,
        format!(
            "store: c.db\nlanes:\n  - name: local\n    kind: openai\n    base_url: {}\n    model: m\n",
            server.base_url()
        ),
    )
    .unwrap();
    // prune never calls a lane: a blocking call is fine here.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
        .args(["-c", config.to_str().unwrap(), "prune"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--keep 400d"),
        "{}",
        text(&out.stderr)
    );
}
