//! `canary store copy`: a history moved between stores (SQLite to PostgreSQL and back), row
//! for row with the same ids, then verified: the target is read back and its row counts and a
//! SHA-256 of every table's content must equal the source's.

use sha2::{Digest, Sha256};

use super::db::{Db, DbError, Dialect, Param, Row, Value, params, transaction};
use super::{Store, StoreError};

/// Rows read and written per statement group.
const PAGE: i64 = 5_000;

/// One table of the store and how its rows are read in a stable order.
struct Table {
    name: &'static str,
    columns: &'static str,
    /// Read by `id` in pages, or by run (tables keyed by run first).
    by_run: bool,
    order: &'static str,
    /// Has an identity `id` whose PostgreSQL sequence must move past the copied ids.
    identity: bool,
}

/// In the order rows can be inserted: what a row refers to comes first.
const TABLES: &[Table] = &[
    Table {
        name: "words",
        columns: "id, word",
        by_run: false,
        order: "id",
        identity: true,
    },
    Table {
        name: "prompt_versions",
        columns: "id, prompt, hash",
        by_run: false,
        order: "id",
        identity: true,
    },
    Table {
        name: "served_as",
        columns: "id, outcome, model, fingerprint, finish_reason",
        by_run: false,
        order: "id",
        identity: true,
    },
    Table {
        name: "texts",
        columns: "id, hash, text",
        by_run: false,
        order: "id",
        identity: true,
    },
    Table {
        name: "runs",
        columns: "id, started_at, finished_at, status, prompt_set_hash, samples, lanes, exit_code, pid, runner, lease_until, shard",
        by_run: false,
        order: "id",
        identity: true,
    },
    Table {
        name: "results",
        columns: "run_id, lane, prompt, sample, served, output, prompt_tokens, completion_tokens, queue_ms, call_ms, error, at_ms",
        by_run: true,
        order: "run_id, lane, prompt, sample",
        identity: false,
    },
    Table {
        name: "verdicts",
        columns: "run_id, lane, prompt, verdict, similarity, review, reasons, mode, p_value",
        by_run: true,
        order: "run_id, lane, prompt",
        identity: false,
    },
    Table {
        name: "lane_verdicts",
        columns: "run_id, lane, verdict, reasons, p_value",
        by_run: true,
        order: "run_id, lane",
        identity: false,
    },
    Table {
        name: "alerts",
        columns: "id, run_id, lane, kind, signature, channel, status, subject, body_text, body_html, error, attempts, created_at, sent_at, claimed_by, claimed_until",
        by_run: false,
        order: "id",
        identity: true,
    },
];

/// What a copy moved, table by table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// (table, rows, SHA-256 of its content as hex), in copy order; the same on both sides.
    pub tables: Vec<(String, u64, String)>,
}

/// Why a copy did not happen or did not verify.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Reading or writing failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The target already holds a history.
    #[error("the target store {target} already holds {runs} runs; copy into an empty store")]
    NotEmpty {
        /// The target.
        target: String,
        /// Its runs.
        runs: i64,
    },
    /// The target read back differs from the source.
    #[error(
        "the copy does not verify: table {table} has {source_rows} rows (sha256 {source_hash}) in the source but {target_rows} (sha256 {target_hash}) in the target"
    )]
    Mismatch {
        /// The table.
        table: String,
        /// Rows in the source.
        source_rows: u64,
        /// Its content hash.
        source_hash: String,
        /// Rows in the target.
        target_rows: u64,
        /// Its content hash.
        target_hash: String,
    },
}

/// Copies every row of `from` into the empty store `to`, then verifies the target against
/// the source. `progress` hears about each table as it is done.
pub fn copy(from: &Store, to: &Store, progress: &dyn Fn(&str, u64)) -> Result<Copied, CopyError> {
    let runs = to.db(|db| db.query_one("SELECT COUNT(*) FROM runs", params![])?.int(0))?;
    if runs > 0 {
        return Err(CopyError::NotEmpty {
            target: to.location().to_string(),
            runs,
        });
    }
    // Rows left by a copy that failed half-way: cleared, since no run refers to them.
    to.db(|db| {
        transaction(db, true, |db| {
            for table in TABLES.iter().rev() {
                db.execute(&format!("DELETE FROM {}", table.name), params![])?;
            }
            Ok(())
        })
    })?;
    let run_ids: Vec<i64> = from.db(|db| {
        db.query("SELECT id FROM runs ORDER BY id", params![])?
            .iter()
            .map(|row| row.int(0))
            .collect()
    })?;
    let mut copied = Copied { tables: Vec::new() };
    for table in TABLES {
        let mut digest = TableDigest::default();
        for_each_page(from, table, &run_ids, &mut |rows| {
            digest.add(rows);
            let insert = format!(
                "INSERT INTO {} ({}) VALUES ({})",
                table.name,
                table.columns,
                (1..=table.columns.split(',').count())
                    .map(|i| format!("?{i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            to.db(|db| {
                transaction(db, true, |db| {
                    for row in rows {
                        let params: Vec<Param<'_>> = row.0.iter().map(Value::as_param).collect();
                        db.execute(&insert, &params)?;
                    }
                    Ok(())
                })
            })
        })?;
        if table.identity {
            to.db(|db| advance_identity(db, table.name))?;
        }
        progress(table.name, digest.rows);
        copied
            .tables
            .push((table.name.to_owned(), digest.rows, digest.hex()));
    }
    verify(to, &run_ids, &copied)?;
    Ok(copied)
}

/// Reads the target back and compares each table's count and content hash with the source's.
fn verify(to: &Store, run_ids: &[i64], copied: &Copied) -> Result<(), CopyError> {
    for (table, (name, rows, hash)) in TABLES.iter().zip(&copied.tables) {
        let mut digest = TableDigest::default();
        for_each_page(to, table, run_ids, &mut |page| {
            digest.add(page);
            Ok(())
        })?;
        if digest.rows != *rows || digest.hex() != *hash {
            return Err(CopyError::Mismatch {
                table: name.clone(),
                source_rows: *rows,
                source_hash: hash.clone(),
                target_rows: digest.rows,
                target_hash: digest.hex(),
            });
        }
    }
    Ok(())
}

/// Calls `each` with the rows of `table` in order, a page at a time.
fn for_each_page(
    store: &Store,
    table: &Table,
    run_ids: &[i64],
    each: &mut dyn FnMut(&[Row]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    if table.by_run {
        let sql = format!(
            "SELECT {} FROM {} WHERE run_id = ?1 ORDER BY {}",
            table.columns, table.name, table.order
        );
        for run in run_ids {
            let rows = store.db(|db| db.query(&sql, params![*run]))?;
            if !rows.is_empty() {
                each(&rows)?;
            }
        }
        return Ok(());
    }
    let sql = format!(
        "SELECT {} FROM {} WHERE id > ?1 ORDER BY id LIMIT ?2",
        table.columns, table.name
    );
    let mut after = i64::MIN;
    loop {
        let rows = store.db(|db| db.query(&sql, params![after, PAGE]))?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        after = last.int(0).map_err(|source| StoreError::Database {
            store: store.location().to_string(),
            source,
        })?;
        each(&rows)?;
    }
}

/// Moves a PostgreSQL identity past the ids copied into its table.
fn advance_identity(db: &mut dyn Db, table: &str) -> Result<(), DbError> {
    if db.dialect() != Dialect::Postgres {
        return Ok(());
    }
    db.batch(&format!(
        "SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 0) + 1, false)
         FROM {table}"
    ))
}

/// A table's row count and a hash of its content, engine-independent.
#[derive(Default)]
struct TableDigest {
    rows: u64,
    hash: Sha256,
}

impl TableDigest {
    fn add(&mut self, rows: &[Row]) {
        for row in rows {
            self.rows += 1;
            for value in &row.0 {
                match value {
                    Value::Null => self.hash.update([0]),
                    Value::Int(i) => {
                        self.hash.update([1]);
                        self.hash.update(i.to_be_bytes());
                    }
                    Value::Real(f) => {
                        self.hash.update([2]);
                        self.hash.update(f.to_bits().to_be_bytes());
                    }
                    Value::Text(s) => {
                        self.hash.update([3]);
                        self.hash.update((s.len() as u64).to_be_bytes());
                        self.hash.update(s.as_bytes());
                    }
                    Value::Blob(b) => {
                        self.hash.update([4]);
                        self.hash.update((b.len() as u64).to_be_bytes());
                        self.hash.update(b);
                    }
                }
            }
        }
    }

    fn hex(&self) -> String {
        self.hash
            .clone()
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}
