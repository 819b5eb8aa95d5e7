//! The `canary` binary as users run it: exit codes, text and JSON output, startup with a dead lane.

use std::process::{Command, Output};

use crate::support::{LaneSpec, Project, Reply, TestServer, refused_base_url};

const SECRET: &str = "sk-cli-0d9e-never-print";

/// Runs the binary with a clean kill-switch environment.
async fn canary(project: &Project, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_canary"));
    command
        .arg("-c")
        .arg(project.path())
        .args(args)
        .env_remove("FREE_LANE")
        .env("TEST_CLI_KEY", SECRET)
        .env("NO_COLOR", "1");
    tokio::task::spawn_blocking(move || command.output().expect("run canary"))
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_string()
}

#[tokio::test]
async fn ask_prints_the_answer_and_each_attempt_and_exits_0() {
    let lane = TestServer::always(Reply::completion("Paris.", "smollm2")).await;
    let project = Project::new(&[], &[LaneSpec::new("free", lane.base_url())]);
    let out = canary(&project, &["ask", "What is the capital of France?"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "Paris.\n");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("served by free"), "{stderr}");
    assert!(stderr.contains("model smollm2"), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("free")
            && l.contains("served")
            && l.contains("queue")
            && l.contains("call")),
        "{stderr}"
    );
}

#[tokio::test]
async fn ask_json_is_the_contract_object() {
    let lane = TestServer::always(Reply::completion("Paris.", "smollm2")).await;
    let project = Project::new(&[], &[LaneSpec::new("free", lane.base_url())]);
    let out = canary(&project, &["ask", "--format", "json", "capital?"]).await;
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for key in [
        "text",
        "lane",
        "model",
        "fingerprint",
        "finish_reason",
        "usage",
        "elapsed_ms",
        "attempts",
    ] {
        assert!(json.get(key).is_some(), "missing {key}: {json}");
    }
    assert_eq!(json["text"], "Paris.");
    assert_eq!(json["lane"], "free");
    assert_eq!(json["finish_reason"], "stop");
    assert_eq!(json["usage"]["total_tokens"], 17);
    let attempt = &json["attempts"][0];
    assert_eq!(
        (attempt["lane"].as_str(), attempt["outcome"].as_str()),
        (Some("free"), Some("served"))
    );
    assert!(attempt["queue_ms"].is_u64() && attempt["call_ms"].is_u64());
}

#[tokio::test]
async fn ask_exits_3_when_no_lane_answers_in_time() {
    let lane = TestServer::always(Reply::Hang).await;
    let project = Project::new(&[], &[LaneSpec::new("hung", lane.base_url())]);
    let started = std::time::Instant::now();
    let out = canary(&project, &["ask", "--deadline", "300ms", "hello"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert!(text(&out.stderr).contains("timeout"));
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn startup_with_a_dead_lane_warns_once_and_serves_from_the_other() {
    let paid = TestServer::always(Reply::completion("from paid", "m")).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("free", refused_base_url().await),
            LaneSpec::new("paid", paid.base_url()).with("api_key_env: TEST_CLI_KEY"),
        ],
    );
    let out = canary(&project, &["ask", "hello"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "from paid\n");
    let stderr = text(&out.stderr);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("lane free") && warnings[0].contains("cannot connect"),
        "{stderr}"
    );
    assert!(!stderr.contains(SECRET) && !text(&out.stdout).contains(SECRET));
    assert!(!project.audit_text().contains(SECRET));
}

#[tokio::test]
async fn a_bad_config_exits_2_naming_file_line_and_column() {
    let project = Project::new(
        &[],
        &[LaneSpec::new("free", "http://127.0.0.1:9/v1".into())],
    );
    std::fs::write(project.path(), "lanes:\n  - name: free\n    kind: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n    max_inflight: lots\n").unwrap();
    let out = canary(&project, &["check"]).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:6:19", project.path().display())),
        "{stderr}"
    );
}

#[tokio::test]
async fn check_validates_the_prompt_set_too() {
    let project = Project::new(
        &[],
        &[LaneSpec::new("free", "http://127.0.0.1:9/v1".into())],
    );
    project.write_prompts("a.yaml", "- id: same\n  prompt: x\n");
    project.write_prompts("b.yaml", "- id: same\n  prompt: y\n");
    let out = canary(&project, &["check"]).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("duplicate prompt id `same`")
            && stderr.contains("a.yaml:1")
            && stderr.contains("b.yaml:1"),
        "{stderr}"
    );
}

#[tokio::test]
async fn check_probe_reports_each_lane_and_exits_3_when_one_is_down() {
    let up = TestServer::always(Reply::json(
        200,
        r#"{"object":"list","data":[{"id":"smollm2"}]}"#,
    ))
    .await;
    let project = Project::new(
        &["deadline: 2s"],
        &[
            LaneSpec::new("up", up.base_url()),
            LaneSpec::new("down", refused_base_url().await),
        ],
    );
    project.write_prompts("p.yaml", "- id: a\n  prompt: hi\n");
    let valid = canary(&project, &["check"]).await;
    assert_eq!(valid.status.code(), Some(0), "{}", text(&valid.stderr));
    let probed = canary(&project, &["check", "--probe", "--format", "json"]).await;
    assert_eq!(probed.status.code(), Some(3));
    let json: serde_json::Value = serde_json::from_slice(&probed.stdout).unwrap();
    assert_eq!(json["lanes"][0]["probe"]["ok"], true);
    assert!(
        json["lanes"][0]["probe"]["detail"]
            .as_str()
            .unwrap()
            .contains("smollm2")
    );
    assert_eq!(json["lanes"][1]["probe"]["ok"], false);
    assert_eq!(up.seen()[0].path, "/v1/models");
}
