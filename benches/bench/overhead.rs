//! `overhead`: what canary's router adds to a call, against a bare reqwest client.
//!
//! Both variants talk to the same loopback server, which answers every request at once over
//! HTTP/1.1 keep-alive. The bare variant is what a caller would write without canary: the same
//! reqwest features and settings, the same JSON body, the response parsed as JSON. The router
//! variant is `canary run`'s call: `Router::route_to` with a freshly minted deadline, and the
//! breaker, admission, the lane's in-flight semaphore, the audit log (to a real file) and the
//! metrics all on. The two alternate in rounds so a change in machine load hits both alike.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use canary::completion::{ChatRequest, Params};
use canary::deadline::Deadline;
use canary::router::Router;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{LaneSpec, Project};

/// In-flight calls of the throughput measurement (the lane's `max_inflight` too).
const CONCURRENCY: usize = 8;
/// The targets.
const TARGET_ADDED_P50_US: f64 = 50.0;
const TARGET_THROUGHPUT_LOST_PCT: f64 = 5.0;
const MODEL: &str = "test-model";
const LANE: &str = "lane";

/// Sizes of one run.
struct Size {
    /// Sequential calls per variant, over all rounds (and as many again at concurrency 8).
    calls: usize,
    rounds: usize,
    warmup: usize,
}

pub fn main(smoke: bool) -> anyhow::Result<()> {
    let size = if smoke {
        Size {
            calls: 500,
            rounds: 4,
            warmup: 50,
        }
    } else {
        Size {
            calls: 20_000,
            rounds: 10,
            warmup: 500,
        }
    };
    // The runtime `canary` itself builds; the jobs run inside `block_on` as `canary run`'s
    // workers do.
    let runtime = canary::runtime().context("start the runtime")?;
    let addr = start_instant_server().context("start the loopback server")?;
    runtime.block_on(measure(addr, &size))
}

/// The two ways of making the same call.
struct Subjects {
    bare: BareClient,
    router: Router,
    request: ChatRequest,
    budget: Duration,
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Bare,
    Router,
}

impl Subjects {
    async fn call(&self, variant: Variant) -> anyhow::Result<()> {
        match variant {
            Variant::Bare => self.bare.call(&self.request).await,
            Variant::Router => {
                // The edge of the job, as in `canary run`: its one deadline is minted here.
                let deadline = Deadline::after(self.budget);
                let routed = self.router.route_to(LANE, &self.request, deadline).await?;
                ensure!(
                    routed.completion.is_some_and(|c| !c.text.is_empty()),
                    "the router did not serve: {:?}",
                    routed.attempts
                );
                Ok(())
            }
        }
    }

    /// `calls` calls one after another; each call's latency goes into `histogram` (ns).
    async fn sequential(
        &self,
        variant: Variant,
        calls: usize,
        histogram: &mut Histogram<u64>,
    ) -> anyhow::Result<()> {
        for _ in 0..calls {
            let start = Instant::now();
            self.call(variant).await?;
            histogram.saturating_record(nanos(start.elapsed()));
        }
        Ok(())
    }

    /// `calls` calls, `CONCURRENCY` at a time.
    async fn concurrent(&self, variant: Variant, calls: usize) -> anyhow::Result<Rate> {
        let next = AtomicUsize::new(0);
        let cpu = process_cpu();
        let start = Instant::now();
        let workers = (0..CONCURRENCY).map(|_| async {
            while next.fetch_add(1, Ordering::Relaxed) < calls {
                self.call(variant).await?;
            }
            anyhow::Ok(())
        });
        for result in futures_util::future::join_all(workers).await {
            result?;
        }
        let per_second = calls as f64 / start.elapsed().as_secs_f64();
        let cpu_us = process_cpu().saturating_sub(cpu) as f64 / calls as f64 / 1000.0;
        Ok(Rate { per_second, cpu_us })
    }
}

/// Throughput of one variant in one round.
struct Rate {
    per_second: f64,
    /// CPU time of the whole process (client, runtime workers, server) per call, in µs: the
    /// work a call costs, which other processes on the machine disturb far less than wall time.
    cpu_us: f64,
}

/// What a caller writes without canary: one reqwest client, post, read, parse.
struct BareClient {
    client: reqwest::Client,
    endpoint: String,
}

impl BareClient {
    fn new(endpoint: String) -> anyhow::Result<BareClient> {
        // The settings `OpenAiLane` uses, so only what canary adds differs.
        let client = reqwest::Client::builder()
            .retry(reqwest::retry::never())
            .no_proxy()
            .build()?;
        Ok(BareClient { client, endpoint })
    }

    async fn call(&self, request: &ChatRequest) -> anyhow::Result<()> {
        let mut body = json!({ "model": MODEL, "messages": request.messages, "stream": false });
        if let (Value::Object(map), Value::Object(params)) =
            (&mut body, serde_json::to_value(&request.params)?)
        {
            map.extend(params);
        }
        let response = self.client.post(&self.endpoint).json(&body).send().await?;
        ensure!(response.status().is_success(), "HTTP {}", response.status());
        let bytes = response.bytes().await?;
        let value: Value = serde_json::from_slice(&bytes)?;
        let text = value["choices"][0]["message"]["content"]
            .as_str()
            .context("no content in the answer")?;
        ensure!(!text.is_empty(), "empty answer");
        Ok(())
    }
}

/// Figures of one variant over all rounds.
struct Figures {
    latency: Histogram<u64>,
    /// Requests per second at `CONCURRENCY`, one per round.
    throughput: Vec<f64>,
    /// CPU µs per call at `CONCURRENCY`, one per round.
    cpu_us: Vec<f64>,
    /// p50 of each round's sequential calls (ns).
    round_p50: Vec<u64>,
}

impl Figures {
    fn new() -> anyhow::Result<Figures> {
        Ok(Figures {
            latency: histogram()?,
            throughput: Vec::new(),
            cpu_us: Vec::new(),
            round_p50: Vec::new(),
        })
    }
}

async fn measure(addr: SocketAddr, size: &Size) -> anyhow::Result<()> {
    let project = Project::new(
        &[],
        &[LaneSpec::new(LANE, format!("http://{addr}/v1"))
            .with(&format!("max_inflight: {CONCURRENCY}"))],
    );
    let audit_path = project
        .config
        .audit
        .clone()
        .context("the default config audits")?;
    let subjects = Subjects {
        bare: BareClient::new(format!("http://{addr}/v1/chat/completions"))?,
        router: project.router(&[]),
        request: ChatRequest::from_prompt(
            Some("Answer tersely."),
            "Is 17077 a prime number? Answer yes or no.",
            Params {
                temperature: Some(0.0),
                max_tokens: Some(64),
                seed: Some(7),
                ..Params::default()
            },
        ),
        budget: project.config.deadline,
    };

    // Warm up both: connections open, allocator and caches settled.
    for variant in [Variant::Bare, Variant::Router] {
        let mut scratch = histogram()?;
        subjects
            .sequential(variant, size.warmup, &mut scratch)
            .await?;
        subjects.concurrent(variant, size.warmup).await?;
    }

    let mut bare = Figures::new()?;
    let mut routed = Figures::new()?;
    let per_round = size.calls / size.rounds;
    let load_before = load_average();
    let started = Instant::now();
    for round in 0..size.rounds {
        // Alternate which goes first, so neither always runs on a warmer or quieter machine.
        let order = if round % 2 == 0 {
            [Variant::Bare, Variant::Router]
        } else {
            [Variant::Router, Variant::Bare]
        };
        for variant in order {
            let figures = match variant {
                Variant::Bare => &mut bare,
                Variant::Router => &mut routed,
            };
            let mut this_round = histogram()?;
            subjects
                .sequential(variant, per_round, &mut this_round)
                .await?;
            figures.round_p50.push(this_round.value_at_quantile(0.5));
            figures.latency.add(&this_round)?;
        }
        for variant in order {
            let rate = subjects.concurrent(variant, per_round).await?;
            let figures = match variant {
                Variant::Bare => &mut bare,
                Variant::Router => &mut routed,
            };
            figures.throughput.push(rate.per_second);
            figures.cpu_us.push(rate.cpu_us);
        }
        eprintln!(
            "overhead: round {}/{}: p50 bare {:.1} µs, router {:.1} µs; {CONCURRENCY} in flight: bare {:.0}/s ({:.1} µs CPU), router {:.0}/s ({:.1} µs CPU)",
            round + 1,
            size.rounds,
            micros(bare.round_p50[round]),
            micros(routed.round_p50[round]),
            bare.throughput[round],
            bare.cpu_us[round],
            routed.throughput[round],
            routed.cpu_us[round],
        );
    }
    let took = started.elapsed();
    let load_after = load_average();

    subjects
        .router
        .flush_audit()
        .context("flush the audit log")?;
    let audited = std::fs::read_to_string(&audit_path)
        .with_context(|| format!("read {}", audit_path.display()))?
        .lines()
        .count();
    let router_calls = size.warmup * 2 + size.calls * 2;
    ensure!(
        audited == router_calls,
        "expected {router_calls} audit lines, found {audited}"
    );

    print_report(size, &bare, &routed, took, (load_before, load_after));
    Ok(())
}

fn print_report(
    size: &Size,
    bare: &Figures,
    routed: &Figures,
    took: Duration,
    load: (Option<f64>, Option<f64>),
) {
    let at = |f: &Figures, q: f64| micros(f.latency.value_at_quantile(q));
    let added = |q: f64| at(routed, q) - at(bare, q);
    let round_added: Vec<f64> = bare
        .round_p50
        .iter()
        .zip(&routed.round_p50)
        .map(|(b, r)| micros(*r) - micros(*b))
        .collect();
    let round_lost: Vec<f64> = bare
        .throughput
        .iter()
        .zip(&routed.throughput)
        .map(|(b, r)| (1.0 - r / b) * 100.0)
        .collect();
    let lost = median(&round_lost);
    let bare_rate = median(&bare.throughput);
    let router_rate = median(&routed.throughput);
    let bare_cpu = median(&bare.cpu_us);
    let router_cpu = median(&routed.cpu_us);
    let load = match load {
        (Some(before), Some(after)) => {
            format!(" The 1-minute load average was {before:.1} before and {after:.1} after.")
        }
        _ => String::new(),
    };

    println!("### Router overhead\n");
    println!(
        "{calls} sequential calls per variant and {calls} more at concurrency {CONCURRENCY}, in {rounds} \
         alternating rounds ({secs:.0} s in all), to a loopback server answering at once over HTTP/1.1 \
         keep-alive: a bare reqwest client (same features and settings, same JSON body, answer parsed \
         as JSON) against `Router::route_to` as `canary run` calls it (jobs polled by `block_on`, a \
         fresh deadline per job, breaker, admission, a lane semaphore of {CONCURRENCY}, an audit line \
         per job appended to a real file, metrics). Latency from HDR histograms of every sequential \
         call; throughput and CPU per call (all threads of the process, from `schedstat`) are medians \
         over rounds, the throughput lost the median of each round's pair. {cores} cores shared with \
         other work.{load}\n",
        calls = size.calls,
        rounds = size.rounds,
        secs = took.as_secs_f64(),
        cores = std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "| variant | p50 µs | p90 µs | p99 µs | p99.9 µs | req/s at concurrency {CONCURRENCY} | CPU µs per call |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, figures, rate, cpu) in [
        ("bare reqwest", bare, bare_rate, bare_cpu),
        ("canary router", routed, router_rate, router_cpu),
    ] {
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {rate:.0} | {cpu:.1} |",
            at(figures, 0.5),
            at(figures, 0.9),
            at(figures, 0.99),
            at(figures, 0.999),
        );
    }
    println!(
        "| **added by the router** | **{:+.1}** | {:+.1} | **{:+.1}** | {:+.1} | **{lost:.1} % lost** | {:+.1} ({:+.0} %) |",
        added(0.5),
        added(0.9),
        added(0.99),
        added(0.999),
        router_cpu - bare_cpu,
        (router_cpu / bare_cpu - 1.0) * 100.0,
    );
    println!(
        "\nPer round, the p50 added ranged {:+.1} to {:+.1} µs and the throughput lost {:.1} to {:.1} %.\n",
        min(&round_added),
        max(&round_added),
        min(&round_lost),
        max(&round_lost),
    );
    println!(
        "Target: under {TARGET_ADDED_P50_US:.0} µs added at p50: **{}** ({:+.1} µs); under \
         {TARGET_THROUGHPUT_LOST_PCT:.0} % throughput lost: **{}** ({lost:.1} %).\n",
        pass(added(0.5) < TARGET_ADDED_P50_US),
        added(0.5),
        pass(lost < TARGET_THROUGHPUT_LOST_PCT),
    );
}

/// CPU time of every thread of this process so far, in ns (Linux `schedstat`; 0 elsewhere).
fn process_cpu() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A server on 127.0.0.1:0 that answers every request with the same chat completion at once,
/// keeping connections alive. It runs on a thread of its own so both variants share its cost
/// equally and it never waits behind the client's tasks.
fn start_instant_server() -> anyhow::Result<SocketAddr> {
    let response: Arc<[u8]> = completion_response().into();
    crate::loopback::serve_on_thread("loopback-lane", move |socket| {
        serve_keep_alive(socket, response.clone())
    })
}

/// The whole response: the chat completion a provider would send, with its headers.
fn completion_response() -> Vec<u8> {
    let body = json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": MODEL,
        "system_fingerprint": "fp-bench",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Yes."}}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 2, "total_tokens": 23}
    })
    .to_string();
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers requests on one connection until the client closes it.
async fn serve_keep_alive(mut socket: TcpStream, response: Arc<[u8]>) {
    let _ = socket.set_nodelay(true);
    let mut buffer = Vec::with_capacity(16 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        // Read until one whole request (head and `Content-Length` body) is buffered.
        let request_len = loop {
            if let Some(len) = complete_request_len(&buffer) {
                break len;
            }
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        buffer.drain(..request_len);
        if socket.write_all(&response).await.is_err() {
            return;
        }
    }
}

/// The length of the first request in `buffer`, once all of it is there.
fn complete_request_len(buffer: &[u8]) -> Option<usize> {
    let head_end = buffer.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buffer[..head_end]).ok()?;
    let body_len = head
        .split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    (buffer.len() >= head_end + body_len).then_some(head_end + body_len)
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    // 1 ns to 60 s at 3 significant digits.
    Ok(Histogram::new_with_bounds(1, 60_000_000_000, 3)?)
}

fn nanos(duration: Duration) -> u64 {
    duration.as_nanos().min(u128::from(u64::MAX)) as u64
}

fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

/// The 1-minute load average, to show how busy the shared machine was.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
