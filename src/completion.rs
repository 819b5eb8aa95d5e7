//! What goes into a lane and what comes out, the same shape whatever lane served.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One chat message of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// Sampling parameters sent with a request. Unset fields are left to the provider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Sampling temperature; canary's prompts default it to 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Upper bound on generated tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling seed, for providers that honour one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Nucleus sampling mass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Stop sequences.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
}

/// Everything that decides what a lane is asked: the messages and the sampling parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatRequest {
    /// The conversation, system message first when there is one.
    pub messages: Vec<Message>,
    /// Sampling parameters.
    pub params: Params,
}

impl ChatRequest {
    /// A request of one user message with an optional system message.
    pub fn from_prompt(system: Option<&str>, prompt: &str, params: Params) -> Self {
        let mut messages = Vec::new();
        if let Some(system) = system {
            messages.push(Message {
                role: "system".into(),
                content: system.into(),
            });
        }
        messages.push(Message {
            role: "user".into(),
            content: prompt.into(),
        });
        ChatRequest { messages, params }
    }

    /// The canonical bytes of this request: what its hash and byte count are taken over.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        // Field order is fixed by the struct definitions, so equal requests give equal bytes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// SHA-256 (hex) and byte count of the request, for the audit log: what left the network
    /// can be matched later without keeping the text.
    pub fn fingerprint(&self) -> (String, usize) {
        let bytes = self.canonical_bytes();
        (hex_sha256(&bytes), bytes.len())
    }
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn hex_sha256(bytes: &[u8]) -> String {
    // Every routed job hashes its request for the audit line: a `format!` per byte cost more
    // than the hash itself.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// Token counts as the provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the request.
    pub prompt_tokens: Option<u64>,
    /// Tokens generated.
    pub completion_tokens: Option<u64>,
    /// Their sum as the provider counted it.
    pub total_tokens: Option<u64>,
}

/// How long the serving attempt took, split so queueing cannot hide inside call time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Timings {
    /// Time spent waiting for one of the lane's in-flight permits.
    pub queue_ms: u64,
    /// Time from sending the request to the last byte of the answer.
    pub call_ms: u64,
}

/// One answer, in the same shape whatever lane served it: callers never branch on the lane.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    /// The answer text, exactly as returned.
    pub text: String,
    /// The lane that served it.
    pub lane: String,
    /// The model the provider says answered (may differ from the one asked for).
    pub model: Option<String>,
    /// The provider's `system_fingerprint`, when it reports one.
    pub fingerprint: Option<String>,
    /// Why generation stopped (`stop`, `length`, ...).
    pub finish_reason: Option<String>,
    /// Token counts.
    pub usage: Usage,
    /// Queue and call time of the serving attempt.
    pub timings: Timings,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_lower_case_hex_of_sha256() {
        // FIPS 180-2's example.
        assert_eq!(
            hex_sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn equal_requests_hash_equal_and_any_change_changes_the_hash() {
        let params = Params {
            temperature: Some(0.0),
            ..Params::default()
        };
        let a = ChatRequest::from_prompt(Some("Be terse."), "Is 7 prime?", params.clone());
        let b = ChatRequest::from_prompt(Some("Be terse."), "Is 7 prime?", params.clone());
        assert_eq!(a.fingerprint(), b.fingerprint());
        let other_system = ChatRequest::from_prompt(None, "Is 7 prime?", params.clone());
        assert_ne!(a.fingerprint().0, other_system.fingerprint().0);
        let other_params = ChatRequest::from_prompt(
            Some("Be terse."),
            "Is 7 prime?",
            Params {
                temperature: Some(0.5),
                ..params
            },
        );
        assert_ne!(a.fingerprint().0, other_params.fingerprint().0);
        assert_eq!(a.fingerprint().0.len(), 64);
    }
}
