//! A scriptable HTTP/1.1 server on 127.0.0.1:0 for driving lanes through every way a real
//! endpoint misbehaves: slow, hung, trickling, reset, refusing, rate-limiting, lying in a 200.
//!
//! It is a real server on a real socket: the lane under test talks to it through reqwest
//! exactly as it talks to a provider.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use canary::config::Config;
use canary::router::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A complete response.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Wait, then do the inner reply.
    After(Duration, Box<Reply>),
    /// Read the request and never answer (the socket stays open).
    Hang,
    /// Send headers announcing `total` bytes, then one byte every `every`.
    Trickle { total: usize, every: Duration },
    /// Send a chunked 200 body that never ends, as fast as the client reads.
    Endless,
    /// Read the request, then reset the connection (RST, not FIN).
    Reset,
}

impl Reply {
    /// A 200 chat completion with `text`, reporting `model`.
    pub fn completion(text: &str, model: &str) -> Reply {
        let body = serde_json::json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": model,
            "system_fingerprint": "fp-test",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
        });
        Reply::json(200, &body.to_string())
    }

    /// A JSON response with `status`.
    pub fn json(status: u16, body: &str) -> Reply {
        Reply::Respond {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    /// Adds a header to a `Respond`.
    pub fn with_header(self, name: &str, value: &str) -> Reply {
        match self {
            Reply::Respond {
                status,
                mut headers,
                body,
            } => {
                headers.push((name.into(), value.into()));
                Reply::Respond {
                    status,
                    headers,
                    body,
                }
            }
            other => other,
        }
    }

    /// Delays this reply.
    pub fn after(self, delay: Duration) -> Reply {
        Reply::After(delay, Box::new(self))
    }
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: String,
}

type Script = dyn Fn(usize, &Seen) -> Reply + Send + Sync;

/// A running test server.
pub struct TestServer {
    pub addr: std::net::SocketAddr,
    requests: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Starts a server whose reply to the n-th request (0-based) is `script(n, request)`.
    pub async fn start(
        script: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
    ) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let script: Arc<Script> = Arc::new(script);
        let requests = Arc::new(AtomicUsize::new(0));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (requests, in_flight, max_in_flight, seen) = (
                requests.clone(),
                in_flight.clone(),
                max_in_flight.clone(),
                seen.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let Ok((socket, _)) = listener.accept().await else {
                        return;
                    };
                    let (script, requests, in_flight, max_in_flight, seen) = (
                        script.clone(),
                        requests.clone(),
                        in_flight.clone(),
                        max_in_flight.clone(),
                        seen.clone(),
                    );
                    tokio::spawn(async move {
                        serve(socket, script, requests, in_flight, max_in_flight, seen).await;
                    });
                }
            })
        };
        TestServer {
            addr,
            requests,
            in_flight,
            max_in_flight,
            seen,
            task,
        }
    }

    /// A server that answers every request the same way.
    pub async fn always(reply: Reply) -> TestServer {
        TestServer::start(move |_, _| reply.clone()).await
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Most requests ever in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// An address where nothing listens: connections are refused.
pub async fn refused_base_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/v1")
}

struct InFlight(Arc<AtomicUsize>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve(
    mut socket: TcpStream,
    script: Arc<Script>,
    requests: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    let n = requests.fetch_add(1, Ordering::SeqCst);
    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _guard = InFlight(in_flight);
    max_in_flight.fetch_max(now, Ordering::SeqCst);
    seen.lock().unwrap().push(request.clone());
    let reply = script(n, &request);
    perform(&mut socket, reply).await;
}

async fn perform(socket: &mut TcpStream, mut reply: Reply) {
    loop {
        match reply {
            Reply::After(delay, inner) => {
                tokio::time::sleep(delay).await;
                reply = *inner;
            }
            Reply::Respond {
                status,
                headers,
                body,
            } => {
                let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
                for (name, value) in &headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str(&format!(
                    "Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                ));
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
                let _ = socket.shutdown().await;
                return;
            }
            Reply::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            Reply::Trickle { total, every } => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {total}\r\nConnection: close\r\n\r\n"
                );
                let _ = socket.write_all(head.as_bytes()).await;
                for _ in 0..total {
                    if socket.write_all(b" ").await.is_err() {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
                return;
            }
            Reply::Endless => {
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
                let _ = socket.write_all(head.as_bytes()).await;
                let chunk = vec![b'x'; 16 * 1024];
                let frame = [
                    format!("{:x}\r\n", chunk.len()).into_bytes(),
                    chunk,
                    b"\r\n".to_vec(),
                ]
                .concat();
                // Bounded so a broken client cannot keep the test server busy forever.
                for _ in 0..100_000 {
                    if socket.write_all(&frame).await.is_err() {
                        return;
                    }
                }
                return;
            }
            Reply::Reset => {
                let _ = socket.set_zero_linger();
                return; // dropping a socket with zero linger sends RST
            }
        }
    }
}

async fn read_request(socket: &mut TcpStream) -> Option<Seen> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split_whitespace();
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buffer.len() < header_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buffer[header_end..]).to_string();
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// One lane of a test config.
pub struct LaneSpec {
    pub name: &'static str,
    pub base_url: String,
    /// Extra YAML lines for the lane, each already indented by four spaces.
    pub extra: Vec<String>,
}

impl LaneSpec {
    pub fn new(name: &'static str, base_url: String) -> LaneSpec {
        LaneSpec {
            name,
            base_url,
            extra: Vec::new(),
        }
    }

    pub fn with(mut self, line: &str) -> LaneSpec {
        self.extra.push(format!("    {line}"));
        self
    }
}

/// A temporary canary project: a config file written to disk and loaded the way users load it.
pub struct Project {
    pub dir: tempfile::TempDir,
    pub config: Config,
}

impl Project {
    /// Writes `canary.yaml` with `top` (top-level YAML lines) and `lanes`, and loads it.
    pub fn new(top: &[&str], lanes: &[LaneSpec]) -> Project {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut yaml = String::new();
        if crate::stores::on_postgres() && !top.iter().any(|line| line.starts_with("store:")) {
            yaml.push_str(&format!("store: {}\n", crate::stores::fresh_database()));
        }
        for line in top {
            yaml.push_str(line);
            yaml.push('\n');
        }
        yaml.push_str("lanes:\n");
        for lane in lanes {
            yaml.push_str(&format!(
                "  - name: {}\n    kind: openai\n    base_url: {}\n    model: test-model\n",
                lane.name, lane.base_url
            ));
            for line in &lane.extra {
                yaml.push_str(line);
                yaml.push('\n');
            }
        }
        let path = dir.path().join("canary.yaml");
        std::fs::write(&path, yaml).expect("write config");
        let config = Config::load(&path).expect("test config loads");
        Project { dir, config }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("canary.yaml")
    }

    /// A router whose environment is exactly `env`: hermetic, whatever the process env holds.
    pub fn router(&self, env: &[(&str, &str)]) -> Router {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Router::new(&self.config, &move |name| env.get(name).cloned()).expect("router builds")
    }

    /// A router reading the real process environment, as the binary does (the kill-switch
    /// drill runs the suite with FREE_LANE=off).
    pub fn router_with_process_env(&self) -> Router {
        Router::new(&self.config, &|name| std::env::var(name).ok()).expect("router builds")
    }

    pub fn audit_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(".canary/audit.jsonl")).unwrap_or_default()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Whether the process runs the kill-switch drill (`FREE_LANE=off`).
pub fn free_lane_off() -> bool {
    std::env::var("FREE_LANE").is_ok_and(|v| v.trim().eq_ignore_ascii_case("off"))
}

/// The last user message of a chat request the server saw.
pub fn prompt_of(seen: &Seen) -> String {
    let body: serde_json::Value = serde_json::from_str(&seen.body).unwrap_or_default();
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

impl Project {
    /// Writes `prompts/<name>` with `yaml`.
    pub fn write_prompts(&self, name: &str, yaml: &str) {
        let dir = self.dir.path().join("prompts");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), yaml).unwrap();
    }

    /// Opens the project's store.
    pub fn store(&self) -> canary::store::Store {
        canary::store::Store::open(&self.config.store).expect("store opens")
    }

    /// Opens the project's store, its env vars (a password) read from `env` only.
    pub fn store_with_env(&self, env: &[(&str, &str)]) -> canary::store::Store {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        canary::store::Store::open_with_env(&self.config.store, &move |name| env.get(name).cloned())
            .expect("store opens")
    }
}

/// Runs the `canary` binary on a project, with a hermetic kill-switch environment plus `env`.
pub async fn canary_with_env(
    project: &Project,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_canary"));
    command
        .arg("-c")
        .arg(project.path())
        .args(args)
        .env_remove("FREE_LANE")
        .env_remove("CANARY_CONFIG")
        .env("NO_COLOR", "1");
    for (key, value) in env {
        command.env(key, value);
    }
    tokio::task::spawn_blocking(move || command.output().expect("run canary"))
        .await
        .unwrap()
}

/// Text of a byte buffer.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_string()
}
