//! One absolute deadline bounds the whole attempt: connect, headers and every byte of the body.

use std::time::{Duration, Instant};

use canary::completion::{ChatRequest, Params};
use canary::deadline::Deadline;
use canary::outcome::Outcome;

use crate::support::{LaneSpec, Project, Reply, TestServer};

fn request() -> ChatRequest {
    ChatRequest::from_prompt(None, "Is 17077 a prime number?", Params::default())
}

#[tokio::test]
async fn slow_lane_never_outlives_budget() {
    let lane =
        TestServer::always(Reply::completion("late", "m").after(Duration::from_secs(5))).await;
    let project = Project::new(&[], &[LaneSpec::new("slow", lane.base_url())]);
    let router = project.router(&[]);

    let start = Instant::now();
    let routed = router
        .route(&request(), Deadline::after(Duration::from_millis(200)))
        .await;
    let took = start.elapsed();

    assert!(
        took < Duration::from_millis(350),
        "a 5 s stall held a 200 ms job for {took:?}"
    );
    assert!(routed.completion.is_none());
    assert_eq!(routed.attempts[0].outcome, Outcome::Timeout);
}

#[tokio::test]
async fn exhausted_ticket_never_reaches_the_network() {
    let lane = TestServer::always(Reply::completion("should not run", "m")).await;
    let project = Project::new(&["floor: 50ms"], &[LaneSpec::new("any", lane.base_url())]);
    let router = project.router(&[]);

    let spent = router
        .route(&request(), Deadline::after(Duration::ZERO))
        .await;
    let thin = router
        .route(&request(), Deadline::after(Duration::from_millis(40)))
        .await;

    assert_eq!(spent.attempts[0].outcome, Outcome::BudgetExhausted);
    assert_eq!(
        thin.attempts[0].outcome,
        Outcome::BudgetExhausted,
        "below the floor fails fast"
    );
    assert_eq!(lane.requests(), 0, "the server saw zero requests");
}

#[tokio::test]
async fn a_hung_socket_is_cut_at_the_deadline() {
    let lane = TestServer::always(Reply::Hang).await;
    let project = Project::new(&[], &[LaneSpec::new("hung", lane.base_url())]);
    let router = project.router(&[]);

    let start = Instant::now();
    let routed = router
        .route(&request(), Deadline::after(Duration::from_millis(300)))
        .await;

    assert!(
        start.elapsed() < Duration::from_millis(450),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(routed.attempts[0].outcome, Outcome::Timeout);
    assert_eq!(lane.requests(), 1);
}

#[tokio::test]
async fn a_trickling_body_cannot_hold_the_job_past_its_deadline() {
    // Headers arrive at once; the body comes one byte every 50 ms and would take 50 s.
    let lane = TestServer::always(Reply::Trickle {
        total: 1000,
        every: Duration::from_millis(50),
    })
    .await;
    let project = Project::new(&[], &[LaneSpec::new("trickle", lane.base_url())]);
    let router = project.router(&[]);

    let start = Instant::now();
    let routed = router
        .route(&request(), Deadline::after(Duration::from_millis(500)))
        .await;

    assert!(
        start.elapsed() < Duration::from_millis(650),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(routed.attempts[0].outcome, Outcome::Timeout);
}
