//! The OpenAI-compatible lane: `POST {base_url}/chat/completions`.
//!
//! Works with OpenAI, OpenRouter, Groq, vLLM, Ollama and llama.cpp's `llama-server`. Every way
//! such an endpoint can fail (refused, reset, 5xx, an error inside a 200, a body that is not
//! JSON or never ends) becomes a [`LaneFailure`], never a panic.

use std::error::Error as _;
use std::time::SystemTime;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::{Answer, BoxFuture, Lane, LaneFailure, ratelimit};
use crate::completion::{ChatRequest, Usage};
use crate::config::LaneConfig;
use crate::deadline::Deadline;

/// Longest error description kept from a response body.
const MESSAGE_LIMIT: usize = 200;

/// A lane speaking the OpenAI chat-completions protocol.
pub struct OpenAiLane {
    endpoint: String,
    models_endpoint: String,
    model: String,
    headers: HeaderMap,
    /// The key, kept only to scrub it from anything a server echoes back.
    key: Option<String>,
    missing_key: Option<String>,
    max_response_bytes: u64,
    client: reqwest::Client,
}

impl OpenAiLane {
    /// Builds the lane from its config; `env` looks up the key variable (a seam for tests).
    pub fn new(
        config: &LaneConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<OpenAiLane, String> {
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                format!("lane {}: `{name}` is not a valid header name", config.name)
            })?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                format!(
                    "lane {}: the value of header `{name}` is not valid",
                    config.name
                )
            })?;
            headers.insert(name, value);
        }
        let mut missing_key = None;
        let mut key = None;
        if let Some(var) = &config.api_key_env {
            match env(var).filter(|key| !key.is_empty()) {
                Some(value) => match HeaderValue::from_str(&format!("Bearer {value}")) {
                    Ok(mut header) => {
                        header.set_sensitive(true);
                        headers.insert(AUTHORIZATION, header);
                        key = Some(value);
                    }
                    Err(_) => {
                        missing_key = Some(format!(
                            "the key in ${var} has characters a header cannot carry"
                        ));
                    }
                },
                None => missing_key = Some(format!("api key env var {var} is not set")),
            }
        }
        let client = reqwest::Client::builder()
            // One attempt per call: the router decides what happens after a failure.
            .retry(reqwest::retry::never())
            .no_proxy()
            .build()
            .map_err(|err| format!("lane {}: cannot build HTTP client: {err}", config.name))?;
        Ok(OpenAiLane {
            endpoint: format!("{}/chat/completions", config.base_url),
            models_endpoint: format!("{}/models", config.base_url),
            model: config.model.clone(),
            headers,
            key,
            missing_key,
            max_response_bytes: config.max_response_bytes,
            client,
        })
    }

    fn body(&self, request: &ChatRequest) -> Value {
        let mut body =
            json!({ "model": self.model, "messages": request.messages, "stream": false });
        if let (Value::Object(map), Ok(Value::Object(params))) =
            (&mut body, serde_json::to_value(&request.params))
        {
            map.extend(params);
        }
        body
    }

    async fn send(
        &self,
        url: &str,
        body: Option<Value>,
    ) -> Result<(u16, HeaderMap, Vec<u8>), LaneFailure> {
        if let Some(why) = &self.missing_key {
            return Err(LaneFailure::Misconfigured(why.clone()));
        }
        let request = match body {
            Some(body) => self.client.post(url).json(&body),
            None => self.client.get(url),
        };
        // No client timeout: the router bounds the whole attempt by its deadline and drops this
        // future when it passes, which cancels the request and closes its connection (hyper
        // never pools a connection whose response was not read to the end). A second timer at
        // the same instant would only cost every call a timer-wheel insert and, on an idle
        // runtime, a wake-up of the I/O driver.
        let mut response = request
            .headers(self.headers.clone())
            .send()
            .await
            .map_err(transport_failure)?;
        let status = response.status().as_u16();
        let headers = std::mem::take(response.headers_mut());
        let body = read_limited(response, self.max_response_bytes).await?;
        Ok((status, headers, body))
    }
}

impl Lane for OpenAiLane {
    fn misconfiguration(&self) -> Option<String> {
        self.missing_key.clone()
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        _deadline: Deadline,
    ) -> BoxFuture<'a, Result<Answer, LaneFailure>> {
        Box::pin(async move {
            let (status, headers, body) =
                self.send(&self.endpoint, Some(self.body(request))).await?;
            interpret(status, &headers, &body, SystemTime::now()).map_err(|f| self.scrub(f))
        })
    }

    fn probe(&self, _deadline: Deadline) -> BoxFuture<'_, Result<String, LaneFailure>> {
        Box::pin(async move {
            let (status, headers, body) = self.send(&self.models_endpoint, None).await?;
            if (200..300).contains(&status) {
                let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let models: Vec<&str> = value["data"]
                    .as_array()
                    .map(|data| data.iter().filter_map(|m| m["id"].as_str()).collect())
                    .unwrap_or_default();
                return Ok(if models.is_empty() {
                    format!("HTTP {status}")
                } else {
                    format!("HTTP {status}, models: {}", models.join(", "))
                });
            }
            Err(self.scrub(status_failure(status, &headers, &body, SystemTime::now())))
        })
    }
}

impl OpenAiLane {
    /// Removes the lane's key from a failure a server described: some servers echo the
    /// Authorization header back in their error messages.
    fn scrub(&self, failure: LaneFailure) -> LaneFailure {
        match &self.key {
            Some(key) => failure.map_message(|m| m.replace(key.as_str(), "[redacted]")),
            None => failure,
        }
    }
}

/// Reads the body chunk by chunk, refusing it as soon as it passes `limit`: a hostile or broken
/// server cannot make us buffer more than that.
async fn read_limited(mut response: reqwest::Response, limit: u64) -> Result<Vec<u8>, LaneFailure> {
    if response.content_length().is_some_and(|len| len > limit) {
        return Err(LaneFailure::TooLarge { limit });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_failure)? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(LaneFailure::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Names a transport error by its root cause ("connection refused", "connection reset by peer").
fn transport_failure(err: reqwest::Error) -> LaneFailure {
    if err.is_timeout() {
        return LaneFailure::Timeout;
    }
    let mut cause = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        cause = inner.to_string();
        source = inner.source();
    }
    // reqwest's own message carries the URL; the root cause alone is clearer and leaks nothing.
    if err.is_connect() {
        LaneFailure::Connect(cause)
    } else {
        LaneFailure::Transport(cause)
    }
}

/// Turns a whole response into an answer or the failure it describes.
pub fn interpret(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<Answer, LaneFailure> {
    if !(200..300).contains(&status) {
        return Err(status_failure(status, headers, body, now));
    }
    let mut value: Value = serde_json::from_slice(body)
        .map_err(|err| LaneFailure::BadBody(format!("HTTP {status} body is not JSON ({err})")))?;
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        return Err(error_object_failure(status, error, headers, now));
    }
    let model = value["model"].as_str().map(str::to_string);
    let fingerprint = value["system_fingerprint"].as_str().map(str::to_string);
    let count = |key: &str| value["usage"][key].as_u64();
    let usage = Usage {
        prompt_tokens: count("prompt_tokens"),
        completion_tokens: count("completion_tokens"),
        total_tokens: count("total_tokens"),
    };
    let choice = value
        .get_mut("choices")
        .and_then(|choices| choices.get_mut(0))
        .ok_or_else(|| LaneFailure::BadBody("no choices in the response".into()))?;
    let finish_reason = choice["finish_reason"].as_str().map(str::to_string);
    // Taken out of the parsed body rather than copied: an answer may be as large as
    // `max_response_bytes`, and a copy would hold it in memory a third time.
    let text = take_string(choice, "/message/content")
        .or_else(|| take_string(choice, "/text"))
        .ok_or_else(|| LaneFailure::BadBody("the first choice has no text content".into()))?;
    Ok(Answer {
        text,
        model,
        fingerprint,
        finish_reason,
        usage,
    })
}

/// Moves the string at `pointer` out of `value`, if there is one.
fn take_string(value: &mut Value, pointer: &str) -> Option<String> {
    match value.pointer_mut(pointer)? {
        Value::String(text) => Some(std::mem::take(text)),
        _ => None,
    }
}

fn status_failure(status: u16, headers: &HeaderMap, body: &[u8], now: SystemTime) -> LaneFailure {
    let error = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("error").cloned())
        .filter(|e| !e.is_null());
    if let Some(error) = error {
        return error_object_failure(status, &error, headers, now);
    }
    // A body that is not an error object may echo the request (the prompt): describe it by its
    // type and size only.
    let content_type = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("no content type");
    let message = format!("{} byte {content_type} body", body.len());
    classify(status, None, message, headers, None, now)
}

/// An `{"error": {...}}` object, whatever status it came with.
fn error_object_failure(
    status: u16,
    error: &Value,
    headers: &HeaderMap,
    now: SystemTime,
) -> LaneFailure {
    let message = short(
        error["message"]
            .as_str()
            .or_else(|| error.as_str())
            .unwrap_or("no message"),
    );
    let code = error["code"]
        .as_u64()
        .or_else(|| error["code"].as_str().and_then(|c| c.parse().ok()))
        .and_then(|c| u16::try_from(c).ok());
    let kind = format!(
        "{} {}",
        error["code"].as_str().unwrap_or_default(),
        error["type"].as_str().unwrap_or_default()
    )
    .to_ascii_lowercase();
    // Inside a 2xx, only rate-limit and auth codes keep their meaning; every other error there
    // is the lane failing (status 0 below).
    let effective = match code {
        Some(code) if (200..300).contains(&status) && !matches!(code, 401 | 402 | 403 | 429) => 0,
        Some(code) if (400..600).contains(&code) => code,
        _ if (200..300).contains(&status) => 0,
        _ => status,
    };
    classify(
        effective,
        Some(&kind),
        message,
        headers,
        error["metadata"]["headers"].as_object(),
        now,
    )
}

fn classify(
    status: u16,
    kind: Option<&str>,
    message: String,
    headers: &HeaderMap,
    body_headers: Option<&serde_json::Map<String, Value>>,
    now: SystemTime,
) -> LaneFailure {
    let kind = kind.unwrap_or_default();
    let quota = kind.contains("rate_limit")
        || kind.contains("quota")
        || kind.contains("resource_exhausted");
    let auth = kind.contains("authentication")
        || kind.contains("permission")
        || kind.contains("invalid_api_key");
    if status == 429 || status == 402 || quota {
        let header_pairs = headers
            .iter()
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
        let body_pairs = body_headers
            .into_iter()
            .flatten()
            .filter_map(|(name, value)| Some((name.as_str(), value.as_str()?)));
        let reset = ratelimit::reset_time(header_pairs.chain(body_pairs), now);
        return LaneFailure::RateLimited { reset, message };
    }
    if status == 401 || status == 403 || auth {
        return LaneFailure::Misconfigured(format!("HTTP {status}: {message}"));
    }
    match status {
        0 => LaneFailure::ErrorBody(message),
        400..=499 => LaneFailure::Client { status, message },
        _ => LaneFailure::Server { status, message },
    }
}

fn short(text: &str) -> String {
    let text = text.trim();
    if text.is_empty() {
        return "empty body".into();
    }
    match text.char_indices().nth(MESSAGE_LIMIT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn fixture_body(name: &str) -> Vec<u8> {
        let raw = match name {
            "chat-ok" => include_str!("../../tests/fixtures/chat-ok.json"),
            "chat-length" => include_str!("../../tests/fixtures/chat-length.json"),
            "chat-badjson" => include_str!("../../tests/fixtures/chat-badjson.json"),
            _ => unreachable!(),
        };
        raw.as_bytes().to_vec()
    }

    #[test]
    fn a_llama_server_answer_parses_into_the_common_shape() {
        let answer = interpret(
            200,
            &HeaderMap::new(),
            &fixture_body("chat-ok"),
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(answer.text, "The capital of France is Paris.");
        assert_eq!(answer.model.as_deref(), Some("smollm2"));
        assert_eq!(answer.fingerprint.as_deref(), Some("b0-unknown"));
        assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
        assert_eq!(answer.usage.total_tokens, Some(50));
    }

    #[test]
    fn a_completions_style_text_is_the_answer_when_there_is_no_message() {
        let body = br#"{"model":"m","choices":[{"text":"plain","finish_reason":"stop"}]}"#;
        let answer = interpret(200, &HeaderMap::new(), body, SystemTime::now()).unwrap();
        assert_eq!(answer.text, "plain");
        assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn choices_of_the_wrong_shape_are_a_bad_body() {
        for body in [
            &br#"{"choices":"none"}"#[..],
            br#"{"choices":[42]}"#,
            br#"{"choices":[{"message":"hi"}]}"#,
            br#"{"choices":[{"message":{"content":7}}]}"#,
        ] {
            let failure = interpret(200, &HeaderMap::new(), body, SystemTime::now()).unwrap_err();
            assert!(matches!(failure, LaneFailure::BadBody(_)), "{failure:?}");
        }
    }

    #[test]
    fn a_length_stop_is_reported() {
        let answer = interpret(
            200,
            &HeaderMap::new(),
            &fixture_body("chat-length"),
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(answer.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn a_400_is_a_request_error_that_does_not_count() {
        let failure = interpret(
            400,
            &HeaderMap::new(),
            &fixture_body("chat-badjson"),
            SystemTime::now(),
        )
        .unwrap_err();
        assert!(
            matches!(failure, LaneFailure::Client { status: 400, .. }),
            "{failure:?}"
        );
        assert!(!failure.counts_against_breaker());
    }

    #[test]
    fn openrouter_429_inside_a_200_is_exhaustion_with_its_reset() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let body = br#"{"error":{"message":"Rate limit exceeded: free-models-per-day","code":429,
            "metadata":{"headers":{"X-RateLimit-Limit":"50","X-RateLimit-Remaining":"0",
            "X-RateLimit-Reset":"1800000060000"}}}}"#;
        match interpret(200, &HeaderMap::new(), body, now).unwrap_err() {
            LaneFailure::RateLimited { reset, message } => {
                assert_eq!(reset, Some(now + Duration::from_secs(60)));
                assert!(message.contains("free-models-per-day"));
            }
            other => panic!("expected rate limit, got {other:?}"),
        }
    }

    #[test]
    fn other_errors_inside_a_200_count_against_the_lane() {
        let body = br#"{"error":{"message":"upstream overloaded","code":"overloaded"}}"#;
        let failure = interpret(200, &HeaderMap::new(), body, SystemTime::now()).unwrap_err();
        assert_eq!(
            failure,
            LaneFailure::ErrorBody("upstream overloaded".into())
        );
        assert!(failure.counts_against_breaker());
    }

    #[test]
    fn openai_quota_and_auth_errors() {
        let quota = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert!(matches!(
            interpret(429, &HeaderMap::new(), quota, SystemTime::now()).unwrap_err(),
            LaneFailure::RateLimited { .. }
        ));
        let auth = br#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        assert!(matches!(
            interpret(401, &HeaderMap::new(), auth, SystemTime::now()).unwrap_err(),
            LaneFailure::Misconfigured(_)
        ));
    }

    #[test]
    fn an_inner_4xx_inside_a_200_counts_against_the_lane() {
        let body = br#"{"error":{"message":"Provider returned error","code":400}}"#;
        let failure = interpret(200, &HeaderMap::new(), body, SystemTime::now()).unwrap_err();
        assert!(failure.counts_against_breaker(), "{failure:?}");
        let huge = br#"{"error":{"message":"x","code":65965}}"#;
        let failure = interpret(500, &HeaderMap::new(), huge, SystemTime::now()).unwrap_err();
        assert!(
            matches!(failure, LaneFailure::Server { status: 500, .. }),
            "{failure:?}"
        );
    }

    #[test]
    fn a_body_that_is_not_an_error_object_is_never_quoted() {
        let echo = br#"{"detail":[{"input":{"messages":[{"content":"SECRET-PROMPT"}]}}]}"#;
        let failure = interpret(422, &HeaderMap::new(), echo, SystemTime::now()).unwrap_err();
        assert!(!failure.to_string().contains("SECRET"), "{failure}");
        assert!(failure.to_string().contains("byte"), "{failure}");
    }

    #[test]
    fn a_non_json_200_is_a_bad_body() {
        let failure = interpret(
            200,
            &HeaderMap::new(),
            b"<html>gateway</html>",
            SystemTime::now(),
        )
        .unwrap_err();
        assert!(matches!(failure, LaneFailure::BadBody(_)));
    }
}
