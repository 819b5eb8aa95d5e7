//! The audit log: one JSON line per job.
//!
//! Every prompt is an egress event, so each job leaves a line saying when, which lanes were
//! tried and how each attempt ended, and which lane served. The prompt itself is recorded as a
//! SHA-256 and a byte count; bodies are written only when the config sets `audit_bodies: true`.
//! Keys never reach this file: lanes hold them in sensitive headers and no message carries them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::completion::ChatRequest;
use crate::router::Attempt;

/// How often the writer thread appends the lines that have queued up.
const WRITE_EVERY: Duration = Duration::from_millis(5);

/// An append-only JSON-lines audit file.
///
/// Jobs serialise their line into a shared buffer; a writer thread appends the buffer every
/// few milliseconds with one `write(2)`. The run's thread never waits on the file or wakes
/// another thread per job. Every line is in the file once [`AuditLog::flush`] returns or the
/// log is dropped (the router is dropped before the process exits). A process killed outright
/// can lose the lines of the jobs that finished in its last few milliseconds, as it can lose
/// results the store's writer has not yet committed.
pub struct AuditLog {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    include_bodies: bool,
}

struct Shared {
    /// Whole lines not yet appended.
    pending: Mutex<Vec<u8>>,
    /// Held while taking `pending` and appending it, so batches reach the file in order.
    file: Mutex<File>,
    stop: AtomicBool,
}

impl Shared {
    /// Appends every whole line queued so far.
    fn write_pending(&self) -> std::io::Result<()> {
        let mut file = lock(&self.file);
        let batch = std::mem::take(&mut *lock(&self.pending));
        if batch.is_empty() {
            return Ok(());
        }
        file.write_all(&batch)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One audit line.
#[derive(Debug, Serialize)]
pub struct AuditEntry<'a> {
    /// When the job finished (RFC 3339, UTC).
    pub ts: String,
    /// Id of the job, also shown by `canary ask`.
    pub job_id: &'a str,
    /// SHA-256 of the canonical request (messages and params).
    pub prompt_sha256: &'a str,
    /// Byte count of the canonical request.
    pub prompt_bytes: usize,
    /// The lane the job was pinned to, for canary runs; absent for routed jobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_lane: Option<&'a str>,
    /// Every attempt, in order.
    pub attempts: &'a [Attempt],
    /// The lane whose answer was used, if any.
    pub served_by: Option<&'a str>,
    /// Wall time of the whole job.
    pub elapsed_ms: u64,
    /// The request, only with `audit_bodies: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<&'a ChatRequest>,
    /// The answer text, only with `audit_bodies: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<&'a str>,
}

impl AuditLog {
    /// Opens (creating it and its folder if needed) the audit file for appending, and starts
    /// its writer thread.
    pub fn open(path: &Path, include_bodies: bool) -> std::io::Result<AuditLog> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let shared = Arc::new(Shared {
            pending: Mutex::new(Vec::with_capacity(64 * 1024)),
            file: Mutex::new(file),
            stop: AtomicBool::new(false),
        });
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("canary-audit".into())
                .spawn(move || write_every_tick(&shared))?
        };
        Ok(AuditLog {
            shared,
            writer: Some(writer),
            include_bodies,
        })
    }

    /// Whether bodies may be written.
    pub fn include_bodies(&self) -> bool {
        self.include_bodies
    }

    /// Queues one line. Lines are serialised whole into the queue, so concurrent jobs never
    /// interleave inside a line.
    pub fn record(&self, entry: &AuditEntry<'_>) -> std::io::Result<()> {
        let mut pending = lock(&self.shared.pending);
        let before = pending.len();
        if let Err(err) = serde_json::to_writer(&mut *pending, entry) {
            pending.truncate(before);
            return Err(err.into());
        }
        pending.push(b'\n');
        Ok(())
    }

    /// Returns once every line recorded before the call is in the file.
    pub fn flush(&self) -> std::io::Result<()> {
        self.shared.write_pending()
    }
}

impl Drop for AuditLog {
    /// Stops the writer and appends what is left.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(writer) = self.writer.take() {
            writer.thread().unpark();
            let _ = writer.join();
        }
        if let Err(err) = self.shared.write_pending() {
            tracing::warn!("cannot append to the audit log: {err}");
        }
    }
}

/// The writer thread: appends the queued lines every [`WRITE_EVERY`] until the log is dropped.
/// A failed write is reported once per tick; its lines are dropped, not retried forever.
fn write_every_tick(shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::park_timeout(WRITE_EVERY);
        if let Err(err) = shared.write_pending() {
            tracing::warn!("cannot append to the audit log: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(job_id: &str) -> AuditEntry<'_> {
        AuditEntry {
            ts: "2026-11-30T00:00:00.000Z".into(),
            job_id,
            prompt_sha256: "00",
            prompt_bytes: 2,
            pinned_lane: Some("free"),
            attempts: &[],
            served_by: None,
            elapsed_ms: 1,
            request: None,
            answer: None,
        }
    }

    fn job_ids(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|line| {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                value["job_id"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    #[test]
    fn lines_from_many_threads_are_whole_and_in_the_file_after_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit/audit.jsonl");
        let log = AuditLog::open(&path, false).unwrap();
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let log = &log;
                scope.spawn(move || {
                    for job in 0..500 {
                        log.record(&entry(&format!("{thread}-{job}"))).unwrap();
                    }
                });
            }
        });
        log.flush().unwrap();
        let ids = job_ids(&path);
        assert_eq!(ids.len(), 2000);
        // Each thread's lines keep their order.
        for thread in 0..4 {
            let mine: Vec<&String> = ids
                .iter()
                .filter(|id| id.starts_with(&format!("{thread}-")))
                .collect();
            let expected: Vec<String> = (0..500).map(|job| format!("{thread}-{job}")).collect();
            assert_eq!(mine, expected.iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn dropping_the_log_writes_what_is_queued() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::fs::write(&path, "{\"job_id\":\"earlier\"}\n").unwrap();
        let log = AuditLog::open(&path, false).unwrap();
        for job in 0..100 {
            log.record(&entry(&job.to_string())).unwrap();
        }
        drop(log);
        let ids = job_ids(&path);
        assert_eq!(ids.len(), 101);
        assert_eq!(ids[0], "earlier", "the file is appended to");
        assert_eq!(ids[100], "99");
    }
}
