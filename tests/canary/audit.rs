//! The audit log records a hash and a byte count, never the prompt, the answer or a key.

use std::time::Duration;

use canary::completion::{ChatRequest, Params};
use canary::deadline::Deadline;

use crate::support::{LaneSpec, Project, Reply, TestServer};

const SECRET: &str = "sk-test-7f3a9c1e-never-log-me";
const PROMPT: &str = "The launch code is swordfish-42. Is 17077 prime?";

#[tokio::test]
async fn audit_lines_have_hash_and_byte_count_but_no_prompt_or_key() {
    let lane = TestServer::always(Reply::completion("the answer text", "m")).await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("paid", lane.base_url()).with("api_key_env: TEST_AUDIT_KEY")],
    );
    let router = project.router(&[("TEST_AUDIT_KEY", SECRET)]);
    let request = ChatRequest::from_prompt(Some("Be terse."), PROMPT, Params::default());

    let routed = router
        .route(&request, Deadline::after(Duration::from_secs(3)))
        .await;
    assert!(routed.completion.is_some());
    assert_eq!(
        lane.seen()[0]
            .headers
            .get("authorization")
            .map(String::as_str),
        Some(format!("Bearer {SECRET}").as_str()),
        "the key was sent to the lane"
    );

    router.flush_audit().unwrap();
    let audit = project.audit_text();
    let lines: Vec<&str> = audit.lines().collect();
    assert_eq!(lines.len(), 1);
    let entry: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    let (sha, bytes) = request.fingerprint();
    assert_eq!(entry["prompt_sha256"], sha);
    assert_eq!(entry["prompt_bytes"], bytes);
    assert_eq!(entry["job_id"], routed.job_id);
    assert_eq!(entry["served_by"], "paid");
    assert_eq!(entry["attempts"][0]["lane"], "paid");
    assert_eq!(entry["attempts"][0]["outcome"], "served");
    assert!(entry["attempts"][0]["queue_ms"].is_u64() && entry["attempts"][0]["call_ms"].is_u64());
    assert!(entry["ts"].as_str().unwrap().ends_with('Z'));
    assert!(!audit.contains("swordfish"), "prompt body leaked: {audit}");
    assert!(
        !audit.contains("the answer text"),
        "answer body leaked: {audit}"
    );
    assert!(!audit.contains(SECRET), "key leaked: {audit}");
}

#[tokio::test]
async fn bodies_are_audited_only_when_the_config_asks() {
    let lane = TestServer::always(Reply::completion("the answer text", "m")).await;
    let project = Project::new(
        &["audit_bodies: true"],
        &[LaneSpec::new("paid", lane.base_url())],
    );
    let router = project.router(&[]);
    let request = ChatRequest::from_prompt(None, PROMPT, Params::default());
    router
        .route(&request, Deadline::after(Duration::from_secs(3)))
        .await;
    router.flush_audit().unwrap();
    let audit = project.audit_text();
    assert!(
        audit.contains("swordfish-42") && audit.contains("the answer text"),
        "{audit}"
    );
}

#[tokio::test]
async fn every_attempt_of_a_fallback_is_audited() {
    let down = TestServer::always(Reply::json(503, "{}")).await;
    let up = TestServer::always(Reply::completion("ok", "m")).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("first", down.base_url()),
            LaneSpec::new("second", up.base_url()),
        ],
    );
    let router = project.router(&[]);
    let request = ChatRequest::from_prompt(None, "x", Params::default());
    router
        .route(&request, Deadline::after(Duration::from_secs(3)))
        .await;
    router.flush_audit().unwrap();
    let entry: serde_json::Value =
        serde_json::from_str(project.audit_text().lines().next().unwrap()).unwrap();
    let outcomes: Vec<&str> = entry["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["error", "served"]);
    assert_eq!(entry["served_by"], "second");
}

#[tokio::test]
async fn a_key_a_server_echoes_back_is_scrubbed_everywhere() {
    // Some servers quote the Authorization header in their 401 message.
    let lane = TestServer::start(|_, seen| {
        let auth = seen
            .headers
            .get("authorization")
            .cloned()
            .unwrap_or_default();
        Reply::json(
            401,
            &serde_json::json!({"error": {"message": format!("invalid token: {auth}")}})
                .to_string(),
        )
    })
    .await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("paid", lane.base_url()).with("api_key_env: TEST_ECHO_KEY")],
    );
    let router = project.router(&[("TEST_ECHO_KEY", SECRET)]);
    let request = ChatRequest::from_prompt(None, "hello", Params::default());

    let routed = router
        .route(&request, Deadline::after(Duration::from_secs(3)))
        .await;

    let detail = routed.attempts[0].detail.clone().unwrap();
    assert!(
        detail.contains("invalid token: Bearer [redacted]"),
        "{detail}"
    );
    router.flush_audit().unwrap();
    assert!(
        !project.audit_text().contains(SECRET),
        "{}",
        project.audit_text()
    );
}

#[tokio::test]
async fn a_job_its_caller_abandons_mid_call_is_still_audited() {
    let lane = TestServer::always(Reply::Hang).await;
    let project = Project::new(&[], &[LaneSpec::new("hung", lane.base_url())]);
    let router = project.router(&[]);
    let request = ChatRequest::from_prompt(None, "hello", Params::default());

    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        router.route(&request, Deadline::after(Duration::from_secs(10))),
    )
    .await;

    assert!(gave_up.is_err());
    assert_eq!(lane.requests(), 1, "the prompt left the network");
    router.flush_audit().unwrap();
    let audit = project.audit_text();
    let entry: serde_json::Value =
        serde_json::from_str(audit.lines().next().expect("one audit line")).unwrap();
    assert_eq!(entry["attempts"][0]["outcome"], "timeout");
    assert!(
        entry["attempts"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("cancelled")
    );
    assert!(
        router
            .render_prometheus()
            .contains("canary_lane_attempts_total{lane=\"hung\",outcome=\"timeout\"} 1")
    );
}
