//! 429 / quota is a state with a reset time, not an exception: no retry storm at a closed door.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use canary::completion::{ChatRequest, Params};
use canary::deadline::Deadline;
use canary::outcome::Outcome;

use crate::support::{LaneSpec, Project, Reply, TestServer};

fn request() -> ChatRequest {
    ChatRequest::from_prompt(None, "hello", Params::default())
}

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(3))
}

#[tokio::test]
async fn a_429_with_retry_after_closes_the_lane_until_its_reset() {
    let lane = TestServer::start(|n, _| {
        if n == 0 {
            Reply::json(429, r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#)
                .with_header("Retry-After", "1")
        } else {
            Reply::completion("ok again", "m")
        }
    })
    .await;
    let project = Project::new(&[], &[LaneSpec::new("limited", lane.base_url())]);
    let router = project.router(&[]);

    let first = router.route(&request(), deadline()).await;
    assert_eq!(first.attempts[0].outcome, Outcome::Exhausted);
    let until = first.attempts[0].until.expect("exhausted carries until");
    let wait = until
        .signed_duration_since(chrono::Utc::now())
        .num_milliseconds();
    assert!(
        (500..=1100).contains(&wait),
        "reset in about a second, got {wait} ms"
    );

    for _ in 0..5 {
        let skipped = router.route(&request(), deadline()).await;
        assert_eq!(skipped.attempts[0].outcome, Outcome::Exhausted);
    }
    assert_eq!(
        lane.requests(),
        1,
        "no request reaches a lane before its reset time"
    );

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after = router.route(&request(), deadline()).await;
    assert_eq!(after.attempts[0].outcome, Outcome::Served);
    assert_eq!(lane.requests(), 2);
}

#[tokio::test]
async fn openrouter_429_inside_a_200_uses_the_epoch_ms_reset() {
    // The reset is stamped when the server answers, 800 ms ahead, as OpenRouter does.
    let stamped = Arc::new(Mutex::new(0u128));
    let lane = {
        let stamped = stamped.clone();
        TestServer::start(move |n, _| {
            if n > 0 {
                return Reply::completion("ok", "m");
            }
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis();
            let reset_ms = now_ms + 800;
            *stamped.lock().unwrap() = reset_ms;
            let body = format!(
                r#"{{"error":{{"message":"Rate limit exceeded: free-models-per-day","code":429,
                    "metadata":{{"headers":{{"X-RateLimit-Limit":"50","X-RateLimit-Remaining":"0",
                    "X-RateLimit-Reset":"{reset_ms}"}}}}}}}}"#
            );
            Reply::json(200, &body)
        })
        .await
    };
    let project = Project::new(&[], &[LaneSpec::new("openrouter", lane.base_url())]);
    let router = project.router(&[]);

    let first = router.route(&request(), deadline()).await;
    assert_eq!(first.attempts[0].outcome, Outcome::Exhausted);
    let until = first.attempts[0].until.unwrap().timestamp_millis() as u128;
    let reset_ms = *stamped.lock().unwrap();
    assert!(
        until.abs_diff(reset_ms) <= 1,
        "until {until} vs reset {reset_ms}"
    );

    let skipped = router.route(&request(), deadline()).await;
    assert_eq!(skipped.attempts[0].outcome, Outcome::Exhausted);
    assert_eq!(lane.requests(), 1);

    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        router.route(&request(), deadline()).await.attempts[0].outcome,
        Outcome::Served
    );
}

#[tokio::test]
async fn an_exhausted_lane_passes_the_job_on_without_a_request() {
    let limited = TestServer::always(
        Reply::json(429, r#"{"error":{"message":"slow down"}}"#).with_header("retry-after", "30"),
    )
    .await;
    let backup = TestServer::always(Reply::completion("backup", "m")).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("limited", limited.base_url()),
            LaneSpec::new("backup", backup.base_url()),
        ],
    );
    let router = project.router(&[]);
    for _ in 0..3 {
        let routed = router.route(&request(), deadline()).await;
        assert_eq!(routed.completion.unwrap().lane, "backup");
    }
    assert_eq!(limited.requests(), 1);
    let metrics = router.render_prometheus();
    assert!(
        metrics.contains("canary_lane_state{lane=\"limited\",state=\"exhausted\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_401_marks_the_lane_misconfigured_and_stops_calling_it() {
    let lane = TestServer::always(Reply::json(
        401,
        r#"{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}"#,
    ))
    .await;
    let project = Project::new(&[], &[LaneSpec::new("badkey", lane.base_url())]);
    let router = project.router(&[]);
    let first = router.route(&request(), deadline()).await;
    assert_eq!(first.attempts[0].outcome, Outcome::Misconfigured);
    let second = router.route(&request(), deadline()).await;
    assert_eq!(second.attempts[0].outcome, Outcome::Misconfigured);
    assert_eq!(lane.requests(), 1);
}

#[tokio::test]
async fn a_missing_key_is_misconfigured_before_any_request() {
    let lane = TestServer::always(Reply::completion("ok", "m")).await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("paid", lane.base_url()).with("api_key_env: TEST_MISSING_KEY")],
    );
    let router = project.router(&[]);
    let routed = router.route(&request(), deadline()).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Misconfigured);
    assert!(
        routed.attempts[0]
            .detail
            .as_deref()
            .unwrap()
            .contains("TEST_MISSING_KEY")
    );
    assert_eq!(lane.requests(), 0);
}
