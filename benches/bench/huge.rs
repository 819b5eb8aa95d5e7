//! `huge`: peak memory while a lane returns a huge or endless body.
//!
//! A real server on loopback sends a 64 MiB body that looks like a valid chat completion (once
//! with its `Content-Length` announced, once chunked so its size is known only at the end) and
//! an endless chunked body. Each case runs in a child process of its own (this binary again,
//! told what to do by `CHILD_ENV`), so one case's peak cannot hide another's: the child routes
//! one job through canary's router and reports the outcome, the time it took and its peak
//! resident memory (`VmHWM` from `/proc/self/status`). An idle child that receives one small
//! answer is the baseline; raising the lane's `max_response_bytes` shows what bounds the peak.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, ensure};
use canary::completion::{ChatRequest, Params};
use canary::config::DEFAULT_MAX_RESPONSE_BYTES;
use canary::deadline::Deadline;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{LaneSpec, Project};

/// Set in a child's environment to the JSON of the `ChildCase` it runs.
const CHILD_ENV: &str = "CANARY_BENCH_HUGE_CASE";
const MIB: u64 = 1024 * 1024;
/// Size of the huge bodies.
const HUGE: u64 = 64 * MIB;
const LANE: &str = "lane";

/// What the loopback server sends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Body {
    /// A small chat completion.
    Small,
    /// `HUGE` bytes of a valid-looking completion, `Content-Length` announced.
    HugeAnnounced,
    /// `HUGE` bytes of a valid-looking completion, chunked: no size until the end.
    HugeChunked,
    /// A chunked completion whose text never ends.
    Endless,
}

impl Body {
    fn path(self) -> &'static str {
        match self {
            Body::Small => "small",
            Body::HugeAnnounced => "announced",
            Body::HugeChunked => "chunked",
            Body::Endless => "endless",
        }
    }

    fn from_path(path: &str) -> Body {
        [Body::HugeAnnounced, Body::HugeChunked, Body::Endless]
            .into_iter()
            .find(|body| path.starts_with(&format!("/{}/", body.path())))
            .unwrap_or(Body::Small)
    }

    fn describe(self) -> &'static str {
        match self {
            Body::Small => "one small answer (idle baseline)",
            Body::HugeAnnounced => "64 MiB JSON, `Content-Length` announced",
            Body::HugeChunked => "64 MiB JSON, chunked",
            Body::Endless => "endless chunked JSON",
        }
    }
}

/// One case, as the parent hands it to a child.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChildCase {
    server: SocketAddr,
    body: Body,
    /// The lane's `max_response_bytes`; `None` leaves canary's default.
    cap: Option<u64>,
}

/// What a child reports on stdout.
#[derive(Debug, Serialize, Deserialize)]
struct ChildReport {
    outcome: String,
    detail: Option<String>,
    /// Bytes of answer text, when the job was served.
    served_chars: Option<usize>,
    elapsed_ms: f64,
    peak_kib: u64,
}

pub fn main(smoke: bool) -> anyhow::Result<()> {
    if let Ok(case) = std::env::var(CHILD_ENV) {
        let case: ChildCase = serde_json::from_str(&case).context("read the child's case")?;
        return child(&case);
    }
    let sent = Arc::new(AtomicU64::new(0));
    let server = start_server(sent.clone()).context("start the loopback server")?;
    let default = DEFAULT_MAX_RESPONSE_BYTES;
    let mut cases = vec![
        (Body::Small, None),
        (Body::HugeChunked, None),
        (Body::Endless, None),
    ];
    if !smoke {
        cases = vec![
            (Body::Small, None),
            (Body::HugeAnnounced, None),
            (Body::HugeChunked, None),
            (Body::Endless, None),
            (Body::Endless, Some(4 * default)),
            (Body::Endless, Some(16 * default)),
            (Body::HugeChunked, Some(2 * HUGE)),
        ];
    }
    let mut rows = Vec::new();
    for (body, cap) in cases {
        let case = ChildCase { server, body, cap };
        sent.store(0, Ordering::SeqCst);
        let report = run_child(&case)?;
        let sent_bytes = sent.load(Ordering::SeqCst);
        eprintln!(
            "huge: {} (cap {}): {} in {:.0} ms, peak {:.1} MiB, server sent {:.1} MiB",
            body.describe(),
            mib(cap.unwrap_or(default)),
            report.outcome,
            report.elapsed_ms,
            report.peak_kib as f64 / 1024.0,
            sent_bytes as f64 / MIB as f64,
        );
        rows.push((case, report, sent_bytes));
    }
    print_report(&rows);
    Ok(())
}

/// Runs one case in a child process and reads its report.
fn run_child(case: &ChildCase) -> anyhow::Result<ChildReport> {
    let exe = std::env::current_exe().context("find the bench binary")?;
    let output = std::process::Command::new(exe)
        .arg("huge")
        .env(CHILD_ENV, serde_json::to_string(case)?)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("run the child")?;
    ensure!(
        output.status.success(),
        "the child for {:?} failed: {}",
        case.body,
        output.status
    );
    let line = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(line.trim()).with_context(|| format!("read the child's report `{line}`"))
}

/// The child: one job through the router, then its own peak memory.
fn child(case: &ChildCase) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("start the runtime")?;
    let report = runtime.block_on(async {
        let mut lane = LaneSpec::new(
            LANE,
            format!("http://{}/{}/v1", case.server, case.body.path()),
        );
        if let Some(cap) = case.cap {
            lane = lane.with(&format!("max_response_bytes: {cap}"));
        }
        let project = Project::new(&[], &[lane]);
        let router = project.router(&[]);
        let request = ChatRequest::from_prompt(None, "Say something long.", Params::default());
        let started = Instant::now();
        let routed = router
            .route_to(LANE, &request, Deadline::after(project.config.deadline))
            .await?;
        let elapsed = started.elapsed();
        let attempt = routed.attempts.last().context("a job with no attempt")?;
        anyhow::Ok(ChildReport {
            outcome: attempt.outcome.to_string(),
            detail: attempt.detail.clone(),
            served_chars: routed.completion.as_ref().map(|c| c.text.len()),
            elapsed_ms: elapsed.as_secs_f64() * 1000.0,
            peak_kib: 0,
        })
    })?;
    let report = ChildReport {
        peak_kib: peak_rss_kib()?,
        ..report
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", serde_json::to_string(&report)?)?;
    Ok(())
}

/// This process's peak resident set, `VmHWM`, in KiB.
fn peak_rss_kib() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/self/status")
}

fn print_report(rows: &[(ChildCase, ChildReport, u64)]) {
    let baseline = rows
        .iter()
        .find(|(case, _, _)| case.body == Body::Small)
        .map_or(0, |(_, report, _)| report.peak_kib);
    println!("### Huge and hostile bodies\n");
    println!(
        "Peak resident memory (`VmHWM`) of a child process that routes one job through canary's \
         router to a loopback server sending each body below, one fresh process per row, against \
         the baseline of the same child receiving one small answer. The lane's \
         `max_response_bytes` (default {}) is the cap; the last rows raise it. \"Sent\" is what \
         the server managed to write before the client stopped reading (socket buffers \
         included).\n",
        mib(DEFAULT_MAX_RESPONSE_BYTES),
    );
    println!(
        "| body | `max_response_bytes` | outcome | time to give up ms | peak RSS MiB | above baseline MiB | sent MiB |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    for (case, report, sent) in rows {
        let outcome = match (&report.detail, report.served_chars) {
            (_, Some(bytes)) if (bytes as u64) < MIB => {
                format!("{} ({bytes} bytes of text)", report.outcome)
            }
            (_, Some(bytes)) => format!(
                "{} ({:.1} MiB of text)",
                report.outcome,
                bytes as f64 / MIB as f64
            ),
            (Some(detail), None) => format!("{}: {detail}", report.outcome),
            (None, None) => report.outcome.clone(),
        };
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:+.1} | {:.1} |",
            case.body.describe(),
            mib(case.cap.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES)),
            outcome,
            report.elapsed_ms,
            report.peak_kib as f64 / 1024.0,
            (report.peak_kib as f64 - baseline as f64) / 1024.0,
            *sent as f64 / MIB as f64,
        );
    }
    // The bound holds when every refused body stays within a small multiple of the cap above
    // the baseline (the buffer doubles as it grows), whatever the body's size.
    let bounded = rows
        .iter()
        .filter(|(case, report, _)| case.body != Body::Small && report.served_chars.is_none())
        .all(|(case, report, _)| {
            let cap_kib = case.cap.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES) / 1024;
            report.peak_kib.saturating_sub(baseline) <= 2 * cap_kib + 8 * 1024
                && report.outcome == "error"
        });
    println!(
        "\nTarget: peak memory bounded by `max_response_bytes`, not by the body (every refused body \
         within twice the cap plus 8 MiB above the baseline, refused as an error): **{}**.\n",
        if bounded { "PASS" } else { "MISS" },
    );
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / MIB)
}

/// A server on 127.0.0.1:0, on a thread of its own (its buffers are not the child's), that
/// answers with the body its path names. `sent` counts the bytes written for the last request.
fn start_server(sent: Arc<AtomicU64>) -> anyhow::Result<SocketAddr> {
    crate::loopback::serve_on_thread("huge-lane", move |socket| serve(socket, sent.clone()))
}

const PREFIX: &str = r#"{"id":"chatcmpl-huge","object":"chat.completion","model":"huge","system_fingerprint":"fp-huge","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":""#;
const SUFFIX: &str = r#""}}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#;

async fn serve(mut socket: TcpStream, sent: Arc<AtomicU64>) {
    let Some(path) = read_request_path(&mut socket).await else {
        return;
    };
    let body = Body::from_path(&path);
    let result = match body {
        Body::Small => {
            let text = format!("{PREFIX}A short answer.{SUFFIX}");
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                text.len()
            );
            send(&mut socket, head.as_bytes(), &sent)
                .await
                .and(send(&mut socket, text.as_bytes(), &sent).await)
        }
        Body::HugeAnnounced => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {HUGE}\r\nConnection: close\r\n\r\n"
            );
            match send(&mut socket, head.as_bytes(), &sent).await {
                Ok(()) => stream_completion(&mut socket, Some(HUGE), false, &sent).await,
                Err(err) => Err(err),
            }
        }
        Body::HugeChunked | Body::Endless => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            let total = (body == Body::HugeChunked).then_some(HUGE);
            match send(&mut socket, head.as_bytes(), &sent).await {
                Ok(()) => stream_completion(&mut socket, total, true, &sent).await,
                Err(err) => Err(err),
            }
        }
    };
    // A client that stops reading closes the connection: the write fails, the stream ends.
    drop(result);
}

/// Writes a completion whose text is filler, `total` bytes in all (`None`: forever), in
/// chunked framing or raw.
async fn stream_completion(
    socket: &mut TcpStream,
    total: Option<u64>,
    chunked: bool,
    sent: &AtomicU64,
) -> std::io::Result<()> {
    const PIECE: usize = 64 * 1024;
    let filler: Vec<u8> = b"all work and no play makes a dull canary "
        .iter()
        .copied()
        .cycle()
        .take(PIECE)
        .collect();
    let mut left = total.map(|t| t - (PREFIX.len() + SUFFIX.len()) as u64);
    write_piece(socket, PREFIX.as_bytes(), chunked, sent).await?;
    loop {
        let len = left.map_or(PIECE, |l| l.min(PIECE as u64) as usize);
        if len == 0 {
            break;
        }
        write_piece(socket, &filler[..len], chunked, sent).await?;
        if let Some(l) = left.as_mut() {
            *l -= len as u64;
        }
    }
    write_piece(socket, SUFFIX.as_bytes(), chunked, sent).await?;
    if chunked {
        send(socket, b"0\r\n\r\n", sent).await?;
    }
    socket.shutdown().await
}

async fn write_piece(
    socket: &mut TcpStream,
    piece: &[u8],
    chunked: bool,
    sent: &AtomicU64,
) -> std::io::Result<()> {
    if chunked {
        send(socket, format!("{:x}\r\n", piece.len()).as_bytes(), sent).await?;
        send(socket, piece, sent).await?;
        send(socket, b"\r\n", sent).await
    } else {
        send(socket, piece, sent).await
    }
}

async fn send(socket: &mut TcpStream, bytes: &[u8], sent: &AtomicU64) -> std::io::Result<()> {
    socket.write_all(bytes).await?;
    sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// Reads one request (head and `Content-Length` body) and returns its path.
async fn read_request_path(socket: &mut TcpStream) -> Option<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(head_end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
            let body_len: usize = head
                .split("\r\n")
                .filter_map(|line| line.split_once(':'))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, value)| value.trim().parse().ok())
                .unwrap_or(0);
            if buffer.len() >= head_end + 4 + body_len {
                return head.split_whitespace().nth(1).map(str::to_string);
            }
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}
