//! The canary as users run it: `run`, `accept`, `diff`, against real loopback servers.

use crate::stores::on_both_stores;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{
    LaneSpec, Project, Reply, TestServer, canary_with_env, prompt_of, refused_base_url, text,
};

const PROMPTS: &str = r#"
- id: capital
  prompt: "What is the capital of France?"
  checks:
    - answer: '(?i)\b(paris|lyon)\b'
- id: prime
  prompt: "Is 17077 a prime number? Answer yes or no."
  checks:
    - answer: '(?i)\b(yes|no)\b'
- id: json
  prompt: "Give a JSON object for Ada, 36."
  checks:
    - json: true
"#;

/// How the fake model answers: the lines it says, and the model name it reports.
#[derive(Clone)]
struct Behaviour {
    reworded: bool,
    model: &'static str,
}

/// A model server whose answers depend on the prompt and on a switchable behaviour.
async fn model_server(behaviour: Arc<Mutex<Behaviour>>) -> TestServer {
    TestServer::start(move |_, seen| {
        let b = behaviour.lock().unwrap().clone();
        let prompt = prompt_of(seen);
        let answer = if prompt.contains("capital") {
            if b.reworded {
                "The capital of France is Paris. It is famous for the Louvre."
            } else {
                "The capital of France is Paris. It is known for the Eiffel Tower."
            }
        } else if prompt.contains("prime") {
            if b.reworded { "No." } else { "Yes." }
        } else {
            r#"{"name": "Ada", "age": 36}"#
        };
        Reply::completion(answer, b.model)
    })
    .await
}

fn behaviour() -> Arc<Mutex<Behaviour>> {
    Arc::new(Mutex::new(Behaviour {
        reworded: false,
        model: "smollm2",
    }))
}

async fn canary(project: &Project, args: &[&str]) -> std::process::Output {
    canary_with_env(project, args, &[]).await
}

/// A one-lane project with a baseline (run 1, accepted) and a run of reworded answers (run 2).
async fn baselined_then_reworded() -> (TestServer, Project) {
    let (behaviour, server, project) = baselined().await;
    behaviour.lock().unwrap().reworded = true;
    canary(&project, &["run"]).await;
    (server, project)
}

/// A one-lane project whose first run (run 1) is accepted as the baseline.
async fn baselined() -> (Arc<Mutex<Behaviour>>, TestServer, Project) {
    let behaviour = behaviour();
    let server = model_server(behaviour.clone()).await;
    let project = one_lane(server.base_url());
    canary(&project, &["run"]).await;
    canary(&project, &["accept"]).await;
    (behaviour, server, project)
}

fn one_lane(url: String) -> Project {
    let project = Project::new(&[], &[LaneSpec::new("local", url)]);
    project.write_prompts("set.yaml", PROMPTS);
    project
}

on_both_stores! {
async fn baseline_unchanged_reworded_accept_round_trip() {
    let behaviour = behaviour();
    let server = model_server(behaviour.clone()).await;
    let project = one_lane(server.base_url());

    let first = canary(&project, &["run"]).await;
    assert_eq!(
        first.status.code(),
        Some(0),
        "{}{}",
        text(&first.stdout),
        text(&first.stderr)
    );
    assert!(
        text(&first.stdout).contains("local"),
        "{}",
        text(&first.stdout)
    );
    let accepted = canary(&project, &["accept"]).await;
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        text(&accepted.stderr)
    );
    let snap = std::fs::read_to_string(project.file("snapshots/local/capital.snap")).unwrap();
    assert!(snap.starts_with("---\nprompt_id: capital\n"), "{snap}");
    assert!(
        snap.ends_with("---\nThe capital of France is Paris. It is known for the Eiffel Tower."),
        "{snap}"
    );

    let unchanged = canary(&project, &["run", "--format", "json"]).await;
    assert_eq!(
        unchanged.status.code(),
        Some(0),
        "{}",
        text(&unchanged.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&unchanged.stdout).unwrap();
    assert_eq!(json["status"], "ok");
    assert_eq!(json["exit_code"], 0);
    assert_eq!(json["lanes"][0]["verdict"], "unchanged");
    assert_eq!(json["lanes"][0]["prompts"].as_array().unwrap().len(), 3);

    behaviour.lock().unwrap().reworded = true;
    let drifted = canary(&project, &["run", "--format", "json"]).await;
    assert_eq!(drifted.status.code(), Some(1), "{}", text(&drifted.stderr));
    let json: serde_json::Value = serde_json::from_slice(&drifted.stdout).unwrap();
    assert_eq!(json["status"], "drifted");
    let prompts = json["lanes"][0]["prompts"].as_array().unwrap();
    let prime = prompts.iter().find(|p| p["id"] == "prime").unwrap();
    assert_eq!(prime["verdict"], "drifted");
    assert!(
        prime["reasons"]
            .to_string()
            .contains("answer changed: yes → no"),
        "{prime}"
    );
    let capital = prompts.iter().find(|p| p["id"] == "capital").unwrap();
    assert!(capital["similarity"].as_f64().unwrap() < 0.85, "{capital}");

    let diff = canary(&project, &["diff"]).await;
    assert_eq!(diff.status.code(), Some(1));
    let shown = text(&diff.stdout);
    assert!(
        shown.contains("-The capital of France is Paris. It is known for the Eiffel Tower."),
        "{shown}"
    );
    assert!(
        shown.contains("+The capital of France is Paris. It is famous for the Louvre."),
        "{shown}"
    );
    let colored = canary(
        &project,
        &["diff", "--color", "always", "--prompt", "capital"],
    )
    .await;
    let shown = text(&colored.stdout);
    assert!(
        shown.contains("\u{1b}[") && shown.contains("Louvre"),
        "changed words are emphasised: {shown}"
    );

    let accepted = canary(&project, &["accept"]).await;
    assert_eq!(accepted.status.code(), Some(0));
    let again = canary(&project, &["run"]).await;
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stdout));
    let clean_diff = canary(&project, &["diff"]).await;
    assert_eq!(clean_diff.status.code(), Some(0));
}
}

on_both_stores! {
async fn a_prompt_edited_after_its_baseline_is_stale_not_drifted() {
    let (_behaviour, _server, project) = baselined().await;
    project.write_prompts(
        "set.yaml",
        &PROMPTS.replace("Answer yes or no.", "Reply yes or no."),
    );

    let out = canary(&project, &["run", "--format", "json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let prime = json["lanes"][0]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "prime")
        .unwrap()
        .clone();
    assert_eq!(prime["verdict"], "stale");
    assert_eq!(json["lanes"][0]["verdict"], "stale");
}
}

on_both_stores! {
async fn a_lane_that_is_down_is_failed_and_exits_3() {
    let up = model_server(behaviour()).await;
    let project = Project::new(
        &["deadline: 2s"],
        &[
            LaneSpec::new("up", up.base_url()),
            LaneSpec::new("down", refused_base_url().await),
        ],
    );
    project.write_prompts("set.yaml", PROMPTS);
    canary(&project, &["run"]).await;
    canary(&project, &["accept", "--lane", "up"]).await;

    let out = canary(&project, &["run", "--format", "json"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["status"], "unmeasured");
    let lanes = json["lanes"].as_array().unwrap();
    assert_eq!(lanes[0]["lane"], "up");
    assert_eq!(
        lanes[0]["verdict"], "unchanged",
        "the other lane is still measured"
    );
    assert_eq!(lanes[1]["verdict"], "failed");
    assert!(
        lanes[1]["prompts"][0]["reasons"][0]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{}",
        lanes[1]
    );
}
}

on_both_stores! {
async fn failed_results_are_never_accepted() {
    let project = Project::new(
        &["deadline: 1s"],
        &[LaneSpec::new("down", refused_base_url().await)],
    );
    project.write_prompts("set.yaml", PROMPTS);
    canary(&project, &["run"]).await;
    let out = canary(&project, &["accept"]).await;
    assert!(
        text(&out.stdout).contains("a failed result is never a baseline"),
        "{}",
        text(&out.stdout)
    );
    assert!(!project.file("snapshots/down/capital.snap").exists());
}
}

on_both_stores! {
async fn a_changed_model_name_is_flagged_even_with_identical_answers() {
    let (behaviour, _server, project) = baselined().await;

    behaviour.lock().unwrap().model = "smollm2-q2-swapped";
    let out = canary(&project, &["run", "--format", "json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lane = &json["lanes"][0];
    assert_eq!(lane["verdict"], "drifted");
    assert!(
        lane["reasons"][0]
            .as_str()
            .unwrap()
            .contains("model changed on 3 of 3 answers: smollm2 → smollm2-q2-swapped"),
        "{lane}"
    );
    assert_eq!(
        lane["counts"]["unchanged"], 3,
        "the answers themselves did not move"
    );
    let diff = canary(&project, &["diff"]).await;
    assert_eq!(
        diff.status.code(),
        Some(1),
        "diff exits like run: {}",
        text(&diff.stdout)
    );
}
}

on_both_stores! {
async fn nondeterministic_answers_inside_the_noise_band_are_not_drift() {
    // A lane sampling at high temperature: three phrasings in rotation, each a fair answer.
    let phrasings = [
        "The sea looks blue because water absorbs the red part of sunlight.",
        "Water absorbs red light, so the sea looks blue to us.",
        "Because water soaks up red light, the sea appears blue.",
    ];
    let server = TestServer::start(move |n, _| Reply::completion(phrasings[n % 3], "m")).await;
    let project = Project::new(
        &["drift:", "  threshold: 0.9"],
        &[LaneSpec::new("warm", server.base_url())],
    );
    project.write_prompts(
        "set.yaml",
        "- id: sea\n  prompt: Why is the sea blue?\n  params: { temperature: 0.9 }\n",
    );

    let calibrated = canary(&project, &["accept", "--samples", "6"]).await;
    assert_eq!(
        calibrated.status.code(),
        Some(0),
        "{}",
        text(&calibrated.stderr)
    );
    let snap = std::fs::read_to_string(project.file("snapshots/warm/sea.snap")).unwrap();
    assert!(snap.contains("samples: 6"), "{snap}");

    for _ in 0..3 {
        let out = canary(&project, &["run", "--samples", "2", "--format", "json"]).await;
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{json}");
        let verdict = json["lanes"][0]["prompts"][0]["verdict"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            verdict == "within_noise" || verdict == "unchanged",
            "{json}"
        );
    }
}
}

on_both_stores! {
async fn drift_seen_on_the_control_lane_too_is_for_review_not_free_lane_drift() {
    let behaviour = behaviour();
    let free = model_server(behaviour.clone()).await;
    let control = model_server(behaviour.clone()).await;
    let project = Project::new(
        &["drift:", "  control: control"],
        &[
            LaneSpec::new("free-tier", free.base_url()),
            LaneSpec::new("control", control.base_url()),
        ],
    );
    project.write_prompts("set.yaml", PROMPTS);
    canary(&project, &["run"]).await;
    canary(&project, &["accept"]).await;

    behaviour.lock().unwrap().reworded = true;
    let out = canary(&project, &["run", "--format", "json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let free_lane = &json["lanes"][0];
    assert_eq!(free_lane["lane"], "free-tier");
    assert_ne!(free_lane["verdict"], "drifted", "{free_lane}");
    let prime = free_lane["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "prime")
        .unwrap()
        .clone();
    assert_eq!(prime["verdict"], "drifted");
    assert_eq!(prime["review"], true);
    assert_eq!(
        json["lanes"][1]["verdict"], "drifted",
        "the control lane itself drifted"
    );
}
}

#[tokio::test]
async fn a_second_run_on_the_same_store_exits_2_naming_the_holder() {
    let slow =
        TestServer::always(Reply::completion("slow", "m").after(Duration::from_millis(600))).await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("slow", slow.base_url()).with("max_inflight: 1")],
    );
    project.write_prompts("set.yaml", PROMPTS);
    let first = {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_canary"));
        command
            .arg("-c")
            .arg(project.path())
            .arg("run")
            .env_remove("FREE_LANE");
        command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        command.spawn().unwrap()
    };
    // Wait until the first run is sending.
    for _ in 0..100 {
        if slow.requests() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    let second = canary(&project, &["run"]).await;
    assert_eq!(second.status.code(), Some(2));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    let stderr = text(&second.stderr);
    assert!(
        stderr.contains("holds the lock") && stderr.contains("run 1 (pid"),
        "{stderr}"
    );
    let mut first = first;
    // Waiting blocks, and the test server shares this runtime: wait off the runtime thread.
    let status = tokio::task::spawn_blocking(move || first.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn sigkill_mid_run_loses_no_finished_result_and_the_next_run_marks_it_interrupted() {
    let slow = TestServer::always(
        Reply::completion("steady answer", "m").after(Duration::from_millis(150)),
    )
    .await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("slow", slow.base_url()).with("max_inflight: 1")],
    );
    let many: String = (0..20)
        .map(|i| format!("- id: p{i:02}\n  prompt: question {i}\n"))
        .collect();
    project.write_prompts("set.yaml", &many);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
        .arg("-c")
        .arg(project.path())
        .arg("run")
        .env_remove("FREE_LANE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if slow.requests() >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let answered_before_kill = slow.requests() - 1; // the last one may have been cut mid-flight

    let store = project.store();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    let run = store.run(None).unwrap();
    assert_eq!(run.status, "running");
    let kept = store.results(run.id).unwrap();
    assert!(
        kept.len() >= answered_before_kill - 1 && kept.len() >= 4,
        "kept {} of ~{answered_before_kill}",
        kept.len()
    );
    assert!(
        kept.iter()
            .all(|r| r.output.as_deref() == Some("steady answer"))
    );
    drop(store);

    let next = canary(&project, &["run", "--prompt", "p00"]).await;
    assert_eq!(next.status.code(), Some(0), "{}", text(&next.stderr));
    assert!(
        text(&next.stderr).contains(&format!("run {} was interrupted", run.id)),
        "{}",
        text(&next.stderr)
    );
    let store = project.store();
    assert_eq!(store.run(Some(run.id)).unwrap().status, "interrupted");
    assert_eq!(store.results(run.id).unwrap().len(), kept.len());
}

#[tokio::test]
async fn the_kill_switch_removes_a_lane_from_the_run_and_the_rest_is_measured() {
    let free = model_server(behaviour()).await;
    let paid = model_server(behaviour()).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("free", free.base_url()).with("kill_switch_env: FREE_LANE"),
            LaneSpec::new("paid", paid.base_url()),
        ],
    );
    project.write_prompts("set.yaml", PROMPTS);
    let out = canary_with_env(
        &project,
        &["run", "--format", "json"],
        &[("FREE_LANE", "off")],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["lanes"].as_array().unwrap().len(), 1);
    assert_eq!(json["lanes"][0]["lane"], "paid");
    assert_eq!(json["skipped_lanes"][0]["lane"], "free");
    assert_eq!(free.requests(), 0);
    // No baselines yet: ten samples of each prompt, enough to accept as baselines.
    assert_eq!(paid.requests(), 3 * 10);
}

on_both_stores! {
async fn history_shows_runs_per_lane_and_one_prompts_story() {
    let (_server, project) = baselined_then_reworded().await;

    let out = canary(&project, &["history", "--format", "json"]).await;
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (runs[0]["run_id"].as_i64(), runs[0]["verdict"].as_str()),
        (Some(2), Some("drifted"))
    );
    assert_eq!(
        (runs[1]["run_id"].as_i64(), runs[1]["verdict"].as_str()),
        (Some(1), Some("new"))
    );
    let story = canary(&project, &["history", "--prompt", "prime"]).await;
    let shown = text(&story.stdout);
    assert!(
        shown.lines().count() == 3 && shown.contains("drifted"),
        "{shown}"
    );
}
}

#[tokio::test]
async fn review_without_a_terminal_refuses_and_prints_the_commands() {
    let server = model_server(behaviour()).await;
    let project = one_lane(server.base_url());
    canary(&project, &["run"]).await;
    let out = canary(&project, &["review"]).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("needs a terminal"), "{stderr}");
    assert!(
        stderr.contains("canary accept --run 1 --lane local --prompt capital"),
        "{stderr}"
    );
}

#[tokio::test]
async fn each_run_rewrites_the_prometheus_metrics_file() {
    let behaviour = behaviour();
    let server = model_server(behaviour.clone()).await;
    let project = Project::new(
        &["metrics_file: metrics/canary.prom"],
        &[LaneSpec::new("local", server.base_url())],
    );
    project.write_prompts("set.yaml", PROMPTS);
    canary(&project, &["run"]).await;
    canary(&project, &["accept"]).await;
    behaviour.lock().unwrap().reworded = true;
    let out = canary(&project, &["run"]).await;
    assert_eq!(out.status.code(), Some(1));

    let metrics = std::fs::read_to_string(project.file("metrics/canary.prom")).unwrap();
    assert!(metrics.contains("canary_last_run_id 2\n"), "{metrics}");
    assert!(
        metrics.contains("canary_last_run_exit_code 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("canary_prompts{lane=\"local\",verdict=\"drifted\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("canary_lane_drifted{lane=\"local\"} 1"),
        "{metrics}"
    );
    // One call per prompt, and nine more for each of the two prompts whose answer left its
    // exact baseline, to confirm the change.
    assert!(
        metrics.contains("canary_lane_call_seconds_count{lane=\"local\",outcome=\"served\"} 21"),
        "{metrics}"
    );
    assert!(
        metrics.contains("canary_lane_state{lane=\"local\",state=\"closed\"} 1"),
        "{metrics}"
    );
    assert!(
        !project.file("metrics/canary.prom.tmp").exists(),
        "written through a temp file and renamed"
    );
}

on_both_stores! {
async fn report_writes_one_self_contained_html_page() {
    let (_server, project) = baselined_then_reworded().await;

    let out = canary(
        &project,
        &[
            "report",
            "-o",
            project.file("out/report.html").to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(project.file("out/report.html")).unwrap();
    assert!(
        page.starts_with("<!DOCTYPE html>") && page.contains("canary run 2"),
        "{page}"
    );
    assert!(
        page.contains("lane local: <span style=\"color:#cf222e\">drifted</span>"),
        "{page}"
    );
    assert!(page.contains("answer changed: yes → no"), "{page}");
    assert!(
        page.contains("background:#ffeef0") && page.contains("famous"),
        "{page}"
    );
    assert!(
        !page.contains("<script") && !page.contains("<link"),
        "self-contained, nothing to load"
    );
}
}

#[tokio::test]
async fn init_scaffolds_a_project_that_checks_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("new-canary");
    let run_init = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
            .arg("init")
            .arg(&target)
            .output()
            .unwrap()
    };
    let first = run_init();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert!(target.join("prompts/facts.yaml").exists() && target.join("snapshots").is_dir());
    assert_eq!(
        std::fs::read_to_string(target.join(".gitignore")).unwrap(),
        ".canary/\n"
    );
    assert_eq!(
        std::fs::read_to_string(target.join(".gitattributes")).unwrap(),
        "*.snap -text\n",
        "git must not convert the line endings of baselines"
    );
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
        .arg("-c")
        .arg(target.join("canary.yaml"))
        .arg("check")
        .output()
        .unwrap();
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked.stderr));
    assert!(
        text(&checked.stdout).contains("prompts: 13"),
        "{}",
        text(&checked.stdout)
    );

    std::fs::write(target.join("canary.yaml"), "# mine\n").unwrap();
    let second = run_init();
    assert_eq!(second.status.code(), Some(0));
    assert!(
        text(&second.stdout).contains("kept"),
        "{}",
        text(&second.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(target.join("canary.yaml")).unwrap(),
        "# mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(target.join(".gitignore")).unwrap(),
        ".canary/\n"
    );
}

#[tokio::test]
async fn a_broken_baseline_is_refused_before_any_request_is_sent() {
    let (_behaviour, server, project) = baselined().await;
    let before = server.requests();
    std::fs::write(
        project.file("snapshots/local/prime.snap"),
        "<<<<<<< HEAD\nnot a snapshot\n",
    )
    .unwrap();

    let out = canary(&project, &["run"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("prime.snap"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(server.requests(), before, "nothing was sent");
    assert_eq!(
        project.store().run(None).unwrap().id,
        1,
        "no run was started"
    );
    assert!(
        text(&out.stderr).contains("canary accept --samples 10 --prompt ID"),
        "it says how to repair: {}",
        text(&out.stderr)
    );

    // The way out it names works: a new baseline replaces the broken one.
    let repaired = canary(&project, &["accept", "--samples", "2", "--prompt", "prime"]).await;
    assert_eq!(
        repaired.status.code(),
        Some(0),
        "{}",
        text(&repaired.stderr)
    );
    let again = canary(&project, &["run"]).await;
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
}

on_both_stores! {
async fn an_error_after_the_results_are_stored_closes_the_run_and_keeps_them() {
    // Answers a little late, so a baseline can break while the run is under way.
    let slow = TestServer::start(|_, seen| {
        let prompt = prompt_of(seen);
        let answer = if prompt.contains("capital") {
            "The capital of France is Paris. It is known for the Eiffel Tower."
        } else if prompt.contains("prime") {
            "Yes."
        } else {
            r#"{"name": "Ada", "age": 36}"#
        };
        Reply::completion(answer, "smollm2").after(Duration::from_millis(300))
    })
    .await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("local", slow.base_url()).with("max_inflight: 1")],
    );
    project.write_prompts("set.yaml", PROMPTS);
    // Two samples each make exact baselines, so the run takes one answer of each.
    canary(&project, &["run", "--samples", "2"]).await;
    canary(&project, &["accept"]).await;
    let before = slow.requests();

    let run = {
        let project_path = project.path();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
                .arg("-c")
                .arg(project_path)
                .arg("run")
                .env_remove("FREE_LANE")
                .output()
                .unwrap()
        })
    };
    // Once the run is sending, someone breaks a baseline under it (a bad merge, say).
    for _ in 0..200 {
        if slow.requests() > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::write(
        project.file("snapshots/local/prime.snap"),
        "<<<<<<< HEAD\nnot a snapshot\n",
    )
    .unwrap();
    let out = run.await.unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("prime.snap"),
        "{}",
        text(&out.stderr)
    );
    let store = project.store();
    let run = store.run(Some(2)).unwrap();
    assert_eq!((run.status.as_str(), run.exit_code), ("finished", Some(2)));
    assert_eq!(store.results(2).unwrap().len(), 3, "the results are kept");
}
}

on_both_stores! {
async fn a_server_reporting_absurd_token_counts_still_has_its_answers_stored() {
    // PostgreSQL holds counts in four-byte integers: a count past them is stored as their
    // largest, and the answer is kept rather than refused.
    let body = serde_json::json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Paris."}}],
        "usage": {"prompt_tokens": 99_999_999_999_u64, "completion_tokens": 99_999_999_999_u64,
                  "total_tokens": 199_999_999_998_u64}
    });
    let server = TestServer::always(Reply::json(200, &body.to_string())).await;
    let project = Project::new(&[], &[LaneSpec::new("local", server.base_url())]);
    project.write_prompts("set.yaml", "- id: a\n  prompt: one\n- id: b\n  prompt: two\n");
    let out = canary(&project, &["run"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let store = project.store();
    let run = store.run(None).unwrap();
    let results = store.results(run.id).unwrap();
    // No baselines yet: ten samples of each of the two prompts.
    assert_eq!(results.len(), 2 * 10);
    for result in &results {
        assert_eq!(result.output.as_deref(), Some("Paris."));
        assert_eq!(result.completion_tokens, Some(i64::from(i32::MAX)));
    }
}
}
