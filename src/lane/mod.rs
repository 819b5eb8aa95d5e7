//! The seam to model endpoints: one trait, one failure vocabulary, one answer shape.

pub mod openai;
pub mod ratelimit;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

use crate::completion::{ChatRequest, Usage};
use crate::deadline::Deadline;
use crate::outcome::Outcome;

/// A boxed future, so lanes of different kinds can sit behind one `dyn Lane`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A model endpoint. Implementations make exactly one attempt per call (no hidden retries) and
/// may assume the router bounds the whole attempt by `deadline`.
pub trait Lane: Send + Sync {
    /// Sends `request` and reads the whole answer.
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<Answer, LaneFailure>>;

    /// Asks the endpoint whether it is up, without generating anything. Returns a short
    /// description of what answered (for `canary check --probe`).
    fn probe(&self, deadline: Deadline) -> BoxFuture<'_, Result<String, LaneFailure>>;

    /// Why the lane cannot work at all as configured (e.g. its key is missing), known before
    /// any request.
    fn misconfiguration(&self) -> Option<String> {
        None
    }
}

/// What an endpoint returned, before the router stamps lane and timings on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The generated text.
    pub text: String,
    /// The model the provider reports.
    pub model: Option<String>,
    /// The provider's `system_fingerprint`.
    pub fingerprint: Option<String>,
    /// Why generation stopped.
    pub finish_reason: Option<String>,
    /// Token counts.
    pub usage: Usage,
}

/// Why an attempt did not produce an answer. Messages never contain keys or prompt text.
#[derive(Debug, Clone, PartialEq)]
pub enum LaneFailure {
    /// The connection could not be made (refused, unreachable, DNS, TLS).
    Connect(String),
    /// The connection broke while talking (reset, closed early).
    Transport(String),
    /// The attempt ran out of its time.
    Timeout,
    /// 5xx.
    Server {
        /// HTTP status.
        status: u16,
        /// Short description from the body, if any.
        message: String,
    },
    /// An error object inside a 2xx body (some providers send errors with status 200).
    ErrorBody(String),
    /// A 2xx body that is not a completion (not JSON, no choices, no content).
    BadBody(String),
    /// The body grew past `max_response_bytes` and was refused.
    TooLarge {
        /// The configured limit.
        limit: u64,
    },
    /// A 4xx about the request itself: our request is wrong, the lane is not sick.
    Client {
        /// HTTP status.
        status: u16,
        /// Short description from the body, if any.
        message: String,
    },
    /// 429, 402 or a quota error: the lane is exhausted until `reset`.
    RateLimited {
        /// When the provider says capacity returns, if it said.
        reset: Option<SystemTime>,
        /// Short description.
        message: String,
    },
    /// 401/403 or a missing key: the lane cannot work until someone fixes its configuration.
    Misconfigured(String),
}

impl LaneFailure {
    /// The contract outcome this failure is reported as.
    pub fn outcome(&self) -> Outcome {
        match self {
            LaneFailure::Timeout => Outcome::Timeout,
            LaneFailure::RateLimited { .. } => Outcome::Exhausted,
            LaneFailure::Misconfigured(_) => Outcome::Misconfigured,
            LaneFailure::Connect(_)
            | LaneFailure::Transport(_)
            | LaneFailure::Server { .. }
            | LaneFailure::ErrorBody(_)
            | LaneFailure::BadBody(_)
            | LaneFailure::TooLarge { .. }
            | LaneFailure::Client { .. } => Outcome::Error,
        }
    }

    /// Whether this failure says the lane is unhealthy. Request errors (4xx) are our fault, and
    /// exhaustion and misconfiguration have states of their own, so none of those count.
    pub fn counts_against_breaker(&self) -> bool {
        matches!(
            self,
            LaneFailure::Connect(_)
                | LaneFailure::Transport(_)
                | LaneFailure::Timeout
                | LaneFailure::Server { .. }
                | LaneFailure::ErrorBody(_)
                | LaneFailure::BadBody(_)
                | LaneFailure::TooLarge { .. }
        )
    }
}

impl LaneFailure {
    /// The same failure with its free-text message passed through `f` (to scrub secrets).
    pub fn map_message(self, f: impl Fn(&str) -> String) -> LaneFailure {
        match self {
            LaneFailure::Connect(m) => LaneFailure::Connect(f(&m)),
            LaneFailure::Transport(m) => LaneFailure::Transport(f(&m)),
            LaneFailure::Timeout => LaneFailure::Timeout,
            LaneFailure::Server { status, message } => LaneFailure::Server {
                status,
                message: f(&message),
            },
            LaneFailure::ErrorBody(m) => LaneFailure::ErrorBody(f(&m)),
            LaneFailure::BadBody(m) => LaneFailure::BadBody(f(&m)),
            LaneFailure::TooLarge { limit } => LaneFailure::TooLarge { limit },
            LaneFailure::Client { status, message } => LaneFailure::Client {
                status,
                message: f(&message),
            },
            LaneFailure::RateLimited { reset, message } => LaneFailure::RateLimited {
                reset,
                message: f(&message),
            },
            LaneFailure::Misconfigured(m) => LaneFailure::Misconfigured(f(&m)),
        }
    }
}

impl fmt::Display for LaneFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaneFailure::Connect(msg) => write!(f, "cannot connect: {msg}"),
            LaneFailure::Transport(msg) => write!(f, "connection failed: {msg}"),
            LaneFailure::Timeout => f.write_str("no complete answer before the deadline"),
            LaneFailure::Server { status, message } => write!(f, "HTTP {status}: {message}"),
            LaneFailure::ErrorBody(msg) => write!(f, "error in response body: {msg}"),
            LaneFailure::BadBody(msg) => write!(f, "unusable response: {msg}"),
            LaneFailure::TooLarge { limit } => {
                write!(
                    f,
                    "response body larger than max_response_bytes ({limit} bytes)"
                )
            }
            LaneFailure::Client { status, message } => write!(f, "HTTP {status}: {message}"),
            LaneFailure::RateLimited { message, .. } => write!(f, "rate limited: {message}"),
            LaneFailure::Misconfigured(msg) => write!(f, "{msg}"),
        }
    }
}
