//! The store: runs, every result as it arrives, verdicts and alerts.
//!
//! An embedded SQLite file by default (WAL mode, full sync), or a PostgreSQL database that
//! several runners share. The queries are written once, behind [`db::Db`]. Results are
//! committed as they arrive (in groups, by [`writer::GroupWriter`], so a slow disk never holds
//! up the requests), and a run killed at any instant leaves a consistent store holding every
//! result committed up to then. Output texts are content-addressed, stored once however many
//! runs repeat them.

pub mod copy;
pub mod db;
mod ids;
pub mod lease;
pub mod location;
pub mod lock;
mod migrations;
pub mod postgres;
mod window;
pub mod writer;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};
use sha2::{Digest, Sha256};

use db::{Db, DbError, Dialect, Param, SqliteDb, params, transaction};
pub use location::{PostgresTarget, StoreLocation};
pub use window::{Attempt, Judged, Window};

/// A store problem.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused, or could not be reached.
    #[error("store {store}: {source}")]
    Database {
        /// The store, as [`StoreLocation`] displays it (never with a password).
        store: String,
        /// What the database said.
        source: DbError,
    },
    /// A PostgreSQL store cannot be connected to.
    #[error("store {store}: {source}")]
    Connect {
        /// The store.
        store: String,
        /// Why.
        source: postgres::ConnectError,
    },
    /// The store was written by a newer canary.
    #[error(
        "store {store} has schema version {found}, newer than this canary understands ({known}); upgrade canary"
    )]
    TooNew {
        /// The store.
        store: String,
        /// Its version.
        found: i64,
        /// Ours.
        known: i64,
    },
    /// The folder of the store cannot be created.
    #[error("cannot create the folder of store {store}: {source}")]
    Folder {
        /// The store file.
        store: String,
        /// Why.
        source: std::io::Error,
    },
    /// The store needs a newer schema, but a run holds it.
    #[error(
        "store {store} must be migrated to this canary's schema, but a run is using it ({holder}); try again when it has finished"
    )]
    MigrationWaits {
        /// The store file.
        store: String,
        /// Who holds the run lock.
        holder: String,
    },
    /// Another runner holds the lease on a lane.
    #[error(
        "lane {lane} is being measured by another runner ({holder}, run {run_id}) until at least {until}; its lease lapses if that runner dies"
    )]
    LeaseHeld {
        /// The lane (and shard) leased.
        lane: String,
        /// The runner holding it.
        holder: String,
        /// Its run.
        run_id: i64,
        /// When its lease ends unless renewed.
        until: String,
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
    /// The shard of the prompt set it measured (`2/4`), if it measured one.
    pub shard: Option<String>,
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

/// A lease a runner holds on a lane of a shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// The lane (with its shard, for a sharded run).
    pub lane: String,
    /// The run holding it.
    pub run_id: i64,
    /// Its runner: host and pid.
    pub runner: String,
    /// When it lapses unless renewed (RFC 3339).
    pub until: String,
}

/// The store.
pub struct Store {
    backend: Backend,
    ids: ids::Ids,
    location: StoreLocation,
    name: String,
}

enum Backend {
    Sqlite(Connection),
    Postgres(Box<Mutex<postgres::PgConn>>),
}

/// The schema version this canary writes, on both engines.
pub const KNOWN_VERSION: i64 = migrations::KNOWN_VERSION;

impl Store {
    /// Opens (creating and migrating as needed) the store at `location`. A PostgreSQL store
    /// takes its password from the env var `password_env` names, or `PGPASSWORD`.
    pub fn open(location: impl Into<StoreLocation>) -> Result<Store, StoreError> {
        Store::open_with_env(&location.into(), &|name| std::env::var(name).ok())
    }

    /// [`Store::open`], reading env vars through `env`. A shared store's runs whose leases
    /// lapsed are marked `interrupted` as it opens, so every command shows them as they are.
    pub fn open_with_env(
        location: &StoreLocation,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Store, StoreError> {
        let mut store = Store::connect_with_env(location, env)?;
        match location {
            StoreLocation::Sqlite(path) => store.migrate_sqlite(path)?,
            StoreLocation::Postgres(_) => {
                store.migrate_postgres()?;
                for id in store.mark_lapsed()? {
                    tracing::warn!(
                        "run {id} stopped renewing its lane leases (its runner died); marked interrupted, its stored results are kept"
                    );
                }
            }
        }
        Ok(store)
    }

    /// Another connection to a store this process has already opened (migrated): for the
    /// threads that commit results and renew leases.
    pub(crate) fn connect(location: &StoreLocation) -> Result<Store, StoreError> {
        Store::connect_with_env(location, &|name| std::env::var(name).ok())
    }

    fn connect_with_env(
        location: &StoreLocation,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Store, StoreError> {
        let name = location.to_string();
        match location {
            StoreLocation::Sqlite(path) => Store::connect_sqlite(path, location, name),
            StoreLocation::Postgres(target) => {
                let conn = postgres::PgConn::connect(target, env).map_err(|source| {
                    StoreError::Connect {
                        store: name.clone(),
                        source,
                    }
                })?;
                Ok(Store {
                    backend: Backend::Postgres(Box::new(Mutex::new(conn))),
                    ids: ids::Ids::default(),
                    location: location.clone(),
                    name,
                })
            }
        }
    }

    fn connect_sqlite(
        path: &Path,
        location: &StoreLocation,
        name: String,
    ) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Folder {
                store: name.clone(),
                source,
            })?;
        }
        let sql = |source: rusqlite::Error| StoreError::Database {
            store: name.clone(),
            source: source.into(),
        };
        let conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(sql)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;",
        )
        .map_err(sql)?;
        Ok(Store {
            backend: Backend::Sqlite(conn),
            ids: ids::Ids::default(),
            location: location.clone(),
            name,
        })
    }

    /// Where the store is.
    pub fn location(&self) -> &StoreLocation {
        &self.location
    }

    /// Which engine holds it.
    pub fn dialect(&self) -> Dialect {
        match self.backend {
            Backend::Sqlite(_) => Dialect::Sqlite,
            Backend::Postgres(_) => Dialect::Postgres,
        }
    }

    fn err(&self, source: DbError) -> StoreError {
        StoreError::Database {
            store: self.name.clone(),
            source,
        }
    }

    /// Runs `work` against the database: the one place the two engines meet.
    pub(crate) fn db<R: Send>(
        &self,
        work: impl FnOnce(&mut dyn Db) -> Result<R, DbError> + Send,
    ) -> Result<R, StoreError> {
        let result = match &self.backend {
            Backend::Sqlite(conn) => work(&mut SqliteDb(conn)),
            Backend::Postgres(conn) => conn
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .with(work),
        };
        result.map_err(|source| self.err(source))
    }

    fn migrate_sqlite(&mut self, path: &Path) -> Result<(), StoreError> {
        let Backend::Sqlite(conn) = &mut self.backend else {
            return Ok(());
        };
        let name = self.name.clone();
        let sql = |source: rusqlite::Error| StoreError::Database {
            store: name.clone(),
            source: source.into(),
        };
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(sql)?;
        if version > KNOWN_VERSION {
            return Err(StoreError::TooNew {
                store: name,
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
            match lock::RunLock::acquire(path) {
                Ok(lock) => Some(lock),
                Err(lock::LockError::Held { holder, .. })
                    if lock::holder_pid(&holder) == Some(std::process::id()) =>
                {
                    None
                }
                Err(lock::LockError::Held { holder, .. }) => {
                    return Err(StoreError::MigrationWaits {
                        store: name,
                        holder,
                    });
                }
                Err(lock::LockError::Io { .. }) => None,
            }
        } else {
            None
        };
        // Immediate, and the version read again inside: two canaries opening the same old
        // store migrate it once.
        let tx = conn
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

    fn migrate_postgres(&mut self) -> Result<(), StoreError> {
        let Backend::Postgres(conn) = &self.backend else {
            return Ok(());
        };
        let migrated = conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .migrate()
            .map_err(|source| self.err(source))?;
        match migrated {
            postgres::Migrated::TooNew(found) => Err(StoreError::TooNew {
                store: self.name.clone(),
                found,
                known: KNOWN_VERSION,
            }),
            postgres::Migrated::To(version) => {
                tracing::info!("store {}: schema brought to version {version}", self.name);
                Ok(())
            }
            postgres::Migrated::Current => Ok(()),
        }
    }

    /// Schema version of the store.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        match &self.backend {
            Backend::Sqlite(conn) => conn
                .query_row("PRAGMA user_version", [], |row| row.get(0))
                .map_err(|e| self.err(e.into())),
            Backend::Postgres(conn) => conn
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .version()
                .map_err(|e| self.err(e)),
        }
    }

    /// Marks runs still `running` as `interrupted`. Call only while holding the run lock of a
    /// SQLite store: then no such run can be alive. Returns their ids.
    pub fn mark_interrupted(&self) -> Result<Vec<i64>, StoreError> {
        self.db(|db| {
            db.query(
                "UPDATE runs SET status = 'interrupted' WHERE status = 'running' RETURNING id",
                params![],
            )?
            .iter()
            .map(|row| row.int(0))
            .collect()
        })
    }

    /// Marks runs still `running` whose lease has lapsed as `interrupted` (their runner died
    /// or lost the store), and drops lapsed leases. Returns the runs' ids.
    pub fn mark_lapsed(&self) -> Result<Vec<i64>, StoreError> {
        self.db(|db| {
            let now = clock(db)?;
            let ids = db
                .query(
                    "UPDATE runs SET status = 'interrupted'
                     WHERE status = 'running' AND lease_until IS NOT NULL AND lease_until < ?1
                     RETURNING id",
                    params![now.as_str()],
                )?
                .iter()
                .map(|row| row.int(0))
                .collect::<Result<Vec<i64>, _>>()?;
            db.execute("DELETE FROM leases WHERE until < ?1", params![now.as_str()])?;
            Ok(ids)
        })
    }

    /// Marks one run `interrupted` (stopped by a signal), if it is still `running`.
    pub fn mark_run_interrupted(&self, run_id: i64) -> Result<(), StoreError> {
        self.db(|db| {
            db.execute(
                "UPDATE runs SET status = 'interrupted' WHERE id = ?1 AND status = 'running'",
                params![run_id],
            )?;
            db.execute("DELETE FROM leases WHERE run_id = ?1", params![run_id])?;
            Ok(())
        })
    }

    /// Removes a run that never got to measure anything (its leases were refused).
    pub fn discard_run(&self, run_id: i64) -> Result<(), StoreError> {
        self.db(|db| {
            db.execute(
                "DELETE FROM runs WHERE id = ?1
                     AND NOT EXISTS (SELECT 1 FROM results WHERE run_id = ?1)",
                params![run_id],
            )?;
            Ok(())
        })
    }

    /// Starts a run and returns its id.
    pub fn begin_run(
        &self,
        prompt_set_hash: &str,
        samples: u32,
        lanes: &[String],
    ) -> Result<i64, StoreError> {
        self.begin_run_with(prompt_set_hash, samples, lanes, None)
    }

    /// Starts a run, of one shard of the prompt set (`2/4`) when `shard` is given.
    pub fn begin_run_with(
        &self,
        prompt_set_hash: &str,
        samples: u32,
        lanes: &[String],
        shard: Option<&str>,
    ) -> Result<i64, StoreError> {
        let lanes = serde_json::to_string(lanes).unwrap_or_default();
        let runner = runner();
        let started = now();
        self.db(|db| {
            db.query_one(
                "INSERT INTO runs (started_at, status, prompt_set_hash, samples, lanes, pid,
                     runner, shard)
                 VALUES (?1, 'running', ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
                params![
                    started.as_str(),
                    prompt_set_hash,
                    i64::from(samples),
                    lanes.as_str(),
                    i64::from(std::process::id()),
                    runner.as_str(),
                    shard
                ],
            )?
            .int(0)
        })
    }

    /// Takes the lease of run `run_id` on each of `lanes` for `ttl`, all or none: a lane whose
    /// lease another live run holds refuses with [`StoreError::LeaseHeld`]. Leases of runs
    /// whose runner died are taken over once they lapse.
    pub fn acquire_leases(
        &self,
        run_id: i64,
        lanes: &[String],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let runner = runner();
        let held = self.db(|db| {
            let now = clock(db)?;
            let until = later(&now, ttl);
            // In one order, so two runners asking for overlapping lanes cannot deadlock.
            let mut lanes = lanes.to_vec();
            lanes.sort();
            let taken = transaction(db, true, |db| {
                for lane in &lanes {
                    // A whole lane and its shards exclude each other; shards of it do not.
                    let base = lane.split(" shard ").next().unwrap_or(lane);
                    let prefix = format!("{base} shard ");
                    let whole = base == lane.as_str();
                    if let Some(other) = db.query_opt(
                        "SELECT lane FROM leases
                         WHERE until >= ?1 AND run_id != ?2
                             AND (lane = ?3 OR lane = ?4
                                  OR (?5 = 1 AND substr(lane, 1, ?6) = ?7))
                         LIMIT 1",
                        params![
                            now.as_str(),
                            run_id,
                            base,
                            lane.as_str(),
                            whole,
                            prefix.chars().count() as i64,
                            prefix.as_str()
                        ],
                    )? {
                        return Err(DbError::Refused(other.text(0)?));
                    }
                    let taken = db.query_opt(
                        "INSERT INTO leases (lane, run_id, runner, until) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (lane) DO UPDATE SET run_id = excluded.run_id,
                             runner = excluded.runner, until = excluded.until
                         WHERE leases.until < ?5
                         RETURNING run_id",
                        params![
                            lane.as_str(),
                            run_id,
                            runner.as_str(),
                            until.as_str(),
                            now.as_str()
                        ],
                    )?;
                    if taken.is_none() {
                        return Err(DbError::Refused(lane.clone()));
                    }
                }
                db.execute(
                    "UPDATE runs SET lease_until = ?2 WHERE id = ?1",
                    params![run_id, until.as_str()],
                )?;
                Ok(())
            });
            match taken {
                Ok(()) => Ok(None),
                Err(DbError::Refused(lane)) => {
                    let holder = db.query_opt(
                        "SELECT lane, run_id, runner, until FROM leases WHERE lane = ?1",
                        params![lane.as_str()],
                    )?;
                    Ok(Some(match holder {
                        Some(row) => lease_row(&row)?,
                        None => LeaseRow {
                            lane,
                            run_id: 0,
                            runner: "a runner that has just finished".into(),
                            until: now.clone(),
                        },
                    }))
                }
                Err(err) => Err(err),
            }
        })?;
        match held {
            None => Ok(()),
            Some(lease) => Err(StoreError::LeaseHeld {
                lane: lease.lane,
                holder: lease.runner,
                run_id: lease.run_id,
                until: lease.until,
            }),
        }
    }

    /// Extends the leases of `run_id` by `ttl` from now. Returns how many it still holds
    /// (fewer than it took means another runner took a lapsed one over), or `None` once the
    /// run is no longer `running` (it finished, or was found dead).
    pub fn renew_leases(&self, run_id: i64, ttl: Duration) -> Result<Option<u64>, StoreError> {
        self.db(|db| {
            let until = later(&clock(db)?, ttl);
            transaction(db, true, |db| {
                let running = db.execute(
                    "UPDATE runs SET lease_until = ?2 WHERE id = ?1 AND status = 'running'",
                    params![run_id, until.as_str()],
                )?;
                if running == 0 {
                    return Ok(None);
                }
                let renewed = db.execute(
                    "UPDATE leases SET until = ?2 WHERE run_id = ?1",
                    params![run_id, until.as_str()],
                )?;
                Ok(Some(renewed))
            })
        })
    }

    /// Gives up the leases of `run_id`.
    pub fn release_leases(&self, run_id: i64) -> Result<(), StoreError> {
        self.db(|db| {
            db.execute("DELETE FROM leases WHERE run_id = ?1", params![run_id])?;
            Ok(())
        })
    }

    /// The live lease on `lane`, if a runner holds one.
    pub fn live_lease(&self, lane: &str) -> Result<Option<LeaseRow>, StoreError> {
        self.db(|db| {
            let now = clock(db)?;
            db.query_opt(
                "SELECT lane, run_id, runner, until FROM leases WHERE lane = ?1 AND until >= ?2",
                params![lane, now.as_str()],
            )?
            .map(|row| lease_row(&row))
            .transpose()
        })
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
        let committed = chrono::Utc::now();
        self.write(|db, ids| {
            if db.dialect() == Dialect::Postgres {
                db.execute(
                    "SELECT pg_advisory_xact_lock_shared(?1)",
                    params![WRITERS_LOCK],
                )?;
            }
            let at_ms = ids
                .started(db, run_id)?
                .and_then(|s| chrono::DateTime::parse_from_rfc3339(&s).ok())
                .map_or(0, |s| (committed - s.to_utc()).num_milliseconds().max(0));
            for result in results {
                insert_result(db, ids, run_id, at_ms, result)?;
            }
            Ok(())
        })
    }

    /// Runs `work` in a write transaction with the ids the store knows; the ids it adds become
    /// known only if it commits.
    fn write<R: Send>(
        &mut self,
        work: impl FnOnce(&mut dyn Db, &mut ids::Ids) -> Result<R, DbError> + Send,
    ) -> Result<R, StoreError> {
        let mut ids = std::mem::take(&mut self.ids);
        let result = self.db(|db| transaction(db, true, |db| work(db, &mut ids)));
        ids.settle(result.is_ok());
        self.ids = ids;
        result
    }

    /// Stores the verdicts of a run (replacing any earlier ones) and ends it.
    pub fn finish_run(
        &mut self,
        run_id: i64,
        items: &[VerdictRow],
        lanes: &[LaneVerdictRow],
        exit_code: i32,
    ) -> Result<(), StoreError> {
        let finished = now();
        self.write(|db, ids| {
            db.execute("DELETE FROM verdicts WHERE run_id = ?1", params![run_id])?;
            db.execute(
                "DELETE FROM lane_verdicts WHERE run_id = ?1",
                params![run_id],
            )?;
            for item in items {
                let reasons = (!item.reasons.is_empty())
                    .then(|| serde_json::to_string(&item.reasons).unwrap_or_default());
                let lane = ids.word(db, &item.lane)?;
                let prompt = ids.word(db, &item.prompt_id)?;
                let verdict = ids.word(db, &item.verdict)?;
                let mode = item.mode.as_deref().map(|m| ids.word(db, m)).transpose()?;
                db.execute(
                    "INSERT INTO verdicts (run_id, lane, prompt, verdict, similarity, review,
                         reasons, mode, p_value)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    params![
                        run_id,
                        lane,
                        prompt,
                        verdict,
                        item.similarity,
                        item.review,
                        reasons.as_deref(),
                        mode,
                        item.p_value
                    ],
                )?;
            }
            for lane in lanes {
                db.execute(
                    "INSERT INTO lane_verdicts (run_id, lane, verdict, reasons, p_value)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        run_id,
                        lane.lane.as_str(),
                        lane.verdict.as_str(),
                        serde_json::to_string(&lane.reasons)
                            .unwrap_or_default()
                            .as_str(),
                        lane.p_value
                    ],
                )?;
            }
            db.execute(
                "UPDATE runs SET status = 'finished', finished_at = ?2, exit_code = ?3
                 WHERE id = ?1",
                params![run_id, finished.as_str(), i64::from(exit_code)],
            )?;
            db.execute("DELETE FROM leases WHERE run_id = ?1", params![run_id])?;
            Ok(())
        })
    }

    /// The run with `id`, or the latest run that has results when `id` is `None`.
    pub fn run(&self, id: Option<i64>) -> Result<RunRow, StoreError> {
        let row = self.db(|db| match id {
            Some(id) => db
                .query_opt(&format!("{RUN_SELECT} WHERE id = ?1"), params![id])?
                .map(|row| run_row(&row))
                .transpose(),
            None => db
                .query_opt(
                    &format!(
                        "{RUN_SELECT} WHERE EXISTS (SELECT 1 FROM results r WHERE r.run_id = runs.id)
                         ORDER BY id DESC LIMIT 1"
                    ),
                    params![],
                )?
                .map(|row| run_row(&row))
                .transpose(),
        })?;
        row.ok_or(match id {
            Some(id) => StoreError::NoSuchRun(id),
            None => StoreError::NoRuns,
        })
    }

    /// The latest runs, newest first.
    pub fn runs(&self, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        self.db(|db| {
            db.query(
                &format!("{RUN_SELECT} ORDER BY id DESC LIMIT ?1"),
                params![limit as i64],
            )?
            .iter()
            .map(run_row)
            .collect()
        })
    }

    /// The latest runs up to `run_id` (included), newest first.
    pub fn runs_through(&self, run_id: i64, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        self.db(|db| {
            db.query(
                &format!("{RUN_SELECT} WHERE id <= ?1 ORDER BY id DESC LIMIT ?2"),
                params![run_id, limit as i64],
            )?
            .iter()
            .map(run_row)
            .collect()
        })
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
            ("CAST(NULL AS TEXT)", "")
        };
        let (only, params) = of_run(run_id, prompt);
        let sql = format!(
            "SELECT r.run_id, l.word, p.word, pv.hash, r.sample, s.outcome, {column}, s.model,
                    s.fingerprint, s.finish_reason, r.completion_tokens, r.queue_ms,
                    r.call_ms, r.error
             FROM results r
             JOIN words l ON l.id = r.lane
             JOIN prompt_versions pv ON pv.id = r.prompt
             JOIN words p ON p.id = pv.prompt
             JOIN served_as s ON s.id = r.served
             {join}
             WHERE r.run_id = ?1 {only}
             ORDER BY l.word, p.word, r.sample"
        );
        self.db(|db| {
            db.query(&sql, &params)?
                .iter()
                .map(|row| {
                    Ok(StoredResult {
                        run_id: row.int(0)?,
                        lane: row.text(1)?,
                        prompt_id: row.text(2)?,
                        prompt_hash: row.text(3)?,
                        sample: row.int(4)?,
                        outcome: row.text(5)?,
                        output: row.opt_text(6)?,
                        model: row.opt_text(7)?,
                        fingerprint: row.opt_text(8)?,
                        finish_reason: row.opt_text(9)?,
                        completion_tokens: row.opt_int(10)?,
                        queue_ms: row.int(11)?,
                        call_ms: row.int(12)?,
                        error: row.opt_text(13)?,
                    })
                })
                .collect()
        })
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
        let (only, params) = of_run(run_id, prompt);
        let sql = format!(
            "SELECT l.word, p.word, w.word, v.similarity, v.review, v.reasons, m.word, v.p_value
             FROM verdicts v
             JOIN words l ON l.id = v.lane
             JOIN words p ON p.id = v.prompt
             JOIN words w ON w.id = v.verdict
             LEFT JOIN words m ON m.id = v.mode
             WHERE v.run_id = ?1 {only}
             ORDER BY l.word, p.word"
        );
        self.db(|db| {
            db.query(&sql, &params)?
                .iter()
                .map(|row| {
                    Ok(VerdictRow {
                        lane: row.text(0)?,
                        prompt_id: row.text(1)?,
                        verdict: row.text(2)?,
                        similarity: row.opt_real(3)?,
                        review: row.bool(4)?,
                        reasons: row
                            .opt_text(5)?
                            .map(|r| serde_json::from_str(&r).unwrap_or_default())
                            .unwrap_or_default(),
                        mode: row.opt_text(6)?,
                        p_value: row.opt_real(7)?,
                    })
                })
                .collect()
        })
    }

    /// Lane verdicts stored for a run.
    pub fn lane_verdicts(&self, run_id: i64) -> Result<Vec<LaneVerdictRow>, StoreError> {
        self.lane_verdicts_where("run_id = ?1 ORDER BY lane", params![run_id])
    }

    /// Lane verdicts stored for the runs with ids from `first` to `last`, in run order.
    pub fn lane_verdicts_in(
        &self,
        first: i64,
        last: i64,
    ) -> Result<Vec<LaneVerdictRow>, StoreError> {
        self.lane_verdicts_where(
            "run_id BETWEEN ?1 AND ?2 ORDER BY run_id, lane",
            params![first, last],
        )
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

    fn lane_verdicts_where(
        &self,
        filter: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<LaneVerdictRow>, StoreError> {
        let sql = format!(
            "SELECT run_id, lane, verdict, reasons, p_value FROM lane_verdicts WHERE {filter}"
        );
        self.db(|db| {
            db.query(&sql, params)?
                .iter()
                .map(|row| {
                    Ok(LaneVerdictRow {
                        run_id: row.int(0)?,
                        lane: row.text(1)?,
                        verdict: row.text(2)?,
                        reasons: serde_json::from_str(&row.text(3)?).unwrap_or_default(),
                        p_value: row.opt_real(4)?,
                    })
                })
                .collect()
        })
    }

    /// The newest verdicts of `lane` from a finished run started between `since` and `until`
    /// (RFC 3339) other than `except_run`: what another runner judged of a lane this run did not
    /// measure. Returns the run and its verdicts.
    pub fn latest_verdicts_of_lane(
        &self,
        lane: &str,
        since: &str,
        until: &str,
        except_run: i64,
    ) -> Result<Option<(i64, Vec<VerdictRow>)>, StoreError> {
        let run = self.db(|db| {
            db.query_opt(
                "SELECT DISTINCT v.run_id FROM verdicts v
                 JOIN words l ON l.id = v.lane
                 JOIN runs ON runs.id = v.run_id
                 WHERE l.word = ?1 AND runs.status = 'finished' AND runs.started_at >= ?2
                     AND runs.started_at <= ?3 AND runs.id != ?4
                 ORDER BY v.run_id DESC LIMIT 1",
                params![lane, since, until, except_run],
            )?
            .map(|row| row.int(0))
            .transpose()
        })?;
        let Some(run) = run else { return Ok(None) };
        let verdicts = self
            .verdicts(run)?
            .into_iter()
            .filter(|v| v.lane == lane)
            .collect();
        Ok(Some((run, verdicts)))
    }

    /// Stores a pending alert; returns its id.
    pub fn insert_alert(&self, alert: &NewAlert<'_>) -> Result<i64, StoreError> {
        self.db(|db| insert_alert(db, alert))
    }

    /// Stores `alerts` of `lane` only if the lane's newest alert is still `expected` (its id,
    /// `None` for none): the check and the inserts are one transaction, under a lock on the
    /// lane, so two runners that judged the same lane state raise its alert once. Returns the
    /// new ids, or `None` when another runner raised one first (decide again).
    pub fn insert_alerts_if_last(
        &self,
        lane: &str,
        expected: Option<i64>,
        alerts: &[NewAlert<'_>],
    ) -> Result<Option<Vec<i64>>, StoreError> {
        let lock_key = lane_lock_key(lane);
        self.db(|db| {
            transaction(db, true, |db| {
                if db.dialect() == Dialect::Postgres {
                    db.execute("SELECT pg_advisory_xact_lock(?1)", params![lock_key])?;
                }
                let last = db
                    .query_one("SELECT MAX(id) FROM alerts WHERE lane = ?1", params![lane])?
                    .opt_int(0)?;
                if last != expected {
                    return Ok(None);
                }
                alerts
                    .iter()
                    .map(|alert| insert_alert(db, alert))
                    .collect::<Result<Vec<i64>, _>>()
                    .map(Some)
            })
        })
    }

    /// Claims a pending alert for delivery by this runner for `ttl`: `true` when this runner
    /// is the one to send it; `false` when it was sent or another runner holds a live claim.
    pub fn claim_alert(&self, id: i64, ttl: Duration) -> Result<bool, StoreError> {
        let runner = runner();
        self.db(|db| {
            let now = clock(db)?;
            let until = later(&now, ttl);
            Ok(db.execute(
                "UPDATE alerts SET claimed_by = ?2, claimed_until = ?3
                 WHERE id = ?1 AND status = 'pending'
                     AND (claimed_until IS NULL OR claimed_until < ?4)",
                params![id, runner.as_str(), until.as_str(), now.as_str()],
            )? == 1)
        })
    }

    /// Records a delivery attempt: sent, or still pending with the error. Either way the
    /// claim on it ends.
    pub fn record_delivery(&self, id: i64, error: Option<&str>) -> Result<(), StoreError> {
        let sent_at = now();
        self.db(|db| {
            match error {
                None => db.execute(
                    "UPDATE alerts SET status = 'sent', sent_at = ?2, error = NULL,
                         attempts = attempts + 1, claimed_by = NULL, claimed_until = NULL
                     WHERE id = ?1",
                    params![id, sent_at.as_str()],
                )?,
                Some(error) => db.execute(
                    "UPDATE alerts SET error = ?2, attempts = attempts + 1, claimed_by = NULL,
                         claimed_until = NULL
                     WHERE id = ?1",
                    params![id, error],
                )?,
            };
            Ok(())
        })
    }

    /// Alerts not delivered yet, oldest first.
    pub fn pending_alerts(&self) -> Result<Vec<AlertRow>, StoreError> {
        self.alerts_where("status = 'pending' ORDER BY id", params![])
    }

    /// The newest alert raised for a lane (any channel, sent or pending).
    pub fn last_alert(&self, lane: &str) -> Result<Option<AlertRow>, StoreError> {
        Ok(self
            .alerts_where("lane = ?1 ORDER BY id DESC LIMIT 1", params![lane])?
            .pop())
    }

    /// Every alert of a run.
    pub fn alerts_of_run(&self, run_id: i64) -> Result<Vec<AlertRow>, StoreError> {
        self.alerts_where("run_id = ?1 ORDER BY id", params![run_id])
    }

    fn alerts_where(
        &self,
        filter: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<AlertRow>, StoreError> {
        let sql = format!(
            "SELECT id, run_id, lane, kind, signature, channel, status, subject, body_text,
                    body_html, error, attempts, created_at FROM alerts WHERE {filter}"
        );
        self.db(|db| {
            db.query(&sql, params)?
                .iter()
                .map(|row| {
                    Ok(AlertRow {
                        id: row.int(0)?,
                        run_id: row.int(1)?,
                        lane: row.text(2)?,
                        kind: row.text(3)?,
                        signature: row.text(4)?,
                        channel: row.text(5)?,
                        status: row.text(6)?,
                        subject: row.text(7)?,
                        body_text: row.text(8)?,
                        body_html: row.text(9)?,
                        error: row.opt_text(10)?,
                        attempts: row.int(11)?,
                        created_at: row.text(12)?,
                    })
                })
                .collect()
        })
    }

    /// Counts of stored rows: (results, distinct outputs), for reports and tests of dedup.
    pub fn counts(&self) -> Result<(i64, i64), StoreError> {
        self.db(|db| {
            let row = db.query_one(
                "SELECT (SELECT COUNT(*) FROM results), (SELECT COUNT(*) FROM texts)",
                params![],
            )?;
            Ok((row.int(0)?, row.int(1)?))
        })
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
        // Integers only, so the list is written into the statement as it is.
        let keep = keep
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        // No baselines: nothing is kept for them (`NOT IN (NULL)` would keep everything).
        let keep = if keep.is_empty() {
            String::new()
        } else {
            format!("AND id NOT IN ({keep})")
        };
        let pruned = self.db(|db| {
            let (create, drop) = match db.dialect() {
                Dialect::Sqlite => (
                    "CREATE TEMP TABLE doomed (id INTEGER PRIMARY KEY)",
                    "DROP TABLE temp.doomed",
                ),
                Dialect::Postgres => (
                    "CREATE TEMP TABLE doomed (id BIGINT PRIMARY KEY)",
                    "DROP TABLE doomed",
                ),
            };
            db.batch(match db.dialect() {
                Dialect::Sqlite => "BEGIN IMMEDIATE",
                Dialect::Postgres => "BEGIN",
            })?;
            let result = prune_in(db, create, cutoff, &keep, dry_run);
            match (&result, dry_run) {
                (Ok(_), false) => {
                    db.batch(drop)?;
                    db.batch("COMMIT")?;
                }
                // Rolled back, the temporary table with it.
                _ => {
                    let _ = db.batch("ROLLBACK");
                }
            }
            result
        })?;
        if let (false, Backend::Sqlite(conn)) = (dry_run, &self.backend) {
            // Fold the log back into the file, so the freed pages show as free space in it
            // rather than as a log as large as what was removed. The prune is committed either
            // way: a reader holding the log open only postpones this to SQLite's next
            // checkpoint.
            if let Err(err) = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);") {
                tracing::debug!("checkpoint after prune postponed: {err}");
            }
        }
        Ok(pruned)
    }

    /// Rewrites the store without its free space (`VACUUM`), so it shrinks after a prune.
    pub fn vacuum(&self) -> Result<(), StoreError> {
        self.db(|db| match db.dialect() {
            Dialect::Sqlite => db.batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);"),
            Dialect::Postgres => db.batch("VACUUM"),
        })
    }

    /// Bytes the store takes on disk: the database file and its write-ahead log, or the
    /// PostgreSQL tables with their indexes.
    pub fn disk_bytes(&self) -> u64 {
        match (&self.backend, &self.location) {
            (Backend::Sqlite(_), StoreLocation::Sqlite(path)) => {
                let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
                let mut wal = path.clone().into_os_string();
                wal.push("-wal");
                size(path) + size(Path::new(&wal))
            }
            _ => self
                .db(|db| {
                    db.query_one(
                        "SELECT CAST(COALESCE(SUM(pg_total_relation_size(c.oid)), 0) AS BIGINT)
                         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = current_schema() AND c.relkind = 'r'",
                        params![],
                    )?
                    .int(0)
                })
                .map_or(0, |bytes| bytes.max(0) as u64),
        }
    }

    /// The engine's own consistency check; `ok` when the store is sound. PostgreSQL checks
    /// itself as it writes, so there it is `ok` once the store answers.
    pub fn integrity_check(&self) -> Result<String, StoreError> {
        self.db(|db| match db.dialect() {
            Dialect::Sqlite => db.query_one("PRAGMA integrity_check", params![])?.text(0),
            Dialect::Postgres => {
                db.query_one("SELECT 1", params![])?;
                Ok("ok".into())
            }
        })
    }
}

/// The filter (beyond `run_id = ?1`) and parameters of a read of one run, of one prompt only
/// when it is given. Two statements rather than one with `(?2 IS NULL OR ...)`: PostgreSQL's
/// cached generic plan of that form loops over every prompt of a run.
fn of_run(run_id: i64, prompt: Option<&str>) -> (&'static str, Vec<Param<'_>>) {
    match prompt {
        Some(prompt) => ("AND p.word = ?2", vec![run_id.into(), prompt.into()]),
        None => ("", vec![run_id.into()]),
    }
}

fn prune_in(
    db: &mut dyn Db,
    create: &str,
    cutoff: &str,
    keep: &str,
    dry_run: bool,
) -> Result<Pruned, DbError> {
    let postgres = db.dialect() == Dialect::Postgres;
    if postgres {
        // Waits for every result transaction in flight (they hold this lock shared), so no
        // runner commits a result pointing at a text this prune removes.
        db.execute("SELECT pg_advisory_xact_lock(?1)", params![WRITERS_LOCK])?;
    }
    db.batch(create)?;
    db.execute(
        &format!(
            "INSERT INTO doomed (id) SELECT id FROM runs
             WHERE started_at < ?1 AND status != 'running'
               {keep}
               AND id < (SELECT MAX(id) FROM runs)
               AND id NOT IN (SELECT run_id FROM alerts WHERE status = 'pending')
               AND id NOT IN (SELECT run_id FROM alerts
                              WHERE id IN (SELECT MAX(id) FROM alerts GROUP BY lane))"
        ),
        params![cutoff],
    )?;
    let mut count =
        |query: &str| -> Result<i64, DbError> { db.query_one(query, params![])?.int(0) };
    let mut pruned = Pruned {
        runs: count("SELECT COUNT(*) FROM doomed")?,
        results: count("SELECT COUNT(*) FROM results WHERE run_id IN (SELECT id FROM doomed)")?,
        texts: 0,
    };
    if dry_run {
        // SQLite runs `NOT IN` with a temporary index; PostgreSQL plans `NOT EXISTS` as a hash
        // anti-join, where its `NOT IN` over a large subquery would be quadratic.
        pruned.texts = if postgres {
            count(
                "SELECT COUNT(*) FROM texts t WHERE NOT EXISTS
                     (SELECT 1 FROM results r WHERE r.output = t.id
                          AND r.run_id NOT IN (SELECT id FROM doomed))",
            )?
        } else {
            count(
                "SELECT COUNT(*) FROM texts WHERE id NOT IN
                     (SELECT output FROM results WHERE output IS NOT NULL
                          AND run_id NOT IN (SELECT id FROM doomed))",
            )?
        };
        return Ok(pruned);
    }
    db.batch(
        "DELETE FROM alerts WHERE run_id IN (SELECT id FROM doomed);
         DELETE FROM verdicts WHERE run_id IN (SELECT id FROM doomed);
         DELETE FROM lane_verdicts WHERE run_id IN (SELECT id FROM doomed);
         DELETE FROM results WHERE run_id IN (SELECT id FROM doomed);
         DELETE FROM leases WHERE run_id IN (SELECT id FROM doomed);
         DELETE FROM runs WHERE id IN (SELECT id FROM doomed);",
    )?;
    pruned.texts = db.execute(
        if postgres {
            "DELETE FROM texts t WHERE NOT EXISTS (SELECT 1 FROM results r WHERE r.output = t.id)"
        } else {
            "DELETE FROM texts WHERE id NOT IN
                 (SELECT output FROM results WHERE output IS NOT NULL)"
        },
        params![],
    )? as i64;
    Ok(pruned)
}

/// Commits one result, storing what repeats once.
fn insert_result(
    db: &mut dyn Db,
    ids: &mut ids::Ids,
    run_id: i64,
    at_ms: i64,
    result: &NewResult<'_>,
) -> Result<(), DbError> {
    // What a server sent is stored as the same text on both engines: PostgreSQL's text
    // cannot hold NUL, so neither store does.
    let output = result.output.map(storable);
    let (model, fingerprint, finish_reason, error) = (
        result.model.map(storable),
        result.fingerprint.map(storable),
        result.finish_reason.map(storable),
        result.error.map(storable),
    );
    let result = &NewResult {
        output: output.as_deref(),
        model: model.as_deref(),
        fingerprint: fingerprint.as_deref(),
        finish_reason: finish_reason.as_deref(),
        error: error.as_deref(),
        ..result.clone()
    };
    let lane = ids.word(db, result.lane)?;
    let prompt_word = ids.word(db, result.prompt_id)?;
    let prompt = ids.prompt_version(db, prompt_word, result.prompt_hash)?;
    let served = ids.served_as(
        db,
        result.outcome,
        result.model,
        result.fingerprint,
        result.finish_reason,
    )?;
    let output = result.output.map(|text| text_id(db, text)).transpose()?;
    db.execute(
        "INSERT INTO results (run_id, lane, prompt, sample, served, output, prompt_tokens,
             completion_tokens, queue_ms, call_ms, error, at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            run_id,
            lane,
            prompt,
            result.sample,
            served,
            output,
            result.prompt_tokens.map(bounded),
            result.completion_tokens.map(bounded),
            bounded(result.queue_ms),
            bounded(result.call_ms),
            result.error,
            bounded(at_ms.max(0) as u64)
        ],
    )?;
    Ok(())
}

fn insert_alert(db: &mut dyn Db, alert: &NewAlert<'_>) -> Result<i64, DbError> {
    db.query_one(
        "INSERT INTO alerts (run_id, lane, kind, signature, channel, status, subject,
             body_text, body_html, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?9) RETURNING id",
        params![
            alert.run_id,
            alert.lane,
            alert.kind,
            alert.signature,
            alert.channel,
            alert.subject,
            alert.body_text,
            alert.body_html,
            now().as_str()
        ],
    )?
    .int(0)
}

/// A count or a time in ms as the store holds it: at most 2^31 - 1, the largest of
/// PostgreSQL's four-byte `INTEGER` (24 days in ms). A server that reports more tokens than
/// that has its count stored as that, not its result refused.
fn bounded(n: u64) -> i64 {
    n.min(i32::MAX as u64) as i64
}

/// `text` without NUL characters (each becomes U+FFFD).
fn storable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// The id of an output text, stored once by its SHA-256.
fn text_id(db: &mut dyn Db, text: &str) -> Result<i64, DbError> {
    let hash = Sha256::digest(text.as_bytes());
    ids::find_or_insert(
        db,
        "SELECT id FROM texts WHERE hash = ?1",
        params![hash.as_slice()],
        "INSERT INTO texts (hash, text) VALUES (?1, ?2) ON CONFLICT (hash) DO NOTHING
         RETURNING id",
        params![hash.as_slice(), text],
    )
}

const RUN_SELECT: &str = "SELECT id, started_at, finished_at, status, prompt_set_hash, samples, lanes, exit_code, shard FROM runs";

fn run_row(row: &db::Row) -> Result<RunRow, DbError> {
    Ok(RunRow {
        id: row.int(0)?,
        started_at: row.text(1)?,
        finished_at: row.opt_text(2)?,
        status: row.text(3)?,
        prompt_set_hash: row.text(4)?,
        samples: row.int(5)?,
        lanes: serde_json::from_str(&row.text(6)?).unwrap_or_default(),
        exit_code: row.opt_int(7)?,
        shard: row.opt_text(8)?,
    })
}

fn lease_row(row: &db::Row) -> Result<LeaseRow, DbError> {
    Ok(LeaseRow {
        lane: row.text(0)?,
        run_id: row.int(1)?,
        runner: row.text(2)?,
        until: row.text(3)?,
    })
}

/// The advisory lock result transactions hold shared and a prune takes alone (PostgreSQL).
const WRITERS_LOCK: i64 = 0x6361_6e61_7279_0001;

/// The advisory-lock key of a lane's alerts (PostgreSQL): the first 8 bytes of a SHA-256.
fn lane_lock_key(lane: &str) -> i64 {
    let digest = Sha256::digest(format!("canary alerts {lane}").as_bytes());
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

/// This runner, as runs, leases and claims name it: host and pid.
pub fn runner() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into());
    format!("{host} pid {}", std::process::id())
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The database's clock, as the store writes times. Leases and claims are read and written
/// by this one clock, so runners whose own clocks disagree still agree on when a lease lapses.
fn clock(db: &mut dyn Db) -> Result<String, DbError> {
    let sql = match db.dialect() {
        Dialect::Sqlite => "SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        Dialect::Postgres => {
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
        }
    };
    db.query_one(sql, params![])?.text(0)
}

/// `ttl` after `now` (a time the store wrote), as the store writes times.
fn later(now: &str, ttl: Duration) -> String {
    let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
    chrono::DateTime::parse_from_rfc3339(now)
        .map(|t| t.to_utc())
        .unwrap_or_else(|_| chrono::Utc::now())
        .checked_add_signed(ttl)
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
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
        let mut store = Store::open(dir.path().join("c.db")).unwrap();
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
    fn ids_added_by_a_transaction_that_rolled_back_are_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path().join("c.db")).unwrap();
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        let fresh = NewResult {
            lane: "fresh",
            ..result("a", 0, Some("x"))
        };
        // The second result repeats the first's key, so the whole transaction rolls back,
        // the words `fresh` and `a` with it.
        assert!(
            store
                .insert_results(run, &[fresh.clone(), fresh.clone()])
                .is_err()
        );
        // Another word takes the id the rolled-back one had.
        let other = NewResult {
            lane: "other",
            ..result("b", 0, Some("y"))
        };
        store.insert_result(run, &other).unwrap();
        store.insert_result(run, &fresh).unwrap();
        let stored: Vec<_> = store
            .results(run)
            .unwrap()
            .into_iter()
            .map(|r| (r.lane, r.prompt_id, r.output))
            .collect();
        assert_eq!(
            stored,
            [
                ("fresh".into(), "a".into(), Some("x".into())),
                ("other".into(), "b".into(), Some("y".into()))
            ]
        );
    }

    #[test]
    fn schema_5_holds_counts_that_schema_4_stored_past_four_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let mut store = Store::open(&path).unwrap();
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        store
            .insert_result(run, &result("a", 0, Some("x")))
            .unwrap();
        drop(store);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "UPDATE results SET completion_tokens = 99999999999, at_ms = 4000000000;
                 PRAGMA user_version = 4;",
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), 5);
        let stored = &store.results(run).unwrap()[0];
        assert_eq!(stored.completion_tokens, Some(i64::from(i32::MAX)));
        assert_eq!(stored.output.as_deref(), Some("x"));
    }

    #[test]
    fn a_window_of_runs_reads_what_each_run_reads() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path().join("c.db")).unwrap();
        // Written out of order, so the window's own sort is what puts them in order.
        let keys = [("paid", "b"), ("paid", "a"), ("free", "b"), ("free", "a")];
        for night in 0u8..4 {
            let run = store.begin_run("set", 1, &["free".into()]).unwrap();
            for (lane, prompt) in keys {
                let answer = format!("{prompt} {}", night % 2);
                let outcome = NewResult {
                    lane,
                    call_ms: 10 + u64::from(night),
                    ..result(prompt, 0, (night != 2).then_some(answer.as_str()))
                };
                store.insert_result(run, &outcome).unwrap();
            }
            let items: Vec<VerdictRow> = keys
                .iter()
                .map(|(lane, prompt)| VerdictRow {
                    lane: (*lane).into(),
                    prompt_id: (*prompt).into(),
                    verdict: if night % 2 == 0 {
                        "unchanged"
                    } else {
                        "drifted"
                    }
                    .into(),
                    similarity: Some(f64::from(night) / 4.0),
                    review: false,
                    reasons: Vec::new(),
                    mode: None,
                    p_value: (*lane == "free").then_some(0.5),
                })
                .collect();
            let lane = LaneVerdictRow {
                run_id: run,
                lane: "free".into(),
                verdict: items[0].verdict.clone(),
                reasons: Vec::new(),
                p_value: Some(f64::from(night)),
            };
            store.finish_run(run, &items, &[lane], 0).unwrap();
        }
        let runs = store.runs(3).unwrap();
        assert_eq!(runs.len(), 3);
        for prompt in [None, Some("b")] {
            let window = store.window(&runs, prompt).unwrap();
            for run in &runs {
                let results = store.results_of(run.id, prompt, false).unwrap();
                assert_eq!(results.len(), if prompt.is_some() { 2 } else { 4 });
                let attempts: Vec<_> = window
                    .attempts(run.id)
                    .iter()
                    .map(|a| {
                        (
                            a.lane.to_string(),
                            a.prompt_id.to_string(),
                            a.sample,
                            a.outcome.to_string(),
                            a.call_ms,
                        )
                    })
                    .collect();
                let expected: Vec<_> = results
                    .iter()
                    .map(|r| {
                        (
                            r.lane.clone(),
                            r.prompt_id.clone(),
                            r.sample,
                            r.outcome.clone(),
                            r.call_ms,
                        )
                    })
                    .collect();
                assert_eq!(attempts, expected);
                let verdicts = store.verdicts_of(run.id, prompt).unwrap();
                assert!(!verdicts.is_empty());
                let judged: Vec<_> = window
                    .verdicts(run.id)
                    .iter()
                    .map(|v| {
                        (
                            v.lane.to_string(),
                            v.prompt_id.to_string(),
                            v.verdict.to_string(),
                            v.similarity,
                            v.p_value,
                        )
                    })
                    .collect();
                let expected: Vec<_> = verdicts
                    .iter()
                    .map(|v| {
                        (
                            v.lane.clone(),
                            v.prompt_id.clone(),
                            v.verdict.clone(),
                            v.similarity,
                            v.p_value,
                        )
                    })
                    .collect();
                assert_eq!(judged, expected);
                let lanes = store.lane_verdicts(run.id).unwrap();
                assert_eq!(window.lane_verdicts(run.id), lanes.as_slice());
            }
            // The run before the window is not read.
            assert!(window.attempts(runs[2].id - 1).is_empty());
            assert!(window.verdicts(runs[2].id - 1).is_empty());
        }
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
        let store = Store::open(dir.path().join("c.db")).unwrap();
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
            .db(|db| {
                db.query("SELECT at_ms FROM results ORDER BY at_ms", params![])?
                    .iter()
                    .map(|row| row.int(0))
                    .collect()
            })
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
        let mut store = Store::open(dir.path().join("c.db")).unwrap();
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
    fn a_lane_lease_refuses_a_second_run_until_it_lapses_and_then_the_first_run_is_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path().join("c.db")).unwrap();
        let lanes = ["free".to_string(), "paid".to_string()];
        let first = store.begin_run("set", 1, &lanes).unwrap();
        store
            .acquire_leases(first, &lanes, Duration::from_millis(300))
            .unwrap();
        let lease = store.live_lease("free").unwrap().unwrap();
        assert_eq!(lease.run_id, first);
        assert!(
            lease
                .runner
                .contains(&format!("pid {}", std::process::id()))
        );
        chrono::DateTime::parse_from_rfc3339(&lease.until).unwrap();

        let second = store.begin_run("set", 1, &lanes[1..]).unwrap();
        let held = store
            .acquire_leases(second, &lanes[1..], Duration::from_secs(60))
            .unwrap_err();
        assert!(
            matches!(&held, StoreError::LeaseHeld { lane, run_id, .. } if lane == "paid" && *run_id == first),
            "{held}"
        );
        assert_eq!(
            store
                .renew_leases(first, Duration::from_millis(300))
                .unwrap(),
            Some(2)
        );
        assert!(
            store.mark_lapsed().unwrap().is_empty(),
            "a live lease is not lapsed"
        );

        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(store.live_lease("free").unwrap(), None);
        assert_eq!(store.mark_lapsed().unwrap(), vec![first]);
        assert_eq!(store.run(Some(first)).unwrap().status, "interrupted");
        assert_eq!(store.run(Some(second)).unwrap().status, "running");
        store
            .acquire_leases(second, &lanes[1..], Duration::from_secs(60))
            .unwrap();
        store.finish_run(second, &[], &[], 0).unwrap();
        assert_eq!(
            store.live_lease("paid").unwrap(),
            None,
            "finishing releases"
        );

        // Shards of a lane run side by side; the whole lane and a shard of it do not.
        let ttl = Duration::from_secs(60);
        let shard_one = store.begin_run("set", 1, &lanes[..1]).unwrap();
        store
            .acquire_leases(shard_one, &["free shard 1/2".into()], ttl)
            .unwrap();
        let shard_two = store.begin_run("set", 1, &lanes[..1]).unwrap();
        store
            .acquire_leases(shard_two, &["free shard 2/2".into()], ttl)
            .unwrap();
        let whole = store.begin_run("set", 1, &lanes[..1]).unwrap();
        let err = store.acquire_leases(whole, &lanes[..1], ttl).unwrap_err();
        assert!(matches!(err, StoreError::LeaseHeld { .. }), "{err}");
        store.finish_run(shard_one, &[], &[], 0).unwrap();
        store.finish_run(shard_two, &[], &[], 0).unwrap();
        store.acquire_leases(whole, &lanes[..1], ttl).unwrap();
        let late_shard = store.begin_run("set", 1, &lanes[..1]).unwrap();
        let err = store
            .acquire_leases(late_shard, &["free shard 1/2".into()], ttl)
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::LeaseHeld { lane, .. } if lane == "free"),
            "{err}"
        );
    }

    #[test]
    fn prune_without_any_baseline_still_removes_old_runs() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path().join("c.db")).unwrap();
        for _ in 0..3 {
            let run = store.begin_run("set", 1, &["free".into()]).unwrap();
            store
                .insert_result(run, &result("a", 0, Some("x")))
                .unwrap();
            store.finish_run(run, &[], &[], 0).unwrap();
        }
        let pruned = store.prune("9999-01-01T00:00:00.000Z", &[], false).unwrap();
        assert_eq!((pruned.runs, pruned.results), (2, 2), "all but the newest");
    }

    #[test]
    fn a_nul_in_what_a_server_sent_is_stored_as_a_replacement_character() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path().join("c.db")).unwrap();
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        let mut odd = result("a", 0, Some("yes\0no"));
        odd.model = Some("m\0");
        store.insert_result(run, &odd).unwrap();
        let stored = &store.results(run).unwrap()[0];
        assert_eq!(stored.output.as_deref(), Some("yes\u{FFFD}no"));
        assert_eq!(stored.model.as_deref(), Some("m\u{FFFD}"));
    }

    #[test]
    fn an_alert_is_stored_only_against_the_newest_alert_and_claimed_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("c.db")).unwrap();
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        let alert = NewAlert {
            run_id: run,
            lane: "free",
            kind: "drift",
            signature: "s",
            channel: "email",
            subject: "s",
            body_text: "b",
            body_html: "b",
        };
        let ids = store
            .insert_alerts_if_last("free", None, std::slice::from_ref(&alert))
            .unwrap()
            .unwrap();
        // A runner that judged against "no alert yet" is too late now.
        assert_eq!(
            store
                .insert_alerts_if_last("free", None, std::slice::from_ref(&alert))
                .unwrap(),
            None
        );
        assert_eq!(store.pending_alerts().unwrap().len(), 1);
        assert!(store.claim_alert(ids[0], Duration::from_secs(60)).unwrap());
        assert!(!store.claim_alert(ids[0], Duration::from_secs(60)).unwrap());
        store.record_delivery(ids[0], Some("smtp down")).unwrap();
        assert!(store.claim_alert(ids[0], Duration::from_secs(60)).unwrap());
        store.record_delivery(ids[0], None).unwrap();
        assert!(!store.claim_alert(ids[0], Duration::from_secs(60)).unwrap());
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
