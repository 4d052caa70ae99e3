//! The SQLite backend: one file, WAL, shared by several processes.
//!
//! - Durable: `synchronous=FULL`, so a commit survives an OS crash (an
//!   epoch or a terminal result never rolls back).
//! - The clock: every connection registers `compute_now()`, which reads the
//!   [`Clock`] the store was opened with; every query and trigger uses it.
//! - Three connections: writes go through one, owned by a writer thread
//!   that commits the writes waiting for it together ([`writer`]: group
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
//! catalog, `dump`). This module holds the connections and the
//! [`Backend`] implementation that opens a transaction for each call.

mod chunks;
mod dump;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::config::DbConfig;
use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, TransactionBehavior};

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
    self, Dialect, Params, Row, audit, backups, bindings, clones, commands, events, gateways,
    images, inventory, leases, liveness, machines, nodes, ready, reconcile, rollouts, secrets,
    sessions, specs, tokens,
};
use crate::tokens::{
    IssueCert, JoinInput, Joined, NewOperator, NewToken, OperatorRow, PreviousProof,
    SealRevocation, TokenInfo,
};

/// The migrations, in order. The schema version is how many ran.
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

#[async_trait]
impl GatewayBackend for SqliteBackend {
    async fn now(&self) -> Result<i64, StoreError> {
        Ok(self.clock.now_ms())
    }

    async fn schema_version(&self) -> Result<u32, StoreError> {
        self.read(|c| Ok(user_version(c)?)).await
    }

    async fn check_cert(&self, fingerprint: &str) -> Result<ValidCert, TxError> {
        let fp = fingerprint.to_string();
        self.read(move |c| ready(nodes::check_cert(&Lite(c), &fp)))
            .await
    }

    async fn revoked_since(&self, since_ms: i64) -> Result<Vec<Revocation>, StoreError> {
        self.read(move |c| ready(nodes::revoked_since(&Lite(c), since_ms)))
            .await
    }

    async fn gateway_revocations(&self) -> Result<Option<SignedRevocations>, StoreError> {
        self.read(|c| ready(gateways::revocations(&Lite(c)))).await
    }

    async fn event_receipts(
        &self,
        node: &str,
        journal_id: &str,
        keys: &[crate::events::EventKey],
    ) -> Result<Vec<(crate::events::EventKey, Vec<u8>)>, StoreError> {
        let (node, journal_id, keys) = (node.to_string(), journal_id.to_string(), keys.to_vec());
        self.read(move |c| ready(events::receipts(&Lite(c), &node, &journal_id, &keys)))
            .await
    }

    async fn result_receipts(
        &self,
        node: &str,
        ids: &[String],
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let (node, ids) = (node.to_string(), ids.to_vec());
        self.read(move |c| ready(commands::result_receipts(&Lite(c), &node, &ids)))
            .await
    }

    async fn put_unknown_result(&self, r: &UnknownResult) -> Result<bool, StoreError> {
        let r = r.clone();
        self.write(move |c| ready(commands::put_unknown_result(&Lite(c), &r)))
            .await
    }

    async fn hello(&self, h: &HelloInput) -> Result<HelloOutcome, TxError> {
        let h = h.clone();
        self.write(move |c| ready(sessions::hello(&Lite(c), &h)))
            .await
    }

    async fn disconnect(&self, ended: &[Ended]) -> Result<Vec<SessionKey>, StoreError> {
        let ended = ended.to_vec();
        self.write(move |c| ready(sessions::disconnect(&Lite(c), &ended)))
            .await
    }

    async fn flush_liveness(
        &self,
        gateway_id: &str,
        seen: &[Seen],
    ) -> Result<Vec<SessionKey>, StoreError> {
        let (gw, seen) = (gateway_id.to_string(), seen.to_vec());
        self.write(move |c| ready(sessions::flush_liveness(&Lite(c), &gw, &seen)))
            .await
    }

    async fn gateway_shutdown(
        &self,
        gateway_id: &str,
        sessions: &[SessionKey],
    ) -> Result<(), StoreError> {
        let (gw, mine) = (gateway_id.to_string(), sessions.to_vec());
        self.write(move |c| ready(sessions::gateway_shutdown(&Lite(c), &gw, &mine)))
            .await
    }

    async fn spec_generations(&self, gateway_id: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let gw = gateway_id.to_string();
        self.read(move |c| ready(sessions::spec_generations(&Lite(c), &gw)))
            .await
    }

    async fn nodes_with_work(
        &self,
        gateway_id: &str,
        specs_since_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        let gw = gateway_id.to_string();
        self.read(move |c| ready(sessions::nodes_with_work(&Lite(c), &gw, specs_since_ms)))
            .await
    }

    async fn sweep_liveness(
        &self,
        rules: &LivenessRules,
        held: &Held,
    ) -> Result<SweepOutcome, StoreError> {
        let (rules, held) = (*rules, held.clone());
        self.write(move |c| {
            ready(leases::check_held(&Lite(c), &held))?;
            ready(liveness::sweep(&Lite(c), &rules))
        })
        .await
    }

    async fn fleet_size(&self) -> Result<FleetSize, StoreError> {
        self.read(|c| ready(sessions::fleet_size(&Lite(c)))).await
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

    async fn report_absorption(&self, gateway_id: &str, per_s: u32) -> Result<(), StoreError> {
        let gateway_id = gateway_id.to_string();
        Self::run(&self.leases, TransactionBehavior::Immediate, move |c| {
            ready(leases::report_absorption(&Lite(c), &gateway_id, per_s))
        })
        .await
    }

    async fn remove_dead_leases(
        &self,
        dead_after: Duration,
        held: &Held,
    ) -> Result<Vec<String>, StoreError> {
        let held = held.clone();
        self.write(move |c| {
            ready(leases::check_held(&Lite(c), &held))?;
            ready(reconcile::remove_dead_leases(&Lite(c), dead_after))
        })
        .await
    }

    async fn put_inventory(
        &self,
        node_id: &str,
        epoch: u64,
        section: &Signed<InventoryInput>,
        verify: VerifySignature,
    ) -> Result<FactApplied, StoreError> {
        let (node, section) = (node_id.to_string(), section.clone());
        self.write(move |c| ready(inventory::put(&Lite(c), &node, epoch, &section, verify)))
            .await
    }

    async fn command_states(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.read(|c| ready(commands::states(&Lite(c)))).await
    }

    async fn take_dispatchable(
        &self,
        gateway_id: &str,
        node_id: &str,
        epoch: u64,
    ) -> Result<Vec<Dispatch>, StoreError> {
        let (gw, node) = (gateway_id.to_string(), node_id.to_string());
        self.write(move |c| ready(commands::take_dispatchable(&Lite(c), &gw, &node, epoch)))
            .await
    }

    async fn command_ack(
        &self,
        route: &crate::commands::Route,
        id: &str,
        running: bool,
    ) -> Result<bool, StoreError> {
        let (route, id) = (route.clone(), id.to_string());
        self.write(move |c| ready(commands::ack(&Lite(c), &route, &id, running)))
            .await
    }

    async fn command_result(
        &self,
        node_id: &str,
        r: &Signed<ResultInput>,
        verify: VerifySignature,
    ) -> Result<ResultApplied, StoreError> {
        let (node, r) = (node_id.to_string(), r.clone());
        self.write(move |c| ready(commands::result(&Lite(c), &node, &r, verify)))
            .await
    }

    async fn sweep_commands(&self, held: &Held) -> Result<Vec<String>, StoreError> {
        let held = held.clone();
        self.write(move |c| {
            ready(leases::check_held(&Lite(c), &held))?;
            ready(commands::sweep(&Lite(c)))
        })
        .await
    }

    async fn signed_spec(&self, node_id: &str) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let node = node_id.to_string();
        self.read(move |c| ready(specs::signed(&Lite(c), &node)))
            .await
    }

    async fn put_state_report(
        &self,
        node_id: &str,
        report: &Signed<StateReportInput>,
        verify: VerifySignature,
    ) -> Result<FactApplied, StoreError> {
        let (node, report) = (node_id.to_string(), report.clone());
        self.write(move |c| ready(specs::put_state_report(&Lite(c), &node, &report, verify)))
            .await
    }

    async fn record_binding(
        &self,
        b: &BindingInput,
        verify: VerifySignature,
    ) -> Result<BindingOutcome, StoreError> {
        let b = b.clone();
        self.write(move |c| ready(bindings::record(&Lite(c), &b, verify)))
            .await
    }

    async fn put_events(
        &self,
        node_id: &str,
        journal_id: &str,
        events: &[EventInput],
    ) -> Result<u64, StoreError> {
        let (node, journal, events) =
            (node_id.to_string(), journal_id.to_string(), events.to_vec());
        self.write(move |c| ready(events::put(&Lite(c), &node, &journal, &events)))
            .await
    }

    async fn release_head(&self, sequence: u64) -> Result<Option<ReleaseHead>, StoreError> {
        self.read(move |c| ready(sql::releases::head(&Lite(c), sequence)))
            .await
    }

    async fn release_chunk(
        &self,
        sequence: u64,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(move |c| chunks::release_chunk(c, sequence, offset, len))
            .await
    }

    async fn image(&self, image_id: &str) -> Result<Option<(ImageRow, Vec<u8>)>, StoreError> {
        let id = image_id.to_string();
        self.read(move |c| ready(images::get(&Lite(c), &id))).await
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

    async fn release(&self, sequence: u64) -> Result<Option<ReleaseFiles>, StoreError> {
        self.read(move |c| ready(sql::releases::files(&Lite(c), sequence)))
            .await
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn add_operator(&self, o: &NewOperator) -> Result<(), TxError> {
        let o = o.clone();
        self.write(move |c| ready(tokens::add_operator(&Lite(c), &o)))
            .await
    }

    async fn list_operators(&self) -> Result<Vec<OperatorRow>, StoreError> {
        self.read(|c| ready(tokens::list_operators(&Lite(c)))).await
    }

    async fn operator_by_cert(&self, cert_sha256: &str) -> Result<Option<OperatorRow>, StoreError> {
        let hash = cert_sha256.to_string();
        self.read(move |c| ready(tokens::operator_by_cert(&Lite(c), &hash)))
            .await
    }

    async fn revoke_operator(
        &self,
        id: &str,
        seal: SealRevocation,
    ) -> Result<OperatorRow, TxError> {
        let id = id.to_string();
        let mut seal = Some(seal);
        self.write(move |c| {
            let seal = seal.take().expect("a write runs once");
            ready(tokens::revoke_operator(&Lite(c), &id, seal))
        })
        .await
    }

    async fn put_secret(
        &self,
        name: &str,
        put: crate::secrets::Put,
        by: &str,
        seal: crate::secrets::SealSecret,
    ) -> Result<crate::secrets::SecretSummary, TxError> {
        let (name, by) = (name.to_string(), by.to_string());
        let mut seal = Some(seal);
        self.write(move |c| {
            let seal = seal.take().expect("a write runs once");
            ready(secrets::put(&Lite(c), &name, put, &by, seal))
        })
        .await
    }

    async fn secret(
        &self,
        name: &str,
        version: u64,
    ) -> Result<Option<crate::secrets::SecretRow>, StoreError> {
        let name = name.to_string();
        self.read(move |c| ready(secrets::get(&Lite(c), &name, version)))
            .await
    }

    async fn list_secrets(&self) -> Result<Vec<crate::secrets::SecretSummary>, StoreError> {
        self.read(|c| ready(secrets::list(&Lite(c)))).await
    }

    async fn delete_secret(&self, name: &str) -> Result<crate::secrets::SecretSummary, TxError> {
        let name = name.to_string();
        self.write(move |c| ready(secrets::delete(&Lite(c), &name)))
            .await
    }

    async fn add_gateway_credential(
        &self,
        name: &str,
        secret_sha256: &str,
    ) -> Result<i64, TxError> {
        let (name, hash) = (name.to_string(), secret_sha256.to_string());
        self.write(move |c| ready(gateways::add(&Lite(c), &name, &hash)))
            .await
    }

    async fn gateway_credential(
        &self,
        name: &str,
    ) -> Result<Option<GatewayCredential>, StoreError> {
        let name = name.to_string();
        self.read(move |c| ready(gateways::get(&Lite(c), &name)))
            .await
    }

    async fn list_gateway_credentials(&self) -> Result<Vec<GatewayCredential>, StoreError> {
        self.read(|c| ready(gateways::list(&Lite(c)))).await
    }

    async fn revoke_gateway_credential(&self, name: &str) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.write(move |c| ready(gateways::revoke(&Lite(c), &name)))
            .await
    }

    async fn record_gateway_cert(&self, cert: &GatewayCert) -> Result<(), StoreError> {
        let cert = cert.clone();
        self.write(move |c| ready(gateways::record_cert(&Lite(c), &cert)))
            .await
    }

    async fn revoked_gateway_certs(&self) -> Result<Vec<GatewayCert>, StoreError> {
        self.read(|c| ready(gateways::revoked_certs(&Lite(c))))
            .await
    }

    async fn put_gateway_revocations(&self, list: &SignedRevocations) -> Result<(), StoreError> {
        let list = list.clone();
        self.write(move |c| ready(gateways::put_revocations(&Lite(c), &list)))
            .await
    }

    async fn gateway_role_sql(&self, _name: &str) -> Result<Option<String>, StoreError> {
        Ok(None)
    }

    async fn list_tokens(&self, all: bool) -> Result<Vec<TokenInfo>, StoreError> {
        self.read(move |c| ready(tokens::list_tokens(&Lite(c), all)))
            .await
    }

    async fn revoke_token(&self, id: &str) -> Result<Option<TokenInfo>, StoreError> {
        let id = id.to_string();
        self.write(move |c| ready(tokens::revoke_token(&Lite(c), &id)))
            .await
    }

    async fn create_token(&self, t: &NewToken) -> Result<i64, StoreError> {
        let t = t.clone();
        self.write(move |c| ready(tokens::create_token(&Lite(c), &t)))
            .await
    }

    async fn join(&self, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError> {
        let j = j.clone();
        self.write(move |c| ready(tokens::join(&Lite(c), &j, issue)))
            .await
    }

    async fn reenrol(
        &self,
        j: &JoinInput,
        proof: &PreviousProof,
        issue: IssueCert,
        seal: SealStatement,
    ) -> Result<Joined, TxError> {
        let (j, proof) = (j.clone(), proof.clone());
        self.write(move |c| ready(tokens::reenrol(&Lite(c), &j, &proof, issue, seal)))
            .await
    }

    async fn join_attested(
        &self,
        j: &JoinInput,
        ek_sha256: &str,
        issue: IssueCert,
        seal: SealStatement,
    ) -> Result<Joined, TxError> {
        let (j, ek) = (j.clone(), ek_sha256.to_string());
        self.write(move |c| ready(tokens::join_attested(&Lite(c), &j, &ek, issue, seal)))
            .await
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
        let (j, ek, ca, boot) = (
            j.clone(),
            ek_sha256.to_string(),
            ek_ca.map(str::to_string),
            boot_id.to_string(),
        );
        self.write(move |c| {
            ready(tokens::join_enrolled(
                &Lite(c),
                &j,
                &ek,
                ca.as_deref(),
                &boot,
                (issue, seal),
                proves,
            ))
        })
        .await
    }

    async fn enrol_machine(&self, e: &NewEnrolment) -> Result<Enrolment, TxError> {
        let e = e.clone();
        self.write(move |c| ready(machines::enrol(&Lite(c), &e)))
            .await
    }

    async fn list_enrolments(&self) -> Result<Vec<Enrolment>, StoreError> {
        self.read(|c| ready(machines::list(&Lite(c)))).await
    }

    async fn remove_enrolment(&self, id: &str) -> Result<Enrolment, TxError> {
        let id = id.to_string();
        self.write(move |c| ready(machines::remove(&Lite(c), &id)))
            .await
    }

    async fn renew_within(
        &self,
        fingerprint: &str,
        issue: RenewCert,
        expired_grace_ms: i64,
    ) -> Result<Joined, TxError> {
        let fp = fingerprint.to_string();
        self.write(move |c| ready(nodes::renew(&Lite(c), &fp, issue, expired_grace_ms)))
            .await
    }

    async fn node_certificates(&self, node_id: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        let node_id = node_id.to_string();
        self.read(move |c| {
            c.prepare_cached(
                "SELECT der FROM node_certs WHERE node_id = ?1 AND der IS NOT NULL ORDER BY serial",
            )?
            .query_map([&node_id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()
            .map_err(StoreError::from)
        })
        .await
    }

    async fn list_nodes(&self) -> Result<NodeList, StoreError> {
        self.read(|c| ready(nodes::list_nodes(&Lite(c)))).await
    }

    async fn node(&self, node_id: &str) -> Result<NodeList, StoreError> {
        let node = node_id.to_string();
        self.read(move |c| ready(nodes::nodes_matching(&Lite(c), Some(&node))))
            .await
    }

    async fn sightings_unwatched(
        &self,
        limit: u32,
    ) -> Result<Vec<crate::sessions::Sighting>, StoreError> {
        self.read(move |c| ready(clones::unwatched(&Lite(c), limit)))
            .await
    }

    async fn mark_sightings_watched(&self, ids: &[i64]) -> Result<(), StoreError> {
        let ids = ids.to_vec();
        self.write(move |c| ready(clones::mark_watched(&Lite(c), &ids)))
            .await
    }

    async fn sightings_of(
        &self,
        serial: &str,
        since_ms: i64,
    ) -> Result<Vec<crate::sessions::Sighting>, StoreError> {
        let serial = serial.to_string();
        self.read(move |c| ready(clones::of(&Lite(c), &serial, since_ms)))
            .await
    }

    async fn drop_forged_sightings(
        &self,
        forged: &[(crate::sessions::Sighting, String)],
    ) -> Result<(), StoreError> {
        let forged = forged.to_vec();
        self.write(move |c| ready(clones::drop_forged(&Lite(c), &forged)))
            .await
    }

    async fn supersede(&self, node_id: &str, serial: &str) -> Result<Vec<String>, StoreError> {
        let (node, serial) = (node_id.to_string(), serial.to_string());
        self.write(move |c| ready(clones::supersede(&Lite(c), &node, &serial)))
            .await
    }

    async fn security_events_unreceipted(
        &self,
        limit: u32,
    ) -> Result<Vec<crate::events::SecurityEvent>, StoreError> {
        self.read(move |c| ready(events::unreceipted(&Lite(c), limit)))
            .await
    }

    async fn put_event_receipt(
        &self,
        event: &crate::events::SecurityEvent,
        receipt: &[u8],
    ) -> Result<(), StoreError> {
        let (event, receipt) = (event.clone(), receipt.to_vec());
        self.write(move |c| ready(events::put_receipt(&Lite(c), &event, &receipt)))
            .await
    }

    async fn unknown_results_unreceipted(
        &self,
        limit: u32,
    ) -> Result<Vec<UnknownResult>, StoreError> {
        self.read(move |c| ready(commands::unknown_results_unreceipted(&Lite(c), limit)))
            .await
    }

    async fn put_unknown_result_receipt(
        &self,
        r: &UnknownResult,
        receipt: &[u8],
    ) -> Result<(), StoreError> {
        let (r, receipt) = (r.clone(), receipt.to_vec());
        self.write(move |c| ready(commands::put_unknown_result_receipt(&Lite(c), &r, &receipt)))
            .await
    }

    async fn results_unreceipted(&self, limit: u32) -> Result<Vec<String>, StoreError> {
        self.read(move |c| ready(commands::results_unreceipted(&Lite(c), limit)))
            .await
    }

    async fn put_result_receipt(&self, id: &str, receipt: &[u8]) -> Result<(), StoreError> {
        let (id, receipt) = (id.to_string(), receipt.to_vec());
        self.write(move |c| ready(commands::put_result_receipt(&Lite(c), &id, &receipt)))
            .await
    }

    async fn upgrades_unjudged(&self, limit: u32) -> Result<Vec<String>, StoreError> {
        self.read(move |c| ready(commands::upgrades_unjudged(&Lite(c), limit)))
            .await
    }

    async fn judge_upgrade_floor(
        &self,
        command_id: &str,
        believed: bool,
    ) -> Result<Option<u64>, StoreError> {
        let id = command_id.to_string();
        self.write(move |c| ready(commands::judge_upgrade_floor(&Lite(c), &id, believed)))
            .await
    }

    async fn require_hello_proofs(&self, node_id: &str, serial: &str) -> Result<bool, StoreError> {
        let (node, serial) = (node_id.to_string(), serial.to_string());
        self.write(move |c| ready(clones::require_hello_proofs(&Lite(c), &node, &serial)))
            .await
    }

    async fn quarantine_clone(
        &self,
        node_id: &str,
        serial: &str,
        alternations: u32,
        seal: SealStatement,
    ) -> Result<bool, TxError> {
        let (node, serial) = (node_id.to_string(), serial.to_string());
        self.write(move |c| {
            ready(clones::quarantine(
                &Lite(c),
                &node,
                &serial,
                alternations,
                seal,
            ))
        })
        .await
    }

    async fn delete_node(&self, node_id: &str, seal: SealStatement) -> Result<bool, StoreError> {
        let node = node_id.to_string();
        self.write(move |c| ready(nodes::delete_node(&Lite(c), &node, seal)))
            .await
    }

    async fn session(&self, node_id: &str) -> Result<Option<SessionRow>, StoreError> {
        let node = node_id.to_string();
        self.read(move |c| ready(sessions::session(&Lite(c), &node)))
            .await
    }

    async fn connected_to(&self, gateway_id: &str) -> Result<Vec<String>, StoreError> {
        let gw = gateway_id.to_string();
        self.read(move |c| ready(sessions::connected_to(&Lite(c), &gw)))
            .await
    }

    async fn leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.read(|c| ready(leases::list(&Lite(c)))).await
    }

    async fn prune_history(
        &self,
        limits: crate::reconcile::HistoryLimits,
        held: &Held,
    ) -> Result<crate::reconcile::Pruned, StoreError> {
        let held = held.clone();
        self.write(move |c| {
            ready(leases::check_held(&Lite(c), &held))?;
            ready(reconcile::prune_history(&Lite(c), limits))
        })
        .await
    }

    async fn inventory(
        &self,
        node_id: &str,
        section: &str,
    ) -> Result<Option<InventoryRow>, StoreError> {
        let (node, section) = (node_id.to_string(), section.to_string());
        self.read(move |c| ready(inventory::get(&Lite(c), &node, &section)))
            .await
    }

    async fn create_command(
        &self,
        cmd: &NewCommand,
        seal: SealCommand,
    ) -> Result<(CommandRow, bool), TxError> {
        let cmd = cmd.clone();
        self.write(move |c| ready(commands::create(&Lite(c), &cmd, seal)))
            .await
    }

    async fn get_command(&self, id: &str) -> Result<Option<CommandRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| ready(commands::row(&Lite(c), &id)))
            .await
    }

    async fn list_commands(
        &self,
        node_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<CommandRow>, StoreError> {
        let node = node_id.map(str::to_string);
        self.read(move |c| ready(commands::list(&Lite(c), node.as_deref(), limit)))
            .await
    }

    async fn cancel_pending_command(&self, id: &str, reason: &str) -> Result<bool, StoreError> {
        let (id, reason) = (id.to_string(), reason.to_string());
        self.write(move |c| ready(commands::cancel_pending(&Lite(c), &id, &reason)))
            .await
    }

    async fn update_spec(
        &self,
        node_id: &str,
        change: ChangeSpec,
        open: OpenSpec,
        seal: SealSpec,
    ) -> Result<(u64, SpecBody), TxError> {
        let node = node_id.to_string();
        self.write(move |c| ready(specs::update(&Lite(c), &node, change, open, seal)))
            .await?
            .map_err(TxError::from)
    }

    async fn specs_expiring(&self, within: Duration) -> Result<Vec<String>, StoreError> {
        self.read(move |c| ready(specs::expiring(&Lite(c), within)))
            .await
    }

    async fn signed_specs(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.read(|c| ready(specs::signed_all(&Lite(c)))).await
    }

    async fn spec_view(&self, node_id: &str) -> Result<Option<SpecView>, StoreError> {
        let node = node_id.to_string();
        self.read(move |c| ready(specs::view(&Lite(c), &node)))
            .await
    }

    async fn bindings(&self, node_id: &str) -> Result<Vec<BindingRow>, StoreError> {
        let node = node_id.to_string();
        self.read(move |c| ready(bindings::list(&Lite(c), &node)))
            .await
    }

    async fn fleet_events(&self, node_id: &str, limit: u32) -> Result<Vec<String>, StoreError> {
        let node = node_id.to_string();
        self.read(move |c| ready(bindings::fleet_events(&Lite(c), &node, limit)))
            .await
    }

    async fn list_fleet_events(
        &self,
        q: &crate::events::EventQuery,
    ) -> Result<Vec<crate::events::FleetEvent>, StoreError> {
        let q = q.clone();
        self.read(move |c| ready(bindings::list_fleet_events(&Lite(c), &q)))
            .await
    }

    async fn publish_fleet_event(
        &self,
        kind: &str,
        node_id: &str,
        detail: &str,
    ) -> Result<(), StoreError> {
        let (kind, node, detail) = (kind.to_string(), node_id.to_string(), detail.to_string());
        self.write(move |c| {
            let at = now(c)?;
            ready(bindings::fleet_event(&Lite(c), at, &kind, &node, &detail))?;
            Ok(())
        })
        .await
    }

    async fn node_events(&self, node_id: &str) -> Result<Vec<EventRow>, StoreError> {
        let node = node_id.to_string();
        self.read(move |c| ready(events::list(&Lite(c), &node)))
            .await
    }

    async fn register_release(&self, r: &NewRelease) -> Result<ReleaseRow, TxError> {
        let r = r.clone();
        self.write(move |c| ready(sql::releases::register(&Lite(c), &r)))
            .await
    }

    async fn list_releases(&self) -> Result<Vec<ReleaseRow>, StoreError> {
        self.read(|c| ready(sql::releases::list(&Lite(c)))).await
    }

    async fn register_image(&self, i: &NewImage) -> Result<bool, StoreError> {
        let i = i.clone();
        self.write(move |c| ready(images::register(&Lite(c), &i)))
            .await
    }

    async fn list_images(&self) -> Result<Vec<ImageRow>, StoreError> {
        self.read(|c| ready(images::list(&Lite(c)))).await
    }

    async fn image_manifests(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.read(|c| ready(images::manifests(&Lite(c)))).await
    }

    async fn resolve_image(&self, what: &str) -> Result<String, TxError> {
        let what = what.to_string();
        self.read(move |c| ready(images::resolve(&Lite(c), &what)))
            .await
    }

    async fn assign_image(
        &self,
        target: &str,
        image_id: Option<&str>,
        append: &str,
        mint_ttl_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        let (target, image, append) = (
            target.to_string(),
            image_id.map(str::to_string),
            append.to_string(),
        );
        self.write(move |c| {
            ready(images::assign(
                &Lite(c),
                &target,
                image.as_deref(),
                &append,
                mint_ttl_ms,
            ))
        })
        .await
    }

    async fn image_for_mac(&self, mac: &str) -> Result<Option<Assigned>, StoreError> {
        let mac = mac.to_string();
        self.read(move |c| ready(images::for_mac(&Lite(c), &mac)))
            .await
    }

    async fn mint_boot_token(&self, mac: &str, t: &NewToken) -> Result<Option<Minted>, StoreError> {
        let (mac, t) = (mac.to_string(), t.clone());
        self.write(move |c| ready(images::mint(&Lite(c), &mac, &t)))
            .await
    }

    async fn allow_boot_mac(&self, mac: &str, pool: Option<&str>) -> Result<(), StoreError> {
        let (mac, pool) = (mac.to_string(), pool.map(str::to_string));
        self.write(move |c| ready(images::allow_mac(&Lite(c), &mac, pool.as_deref())))
            .await
    }

    async fn disallow_boot_mac(&self, mac: &str) -> Result<bool, StoreError> {
        let mac = mac.to_string();
        self.write(move |c| ready(images::disallow_mac(&Lite(c), &mac)))
            .await
    }

    async fn boot_macs(&self) -> Result<Vec<AllowedMac>, StoreError> {
        self.read(|c| ready(images::allowed_macs(&Lite(c)))).await
    }

    async fn image_artifact(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let sha = sha256.to_string();
        self.read(move |c| ready(images::artifact(&Lite(c), &sha)))
            .await
    }

    async fn image_artifact_size(&self, sha256: &str) -> Result<Option<u64>, StoreError> {
        let sha = sha256.to_string();
        self.read(move |c| ready(images::artifact_size(&Lite(c), &sha)))
            .await
    }

    async fn record_boot(&self, b: &BootRecord) -> Result<(), StoreError> {
        let b = b.clone();
        self.write(move |c| ready(images::record_boot(&Lite(c), &b)))
            .await
    }

    async fn boots(&self, mac: Option<&str>, limit: u32) -> Result<Vec<BootRow>, StoreError> {
        let mac = mac.map(str::to_string);
        self.read(move |c| ready(images::boots(&Lite(c), mac.as_deref(), limit)))
            .await
    }

    async fn start_rollout(&self, r: &NewRollout) -> Result<Rollout, TxError> {
        let r = r.clone();
        self.write(move |c| ready(rollouts::start(&Lite(c), &r)))
            .await
    }

    async fn rollout(&self, id: &str) -> Result<Option<Rollout>, StoreError> {
        let id = id.to_string();
        self.read(move |c| ready(rollouts::get(&Lite(c), &id)))
            .await
    }

    async fn list_rollouts(&self) -> Result<Vec<Rollout>, StoreError> {
        self.read(|c| ready(rollouts::list(&Lite(c)))).await
    }

    async fn set_rollout_state(
        &self,
        id: &str,
        from: &[RolloutState],
        to: RolloutState,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let (id, from, reason) = (id.to_string(), from.to_vec(), reason.to_string());
        self.write(move |c| ready(rollouts::set_state(&Lite(c), &id, &from, to, &reason)))
            .await
    }

    async fn advance_rollout(
        &self,
        id: &str,
        from: usize,
        to: usize,
        held: &Held,
    ) -> Result<bool, StoreError> {
        let (id, held) = (id.to_string(), held.clone());
        self.write(move |c| {
            ready(leases::check_held(&Lite(c), &held))?;
            ready(rollouts::advance(&Lite(c), &id, from, to))
        })
        .await
    }

    async fn record_rollout_command(
        &self,
        id: &str,
        node_id: &str,
        which: RolloutCommand,
        command_id: &str,
    ) -> Result<(), StoreError> {
        let (id, node, cmd) = (id.to_string(), node_id.to_string(), command_id.to_string());
        self.write(move |c| ready(rollouts::record_command(&Lite(c), &id, &node, which, &cmd)))
            .await
    }

    async fn skip_rollout_node(
        &self,
        id: &str,
        node_id: &str,
        held: &Held,
    ) -> Result<(), StoreError> {
        let (id, node, held) = (id.to_string(), node_id.to_string(), held.clone());
        self.write(move |c| {
            ready(leases::check_held(&Lite(c), &held))?;
            ready(rollouts::skip(&Lite(c), &id, &node))
        })
        .await
    }

    async fn audit_snapshot(&self) -> Result<AuditSnapshot, StoreError> {
        self.read(|c| ready(audit::snapshot(&Lite(c)))).await
    }

    async fn audit_history(&self) -> Result<AuditHistory, StoreError> {
        self.read(|c| ready(audit::history(&Lite(c)))).await
    }

    async fn settling(&self) -> Result<Settling, StoreError> {
        self.read(|c| ready(audit::settling(&Lite(c)))).await
    }

    async fn begin_backup(&self, b: &NewBackup) -> Result<BackupRow, StoreError> {
        let b = b.clone();
        self.write(move |c| ready(backups::begin(&Lite(c), &b)))
            .await
    }

    async fn finish_backup(&self, id: &str, files: u64, bytes: u64) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |c| ready(backups::finish(&Lite(c), &id, files, bytes)))
            .await
    }

    async fn fail_backup(&self, id: &str, reason: &str) -> Result<bool, StoreError> {
        let (id, reason) = (id.to_string(), reason.to_string());
        self.write(move |c| ready(backups::fail(&Lite(c), &id, &reason)))
            .await
    }

    async fn backups(&self) -> Result<Vec<BackupRow>, StoreError> {
        self.read(|c| ready(backups::list(&Lite(c)))).await
    }

    async fn backup(&self, id: &str) -> Result<Option<BackupRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| ready(backups::get(&Lite(c), &id))).await
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

    async fn reconcile(
        &self,
        owner: &str,
        dead_after: Duration,
    ) -> Result<crate::reconcile::Reconciled, StoreError> {
        let owner = owner.to_string();
        self.write(move |c| ready(reconcile::run(&Lite(c), &owner, dead_after)))
            .await
    }
}

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
