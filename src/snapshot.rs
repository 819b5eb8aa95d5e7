//! Accepted baselines: `snapshots/<lane>/<prompt-id>.snap`.
//!
//! A short YAML header between `---` lines, then every distinct answer the baseline's samples
//! gave, each exactly as the lane returned it: readable in a pull request, diffable by git, and
//! self-contained (the store is not needed to judge against it).
//!
//! With one distinct answer the body is that answer alone. With several, each is introduced by a
//! marker line that starts with the header's `separator`, chosen so that no answer has a line
//! starting with it; the header's `counts` says how many samples gave each answer.

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

/// How much an older baseline's samples varied, when only its first answer was kept. Snapshots
/// written since keep every answer and carry no band; these still judge as they always did.
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
    /// Samples accepted.
    pub samples: u32,
    /// How many samples gave each distinct answer of the body, in order (absent in snapshots
    /// written before every answer was kept).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "on_one_line"
    )]
    pub counts: Vec<u32>,
    /// Start of the marker line before each answer, when there are several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub separator: Option<String>,
    /// The noise band of an older snapshot that kept only its first answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<Noise>,
}

/// One distinct answer of a baseline and how many of its samples gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The output text, exactly as returned.
    pub text: String,
    /// Samples that gave exactly this text.
    pub count: u32,
}

/// A baseline: header plus its distinct answers, most frequent first.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Header.
    pub header: SnapshotHeader,
    /// Distinct answers, most frequent first (never empty).
    pub answers: Vec<Answer>,
}

/// The marker every separator starts with; more tildes are added while an answer contains it.
const SEPARATOR: &str = "~~~~ canary answer";

/// `<snapshots>/<lane>/<prompt-id>.snap`.
pub fn path_for(snapshots: &Path, lane: &str, prompt_id: &str) -> PathBuf {
    snapshots.join(lane).join(format!("{prompt_id}.snap"))
}

/// Groups sample texts into distinct answers with counts: most frequent first, ties in order of
/// first appearance.
pub fn distinct_answers<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<Answer> {
    let mut answers: Vec<Answer> = Vec::new();
    for text in texts {
        match answers.iter_mut().find(|a| a.text == text) {
            Some(answer) => answer.count += 1,
            None => answers.push(Answer {
                text: text.to_string(),
                count: 1,
            }),
        }
    }
    // A stable sort keeps first appearance among equal counts.
    answers.sort_by_key(|a| std::cmp::Reverse(a.count));
    answers
}

impl Snapshot {
    /// A snapshot of these answers; sets the header's `samples`, `counts` and `separator`.
    pub fn new(mut header: SnapshotHeader, answers: Vec<Answer>) -> Snapshot {
        header.samples = answers.iter().map(|a| a.count).sum();
        header.counts = answers.iter().map(|a| a.count).collect();
        header.separator = (answers.len() > 1).then(|| separator_for(&answers));
        Snapshot { header, answers }
    }

    /// The most frequent answer (the first).
    pub fn primary(&self) -> &str {
        self.answers.first().map_or("", |a| a.text.as_str())
    }

    /// Renders the file text.
    pub fn render(&self) -> String {
        let header = serde_saphyr::to_string(&self.header).unwrap_or_default();
        let mut out = format!("---\n{}---\n", ensure_newline(&header));
        match &self.header.separator {
            None => out.push_str(self.primary()),
            Some(separator) => {
                let distinct = self.answers.len();
                for (index, answer) in self.answers.iter().enumerate() {
                    if index > 0 {
                        out.push('\n');
                    }
                    out.push_str(&format!(
                        "{separator} {} of {distinct}: {} of {} samples\n",
                        index + 1,
                        answer.count,
                        self.header.samples
                    ));
                    out.push_str(&answer.text);
                }
            }
        }
        out
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
        let texts = match &header.separator {
            None => vec![body.to_string()],
            Some(separator) => split_answers(body, separator).ok_or_else(|| {
                invalid(format!(
                    "the body should start with a `{separator}` line before each answer"
                ))
            })?,
        };
        let counts = if header.counts.is_empty() {
            // Written before every answer was kept: the first answer stands for all samples.
            vec![header.samples.max(1)]
        } else {
            header.counts.clone()
        };
        if counts.len() != texts.len() {
            return Err(invalid(format!(
                "the header counts {} answers, the body holds {}",
                counts.len(),
                texts.len()
            )));
        }
        if !header.counts.is_empty() && header.counts.iter().sum::<u32>() != header.samples {
            return Err(invalid(format!(
                "the header's counts add up to {}, not to its {} samples",
                header.counts.iter().sum::<u32>(),
                header.samples
            )));
        }
        let answers = texts
            .into_iter()
            .zip(counts)
            .map(|(text, count)| Answer { text, count })
            .collect();
        Ok(Snapshot { header, answers })
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

    /// The runs every snapshot under `snapshots` was accepted from, sorted, once each: what a
    /// prune keeps. A file that cannot be read or parsed is reported, not skipped silently.
    pub fn source_runs(snapshots: &Path) -> Result<Vec<i64>, SnapshotError> {
        let mut runs = Vec::new();
        let mut folders = vec![snapshots.to_path_buf()];
        while let Some(folder) = folders.pop() {
            let entries = match std::fs::read_dir(&folder) {
                Ok(entries) => entries,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(SnapshotError::Io {
                        path: folder,
                        source,
                    });
                }
            };
            for entry in entries {
                let path = entry
                    .map_err(|source| SnapshotError::Io {
                        path: folder.clone(),
                        source,
                    })?
                    .path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|e| e == "snap") {
                    let text =
                        std::fs::read_to_string(&path).map_err(|source| SnapshotError::Io {
                            path: path.clone(),
                            source,
                        })?;
                    runs.push(Snapshot::parse(&path, &text)?.header.accepted_from_run);
                }
            }
        }
        runs.sort_unstable();
        runs.dedup();
        Ok(runs)
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

/// `[3, 2, 1]` rather than a line per number: thirty samples of thirty answers stay readable.
fn on_one_line<S: serde::Serializer>(counts: &[u32], serializer: S) -> Result<S::Ok, S::Error> {
    serde_saphyr::FlowSeq(counts).serialize(serializer)
}

/// A separator no answer has at the start of a line.
fn separator_for(answers: &[Answer]) -> String {
    let mut separator = SEPARATOR.to_string();
    let clashes = |sep: &str| {
        answers
            .iter()
            .any(|a| a.text.starts_with(sep) || a.text.contains(&format!("\n{sep}")))
    };
    while clashes(&separator) {
        separator.insert(0, '~');
    }
    separator
}

/// Splits a body of marker-introduced answers. The newline before a marker belongs to the marker,
/// so each answer comes back exactly as written, with or without its own final newline.
fn split_answers(body: &str, separator: &str) -> Option<Vec<String>> {
    let mut rest = body.strip_prefix(separator)?;
    let mut texts = Vec::new();
    loop {
        // Skip the rest of the marker line.
        let Some(end) = rest.find('\n') else {
            texts.push(String::new());
            return Some(texts);
        };
        rest = &rest[end + 1..];
        match rest.find(&format!("\n{separator}")) {
            Some(next) => {
                texts.push(rest[..next].to_string());
                rest = &rest[next + 1 + separator.len()..];
            }
            None => {
                texts.push(rest.to_string());
                return Some(texts);
            }
        }
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

    fn header() -> SnapshotHeader {
        SnapshotHeader {
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
            samples: 0,
            counts: vec![],
            separator: None,
            noise: None,
        }
    }

    fn one_answer() -> Snapshot {
        Snapshot::new(
            header(),
            distinct_answers(["Yes.\n\n---\nA line of dashes above, and no newline at the end"; 3]),
        )
    }

    #[test]
    fn a_snapshot_of_one_distinct_answer_is_that_answer_exactly() {
        let snapshot = one_answer();
        let text = snapshot.render();
        assert!(text.starts_with("---\nprompt_id: prime-17077\n"), "{text}");
        assert!(text.contains("samples: 3\ncounts: [3]\n"), "{text}");
        assert!(!text.contains("separator"), "{text}");
        assert!(
            text.ends_with("---\nYes.\n\n---\nA line of dashes above, and no newline at the end")
        );
        assert_eq!(
            Snapshot::parse(Path::new("x.snap"), &text).unwrap(),
            snapshot
        );
    }

    #[test]
    fn every_distinct_answer_is_kept_exactly_with_its_count() {
        let texts = [
            "Eggs and toast.\n",
            "Porridge",
            "Eggs and toast.\n",
            "  indented\n\nwith a blank line",
            "",
            "Porridge",
            "Eggs and toast.\n",
        ];
        let snapshot = Snapshot::new(header(), distinct_answers(texts));
        assert_eq!(
            snapshot
                .answers
                .iter()
                .map(|a| (a.text.as_str(), a.count))
                .collect::<Vec<_>>(),
            [
                ("Eggs and toast.\n", 3),
                ("Porridge", 2),
                ("  indented\n\nwith a blank line", 1),
                ("", 1)
            ]
        );
        let text = snapshot.render();
        assert!(
            text.contains("~~~~ canary answer 1 of 4: 3 of 7 samples\nEggs and toast.\n\n~~~~ canary answer 2 of 4"),
            "{text}"
        );
        let parsed = Snapshot::parse(Path::new("x.snap"), &text).unwrap();
        assert_eq!(parsed, snapshot);
        assert_eq!(parsed.primary(), "Eggs and toast.\n");
    }

    #[test]
    fn an_answer_that_contains_the_marker_gets_a_longer_separator() {
        let texts = ["a\n~~~~ canary answer 2 of 2: forged", "b"];
        let snapshot = Snapshot::new(header(), distinct_answers(texts));
        assert_eq!(
            snapshot.header.separator.as_deref(),
            Some("~~~~~ canary answer")
        );
        let parsed = Snapshot::parse(Path::new("x.snap"), &snapshot.render()).unwrap();
        assert_eq!(parsed.answers, snapshot.answers);
    }

    #[test]
    fn an_older_snapshot_with_one_answer_and_a_noise_band_still_reads() {
        let text = "---\nprompt_id: p\nprompt_hash: h\nlane: free\nmodel: m\naccepted_at: '2026-11-01T00:00:00Z'\naccepted_from_run: 2\nsamples: 5\nnoise:\n  similarity_floor: 0.4\n  length_ratio: [0.8, 1.3]\n---\nFirst answer.";
        let snapshot = Snapshot::parse(Path::new("x.snap"), text).unwrap();
        assert_eq!(snapshot.answers.len(), 1);
        assert_eq!(snapshot.primary(), "First answer.");
        assert_eq!(snapshot.header.samples, 5);
        assert_eq!(
            snapshot.header.noise.as_ref().map(|n| n.similarity_floor),
            Some(0.4)
        );
    }

    #[test]
    fn counts_that_disagree_with_the_body_are_an_error() {
        let mut text = Snapshot::new(header(), distinct_answers(["a", "b"])).render();
        text = text.replace("counts: [1, 1]", "counts: [1, 2]");
        let err = Snapshot::parse(Path::new("x.snap"), &text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("add up to 3, not to its 2 samples"), "{err}");
    }

    #[test]
    fn write_then_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = one_answer().write(dir.path()).unwrap();
        assert_eq!(path, dir.path().join("free/prime-17077.snap"));
        let loaded = Snapshot::load(dir.path(), "free", "prime-17077").unwrap();
        assert_eq!(loaded, Some(one_answer()));
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
