//! The SQLite store: runs, every result as it arrives, verdicts and alerts.
//!
//! WAL mode with full sync: results are committed as they arrive (in groups, by
//! [`writer::GroupWriter`], so a slow disk never holds up the requests), and a run killed at any
//! instant leaves a consistent store holding every result committed up to then.
//! Output texts are content-addressed, stored once however many runs repeat them.

pub mod lock;
mod migrations;
pub mod writer;

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use sha2::{Digest, Sha256};

/// A store problem.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused.
    #[error("store {path}: {source}")]
    Sqlite {
        /// The store file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The store was written by a newer canary.
    #[error(
        "store {path} has schema version {found}, newer than this canary understands ({known}); upgrade canary"
    )]
    TooNew {
        /// The store file.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// Ours.
        known: i64,
    },
    /// The folder of the store cannot be created.
    #[error("cannot create the folder of store {path}: {source}")]
    Folder {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The store needs a newer schema, but a run holds it.
    #[error(
        "store {path} must be migrated to this canary's schema, but a run is using it ({holder}); try again when it has finished"
    )]
    MigrationWaits {
        /// The store file.
        path: PathBuf,
        /// Who holds the run lock.
        holder: String,
    },
    /// The committing thread could not be started.
    #[error("cannot start the thread that commits results: {source}")]
    Thread {
        /// Why.
        source: std::io::Error,
    },
    /// A run id that does not exist.
    #[error("no run {0} in the store (see `canary history`)")]
    NoSuchRun(i64),
    /// No run at all yet.
    #[error("the store has no runs yet: run `canary run` first")]
    NoRuns,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// Run id.
    pub id: i64,
    /// Start time (RFC 3339).
    pub started_at: String,
    /// End time, when it ended.
    pub finished_at: Option<String>,
    /// `running`, `finished` or `interrupted`.
    pub status: String,
    /// Hash of the prompt set it ran.
    pub prompt_set_hash: String,
    /// Samples per (lane, prompt).
    pub samples: i64,
    /// Lanes measured.
    pub lanes: Vec<String>,
    /// Exit code it ended with.
    pub exit_code: Option<i64>,
}

/// One result to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewResult<'a> {
    /// Lane measured.
    pub lane: &'a str,
    /// Prompt id.
    pub prompt_id: &'a str,
    /// Prompt hash at the time.
    pub prompt_hash: &'a str,
    /// Sample number, from 0.
    pub sample: i64,
    /// Router outcome.
    pub outcome: &'a str,
    /// Output text, when served.
    pub output: Option<&'a str>,
    /// Reported model.
    pub model: Option<&'a str>,
    /// Reported fingerprint.
    pub fingerprint: Option<&'a str>,
    /// Finish reason.
    pub finish_reason: Option<&'a str>,
    /// Prompt tokens.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens.
    pub completion_tokens: Option<u64>,
    /// Queue wait.
    pub queue_ms: u64,
    /// Call time.
    pub call_ms: u64,
    /// What failed, for failed results.
    pub error: Option<&'a str>,
}

/// A stored result with its output text.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResult {
    /// Run id.
    pub run_id: i64,
    /// Lane.
    pub lane: String,
    /// Prompt id.
    pub prompt_id: String,
    /// Prompt hash.
    pub prompt_hash: String,
    /// Sample number.
    pub sample: i64,
    /// Router outcome.
    pub outcome: String,
    /// Output text, when served.
    pub output: Option<String>,
    /// Reported model.
    pub model: Option<String>,
    /// Reported fingerprint.
    pub fingerprint: Option<String>,
    /// Finish reason.
    pub finish_reason: Option<String>,
    /// Completion tokens.
    pub completion_tokens: Option<i64>,
    /// Queue wait.
    pub queue_ms: i64,
    /// Call time.
    pub call_ms: i64,
    /// What failed.
    pub error: Option<String>,
}

/// What a prune removed (or, in a dry run, would remove).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    /// Runs.
    pub runs: i64,
    /// Their results.
    pub results: i64,
    /// Output texts no remaining result refers to.
    pub texts: i64,
}

/// A stored verdict of one (lane, prompt).
#[derive(Debug, Clone, PartialEq)]
pub struct VerdictRow {
    /// Lane.
    pub lane: String,
    /// Prompt id.
    pub prompt_id: String,
    /// Verdict name.
    pub verdict: String,
    /// Similarity to the baseline.
    pub similarity: Option<f64>,
    /// Drifted on the control lane too: for review, not an alert.
    pub review: bool,
    /// Reasons.
    pub reasons: Vec<String>,
    /// How it was judged: `exact`, `sampled` or `single`.
    pub mode: Option<String>,
    /// The two-sample test's p-value, for sampled items.
    pub p_value: Option<f64>,
}

/// A stored verdict of one lane in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneVerdictRow {
    /// Run id.
    pub run_id: i64,
    /// Lane.
    pub lane: String,
    /// Verdict name.
    pub verdict: String,
    /// Reasons.
    pub reasons: Vec<String>,
    /// The p-value of the lane's two-sample test, when it had sampled prompts.
    pub p_value: Option<f64>,
}

/// An alert to store for one channel.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAlert<'a> {
    /// The run that raised it.
    pub run_id: i64,
    /// The lane it is about.
    pub lane: &'a str,
    /// `drift` or `recovered`.
    pub kind: &'a str,
    /// What drifted, so the same drift is recognised next time.
    pub signature: &'a str,
    /// `email`, `webhook`, ...
    pub channel: &'a str,
    /// Subject line.
    pub subject: &'a str,
    /// Plain-text body.
    pub body_text: &'a str,
    /// HTML body.
    pub body_html: &'a str,
}

/// A stored alert of one channel.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertRow {
    /// Row id.
    pub id: i64,
    /// The run that raised it.
    pub run_id: i64,
    /// The lane it is about.
    pub lane: String,
    /// `drift` or `recovered`.
    pub kind: String,
    /// What drifted.
    pub signature: String,
    /// Channel.
    pub channel: String,
    /// `pending` or `sent`.
    pub status: String,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub body_text: String,
    /// HTML body.
    pub body_html: String,
    /// Last delivery error.
    pub error: Option<String>,
    /// Delivery attempts so far.
    pub attempts: i64,
    /// When it was raised (RFC 3339).
    pub created_at: String,
}

/// The SQLite store.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

const KNOWN_VERSION: i64 = migrations::MIGRATIONS.len() as i64;

impl Store {
    /// Opens (creating and migrating as needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Folder {
                path: path.to_path_buf(),
                source,
            })?;
        }
        let sql = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;",
        )
        .map_err(sql)?;
        let mut store = Store {
            conn,
            path: path.to_path_buf(),
        };
        store.migrate()?;
        Ok(store)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| self.err(e))?;
        if version > KNOWN_VERSION {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found: version,
                known: KNOWN_VERSION,
            });
        }
        if version == KNOWN_VERSION {
            return Ok(());
        }
        // A store in use by a run of an older canary must not change shape under it: migrate
        // only holding the run lock, or when this process is the one holding it.
        let _lock = if version > 0 {
            match lock::RunLock::acquire(&self.path) {
                Ok(lock) => Some(lock),
                Err(lock::LockError::Held { holder, .. })
                    if lock::holder_pid(&holder) == Some(std::process::id()) =>
                {
                    None
                }
                Err(lock::LockError::Held { holder, .. }) => {
                    return Err(StoreError::MigrationWaits {
                        path: self.path.clone(),
                        holder,
                    });
                }
                Err(lock::LockError::Io { .. }) => None,
            }
        } else {
            None
        };
        let sql = sqlite_error(&self.path);
        // Immediate, and the version read again inside: two canaries opening the same old
        // store migrate it once.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        let version: i64 = tx
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(sql)?;
        for (index, migration) in migrations::MIGRATIONS
            .iter()
            .enumerate()
            .skip(version as usize)
        {
            tx.execute_batch(migration)
                .and_then(|()| tx.pragma_update(None, "user_version", index as i64 + 1))
                .map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }

    /// Schema version of the store.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| self.err(e))
    }

    /// Marks runs still `running` as `interrupted`. Call only while holding the run lock: then
    /// no such run can be alive. Returns their ids.
    pub fn mark_interrupted(&self) -> Result<Vec<i64>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("UPDATE runs SET status = 'interrupted' WHERE status = 'running' RETURNING id")
            .map_err(|e| self.err(e))?;
        let ids = stmt
            .query_map([], |row| row.get(0))
            .and_then(|rows| rows.collect::<Result<Vec<i64>, _>>())
            .map_err(|e| self.err(e))?;
        Ok(ids)
    }

    /// Starts a run and returns its id.
    pub fn begin_run(
        &self,
        prompt_set_hash: &str,
        samples: u32,
        lanes: &[String],
    ) -> Result<i64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO runs (started_at, status, prompt_set_hash, samples, lanes, pid)
                 VALUES (?1, 'running', ?2, ?3, ?4, ?5)",
                params![
                    now(),
                    prompt_set_hash,
                    samples,
                    serde_json::to_string(lanes).unwrap_or_default(),
                    std::process::id()
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Commits one result (and its output text, once) in its own transaction.
    pub fn insert_result(&mut self, run_id: i64, result: &NewResult<'_>) -> Result<(), StoreError> {
        self.insert_results(run_id, std::slice::from_ref(result))
    }

    /// Commits results in one transaction: all of them or none (`run` commits through
    /// [`writer::GroupWriter`], which groups what arrives together).
    pub fn insert_results(
        &mut self,
        run_id: i64,
        results: &[NewResult<'_>],
    ) -> Result<(), StoreError> {
        let sql = sqlite_error(&self.path);
        // Immediate: the write lock is taken before the first read, so another connection's
        // commit in between cannot turn this into a busy error that no timeout retries.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        for result in results {
            insert_result(&tx, run_id, result).map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }

    /// Stores the verdicts of a run (replacing any earlier ones) and ends it.
    pub fn finish_run(
        &mut self,
        run_id: i64,
        items: &[VerdictRow],
        lanes: &[LaneVerdictRow],
        exit_code: i32,
    ) -> Result<(), StoreError> {
        let sql = sqlite_error(&self.path);
        let tx = self.conn.transaction().map_err(sql)?;
        tx.execute("DELETE FROM verdicts WHERE run_id = ?1", [run_id])
            .map_err(sql)?;
        tx.execute("DELETE FROM lane_verdicts WHERE run_id = ?1", [run_id])
            .map_err(sql)?;
        for item in items {
            let reasons = (!item.reasons.is_empty())
                .then(|| serde_json::to_string(&item.reasons).unwrap_or_default());
            let ids = (|| {
                Ok::<_, rusqlite::Error>((
                    word(&tx, &item.lane)?,
                    word(&tx, &item.prompt_id)?,
                    word(&tx, &item.verdict)?,
                    item.mode.as_deref().map(|m| word(&tx, m)).transpose()?,
                ))
            })()
            .map_err(sql)?;
            tx.prepare_cached(
                "INSERT INTO verdicts (run_id, lane, prompt, verdict, similarity, review, reasons,
                     mode, p_value)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .and_then(|mut insert| {
                insert.execute(params![
                    run_id,
                    ids.0,
                    ids.1,
                    ids.2,
                    item.similarity,
                    item.review,
                    reasons,
                    ids.3,
                    item.p_value
                ])
            })
            .map_err(sql)?;
        }
        for lane in lanes {
            tx.execute(
                "INSERT INTO lane_verdicts (run_id, lane, verdict, reasons, p_value)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    run_id,
                    lane.lane,
                    lane.verdict,
                    serde_json::to_string(&lane.reasons).unwrap_or_default(),
                    lane.p_value
                ],
            )
            .map_err(sql)?;
        }
        tx.execute(
            "UPDATE runs SET status = 'finished', finished_at = ?2, exit_code = ?3 WHERE id = ?1",
            params![run_id, now(), exit_code],
        )
        .map_err(sql)?;
        tx.commit().map_err(sql)
    }

    /// The run with `id`, or the latest run that has results when `id` is `None`.
    pub fn run(&self, id: Option<i64>) -> Result<RunRow, StoreError> {
        let row = match id {
            Some(id) => self
                .conn
                .query_row(&format!("{RUN_SELECT} WHERE id = ?1"), [id], run_row)
                .optional()
                .map_err(|e| self.err(e))?
                .ok_or(StoreError::NoSuchRun(id))?,
            None => self
                .conn
                .query_row(
                    &format!("{RUN_SELECT} WHERE EXISTS (SELECT 1 FROM results r WHERE r.run_id = runs.id) ORDER BY id DESC LIMIT 1"),
                    [],
                    run_row,
                )
                .optional()
                .map_err(|e| self.err(e))?
                .ok_or(StoreError::NoRuns)?,
        };
        Ok(row)
    }

    /// The latest runs, newest first.
    pub fn runs(&self, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!("{RUN_SELECT} ORDER BY id DESC LIMIT ?1"))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([limit as i64], run_row)
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// The latest runs up to `run_id` (included), newest first.
    pub fn runs_through(&self, run_id: i64, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "{RUN_SELECT} WHERE id <= ?1 ORDER BY id DESC LIMIT ?2"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![run_id, limit as i64], run_row)
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// Every result of a run, in lane, prompt, sample order.
    pub fn results(&self, run_id: i64) -> Result<Vec<StoredResult>, StoreError> {
        self.results_of(run_id, None, true)
    }

    /// The results of a run, of one prompt only when `prompt` is given; with `text` false the
    /// output texts are not read (`output` is `None`), for readers that need only outcomes and
    /// timings.
    pub fn results_of(
        &self,
        run_id: i64,
        prompt: Option<&str>,
        text: bool,
    ) -> Result<Vec<StoredResult>, StoreError> {
        let (column, join) = if text {
            ("t.text", "LEFT JOIN texts t ON t.id = r.output")
        } else {
            ("NULL", "")
        };
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT r.run_id, l.word, p.word, pv.hash, r.sample, s.outcome, {column}, s.model,
                        s.fingerprint, s.finish_reason, r.completion_tokens, r.queue_ms,
                        r.call_ms, r.error
                 FROM results r
                 JOIN words l ON l.id = r.lane
                 JOIN prompt_versions pv ON pv.id = r.prompt
                 JOIN words p ON p.id = pv.prompt
                 JOIN served_as s ON s.id = r.served
                 {join}
                 WHERE r.run_id = ?1 AND (?2 IS NULL OR p.word = ?2)
                 ORDER BY l.word, p.word, r.sample"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![run_id, prompt], |row| {
                Ok(StoredResult {
                    run_id: row.get(0)?,
                    lane: row.get(1)?,
                    prompt_id: row.get(2)?,
                    prompt_hash: row.get(3)?,
                    sample: row.get(4)?,
                    outcome: row.get(5)?,
                    output: row.get(6)?,
                    model: row.get(7)?,
                    fingerprint: row.get(8)?,
                    finish_reason: row.get(9)?,
                    completion_tokens: row.get(10)?,
                    queue_ms: row.get(11)?,
                    call_ms: row.get(12)?,
                    error: row.get(13)?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// The verdicts stored for a run.
    pub fn verdicts(&self, run_id: i64) -> Result<Vec<VerdictRow>, StoreError> {
        self.verdicts_of(run_id, None)
    }

    /// The verdicts stored for a run, of one prompt only when `prompt` is given.
    pub fn verdicts_of(
        &self,
        run_id: i64,
        prompt: Option<&str>,
    ) -> Result<Vec<VerdictRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT l.word, p.word, w.word, v.similarity, v.review, v.reasons, m.word,
                        v.p_value
                 FROM verdicts v
                 JOIN words l ON l.id = v.lane
                 JOIN words p ON p.id = v.prompt
                 JOIN words w ON w.id = v.verdict
                 LEFT JOIN words m ON m.id = v.mode
                 WHERE v.run_id = ?1 AND (?2 IS NULL OR p.word = ?2)
                 ORDER BY l.word, p.word",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![run_id, prompt], |row| {
                let reasons: Option<String> = row.get(5)?;
                Ok(VerdictRow {
                    lane: row.get(0)?,
                    prompt_id: row.get(1)?,
                    verdict: row.get(2)?,
                    similarity: row.get(3)?,
                    review: row.get(4)?,
                    reasons: reasons
                        .map(|r| serde_json::from_str(&r).unwrap_or_default())
                        .unwrap_or_default(),
                    mode: row.get(6)?,
                    p_value: row.get(7)?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// Lane verdicts stored for a run.
    pub fn lane_verdicts(&self, run_id: i64) -> Result<Vec<LaneVerdictRow>, StoreError> {
        self.lane_verdicts_where("run_id = ?1 ORDER BY lane", params![run_id])
    }

    /// A lane's verdicts in runs before `before_run`, newest first, at most `limit`.
    pub fn lane_history(
        &self,
        lane: &str,
        before_run: i64,
        limit: usize,
    ) -> Result<Vec<LaneVerdictRow>, StoreError> {
        self.lane_verdicts_where(
            "lane = ?1 AND run_id < ?2 ORDER BY run_id DESC LIMIT ?3",
            params![lane, before_run, limit as i64],
        )
    }

    fn lane_verdicts_where<P: rusqlite::Params>(
        &self,
        filter: &str,
        params: P,
    ) -> Result<Vec<LaneVerdictRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT run_id, lane, verdict, reasons, p_value FROM lane_verdicts WHERE {filter}"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params, |row| {
                let reasons: String = row.get(3)?;
                Ok(LaneVerdictRow {
                    run_id: row.get(0)?,
                    lane: row.get(1)?,
                    verdict: row.get(2)?,
                    reasons: serde_json::from_str(&reasons).unwrap_or_default(),
                    p_value: row.get(4)?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// Stores a pending alert; returns its id.
    pub fn insert_alert(&self, alert: &NewAlert<'_>) -> Result<i64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO alerts (run_id, lane, kind, signature, channel, status, subject,
                     body_text, body_html, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?9)",
                params![
                    alert.run_id,
                    alert.lane,
                    alert.kind,
                    alert.signature,
                    alert.channel,
                    alert.subject,
                    alert.body_text,
                    alert.body_html,
                    now()
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Records a delivery attempt: sent, or still pending with the error.
    pub fn record_delivery(&self, id: i64, error: Option<&str>) -> Result<(), StoreError> {
        let result = match error {
            None => self.conn.execute(
                "UPDATE alerts SET status = 'sent', sent_at = ?2, error = NULL,
                     attempts = attempts + 1 WHERE id = ?1",
                params![id, now()],
            ),
            Some(error) => self.conn.execute(
                "UPDATE alerts SET error = ?2, attempts = attempts + 1 WHERE id = ?1",
                params![id, error],
            ),
        };
        result.map(|_| ()).map_err(|e| self.err(e))
    }

    /// Alerts not delivered yet, oldest first.
    pub fn pending_alerts(&self) -> Result<Vec<AlertRow>, StoreError> {
        self.alerts_where("status = 'pending' ORDER BY id", [])
    }

    /// The newest alert raised for a lane (any channel, sent or pending).
    pub fn last_alert(&self, lane: &str) -> Result<Option<AlertRow>, StoreError> {
        Ok(self
            .alerts_where("lane = ?1 ORDER BY id DESC LIMIT 1", [lane])?
            .pop())
    }

    /// Every alert of a run.
    pub fn alerts_of_run(&self, run_id: i64) -> Result<Vec<AlertRow>, StoreError> {
        self.alerts_where("run_id = ?1 ORDER BY id", [run_id])
    }

    fn alerts_where<P: rusqlite::Params>(
        &self,
        filter: &str,
        params: P,
    ) -> Result<Vec<AlertRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT id, run_id, lane, kind, signature, channel, status, subject, body_text,
                        body_html, error, attempts, created_at FROM alerts WHERE {filter}"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params, |row| {
                Ok(AlertRow {
                    id: row.get(0)?,
                    run_id: row.get(1)?,
                    lane: row.get(2)?,
                    kind: row.get(3)?,
                    signature: row.get(4)?,
                    channel: row.get(5)?,
                    status: row.get(6)?,
                    subject: row.get(7)?,
                    body_text: row.get(8)?,
                    body_html: row.get(9)?,
                    error: row.get(10)?,
                    attempts: row.get(11)?,
                    created_at: row.get(12)?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// Counts of stored rows: (results, distinct outputs), for reports and tests of dedup.
    pub fn counts(&self) -> Result<(i64, i64), StoreError> {
        self.conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM results), (SELECT COUNT(*) FROM texts)",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .map_err(|e| self.err(e))
    }

    /// Removes runs started before `cutoff` (RFC 3339) with their results, verdicts and sent
    /// alerts, then the output texts no remaining result refers to. Kept whatever their age:
    /// the runs in `keep` (the baselines' source runs), the newest run, a run still `running`,
    /// runs with an undelivered alert, and each lane's newest alert, which holds back a repeat
    /// of the same drift. With `dry_run`, counts what would go and changes nothing.
    pub fn prune(
        &mut self,
        cutoff: &str,
        keep: &[i64],
        dry_run: bool,
    ) -> Result<Pruned, StoreError> {
        let sql = sqlite_error(&self.path);
        let tx = self.conn.transaction().map_err(sql)?;
        tx.execute(
            "CREATE TEMP TABLE doomed AS SELECT id FROM runs
             WHERE started_at < ?1 AND status != 'running'
               AND id NOT IN (SELECT value FROM json_each(?2))
               AND id < (SELECT MAX(id) FROM runs)
               AND id NOT IN (SELECT run_id FROM alerts WHERE status = 'pending')
               AND id NOT IN (SELECT run_id FROM alerts
                              WHERE id IN (SELECT MAX(id) FROM alerts GROUP BY lane))",
            params![cutoff, serde_json::to_string(keep).unwrap_or_default()],
        )
        .map_err(sql)?;
        let count =
            |query: &str| -> rusqlite::Result<i64> { tx.query_row(query, [], |row| row.get(0)) };
        let mut pruned = Pruned {
            runs: count("SELECT COUNT(*) FROM doomed").map_err(sql)?,
            results: count("SELECT COUNT(*) FROM results WHERE run_id IN (SELECT id FROM doomed)")
                .map_err(sql)?,
            texts: 0,
        };
        if dry_run {
            pruned.texts = count(
                "SELECT COUNT(*) FROM texts WHERE id NOT IN
                     (SELECT output FROM results WHERE output IS NOT NULL
                          AND run_id NOT IN (SELECT id FROM doomed))",
            )
            .map_err(sql)?;
            // Rolled back, the temporary table with it.
            drop(tx);
            return Ok(pruned);
        }
        tx.execute_batch(
            "DELETE FROM alerts WHERE run_id IN (SELECT id FROM doomed);
             DELETE FROM verdicts WHERE run_id IN (SELECT id FROM doomed);
             DELETE FROM lane_verdicts WHERE run_id IN (SELECT id FROM doomed);
             DELETE FROM results WHERE run_id IN (SELECT id FROM doomed);
             DELETE FROM runs WHERE id IN (SELECT id FROM doomed);",
        )
        .map_err(sql)?;
        pruned.texts = tx
            .execute(
                "DELETE FROM texts WHERE id NOT IN
                     (SELECT output FROM results WHERE output IS NOT NULL)",
                [],
            )
            .map_err(sql)? as i64;
        tx.execute_batch("DROP TABLE temp.doomed").map_err(sql)?;
        tx.commit().map_err(sql)?;
        // Fold the log back into the file, so the freed pages show as free space in it rather
        // than as a log as large as what was removed. The prune is committed either way: a
        // reader holding the log open only postpones this to SQLite's next checkpoint.
        if let Err(err) = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);") {
            tracing::debug!("checkpoint after prune postponed: {err}");
        }
        Ok(pruned)
    }

    /// Rewrites the file without its free pages (SQLite's `VACUUM`), so it shrinks after a prune.
    pub fn vacuum(&self) -> Result<(), StoreError> {
        self.conn
            .execute_batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(|e| self.err(e))
    }

    /// Bytes the store takes on disk: the database file and its write-ahead log.
    pub fn disk_bytes(&self) -> u64 {
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        size(&self.path) + size(Path::new(&wal))
    }

    /// SQLite's own consistency check; `ok` when the file is sound.
    pub fn integrity_check(&self) -> Result<String, StoreError> {
        self.conn
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .map_err(|e| self.err(e))
    }
}

/// Wraps SQLite's errors with the store's path; usable while a transaction borrows the
/// connection.
fn sqlite_error(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + Copy + '_ {
    move |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    }
}

/// Commits one result inside `tx`, storing what repeats once.
fn insert_result(tx: &Connection, run_id: i64, result: &NewResult<'_>) -> rusqlite::Result<()> {
    let lane = word(tx, result.lane)?;
    let prompt = prompt_version(tx, word(tx, result.prompt_id)?, result.prompt_hash)?;
    let served = served_as(tx, result)?;
    let output = result.output.map(|text| text_id(tx, text)).transpose()?;
    tx.prepare_cached(
        "INSERT INTO results (run_id, lane, prompt, sample, served, output, prompt_tokens,
             completion_tokens, queue_ms, call_ms, error, at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,
             (SELECT MAX(0, CAST(ROUND((julianday('now') - julianday(started_at)) * 86400000)
                 AS INTEGER)) FROM runs WHERE id = ?1))",
    )?
    .execute(params![
        run_id,
        lane,
        prompt,
        result.sample,
        served,
        output,
        result.prompt_tokens.map(|t| t as i64),
        result.completion_tokens.map(|t| t as i64),
        result.queue_ms as i64,
        result.call_ms as i64,
        result.error,
    ])?;
    Ok(())
}

/// The id of `word`, adding it the first time.
fn word(tx: &Connection, word: &str) -> rusqlite::Result<i64> {
    find_or_insert(
        tx,
        "SELECT id FROM words WHERE word = ?1",
        params![word],
        "INSERT INTO words (word) VALUES (?1)",
        params![word],
    )
}

/// The id of a prompt at one version of its text.
fn prompt_version(tx: &Connection, prompt: i64, hash: &str) -> rusqlite::Result<i64> {
    find_or_insert(
        tx,
        "SELECT id FROM prompt_versions WHERE prompt = ?1 AND hash = ?2",
        params![prompt, hash],
        "INSERT INTO prompt_versions (prompt, hash) VALUES (?1, ?2)",
        params![prompt, hash],
    )
}

/// The id of what a result reported besides its text: outcome, model, fingerprint, finish.
fn served_as(tx: &Connection, result: &NewResult<'_>) -> rusqlite::Result<i64> {
    let values = params![
        result.outcome,
        result.model,
        result.fingerprint,
        result.finish_reason
    ];
    find_or_insert(
        tx,
        "SELECT id FROM served_as WHERE outcome = ?1 AND model IS ?2 AND fingerprint IS ?3
             AND finish_reason IS ?4",
        values,
        "INSERT INTO served_as (outcome, model, fingerprint, finish_reason)
         VALUES (?1, ?2, ?3, ?4)",
        values,
    )
}

/// The id of an output text, stored once by its SHA-256.
fn text_id(tx: &Connection, text: &str) -> rusqlite::Result<i64> {
    let hash = Sha256::digest(text.as_bytes()).to_vec();
    find_or_insert(
        tx,
        "SELECT id FROM texts WHERE hash = ?1",
        params![hash],
        "INSERT INTO texts (hash, text) VALUES (?1, ?2)",
        params![hash, text],
    )
}

/// The id of the row `select` finds by `key`, or of the row `insert` adds from `row`: how
/// what repeats from result to result is stored once.
fn find_or_insert(
    tx: &Connection,
    select: &str,
    key: &[&dyn rusqlite::ToSql],
    insert: &str,
    row: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<i64> {
    let found = tx
        .prepare_cached(select)?
        .query_row(key, |found| found.get(0))
        .optional()?;
    match found {
        Some(id) => Ok(id),
        None => {
            tx.prepare_cached(insert)?.execute(row)?;
            Ok(tx.last_insert_rowid())
        }
    }
}

const RUN_SELECT: &str = "SELECT id, started_at, finished_at, status, prompt_set_hash, samples, lanes, exit_code FROM runs";

fn run_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    let lanes: String = row.get(6)?;
    Ok(RunRow {
        id: row.get(0)?,
        started_at: row.get(1)?,
        finished_at: row.get(2)?,
        status: row.get(3)?,
        prompt_set_hash: row.get(4)?,
        samples: row.get(5)?,
        lanes: serde_json::from_str(&lanes).unwrap_or_default(),
        exit_code: row.get(7)?,
    })
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result<'a>(prompt: &'a str, sample: i64, output: Option<&'a str>) -> NewResult<'a> {
        NewResult {
            lane: "free",
            prompt_id: prompt,
            prompt_hash: "h",
            sample,
            outcome: if output.is_some() {
                "served"
            } else {
                "timeout"
            },
            output,
            model: Some("m"),
            fingerprint: None,
            finish_reason: Some("stop"),
            prompt_tokens: Some(3),
            completion_tokens: Some(4),
            queue_ms: 0,
            call_ms: 12,
            error: None,
        }
    }

    #[test]
    fn identical_outputs_are_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("c.db")).unwrap();
        for night in 0..30 {
            let run = store.begin_run("set", 1, &["free".into()]).unwrap();
            store
                .insert_result(run, &result("a", 0, Some("Paris.")))
                .unwrap();
            let answer = if night % 10 == 0 {
                "Paris, France."
            } else {
                "Paris."
            };
            store
                .insert_result(run, &result("b", 0, Some(answer)))
                .unwrap();
            store.insert_result(run, &result("c", 0, None)).unwrap();
        }
        assert_eq!(store.counts().unwrap(), (90, 2));
        let latest = store.run(None).unwrap();
        let results = store.results(latest.id).unwrap();
        assert_eq!(results[0].output.as_deref(), Some("Paris."));
        assert_eq!(results[2].output, None);
    }

    #[test]
    fn migrations_are_recorded_and_reopening_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        Store::open(&path).unwrap();
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), KNOWN_VERSION);
    }

    #[test]
    fn a_store_from_a_newer_canary_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        Store::open(&path).unwrap();
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let err = Store::open(&path).err().unwrap().to_string();
        assert!(err.contains("schema version 99"), "{err}");
    }

    #[test]
    fn running_runs_become_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.db")).unwrap();
        let run = store.begin_run("set", 1, &[]).unwrap();
        assert_eq!(store.mark_interrupted().unwrap(), vec![run]);
        assert_eq!(store.run(Some(run)).unwrap().status, "interrupted");
        assert!(store.mark_interrupted().unwrap().is_empty());
    }

    #[test]
    fn a_version_2_store_keeps_every_result_and_verdict_through_the_compact_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(migrations::MIGRATIONS[0]).unwrap();
            conn.execute_batch(migrations::MIGRATIONS[1]).unwrap();
            conn.pragma_update(None, "user_version", 2).unwrap();
            conn.execute_batch(
                "INSERT INTO runs (id, started_at, status, prompt_set_hash, samples, lanes)
                     VALUES (1, '2026-11-01T03:00:00.000Z', 'finished', 'set', 2, '[\"free\",\"paid\"]');
                 INSERT INTO outputs VALUES
                     ('bdff8c417ab50e95e95cce16035a3799c7e00104de4a7b3453f06728c620faf7', 'Paris.');
                 INSERT INTO results (run_id, lane, prompt_id, prompt_hash, sample, outcome,
                     output_hash, model, fingerprint, finish_reason, prompt_tokens,
                     completion_tokens, queue_ms, call_ms, error, created_at) VALUES
                   (1, 'free', 'capital', 'h1', 0, 'served',
                    'bdff8c417ab50e95e95cce16035a3799c7e00104de4a7b3453f06728c620faf7',
                    'm', NULL, 'stop', 3, 4, 1, 20, NULL, '2026-11-01T03:00:01.500Z'),
                   (1, 'free', 'capital', 'h1', 1, 'timeout', NULL, NULL, NULL, NULL, NULL,
                    NULL, 0, 30000, 'deadline passed', '2026-11-01T03:00:31.000Z'),
                   (1, 'paid', 'capital', 'h1', 0, 'served',
                    'bdff8c417ab50e95e95cce16035a3799c7e00104de4a7b3453f06728c620faf7',
                    'm', 'fp', 'stop', 3, 4, 2, 25, NULL, '2026-11-01T03:00:02.000Z');
                 INSERT INTO verdicts (run_id, lane, prompt_id, verdict, similarity, review,
                     reasons, mode, p_value) VALUES
                   (1, 'free', 'capital', 'drifted', 0.5, 0, '[\"one sample timed out\"]',
                    'sampled', 0.004),
                   (1, 'paid', 'capital', 'unchanged', 1.0, 0, '[]', 'exact', NULL);",
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), KNOWN_VERSION);
        let results = store.results(1).unwrap();
        assert_eq!(results.len(), 3);
        assert_eq!(
            (results[0].lane.as_str(), results[0].prompt_hash.as_str()),
            ("free", "h1")
        );
        assert_eq!(results[0].output.as_deref(), Some("Paris."));
        assert_eq!(results[1].outcome, "timeout");
        assert_eq!(results[1].error.as_deref(), Some("deadline passed"));
        assert_eq!(results[1].output, None);
        assert_eq!(results[2].fingerprint.as_deref(), Some("fp"));
        assert_eq!(results[2].call_ms, 25);
        let verdicts = store.verdicts(1).unwrap();
        assert_eq!(
            verdicts[0].reasons,
            vec!["one sample timed out".to_string()]
        );
        assert_eq!(verdicts[0].mode.as_deref(), Some("sampled"));
        assert_eq!(verdicts[0].p_value, Some(0.004));
        assert_eq!(verdicts[1].verdict, "unchanged");
        assert!(verdicts[1].reasons.is_empty());
        assert_eq!(store.counts().unwrap(), (3, 1));
        let at: Vec<i64> = store
            .conn
            .prepare("SELECT at_ms FROM results ORDER BY at_ms")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(at, vec![1500, 2000, 31000]);
        assert_eq!(store.integrity_check().unwrap(), "ok");
        // A text stored before the migration is found again by its hash, not stored twice.
        let mut store = store;
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        store
            .insert_result(run, &result("capital", 0, Some("Paris.")))
            .unwrap();
        assert_eq!(store.counts().unwrap(), (4, 1));
    }

    #[test]
    fn prune_keeps_baseline_runs_pending_alerts_each_lanes_latest_alert_and_the_newest_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("c.db")).unwrap();
        let lanes = ["free".to_string(), "paid".to_string()];
        for _ in 1..=6 {
            let run = store.begin_run("set", 1, &lanes).unwrap();
            store
                .insert_result(run, &result("a", 0, Some(&format!("answer {run}"))))
                .unwrap();
            store.finish_run(run, &[], &[], 0).unwrap();
        }
        let alert = |run_id, lane| NewAlert {
            run_id,
            lane,
            kind: "drift",
            signature: "s",
            channel: "email",
            subject: "s",
            body_text: "b",
            body_html: "b",
        };
        // Alert ids (1, 2, 3) differ from their runs (3, 5, 2) on purpose.
        let first = store.insert_alert(&alert(3, "free")).unwrap();
        store.record_delivery(first, None).unwrap();
        let latest = store.insert_alert(&alert(5, "free")).unwrap();
        store.record_delivery(latest, None).unwrap();
        store.insert_alert(&alert(2, "paid")).unwrap(); // never delivered
        let pruned = store
            .prune("9999-01-01T00:00:00.000Z", &[1], false)
            .unwrap();
        assert_eq!(
            pruned,
            Pruned {
                runs: 2,
                results: 2,
                texts: 2
            }
        );
        let mut kept: Vec<i64> = store.runs(10).unwrap().iter().map(|r| r.id).collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![1, 2, 5, 6]);
        assert_eq!(store.last_alert("free").unwrap().unwrap().id, latest);
        assert_eq!(store.pending_alerts().unwrap().len(), 1);
        assert_eq!(store.counts().unwrap(), (4, 4));
        assert_eq!(store.integrity_check().unwrap(), "ok");
    }

    #[test]
    fn a_lock_holders_pid_is_read_from_its_description() {
        assert_eq!(
            lock::holder_pid("pid 4242 since 2026-11-30T03:00:00Z"),
            Some(4242)
        );
        assert_eq!(lock::holder_pid("run 7 (pid 12)"), Some(12));
        assert_eq!(lock::holder_pid("a run that is starting"), None);
    }
}
