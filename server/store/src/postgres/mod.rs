//! The PostgreSQL backend: the store for a fleet past one machine, with
//! gateways and controllers on several hosts.
//!
//! - Connections: a pool ([`deadpool_postgres`] over [`tokio_postgres`])
//!   that replaces a broken connection when it is next taken, so the store
//!   recovers from a database restart by itself. Lease renewals go through
//!   a pool of their own, so a renewal never waits for a connection behind
//!   Hellos. Every connection runs with `lock_timeout` and
//!   `idle_in_transaction_session_timeout` ([`LOCK_TIMEOUT`],
//!   [`IDLE_IN_TRANSACTION_TIMEOUT`]): a paused gateway (a zombie) holding
//!   locks cannot block a takeover for longer than that. Statements are
//!   prepared once per connection and cached.
//! - The clock: `compute_now()` is an SQL function reading the database's
//!   clock, so every process agrees on "now" whatever its own clock says.
//!   A store opened with an injected clock (tests) sets it in each
//!   transaction (`bc.now_ms`).
//! - Every transaction's statements are written once for both backends
//!   in `crate::sql` and run here over `Pg` (a batch pipelined in one
//!   round trip; PostgreSQL's own: ranges of large values by `substring()`,
//!   `chunks`; the dump and restore over its catalogs, `dump`; the Hellos
//!   grouped into shared transactions, `hellos`; the simulated stall).
//! - The spec's rules, in those statements: the Hello re-reads its
//!   gateway's lease `FOR SHARE` (a lease that moved aborts it, fenced);
//!   session writes carry `AND epoch = $epoch`; dispatch holds the session
//!   row `FOR SHARE`, so it cannot race an epoch bump; liveness is flushed
//!   as ages and the database computes `compute_now() - age`. Read
//!   committed is the isolation level: a transaction that reads a row to
//!   change it locks it first (`FOR UPDATE`), always a node's row before
//!   its session and its commands, so concurrent transactions queue
//!   instead of deadlocking.
//! - A gateway's own Hellos and its lease renewal take a lock in this
//!   process (Hellos shared, the renewal exclusive) before the database's:
//!   `FOR SHARE` lockers can otherwise keep an `UPDATE` of the lease row
//!   waiting for as long as Hellos overlap, which in a reconnect storm is
//!   until the gateway fences itself.
//! - Migrations: one SQL file each in `migrations/`, the same numbers as
//!   SQLite's for the same schema, applied in order under an advisory lock,
//!   one transaction each; `bc_schema.version` is the number applied. Only
//!   the key holder migrates; then it grants the gateway group role what a
//!   gateway may do ([`grants`]), and gateways connect as roles of that
//!   group.
//!
//! Errors carry the database's message for the logs (never the connection
//! string); peers see only that the store is unavailable.

mod chunks;
pub mod cluster;
pub mod connect;
mod dump;
pub mod grants;
mod hellos;
mod stall;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

use crate::backend::*;
use crate::clock::Clock;
use crate::error::{StoreError, TxError};
use crate::sql::{self, Dialect, Row, leases};

/// The migrations, in order. The schema version is how many ran; the
/// numbers mean the same schema as SQLite's.
pub const MIGRATIONS: &[&str] = migrations!("migrations");

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// How long a statement waits for a row or table lock before it fails.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a connection may sit inside a transaction doing nothing before
/// the database ends its session (and so releases its locks).
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections in the main pool of one process.
pub const POOL_SIZE: usize = 16;
/// How long a caller waits for a pooled connection, and for a new one.
const POOL_WAIT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The advisory lock key that orders migrations of one database.
const MIGRATION_LOCK: i64 = 0x6263_5f6d_6967; // "bc_mig"

type Tx<'a> = deadpool_postgres::Transaction<'a>;
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Database(Box::new(e))
    }
}

impl From<tokio_postgres::Error> for TxError {
    fn from(e: tokio_postgres::Error) -> Self {
        TxError::Store(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Database(Box::new(e))
    }
}

/// A PostgreSQL transaction as the shared bodies see it ([`crate::sql`]).
pub(super) struct Pg<'t, 'a>(pub(super) &'t Tx<'a>);

impl Pg<'_, '_> {
    fn values<'p>(params: sql::Params<'p>) -> Vec<&'p (dyn ToSql + Sync)> {
        params.iter().map(|p| p.pg()).collect()
    }
}

impl sql::Db for Pg<'_, '_> {
    const DIALECT: Dialect = Dialect::Postgres;

    async fn query(&self, sql: &str, params: sql::Params<'_>) -> Result<Vec<Row>, StoreError> {
        Ok(query(self.0, sql, &Self::values(params))
            .await?
            .into_iter()
            .map(Row::Postgres)
            .collect())
    }

    async fn execute(&self, sql: &str, params: sql::Params<'_>) -> Result<u64, StoreError> {
        Ok(execute(self.0, sql, &Self::values(params)).await?)
    }

    async fn batch(
        &self,
        statements: &[(&str, sql::Params<'_>)],
    ) -> Result<Vec<Vec<Row>>, StoreError> {
        let values: Vec<_> = statements.iter().map(|(_, p)| Self::values(p)).collect();
        let batch: Vec<(&str, Params<'_>)> = statements
            .iter()
            .zip(&values)
            .map(|((sql, _), v)| (*sql, v.as_slice()))
            .collect();
        Ok(pipeline(self.0, &batch)
            .await?
            .into_iter()
            .map(|rows| rows.into_iter().map(Row::Postgres).collect())
            .collect())
    }
}

/// Rows of a cached statement.
async fn query(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let st = tx.prepare_cached(sql).await?;
    tx.query(&st, params).await
}

/// Runs cached statements back to back without waiting for each answer:
/// one round trip for the batch. The server runs them in the order given,
/// as it would one at a time; an error aborts the transaction as usual.
/// Each statement's rows, in order.
async fn pipeline(
    tx: &Tx<'_>,
    batch: &[(&str, Params<'_>)],
) -> Result<Vec<Vec<tokio_postgres::Row>>, tokio_postgres::Error> {
    use futures_util::future::try_join_all;
    // Prepared first, all of them (cached: no round trip after a
    // connection's first), so that each query below is sent when first
    // polled, in order.
    let statements = try_join_all(batch.iter().map(|(sql, _)| tx.prepare_cached(sql))).await?;
    try_join_all(
        statements
            .iter()
            .zip(batch)
            .map(|(st, (_, params))| tx.query(st, params)),
    )
    .await
}

/// At most one row of a cached statement.
async fn query_opt(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
    let st = tx.prepare_cached(sql).await?;
    tx.query_opt(&st, params).await
}

/// Exactly one row of a cached statement.
async fn query_one(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
    let st = tx.prepare_cached(sql).await?;
    tx.query_one(&st, params).await
}

/// A cached statement's changed row count.
async fn execute(tx: &Tx<'_>, sql: &str, params: Params<'_>) -> Result<u64, tokio_postgres::Error> {
    let st = tx.prepare_cached(sql).await?;
    tx.execute(&st, params).await
}

/// `compute_now()`.
async fn now(tx: &Tx<'_>) -> Result<i64, tokio_postgres::Error> {
    Ok(query_one(tx, "SELECT compute_now()", &[]).await?.get(0))
}

/// Runs `$body` (an expression that awaits a domain function given the
/// transaction `$tx`) in one transaction on a connection from `$pool`,
/// begun by `$self.$begin` (default: [`PostgresBackend::begin`]):
/// committed when it returns `Ok`, rolled back otherwise.
macro_rules! tx {
    ($self:ident, $pool:ident, $begin:ident, |$tx:ident| $body:expr) => {{
        let mut conn = $self.$pool.get().await.map_err(StoreError::from)?;
        let $tx = $self.$begin(&mut conn).await?;
        let out = $body;
        match out {
            Ok(v) => {
                $tx.commit().await.map_err(StoreError::from)?;
                Ok(v)
            }
            // Dropping the transaction rolls it back.
            Err(e) => Err(e),
        }
    }};
    ($self:ident, $pool:ident, |$tx:ident| $body:expr) => {
        tx!($self, $pool, begin, |$tx| $body)
    };
    ($self:ident, |$tx:ident| $body:expr) => {
        tx!($self, pool, |$tx| $body)
    };
}

/// Runs an operation's body ([`implement`]) on PostgreSQL, in a
/// transaction from the main pool begun as its kind says: `write` (and
/// `recording`) by
/// [`PostgresBackend::begin`], `read` by
/// [`PostgresBackend::begin_read_only`] (a `read` that wrote would fail),
/// `snapshot` by [`PostgresBackend::begin_consistent`].
macro_rules! pg_run {
    ($self:ident, snapshot, |$db:ident| $body:expr, $($arg:ident: $ty:ty),*) => {
        tx!($self, pool, begin_consistent, |tx| {
            let $db = &Pg(&tx);
            $body.await
        })
    };
    ($self:ident, recording, $($rest:tt)*) => {
        pg_run!($self, write, $($rest)*)
    };
    ($self:ident, read, |$db:ident| $body:expr, $($arg:ident: $ty:ty),*) => {
        tx!($self, pool, begin_read_only, |tx| {
            let $db = &Pg(&tx);
            $body.await
        })
    };
    ($self:ident, write, |$db:ident| $body:expr, $($arg:ident: $ty:ty),*) => {
        tx!($self, pool, begin, |tx| {
            let $db = &Pg(&tx);
            $body.await
        })
    };
}

/// Begins a transaction with the store's clock (`None`: the database's).
async fn begin_with<'a>(
    conn: &'a mut Object,
    clock: Option<&dyn Clock>,
) -> Result<Tx<'a>, StoreError> {
    let tx = conn.transaction().await?;
    pin_clock(&tx, clock).await?;
    Ok(tx)
}

/// With an injected clock, `compute_now()` answers it in `tx`.
async fn pin_clock(tx: &Tx<'_>, clock: Option<&dyn Clock>) -> Result<(), StoreError> {
    if let Some(clock) = clock {
        execute(
            tx,
            "SELECT set_config('bc.now_ms', $1, true)",
            &[&clock.now_ms().to_string()],
        )
        .await?;
    }
    Ok(())
}

/// The PostgreSQL store.
pub struct PostgresBackend {
    pool: Pool,
    leases: Pool,
    /// An injected clock (tests); `None`: the database's own.
    clock: Option<Arc<dyn Clock>>,
    /// Per gateway lease: its Hellos share it, its renewal takes it alone.
    fences: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    /// Hellos grouped into shared transactions.
    hellos: hellos::Groups,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the connection string: it may carry a password.
        f.debug_struct("PostgresBackend")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

/// The connection settings every connection of the store gets: the
/// address's own, with the store's timeouts and keepalives, and the TLS
/// and password settings `connect` takes out of it.
pub fn config(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    Ok(connection(url)?.0)
}

/// [`config`], and the TLS client the address asks for (`None`: plain, as
/// over a unix socket).
pub fn connection(url: &str) -> Result<(tokio_postgres::Config, Option<connect::Tls>), StoreError> {
    let settings = connect::settings(url)?;
    let mut config: tokio_postgres::Config = settings.url.parse().map_err(|_| {
        StoreError::Address(
            "the PostgreSQL store address does not parse: use postgres://USER@HOST/DATABASE \
             or postgresql:///DATABASE?host=/SOCKET/DIR"
                .into(),
        )
    })?;
    if config.get_password().is_none()
        && let Some(password) = connect::password(&settings)?
    {
        config.password(password);
    }
    let mut options = config.get_options().unwrap_or_default().to_string();
    options.push_str(&format!(
        " -c lock_timeout={} -c idle_in_transaction_session_timeout={} \
         -c plan_cache_mode=force_generic_plan",
        LOCK_TIMEOUT.as_millis(),
        IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
    ));
    config.options(options.trim());
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(10));
    if config.get_application_name().is_none() {
        config.application_name("better-compute");
    }
    Ok((config, connect::tls(&settings)?))
}

fn pool(
    (config, tls): (tokio_postgres::Config, Option<connect::Tls>),
    size: usize,
) -> Result<Pool, StoreError> {
    let manager_config = ManagerConfig {
        // A connection whose socket closed (a database restart) is
        // replaced when next taken; one that broke mid-statement fails
        // that statement and is replaced then.
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls {
        Some(tls) => Manager::from_config(config, tls, manager_config),
        None => Manager::from_config(config, NoTls, manager_config),
    };
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .recycle_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|e| StoreError::Database(Box::new(e)))
}

impl PostgresBackend {
    /// Opens the store at `url` (`postgres://...`), migrating it. With an
    /// injected `clock`, `compute_now()` follows it; with `None` it is the
    /// database's clock.
    pub async fn open(
        url: &str,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<PostgresBackend, StoreError> {
        let connection = connection(url)?;
        let main = pool(connection.clone(), POOL_SIZE)?;
        let backend = PostgresBackend {
            hellos: hellos::Groups::new(main.clone(), clock.clone()),
            pool: main,
            leases: pool(connection, 2)?,
            clock,
            fences: Mutex::new(HashMap::new()),
        };
        backend.migrate().await?;
        Ok(backend)
    }

    /// The store at `url` as it is: no migration runs, nothing is
    /// written, and no connection is made until the first call.
    pub fn open_existing(
        url: &str,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<PostgresBackend, StoreError> {
        let connection = connection(url)?;
        let main = pool(connection.clone(), 2)?;
        Ok(PostgresBackend {
            hellos: hellos::Groups::new(main.clone(), clock.clone()),
            pool: main,
            leases: pool(connection, 1)?,
            clock,
            fences: Mutex::new(HashMap::new()),
        })
    }

    /// Begins a transaction with the store's clock.
    async fn begin<'a>(&self, conn: &'a mut Object) -> Result<Tx<'a>, StoreError> {
        begin_with(conn, self.clock.as_deref()).await
    }

    /// A read-only transaction with the store's clock, at read committed.
    async fn begin_read_only<'a>(&self, conn: &'a mut Object) -> Result<Tx<'a>, StoreError> {
        let tx = conn.build_transaction().read_only(true).start().await?;
        pin_clock(&tx, self.clock.as_deref()).await?;
        Ok(tx)
    }

    /// A read-only transaction at repeatable read: one consistent reading
    /// of every table (the audit snapshot, a backup's dump).
    async fn begin_consistent<'a>(&self, conn: &'a mut Object) -> Result<Tx<'a>, StoreError> {
        let tx = conn
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        pin_clock(&tx, self.clock.as_deref()).await?;
        Ok(tx)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await?;
        loop {
            let tx = conn.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await?;
            tx.batch_execute("CREATE TABLE IF NOT EXISTS bc_schema (version BIGINT NOT NULL)")
                .await?;
            let version: i64 = match tx.query_opt("SELECT version FROM bc_schema", &[]).await? {
                Some(r) => r.get(0),
                None => {
                    tx.execute("INSERT INTO bc_schema (version) VALUES (0)", &[])
                        .await?;
                    0
                }
            };
            let version = version.clamp(0, u32::MAX as i64) as u32;
            if version > SCHEMA_VERSION {
                return Err(StoreError::TooNew {
                    found: version,
                    known: SCHEMA_VERSION,
                });
            }
            let Some(m) = MIGRATIONS.get(version as usize) else {
                // Up to date: the gateway group role gets exactly what a
                // gateway may do in this schema.
                grants::apply(&tx).await?;
                tx.commit().await?;
                return Ok(());
            };
            tx.batch_execute(m).await?;
            tx.execute(
                "UPDATE bc_schema SET version = $1",
                &[&(i64::from(version) + 1)],
            )
            .await?;
            tx.commit().await?;
        }
    }

    /// The lock a gateway's Hellos share and its lease renewal takes alone.
    fn fence(&self, lease: &str) -> Arc<tokio::sync::RwLock<()>> {
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(lease.to_string())
            .or_default()
            .clone()
    }
}

gateway_operations!(implement!(PostgresBackend, pg_run, GatewayBackend {
    async fn now(&self) -> Result<i64, StoreError> {
        if let Some(c) = &self.clock {
            return Ok(c.now_ms());
        }
        tx!(self, |tx| now(&tx).await.map_err(StoreError::from))
    }

    async fn schema_version(&self) -> Result<u32, StoreError> {
        tx!(self, |tx| async {
            let v: i64 = query_one(&tx, "SELECT version FROM bc_schema", &[])
                .await?
                .get(0);
            Ok::<_, StoreError>(v.clamp(0, u32::MAX as i64) as u32)
        }
        .await)
    }

    async fn hello(&self, h: &HelloInput) -> Result<HelloOutcome, TxError> {
        let fence = self.fence(&crate::leases::gateway_lease(&h.gateway_id));
        let _shared = fence.read().await;
        self.hellos.hello(h).await
    }

    async fn hold_lease(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Held>, StoreError> {
        let fence = self.fence(name);
        let _alone = fence.write().await;
        tx!(self, leases, |tx| leases::renew(&Pg(&tx), name, owner, ttl)
            .await)
    }

    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        let fence = self.fence(name);
        let _alone = fence.write().await;
        tx!(self, leases, |tx| leases::release(&Pg(&tx), name, owner)
            .await)
    }

    async fn report_absorption(&self, gateway_id: &GatewayId, per_s: u32) -> Result<(), StoreError> {
        tx!(self, |tx| leases::report_absorption(
            &Pg(&tx),
            gateway_id,
            per_s
        )
        .await)
    }

    async fn release_chunk(
        &self,
        sequence: ReleaseSeq,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        tx!(self, |tx| chunks::release_chunk(&tx, sequence, offset, len)
            .await)
    }

    async fn image_artifact_chunk(
        &self,
        sha256: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        tx!(self, |tx| chunks::artifact_chunk(&tx, sha256, offset, len)
            .await)
    }
}));

key_holder_operations!(implement!(PostgresBackend, pg_run, Backend {
    async fn gateway_role_sql(&self, name: &GatewayId) -> Result<Option<String>, StoreError> {
        tx!(self, |tx| grants::role_sql_here(&tx, name).await.map(Some))
    }

    async fn dump(&self) -> Result<Dump, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = self.begin_consistent(&mut conn).await?;
        let dump = dump::dump(&tx).await?;
        tx.commit().await?;
        Ok(dump)
    }

    async fn restore(&self, dump: Dump) -> Result<(), TxError> {
        tx!(self, |tx| dump::restore(&tx, &dump).await)
    }

    async fn stall(&self, duration: Duration) -> Result<(), StoreError> {
        tx!(self, |tx| stall::stall(&tx, duration).await)
    }
}));
