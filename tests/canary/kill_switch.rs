//! The kill switch: a lane switched off is gone for the process, and everything still serves.

use std::time::Duration;

use canary::completion::{ChatRequest, Params};
use canary::deadline::Deadline;
use canary::metrics::LaneStatus;
use canary::outcome::Outcome;

use crate::support::{LaneSpec, Project, Reply, TestServer};

fn request() -> ChatRequest {
    ChatRequest::from_prompt(None, "hello", Params::default())
}

#[tokio::test]
async fn a_lane_switched_off_by_env_receives_zero_requests() {
    let free = TestServer::always(Reply::completion("free", "m")).await;
    let paid = TestServer::always(Reply::completion("paid", "m")).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("free", free.base_url()).with("kill_switch_env: FREE_LANE"),
            LaneSpec::new("paid", paid.base_url()),
        ],
    );
    let router = project.router(&[("FREE_LANE", "off")]);

    for _ in 0..3 {
        let routed = router
            .route(&request(), Deadline::after(Duration::from_secs(3)))
            .await;
        assert_eq!(routed.completion.unwrap().lane, "paid");
        assert_eq!(routed.attempts[0].outcome, Outcome::Disabled);
    }
    assert_eq!(free.requests(), 0);
    assert_eq!(
        router.statuses()[0],
        ("free".to_string(), LaneStatus::Disabled)
    );
    let metrics = router.render_prometheus();
    assert!(
        metrics.contains("canary_lane_state{lane=\"free\",state=\"disabled\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_default_kill_switch_is_canary_lane_name() {
    let lane = TestServer::always(Reply::completion("x", "m")).await;
    let project = Project::new(&[], &[LaneSpec::new("free-tier", lane.base_url())]);
    let router = project.router(&[("CANARY_LANE_FREE_TIER", "OFF")]);
    let routed = router
        .route(&request(), Deadline::after(Duration::from_secs(3)))
        .await;
    assert_eq!(routed.attempts[0].outcome, Outcome::Disabled);
    assert_eq!(lane.requests(), 0);
}

#[tokio::test]
async fn enabled_false_removes_the_lane_and_the_rest_still_serves() {
    let free = TestServer::always(Reply::completion("free", "m")).await;
    let paid = TestServer::always(Reply::completion("paid", "m")).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("free", free.base_url()).with("enabled: false"),
            LaneSpec::new("paid", paid.base_url()),
        ],
    );
    let router = project.router(&[]);
    let routed = router
        .route(&request(), Deadline::after(Duration::from_secs(3)))
        .await;
    assert_eq!(routed.completion.unwrap().lane, "paid");
    assert_eq!(free.requests(), 0);
}

#[tokio::test]
async fn a_switched_off_lane_does_not_take_a_share_of_the_budget() {
    // With the first lane off, the second is last and keeps the whole deadline.
    let paid =
        TestServer::always(Reply::completion("paid", "m").after(Duration::from_millis(400))).await;
    let project = Project::new(
        &[],
        &[
            LaneSpec::new("free", "http://127.0.0.1:9/v1".into()).with("max_share: 0.5"),
            LaneSpec::new("paid", paid.base_url()).with("max_share: 0.5"),
        ],
    );
    let router = project.router(&[("CANARY_LANE_FREE", "off")]);
    let routed = router
        .route(&request(), Deadline::after(Duration::from_millis(600)))
        .await;
    assert_eq!(
        routed
            .completion
            .expect("last lane gets all that is left")
            .lane,
        "paid"
    );
}
