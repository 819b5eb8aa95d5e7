//! What `history` and the report show of a window of runs: the attempts (no texts), verdicts
//! and lane verdicts of the last runs, read with one statement per table.
//!
//! A statement per run costs a round trip each on PostgreSQL, and joining the names in SQL
//! then sorting by them costs more than the scan: the rows are read by id, in no order, only
//! the columns shown, and the names (lanes, prompts, verdicts, outcomes: small tables) are
//! resolved here, each held once and shared, and sorted. Each run's rows come out in the order
//! [`Store::results_of`] and [`Store::verdicts_of`] give theirs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::db::{Db, DbError, params};
use super::{LaneVerdictRow, RunRow, Store, StoreError};

/// What a window of runs stored, per run: see [`Store::window`].
#[derive(Debug, Default)]
pub struct Window {
    attempts: BTreeMap<i64, Vec<Attempt>>,
    verdicts: BTreeMap<i64, Vec<Judged>>,
    lane_verdicts: BTreeMap<i64, Vec<LaneVerdictRow>>,
}

/// One attempt of a run, as a window shows it: no text, names shared between rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// Lane name.
    pub lane: Arc<str>,
    /// Prompt id.
    pub prompt_id: Arc<str>,
    /// Sample index.
    pub sample: i64,
    /// `served`, `timeout`, ...
    pub outcome: Arc<str>,
    /// Time on the wire (ms).
    pub call_ms: i64,
}

/// One prompt's verdict in a run, as a window shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// Lane name.
    pub lane: Arc<str>,
    /// Prompt id.
    pub prompt_id: Arc<str>,
    /// The verdict.
    pub verdict: Arc<str>,
    /// Similarity to the baseline.
    pub similarity: Option<f64>,
    /// The sampled test's p-value.
    pub p_value: Option<f64>,
}

impl Window {
    /// A run's attempts, in lane, prompt, sample order.
    pub fn attempts(&self, run: i64) -> &[Attempt] {
        self.attempts.get(&run).map_or(&[], Vec::as_slice)
    }

    /// A run's verdicts, in lane, prompt order.
    pub fn verdicts(&self, run: i64) -> &[Judged] {
        self.verdicts.get(&run).map_or(&[], Vec::as_slice)
    }

    /// A run's lane verdicts, in lane order.
    pub fn lane_verdicts(&self, run: i64) -> &[LaneVerdictRow] {
        self.lane_verdicts.get(&run).map_or(&[], Vec::as_slice)
    }
}

/// The names the window's rows point at.
struct Names {
    words: HashMap<i64, Arc<str>>,
    /// Prompt version: its prompt's word.
    versions: HashMap<i64, i64>,
    /// What was served: its outcome.
    served: HashMap<i64, Arc<str>>,
}

impl Names {
    fn read(db: &mut dyn Db) -> Result<Names, DbError> {
        let words = db
            .query("SELECT id, word FROM words", params![])?
            .iter()
            .map(|row| Ok((row.int(0)?, Arc::from(row.text(1)?))))
            .collect::<Result<_, DbError>>()?;
        let versions = db
            .query("SELECT id, prompt FROM prompt_versions", params![])?
            .iter()
            .map(|row| Ok((row.int(0)?, row.int(1)?)))
            .collect::<Result<_, DbError>>()?;
        let served = db
            .query("SELECT id, outcome FROM served_as", params![])?
            .iter()
            .map(|row| Ok((row.int(0)?, Arc::from(row.text(1)?))))
            .collect::<Result<_, DbError>>()?;
        Ok(Names {
            words,
            versions,
            served,
        })
    }

    fn word(&self, id: i64, column: usize) -> Result<Arc<str>, DbError> {
        self.words
            .get(&id)
            .cloned()
            .ok_or_else(|| missing(column, id))
    }
}

fn missing(column: usize, id: i64) -> DbError {
    DbError::Decode {
        column,
        message: format!("no row with id {id} to name it"),
    }
}

impl Store {
    /// The attempts (without their texts), verdicts and lane verdicts of `runs`, of one
    /// prompt when given, read with one statement per table.
    pub fn window(&self, runs: &[RunRow], prompt: Option<&str>) -> Result<Window, StoreError> {
        let (Some(first), Some(last)) = (
            runs.iter().map(|r| r.id).min(),
            runs.iter().map(|r| r.id).max(),
        ) else {
            return Ok(Window::default());
        };
        let mut window = self.db(|db| read(db, first, last, prompt))?;
        for lane in self.lane_verdicts_in(first, last)? {
            window
                .lane_verdicts
                .entry(lane.run_id)
                .or_default()
                .push(lane);
        }
        Ok(window)
    }
}

fn read(db: &mut dyn Db, first: i64, last: i64, prompt: Option<&str>) -> Result<Window, DbError> {
    let mut window = Window::default();
    let (only_results, only_verdicts, params) = match prompt {
        Some(prompt) => (
            " AND prompt IN (SELECT pv.id FROM prompt_versions pv JOIN words w ON w.id = pv.prompt
                             WHERE w.word = ?3)",
            " AND prompt = (SELECT id FROM words WHERE word = ?3)",
            params![first, last, prompt].to_vec(),
        ),
        None => ("", "", params![first, last].to_vec()),
    };
    let results = db.query(
        &format!(
            "SELECT run_id, lane, prompt, sample, served, call_ms
             FROM results WHERE run_id BETWEEN ?1 AND ?2{only_results}"
        ),
        &params,
    )?;
    let verdicts = db.query(
        &format!(
            "SELECT run_id, lane, prompt, verdict, similarity, p_value
             FROM verdicts WHERE run_id BETWEEN ?1 AND ?2{only_verdicts}"
        ),
        &params,
    )?;
    // The names last: a runner may commit rows with new names while this reads, and whatever
    // a row read above names was committed with it (names are never deleted).
    let names = Names::read(db)?;
    for row in &results {
        let version = row.int(2)?;
        let prompt = *names
            .versions
            .get(&version)
            .ok_or_else(|| missing(2, version))?;
        let served = row.int(4)?;
        let attempt = Attempt {
            lane: names.word(row.int(1)?, 1)?,
            prompt_id: names.word(prompt, 2)?,
            sample: row.int(3)?,
            outcome: names
                .served
                .get(&served)
                .cloned()
                .ok_or_else(|| missing(4, served))?,
            call_ms: row.int(5)?,
        };
        window
            .attempts
            .entry(row.int(0)?)
            .or_default()
            .push(attempt);
    }
    for attempts in window.attempts.values_mut() {
        attempts.sort_by(|a, b| {
            (&a.lane, &a.prompt_id, a.sample).cmp(&(&b.lane, &b.prompt_id, b.sample))
        });
    }
    for row in &verdicts {
        let verdict = Judged {
            lane: names.word(row.int(1)?, 1)?,
            prompt_id: names.word(row.int(2)?, 2)?,
            verdict: names.word(row.int(3)?, 3)?,
            similarity: row.opt_real(4)?,
            p_value: row.opt_real(5)?,
        };
        window
            .verdicts
            .entry(row.int(0)?)
            .or_default()
            .push(verdict);
    }
    for verdicts in window.verdicts.values_mut() {
        verdicts.sort_by(|a, b| (&a.lane, &a.prompt_id).cmp(&(&b.lane, &b.prompt_id)));
    }
    Ok(window)
}
