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

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

use crate::audit::{AuditHistory, AuditSnapshot, Settling};
use crate::backend::{Backend, GatewayBackend};
use crate::backups::{BackupRow, Dump, NewBackup};
use crate::bindings::{BindingInput, BindingOutcome, BindingRow, VerifySignature};
use crate::clock::Clock;
use crate::commands::{
    CommandRow, Dispatch, NewCommand, ResultApplied, ResultInput, SealCommand, UnknownResult,
};
use crate::error::{StoreError, TxError};
use crate::events::{EventInput, EventRow};
use crate::gateways::{GatewayCert, GatewayCredential, SignedRevocations};
use crate::images::{AllowedMac, Assigned, BootRecord, BootRow, ImageRow, Minted, NewImage};
use crate::inventory::{InventoryInput, InventoryRow};
use crate::leases::{Held, LeaseRow};
use crate::liveness::{LivenessRules, SweepOutcome};
use crate::machines::{Enrolled, Enrolment, NewEnrolment};
use crate::nodes::{NodeList, RenewCert, Revocation, SealStatement, Signed, ValidCert};
use crate::releases::{NewRelease, ReleaseFiles, ReleaseHead, ReleaseRow};
use crate::rollouts::{NewRollout, Rollout, RolloutCommand, RolloutState};
use crate::sessions::{Ended, FleetSize, HelloInput, HelloOutcome, Seen, SessionKey, SessionRow};
use crate::specs::{
    ChangeSpec, FactApplied, OpenSpec, SealSpec, SpecBody, SpecView, StateReportInput,
};
use crate::sql::{
    self, Dialect, Row, audit, backups, bindings, clones, commands, events, gateways, images,
    inventory, leases, liveness, machines, nodes, reconcile, rollouts, secrets, sessions, specs,
    tokens,
};
use crate::tokens::{
    IssueCert, JoinInput, Joined, NewOperator, NewToken, OperatorRow, PreviousProof,
    SealRevocation, TokenInfo,
};

/// The migrations, in order. The schema version is how many ran; the
/// numbers mean the same schema as SQLite's.
pub const MIGRATIONS: &[&str] = &[
    include_str!("migrations/0001_join_nodes_sessions.sql"),
    include_str!("migrations/0002_commands.sql"),
    include_str!("migrations/0003_node_events.sql"),
    include_str!("migrations/0004_desired_state.sql"),
    include_str!("migrations/0005_access.sql"),
    include_str!("migrations/0006_bindings_fleet_events.sql"),
    include_str!("migrations/0007_releases.sql"),
    include_str!("migrations/0008_release_floors_rollouts.sql"),
    include_str!("migrations/0009_audit.sql"),
    include_str!("migrations/0010_images.sql"),
    include_str!("migrations/0011_compute_now.sql"),
    include_str!("migrations/0012_signed_facts_statements.sql"),
    include_str!("migrations/0013_audit_chain.sql"),
    include_str!("migrations/0014_backups.sql"),
    include_str!("migrations/0015_cert_sightings.sql"),
    include_str!("migrations/0016_operator_certificates.sql"),
    include_str!("migrations/0017_gateway_credentials.sql"),
    include_str!("migrations/0018_node_ek.sql"),
    include_str!("migrations/0019_audit_chains.sql"),
    include_str!("migrations/0020_machine_enrolments.sql"),
    include_str!("migrations/0021_ek_ca_intermediates.sql"),
    include_str!("migrations/0022_boot_access.sql"),
    include_str!("migrations/0023_hello_cost.sql"),
    include_str!("migrations/0024_signed_results.sql"),
    include_str!("migrations/0025_revocations_stay.sql"),
    include_str!("migrations/0026_legacy_results.sql"),
    include_str!("migrations/0027_controller_leases.sql"),
    include_str!("migrations/0028_hello_proofs.sql"),
    include_str!("migrations/0029_legacy_hello_endings.sql"),
    include_str!("migrations/0030_endings_written_once.sql"),
    include_str!("migrations/0031_sightings_watched.sql"),
    include_str!("migrations/0032_hello_proofs_required.sql"),
    include_str!("migrations/0033_floors_from_signed_upgrades.sql"),
    include_str!("migrations/0034_gateway_revocations.sql"),
    include_str!("migrations/0035_result_receipts.sql"),
    include_str!("migrations/0036_node_security_events.sql"),
    include_str!("migrations/0037_security_events_by_body.sql"),
    include_str!("migrations/0038_operator_revocations.sql"),
    include_str!("migrations/0039_unknown_results.sql"),
    include_str!("migrations/0040_secrets.sql"),
    include_str!("migrations/0041_lease_generation.sql"),
    include_str!("migrations/0042_lease_absorption.sql"),
];

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
/// transaction `$tx`) in one transaction on a connection from `$pool`:
/// committed when it returns `Ok`, rolled back otherwise.
macro_rules! tx {
    ($self:ident, $pool:ident, |$tx:ident| $body:expr) => {{
        let mut conn = $self.$pool.get().await.map_err(StoreError::from)?;
        let $tx = $self.begin(&mut conn).await?;
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
    ($self:ident, |$tx:ident| $body:expr) => {
        tx!($self, pool, |$tx| $body)
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

#[async_trait]
impl GatewayBackend for PostgresBackend {
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

    async fn check_cert(&self, fingerprint: &str) -> Result<ValidCert, TxError> {
        tx!(self, |tx| nodes::check_cert(&Pg(&tx), fingerprint).await)
    }

    async fn revoked_since(&self, since_ms: i64) -> Result<Vec<Revocation>, StoreError> {
        tx!(self, |tx| nodes::revoked_since(&Pg(&tx), since_ms).await)
    }

    async fn gateway_revocations(&self) -> Result<Option<SignedRevocations>, StoreError> {
        tx!(self, |tx| gateways::revocations(&Pg(&tx)).await)
    }

    async fn event_receipts(
        &self,
        node: &str,
        journal_id: &str,
        keys: &[crate::events::EventKey],
    ) -> Result<Vec<(crate::events::EventKey, Vec<u8>)>, StoreError> {
        tx!(self, |tx| events::receipts(
            &Pg(&tx),
            node,
            journal_id,
            keys
        )
        .await)
    }

    async fn result_receipts(
        &self,
        node: &str,
        ids: &[String],
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        tx!(self, |tx| commands::result_receipts(&Pg(&tx), node, ids)
            .await)
    }

    async fn put_unknown_result(&self, r: &UnknownResult) -> Result<bool, StoreError> {
        tx!(self, |tx| commands::put_unknown_result(&Pg(&tx), r).await)
    }

    async fn hello(&self, h: &HelloInput) -> Result<HelloOutcome, TxError> {
        let fence = self.fence(&crate::leases::gateway_lease(&h.gateway_id));
        let _shared = fence.read().await;
        self.hellos.hello(h).await
    }

    async fn disconnect(&self, ended: &[Ended]) -> Result<Vec<SessionKey>, StoreError> {
        tx!(self, |tx| sessions::disconnect(&Pg(&tx), ended).await)
    }

    async fn flush_liveness(
        &self,
        gateway_id: &str,
        seen: &[Seen],
    ) -> Result<Vec<SessionKey>, StoreError> {
        tx!(self, |tx| sessions::flush_liveness(
            &Pg(&tx),
            gateway_id,
            seen
        )
        .await)
    }

    async fn gateway_shutdown(
        &self,
        gateway_id: &str,
        sessions: &[SessionKey],
    ) -> Result<(), StoreError> {
        tx!(self, |tx| sessions::gateway_shutdown(
            &Pg(&tx),
            gateway_id,
            sessions
        )
        .await)
    }

    async fn spec_generations(&self, gateway_id: &str) -> Result<Vec<(String, u64)>, StoreError> {
        tx!(self, |tx| sessions::spec_generations(&Pg(&tx), gateway_id)
            .await)
    }

    async fn nodes_with_work(
        &self,
        gateway_id: &str,
        specs_since_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| sessions::nodes_with_work(
            &Pg(&tx),
            gateway_id,
            specs_since_ms
        )
        .await)
    }

    async fn sweep_liveness(
        &self,
        rules: &LivenessRules,
        held: &Held,
    ) -> Result<SweepOutcome, StoreError> {
        tx!(self, |tx| {
            leases::check_held(&Pg(&tx), held).await?;
            liveness::sweep(&Pg(&tx), rules).await
        })
    }

    async fn fleet_size(&self) -> Result<FleetSize, StoreError> {
        tx!(self, |tx| sessions::fleet_size(&Pg(&tx)).await)
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

    async fn report_absorption(&self, gateway_id: &str, per_s: u32) -> Result<(), StoreError> {
        tx!(self, |tx| leases::report_absorption(
            &Pg(&tx),
            gateway_id,
            per_s
        )
        .await)
    }

    async fn remove_dead_leases(
        &self,
        dead_after: Duration,
        held: &Held,
    ) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| {
            leases::check_held(&Pg(&tx), held).await?;
            reconcile::remove_dead_leases(&Pg(&tx), dead_after).await
        })
    }

    async fn put_inventory(
        &self,
        node_id: &str,
        epoch: u64,
        section: &Signed<InventoryInput>,
        verify: VerifySignature,
    ) -> Result<FactApplied, StoreError> {
        tx!(self, |tx| inventory::put(
            &Pg(&tx),
            node_id,
            epoch,
            section,
            verify
        )
        .await)
    }

    async fn command_states(&self) -> Result<Vec<(String, u64)>, StoreError> {
        tx!(self, |tx| commands::states(&Pg(&tx)).await)
    }

    async fn take_dispatchable(
        &self,
        gateway_id: &str,
        node_id: &str,
        epoch: u64,
    ) -> Result<Vec<Dispatch>, StoreError> {
        tx!(self, |tx| commands::take_dispatchable(
            &Pg(&tx),
            gateway_id,
            node_id,
            epoch
        )
        .await)
    }

    async fn command_ack(
        &self,
        route: &crate::commands::Route,
        id: &str,
        running: bool,
    ) -> Result<bool, StoreError> {
        tx!(self, |tx| commands::ack(&Pg(&tx), route, id, running).await)
    }

    async fn command_result(
        &self,
        node_id: &str,
        r: &Signed<ResultInput>,
        verify: VerifySignature,
    ) -> Result<ResultApplied, StoreError> {
        tx!(self, |tx| commands::result(&Pg(&tx), node_id, r, verify)
            .await)
    }

    async fn sweep_commands(&self, held: &Held) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| {
            leases::check_held(&Pg(&tx), held).await?;
            commands::sweep(&Pg(&tx)).await
        })
    }

    async fn signed_spec(&self, node_id: &str) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        tx!(self, |tx| specs::signed(&Pg(&tx), node_id).await)
    }

    async fn put_state_report(
        &self,
        node_id: &str,
        report: &Signed<StateReportInput>,
        verify: VerifySignature,
    ) -> Result<FactApplied, StoreError> {
        tx!(self, |tx| specs::put_state_report(
            &Pg(&tx),
            node_id,
            report,
            verify
        )
        .await)
    }

    async fn record_binding(
        &self,
        b: &BindingInput,
        verify: VerifySignature,
    ) -> Result<BindingOutcome, StoreError> {
        tx!(self, |tx| bindings::record(&Pg(&tx), b, verify).await)
    }

    async fn put_events(
        &self,
        node_id: &str,
        journal_id: &str,
        events: &[EventInput],
    ) -> Result<u64, StoreError> {
        tx!(self, |tx| events::put(
            &Pg(&tx),
            node_id,
            journal_id,
            events
        )
        .await)
    }

    async fn release_head(&self, sequence: u64) -> Result<Option<ReleaseHead>, StoreError> {
        tx!(self, |tx| sql::releases::head(&Pg(&tx), sequence).await)
    }

    async fn release_chunk(
        &self,
        sequence: u64,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        tx!(self, |tx| chunks::release_chunk(&tx, sequence, offset, len)
            .await)
    }

    async fn image(&self, image_id: &str) -> Result<Option<(ImageRow, Vec<u8>)>, StoreError> {
        tx!(self, |tx| images::get(&Pg(&tx), image_id).await)
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

    async fn release(&self, sequence: u64) -> Result<Option<ReleaseFiles>, StoreError> {
        tx!(self, |tx| sql::releases::files(&Pg(&tx), sequence).await)
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    async fn add_operator(&self, o: &NewOperator) -> Result<(), TxError> {
        tx!(self, |tx| tokens::add_operator(&Pg(&tx), o).await)
    }

    async fn list_operators(&self) -> Result<Vec<OperatorRow>, StoreError> {
        tx!(self, |tx| tokens::list_operators(&Pg(&tx)).await)
    }

    async fn operator_by_cert(&self, cert_sha256: &str) -> Result<Option<OperatorRow>, StoreError> {
        tx!(self, |tx| tokens::operator_by_cert(&Pg(&tx), cert_sha256)
            .await)
    }

    async fn revoke_operator(
        &self,
        id: &str,
        seal: SealRevocation,
    ) -> Result<OperatorRow, TxError> {
        tx!(self, |tx| tokens::revoke_operator(&Pg(&tx), id, seal).await)
    }

    async fn put_secret(
        &self,
        name: &str,
        put: crate::secrets::Put,
        by: &str,
        seal: crate::secrets::SealSecret,
    ) -> Result<crate::secrets::SecretSummary, TxError> {
        tx!(self, |tx| secrets::put(&Pg(&tx), name, put, by, seal).await)
    }

    async fn secret(
        &self,
        name: &str,
        version: u64,
    ) -> Result<Option<crate::secrets::SecretRow>, StoreError> {
        tx!(self, |tx| secrets::get(&Pg(&tx), name, version).await)
    }

    async fn list_secrets(&self) -> Result<Vec<crate::secrets::SecretSummary>, StoreError> {
        tx!(self, |tx| secrets::list(&Pg(&tx)).await)
    }

    async fn delete_secret(&self, name: &str) -> Result<crate::secrets::SecretSummary, TxError> {
        tx!(self, |tx| secrets::delete(&Pg(&tx), name).await)
    }

    async fn add_gateway_credential(
        &self,
        name: &str,
        secret_sha256: &str,
    ) -> Result<i64, TxError> {
        tx!(self, |tx| gateways::add(&Pg(&tx), name, secret_sha256)
            .await)
    }

    async fn gateway_credential(
        &self,
        name: &str,
    ) -> Result<Option<GatewayCredential>, StoreError> {
        tx!(self, |tx| gateways::get(&Pg(&tx), name).await)
    }

    async fn list_gateway_credentials(&self) -> Result<Vec<GatewayCredential>, StoreError> {
        tx!(self, |tx| gateways::list(&Pg(&tx)).await)
    }

    async fn revoke_gateway_credential(&self, name: &str) -> Result<bool, StoreError> {
        tx!(self, |tx| gateways::revoke(&Pg(&tx), name).await)
    }

    async fn record_gateway_cert(&self, cert: &GatewayCert) -> Result<(), StoreError> {
        tx!(self, |tx| gateways::record_cert(&Pg(&tx), cert).await)
    }

    async fn revoked_gateway_certs(&self) -> Result<Vec<GatewayCert>, StoreError> {
        tx!(self, |tx| gateways::revoked_certs(&Pg(&tx)).await)
    }

    async fn put_gateway_revocations(&self, list: &SignedRevocations) -> Result<(), StoreError> {
        tx!(self, |tx| gateways::put_revocations(&Pg(&tx), list).await)
    }

    async fn gateway_role_sql(&self, name: &str) -> Result<Option<String>, StoreError> {
        tx!(self, |tx| grants::role_sql_here(&tx, name).await.map(Some))
    }

    async fn list_tokens(&self, all: bool) -> Result<Vec<TokenInfo>, StoreError> {
        tx!(self, |tx| tokens::list_tokens(&Pg(&tx), all).await)
    }

    async fn revoke_token(&self, id: &str) -> Result<Option<TokenInfo>, StoreError> {
        tx!(self, |tx| tokens::revoke_token(&Pg(&tx), id).await)
    }

    async fn create_token(&self, t: &NewToken) -> Result<i64, StoreError> {
        tx!(self, |tx| tokens::create_token(&Pg(&tx), t).await)
    }

    async fn join(&self, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError> {
        tx!(self, |tx| tokens::join(&Pg(&tx), j, issue).await)
    }

    async fn reenrol(
        &self,
        j: &JoinInput,
        proof: &PreviousProof,
        issue: IssueCert,
        seal: SealStatement,
    ) -> Result<Joined, TxError> {
        tx!(self, |tx| tokens::reenrol(&Pg(&tx), j, proof, issue, seal)
            .await)
    }

    async fn join_attested(
        &self,
        j: &JoinInput,
        ek_sha256: &str,
        issue: IssueCert,
        seal: SealStatement,
    ) -> Result<Joined, TxError> {
        tx!(self, |tx| tokens::join_attested(
            &Pg(&tx),
            j,
            ek_sha256,
            issue,
            seal
        )
        .await)
    }

    async fn join_enrolled(
        &self,
        j: &JoinInput,
        ek_sha256: &str,
        ek_ca: Option<&str>,
        boot_id: &str,
        issue: IssueCert,
        seal: SealStatement,
        proves: crate::machines::ProvesMachine,
    ) -> Result<Enrolled, TxError> {
        tx!(self, |tx| tokens::join_enrolled(
            &Pg(&tx),
            j,
            ek_sha256,
            ek_ca,
            boot_id,
            (issue, seal),
            proves
        )
        .await)
    }

    async fn enrol_machine(&self, e: &NewEnrolment) -> Result<Enrolment, TxError> {
        tx!(self, |tx| machines::enrol(&Pg(&tx), e).await)
    }

    async fn list_enrolments(&self) -> Result<Vec<Enrolment>, StoreError> {
        tx!(self, |tx| machines::list(&Pg(&tx)).await)
    }

    async fn remove_enrolment(&self, id: &str) -> Result<Enrolment, TxError> {
        tx!(self, |tx| machines::remove(&Pg(&tx), id).await)
    }

    async fn renew_within(
        &self,
        fingerprint: &str,
        issue: RenewCert,
        expired_grace_ms: i64,
    ) -> Result<Joined, TxError> {
        tx!(self, |tx| nodes::renew(
            &Pg(&tx),
            fingerprint,
            issue,
            expired_grace_ms
        )
        .await)
    }

    async fn node_certificates(&self, node_id: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        let rows = tx!(self, |tx| query(
            &tx,
            "SELECT der FROM node_certs WHERE node_id = $1 AND der IS NOT NULL ORDER BY serial",
            &[&node_id],
        )
        .await
        .map_err(StoreError::from))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn list_nodes(&self) -> Result<NodeList, StoreError> {
        tx!(self, |tx| nodes::list_nodes(&Pg(&tx)).await)
    }

    async fn node(&self, node_id: &str) -> Result<NodeList, StoreError> {
        tx!(self, |tx| nodes::nodes_matching(&Pg(&tx), Some(node_id))
            .await)
    }

    async fn sightings_unwatched(
        &self,
        limit: u32,
    ) -> Result<Vec<crate::sessions::Sighting>, StoreError> {
        tx!(self, |tx| clones::unwatched(&Pg(&tx), limit).await)
    }

    async fn mark_sightings_watched(&self, ids: &[i64]) -> Result<(), StoreError> {
        tx!(self, |tx| clones::mark_watched(&Pg(&tx), ids).await)
    }

    async fn sightings_of(
        &self,
        serial: &str,
        since_ms: i64,
    ) -> Result<Vec<crate::sessions::Sighting>, StoreError> {
        tx!(self, |tx| clones::of(&Pg(&tx), serial, since_ms).await)
    }

    async fn drop_forged_sightings(
        &self,
        forged: &[(crate::sessions::Sighting, String)],
    ) -> Result<(), StoreError> {
        tx!(self, |tx| clones::drop_forged(&Pg(&tx), forged).await)
    }

    async fn supersede(&self, node_id: &str, serial: &str) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| clones::supersede(&Pg(&tx), node_id, serial)
            .await)
    }

    async fn security_events_unreceipted(
        &self,
        limit: u32,
    ) -> Result<Vec<crate::events::SecurityEvent>, StoreError> {
        tx!(self, |tx| events::unreceipted(&Pg(&tx), limit).await)
    }

    async fn put_event_receipt(
        &self,
        event: &crate::events::SecurityEvent,
        receipt: &[u8],
    ) -> Result<(), StoreError> {
        tx!(self, |tx| events::put_receipt(&Pg(&tx), event, receipt)
            .await)
    }

    async fn unknown_results_unreceipted(
        &self,
        limit: u32,
    ) -> Result<Vec<UnknownResult>, StoreError> {
        tx!(self, |tx| commands::unknown_results_unreceipted(
            &Pg(&tx),
            limit
        )
        .await)
    }

    async fn put_unknown_result_receipt(
        &self,
        r: &UnknownResult,
        receipt: &[u8],
    ) -> Result<(), StoreError> {
        tx!(self, |tx| commands::put_unknown_result_receipt(
            &Pg(&tx),
            r,
            receipt
        )
        .await)
    }

    async fn results_unreceipted(&self, limit: u32) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| commands::results_unreceipted(&Pg(&tx), limit)
            .await)
    }

    async fn put_result_receipt(&self, id: &str, receipt: &[u8]) -> Result<(), StoreError> {
        tx!(self, |tx| commands::put_result_receipt(
            &Pg(&tx),
            id,
            receipt
        )
        .await)
    }

    async fn upgrades_unjudged(&self, limit: u32) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| commands::upgrades_unjudged(&Pg(&tx), limit)
            .await)
    }

    async fn judge_upgrade_floor(
        &self,
        command_id: &str,
        believed: bool,
    ) -> Result<Option<u64>, StoreError> {
        tx!(self, |tx| commands::judge_upgrade_floor(
            &Pg(&tx),
            command_id,
            believed
        )
        .await)
    }

    async fn require_hello_proofs(&self, node_id: &str, serial: &str) -> Result<bool, StoreError> {
        tx!(self, |tx| clones::require_hello_proofs(
            &Pg(&tx),
            node_id,
            serial
        )
        .await)
    }

    async fn quarantine_clone(
        &self,
        node_id: &str,
        serial: &str,
        alternations: u32,
        seal: SealStatement,
    ) -> Result<bool, TxError> {
        tx!(self, |tx| clones::quarantine(
            &Pg(&tx),
            node_id,
            serial,
            alternations,
            seal
        )
        .await)
    }

    async fn delete_node(&self, node_id: &str, seal: SealStatement) -> Result<bool, StoreError> {
        tx!(self, |tx| nodes::delete_node(&Pg(&tx), node_id, seal).await)
    }

    async fn session(&self, node_id: &str) -> Result<Option<SessionRow>, StoreError> {
        tx!(self, |tx| sessions::session(&Pg(&tx), node_id).await)
    }

    async fn connected_to(&self, gateway_id: &str) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| sessions::connected_to(&Pg(&tx), gateway_id)
            .await)
    }

    async fn leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        tx!(self, |tx| leases::list(&Pg(&tx)).await)
    }

    async fn prune_history(
        &self,
        limits: crate::reconcile::HistoryLimits,
        held: &Held,
    ) -> Result<crate::reconcile::Pruned, StoreError> {
        tx!(self, |tx| {
            leases::check_held(&Pg(&tx), held).await?;
            reconcile::prune_history(&Pg(&tx), limits).await
        })
    }

    async fn inventory(
        &self,
        node_id: &str,
        section: &str,
    ) -> Result<Option<InventoryRow>, StoreError> {
        tx!(self, |tx| inventory::get(&Pg(&tx), node_id, section).await)
    }

    async fn create_command(
        &self,
        cmd: &NewCommand,
        seal: SealCommand,
    ) -> Result<(CommandRow, bool), TxError> {
        tx!(self, |tx| commands::create(&Pg(&tx), cmd, seal).await)
    }

    async fn get_command(&self, id: &str) -> Result<Option<CommandRow>, StoreError> {
        tx!(self, |tx| commands::row(&Pg(&tx), id).await)
    }

    async fn list_commands(
        &self,
        node_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<CommandRow>, StoreError> {
        tx!(self, |tx| commands::list(&Pg(&tx), node_id, limit).await)
    }

    async fn cancel_pending_command(&self, id: &str, reason: &str) -> Result<bool, StoreError> {
        tx!(self, |tx| commands::cancel_pending(&Pg(&tx), id, reason)
            .await)
    }

    async fn update_spec(
        &self,
        node_id: &str,
        change: ChangeSpec,
        open: OpenSpec,
        seal: SealSpec,
    ) -> Result<(u64, SpecBody), TxError> {
        let updated: Result<_, TxError> = tx!(self, |tx| specs::update(
            &Pg(&tx),
            node_id,
            change,
            open,
            seal
        )
        .await);
        updated?.map_err(TxError::from)
    }

    async fn specs_expiring(&self, within: Duration) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| specs::expiring(&Pg(&tx), within).await)
    }

    async fn signed_specs(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        tx!(self, |tx| specs::signed_all(&Pg(&tx)).await)
    }

    async fn spec_view(&self, node_id: &str) -> Result<Option<SpecView>, StoreError> {
        tx!(self, |tx| specs::view(&Pg(&tx), node_id).await)
    }

    async fn bindings(&self, node_id: &str) -> Result<Vec<BindingRow>, StoreError> {
        tx!(self, |tx| bindings::list(&Pg(&tx), node_id).await)
    }

    async fn fleet_events(&self, node_id: &str, limit: u32) -> Result<Vec<String>, StoreError> {
        tx!(self, |tx| bindings::fleet_events(&Pg(&tx), node_id, limit)
            .await)
    }

    async fn list_fleet_events(
        &self,
        q: &crate::events::EventQuery,
    ) -> Result<Vec<crate::events::FleetEvent>, StoreError> {
        tx!(self, |tx| bindings::list_fleet_events(&Pg(&tx), q).await)
    }

    async fn publish_fleet_event(
        &self,
        kind: &str,
        node_id: &str,
        detail: &str,
    ) -> Result<(), StoreError> {
        tx!(self, |tx| async {
            let at = now(&tx).await?;
            bindings::fleet_event(&Pg(&tx), at, kind, node_id, detail).await?;
            Ok::<(), StoreError>(())
        }
        .await)
    }

    async fn node_events(&self, node_id: &str) -> Result<Vec<EventRow>, StoreError> {
        tx!(self, |tx| events::list(&Pg(&tx), node_id).await)
    }

    async fn register_release(&self, r: &NewRelease) -> Result<ReleaseRow, TxError> {
        tx!(self, |tx| sql::releases::register(&Pg(&tx), r).await)
    }

    async fn list_releases(&self) -> Result<Vec<ReleaseRow>, StoreError> {
        tx!(self, |tx| sql::releases::list(&Pg(&tx)).await)
    }

    async fn register_image(&self, i: &NewImage) -> Result<bool, StoreError> {
        tx!(self, |tx| images::register(&Pg(&tx), i).await)
    }

    async fn list_images(&self) -> Result<Vec<ImageRow>, StoreError> {
        tx!(self, |tx| images::list(&Pg(&tx)).await)
    }

    async fn image_manifests(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        tx!(self, |tx| images::manifests(&Pg(&tx)).await)
    }

    async fn resolve_image(&self, what: &str) -> Result<String, TxError> {
        tx!(self, |tx| images::resolve(&Pg(&tx), what).await)
    }

    async fn assign_image(
        &self,
        target: &str,
        image_id: Option<&str>,
        append: &str,
        mint_ttl_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        tx!(self, |tx| images::assign(
            &Pg(&tx),
            target,
            image_id,
            append,
            mint_ttl_ms
        )
        .await)
    }

    async fn image_for_mac(&self, mac: &str) -> Result<Option<Assigned>, StoreError> {
        tx!(self, |tx| images::for_mac(&Pg(&tx), mac).await)
    }

    async fn mint_boot_token(&self, mac: &str, t: &NewToken) -> Result<Option<Minted>, StoreError> {
        tx!(self, |tx| images::mint(&Pg(&tx), mac, t).await)
    }

    async fn allow_boot_mac(&self, mac: &str, pool: Option<&str>) -> Result<(), StoreError> {
        tx!(self, |tx| images::allow_mac(&Pg(&tx), mac, pool).await)
    }

    async fn disallow_boot_mac(&self, mac: &str) -> Result<bool, StoreError> {
        tx!(self, |tx| images::disallow_mac(&Pg(&tx), mac).await)
    }

    async fn boot_macs(&self) -> Result<Vec<AllowedMac>, StoreError> {
        tx!(self, |tx| images::allowed_macs(&Pg(&tx)).await)
    }

    async fn image_artifact(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        tx!(self, |tx| images::artifact(&Pg(&tx), sha256).await)
    }

    async fn image_artifact_size(&self, sha256: &str) -> Result<Option<u64>, StoreError> {
        tx!(self, |tx| images::artifact_size(&Pg(&tx), sha256).await)
    }

    async fn record_boot(&self, b: &BootRecord) -> Result<(), StoreError> {
        tx!(self, |tx| images::record_boot(&Pg(&tx), b).await)
    }

    async fn boots(&self, mac: Option<&str>, limit: u32) -> Result<Vec<BootRow>, StoreError> {
        tx!(self, |tx| images::boots(&Pg(&tx), mac, limit).await)
    }

    async fn start_rollout(&self, r: &NewRollout) -> Result<Rollout, TxError> {
        tx!(self, |tx| rollouts::start(&Pg(&tx), r).await)
    }

    async fn rollout(&self, id: &str) -> Result<Option<Rollout>, StoreError> {
        tx!(self, |tx| rollouts::get(&Pg(&tx), id).await)
    }

    async fn list_rollouts(&self) -> Result<Vec<Rollout>, StoreError> {
        tx!(self, |tx| rollouts::list(&Pg(&tx)).await)
    }

    async fn set_rollout_state(
        &self,
        id: &str,
        from: &[RolloutState],
        to: RolloutState,
        reason: &str,
    ) -> Result<bool, StoreError> {
        tx!(self, |tx| rollouts::set_state(
            &Pg(&tx),
            id,
            from,
            to,
            reason
        )
        .await)
    }

    async fn advance_rollout(
        &self,
        id: &str,
        from: usize,
        to: usize,
        held: &Held,
    ) -> Result<bool, StoreError> {
        tx!(self, |tx| {
            leases::check_held(&Pg(&tx), held).await?;
            rollouts::advance(&Pg(&tx), id, from, to).await
        })
    }

    async fn record_rollout_command(
        &self,
        id: &str,
        node_id: &str,
        which: RolloutCommand,
        command_id: &str,
    ) -> Result<(), StoreError> {
        tx!(self, |tx| rollouts::record_command(
            &Pg(&tx),
            id,
            node_id,
            which,
            command_id
        )
        .await)
    }

    async fn skip_rollout_node(
        &self,
        id: &str,
        node_id: &str,
        held: &Held,
    ) -> Result<(), StoreError> {
        tx!(self, |tx| {
            leases::check_held(&Pg(&tx), held).await?;
            rollouts::skip(&Pg(&tx), id, node_id).await
        })
    }

    async fn audit_snapshot(&self) -> Result<AuditSnapshot, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = self.begin_consistent(&mut conn).await?;
        let snap = audit::snapshot(&Pg(&tx)).await?;
        tx.commit().await?;
        Ok(snap)
    }

    async fn audit_history(&self) -> Result<AuditHistory, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = self.begin_consistent(&mut conn).await?;
        let history = audit::history(&Pg(&tx)).await?;
        tx.commit().await?;
        Ok(history)
    }

    async fn settling(&self) -> Result<Settling, StoreError> {
        tx!(self, |tx| audit::settling(&Pg(&tx)).await)
    }

    async fn begin_backup(&self, b: &NewBackup) -> Result<BackupRow, StoreError> {
        tx!(self, |tx| backups::begin(&Pg(&tx), b).await)
    }

    async fn finish_backup(&self, id: &str, files: u64, bytes: u64) -> Result<bool, StoreError> {
        tx!(self, |tx| backups::finish(&Pg(&tx), id, files, bytes).await)
    }

    async fn fail_backup(&self, id: &str, reason: &str) -> Result<bool, StoreError> {
        tx!(self, |tx| backups::fail(&Pg(&tx), id, reason).await)
    }

    async fn backups(&self) -> Result<Vec<BackupRow>, StoreError> {
        tx!(self, |tx| backups::list(&Pg(&tx)).await)
    }

    async fn backup(&self, id: &str) -> Result<Option<BackupRow>, StoreError> {
        tx!(self, |tx| backups::get(&Pg(&tx), id).await)
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

    async fn reconcile(
        &self,
        owner: &str,
        dead_after: Duration,
    ) -> Result<crate::reconcile::Reconciled, StoreError> {
        tx!(self, |tx| reconcile::run(&Pg(&tx), owner, dead_after).await)
    }
}
