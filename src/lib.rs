//! canary: a nightly quality-drift canary for the lanes of a shared LLM router.
//!
//! The library holds everything; the `canary` binary only parses arguments and calls in here.
//! Where things live:
//! - [`deadline`]: the one absolute deadline a job carries.
//! - [`router`]: admission, per-lane caps, breakers, exhaustion, fallback, audit.
//! - [`lane`]: the seam to model endpoints, and the OpenAI-compatible lane.
//! - [`config`]: the `canary.yaml` file.
//! - [`audit`], [`metrics`]: what a job leaves behind.
//! - [`cmd`]: the commands.

pub mod accept;
pub mod alert;
pub mod audit;
pub mod checks;
pub mod cli;
pub mod cmd;
pub mod completion;
pub mod config;
pub mod deadline;
pub mod diff;
pub mod drift;
pub mod html;
pub mod judge;
pub mod lane;
pub mod metrics;
pub mod outcome;
pub mod prompts;
pub mod report;
pub mod router;
pub mod run;
pub mod schedule;
pub mod snapshot;
pub mod store;
pub mod verdict;

/// The async runtime canary runs on: one thread.
///
/// `canary run` polls every job of a run in one task, and the disk writes have a thread of their
/// own, so more threads buy nothing; on one thread each job's deadline timer fires on time (p99
/// overshoot 4–7 ms against a hung server, 100 jobs at once, where the multi-threaded runtime
/// reached 14–18 ms: `scripts/bench --only deadline`).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// An error and its causes (`errors`, outermost first) in one line, each said once: a cause
/// an error already states in its own message (`store X: ERROR: ...`) is not repeated.
pub fn said_once<'a>(
    errors: impl IntoIterator<Item = &'a (dyn std::error::Error + 'static)>,
) -> String {
    let mut message = String::new();
    for error in errors {
        let text = error.to_string();
        if message.is_empty() {
            message = text;
        } else if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
    }
    message
}
