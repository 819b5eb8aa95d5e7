//! `deadline`: how far past its absolute deadline a job ends when its lane never answers.
//!
//! Jobs go through `Router::route_to` as in `canary run`: workers side by side inside
//! `block_on`, each minting its job's 200 ms deadline when it takes the job. The lane is a real
//! server on loopback that either hangs (reads the request, never answers) or trickles (headers
//! at once, then one byte every 50 ms of a body that would take minutes). The overshoot of a job
//! is the instant `route_to` returned minus the job's deadline. Two reference rows run the same
//! jobs without the router: a bare tokio timer (what the runtime itself achieves) and a bare
//! reqwest client bounded by the same deadline (what the HTTP stack achieves).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use canary::completion::{ChatRequest, Params};
use canary::deadline::Deadline;
use canary::outcome::Outcome;
use canary::router::Router;
use hdrhistogram::Histogram;
use tokio::time::{Instant, timeout_at};

use crate::support::{LaneSpec, Project, Reply, TestServer};

const BUDGET: Duration = Duration::from_millis(200);
const IN_FLIGHT: usize = 100;
/// The target for the p99 overshoot.
const TARGET_P99: Duration = Duration::from_millis(10);
const LANE: &str = "lane";

/// One measured row.
struct Case {
    name: &'static str,
    reply: Reply,
    /// The lane's `max_inflight`.
    cap: usize,
    via: Via,
}

/// What a job goes through.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    /// canary's router, as `canary run` calls it.
    Router,
    /// Reference: a bare reqwest client under `timeout_at` of the job's deadline.
    BareReqwest,
    /// Reference: only `timeout_at` of the job's deadline, no network at all.
    TimerOnly,
}

/// What one row measured.
struct Measured {
    /// Overshoot past the deadline, µs.
    overshoot: Histogram<u64>,
    /// Jobs that ended before their deadline (refused fast, `budget_exhausted`).
    early: usize,
    outcomes: BTreeMap<String, usize>,
    took: Duration,
}

pub fn main(smoke: bool) -> anyhow::Result<()> {
    let jobs = if smoke { 50 } else { 1_000 };
    // The runtime `canary` itself builds.
    let runtime = canary::runtime().context("start the runtime")?;
    runtime.block_on(run(jobs))
}

async fn run(jobs: usize) -> anyhow::Result<()> {
    let trickle = Reply::Trickle {
        total: 100_000,
        every: Duration::from_millis(50),
    };
    let cases = [
        Case {
            name: "hung (accepts, reads, never answers)",
            reply: Reply::Hang,
            cap: IN_FLIGHT,
            via: Via::Router,
        },
        Case {
            name: "trickling (headers, then 1 byte / 50 ms)",
            reply: trickle,
            cap: IN_FLIGHT,
            via: Via::Router,
        },
        Case {
            name: "hung, lane cap 10: most jobs wait in the queue",
            reply: Reply::Hang,
            cap: 10,
            via: Via::Router,
        },
        Case {
            name: "*reference:* hung, bare reqwest, no router",
            reply: Reply::Hang,
            cap: IN_FLIGHT,
            via: Via::BareReqwest,
        },
        Case {
            name: "*reference:* a tokio timer alone, no lane",
            reply: Reply::Hang,
            cap: IN_FLIGHT,
            via: Via::TimerOnly,
        },
    ];
    let mut results = Vec::new();
    for case in &cases {
        eprintln!("deadline: {} ({jobs} jobs)", case.name);
        let measured = measure(case, jobs).await?;
        eprintln!(
            "deadline: {}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            case.name,
            ms(measured.overshoot.value_at_quantile(0.5)),
            ms(measured.overshoot.value_at_quantile(0.99)),
            ms(measured.overshoot.max()),
        );
        results.push(measured);
    }
    print_report(jobs, &cases, &results);
    Ok(())
}

/// Everything a job needs, shared by the workers of one row.
struct Subject {
    via: Via,
    router: Router,
    request: ChatRequest,
    client: reqwest::Client,
    endpoint: String,
}

async fn measure(case: &Case, jobs: usize) -> anyhow::Result<Measured> {
    let server = TestServer::always(case.reply.clone()).await;
    // A breaker would open after a few timeouts and turn the rest into instant refusals that
    // never reach the network: set its threshold out of reach to measure every job's deadline.
    let project = Project::new(
        &[],
        &[LaneSpec::new(LANE, server.base_url())
            .with(&format!("max_inflight: {}", case.cap))
            .with("breaker: { failures: 1000000, cooldown: 1s }")],
    );
    let subject = Subject {
        via: case.via,
        router: project.router(&[]),
        request: ChatRequest::from_prompt(
            None,
            "Is 17077 a prime number? Answer yes or no.",
            Params::default(),
        ),
        client: reqwest::Client::builder()
            .retry(reqwest::retry::never())
            .no_proxy()
            .build()?,
        endpoint: format!("{}/chat/completions", server.base_url()),
    };

    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let workers = (0..IN_FLIGHT.min(jobs)).map(|_| {
        let (subject, next) = (&subject, &next);
        async move {
            let mut ended = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < jobs {
                ended.push(job(subject).await?);
            }
            anyhow::Ok(ended)
        }
    });
    let mut measured = Measured {
        overshoot: Histogram::new_with_bounds(1, 3_600_000_000, 3)?,
        early: 0,
        outcomes: BTreeMap::new(),
        took: Duration::ZERO,
    };
    for worker in futures_util::future::join_all(workers).await {
        for (outcome, overshoot) in worker? {
            *measured.outcomes.entry(outcome).or_default() += 1;
            match overshoot {
                Some(past) => measured
                    .overshoot
                    .saturating_record((past.as_micros() as u64).max(1)),
                None => measured.early += 1,
            }
        }
    }
    measured.took = started.elapsed();
    ensure!(
        case.via == Via::TimerOnly || server.requests() > 0,
        "the lane server saw no request: the jobs never reached the network"
    );
    Ok(measured)
}

/// One job: how it ended, and how long after its deadline (`None`: before it).
async fn job(subject: &Subject) -> anyhow::Result<(String, Option<Duration>)> {
    // The edge of the job, as in `canary run`: its one deadline is minted here.
    let deadline = Deadline::after(BUDGET);
    let outcome = match subject.via {
        Via::Router => {
            let routed = subject
                .router
                .route_to(LANE, &subject.request, deadline)
                .await?;
            ensure!(
                routed.completion.is_none(),
                "a lane that never answers served a job"
            );
            let attempt = routed.attempts.last().context("a job with no attempt")?;
            attempt.outcome.to_string()
        }
        Via::BareReqwest => {
            let call = async {
                let response = subject
                    .client
                    .post(&subject.endpoint)
                    .json(&subject.request.messages)
                    .send()
                    .await?;
                response.bytes().await
            };
            match timeout_at(deadline.instant(), call).await {
                Ok(_) => "answered".to_string(),
                Err(_) => Outcome::Timeout.to_string(),
            }
        }
        Via::TimerOnly => {
            let _ = timeout_at(deadline.instant(), std::future::pending::<()>()).await;
            Outcome::Timeout.to_string()
        }
    };
    let ended = Instant::now();
    let overshoot = (ended >= deadline.instant()).then(|| ended - deadline.instant());
    Ok((outcome, overshoot))
}

fn print_report(jobs: usize, cases: &[Case], results: &[Measured]) {
    println!("### Deadline precision\n");
    println!(
        "{jobs} jobs per row, each with a {budget} ms deadline minted when a worker takes it, \
         {IN_FLIGHT} workers side by side in `block_on` as in `canary run`, through \
         `Router::route_to` to one lane on a loopback server that never completes an answer (the \
         breaker's threshold set out of reach, so every job reaches the network or the queue). \
         Overshoot is when the call returned minus the job's absolute deadline, from an HDR \
         histogram; \"early\" counts jobs refused before their deadline. In the third row the \
         lane's `max_inflight` is 10, so most jobs spend their deadline waiting for a permit. The \
         two reference rows run the same jobs without the router.\n",
        budget = BUDGET.as_millis(),
    );
    println!(
        "| lane server | in flight / lane cap | outcomes | overshoot p50 ms | p99 ms | max ms | early | wall s |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for (case, measured) in cases.iter().zip(results) {
        let outcomes: Vec<String> = measured
            .outcomes
            .iter()
            .map(|(outcome, n)| format!("{n} {outcome}"))
            .collect();
        println!(
            "| {} | {} / {} | {} | {:.2} | {:.2} | {:.2} | {} | {:.1} |",
            case.name,
            IN_FLIGHT.min(jobs),
            if case.via == Via::Router {
                case.cap.to_string()
            } else {
                "–".to_string()
            },
            outcomes.join(", "),
            ms(measured.overshoot.value_at_quantile(0.5)),
            ms(measured.overshoot.value_at_quantile(0.99)),
            ms(measured.overshoot.max()),
            measured.early,
            measured.took.as_secs_f64(),
        );
    }
    let worst = cases
        .iter()
        .zip(results)
        .filter(|(case, _)| case.via == Via::Router)
        .map(|(_, m)| m.overshoot.value_at_quantile(0.99))
        .max()
        .unwrap_or(0);
    let pass = Duration::from_micros(worst) < TARGET_P99;
    println!(
        "\nTarget: p99 overshoot under {} ms for every server through the router: **{}** (worst \
         p99 {:.2} ms).\n",
        TARGET_P99.as_millis(),
        if pass { "PASS" } else { "MISS" },
        ms(worst),
    );
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
