//! A store shared by several runners: PostgreSQL with a lease per lane, shards, exactly-once
//! alerts, the control lane measured by another runner, and copies between the two engines.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::smtp::{SmtpOptions, SmtpServer, TestCertificates};
use crate::stores::{fresh_database, start_tls_server};
use crate::support::{LaneSpec, Project, Reply, TestServer, canary_with_env, prompt_of, text};

/// `n` prompts `p00`, `p01`, ...
fn prompts(n: usize) -> String {
    (0..n)
        .map(|i| format!("- id: p{i:02}\n  prompt: question {i}\n"))
        .collect()
}

/// A project on a fresh PostgreSQL database with a short lease.
fn shared(lanes: &[LaneSpec], top: &[&str]) -> Project {
    shared_with_lease(lanes, top, "2s")
}

fn shared_with_lease(lanes: &[LaneSpec], top: &[&str], lease: &str) -> Project {
    let store = format!("store: {{ url: {}, lease: {lease} }}", fresh_database());
    let mut lines = vec![store.as_str()];
    lines.extend_from_slice(top);
    Project::new(&lines, lanes)
}

/// A `canary` process on the project, running while the test goes on.
fn spawn(project: &Project, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_canary"))
        .arg("-c")
        .arg(project.path())
        .args(args)
        .env_remove("FREE_LANE")
        .env_remove("CANARY_CONFIG")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start canary")
}

/// Waits for a spawned `canary` off the runtime thread (the test servers share it).
async fn finish(child: Child) -> std::process::Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait for canary"))
        .await
        .unwrap()
}

async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting");
}

fn runs(project: &Project) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
        .arg("-c")
        .arg(project.path())
        .args(["history", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn two_runners_measure_two_lanes_at_once_and_a_killed_one_keeps_its_results() {
    let free =
        TestServer::always(Reply::completion("free answer", "m").after(Duration::from_millis(100)))
            .await;
    let paid =
        TestServer::always(Reply::completion("paid answer", "m").after(Duration::from_millis(100)))
            .await;
    // Long enough that the refused runner below surely starts while the lease holds.
    let project = shared_with_lease(
        &[
            LaneSpec::new("free", free.base_url()).with("max_inflight: 1"),
            LaneSpec::new("paid", paid.base_url()).with("max_inflight: 1"),
        ],
        &[],
        "6s",
    );
    project.write_prompts("set.yaml", &prompts(20));

    let mut doomed = spawn(&project, &["run", "--lane", "free", "--samples", "1"]);
    let survivor = spawn(&project, &["run", "--lane", "paid", "--samples", "1"]);
    // Both lanes are being asked at the same time, by two processes.
    until(|| free.requests() >= 6 && paid.requests() >= 3).await;
    doomed.kill().unwrap(); // SIGKILL: no chance to mark anything
    doomed.wait().unwrap();
    let answered_before_kill = free.requests() - 1;

    // The lane stays leased until the lease lapses: another runner is refused meanwhile.
    let refused = canary_with_env(&project, &["run", "--lane", "free"], &[]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    let why = text(&refused.stderr);
    assert!(
        why.contains("lane free is being measured by another runner") && why.contains("pid "),
        "{why}"
    );

    let survived = finish(survivor).await;
    assert_eq!(
        survived.status.code(),
        Some(0),
        "{}",
        text(&survived.stderr)
    );
    assert_eq!(
        paid.requests(),
        20,
        "the other runner measured every prompt"
    );

    let store = project.store();
    let killed = store
        .runs(10)
        .unwrap()
        .into_iter()
        .find(|r| r.lanes == ["free"])
        .unwrap();
    let kept = store.results(killed.id).unwrap();
    assert!(
        kept.len() >= answered_before_kill.saturating_sub(1) && kept.len() >= 4,
        "kept {} of ~{answered_before_kill}",
        kept.len()
    );
    assert!(
        kept.iter()
            .all(|r| r.output.as_deref() == Some("free answer"))
    );
    drop(store);

    // Once its lease lapses, the killed run reads as interrupted, and the lane is free again.
    tokio::time::sleep(Duration::from_millis(6500)).await;
    let history = runs(&project);
    let statuses: Vec<(String, String)> = history["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["lane"].as_str().unwrap_or_default().to_owned(),
                r["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        statuses.contains(&("free".into(), "interrupted".into()))
            && statuses.contains(&("paid".into(), "finished".into())),
        "{history}"
    );
    let store = project.store();
    assert_eq!(store.results(killed.id).unwrap().len(), kept.len());
    drop(store);
    let again = canary_with_env(&project, &["run", "--lane", "free", "--prompt", "p00"], &[]).await;
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
}

/// A model whose prime answer flips when `drift` is set.
async fn model(drift: Arc<Mutex<bool>>) -> TestServer {
    TestServer::start(move |_, seen| {
        let drifting = *drift.lock().unwrap();
        let prompt = prompt_of(seen);
        let answer = if prompt.contains("question") {
            if drifting { "No." } else { "Yes." }
        } else {
            "Paris."
        };
        Reply::completion(answer, "smollm2")
    })
    .await
}

#[tokio::test]
async fn two_runners_judging_the_same_drift_at_once_send_one_email() {
    let smtp = SmtpServer::start(SmtpOptions::default());
    let drift = Arc::new(Mutex::new(false));
    let server = model(drift.clone()).await;
    let smtp_line = format!(
        "    smtp: {{ host: 127.0.0.1, port: {}, security: none, timeout: 5s }}",
        smtp.port
    );
    let project = shared(
        &[LaneSpec::new("free", server.base_url())],
        &[
            "alerts:",
            "  email:",
            &smtp_line,
            "    from: canary@example.com",
            "    to: [oncall@example.com]",
        ],
    );
    project.write_prompts("set.yaml", &prompts(8));
    canary_with_env(&project, &["run"], &[]).await;
    canary_with_env(&project, &["accept"], &[]).await;

    *drift.lock().unwrap() = true;
    for _ in 0..3 {
        // Two runners, each half of the prompt set, both seeing the lane drift.
        let first = spawn(&project, &["run", "--shard", "1/2"]);
        let second = spawn(&project, &["run", "--shard", "2/2"]);
        let (first, second) = (finish(first).await, finish(second).await);
        assert_eq!(first.status.code(), Some(1), "{}", text(&first.stderr));
        assert_eq!(second.status.code(), Some(1), "{}", text(&second.stderr));
    }
    smtp.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let subjects: Vec<String> = smtp
        .received()
        .iter()
        .map(|m| m["headers"]["Subject"].to_string())
        .collect();
    assert_eq!(
        subjects.len(),
        1,
        "one email for the lane's drift, whoever judged it: {subjects:?}"
    );
    let store = project.store();
    assert!(store.pending_alerts().unwrap().is_empty());
    let shards: Vec<Option<String>> = store
        .runs(2)
        .unwrap()
        .into_iter()
        .map(|r| r.shard)
        .collect();
    assert!(
        shards.contains(&Some("1/2".into())) && shards.contains(&Some("2/2".into())),
        "{shards:?}"
    );
}

#[tokio::test]
async fn the_control_lane_measured_by_another_runner_still_marks_shared_drift_for_review() {
    let drift = Arc::new(Mutex::new(false));
    let free = model(drift.clone()).await;
    let control = model(drift.clone()).await;
    let project = shared(
        &[
            LaneSpec::new("free", free.base_url()),
            LaneSpec::new("control", control.base_url()),
        ],
        &["drift:", "  control: control"],
    );
    project.write_prompts("set.yaml", &prompts(3));
    canary_with_env(&project, &["run"], &[]).await;
    canary_with_env(&project, &["accept"], &[]).await;

    *drift.lock().unwrap() = true;
    let control_run = canary_with_env(&project, &["run", "--lane", "control"], &[]).await;
    assert_eq!(
        control_run.status.code(),
        Some(1),
        "{}",
        text(&control_run.stderr)
    );
    let free_run = canary_with_env(
        &project,
        &["run", "--lane", "free", "--format", "json"],
        &[],
    )
    .await;
    let json: serde_json::Value = serde_json::from_slice(&free_run.stdout).unwrap();
    let lane = &json["lanes"][0];
    assert_eq!(lane["lane"], "free");
    assert_ne!(lane["verdict"], "drifted", "{lane}");
    for prompt in lane["prompts"].as_array().unwrap() {
        assert_eq!(prompt["verdict"], "drifted", "{prompt}");
        assert_eq!(prompt["review"], true, "{prompt}");
    }
}

/// A SQLite project with three runs of four prompts: baselines, then a drift measured with
/// three samples and once more with one.
async fn drifted_history(server: &TestServer, drift: &Mutex<bool>) -> Project {
    let project = Project::new(&[], &[LaneSpec::new("free", server.base_url())]);
    project.write_prompts("set.yaml", &prompts(4));
    canary_with_env(&project, &["run"], &[]).await;
    canary_with_env(&project, &["accept"], &[]).await;
    *drift.lock().unwrap() = true;
    canary_with_env(&project, &["run", "--samples", "3"], &[]).await;
    canary_with_env(&project, &["run"], &[]).await;
    project
}

/// What a read-only command prints on the store `config` names.
fn shown(config: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
        .arg("-c")
        .arg(config)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    // `diff` exits 1 on drift; either way its output is what is compared.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The commands whose output two stores holding the same history must print alike.
const READS: [&[&str]; 4] = [
    &["history"],
    &["history", "--format", "json"],
    &["history", "--prompt", "p01"],
    &["diff", "--format", "json"],
];

#[tokio::test]
async fn a_history_copied_sqlite_to_postgres_and_back_reads_the_same() {
    let drift = Arc::new(Mutex::new(false));
    let server = model(drift.clone()).await;
    let project = drifted_history(&server, &drift).await;
    let original = project.path();
    let url = fresh_database();
    let yaml = std::fs::read_to_string(&original).unwrap();
    let on_postgres = project.file("canary-pg.yaml");
    std::fs::write(&on_postgres, format!("store: {url}\n{yaml}")).unwrap();
    let copied_back = project.file("canary-back.yaml");
    std::fs::write(&copied_back, format!("store: back.db\n{yaml}")).unwrap();

    let to_pg = canary_with_env(&project, &["store", "copy", "--to", &url], &[]).await;
    assert_eq!(to_pg.status.code(), Some(0), "{}", text(&to_pg.stderr));
    assert!(
        text(&to_pg.stdout).contains("verified"),
        "{}",
        text(&to_pg.stdout)
    );
    let back = canary_with_env(
        &project,
        &[
            "store", "copy", "--from", &url, "--to", "back.db", "--format", "json",
        ],
        &[],
    )
    .await;
    assert_eq!(back.status.code(), Some(0), "{}", text(&back.stderr));
    let report: serde_json::Value = serde_json::from_slice(&back.stdout).unwrap();
    assert_eq!(report["verified"], true);
    let results = report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["table"] == "results")
        .unwrap();
    assert_eq!(results["rows"], project.store().counts().unwrap().0);

    for args in READS {
        let sqlite = shown(&original, args);
        assert_eq!(sqlite, shown(&on_postgres, args), "{args:?} on PostgreSQL");
        assert_eq!(sqlite, shown(&copied_back, args), "{args:?} copied back");
    }

    // A store that already holds a history is not copied into.
    let again = canary_with_env(&project, &["store", "copy", "--to", &url], &[]).await;
    assert_eq!(again.status.code(), Some(2));
    assert!(
        text(&again.stderr).contains("already holds 3 runs"),
        "{}",
        text(&again.stderr)
    );
}

#[tokio::test]
async fn the_store_password_never_reaches_output_logs_or_the_store() {
    const SECRET: &str = "pg-pass-9d2e-never-print";
    let server = TestServer::always(Reply::completion("answer", "m")).await;
    let url = fresh_database();
    let project = Project::new(
        &[&format!(
            "store: {{ url: {url}, password_env: TEST_PG_PASSWORD }}"
        )],
        &[LaneSpec::new("free", server.base_url())],
    );
    project.write_prompts("set.yaml", &prompts(2));
    let env = [("TEST_PG_PASSWORD", SECRET), ("CANARY_LOG", "trace")];
    let run = canary_with_env(&project, &["run", "--samples", "1"], &env).await;
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let history = canary_with_env(&project, &["history", "--format", "json"], &env).await;
    // A server that cannot be reached: the error names the store, never the password.
    let (unreachable, _) = url.rsplit_once('/').unwrap();
    let broken = project.file("broken.yaml");
    std::fs::write(
        &broken,
        std::fs::read_to_string(project.path()).unwrap().replacen(
            &url,
            &format!(
                "{}:1/nowhere",
                &unreachable[..unreachable.rfind(':').unwrap()]
            ),
            1,
        ),
    )
    .unwrap();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_canary"))
        .arg("-c")
        .arg(&broken)
        .arg("history")
        .envs(env)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused.stderr).contains("store postgres://canary@127.0.0.1:1/nowhere"),
        "{}",
        text(&refused.stderr)
    );
    let missing = canary_with_env(&project, &["history"], &[]).await;
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing.stderr)
            .contains("TEST_PG_PASSWORD that `store.password_env` names is not set"),
        "{}",
        text(&missing.stderr)
    );
    for out in [&run, &history, &refused, &missing] {
        assert!(!text(&out.stdout).contains(SECRET) && !text(&out.stderr).contains(SECRET));
    }
    assert!(!project.audit_text().contains(SECRET));
    let store = project.store_with_env(&[("TEST_PG_PASSWORD", SECRET)]);
    for result in store.results(1).unwrap() {
        assert!(!format!("{result:?}").contains(SECRET));
    }
}

#[tokio::test]
async fn a_store_asking_for_tls_verifies_the_server_and_sends_the_password_only_inside_it() {
    let certs = TestCertificates::new();
    let dir = tempfile::tempdir().unwrap();
    let url = tokio::task::spawn_blocking({
        let (data, cert, key) = (dir.path().join("pg"), certs.cert.clone(), certs.key.clone());
        move || start_tls_server(&data, &cert, &key)
    })
    .await
    .unwrap();
    let server = TestServer::always(Reply::completion("answer", "m")).await;
    let project = |store: &str| {
        let project = Project::new(&[store], &[LaneSpec::new("free", server.base_url())]);
        project.write_prompts("set.yaml", &prompts(2));
        project
    };
    let ca = certs.ca.display().to_string();
    let password = [("TEST_TLS_PG_PASSWORD", "canary")];
    let verified = project(&format!(
        "store: {{ url: \"{url}?sslmode=verify-full\", password_env: TEST_TLS_PG_PASSWORD, ca_file: {ca} }}"
    ));
    let run = canary_with_env(&verified, &["run", "--samples", "1"], &password).await;
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert_eq!(
        verified.store_with_env(&password).results(1).unwrap().len(),
        2
    );

    // Without the CA the certificate is not trusted; without TLS the server refuses.
    let untrusted = project(&format!(
        "store: {{ url: \"{url}?sslmode=require\", password_env: TEST_TLS_PG_PASSWORD }}"
    ));
    let out = canary_with_env(&untrusted, &["history"], &password).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).to_lowercase().contains("certificate"),
        "{}",
        text(&out.stderr)
    );
    let plain = project(&format!(
        "store: {{ url: \"{url}\", password_env: TEST_TLS_PG_PASSWORD }}"
    ));
    let out = canary_with_env(&plain, &["history"], &password).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // With TLS and a wrong password the server says no, and the password is not repeated.
    let out = canary_with_env(
        &verified,
        &["history"],
        &[("TEST_TLS_PG_PASSWORD", "wrong-pass-7c1e")],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong-pass-7c1e"), "{stderr}");
}

#[tokio::test]
async fn a_postgresql_store_of_schema_4_keeps_every_row_as_its_integers_narrow() {
    let drift = Arc::new(Mutex::new(false));
    let server = model(drift.clone()).await;
    let project = drifted_history(&server, &drift).await;
    let url = fresh_database();
    let copied = canary_with_env(&project, &["store", "copy", "--to", &url], &[]).await;
    assert_eq!(copied.status.code(), Some(0), "{}", text(&copied.stderr));
    // Back to the schema the first PostgreSQL stores were created with: 8-byte integers.
    let sql = |statements: String| {
        let url = url.clone();
        canary::store::postgres::off_runtime(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            client.batch_execute(&statements).unwrap();
        })
    };
    let widen = |table: &str, columns: &[&str]| {
        let columns: Vec<String> = columns
            .iter()
            .map(|c| format!("ALTER COLUMN {c} TYPE BIGINT"))
            .collect();
        format!("ALTER TABLE {table} {};", columns.join(", "))
    };
    // A count schema 4 held as a server reported it, past what four bytes hold.
    sql(format!(
        "{} {} UPDATE results SET prompt_tokens = 99999999999
             WHERE ctid = (SELECT ctid FROM results LIMIT 1);
         UPDATE canary_schema SET version = 4;",
        widen(
            "results",
            &[
                "run_id",
                "lane",
                "prompt",
                "sample",
                "served",
                "output",
                "prompt_tokens",
                "completion_tokens",
                "queue_ms",
                "call_ms",
                "at_ms"
            ]
        ),
        widen(
            "verdicts",
            &["run_id", "lane", "prompt", "verdict", "review", "mode"]
        ),
    ));
    let on_postgres = project.file("canary-pg.yaml");
    let yaml = std::fs::read_to_string(project.path()).unwrap();
    std::fs::write(&on_postgres, format!("store: {url}\n{yaml}")).unwrap();

    for args in READS {
        assert_eq!(
            shown(&project.path(), args),
            shown(&on_postgres, args),
            "{args:?} after the migration"
        );
    }
    let (version, narrow, largest) = canary::store::postgres::off_runtime(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let version: i64 = client
            .query_one("SELECT version FROM canary_schema", &[])
            .unwrap()
            .get(0);
        let narrow: i64 = client
            .query_one(
                "SELECT COUNT(*) FROM information_schema.columns
                 WHERE table_name IN ('results', 'verdicts') AND data_type IN ('integer', 'smallint')",
                &[],
            )
            .unwrap()
            .get(0);
        let largest: i32 = client
            .query_one("SELECT MAX(prompt_tokens) FROM results", &[])
            .unwrap()
            .get(0);
        (version, narrow, largest)
    });
    assert_eq!((version, narrow, largest), (5, 17, i32::MAX));
}

#[tokio::test]
async fn a_database_that_accepts_and_never_answers_is_given_up_on_at_connect_timeout() {
    // Accepts every connection and holds it without a byte in reply.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let project = Project::new(
        &[&format!(
            "store: postgres://canary@127.0.0.1:{port}/canary?connect_timeout=1"
        )],
        &[LaneSpec::new("free", "http://127.0.0.1:9/v1".into())],
    );
    let started = std::time::Instant::now();
    let out = canary_with_env(&project, &["history"], &[]).await;
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no answer within 1 s while connecting"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "gave up after {took:?}"
    );
}
