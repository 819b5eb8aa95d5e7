//! Each way an endpoint fails becomes an outcome of the contract, inside the deadline.

use std::time::{Duration, Instant};

use canary::completion::{ChatRequest, Params};
use canary::deadline::Deadline;
use canary::outcome::Outcome;
use canary::router::Routed;

use crate::support::{LaneSpec, Project, Reply, TestServer, refused_base_url};

async fn one_job(base_url: String, extra: &[&str]) -> Routed {
    let mut lane = LaneSpec::new("lane", base_url);
    for line in extra {
        lane = lane.with(line);
    }
    let project = Project::new(&[], &[lane]);
    let router = project.router(&[]);
    let request = ChatRequest::from_prompt(None, "hello", Params::default());
    let start = Instant::now();
    let routed = router
        .route(&request, Deadline::after(Duration::from_secs(3)))
        .await;
    assert!(start.elapsed() < Duration::from_secs(3));
    routed
}

fn detail(routed: &Routed) -> String {
    routed.attempts[0].detail.clone().unwrap_or_default()
}

#[tokio::test]
async fn connection_refused_is_an_error_at_once() {
    let start = Instant::now();
    let routed = one_job(refused_base_url().await, &[]).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Error);
    assert!(
        detail(&routed).contains("cannot connect"),
        "{}",
        detail(&routed)
    );
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn connection_reset_is_an_error() {
    let lane = TestServer::always(Reply::Reset).await;
    let routed = one_job(lane.base_url(), &[]).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Error);
    assert_eq!(lane.requests(), 1);
}

#[tokio::test]
async fn a_500_is_an_error_with_its_status() {
    let lane = TestServer::always(Reply::json(500, r#"{"error":{"message":"internal"}}"#)).await;
    let routed = one_job(lane.base_url(), &[]).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Error);
    assert!(detail(&routed).contains("HTTP 500"), "{}", detail(&routed));
}

#[tokio::test]
async fn a_non_json_200_is_an_error() {
    let lane = TestServer::always(Reply::Respond {
        status: 200,
        headers: vec![("Content-Type".into(), "text/html".into())],
        body: b"<html>upstream gateway</html>".to_vec(),
    })
    .await;
    let routed = one_job(lane.base_url(), &[]).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Error);
    assert!(detail(&routed).contains("not JSON"), "{}", detail(&routed));
}

#[tokio::test]
async fn an_error_object_inside_a_200_is_an_error() {
    let lane = TestServer::always(Reply::json(
        200,
        r#"{"error":{"message":"provider returned error","code":502}}"#,
    ))
    .await;
    let routed = one_job(lane.base_url(), &[]).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Error);
}

#[tokio::test]
async fn an_oversized_declared_body_is_refused() {
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(8 * 1024));
    let lane = TestServer::always(Reply::json(200, &big)).await;
    let routed = one_job(lane.base_url(), &["max_response_bytes: 4KiB"]).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Error);
    assert!(
        detail(&routed).contains("max_response_bytes"),
        "{}",
        detail(&routed)
    );
}

#[tokio::test]
async fn an_endless_body_is_refused_while_it_streams_in() {
    // No Content-Length and no end: only counting bytes as they arrive can stop it.
    let lane = TestServer::always(Reply::Endless).await;
    let start = Instant::now();
    let routed = one_job(lane.base_url(), &["max_response_bytes: 1MiB"]).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Error);
    assert!(
        detail(&routed).contains("max_response_bytes"),
        "{}",
        detail(&routed)
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "refused early, not at the deadline"
    );
}

#[tokio::test]
async fn the_answer_has_the_same_shape_whatever_lane_served() {
    let lane = TestServer::always(Reply::completion("Paris.", "served-model")).await;
    let routed = one_job(lane.base_url(), &[]).await;
    let completion = routed.completion.expect("served");
    assert_eq!(completion.text, "Paris.");
    assert_eq!(completion.lane, "lane");
    assert_eq!(completion.model.as_deref(), Some("served-model"));
    assert_eq!(completion.fingerprint.as_deref(), Some("fp-test"));
    assert_eq!(completion.finish_reason.as_deref(), Some("stop"));
    assert_eq!(completion.usage.total_tokens, Some(17));
    let seen = &lane.seen()[0];
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    let body: serde_json::Value = serde_json::from_str(&seen.body).unwrap();
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["messages"][0]["content"], "hello");
}
