//! The PostgreSQL connection of a shared store.
//!
//! The synchronous `postgres` client drives its socket with a small runtime of its own, which
//! cannot run inside canary's: a store call made from async code runs on a short-lived scoped
//! thread instead. Store calls are few and coarse (a group of results, a run's verdicts), so
//! the thread costs nothing that shows.

use std::collections::HashMap;
use std::sync::Arc;

use super::db::{Db, DbError, PostgresDb};
use super::location::PostgresTarget;
use super::migrations;

/// One connection and its prepared statements.
pub struct PgConn {
    /// Always `Some` until dropped: closing the connection also needs to be off the runtime.
    client: Option<postgres::Client>,
    statements: HashMap<String, postgres::Statement>,
}

impl Drop for PgConn {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            off_runtime(move || drop(client));
        }
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `password_env` names a variable that is not set.
    #[error("the env var {0} that `store.password_env` names is not set")]
    MissingPassword(String),
    /// The CA file cannot be read or holds no certificate.
    #[error("cannot use store.ca_file {path}: {message}")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// rustls could not be set up.
    #[error("cannot set up TLS to the store: {0}")]
    Tls(String),
    /// The server refused or could not be reached.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The server did not finish the connection (TCP, TLS, start-up, password) in time.
    #[error(
        "no answer within {} s while connecting (the URL's `connect_timeout` sets how long)",
        .0.as_secs_f64()
    )]
    TimedOut(std::time::Duration),
}

/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `work` off any async runtime: on this thread when it is not inside one, else on a
/// scoped thread it waits for.
pub fn off_runtime<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    std::thread::scope(|scope| match scope.spawn(work).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl PgConn {
    /// Connects, with TLS when the URL asks for it (`sslmode=require`, `verify-ca` or
    /// `verify-full`: the server's certificate is always verified), and the password from
    /// `password_env` or `PGPASSWORD`.
    pub fn connect(
        target: &PostgresTarget,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PgConn, ConnectError> {
        let (url, tls) = tls_mode(&target.url);
        let mut config: postgres::Config = url.parse().map_err(DbError::from)?;
        config.application_name("canary");
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let password = match &target.password_env {
            Some(var) => Some(env(var).ok_or_else(|| ConnectError::MissingPassword(var.clone()))?),
            None => env("PGPASSWORD"),
        };
        if let Some(password) = password {
            config.password(password);
        }
        let connector = if tls {
            config.ssl_mode(postgres::config::SslMode::Require);
            Some(tls_connector(target)?)
        } else {
            config.ssl_mode(postgres::config::SslMode::Disable);
            None
        };
        // The client's own timeout covers the TCP connect only: a server that accepts and then
        // never answers would hold the handshake forever. The whole connect gets the same time
        // on a thread of its own; given up on, it ends (and drops its client) by itself.
        let limit = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT);
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let connected = match connector {
                Some(connector) => config.connect(connector),
                None => config.connect(postgres::NoTls),
            };
            let _ = send.send(connected);
        });
        let client = match receive.recv_timeout(limit) {
            Ok(connected) => connected.map_err(DbError::from)?,
            Err(_) => return Err(ConnectError::TimedOut(limit)),
        };
        Ok(PgConn {
            client: Some(client),
            statements: HashMap::new(),
        })
    }

    /// Runs `work` against this connection, off any async runtime.
    pub fn with<R: Send>(
        &mut self,
        work: impl FnOnce(&mut dyn Db) -> Result<R, DbError> + Send,
    ) -> Result<R, DbError> {
        let PgConn { client, statements } = self;
        let client = client
            .as_mut()
            .expect("the connection is open until dropped");
        off_runtime(move || {
            let mut db = PostgresDb { client, statements };
            work(&mut db)
        })
    }

    /// Brings the schema to this canary's version, once, whatever the number of runners
    /// starting at the same instant: under an advisory lock, in one transaction.
    pub fn migrate(&mut self) -> Result<Migrated, DbError> {
        self.with(|db| {
            db.batch("BEGIN")?;
            let result = migrate_locked(db);
            match result {
                Ok(Migrated::Current) | Ok(Migrated::To(_)) => db.batch("COMMIT")?,
                _ => {
                    let _ = db.batch("ROLLBACK");
                }
            }
            result
        })
    }

    /// The schema version.
    pub fn version(&mut self) -> Result<i64, DbError> {
        self.with(|db| {
            Ok(db
                .query_opt("SELECT version FROM canary_schema", &[])?
                .map(|row| row.int(0))
                .transpose()?
                .unwrap_or(0))
        })
    }
}

/// What a migration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrated {
    /// Nothing to do.
    Current,
    /// Brought to this version.
    To(i64),
    /// The store is newer than this canary.
    TooNew(i64),
}

/// The key of the advisory lock migrations take (any constant the store does not use else).
const MIGRATION_LOCK: i64 = 0x6361_6e61_7279; // "canary"

fn migrate_locked(db: &mut dyn Db) -> Result<Migrated, DbError> {
    db.execute("SELECT pg_advisory_xact_lock(?1)", &[MIGRATION_LOCK.into()])?;
    db.batch("CREATE TABLE IF NOT EXISTS canary_schema (version BIGINT NOT NULL)")?;
    let version = db
        .query_opt("SELECT version FROM canary_schema", &[])?
        .map(|row| row.int(0))
        .transpose()?;
    let known = migrations::KNOWN_VERSION;
    let from = version.unwrap_or(0);
    if from > known {
        return Ok(Migrated::TooNew(from));
    }
    if from == known {
        return Ok(Migrated::Current);
    }
    for (to, migration) in migrations::POSTGRES {
        if *to > from {
            db.batch(migration)?;
        }
    }
    if version.is_none() {
        db.execute(
            "INSERT INTO canary_schema (version) VALUES (?1)",
            &[known.into()],
        )?;
    } else {
        db.execute("UPDATE canary_schema SET version = ?1", &[known.into()])?;
    }
    Ok(Migrated::To(known))
}

/// The URL as the client parses it, and whether TLS is asked for. `verify-ca` and
/// `verify-full` read as `require`: rustls always verifies the server's certificate.
pub(crate) fn tls_mode(url: &str) -> (String, bool) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), false);
    };
    let mut tls = false;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslmode", mode)) => {
                tls = matches!(mode, "require" | "verify-ca" | "verify-full");
            }
            _ => kept.push(pair),
        }
    }
    if kept.is_empty() {
        (base.to_owned(), tls)
    } else {
        (format!("{base}?{}", kept.join("&")), tls)
    }
}

fn tls_connector(
    target: &PostgresTarget,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, ConnectError> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = &target.ca_file {
        let ca_error = |message: String| ConnectError::CaFile {
            path: path.display().to_string(),
            message,
        };
        let pem = std::fs::read(path).map_err(|err| ca_error(err.to_string()))?;
        let mut added = 0;
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|err| ca_error(err.to_string()))?;
            roots.add(cert).map_err(|err| ca_error(err.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(ca_error("no PEM certificate in it".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| ConnectError::Tls(err.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_asks_for_tls_and_other_parameters_stay() {
        assert_eq!(
            tls_mode("postgres://u@h/db"),
            ("postgres://u@h/db".to_string(), false)
        );
        assert_eq!(
            tls_mode("postgres://u@h/db?sslmode=verify-full"),
            ("postgres://u@h/db".to_string(), true)
        );
        assert_eq!(
            tls_mode("postgres://u@h/db?connect_timeout=3&sslmode=require"),
            ("postgres://u@h/db?connect_timeout=3".to_string(), true)
        );
        assert_eq!(
            tls_mode("postgres://u@h/db?sslmode=disable"),
            ("postgres://u@h/db".to_string(), false)
        );
    }
}
