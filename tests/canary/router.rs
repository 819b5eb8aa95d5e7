//! Fallback, breaker, and per-lane concurrency caps.

use std::time::Duration;

use canary::completion::{ChatRequest, Params};
use canary::deadline::Deadline;
use canary::outcome::Outcome;

use crate::support::{LaneSpec, Project, Reply, TestServer, free_lane_off};

fn request(text: &str) -> ChatRequest {
    ChatRequest::from_prompt(None, text, Params::default())
}

#[tokio::test]
async fn a_failing_free_lane_falls_back_to_paid() {
    let free = TestServer::always(Reply::json(500, r#"{"error":{"message":"boom"}}"#)).await;
    let paid = TestServer::always(Reply::completion("ok", "paid-model")).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("free", free.base_url()).with("kill_switch_env: FREE_LANE"),
            LaneSpec::new("paid", paid.base_url()),
        ],
    );
    let router = project.router_with_process_env();

    let routed = router
        .route(&request("hello"), Deadline::after(Duration::from_secs(5)))
        .await;

    let completion = routed.completion.expect("paid answers");
    assert_eq!(
        (completion.text.as_str(), completion.lane.as_str()),
        ("ok", "paid")
    );
    assert_eq!(paid.requests(), 1);
    let free_outcome = routed.attempts[0].outcome;
    if free_lane_off() {
        assert_eq!(free_outcome, Outcome::Disabled);
        assert_eq!(free.requests(), 0);
    } else {
        assert_eq!(free_outcome, Outcome::Error);
        assert_eq!(free.requests(), 1);
    }
}

#[tokio::test]
async fn the_breaker_opens_after_repeated_failures_and_admits_again_after_cooldown() {
    // Two failures, then the lane recovers.
    let lane = TestServer::start(|n, _| {
        if n < 2 {
            Reply::json(503, r#"{"error":{"message":"overloaded"}}"#)
        } else {
            Reply::completion("back", "m")
        }
    })
    .await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("flaky", lane.base_url())
            .with("breaker: { failures: 2, cooldown: 300ms }")],
    );
    let router = project.router(&[]);
    let deadline = || Deadline::after(Duration::from_secs(5));

    for _ in 0..2 {
        let routed = router.route(&request("x"), deadline()).await;
        assert_eq!(routed.attempts[0].outcome, Outcome::Error);
    }
    let routed = router.route(&request("x"), deadline()).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::BreakerOpen);
    assert_eq!(lane.requests(), 2, "an open breaker sends nothing");

    // Cooldown is 300 ms with at most 10% jitter.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let routed = router.route(&request("x"), deadline()).await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Served);
    let routed = router.route(&request("x"), deadline()).await;
    assert_eq!(
        routed.attempts[0].outcome,
        Outcome::Served,
        "the probe closed the breaker"
    );
    assert_eq!(lane.requests(), 4);
}

#[tokio::test]
async fn a_half_open_lane_lets_exactly_one_probe_through() {
    let lane = TestServer::start(|n, _| {
        if n < 1 {
            Reply::json(500, "{}")
        } else {
            Reply::completion("slow probe", "m").after(Duration::from_millis(300))
        }
    })
    .await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("flaky", lane.base_url())
            .with("breaker: { failures: 1, cooldown: 100ms }")],
    );
    let router = project.router(&[]);
    let deadline = || Deadline::after(Duration::from_secs(5));
    router.route(&request("x"), deadline()).await;
    tokio::time::sleep(Duration::from_millis(150)).await;

    let probe_request = request("x");
    let jobs = (0..5).map(|_| router.route(&probe_request, deadline()));
    let results = futures_util::future::join_all(jobs).await;

    let outcomes: Vec<Outcome> = results.iter().map(|r| r.attempts[0].outcome).collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Served).count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == Outcome::BreakerOpen)
            .count(),
        4,
        "{outcomes:?}"
    );
    assert_eq!(lane.requests(), 2);
}

#[tokio::test]
async fn request_errors_do_not_trip_the_breaker() {
    let lane = TestServer::always(Reply::json(
        400,
        r#"{"error":{"message":"bad request","type":"invalid_request_error"}}"#,
    ))
    .await;
    let project =
        Project::new(
            &[],
            &[LaneSpec::new("strict", lane.base_url())
                .with("breaker: { failures: 1, cooldown: 60s }")],
        );
    let router = project.router(&[]);
    for _ in 0..3 {
        let routed = router
            .route(&request("x"), Deadline::after(Duration::from_secs(5)))
            .await;
        assert_eq!(routed.attempts[0].outcome, Outcome::Error);
    }
    assert_eq!(lane.requests(), 3, "a 4xx is our fault, not the lane's");
}

#[tokio::test]
async fn max_inflight_caps_concurrent_requests_and_reports_queue_wait() {
    let lane =
        TestServer::always(Reply::completion("ok", "m").after(Duration::from_millis(100))).await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("capped", lane.base_url()).with("max_inflight: 2")],
    );
    let router = project.router(&[]);

    let jobs = (0..10).map(|i| {
        let request = request(&format!("job {i}"));
        let router = &router;
        async move {
            router
                .route(&request, Deadline::after(Duration::from_secs(10)))
                .await
        }
    });
    let results = futures_util::future::join_all(jobs).await;

    assert!(results.iter().all(|r| r.completion.is_some()));
    assert_eq!(lane.requests(), 10);
    assert_eq!(lane.max_in_flight(), 2);
    let longest_queue = results
        .iter()
        .map(|r| r.attempts[0].queue_ms)
        .max()
        .unwrap();
    // Ten 100 ms calls two at a time: the last pair waited for four pairs.
    assert!(
        longest_queue >= 300,
        "queue wait is reported apart from the call: {longest_queue} ms"
    );
    assert!(
        results
            .iter()
            .all(|r| r.attempts[0].call_ms >= 90 && r.attempts[0].call_ms < 1000)
    );
    let metrics = router.render_prometheus();
    assert!(
        metrics.contains("canary_lane_queue_seconds_count{lane=\"capped\"} 10"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_queue_wait_past_the_deadline_is_a_queue_timeout() {
    let lane = TestServer::always(Reply::completion("ok", "m").after(Duration::from_secs(2))).await;
    let project = Project::new(
        &[],
        &[LaneSpec::new("one", lane.base_url()).with("max_inflight: 1")],
    );
    let router = project.router(&[]);

    let deadline = Deadline::after(Duration::from_millis(300));
    let (first, second) = (request("a"), request("b"));
    let (a, b) = tokio::join!(
        router.route(&first, deadline),
        router.route(&second, deadline)
    );

    let mut outcomes = [a.attempts[0].outcome, b.attempts[0].outcome];
    outcomes.sort();
    assert_eq!(outcomes, [Outcome::Timeout, Outcome::QueueTimeout]);
    assert_eq!(
        lane.requests(),
        1,
        "the queued job never reached the server"
    );
    let queued = if a.attempts[0].outcome == Outcome::QueueTimeout {
        &a
    } else {
        &b
    };
    assert!(queued.attempts[0].queue_ms >= 250, "{:?}", queued.attempts);
}

#[tokio::test]
async fn a_hung_free_lane_leaves_the_paid_lane_its_time() {
    let free = TestServer::always(Reply::Hang).await;
    let paid =
        TestServer::always(Reply::completion("paid answer", "m").after(Duration::from_millis(300)))
            .await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("free", free.base_url())
                .with("kill_switch_env: FREE_LANE")
                .with("max_share: 0.5"),
            LaneSpec::new("paid", paid.base_url()),
        ],
    );
    let router = project.router_with_process_env();

    let routed = router
        .route(&request("x"), Deadline::after(Duration::from_secs(1)))
        .await;

    assert_eq!(routed.completion.expect("paid still had time").lane, "paid");
    assert!(
        routed.elapsed < Duration::from_millis(1000),
        "{:?}",
        routed.elapsed
    );
    if !free_lane_off() {
        let free_attempt = &routed.attempts[0];
        assert_eq!(free_attempt.outcome, Outcome::Timeout);
        assert!(
            (450..700).contains(&free_attempt.call_ms),
            "free got half: {free_attempt:?}"
        );
    }
}

#[tokio::test]
async fn lanes_are_tried_in_configured_order_and_the_first_answer_wins() {
    let first = TestServer::always(Reply::completion("first", "m")).await;
    let second = TestServer::always(Reply::completion("second", "m")).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("one", first.base_url()),
            LaneSpec::new("two", second.base_url()),
        ],
    );
    let router = project.router(&[]);
    let routed = router
        .route(&request("x"), Deadline::after(Duration::from_secs(5)))
        .await;
    assert_eq!(routed.completion.unwrap().text, "first");
    assert_eq!(second.requests(), 0);
    let pinned = router
        .route_to(
            "two",
            &request("x"),
            Deadline::after(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(pinned.completion.unwrap().text, "second");
}
