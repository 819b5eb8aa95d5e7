//! Commits a run's results on a thread of its own, in groups.
//!
//! The request workers hand each finished result over and go straight on; they never wait for
//! a disk sync. The thread commits what it has in one transaction (full sync), and every result
//! that arrived meanwhile goes into the next one: each result is durable within about one sync
//! of arriving, and a slow disk costs one sync per group instead of one per result.

use std::sync::mpsc;
use std::thread::JoinHandle;

use super::{NewResult, Store, StoreError, StoreLocation};

/// Most results in one transaction.
const MAX_GROUP: usize = 512;

/// A result ready to be committed, owning its texts.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedResult {
    /// Lane measured.
    pub lane: String,
    /// Prompt id.
    pub prompt_id: String,
    /// Prompt hash at the time.
    pub prompt_hash: String,
    /// Sample number, from 0.
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
    /// Prompt tokens.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens.
    pub completion_tokens: Option<u64>,
    /// Queue wait.
    pub queue_ms: u64,
    /// Call time.
    pub call_ms: u64,
    /// What failed, for failed results.
    pub error: Option<String>,
}

impl OwnedResult {
    /// Borrowed, as the store takes it.
    pub fn as_new(&self) -> NewResult<'_> {
        NewResult {
            lane: &self.lane,
            prompt_id: &self.prompt_id,
            prompt_hash: &self.prompt_hash,
            sample: self.sample,
            outcome: &self.outcome,
            output: self.output.as_deref(),
            model: self.model.as_deref(),
            fingerprint: self.fingerprint.as_deref(),
            finish_reason: self.finish_reason.as_deref(),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            queue_ms: self.queue_ms,
            call_ms: self.call_ms,
            error: self.error.as_deref(),
        }
    }
}

/// The committing thread of one run. Dropping it waits until everything handed over is
/// committed, so a run stopped by a signal still keeps every result that finished.
pub struct GroupWriter {
    sender: Option<mpsc::Sender<OwnedResult>>,
    thread: Option<JoinHandle<Result<usize, StoreError>>>,
}

impl GroupWriter {
    /// Opens its own connection to the store at `location` and starts committing results of
    /// `run_id`.
    pub fn start(
        location: impl Into<StoreLocation>,
        run_id: i64,
    ) -> Result<GroupWriter, StoreError> {
        let mut store = Store::connect(&location.into())?;
        let (sender, receiver) = mpsc::channel::<OwnedResult>();
        let thread = std::thread::Builder::new()
            .name("canary-store".into())
            .spawn(move || {
                let mut stored = 0;
                while let Ok(first) = receiver.recv() {
                    let mut group = vec![first];
                    group.extend(receiver.try_iter().take(MAX_GROUP - 1));
                    let (committed, failed) = commit_group(&mut store, run_id, &group);
                    stored += committed;
                    if let Some(err) = failed {
                        return Err(err);
                    }
                }
                Ok(stored)
            })
            .map_err(|source| StoreError::Thread { source })?;
        Ok(GroupWriter {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Hands a result over. `false` when the thread has stopped on an error, which `finish`
    /// returns.
    pub fn send(&self, result: OwnedResult) -> bool {
        self.sender
            .as_ref()
            .is_some_and(|sender| sender.send(result).is_ok())
    }

    /// Waits until every result handed over is committed; returns how many were.
    pub fn finish(mut self) -> Result<usize, StoreError> {
        self.sender.take();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => Ok(0),
        }
    }
}

/// Commits `group` in one transaction; if that fails, one by one, so one bad result does not
/// take the others with it. Returns how many were committed and the first error.
fn commit_group(
    store: &mut Store,
    run_id: i64,
    group: &[OwnedResult],
) -> (usize, Option<StoreError>) {
    let rows: Vec<NewResult<'_>> = group.iter().map(OwnedResult::as_new).collect();
    if store.insert_results(run_id, &rows).is_ok() {
        return (rows.len(), None);
    }
    let mut committed = 0;
    let mut failed = None;
    for row in &rows {
        match store.insert_result(run_id, row) {
            Ok(()) => committed += 1,
            Err(err) => {
                failed.get_or_insert(err);
            }
        }
    }
    (committed, failed)
}

impl Drop for GroupWriter {
    fn drop(&mut self) {
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(n: usize) -> OwnedResult {
        OwnedResult {
            lane: "free".into(),
            prompt_id: format!("p{n}"),
            prompt_hash: "h".into(),
            sample: 0,
            outcome: "served".into(),
            output: Some(format!("answer {}", n % 7)),
            model: Some("m".into()),
            fingerprint: None,
            finish_reason: Some("stop".into()),
            prompt_tokens: Some(3),
            completion_tokens: Some(4),
            queue_ms: 0,
            call_ms: 5,
            error: None,
        }
    }

    #[test]
    fn every_result_handed_over_is_committed_in_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let store = Store::open(&path).unwrap();
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        let writer = GroupWriter::start(&path, run).unwrap();
        for n in 0..1000 {
            assert!(writer.send(result(n)));
        }
        assert_eq!(writer.finish().unwrap(), 1000);
        assert_eq!(store.counts().unwrap(), (1000, 7));
        assert_eq!(
            store.results(run).unwrap()[0].output.as_deref(),
            Some("answer 0")
        );
    }

    #[test]
    fn dropping_the_writer_still_commits_what_it_was_handed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let store = Store::open(&path).unwrap();
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        let writer = GroupWriter::start(&path, run).unwrap();
        for n in 0..50 {
            writer.send(result(n));
        }
        drop(writer);
        assert_eq!(store.counts().unwrap().0, 50);
    }

    #[test]
    fn a_failed_commit_stops_the_writer_and_finish_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let store = Store::open(&path).unwrap();
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        let writer = GroupWriter::start(&path, run).unwrap();
        // The same (lane, prompt, sample) twice breaks the store's uniqueness.
        writer.send(result(1));
        writer.send(result(1));
        let err = writer.finish().unwrap_err().to_string();
        assert!(err.contains("UNIQUE"), "{err}");
        assert_eq!(store.counts().unwrap().0, 1);
    }

    #[test]
    fn one_bad_result_does_not_take_its_group_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let mut store = Store::open(&path).unwrap();
        let run = store.begin_run("set", 1, &["free".into()]).unwrap();
        let (committed, failed) = commit_group(&mut store, run, &[result(1), result(1), result(2)]);
        assert_eq!(committed, 2);
        assert!(failed.unwrap().to_string().contains("UNIQUE"));
        assert_eq!(store.counts().unwrap().0, 2);
    }
}
