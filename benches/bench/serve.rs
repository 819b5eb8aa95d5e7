//! `serve`: an OpenAI-compatible lane on loopback that answers every chat completion after a
//! fixed latency, for measuring canary and its peers against the same lane
//! (`scripts/bench`'s peers part).
//!
//! ```text
//! cargo bench --bench bench -- serve [--latency 50ms] [--port N] [--model NAME]
//! ```
//!
//! It prints `listening on http://127.0.0.1:PORT/v1` on stdout and serves until SIGTERM or
//! SIGINT, then prints what it served on stderr. Routes:
//!
//! - `POST /v1/chat/completions`: after the latency, a chat completion whose text depends on
//!   the prompt (so answers are not all alike), with the request's model, usage and
//!   `finish_reason: stop`;
//! - `GET /v1/models`: the model list, at once;
//! - `GET /stats`: at once, `{"chat_completions", "requests"}` so far, and since the previous
//!   `/stats`: `max_in_flight`, the most chat completions in flight at once, and `busy_s`, the
//!   time from the first chat completion's arrival to the last one's answer. A caller that reads
//!   it before and after each measured tool gets them per tool: `busy_s` is how long the lane
//!   saw that tool's traffic, its wall time less its startup and shutdown.
//!
//! The test support server answers one request per connection (`Connection: close`); clients
//! that keep connections alive (all of the peers, and canary through reqwest) would be measured
//! on connection setup instead. This one speaks HTTP/1.1 keep-alive (Content-Length or chunked
//! request bodies, `Expect: 100-continue`), and every connection is its own task, so N
//! concurrent requests all finish after about one latency: the lane never serialises them.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head accepted, and largest body.
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 16 * 1024 * 1024;
/// A connection with no request for this long is closed; far longer than any client's pool
/// keeps an idle connection, so a client never reuses one the server just dropped.
const IDLE: Duration = Duration::from_secs(300);

/// What `serve` was asked to do.
struct Options {
    /// Time between the end of a request and its answer.
    latency: Duration,
    /// Port on 127.0.0.1 (0: any free one).
    port: u16,
    /// Model named in answers when the request names none, and listed by `/v1/models`.
    model: String,
}

impl Options {
    fn parse(args: &[&str]) -> anyhow::Result<Options> {
        let mut options = Options {
            latency: Duration::from_millis(50),
            port: 0,
            model: "bench-model".to_string(),
        };
        let mut args = args.iter();
        while let Some(&flag) = args.next() {
            let mut value = || {
                args.next()
                    .copied()
                    .with_context(|| format!("{flag} needs a value"))
            };
            match flag {
                "--latency" => {
                    let text = value()?;
                    options.latency = humantime::parse_duration(text)
                        .with_context(|| format!("--latency {text}: expected e.g. 50ms"))?;
                }
                "--port" => {
                    let text = value()?;
                    options.port = text
                        .parse()
                        .with_context(|| format!("--port {text}: expected 0 to 65535"))?;
                }
                "--model" => options.model = value()?.to_string(),
                other => bail!(
                    "serve: unknown argument `{other}` (serve [--latency 50ms] [--port N] [--model NAME])"
                ),
            }
        }
        Ok(options)
    }
}

/// What the lane has done, for `/stats` and the line printed at exit.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    chat_completions: AtomicU64,
    in_flight: AtomicUsize,
    /// Peak of `in_flight` since the last `/stats`.
    max_in_flight: AtomicUsize,
    /// Peak of `in_flight` since start.
    max_in_flight_ever: AtomicUsize,
    /// First chat completion's arrival and last one's answer since the last `/stats`.
    busy: Mutex<Option<(Instant, Instant)>>,
}

impl Counters {
    /// Widens the busy window to cover `from..to`.
    fn busy(&self, from: Instant, to: Instant) {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        *busy = Some(match *busy {
            Some((first, last)) => (first.min(from), last.max(to)),
            None => (from, to),
        });
    }

    /// Seconds of the busy window since the last call, which starts a new one.
    fn take_busy_secs(&self) -> f64 {
        let window = self.busy.lock().unwrap_or_else(|p| p.into_inner()).take();
        window.map_or(0.0, |(first, last)| (last - first).as_secs_f64())
    }

    fn summary(&self) -> String {
        format!(
            "serve: {} chat completions, {} requests, at most {} in flight",
            self.chat_completions.load(Ordering::SeqCst),
            self.requests.load(Ordering::SeqCst),
            self.max_in_flight_ever.load(Ordering::SeqCst)
        )
    }
}

/// Counts a chat completion in flight for as long as it lives.
struct InFlight<'a>(&'a Counters);

impl<'a> InFlight<'a> {
    fn enter(counters: &'a Counters) -> InFlight<'a> {
        let now = counters.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        counters.max_in_flight.fetch_max(now, Ordering::SeqCst);
        counters.max_in_flight_ever.fetch_max(now, Ordering::SeqCst);
        InFlight(counters)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs `serve` until SIGTERM or SIGINT.
pub fn main(args: &[&str]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", options.port))
            .await
            .with_context(|| format!("cannot listen on 127.0.0.1:{}", options.port))?;
        let addr = listener.local_addr()?;
        let mut stdout = std::io::stdout();
        writeln!(stdout, "listening on http://{addr}/v1")?;
        stdout.flush()?;
        eprintln!(
            "serve: every chat completion answered after {}",
            humantime::format_duration(options.latency)
        );
        let counters = Arc::new(Counters::default());
        let options = Arc::new(options);
        tokio::select! {
            result = accept_loop(listener, options, counters.clone()) => result?,
            // The peers benchmark stops the lane with SIGTERM and reads this line.
            () = shutdown_signal() => {}
        }
        eprintln!("{}", counters.summary());
        Ok(())
    })
}

async fn accept_loop(
    listener: TcpListener,
    options: Arc<Options>,
    counters: Arc<Counters>,
) -> anyhow::Result<()> {
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors and the like: the lane stays up for the next one.
            Err(err) => {
                eprintln!("serve: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let (options, counters) = (options.clone(), counters.clone());
        tokio::spawn(async move {
            if let Err(err) = serve_connection(socket, &options, &counters).await {
                eprintln!("serve: connection dropped: {err}");
            }
        });
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// One parsed request.
struct Request {
    method: String,
    path: String,
    body: Vec<u8>,
    /// Whether the connection stays open after the answer.
    keep_alive: bool,
}

/// One response.
struct Response {
    status: u16,
    body: String,
}

impl Response {
    fn json(status: u16, body: serde_json::Value) -> Response {
        Response {
            status,
            body: body.to_string(),
        }
    }

    fn error(status: u16, message: &str) -> Response {
        Response::json(
            status,
            serde_json::json!({"error": {"message": message, "type": "invalid_request_error"}}),
        )
    }
}

/// Serves requests on one connection until the client closes it or asks to.
async fn serve_connection(
    mut socket: TcpStream,
    options: &Options,
    counters: &Counters,
) -> std::io::Result<()> {
    let mut buffer = Vec::with_capacity(8 * 1024);
    loop {
        let request = match tokio::time::timeout(IDLE, read_request(&mut socket, &mut buffer)).await
        {
            Ok(Ok(Some(request))) => request,
            // The client closed the connection between requests, or it sat idle.
            Ok(Ok(None)) | Err(_) => return Ok(()),
            Ok(Err(err)) if err.kind() == std::io::ErrorKind::InvalidData => {
                let response = Response::error(400, &err.to_string());
                return write_response(&mut socket, &response, false).await;
            }
            Ok(Err(err)) => return Err(err),
        };
        counters.requests.fetch_add(1, Ordering::SeqCst);
        let response = answer(&request, options, counters).await;
        write_response(&mut socket, &response, request.keep_alive).await?;
        if !request.keep_alive {
            return socket.shutdown().await;
        }
    }
}

/// The lane's answer to one request.
async fn answer(request: &Request, options: &Options, counters: &Counters) -> Response {
    let path = request.path.split('?').next().unwrap_or_default();
    match (request.method.as_str(), path) {
        ("POST", "/v1/chat/completions") => {
            let arrived = Instant::now();
            let _in_flight = InFlight::enter(counters);
            let Ok(body) = serde_json::from_slice::<serde_json::Value>(&request.body) else {
                return Response::error(400, "the body is not JSON");
            };
            if body["stream"].as_bool() == Some(true) {
                return Response::error(400, "this bench lane does not stream; send stream: false");
            }
            tokio::time::sleep(options.latency).await;
            let n = counters.chat_completions.fetch_add(1, Ordering::SeqCst) + 1;
            counters.busy(arrived, Instant::now());
            Response::json(200, completion(&body, &options.model, n))
        }
        ("GET", "/v1/models") => Response::json(
            200,
            serde_json::json!({"object": "list", "data": [
                {"id": options.model, "object": "model", "created": 1_700_000_000, "owned_by": "canary-bench"}
            ]}),
        ),
        ("GET", "/stats") => Response::json(
            200,
            serde_json::json!({
                "chat_completions": counters.chat_completions.load(Ordering::SeqCst),
                "requests": counters.requests.load(Ordering::SeqCst),
                "max_in_flight": counters.max_in_flight.swap(0, Ordering::SeqCst),
                "busy_s": counters.take_busy_secs(),
            }),
        ),
        _ => Response::error(404, &format!("no route {} {path}", request.method)),
    }
}

/// A chat completion as OpenAI returns it, answering the last user message.
fn completion(request: &serde_json::Value, default_model: &str, n: u64) -> serde_json::Value {
    let model = request["model"].as_str().unwrap_or(default_model);
    let messages = request["messages"].as_array().map(Vec::as_slice);
    let prompt = messages
        .unwrap_or_default()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            serde_json::Value::String(text) => text.clone(),
            // Content parts: the text ones, joined.
            serde_json::Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        })
        .unwrap_or_default();
    let text = answer_text(&prompt);
    let prompt_chars: usize = messages
        .unwrap_or_default()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .map(str::len)
        .sum();
    // About four characters a token, as OpenAI's tokenizers average on English.
    let prompt_tokens = prompt_chars.div_ceil(4) + 7;
    let completion_tokens = text.len().div_ceil(4);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    serde_json::json!({
        "id": format!("chatcmpl-bench{n:012}"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": "fp_bench",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": null,
            "finish_reason": "stop"
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens
        }
    })
}

/// A short answer that depends on the prompt only: the same prompt always gets the same answer
/// (a lane at temperature 0), different prompts mostly get different ones.
fn answer_text(prompt: &str) -> String {
    const OPENINGS: [&str; 6] = [
        "Yes.",
        "No.",
        "It depends on the context.",
        "Here is a short answer.",
        "In short:",
        "The answer is",
    ];
    // FNV-1a: stable across runs and platforms, unlike std's hasher.
    let hash = prompt.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let topic: Vec<&str> = prompt.split_whitespace().take(6).collect();
    format!(
        "{} {} ({} words asked; reference {}).",
        OPENINGS[(hash % OPENINGS.len() as u64) as usize],
        topic.join(" ").trim_end_matches(['?', '.', '!']),
        prompt.split_whitespace().count(),
        hash % 100_000
    )
}

/// Reads one request from `socket`, keeping bytes past its end in `buffer` for the next one.
/// `Ok(None)`: the client closed the connection before a new request began.
async fn read_request(
    socket: &mut TcpStream,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Option<Request>> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let head_end = loop {
        if let Some(pos) = find(buffer, b"\r\n\r\n") {
            break pos + 4;
        }
        if buffer.len() > MAX_HEAD {
            return Err(invalid("request head too large"));
        }
        if read_more(socket, buffer).await? == 0 {
            return if buffer.is_empty() {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
    };
    let head = std::str::from_utf8(&buffer[..head_end])
        .map_err(|_| invalid("request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split_whitespace();
    let (Some(method), Some(path), Some(version)) = (first.next(), first.next(), first.next())
    else {
        return Err(invalid("malformed request line"));
    };
    let (method, path) = (method.to_string(), path.to_string());
    let mut keep_alive = version == "HTTP/1.1";
    let mut length = 0usize;
    let mut chunked = false;
    let mut expect_continue = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            return Err(invalid("malformed header line"));
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                length = value.parse().map_err(|_| invalid("bad Content-Length"))?;
            }
            "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
            "connection" => {
                let value = value.to_ascii_lowercase();
                if value.contains("close") {
                    keep_alive = false;
                } else if value.contains("keep-alive") {
                    keep_alive = true;
                }
            }
            "expect" => expect_continue = value.eq_ignore_ascii_case("100-continue"),
            _ => {}
        }
    }
    if length > MAX_BODY {
        return Err(invalid("request body too large"));
    }
    buffer.drain(..head_end);
    if expect_continue {
        socket.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    let body = if chunked {
        read_chunked(socket, buffer).await?
    } else {
        while buffer.len() < length {
            if read_more(socket, buffer).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        buffer.drain(..length).collect()
    };
    Ok(Some(Request {
        method,
        path,
        body,
        keep_alive,
    }))
}

/// Reads a chunked body (RFC 9112 §7.1), trailers included, from `buffer` and `socket`.
async fn read_chunked(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<Vec<u8>> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(pos) = find(buffer, b"\r\n") {
                break pos;
            }
            if read_more(socket, buffer).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        };
        let size_text = std::str::from_utf8(&buffer[..line_end])
            .map_err(|_| invalid("bad chunk size"))?
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| invalid("bad chunk size"))?;
        buffer.drain(..line_end + 2);
        if size == 0 {
            // Trailers, up to an empty line.
            loop {
                if let Some(pos) = find(buffer, b"\r\n") {
                    buffer.drain(..pos + 2);
                    if pos == 0 {
                        return Ok(body);
                    }
                    continue;
                }
                if read_more(socket, buffer).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err(invalid("request body too large"));
        }
        while buffer.len() < size + 2 {
            if read_more(socket, buffer).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        body.extend(buffer.drain(..size));
        buffer.drain(..2);
    }
}

async fn read_more(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 8 * 1024];
    let n = socket.read(&mut chunk).await?;
    buffer.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn write_response(
    socket: &mut TcpStream,
    response: &Response,
    keep_alive: bool,
) -> std::io::Result<()> {
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Status",
    };
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let message = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{}",
        response.status,
        response.body.len(),
        response.body
    );
    socket.write_all(message.as_bytes()).await
}
