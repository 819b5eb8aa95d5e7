//! Leases of a runner on its lanes in a shared store.
//!
//! A pid means nothing across machines, so a runner writing to PostgreSQL claims each lane it
//! measures (or each shard of one) with a lease that lapses unless renewed. A thread renews
//! it every third of its length while the run lasts. A runner that dies stops renewing: once
//! the lease lapses, its run reads as interrupted (every result it committed is kept) and the
//! lane is free for the next runner.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Store, StoreError, StoreLocation};

/// The lease keys of a run: its lanes, or its lanes' shard.
pub fn keys(lanes: &[String], shard: Option<&str>) -> Vec<String> {
    lanes
        .iter()
        .map(|lane| match shard {
            Some(shard) => format!("{lane} shard {shard}"),
            None => lane.clone(),
        })
        .collect()
}

/// Renews a run's leases on a thread of its own until dropped.
#[derive(Debug)]
pub struct LeaseKeeper {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl LeaseKeeper {
    /// Starts renewing the leases of `run_id` (`held` of them) for `ttl` every `ttl / 3`, over
    /// a connection of its own.
    pub fn start(
        location: &StoreLocation,
        run_id: i64,
        held: usize,
        ttl: Duration,
    ) -> Result<LeaseKeeper, StoreError> {
        let store = Store::connect(location)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("canary-lease".into())
            .spawn(move || {
                let every = ttl / 3;
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    match store.renew_leases(run_id, ttl) {
                        // Finished: its leases went with its verdicts.
                        Ok(None) => break,
                        Ok(Some(renewed)) if (renewed as usize) < held => tracing::warn!(
                            "run {run_id}: holds {renewed} of its {held} lane leases; another runner took over a lapsed one"
                        ),
                        Ok(Some(_)) => {}
                        Err(err) => tracing::warn!(
                            "run {run_id}: cannot renew its lane leases ({err}); they lapse in {} unless the store answers",
                            humantime::format_duration(ttl)
                        ),
                    }
                }
            })
            .map_err(|source| StoreError::Thread { source })?;
        Ok(LeaseKeeper {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_leases_its_lanes_shard() {
        let lanes = vec!["free".to_string(), "paid".to_string()];
        assert_eq!(keys(&lanes, None), lanes);
        assert_eq!(
            keys(&lanes, Some("2/4")),
            ["free shard 2/4", "paid shard 2/4"]
        );
    }
}
