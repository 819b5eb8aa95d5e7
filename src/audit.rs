//! The audit log: one JSON line per job.
//!
//! Every prompt is an egress event, so each job leaves a line saying when, which lanes were
//! tried and how each attempt ended, and which lane served. The prompt itself is recorded as a
//! SHA-256 and a byte count; bodies are written only when the config sets `audit_bodies: true`.
//! Keys never reach this file: lanes hold them in sensitive headers and no message carries them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde::Serialize;

use crate::completion::ChatRequest;
use crate::router::Attempt;

/// An append-only JSON-lines audit file.
pub struct AuditLog {
    file: Mutex<File>,
    include_bodies: bool,
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
    /// Opens (creating it and its folder if needed) the audit file for appending.
    pub fn open(path: &Path, include_bodies: bool) -> std::io::Result<AuditLog> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(AuditLog {
            file: Mutex::new(file),
            include_bodies,
        })
    }

    /// Whether bodies may be written.
    pub fn include_bodies(&self) -> bool {
        self.include_bodies
    }

    /// Appends one line. The line is written with a single `write_all` so concurrent jobs never
    /// interleave inside a line.
    pub fn record(&self, entry: &AuditEntry<'_>) -> std::io::Result<()> {
        // Sized for a typical line, so it is not grown several times on every job.
        let mut line = Vec::with_capacity(512);
        serde_json::to_writer(&mut line, entry)?;
        line.push(b'\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        file.write_all(&line)
    }
}
