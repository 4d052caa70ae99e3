//! One store over two databases: the transactions both backends run,
//! written once over [`Db`], the small dialect trait each backend
//! implements for one open transaction.
//!
//! A domain's statements and their sequence live in one file here (an
//! `async fn` over `&impl Db`), with the decisions of the domain module
//! (`crate::leases`, `crate::machines`, ...) called in between; a backend
//! only opens the transaction (which connection, which lock, which
//! isolation) and hands the body a [`Db`]. A new query is one function
//! here; its backends' `Backend` methods each call it.
//!
//! Statements are written in PostgreSQL's text: `$N` placeholders, and
//! row locks (`FOR UPDATE`, `FOR SHARE`, `FOR NO KEY UPDATE`, each
//! optionally `OF` a table) where PostgreSQL needs them to order
//! concurrent writers. SQLite runs the same text with `?N` and without
//! the row locks ([`lite_text`]): its one writer connection holds the
//! whole database for a write transaction, which is what the locks stand
//! for. A list binds as one [`List`] (an array on PostgreSQL, JSON text on
//! SQLite). Where the two truly differ (one statement over arrays against
//! a loop, a digest one database derives), [`Db::DIALECT`] picks the text
//! or the sequence; values are bound with the type
//! PostgreSQL's column has (`i64` for `BIGINT`, `bool` for `BOOLEAN`),
//! which SQLite stores as it is given.
//!
//! SQLite's statements never wait for anything (the backend runs them on
//! its own threads), so a body over its [`Db`] completes at its first
//! poll ([`ready`]); PostgreSQL's await the database.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::error::StoreError;

pub(crate) mod audit;
pub(crate) mod backups;
pub(crate) mod bindings;
pub(crate) mod clones;
pub(crate) mod commands;
pub(crate) mod events;
pub(crate) mod gateways;
pub(crate) mod images;
pub(crate) mod inventory;
pub(crate) mod leases;
pub(crate) mod liveness;
pub(crate) mod machines;
pub(crate) mod nodes;
pub(crate) mod reconcile;
pub(crate) mod releases;
pub(crate) mod rollouts;
pub(crate) mod secrets;
pub(crate) mod sessions;
pub(crate) mod specs;
pub(crate) mod tokens;

/// Which database a [`Db`] speaks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// A value bound to a statement: anything both drivers bind (`i64`,
/// `i32`, `bool`, `&str`, `String`, `Vec<u8>`, `&[u8]`, and `Option`s of
/// them).
pub(crate) trait Param: Sync {
    fn lite(&self) -> &dyn rusqlite::ToSql;
    fn pg(&self) -> &(dyn tokio_postgres::types::ToSql + Sync);
}

impl<T> Param for T
where
    T: rusqlite::ToSql + tokio_postgres::types::ToSql + Sync,
{
    fn lite(&self) -> &dyn rusqlite::ToSql {
        self
    }

    fn pg(&self) -> &(dyn tokio_postgres::types::ToSql + Sync) {
        self
    }
}

/// A statement's values, in placeholder order.
pub(crate) type Params<'a> = &'a [&'a dyn Param];

/// A value read from a column: anything both drivers read.
pub(crate) trait Col:
    rusqlite::types::FromSql + for<'a> tokio_postgres::types::FromSql<'a>
{
}

impl<T> Col for T where T: rusqlite::types::FromSql + for<'a> tokio_postgres::types::FromSql<'a> {}

/// One row of a result.
pub(crate) enum Row {
    Sqlite(Vec<rusqlite::types::Value>),
    Postgres(tokio_postgres::Row),
}

impl Row {
    /// Column `i` as `T`; a column of another type is an error, not a
    /// panic.
    pub(crate) fn get<T: Col>(&self, i: usize) -> Result<T, StoreError> {
        match self {
            Row::Sqlite(values) => {
                let value = values
                    .get(i)
                    .ok_or_else(|| StoreError::Corrupt(format!("a row has no column {i}")))?;
                T::column_result(value.into())
                    .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
            }
            Row::Postgres(row) => row
                .try_get(i)
                .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}"))),
        }
    }

    /// A JSON text column, parsed.
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self, i: usize) -> Result<T, StoreError> {
        let text: String = self.get(i)?;
        serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("column {i} does not parse: {e}")))
    }
}

/// A list bound as one value: an array on PostgreSQL (`= ANY($n)`,
/// `unnest($n)`), the JSON text of an array on SQLite, which binds no
/// arrays (`json_each($n)`). [`in_list`] writes the test of a column
/// against one.
#[derive(Debug)]
pub(crate) struct List<T>(pub(crate) Vec<T>);

impl<T: serde::Serialize> rusqlite::ToSql for List<T> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        let text = serde_json::to_string(&self.0)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        Ok(rusqlite::types::ToSqlOutput::Owned(
            rusqlite::types::Value::Text(text),
        ))
    }
}

impl<T> tokio_postgres::types::ToSql for List<T>
where
    T: std::fmt::Debug,
    Vec<T>: tokio_postgres::types::ToSql,
{
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <Vec<T> as tokio_postgres::types::ToSql>::accepts(ty)
    }

    tokio_postgres::types::to_sql_checked!();
}

/// Whether `column` is one of the [`List`] bound at placeholder `$n`.
pub(crate) fn in_list(dialect: Dialect, column: &str, n: usize) -> String {
    match dialect {
        Dialect::Sqlite => format!("{column} IN (SELECT value FROM json_each(${n}))"),
        Dialect::Postgres => format!("{column} = ANY(${n})"),
    }
}

/// A value as the JSON text of a column.
pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain data serializes")
}

/// One open transaction on either database: what a shared body needs.
pub(crate) trait Db {
    const DIALECT: Dialect;

    /// [`Db::DIALECT`], for a body that holds an `&impl Db`.
    fn dialect(&self) -> Dialect {
        Self::DIALECT
    }

    /// Every row of a statement.
    async fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, StoreError>;

    /// A statement's changed row count.
    async fn execute(&self, sql: &str, params: Params<'_>) -> Result<u64, StoreError>;

    /// Statements run in the order given, each one's rows: on PostgreSQL
    /// sent together and answered in one round trip (an error aborts the
    /// transaction as usual), on SQLite one after another.
    async fn batch(&self, statements: &[(&str, Params<'_>)]) -> Result<Vec<Vec<Row>>, StoreError> {
        let mut out = Vec::with_capacity(statements.len());
        for (sql, params) in statements {
            out.push(self.query(sql, params).await?);
        }
        Ok(out)
    }

    /// The first column of every row of a statement.
    async fn column<T: Col, C: FromIterator<T>>(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<C, StoreError> {
        self.query(sql, params)
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// At most one row; a second is an error.
    async fn query_opt(&self, sql: &str, params: Params<'_>) -> Result<Option<Row>, StoreError> {
        let mut rows = self.query(sql, params).await?;
        if rows.len() > 1 {
            return Err(StoreError::Corrupt(format!(
                "{} rows where one at most was expected",
                rows.len()
            )));
        }
        Ok(rows.pop())
    }

    /// Exactly one row.
    async fn query_one(&self, sql: &str, params: Params<'_>) -> Result<Row, StoreError> {
        self.query_opt(sql, params)
            .await?
            .ok_or_else(|| StoreError::Corrupt("no row where one was expected".into()))
    }

    /// `compute_now()`: the store's clock.
    async fn now(&self) -> Result<i64, StoreError> {
        self.query_one("SELECT compute_now()", &[]).await?.get(0)
    }
}

/// The text SQLite runs for a statement written for PostgreSQL: `$N`
/// placeholders as `?N`, row locks left out. Kept per thread, so each
/// statement is rewritten once.
pub(crate) fn lite_text(sql: &str) -> Rc<str> {
    thread_local! {
        static REWRITTEN: RefCell<HashMap<Box<str>, Rc<str>>> = RefCell::new(HashMap::new());
    }
    REWRITTEN.with(|cache| {
        if let Some(text) = cache.borrow().get(sql) {
            return text.clone();
        }
        let text: Rc<str> = rewrite_for_sqlite(sql).into();
        cache.borrow_mut().insert(sql.into(), text.clone());
        text
    })
}

/// The row-lock clauses SQLite has no words for, longest first.
const LOCKS: &[&str] = &["FOR NO KEY UPDATE", "FOR UPDATE", "FOR SHARE"];

fn rewrite_for_sqlite(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        if c == '\'' {
            // A string literal: copied as it is, to its closing quote.
            let end = rest[1..].find('\'').map_or(rest.len(), |i| i + 2);
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else if c == '$' && rest[1..].starts_with(|d: char| d.is_ascii_digit()) {
            out.push('?');
            rest = &rest[1..];
        } else if let Some(lock) = LOCKS
            .iter()
            .find(|l| !ends_in_word(&out) && starts_with_word(rest, l))
        {
            rest = &rest[lock.len()..];
            // `OF table[, table]`: the tables it names.
            let after = rest.trim_start();
            if starts_with_word(after, "OF") {
                let mut tables = after[2..].trim_start();
                loop {
                    let name_end = tables
                        .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                        .unwrap_or(tables.len());
                    tables = &tables[name_end..];
                    match tables.trim_start().strip_prefix(',') {
                        Some(more) => tables = more.trim_start(),
                        None => break,
                    }
                }
                rest = tables;
            }
            // The space before the clause goes with it.
            while out.ends_with([' ', '\n']) {
                out.pop();
            }
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Whether `s` ends inside a word (a lock clause cannot start there).
fn ends_in_word(s: &str) -> bool {
    s.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `s` starts with the words `w`, not a longer word.
fn starts_with_word(s: &str, w: &str) -> bool {
    s.starts_with(w) && !s[w.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
}

/// The value of a future that is ready at its first poll: a body over
/// SQLite's [`Db`], whose statements never wait.
///
/// # Panics
/// If the future waits: a body over SQLite awaited something that is not
/// a statement (a bug).
pub(crate) fn ready<T>(f: impl Future<Output = T>) -> T {
    use futures_util::FutureExt;
    f.now_or_never()
        .expect("a transaction body over SQLite waited for something")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_runs_postgres_text_without_row_locks() {
        let cases = [
            (
                "SELECT a FROM t WHERE b = $1",
                "SELECT a FROM t WHERE b = ?1",
            ),
            (
                "SELECT epoch FROM s WHERE n = $12 FOR SHARE",
                "SELECT epoch FROM s WHERE n = ?12",
            ),
            (
                "SELECT 1 FROM n JOIN s ON s.id = n.id WHERE n.id = $1 FOR UPDATE OF n",
                "SELECT 1 FROM n JOIN s ON s.id = n.id WHERE n.id = ?1",
            ),
            (
                "SELECT 1 FROM n WHERE id = $1\n FOR NO KEY UPDATE",
                "SELECT 1 FROM n WHERE id = ?1",
            ),
            (
                "SELECT x FROM t WHERE id = $1 FOR SHARE OF t, u ORDER BY x",
                "SELECT x FROM t WHERE id = ?1 ORDER BY x",
            ),
            // A literal keeps its text; a column named like a lock word
            // is no lock.
            ("SELECT '$1 FOR SHARE', $2", "SELECT '$1 FOR SHARE', ?2"),
            ("SELECT FOR_SHARE FROM t", "SELECT FOR_SHARE FROM t"),
            ("SELECT PLATFOR SHARE FROM t", "SELECT PLATFOR SHARE FROM t"),
            ("SELECT $ FROM t", "SELECT $ FROM t"),
        ];
        for (pg, lite) in cases {
            assert_eq!(rewrite_for_sqlite(pg), lite, "{pg}");
            assert_eq!(&*lite_text(pg), lite, "{pg}");
        }
    }

    #[test]
    fn a_body_that_waits_is_a_bug_not_a_hang() {
        assert_eq!(ready(async { 7 }), 7);
        let waited = std::panic::catch_unwind(|| ready(std::future::pending::<()>()));
        assert!(waited.is_err());
    }
}
