//! Email alerts, webhook and heartbeat, against a real SMTP server and real HTTP servers.

use std::sync::{Arc, Mutex};

use crate::smtp::{SmtpOptions, SmtpServer, TestCertificates};
use crate::stores::on_both_stores;
use crate::support::{LaneSpec, Project, Reply, TestServer, canary_with_env, prompt_of, text};

const PROMPTS: &str = r#"
- id: capital
  prompt: "What is the capital of France?"
- id: prime
  prompt: "Is 17077 a prime number? Answer yes or no."
  checks:
    - answer: '(?i)\b(yes|no)\b'
- id: html
  prompt: "Say something with markup."
"#;

const PASSWORD: &str = "smtp-pass-5c1d-never-print";

/// A model whose prime answer flips when `drift` is set; its markup answer is hostile HTML.
async fn model(drift: Arc<Mutex<bool>>) -> TestServer {
    TestServer::start(move |_, seen| {
        let drifting = *drift.lock().unwrap();
        let prompt = prompt_of(seen);
        let answer = if prompt.contains("prime") {
            if drifting { "No." } else { "Yes." }
        } else if prompt.contains("markup") {
            if drifting {
                "<script>alert('owned')</script> & <b>bold</b>"
            } else {
                "plain words only"
            }
        } else {
            "Paris."
        };
        Reply::completion(answer, "smollm2")
    })
    .await
}

fn project(model_url: String, smtp_port: u16, extra: &[&str]) -> Project {
    let mut top = vec![
        "alerts".to_string() + ":",
        "  email:".into(),
        format!("    smtp: {{ host: 127.0.0.1, port: {smtp_port}, security: none, timeout: 5s }}"),
        "    from: canary@example.com".into(),
        "    to: [oncall@example.com, backup@example.com]".into(),
    ];
    top.extend(extra.iter().map(|s| s.to_string()));
    let top: Vec<&str> = top.iter().map(String::as_str).collect();
    let project = Project::new(&top, &[LaneSpec::new("free", model_url)]);
    project.write_prompts("set.yaml", PROMPTS);
    project
}

async fn canary(project: &Project, args: &[&str]) -> std::process::Output {
    canary_with_env(project, args, &[("TEST_SMTP_PASSWORD", PASSWORD)]).await
}

on_both_stores! {
async fn drift_sends_one_email_the_same_drift_none_and_recovery_one() {
    let smtp = SmtpServer::start(SmtpOptions::default());
    let drift = Arc::new(Mutex::new(false));
    let server = model(drift.clone()).await;
    let project = project(
        server.base_url(),
        smtp.port,
        &["report: { path: report.html, url: https://canary.example.com/report.html }"],
    );

    canary(&project, &["run"]).await;
    canary(&project, &["accept"]).await;
    let quiet = canary(&project, &["run"]).await;
    assert_eq!(quiet.status.code(), Some(0));
    assert!(smtp.received().is_empty(), "no email while nothing drifts");

    *drift.lock().unwrap() = true;
    let drifted = canary(&project, &["run"]).await;
    assert_eq!(drifted.status.code(), Some(1), "{}", text(&drifted.stderr));
    let mail = smtp.wait_for(1).await;
    assert_eq!(mail.len(), 1);
    let email = &mail[0];
    assert_eq!(
        email["headers"]["Subject"],
        "[canary] free: 2 of 3 prompts drifted (run 3)"
    );
    assert_eq!(email["headers"]["From"], "canary@example.com");
    assert_eq!(
        email["headers"]["To"],
        "oncall@example.com, backup@example.com"
    );
    assert_eq!(
        email["rcpt_tos"],
        serde_json::json!(["oncall@example.com", "backup@example.com"])
    );
    assert_eq!(email["content_type"], "multipart/alternative");
    let body = email["text"].as_str().unwrap();
    assert!(body.contains("answer changed: yes → no"), "{body}");
    assert!(
        body.contains("-Yes.") && body.contains("+No."),
        "the diff is in the text: {body}"
    );
    assert!(body.contains("canary diff --run 3 --lane free"), "{body}");
    let html = email["html"].as_str().unwrap();
    assert!(
        html.contains("&lt;script&gt;alert('owned')&lt;/script&gt;"),
        "model output is escaped: {html}"
    );
    assert!(!html.contains("<script>"), "{html}");
    assert!(
        html.contains("background:#ffeef0") && html.contains("background:#e6ffed"),
        "the diff is in the HTML: {html}"
    );
    assert!(
        body.contains(
            "Report (this lane over the last runs):  https://canary.example.com/report.html"
        ),
        "{body}"
    );
    assert!(
        html.contains("<a href=\"https://canary.example.com/report.html\">"),
        "{html}"
    );
    let report = std::fs::read_to_string(project.file("report.html")).unwrap();
    assert!(
        report.contains("canary · run 3"),
        "run keeps the report up to date"
    );

    let again = canary(&project, &["run"]).await;
    assert_eq!(again.status.code(), Some(1));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(smtp.received().len(), 1, "the same drift is not sent twice");

    // A run of a clean prompt only says nothing about the lane: no "recovered".
    let partial = canary(&project, &["run", "--prompt", "capital"]).await;
    assert_eq!(partial.status.code(), Some(0));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(smtp.received().len(), 1, "a partial run raises no alert");

    *drift.lock().unwrap() = false;
    let recovered = canary(&project, &["run"]).await;
    assert_eq!(recovered.status.code(), Some(0));
    let mail = smtp.wait_for(2).await;
    assert_eq!(mail.len(), 2);
    assert_eq!(
        mail[1]["headers"]["Subject"],
        "[canary] free: recovered, no drift in run 6"
    );
}
}

on_both_stores! {
async fn an_unreachable_smtp_server_leaves_a_pending_alert_the_next_run_delivers() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let drift = Arc::new(Mutex::new(false));
    let server = model(drift.clone()).await;
    let project = project(server.base_url(), port, &[]);
    canary(&project, &["run", "--no-alert"]).await;
    canary(&project, &["accept"]).await;
    *drift.lock().unwrap() = true;

    let down = canary(&project, &["run"]).await;
    assert_eq!(
        down.status.code(),
        Some(1),
        "the exit code still says drift"
    );
    assert!(
        text(&down.stderr).contains("kept as pending"),
        "{}",
        text(&down.stderr)
    );
    let store = project.store();
    let pending = store.pending_alerts().unwrap();
    assert_eq!(pending.len(), 1);
    assert!(
        pending[0].error.as_deref().unwrap().contains("SMTP"),
        "{:?}",
        pending[0].error
    );
    assert_eq!(
        store.results(pending[0].run_id).unwrap().len(),
        // One answer per prompt, and nine more of each of the two whose answer left its exact
        // baseline, to confirm the change.
        3 + 2 * 9,
        "results were committed first"
    );
    drop(store);

    let smtp = SmtpServer::start(SmtpOptions {
        port,
        ..SmtpOptions::default()
    });
    let next = canary(&project, &["run"]).await;
    assert_eq!(next.status.code(), Some(1));
    let mail = smtp.wait_for(1).await;
    assert_eq!(mail.len(), 1, "delivered once, not once per run");
    assert_eq!(
        mail[0]["headers"]["Subject"],
        "[canary] free: 2 of 3 prompts drifted (run 2)"
    );
    assert!(project.store().pending_alerts().unwrap().is_empty());
}
}

#[tokio::test]
async fn starttls_with_a_test_certificate_and_login_works_and_verifies_the_certificate() {
    let certs = TestCertificates::new();
    let smtp = SmtpServer::start(SmtpOptions {
        tls: Some((&certs.cert, &certs.key)),
        login: Some(("canary", PASSWORD)),
        ..SmtpOptions::default()
    });
    let server = model(Arc::new(Mutex::new(false))).await;
    let smtp_line = |ca: &str| {
        format!(
            "    smtp: {{ host: localhost, port: {}, security: starttls, username_env: TEST_SMTP_USER, password_env: TEST_SMTP_PASSWORD{ca} }}",
            smtp.port
        )
    };
    let trusted = smtp_line(&format!(", ca_file: {}", certs.ca.display()));
    let top = [
        "alerts:",
        "  email:",
        &trusted,
        "    from: canary@example.com",
        "    to: [oncall@example.com]",
    ];
    let project = Project::new(&top, &[LaneSpec::new("free", server.base_url())]);
    let env = [
        ("TEST_SMTP_USER", "canary"),
        ("TEST_SMTP_PASSWORD", PASSWORD),
    ];

    let out = canary_with_env(&project, &["alert", "test"], &env).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("email: sent"));
    let mail = smtp.wait_for(1).await;
    assert_eq!(
        mail[0]["tls"], true,
        "the session was upgraded with STARTTLS"
    );
    assert_eq!(mail[0]["login"], "canary");
    assert_eq!(mail[0]["headers"]["Subject"], "[canary] test alert");
    assert!(!text(&out.stdout).contains(PASSWORD) && !text(&out.stderr).contains(PASSWORD));

    // Without the test CA the certificate is not trusted: verification is on.
    let untrusted = smtp_line("");
    let top = [
        "alerts:",
        "  email:",
        &untrusted,
        "    from: canary@example.com",
        "    to: [oncall@example.com]",
    ];
    let project = Project::new(&top, &[LaneSpec::new("free", server.base_url())]);
    let out = canary_with_env(&project, &["alert", "test"], &env).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stdout).contains("email: FAILED"),
        "{}",
        text(&out.stdout)
    );
    assert!(!text(&out.stdout).contains(PASSWORD));
    assert_eq!(smtp.received().len(), 1);
}

#[tokio::test]
async fn webhook_and_heartbeat_channels() {
    let hook = TestServer::always(Reply::json(200, "ok")).await;
    let beat = TestServer::always(Reply::json(200, "OK")).await;
    let drift = Arc::new(Mutex::new(false));
    let server = model(drift.clone()).await;
    let hook_url = format!("http://{}/hooks/secret-token", hook.addr);
    let beat_url = format!("http://{}/ping/uuid", beat.addr);
    let top = [
        "alerts:",
        "  webhook: { url_env: TEST_WEBHOOK_URL }",
        "  heartbeat: { url_env: TEST_HEARTBEAT_URL }",
    ];
    let project = Project::new(&top, &[LaneSpec::new("free", server.base_url())]);
    project.write_prompts("set.yaml", PROMPTS);
    let env = [
        ("TEST_WEBHOOK_URL", hook_url.as_str()),
        ("TEST_HEARTBEAT_URL", beat_url.as_str()),
    ];

    let tested = canary_with_env(&project, &["alert", "test"], &env).await;
    assert_eq!(tested.status.code(), Some(0), "{}", text(&tested.stdout));
    assert_eq!(hook.requests(), 1);
    let posted: serde_json::Value = serde_json::from_str(&hook.seen()[0].body).unwrap();
    assert!(
        posted["text"]
            .as_str()
            .unwrap()
            .contains("[canary] test alert"),
        "{posted}"
    );

    canary_with_env(&project, &["run"], &env).await;
    canary_with_env(&project, &["accept"], &env).await;
    *drift.lock().unwrap() = true;
    let drifted = canary_with_env(&project, &["run"], &env).await;
    assert_eq!(drifted.status.code(), Some(1));
    assert_eq!(hook.requests(), 2, "one post for the drift");
    let posted: serde_json::Value = serde_json::from_str(&hook.seen()[1].body).unwrap();
    assert!(
        posted["text"]
            .as_str()
            .unwrap()
            .contains("2 of 3 prompts drifted"),
        "{posted}"
    );

    let paths: Vec<String> = beat.seen().iter().map(|s| s.path.clone()).collect();
    // alert test pings once; each of the two runs pings start and then success.
    assert_eq!(
        paths,
        [
            "/ping/uuid",
            "/ping/uuid/start",
            "/ping/uuid",
            "/ping/uuid/start",
            "/ping/uuid"
        ]
    );
    assert!(!text(&drifted.stderr).contains("secret-token"));
}

#[tokio::test]
async fn a_channel_that_cannot_be_set_up_does_not_silence_the_others() {
    let hook = TestServer::always(Reply::json(200, "ok")).await;
    let drift = Arc::new(Mutex::new(false));
    let server = model(drift.clone()).await;
    let hook_url = format!("http://{}/hooks/x", hook.addr);
    let top = [
        "alerts:",
        "  email:",
        "    smtp: { host: 127.0.0.1, port: 25, security: none, username_env: TEST_UNSET_USER, password_env: TEST_UNSET_PASS }",
        "    from: canary@example.com",
        "    to: [oncall@example.com]",
        "  webhook: { url_env: TEST_WEBHOOK_URL }",
    ];
    let project = Project::new(&top, &[LaneSpec::new("free", server.base_url())]);
    project.write_prompts("set.yaml", PROMPTS);
    let env = [("TEST_WEBHOOK_URL", hook_url.as_str())];

    let tested = canary_with_env(&project, &["alert", "test"], &env).await;
    assert_eq!(tested.status.code(), Some(2));
    let shown = text(&tested.stdout);
    assert!(
        shown.contains("FAILED: email: env var TEST_UNSET_USER") && shown.contains("webhook: sent"),
        "{shown}"
    );

    canary_with_env(&project, &["run"], &env).await;
    canary_with_env(&project, &["accept"], &env).await;
    *drift.lock().unwrap() = true;
    let drifted = canary_with_env(&project, &["run"], &env).await;
    assert_eq!(drifted.status.code(), Some(1));
    assert_eq!(
        hook.requests(),
        2,
        "the webhook still carried the drift alert"
    );
    assert!(
        text(&drifted.stderr).contains("alert channel not set up"),
        "{}",
        text(&drifted.stderr)
    );
}
