//! The run lock: one `canary run` per store at a time.
//!
//! An advisory lock (`flock`) on `<store>.lock`, taken without waiting. The kernel releases it
//! when the holder dies, even by SIGKILL, so a crashed run never leaves a stale lock. The file
//! names the holder, so the refused run can say who holds it.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The lock is held elsewhere, or the lock file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error("another canary run holds the lock on {path}: {holder}")]
    Held {
        /// The lock file.
        path: PathBuf,
        /// What the holder wrote about itself.
        holder: String,
    },
    /// The lock file could not be created or locked.
    #[error("cannot use lock file {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The process id in a holder's description (`pid 4242 since ...`, `run 7 (pid 4242)`).
pub fn holder_pid(holder: &str) -> Option<u32> {
    let rest = &holder[holder.find("pid ")? + 4..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A held run lock; released on drop.
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
}

impl RunLock {
    /// The lock file of a store.
    pub fn path_for(store: &Path) -> PathBuf {
        let mut name = store.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        store.with_file_name(name)
    }

    /// Takes the lock of `store` at once, or says who holds it.
    pub fn acquire(store: &Path) -> Result<RunLock, LockError> {
        let path = RunLock::path_for(store);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(LockError::Held {
                    path,
                    holder: if holder.is_empty() {
                        "a run that is starting".into()
                    } else {
                        holder.to_string()
                    },
                });
            }
            Err(TryLockError::Error(err)) => return Err(io(err)),
        }
        let mut lock = RunLock {
            file,
            path: path.clone(),
        };
        let holder = format!(
            "pid {} since {}",
            std::process::id(),
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        lock.describe(&holder).map_err(io)?;
        Ok(lock)
    }

    /// Rewrites the holder's description (e.g. once the run has an id).
    pub fn describe(&mut self, holder: &str) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        self.file.write_all(holder.as_bytes())?;
        self.file.flush()
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What keeps two runs from measuring the same lanes at once: the file lock of a SQLite store,
/// or leases per lane in a shared PostgreSQL store (taken once the run has an id).
#[derive(Debug)]
pub enum RunGuard {
    /// The whole SQLite store, for this process.
    File(RunLock),
    /// Leases on this run's lanes, renewed until dropped.
    Leases(Option<super::lease::LeaseKeeper>),
}

impl RunGuard {
    /// Takes the file lock of a SQLite store at once, or says who holds it. A shared store
    /// has nothing to take before the run exists.
    pub fn take(store: &super::StoreLocation) -> Result<RunGuard, LockError> {
        match store.sqlite_path() {
            Some(path) => RunLock::acquire(path).map(RunGuard::File),
            None => Ok(RunGuard::Leases(None)),
        }
    }

    /// Names the holder (e.g. once the run has an id), for a file lock.
    pub fn describe(&mut self, holder: &str) -> std::io::Result<()> {
        match self {
            RunGuard::File(lock) => lock.describe(holder),
            RunGuard::Leases(_) => Ok(()),
        }
    }

    /// Keeps the run's leases renewed until the guard is dropped.
    pub fn keep(&mut self, keeper: super::lease::LeaseKeeper) {
        if let RunGuard::Leases(slot) = self {
            *slot = Some(keeper);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_acquire_is_refused_with_the_holder_and_a_release_frees_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("canary.db");
        let mut first = RunLock::acquire(&store).unwrap();
        first.describe("run 7 (pid 1)").unwrap();
        let err = RunLock::acquire(&store).unwrap_err().to_string();
        assert!(err.contains("run 7 (pid 1)"), "{err}");
        drop(first);
        RunLock::acquire(&store).unwrap();
    }
}
