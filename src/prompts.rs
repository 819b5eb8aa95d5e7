//! The pinned prompt set: `prompts/*.yaml`.
//!
//! Ids are unique across the whole set and stable forever. A prompt's hash covers everything
//! that changes the request (messages and parameters, with temperature defaulting to 0); the
//! set's hash covers every prompt. A baseline made from another hash is stale, never compared.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};
use serde_saphyr::Spanned;

use crate::checks::Check;
use crate::completion::{ChatRequest, Message, Params, hex_sha256};
use crate::config::MAX_SAMPLES;

/// A problem in the prompt set, located in its file.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The folder or a file could not be read.
    #[error("cannot read prompts at {path}: {source}")]
    Read {
        /// What we tried to read.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A file is not a valid prompt list.
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        /// The prompt file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
        /// What was wrong and what was expected.
        message: String,
    },
    /// Two prompts share an id.
    #[error(
        "duplicate prompt id `{id}`: {first}:{first_line} and {second}:{second_line}; ids must be unique across the set"
    )]
    DuplicateId {
        /// The id.
        id: String,
        /// File of the first.
        first: PathBuf,
        /// Line of the first.
        first_line: u64,
        /// File of the second.
        second: PathBuf,
        /// Line of the second.
        second_line: u64,
    },
    /// The folder holds no prompts.
    #[error("no prompts found in {0}: add prompts/*.yaml (see `canary init`)")]
    Empty(PathBuf),
}

/// One pinned prompt.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// Stable id.
    pub id: String,
    /// The request it sends.
    pub request: ChatRequest,
    /// Per-prompt similarity floor, overriding `drift.threshold`.
    pub threshold: Option<f64>,
    /// Answers per run and per baseline, overriding `drift.samples`.
    pub samples: Option<u32>,
    /// Deterministic checks of the answer.
    pub checks: Vec<Check>,
    /// SHA-256 of the canonical request.
    pub hash: String,
    /// File it came from.
    pub file: PathBuf,
    /// Line of its `id`.
    pub line: u64,
}

/// The whole pinned set, in id order.
#[derive(Debug, Clone)]
pub struct PromptSet {
    /// Prompts sorted by id.
    pub prompts: Vec<Prompt>,
    /// Hash over every prompt's id and hash.
    pub hash: String,
}

impl PromptSet {
    /// Loads every `*.yaml` / `*.yml` file in `dir`.
    pub fn load(dir: &Path) -> Result<PromptSet, PromptError> {
        let read_err = |source| PromptError::Read {
            path: dir.to_path_buf(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(read_err)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| {
                path.is_file()
                    && path
                        .extension()
                        .is_some_and(|ext| ext == "yaml" || ext == "yml")
            })
            .collect();
        files.sort();
        let mut prompts = Vec::new();
        let mut seen: HashMap<String, (PathBuf, u64)> = HashMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| PromptError::Read {
                path: file.clone(),
                source,
            })?;
            for prompt in parse_file(&file, &text)? {
                if let Some((first, first_line)) = seen.get(&prompt.id) {
                    return Err(PromptError::DuplicateId {
                        id: prompt.id.clone(),
                        first: first.clone(),
                        first_line: *first_line,
                        second: prompt.file.clone(),
                        second_line: prompt.line,
                    });
                }
                seen.insert(prompt.id.clone(), (prompt.file.clone(), prompt.line));
                prompts.push(prompt);
            }
        }
        if prompts.is_empty() {
            return Err(PromptError::Empty(dir.to_path_buf()));
        }
        prompts.sort_by(|a, b| a.id.cmp(&b.id));
        let mut all = String::new();
        for prompt in &prompts {
            all.push_str(&prompt.id);
            all.push('\0');
            all.push_str(&prompt.hash);
            all.push('\n');
        }
        Ok(PromptSet {
            hash: hex_sha256(all.as_bytes()),
            prompts,
        })
    }

    /// The prompt with `id`.
    pub fn get(&self, id: &str) -> Option<&Prompt> {
        self.prompts.iter().find(|p| p.id == id)
    }
}

/// Parses one prompt file.
pub fn parse_file(path: &Path, text: &str) -> Result<Vec<Prompt>, PromptError> {
    let raw: Vec<RawPrompt> = serde_saphyr::from_str(text).map_err(|err| {
        let (line, column, message) = crate::config::located(&err);
        PromptError::Invalid {
            path: path.to_path_buf(),
            line,
            column,
            message,
        }
    })?;
    raw.into_iter().map(|r| r.resolve(path)).collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrompt {
    id: Spanned<PromptId>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    params: Params,
    #[serde(default)]
    threshold: Option<Threshold>,
    #[serde(default)]
    samples: Option<Samples>,
    #[serde(default)]
    checks: Vec<Check>,
}

impl RawPrompt {
    fn resolve(self, path: &Path) -> Result<Prompt, PromptError> {
        let at = |message: String| PromptError::Invalid {
            path: path.to_path_buf(),
            line: self.id.referenced.line(),
            column: self.id.referenced.column(),
            message,
        };
        let id = self.id.value.0.clone();
        let mut params = self.params.clone();
        params.temperature.get_or_insert(0.0);
        let request = match (&self.prompt, &self.messages) {
            (Some(prompt), None) => {
                ChatRequest::from_prompt(self.system.as_deref(), prompt, params)
            }
            (None, Some(messages)) => {
                if messages.is_empty() {
                    return Err(at(format!("prompt `{id}`: `messages` is empty")));
                }
                let mut all = Vec::new();
                if let Some(system) = &self.system {
                    all.push(Message {
                        role: "system".into(),
                        content: system.clone(),
                    });
                }
                all.extend(messages.iter().cloned());
                ChatRequest {
                    messages: all,
                    params,
                }
            }
            (Some(_), Some(_)) => {
                return Err(at(format!(
                    "prompt `{id}` has both `prompt` and `messages`; use one"
                )));
            }
            (None, None) => {
                return Err(at(format!(
                    "prompt `{id}` needs `prompt: \"...\"` or `messages: [...]`"
                )));
            }
        };
        let hash = request.fingerprint().0;
        Ok(Prompt {
            id,
            request,
            threshold: self.threshold.map(|t| t.0),
            samples: self.samples.map(|s| s.0),
            checks: self.checks,
            hash,
            file: path.to_path_buf(),
            line: self.id.referenced.line(),
        })
    }
}

/// A prompt id: letters, digits, `.`, `_`, `-` (it names a snapshot file).
struct PromptId(String);

impl<'de> Deserialize<'de> for PromptId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let ok = !text.is_empty()
            && !text.starts_with('.')
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(PromptId(text))
        } else {
            Err(serde::de::Error::custom(format!(
                "expected a prompt id of letters, digits, `.`, `_` and `-` (it names a snapshot file), found `{text}`"
            )))
        }
    }
}

struct Threshold(f64);

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(deserializer)?;
        if (0.0..=1.0).contains(&value) {
            Ok(Threshold(value))
        } else {
            Err(serde::de::Error::custom(format!(
                "expected a similarity threshold between 0 and 1, found {value}"
            )))
        }
    }
}

struct Samples(u32);

impl<'de> Deserialize<'de> for Samples {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = u32::deserialize(deserializer)?;
        if (1..=MAX_SAMPLES).contains(&value) {
            Ok(Samples(value))
        } else {
            Err(serde::de::Error::custom(format!(
                "expected a number of samples from 1 to {MAX_SAMPLES}, found {value}"
            )))
        }
    }
}

impl fmt::Display for Prompt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}:{})", self.id, self.file.display(), self.line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn the_contract_example_loads_and_hashes_the_request() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "math.yaml",
            r#"- id: prime-17077
  prompt: "Is 17077 a prime number? Answer yes or no."
  system: "Answer tersely."
  params: { temperature: 0, max_tokens: 64, seed: 7 }
  threshold: 0.9
  checks:
    - answer: '(?i)\b(yes|no)\b'
    - contains: "yes"
    - regex: '^\s*(yes|no)'
    - json: true
    - max_chars: 400
"#,
        );
        let set = PromptSet::load(dir.path()).unwrap();
        let prompt = &set.prompts[0];
        assert_eq!(prompt.id, "prime-17077");
        assert_eq!(prompt.checks.len(), 5);
        assert_eq!(prompt.threshold, Some(0.9));
        assert_eq!(prompt.request.messages[0].role, "system");
        assert_eq!(prompt.hash, prompt.request.fingerprint().0);
        assert_eq!(set.hash.len(), 64);
    }

    #[test]
    fn temperature_defaults_to_zero_and_is_part_of_the_hash() {
        let implicit = parse_file(Path::new("a.yaml"), "- id: a\n  prompt: hi\n").unwrap();
        let explicit = parse_file(
            Path::new("a.yaml"),
            "- id: a\n  prompt: hi\n  params: { temperature: 0 }\n",
        )
        .unwrap();
        let warm = parse_file(
            Path::new("a.yaml"),
            "- id: a\n  prompt: hi\n  params: { temperature: 0.7 }\n",
        )
        .unwrap();
        assert_eq!(implicit[0].hash, explicit[0].hash);
        assert_ne!(implicit[0].hash, warm[0].hash);
    }

    #[test]
    fn checks_threshold_and_samples_do_not_change_the_hash() {
        let plain = parse_file(Path::new("a.yaml"), "- id: a\n  prompt: hi\n").unwrap();
        let checked = parse_file(
            Path::new("a.yaml"),
            "- id: a\n  prompt: hi\n  threshold: 0.5\n  samples: 8\n  checks:\n    - max_chars: 10\n",
        )
        .unwrap();
        assert_eq!(plain[0].hash, checked[0].hash);
        assert_eq!(checked[0].samples, Some(8));
        let err = parse_file(Path::new("a.yaml"), "- id: a\n  prompt: hi\n  samples: 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("a.yaml:3:") && err.contains("from 1 to 1000"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_ids_name_both_files_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "a.yaml",
            "- id: one\n  prompt: x\n- id: two\n  prompt: y\n",
        );
        write(dir.path(), "b.yaml", "\n- id: two\n  prompt: z\n");
        let err = PromptSet::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("duplicate prompt id `two`"), "{err}");
        assert!(
            err.contains("a.yaml:3") && err.contains("b.yaml:2"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_regex_is_located() {
        let err = parse_file(
            Path::new("p.yaml"),
            "- id: a\n  prompt: hi\n  checks:\n    - regex: '(unclosed'\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("p.yaml:4:"), "{err}");
        assert!(err.contains("regex"), "{err}");
    }

    #[test]
    fn unknown_keys_and_missing_prompt_are_errors() {
        let err = parse_file(Path::new("p.yaml"), "- id: a\n  promt: hi\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("p.yaml:2:3"), "{err}");
        let err = parse_file(Path::new("p.yaml"), "- id: a\n  system: x\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs `prompt"), "{err}");
    }
}
