//! Accepted baselines: `snapshots/<lane>/<prompt-id>.snap`.
//!
//! A short YAML header between `---` lines, then the output text exactly as the lane returned
//! it: readable in a pull request, diffable by git, and self-contained (the store is not needed
//! to judge against it).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::completion::Params;

/// A snapshot file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading or writing failed.
    #[error("snapshot {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a snapshot.
    #[error("snapshot {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// How much the baseline's own samples varied: outputs inside this band are noise, not drift.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Noise {
    /// Lowest similarity of any accepted sample to the primary one (1 with a single sample).
    pub similarity_floor: f64,
    /// Lowest and highest length of the samples relative to the primary.
    pub length_ratio: [f64; 2],
    /// Every answer the `answer` check extracted from the samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<String>,
    /// Whether the samples declined (absent when they disagreed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<bool>,
    /// Checks whose result differed between samples: they cannot signal drift.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flaky_checks: Vec<String>,
}

impl Default for Noise {
    fn default() -> Self {
        Noise {
            similarity_floor: 1.0,
            length_ratio: [1.0, 1.0],
            answers: Vec::new(),
            refusal: None,
            flaky_checks: Vec::new(),
        }
    }
}

/// The header of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotHeader {
    /// Prompt id.
    pub prompt_id: String,
    /// Hash of the prompt when accepted; a different current hash makes the baseline stale.
    pub prompt_hash: String,
    /// Lane.
    pub lane: String,
    /// Model the lane reported.
    #[serde(default)]
    pub model: Option<String>,
    /// Fingerprint the lane reported.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// Request parameters.
    #[serde(default)]
    pub params: Params,
    /// When it was accepted (RFC 3339).
    pub accepted_at: String,
    /// Run it was accepted from.
    pub accepted_from_run: i64,
    /// Samples behind the noise band.
    pub samples: u32,
    /// The noise band.
    pub noise: Noise,
}

/// A baseline: header plus the exact output.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Header.
    pub header: SnapshotHeader,
    /// The output text, exactly as returned.
    pub body: String,
}

/// `<snapshots>/<lane>/<prompt-id>.snap`.
pub fn path_for(snapshots: &Path, lane: &str, prompt_id: &str) -> PathBuf {
    snapshots.join(lane).join(format!("{prompt_id}.snap"))
}

impl Snapshot {
    /// Renders the file text.
    pub fn render(&self) -> String {
        let header = serde_saphyr::to_string(&self.header).unwrap_or_default();
        format!("---\n{}---\n{}", ensure_newline(&header), self.body)
    }

    /// Parses a snapshot file's text.
    pub fn parse(path: &Path, text: &str) -> Result<Snapshot, SnapshotError> {
        let invalid = |message: String| SnapshotError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let rest = text
            .strip_prefix("---\n")
            .ok_or_else(|| invalid("expected a `---` line first".into()))?;
        let (header, body) = match rest.find("\n---\n") {
            Some(end) => (&rest[..end + 1], &rest[end + 5..]),
            None => return Err(invalid("expected a `---` line closing the header".into())),
        };
        let header: SnapshotHeader = serde_saphyr::from_str(header).map_err(|err| {
            let line = err.location().map_or(0, |l| l.line() + 1);
            invalid(format!("header line {line}: {}", err.without_snippet()))
        })?;
        Ok(Snapshot {
            header,
            body: body.to_string(),
        })
    }

    /// Reads the snapshot of (lane, prompt), if there is one.
    pub fn load(
        snapshots: &Path,
        lane: &str,
        prompt_id: &str,
    ) -> Result<Option<Snapshot>, SnapshotError> {
        let path = path_for(snapshots, lane, prompt_id);
        match std::fs::read_to_string(&path) {
            Ok(text) => Snapshot::parse(&path, &text).map(Some),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SnapshotError::Io { path, source }),
        }
    }

    /// Writes the snapshot atomically (temp file, then rename), creating the lane folder.
    pub fn write(&self, snapshots: &Path) -> Result<PathBuf, SnapshotError> {
        let path = path_for(snapshots, &self.header.lane, &self.header.prompt_id);
        let io = |source| SnapshotError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let temp = path.with_extension("snap.tmp");
        std::fs::write(&temp, self.render()).map_err(io)?;
        std::fs::rename(&temp, &path).map_err(io)?;
        Ok(path)
    }
}

fn ensure_newline(text: &str) -> String {
    if text.ends_with('\n') {
        text.to_string()
    } else {
        format!("{text}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            header: SnapshotHeader {
                prompt_id: "prime-17077".into(),
                prompt_hash: "ab12".into(),
                lane: "free".into(),
                model: Some("smollm2".into()),
                fingerprint: Some("b0-unknown".into()),
                params: Params {
                    temperature: Some(0.0),
                    max_tokens: Some(64),
                    ..Params::default()
                },
                accepted_at: "2026-11-30T03:00:00Z".into(),
                accepted_from_run: 4,
                samples: 3,
                noise: Noise {
                    similarity_floor: 0.8,
                    length_ratio: [0.9, 1.2],
                    answers: vec!["yes".into()],
                    refusal: Some(false),
                    flaky_checks: vec![],
                },
            },
            body: "Yes.\n\n---\nA line of dashes above, and no newline at the end".into(),
        }
    }

    #[test]
    fn a_snapshot_round_trips_with_its_body_exact() {
        let snapshot = sample();
        let text = snapshot.render();
        assert!(text.starts_with("---\nprompt_id: prime-17077\n"), "{text}");
        let parsed = Snapshot::parse(Path::new("x.snap"), &text).unwrap();
        assert_eq!(parsed, snapshot);
    }

    #[test]
    fn write_then_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = sample().write(dir.path()).unwrap();
        assert_eq!(path, dir.path().join("free/prime-17077.snap"));
        let loaded = Snapshot::load(dir.path(), "free", "prime-17077").unwrap();
        assert_eq!(loaded, Some(sample()));
        assert_eq!(Snapshot::load(dir.path(), "free", "other").unwrap(), None);
    }

    #[test]
    fn a_file_without_header_is_invalid() {
        let err = Snapshot::parse(Path::new("x.snap"), "just text")
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.snap") && err.contains("`---`"), "{err}");
    }
}
