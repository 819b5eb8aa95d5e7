//! The one seam between the store and its database engine.
//!
//! The store's queries are written once, in the SQL that SQLite and PostgreSQL share, with
//! `?1`-style parameters (rewritten to `$1` for PostgreSQL). A query takes [`Param`]s and gives
//! [`Row`]s of [`Value`]s; [`Dialect`] says which engine is behind the seam, for the few
//! statements that differ (schema, maintenance, locking).

use std::collections::HashMap;

use rusqlite::types::{ToSqlOutput, ValueRef};

/// The engine behind a [`Db`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// An embedded SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// A database error, from either engine, or a value of an unexpected type.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite refused.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL refused, or the connection failed. Its message is PostgreSQL's own, which
    /// says all the client's error chain would (`db error`, then the same message again).
    #[error("{}", postgres_message(.0))]
    Postgres(postgres::Error),
    /// The work in a transaction gave up on purpose (a lease held elsewhere); rolled back.
    #[error("refused: {0}")]
    Refused(String),
    /// A column did not hold what the store expects.
    #[error("column {column}: {message}")]
    Decode {
        /// Its index.
        column: usize,
        /// What was wrong.
        message: String,
    },
}

impl From<postgres::Error> for DbError {
    fn from(err: postgres::Error) -> DbError {
        DbError::Postgres(err)
    }
}

/// PostgreSQL's own message (with its detail), rather than the client's "db error".
fn postgres_message(err: &postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{}: {} ({detail})", db.severity(), db.message()),
            None => format!("{}: {}", db.severity(), db.message()),
        },
        // Not the server's: the client's message with its causes (a TLS handshake names the
        // certificate problem only in its cause).
        None => crate::said_once(std::iter::successors(
            Some(err as &(dyn std::error::Error + 'static)),
            |error| error.source(),
        )),
    }
}

impl DbError {
    /// A unique or primary-key constraint refused a row.
    pub fn is_unique_violation(&self) -> bool {
        match self {
            DbError::Sqlite(rusqlite::Error::SqliteFailure(failure, _)) => {
                failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    || failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            }
            DbError::Postgres(err) => {
                err.code() == Some(&postgres::error::SqlState::UNIQUE_VIOLATION)
            }
            _ => false,
        }
    }
}

/// A query parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Param<'a> {
    /// SQL NULL.
    Null,
    /// An integer (BIGINT in PostgreSQL).
    Int(i64),
    /// A float (DOUBLE PRECISION in PostgreSQL).
    Real(f64),
    /// Text.
    Text(&'a str),
    /// Bytes (BYTEA in PostgreSQL).
    Blob(&'a [u8]),
}

impl From<i64> for Param<'_> {
    fn from(value: i64) -> Self {
        Param::Int(value)
    }
}

impl From<bool> for Param<'_> {
    fn from(value: bool) -> Self {
        Param::Int(i64::from(value))
    }
}

impl From<f64> for Param<'_> {
    fn from(value: f64) -> Self {
        Param::Real(value)
    }
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(value: &'a str) -> Self {
        Param::Text(value)
    }
}

impl<'a> From<&'a String> for Param<'a> {
    fn from(value: &'a String) -> Self {
        Param::Text(value)
    }
}

impl<'a> From<&'a [u8]> for Param<'a> {
    fn from(value: &'a [u8]) -> Self {
        Param::Blob(value)
    }
}

impl<'a, T: Into<Param<'a>>> From<Option<T>> for Param<'a> {
    fn from(value: Option<T>) -> Self {
        value.map_or(Param::Null, Into::into)
    }
}

/// The parameters of one statement: `params![a, b]`.
macro_rules! params {
    () => { &[] as &[$crate::store::db::Param<'_>] };
    ($($value:expr),+ $(,)?) => {
        &[$($crate::store::db::Param::from($value)),+] as &[$crate::store::db::Param<'_>]
    };
}
pub(crate) use params;

/// A value read from a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// An integer.
    Int(i64),
    /// A float.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

impl Value {
    /// The value as a parameter of another statement (to copy rows between stores).
    pub fn as_param(&self) -> Param<'_> {
        match self {
            Value::Null => Param::Null,
            Value::Int(i) => Param::Int(*i),
            Value::Real(f) => Param::Real(*f),
            Value::Text(s) => Param::Text(s),
            Value::Blob(b) => Param::Blob(b),
        }
    }
}

/// One row of a result.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Vec<Value>);

impl Row {
    fn value(&self, column: usize) -> Result<&Value, DbError> {
        self.0.get(column).ok_or_else(|| DbError::Decode {
            column,
            message: format!("the row has {} columns", self.0.len()),
        })
    }

    fn wrong(column: usize, expected: &str, found: &Value) -> DbError {
        DbError::Decode {
            column,
            message: format!("expected {expected}, found {found:?}"),
        }
    }

    /// An integer column.
    pub fn int(&self, column: usize) -> Result<i64, DbError> {
        self.opt_int(column)?
            .ok_or_else(|| Row::wrong(column, "an integer", &Value::Null))
    }

    /// An integer column that may be NULL.
    pub fn opt_int(&self, column: usize) -> Result<Option<i64>, DbError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Int(i) => Ok(Some(*i)),
            other => Err(Row::wrong(column, "an integer", other)),
        }
    }

    /// An integer column read as a flag.
    pub fn bool(&self, column: usize) -> Result<bool, DbError> {
        Ok(self.int(column)? != 0)
    }

    /// A float column that may be NULL.
    pub fn opt_real(&self, column: usize) -> Result<Option<f64>, DbError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Real(f) => Ok(Some(*f)),
            // SQLite stores a float without a fraction as an integer when it can.
            Value::Int(i) => Ok(Some(*i as f64)),
            other => Err(Row::wrong(column, "a number", other)),
        }
    }

    /// A text column.
    pub fn text(&self, column: usize) -> Result<String, DbError> {
        self.opt_text(column)?
            .ok_or_else(|| Row::wrong(column, "text", &Value::Null))
    }

    /// A text column that may be NULL.
    pub fn opt_text(&self, column: usize) -> Result<Option<String>, DbError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s.clone())),
            other => Err(Row::wrong(column, "text", other)),
        }
    }
}

/// A connection to the store's database: SQLite or PostgreSQL.
pub trait Db {
    /// Which engine this is.
    fn dialect(&self) -> Dialect;
    /// Runs one statement; returns the rows it changed.
    fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, DbError>;
    /// Runs one query; returns its rows.
    fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, DbError>;
    /// Runs several statements without parameters.
    fn batch(&mut self, sql: &str) -> Result<(), DbError>;

    /// The first row of a query, if any.
    fn query_opt(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// The one row of a query.
    fn query_one(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Row, DbError> {
        self.query_opt(sql, params)?.ok_or(DbError::Decode {
            column: 0,
            message: "the query returned no row".into(),
        })
    }
}

/// Runs `work` in a transaction: committed when it returns `Ok`, rolled back otherwise.
/// A `write` transaction takes SQLite's write lock at once (`BEGIN IMMEDIATE`), so another
/// connection's commit in between cannot turn it into a busy error no timeout retries.
pub fn transaction<R>(
    db: &mut dyn Db,
    write: bool,
    work: impl FnOnce(&mut dyn Db) -> Result<R, DbError>,
) -> Result<R, DbError> {
    let begin = match (db.dialect(), write) {
        (Dialect::Sqlite, true) => "BEGIN IMMEDIATE",
        _ => "BEGIN",
    };
    db.batch(begin)?;
    match work(db) {
        Ok(value) => {
            db.batch("COMMIT")?;
            Ok(value)
        }
        Err(err) => {
            // The error that ended the work is the one worth reporting.
            let _ = db.batch("ROLLBACK");
            Err(err)
        }
    }
}

/// SQLite behind the seam.
pub struct SqliteDb<'c>(pub &'c rusqlite::Connection);

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Param::Null => ValueRef::Null,
            Param::Int(i) => ValueRef::Integer(*i),
            Param::Real(f) => ValueRef::Real(*f),
            Param::Text(s) => ValueRef::Text(s.as_bytes()),
            Param::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl Db for SqliteDb<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, DbError> {
        let changed = self
            .0
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(params))?;
        Ok(changed as u64)
    }

    fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, DbError> {
        let mut statement = self.0.prepare_cached(sql)?;
        let columns = statement.column_count();
        let mut rows = statement.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let mut values = Vec::with_capacity(columns);
            for column in 0..columns {
                values.push(match row.get_ref(column)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(i) => Value::Int(i),
                    ValueRef::Real(f) => Value::Real(f),
                    ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Value::Blob(b.to_vec()),
                });
            }
            out.push(Row(values));
        }
        Ok(out)
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        Ok(self.0.execute_batch(sql)?)
    }
}

/// PostgreSQL behind the seam: a client and its prepared statements, by the store's SQL.
pub struct PostgresDb<'c> {
    /// The connection.
    pub client: &'c mut postgres::Client,
    /// Statements prepared on it, by the SQL as the store writes it.
    pub statements: &'c mut HashMap<String, postgres::Statement>,
}

impl PostgresDb<'_> {
    fn statement(&mut self, sql: &str) -> Result<postgres::Statement, DbError> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(&dollar_params(sql))?;
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

/// `?1` → `$1`: the store's parameters as PostgreSQL writes them. The store's SQL has no `?`
/// inside string literals.
pub fn dollar_params(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

impl postgres::types::ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use postgres::types::Type;
        match self {
            Param::Null => Ok(postgres::types::IsNull::Yes),
            Param::Int(i) if *ty == Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
            Param::Int(i) if *ty == Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
            Param::Int(i) if *ty == Type::BOOL => (*i != 0).to_sql(ty, out),
            Param::Int(i) if *ty == Type::FLOAT8 => (*i as f64).to_sql(ty, out),
            Param::Int(i) => i.to_sql(ty, out),
            Param::Real(f) => f.to_sql(ty, out),
            Param::Text(s) => s.to_sql(ty, out),
            Param::Blob(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

impl Db for PostgresDb<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, DbError> {
        let statement = self.statement(sql)?;
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> = params
            .iter()
            .map(|p| p as &(dyn postgres::types::ToSql + Sync))
            .collect();
        Ok(self.client.execute(&statement, &params)?)
    }

    fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, DbError> {
        let statement = self.statement(sql)?;
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> = params
            .iter()
            .map(|p| p as &(dyn postgres::types::ToSql + Sync))
            .collect();
        // Each row is converted as it arrives rather than after all of them: a window of runs
        // is tens of thousands of rows, and two copies of them at once would double the peak.
        use postgres::fallible_iterator::FallibleIterator;
        let mut rows = self.client.query_raw(&statement, params)?;
        let mut converted = Vec::new();
        while let Some(row) = rows.next()? {
            converted.push(postgres_row(&row)?);
        }
        Ok(converted)
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        Ok(self.client.batch_execute(sql)?)
    }
}

fn postgres_row(row: &postgres::Row) -> Result<Row, DbError> {
    use postgres::types::Type;
    let mut values = Vec::with_capacity(row.len());
    for (index, column) in row.columns().iter().enumerate() {
        let ty = column.type_();
        let value = if *ty == Type::INT8 {
            row.try_get::<_, Option<i64>>(index)?.map(Value::Int)
        } else if *ty == Type::INT4 {
            row.try_get::<_, Option<i32>>(index)?
                .map(|i| Value::Int(i.into()))
        } else if *ty == Type::INT2 {
            row.try_get::<_, Option<i16>>(index)?
                .map(|i| Value::Int(i.into()))
        } else if *ty == Type::BOOL {
            row.try_get::<_, Option<bool>>(index)?
                .map(|b| Value::Int(b.into()))
        } else if *ty == Type::FLOAT8 {
            row.try_get::<_, Option<f64>>(index)?.map(Value::Real)
        } else if *ty == Type::FLOAT4 {
            row.try_get::<_, Option<f32>>(index)?
                .map(|f| Value::Real(f.into()))
        } else if *ty == Type::BYTEA {
            row.try_get::<_, Option<Vec<u8>>>(index)?.map(Value::Blob)
        } else {
            row.try_get::<_, Option<String>>(index)?.map(Value::Text)
        };
        values.push(value.unwrap_or(Value::Null));
    }
    Ok(Row(values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_parameters_become_dollar_parameters() {
        assert_eq!(
            dollar_params("SELECT a FROM t WHERE b = ?1 AND (?2 IS NULL OR c = ?12) AND d = '?'"),
            "SELECT a FROM t WHERE b = $1 AND ($2 IS NULL OR c = $12) AND d = '?'"
        );
    }

    #[test]
    fn rows_convert_and_name_what_is_wrong() {
        let row = Row(vec![
            Value::Int(3),
            Value::Null,
            Value::Text("x".into()),
            Value::Int(2),
        ]);
        assert_eq!(row.int(0).unwrap(), 3);
        assert_eq!(row.opt_int(1).unwrap(), None);
        assert_eq!(row.text(2).unwrap(), "x");
        assert_eq!(row.opt_real(3).unwrap(), Some(2.0));
        assert!(row.bool(0).unwrap());
        let err = row.int(2).unwrap_err().to_string();
        assert!(err.contains("column 2") && err.contains("integer"), "{err}");
        assert!(row.int(9).is_err());
    }

    #[test]
    fn a_failed_transaction_on_sqlite_leaves_nothing() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut db = SqliteDb(&conn);
        db.batch("CREATE TABLE t (a INTEGER PRIMARY KEY)").unwrap();
        let failed = transaction(&mut db, true, |db| {
            db.execute("INSERT INTO t (a) VALUES (?1)", params![1_i64])?;
            db.execute("INSERT INTO t (a) VALUES (?1)", params![1_i64])
        });
        assert!(failed.unwrap_err().is_unique_violation());
        let count = db.query_one("SELECT COUNT(*) FROM t", params![]).unwrap();
        assert_eq!(count.int(0).unwrap(), 0);
    }
}
