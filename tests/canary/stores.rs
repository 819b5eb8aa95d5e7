//! Both store engines under one suite: a throwaway PostgreSQL server for the test process, a
//! fresh database per project, and `on_both_stores!`, which runs a test body once against a
//! SQLite file and once against PostgreSQL.
//!
//! The server is started once per test process by `scripts/postgres` (which installs Debian's
//! PostgreSQL when it is missing) on a free loopback port, with a throwaway data directory;
//! its watchdog stops it and removes the data once this process has ended.

#![allow(dead_code)]

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// Set while a test body runs against PostgreSQL: `Project::new` then gives the project a
    /// fresh PostgreSQL database instead of a SQLite file.
    static ON_POSTGRES: Cell<bool> = const { Cell::new(false) };
}

/// Whether the project being set up on this thread should use PostgreSQL.
pub fn on_postgres() -> bool {
    ON_POSTGRES.with(Cell::get)
}

/// Runs `body` with projects made on this thread using PostgreSQL.
pub async fn with_postgres<F: std::future::Future>(body: F) -> F::Output {
    ON_POSTGRES.with(|flag| flag.set(true));
    let output = body.await;
    ON_POSTGRES.with(|flag| flag.set(false));
    output
}

/// The URL of this process's PostgreSQL server (its `canary` database), started on first use,
/// without fsync (tests need no durability across a machine crash).
pub fn server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("canary-tests-pg-{}", std::process::id()));
        start_server(&dir, true)
    })
}

/// Starts a PostgreSQL server with its data under `dir` (stopped by its watchdog when this
/// process ends, or by `scripts/postgres stop DIR`); its URL. `fast` turns fsync off.
pub fn start_server(dir: &std::path::Path, fast: bool) -> String {
    start(dir, fast, None)
}

/// Starts a server that accepts only TLS (with `cert` and `key`, PEM) and asks `canary` for its
/// password, `canary`; its URL (without `sslmode`).
pub fn start_tls_server(
    dir: &std::path::Path,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> String {
    start(dir, true, Some((cert, key)))
}

fn start(
    dir: &std::path::Path,
    fast: bool,
    tls: Option<(&std::path::Path, &std::path::Path)>,
) -> String {
    let mut command =
        std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/postgres"));
    command
        .arg("start")
        .arg(dir)
        .env("CANARY_PG_OWNER", std::process::id().to_string())
        .env("CANARY_PG_FAST", if fast { "1" } else { "0" })
        .stderr(std::process::Stdio::inherit());
    if let Some((cert, key)) = tls {
        command
            .env("CANARY_PG_TLS_CERT", cert)
            .env("CANARY_PG_TLS_KEY", key);
    }
    let output = command.output().expect("run scripts/postgres");
    assert!(
        output.status.success(),
        "scripts/postgres start failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stdout)
        .expect("a URL")
        .trim()
        .to_owned()
}

/// A new, empty database on the server; its URL.
pub fn fresh_database() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let base = server_url();
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    canary::store::postgres::off_runtime(|| {
        let mut client =
            postgres::Client::connect(base, postgres::NoTls).expect("connect to the test server");
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create a test database");
    });
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    format!("{server}/{name}")
}

/// Runs an async test body once on a SQLite store and once on a PostgreSQL one:
/// `on_both_stores! { async fn name() { ... } }` makes tests `name::sqlite` and
/// `name::postgres`.
#[allow(unused_macros)]
macro_rules! on_both_stores {
    ($(#[$meta:meta])* async fn $name:ident() $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body() $body

            #[tokio::test]
            async fn sqlite() {
                body().await
            }

            #[tokio::test]
            async fn postgres() {
                crate::stores::with_postgres(body()).await
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_stores;
