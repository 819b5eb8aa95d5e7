//! Slack-compatible webhook alerts: `POST {"text": ...}` to a URL kept in an env var.

use super::Channel;
use super::message::Message;
use crate::config::WebhookConfig;
use crate::lane::BoxFuture;

/// Longest a webhook delivery may take.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// The webhook channel.
pub struct WebhookChannel {
    url: String,
    client: reqwest::Client,
}

impl WebhookChannel {
    /// Reads the URL from the env var the config names.
    pub fn new(
        config: &WebhookConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<WebhookChannel, String> {
        let url = env(&config.url_env)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| format!("webhook: env var {} is not set", config.url_env))?;
        reqwest::Url::parse(&url)
            .map_err(|_| format!("webhook: the URL in {} is not a URL", config.url_env))?;
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|err| format!("webhook: cannot build HTTP client: {err}"))?;
        Ok(WebhookChannel { url, client })
    }
}

impl Channel for WebhookChannel {
    fn name(&self) -> &'static str {
        "webhook"
    }

    fn send<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            // Slack reads `<...>` as links and mentions: model output must not ping a channel.
            let escape = |t: &str| {
                t.replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;")
            };
            let body = serde_json::json!({
                "text": format!("*{}*\n{}", escape(&message.subject), escape(&message.text))
            });
            // Webhook URLs are secrets: errors are reported without them.
            let response = self
                .client
                .post(&self.url)
                .json(&body)
                .send()
                .await
                .map_err(|err| format!("webhook: {}", err.without_url()))?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(format!("webhook: HTTP {}", response.status().as_u16()))
            }
        })
    }
}
