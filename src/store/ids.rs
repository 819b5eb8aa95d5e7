//! The ids of what results and verdicts repeat (lane and prompt names, verdict words, prompt
//! versions, what a server reported besides its text), kept by the store that writes them.
//!
//! None of these rows is ever deleted while a run writes (only `canary store copy` clears them,
//! in a target that holds no run), so an id once committed stays right for the life of the
//! store (as does when a run started, which the time of each result is counted from): a writer looks each up once instead of once per result, which on PostgreSQL is a round
//! trip each. Ids found or added inside a transaction are only staged; they become known when it
//! commits and are forgotten when it rolls back, since a rolled-back insert's id names nothing.
//! Output texts are not kept here: `prune` deletes the ones no result uses any more.

use std::collections::HashMap;
use std::hash::Hash;

use super::db::{Db, DbError, Param, params};

/// What a result reported besides its text: outcome, model, fingerprint, finish reason.
type Served = (String, Option<String>, Option<String>, Option<String>);

/// Known ids, committed and staged.
#[derive(Debug, Default)]
pub(super) struct Ids {
    committed: Known,
    staged: Known,
}

#[derive(Debug, Default)]
struct Known {
    words: HashMap<String, i64>,
    versions: HashMap<(i64, String), i64>,
    served: HashMap<Served, i64>,
    started: HashMap<i64, String>,
}

impl Known {
    fn absorb(&mut self, other: &mut Known) {
        self.words.extend(other.words.drain());
        self.versions.extend(other.versions.drain());
        self.served.extend(other.served.drain());
        self.started.extend(other.started.drain());
    }
}

/// The id under `key` in `committed` or `staged`, or the one `find` returns, staged.
fn known<K: Eq + Hash>(
    committed: &HashMap<K, i64>,
    staged: &mut HashMap<K, i64>,
    key: K,
    find: impl FnOnce() -> Result<i64, DbError>,
) -> Result<i64, DbError> {
    if let Some(id) = committed.get(&key).or_else(|| staged.get(&key)) {
        return Ok(*id);
    }
    let id = find()?;
    staged.insert(key, id);
    Ok(id)
}

impl Ids {
    /// Ends a transaction: what it staged becomes known if it committed.
    pub(super) fn settle(&mut self, committed: bool) {
        if committed {
            self.committed.absorb(&mut self.staged);
        } else {
            self.staged = Known::default();
        }
    }

    /// The id of `word`, adding it the first time.
    pub(super) fn word(&mut self, db: &mut dyn Db, word: &str) -> Result<i64, DbError> {
        known(
            &self.committed.words,
            &mut self.staged.words,
            word.to_owned(),
            || {
                find_or_insert(
                    db,
                    "SELECT id FROM words WHERE word = ?1",
                    params![word],
                    "INSERT INTO words (word) VALUES (?1) ON CONFLICT (word) DO NOTHING
                     RETURNING id",
                    params![word],
                )
            },
        )
    }

    /// The id of a prompt at one version of its text.
    pub(super) fn prompt_version(
        &mut self,
        db: &mut dyn Db,
        prompt: i64,
        hash: &str,
    ) -> Result<i64, DbError> {
        known(
            &self.committed.versions,
            &mut self.staged.versions,
            (prompt, hash.to_owned()),
            || {
                find_or_insert(
                    db,
                    "SELECT id FROM prompt_versions WHERE prompt = ?1 AND hash = ?2",
                    params![prompt, hash],
                    "INSERT INTO prompt_versions (prompt, hash) VALUES (?1, ?2)
                     ON CONFLICT (prompt, hash) DO NOTHING RETURNING id",
                    params![prompt, hash],
                )
            },
        )
    }

    /// The id of what a result reported besides its text. Two runners adding the same
    /// combination at once may store it twice; each copy reads the same.
    pub(super) fn served_as(
        &mut self,
        db: &mut dyn Db,
        outcome: &str,
        model: Option<&str>,
        fingerprint: Option<&str>,
        finish_reason: Option<&str>,
    ) -> Result<i64, DbError> {
        let key = (
            outcome.to_owned(),
            model.map(str::to_owned),
            fingerprint.map(str::to_owned),
            finish_reason.map(str::to_owned),
        );
        known(&self.committed.served, &mut self.staged.served, key, || {
            let values = params![outcome, model, fingerprint, finish_reason];
            find_or_insert(
                db,
                "SELECT id FROM served_as WHERE outcome = ?1 AND model IS NOT DISTINCT FROM ?2
                     AND fingerprint IS NOT DISTINCT FROM ?3
                     AND finish_reason IS NOT DISTINCT FROM ?4
                 ORDER BY id LIMIT 1",
                values,
                "INSERT INTO served_as (outcome, model, fingerprint, finish_reason)
                 VALUES (?1, ?2, ?3, ?4) RETURNING id",
                values,
            )
        })
    }

    /// When run `run_id` started (RFC 3339), `None` for a run the store does not hold.
    pub(super) fn started(
        &mut self,
        db: &mut dyn Db,
        run_id: i64,
    ) -> Result<Option<String>, DbError> {
        if let Some(started) = self
            .committed
            .started
            .get(&run_id)
            .or_else(|| self.staged.started.get(&run_id))
        {
            return Ok(Some(started.clone()));
        }
        let started = db
            .query_opt("SELECT started_at FROM runs WHERE id = ?1", params![run_id])?
            .map(|row| row.text(0))
            .transpose()?;
        if let Some(started) = &started {
            self.staged.started.insert(run_id, started.clone());
        }
        Ok(started)
    }
}

/// The id of the row `select` finds by `key`, or of the row `insert` adds from `row`: how
/// what repeats from result to result is stored once. An insert another runner beat (it
/// returns no row) is found by a second look.
pub(super) fn find_or_insert(
    db: &mut dyn Db,
    select: &str,
    key: &[Param<'_>],
    insert: &str,
    row: &[Param<'_>],
) -> Result<i64, DbError> {
    if let Some(found) = db.query_opt(select, key)? {
        return found.int(0);
    }
    match db.query_opt(insert, row)? {
        Some(inserted) => inserted.int(0),
        None => db.query_one(select, key)?.int(0),
    }
}
