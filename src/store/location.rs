//! Where the store lives: a SQLite file, or a PostgreSQL database shared by several runners.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default lease of a runner on its lanes in a shared store.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// An embedded SQLite file, guarded by a file lock while a run writes it.
    Sqlite(PathBuf),
    /// A PostgreSQL database; runners hold a lease per lane in it.
    Postgres(PostgresTarget),
}

/// A PostgreSQL store: its URL (never with a password) and where its secrets come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresTarget {
    /// `postgres://user@host[:port]/db[?sslmode=require]`.
    pub url: String,
    /// The env var holding the password; `PGPASSWORD` when not named.
    pub password_env: Option<String>,
    /// Extra CA certificates (PEM) to trust for TLS, beside the public roots.
    pub ca_file: Option<PathBuf>,
    /// How long a runner's claim on its lanes lasts without renewal.
    pub lease: Duration,
}

impl StoreLocation {
    /// Reads `store:` as written: a PostgreSQL URL, or a SQLite path (relative to `dir`).
    pub fn parse(value: &str, dir: &Path) -> Result<StoreLocation, String> {
        if is_postgres_url(value) {
            return Ok(StoreLocation::Postgres(PostgresTarget::new(value)?));
        }
        let path = PathBuf::from(value);
        Ok(StoreLocation::Sqlite(if path.is_absolute() {
            path
        } else {
            dir.join(path)
        }))
    }

    /// The SQLite file, for a SQLite store.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            StoreLocation::Sqlite(path) => Some(path),
            StoreLocation::Postgres(_) => None,
        }
    }

    /// Whether several runners may share it.
    pub fn is_shared(&self) -> bool {
        matches!(self, StoreLocation::Postgres(_))
    }
}

/// `postgres://` or `postgresql://`.
pub fn is_postgres_url(value: &str) -> bool {
    value.starts_with("postgres://") || value.starts_with("postgresql://")
}

impl PostgresTarget {
    /// A target with the default lease, refusing a URL that carries a password: secrets are
    /// never written in the config.
    pub fn new(url: &str) -> Result<PostgresTarget, String> {
        // `sslmode` is read by canary itself (the client knows fewer modes than libpq).
        let (without_sslmode, _) = super::postgres::tls_mode(url);
        let config: postgres::Config = without_sslmode
            .parse()
            .map_err(|err| format!("expected a PostgreSQL URL such as postgres://canary@db.internal/canary, found {}: {err}", redact(url)))?;
        if config.get_password().is_some() {
            return Err(format!(
                "the store URL {} carries a password; put it in PGPASSWORD or the env var `store.password_env` names instead",
                redact(url)
            ));
        }
        if config.get_user().is_none() {
            return Err(format!(
                "the store URL {url} names no user; write postgres://USER@HOST/DB"
            ));
        }
        Ok(PostgresTarget {
            url: url.to_owned(),
            password_env: None,
            ca_file: None,
            lease: DEFAULT_LEASE,
        })
    }
}

/// A URL with any password replaced, for messages: in its user info or a `password`
/// parameter.
pub fn redact(url: &str) -> String {
    let url = &redact_parameter(url);
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    // The user info ends at the last `@` (a password may hold `/` or `?`).
    let authority_end = match rest.rfind('@') {
        Some(at) => at + rest[at..].find(['/', '?']).unwrap_or(rest.len() - at),
        None => rest.find(['/', '?']).unwrap_or(rest.len()),
    };
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => match authority[..at].find(':') {
            Some(colon) => format!(
                "{}{}:[redacted]{}",
                &url[..scheme_end + 3],
                &authority[..colon],
                &rest[at..]
            ),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// `password=...` in the query string, replaced.
fn redact_parameter(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=[redacted]"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

impl From<&StoreLocation> for StoreLocation {
    fn from(location: &StoreLocation) -> Self {
        location.clone()
    }
}

impl From<&Path> for StoreLocation {
    fn from(path: &Path) -> Self {
        StoreLocation::Sqlite(path.to_path_buf())
    }
}

impl From<&PathBuf> for StoreLocation {
    fn from(path: &PathBuf) -> Self {
        StoreLocation::Sqlite(path.clone())
    }
}

impl From<PathBuf> for StoreLocation {
    fn from(path: PathBuf) -> Self {
        StoreLocation::Sqlite(path)
    }
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => write!(f, "{}", path.display()),
            StoreLocation::Postgres(target) => f.write_str(&redact(&target.url)),
        }
    }
}

impl StoreLocation {
    /// For messages: the file, or the URL without any password.
    pub fn display(&self) -> &Self {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths_are_told_apart() {
        let dir = Path::new("/srv/canary");
        assert_eq!(
            StoreLocation::parse(".canary/canary.db", dir).unwrap(),
            StoreLocation::Sqlite(PathBuf::from("/srv/canary/.canary/canary.db"))
        );
        let StoreLocation::Postgres(target) = StoreLocation::parse(
            "postgres://canary@db.internal:5433/canary?sslmode=require",
            dir,
        )
        .unwrap() else {
            panic!("not postgres")
        };
        assert_eq!(target.lease, DEFAULT_LEASE);
        assert!(StoreLocation::parse("postgresql://canary@db/canary", dir).is_ok());
    }

    #[test]
    fn a_password_in_the_url_is_refused_and_never_repeated() {
        let err = StoreLocation::parse("postgres://canary:hunter2@db/canary", Path::new("/"))
            .unwrap_err();
        assert!(err.contains("PGPASSWORD"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        assert_eq!(
            redact("postgres://canary:hunter2@db:5432/canary?sslmode=require"),
            "postgres://canary:[redacted]@db:5432/canary?sslmode=require"
        );
        assert_eq!(redact("postgres://canary@db/c"), "postgres://canary@db/c");
    }

    #[test]
    fn a_password_in_a_parameter_or_with_odd_characters_is_never_repeated() {
        for url in [
            "postgres://canary@db/canary?password=hunter2",
            "postgres://canary@db/canary?sslmode=require&PASSWORD=hunter2",
            "postgres://canary:hun/ter?2@db/canary",
        ] {
            let shown = redact(url);
            assert!(
                !shown.contains("hunter2") && !shown.contains("hun/ter"),
                "{shown}"
            );
            if let Err(err) = StoreLocation::parse(url, Path::new("/")) {
                assert!(
                    !err.contains("hunter2") && !err.contains("hun/ter"),
                    "{err}"
                );
            }
        }
        let err = StoreLocation::parse(
            "postgres://canary@db/canary?password=hunter2",
            Path::new("/"),
        )
        .unwrap_err();
        assert!(err.contains("carries a password"), "{err}");
    }

    #[test]
    fn every_sslmode_canary_knows_parses() {
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            let url = format!("postgres://canary@db/canary?sslmode={mode}");
            assert!(StoreLocation::parse(&url, Path::new("/")).is_ok(), "{mode}");
        }
    }

    #[test]
    fn a_url_without_a_user_is_refused() {
        let err =
            StoreLocation::parse("postgres://db.internal/canary", Path::new("/")).unwrap_err();
        assert!(err.contains("no user"), "{err}");
    }
}
