//! The SQLite backend: one file, WAL, shared by several processes.
//!
//! - Durable: `synchronous=FULL`, so a commit survives an OS crash (an
//!   epoch or a terminal result never rolls back).
//! - The clock: every connection registers `compute_now()`, which reads the
//!   [`Clock`] the store was opened with; every query and trigger uses it.
//! - Three connections: writes go through one, owned by a writer thread
//!   that commits the writes waiting for it together (`writer`: group
//!   commit, one fsync for many); reads through another (WAL readers never
//!   wait for writers); lease renewals through their own, so a gateway's
//!   renewal never waits behind Hellos.
//! - Several gateway processes share the file: a writer waiting for
//!   another's lock retries every 200 µs for up to 10 s (SQLite's own busy
//!   timeout backs off to 100 ms sleeps, which starves writers under load).
//! - Migrations: one SQL file each in `migrations/`, applied in order, one
//!   transaction each; the schema version (`user_version`) is the number
//!   applied. A store newer than this binary is refused.
//!
//! Every transaction's statements are written once for both backends in
//! `crate::sql` and run here over `Lite` (SQLite's own: the ranges of
//! large values read by blob I/O, `chunks`; the dump and restore over its
//! catalog, `dump`). This module holds the connections, and implements
//! the store's interfaces from their lists of operations (`lite_run`):
//! each call's arguments carried to a transaction on the writer's thread or
//! the reader's (`carry`).

mod carry;
mod chunks;
mod dump;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, TransactionBehavior};

use crate::backend::*;
use crate::clock::Clock;
use crate::error::{StoreError, TxError};
use crate::sql::{self, Dialect, Params, Row, leases, ready, sessions};
use carry::Carry;

/// The migrations, in order. The schema version is how many ran.
pub const MIGRATIONS: &[&str] = migrations!("migrations");

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// A SQLite transaction as the shared bodies see it ([`crate::sql`]).
pub(super) struct Lite<'c>(pub(super) &'c Connection);

impl Lite<'_> {
    fn values<'p>(params: Params<'p>) -> Vec<&'p dyn rusqlite::ToSql> {
        params.iter().map(|p| p.lite()).collect()
    }
}

impl sql::Db for Lite<'_> {
    const DIALECT: Dialect = Dialect::Sqlite;

    async fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, StoreError> {
        let mut st = self.0.prepare_cached(&sql::lite_text(sql))?;
        let columns = st.column_count();
        let mut rows = st.query(Self::values(params).as_slice())?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(Row::Sqlite(
                (0..columns)
                    .map(|i| r.get(i))
                    .collect::<rusqlite::Result<_>>()?,
            ));
        }
        Ok(out)
    }

    async fn execute(&self, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
        let mut st = self.0.prepare_cached(&sql::lite_text(sql))?;
        let values = Self::values(params);
        if st.column_count() == 0 {
            return Ok(st.execute(values.as_slice())? as u64);
        }
        // A statement that returns rows (a locking read PostgreSQL needs),
        // run to its end: its rows counted, as PostgreSQL counts them.
        let mut rows = st.query(values.as_slice())?;
        let mut n = 0;
        while rows.next()?.is_some() {
            n += 1;
        }
        Ok(n)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(Box::new(e))
    }
}

impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        TxError::Store(e.into())
    }
}

/// The busy handler: `attempt` counts from 0; false gives up (SQLITE_BUSY).
fn busy_wait(attempt: i32) -> bool {
    const STEP: Duration = Duration::from_micros(200);
    const LIMIT: i32 = 50_000; // 10 s
    if attempt >= LIMIT {
        return false;
    }
    std::thread::sleep(STEP);
    true
}

/// A connection to the store file with the store's settings and clock.
fn connect(path: &Path, clock: &Arc<dyn Clock>) -> rusqlite::Result<Connection> {
    connect_pinned(path, clock, None)
}

/// [`connect`], with `compute_now()` answering the time `pin` holds while
/// it holds one (the writer pins it for each write: see [`writer::Pin`]).
fn connect_pinned(
    path: &Path,
    clock: &Arc<dyn Clock>,
    pin: Option<Arc<writer::Pin>>,
) -> rusqlite::Result<Connection> {
    let mut conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_handler(Some(busy_wait))?;
    statements_kept(&conn)?;
    let clock = clock.clone();
    conn.create_scalar_function(
        "compute_now",
        0,
        // Not deterministic: it is a clock. Innocuous: triggers may call it.
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_INNOCUOUS,
        move |_| {
            Ok(pin
                .as_ref()
                .and_then(|p| p.get())
                .unwrap_or_else(|| clock.now_ms()))
        },
    )?;
    audit_functions(&conn)?;
    Ok(conn)
}

/// Registers `audit_hash()`, `audit_hash_v2()` and `audit_chain_of()`,
/// which the audit chain's migrations and trigger call, and
/// `sha256_hex()`, which keys a node's security events, on a connection:
/// every connection the store opens has them; a tool that writes to the
/// store file through a plain connection needs them too.
pub fn audit_functions(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8
        | FunctionFlags::SQLITE_DETERMINISTIC
        | FunctionFlags::SQLITE_INNOCUOUS;
    // What a node's security events are kept by (migration 0037).
    conn.create_scalar_function("sha256_hex", 1, flags, |ctx| {
        use sha2::Digest;
        let body: Vec<u8> = ctx.get(0)?;
        Ok(hex::encode(sha2::Sha256::digest(&body)))
    })?;
    conn.create_scalar_function("audit_hash_v2", 10, flags, |ctx| {
        Ok(crate::audit::chain_hash(
            ctx.get(0)?,
            &ctx.get::<String>(1)?,
            ctx.get(2)?,
            ctx.get(3)?,
            &ctx.get::<String>(4)?,
            &ctx.get::<String>(5)?,
            ctx.get(6)?,
            &ctx.get::<String>(7)?,
            ctx.get(8)?,
            &ctx.get::<String>(9)?,
        ))
    })?;
    conn.create_scalar_function("audit_chain_of", 2, flags, |ctx| {
        Ok(crate::audit::chain_of(
            &ctx.get::<String>(0)?,
            &ctx.get::<String>(1)?,
        ))
    })?;
    conn.create_scalar_function(
        "audit_hash",
        9,
        FunctionFlags::SQLITE_UTF8
            | FunctionFlags::SQLITE_DETERMINISTIC
            | FunctionFlags::SQLITE_INNOCUOUS,
        |ctx| {
            Ok(crate::audit::chain_hash(
                crate::audit::SEALED_CHAIN,
                &ctx.get::<String>(0)?,
                ctx.get(1)?,
                ctx.get(2)?,
                &ctx.get::<String>(3)?,
                &ctx.get::<String>(4)?,
                ctx.get(5)?,
                &ctx.get::<String>(6)?,
                ctx.get(7)?,
                &ctx.get::<String>(8)?,
            ))
        },
    )
}

/// Applies the migrations the store lacks, one transaction each; the
/// version is read inside each, so processes opening one store at once
/// apply each migration once.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
        let version = user_version(&tx)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                found: version,
                known: SCHEMA_VERSION,
            });
        }
        let Some(m) = MIGRATIONS.get(version as usize) else {
            return Ok(());
        };
        tx.execute_batch(m)?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
    }
}

fn user_version(conn: &Connection) -> rusqlite::Result<u32> {
    let v: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    Ok(v.clamp(0, u32::MAX as i64) as u32)
}

/// `compute_now()`.
fn now(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row_kept("SELECT compute_now()", [], |r| r.get(0))
}

/// Running a statement from the connection's prepared statements: what
/// `query_row` and `execute` do, without parsing and planning the statement
/// again at every call.
pub(super) trait Kept {
    fn query_row_kept<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;

    fn execute_kept<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
}

impl Kept for Connection {
    fn query_row_kept<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    fn execute_kept<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }
}

/// How many prepared statements a store connection keeps: every statement
/// the writer runs, with room to spare (rusqlite keeps 16, fewer than one
/// Hello's group commit uses, and a statement pushed out is parsed again).
const STATEMENTS_KEPT: usize = 256;

/// Settings that let a store connection keep its prepared statements:
/// room for all of them, and plans that do not depend on the values bound.
/// Without the query planner stability guarantee SQLite marks a statement
/// whose plan weighed a bound value (an `= ?1` term, for instance) to be
/// planned again when that value changes, and rusqlite clears a
/// statement's bindings as it goes back to its cache: such a statement was
/// parsed and planned again at every use. The store's plans come from its
/// indexes; no statistics (ANALYZE) are kept for values to matter.
fn statements_kept(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENTS_KEPT);
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic while holding the lock cannot leave a half-applied
    // transaction (SQLite rolls it back), so a poisoned lock is usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The SQLite store.
#[derive(Debug)]
pub struct SqliteBackend {
    path: PathBuf,
    clock: Arc<dyn Clock>,
    writer: writer::Writer,
    reader: Arc<Mutex<Connection>>,
    leases: Arc<Mutex<Connection>>,
}

impl SqliteBackend {
    /// Opens the store at `path`, creating and migrating it.
    pub async fn open(path: PathBuf, clock: Arc<dyn Clock>) -> Result<SqliteBackend, StoreError> {
        Self::open_with(path, clock, true).await
    }

    /// Opens the store at `path` as it is: no file is created and no
    /// migration runs (what `better-compute doctor` looks at). A store
    /// newer than this binary is refused.
    pub async fn open_existing(
        path: PathBuf,
        clock: Arc<dyn Clock>,
    ) -> Result<SqliteBackend, StoreError> {
        if !path.is_file() {
            return Err(StoreError::Missing);
        }
        Self::open_with(path, clock, false).await
    }

    async fn open_with(
        path: PathBuf,
        clock: Arc<dyn Clock>,
        migrating: bool,
    ) -> Result<SqliteBackend, StoreError> {
        tokio::task::spawn_blocking(move || {
            let pin = Arc::new(writer::Pin::new(clock.clone()));
            let mut writer = connect_pinned(&path, &clock, Some(pin.clone()))?;
            if migrating {
                migrate(&mut writer)?;
            } else {
                let found = user_version(&writer)?;
                if found > SCHEMA_VERSION {
                    return Err(StoreError::TooNew {
                        found,
                        known: SCHEMA_VERSION,
                    });
                }
            }
            let writer = writer::Writer::start(writer, pin)
                .map_err(|e| StoreError::Database(Box::new(e)))?;
            let reader = connect(&path, &clock)?;
            // A `read` operation writes nothing: one that tried would
            // fail here rather than write outside the writer's commits.
            reader.pragma_update(None, "query_only", true)?;
            let leases = connect(&path, &clock)?;
            Ok(SqliteBackend {
                path,
                clock,
                writer,
                reader: Arc::new(Mutex::new(reader)),
                leases: Arc::new(Mutex::new(leases)),
            })
        })
        .await
        .map_err(StoreError::Task)?
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in one transaction on `conn`, off the async runtime.
    async fn run<T, E>(
        conn: &Arc<Mutex<Connection>>,
        behavior: TransactionBehavior,
        f: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let conn = conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = lock(&conn);
            let tx = c
                .transaction_with_behavior(behavior)
                .map_err(|e| E::from(e.into()))?;
            let out = f(&tx)?;
            tx.commit().map_err(|e| E::from(e.into()))?;
            Ok(out)
        })
        .await
        .map_err(|e| E::from(StoreError::Task(e)))?
    }

    async fn write<T, E>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.writer.write(f).await
    }

    async fn read<T, E>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        Self::run(&self.reader, TransactionBehavior::Deferred, f).await
    }
}

/// Runs an operation's body ([`implement`]) on SQLite: its arguments
/// carried to the transaction's thread ([`carry`]), the body run there in
/// a transaction of the operation's kind: a `write` (and a `recording`
/// one) through the writer, a
/// `read` on the reader connection, which is `query_only` (a `read` that
/// wrote would fail), and a `snapshot` as a read (a WAL reader sees one
/// instant for its whole transaction).
macro_rules! lite_run {
    ($self:ident, recording, $($rest:tt)*) => {
        lite_run!($self, write, $($rest)*)
    };
    ($self:ident, snapshot, $($rest:tt)*) => {
        lite_run!($self, read, $($rest)*)
    };
    ($self:ident, $mode:ident, |$db:ident| $body:expr, $($arg:ident: $ty:ty),*) => {{
        $(let mut $arg = <$ty as Carry<'_>>::own($arg);)*
        $self
            .$mode(move |c| {
                let $db = &Lite(c);
                $(let $arg = <$ty as Carry<'_>>::back(&mut $arg);)*
                ready($body)
            })
            .await
    }};
}

gateway_operations!(implement!(SqliteBackend, lite_run, GatewayBackend {
    async fn now(&self) -> Result<i64, StoreError> {
        Ok(self.clock.now_ms())
    }

    async fn schema_version(&self) -> Result<u32, StoreError> {
        self.read(|c| Ok(user_version(c)?)).await
    }

    async fn hello(&self, h: &HelloInput) -> Result<HelloOutcome, TxError> {
        let h = h.clone();
        self.write(move |c| ready(sessions::hello(&Lite(c), &h)))
            .await
    }

    async fn hold_lease(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Held>, StoreError> {
        let (name, owner) = (name.to_string(), owner.to_string());
        Self::run(&self.leases, TransactionBehavior::Immediate, move |c| {
            ready(leases::renew(&Lite(c), &name, &owner, ttl))
        })
        .await
    }

    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        let (name, owner) = (name.to_string(), owner.to_string());
        Self::run(&self.leases, TransactionBehavior::Immediate, move |c| {
            ready(leases::release(&Lite(c), &name, &owner))
        })
        .await
    }

    async fn report_absorption(&self, gateway_id: &GatewayId, per_s: u32) -> Result<(), StoreError> {
        let gateway_id = gateway_id.to_string();
        Self::run(&self.leases, TransactionBehavior::Immediate, move |c| {
            ready(leases::report_absorption(&Lite(c), &GatewayId::from(&gateway_id), per_s))
        })
        .await
    }

    async fn release_chunk(
        &self,
        sequence: ReleaseSeq,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(move |c| chunks::release_chunk(c, sequence, offset, len))
            .await
    }

    async fn image_artifact_chunk(
        &self,
        sha256: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let sha = sha256.to_string();
        self.read(move |c| chunks::artifact_chunk(c, &sha, offset, len))
            .await
    }
}));

key_holder_operations!(implement!(SqliteBackend, lite_run, Backend {
    async fn gateway_role_sql(&self, _name: &GatewayId) -> Result<Option<String>, StoreError> {
        Ok(None)
    }

    async fn dump(&self) -> Result<Dump, StoreError> {
        self.read(dump::dump).await
    }

    async fn restore(&self, dump: Dump) -> Result<(), TxError> {
        // Its own connection and transaction: a restore is not grouped
        // with other writes, and its foreign keys are checked at its commit.
        let (path, clock) = (self.path.clone(), self.clock.clone());
        tokio::task::spawn_blocking(move || -> Result<(), TxError> {
            let mut conn = connect(&path, &clock)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            dump::restore(&tx, &dump)?;
            tx.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| TxError::Store(StoreError::Task(e)))?
    }

    async fn stall(&self, duration: Duration) -> Result<(), StoreError> {
        let (path, clock) = (self.path.clone(), self.clock.clone());
        tokio::task::spawn_blocking(move || -> Result<(), StoreError> {
            let conn = connect(&path, &clock)?;
            conn.execute_batch("BEGIN EXCLUSIVE")?;
            std::thread::sleep(duration);
            conn.execute_batch("COMMIT")?;
            Ok(())
        })
        .await
        .map_err(StoreError::Task)?
    }
}));

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rusqlite::StatementStatus;

    use crate::clock::{Clock, ManualClock};

    /// A Hello's statements stay prepared from one node to the next: a
    /// statement SQLite would plan again for each new value bound (this
    /// one was, at every Hello) is planned once.
    #[test]
    fn a_kept_statement_is_not_planned_again_for_each_value() {
        let d = tempfile::tempdir().unwrap();
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let mut conn = super::connect(&d.path().join("s.db"), &clock).unwrap();
        super::migrate(&mut conn).unwrap();
        // The Hello's read of its node's commands in flight, as SQLite runs it.
        let in_flight = crate::sql::lite_text(crate::sql::sessions::HELLO_IN_FLIGHT);
        for node in ["a", "b", "c", "d"] {
            let mut q = conn.prepare_cached(&in_flight).unwrap();
            assert_eq!(q.query_map([node], |_| Ok(())).unwrap().count(), 0);
        }
        let q = conn.prepare_cached(&in_flight).unwrap();
        assert_eq!(q.get_status(StatementStatus::RePrepare), 0);
    }
}
