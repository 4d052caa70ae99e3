//! The store: the only source of truth of the control plane.
//!
//! Embedded SQLite (WAL) by default. All time the store records comes from
//! its own clock, `compute_now()`; gateways hand it ages ("seen 1200 ms
//! ago"), never timestamps they computed. Writes on behalf of a session carry
//! its epoch and change nothing once a newer Hello has run (see
//! `bcd_core::epoch`).
//!
//! Methods are blocking; async callers go through [`Store::run`], which moves
//! the work to the blocking pool. Errors that reach an operator or a node are
//! [`Refusal`]s with their own wording; [`StoreError`] carries the database
//! error for logs only and is never sent to a peer.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bcd_core::command::{HelloDecision, Kind, NodeReport, ServerState, apply_result, on_hello};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// SQL for `compute_now()` in unix milliseconds.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

const MIGRATIONS: &[&str] = &[
    // 1: join, nodes, certificates, sessions, inventory, leases, operators.
    "
    CREATE TABLE join_tokens (
        id            TEXT PRIMARY KEY,
        secret_sha256 TEXT NOT NULL,
        created_at    INTEGER NOT NULL,
        expires_at    INTEGER NOT NULL,
        uses_total    INTEGER NOT NULL,
        uses_left     INTEGER NOT NULL,
        description   TEXT NOT NULL DEFAULT ''
    ) STRICT;
    CREATE TABLE nodes (
        id                  TEXT PRIMARY KEY,
        hostname            TEXT NOT NULL,
        created_at          INTEGER NOT NULL,
        deleted_at          INTEGER,
        identity_generation INTEGER NOT NULL,
        ramdisk             INTEGER NOT NULL DEFAULT 0,
        join_token          TEXT NOT NULL,
        agent_version       TEXT NOT NULL DEFAULT '',
        conditions          TEXT NOT NULL DEFAULT '[]',
        taints              TEXT NOT NULL DEFAULT '[]'
    ) STRICT;
    CREATE TABLE node_certs (
        serial              TEXT PRIMARY KEY,
        node_id             TEXT NOT NULL REFERENCES nodes(id),
        fingerprint         TEXT NOT NULL UNIQUE,
        identity_generation INTEGER NOT NULL,
        not_before          INTEGER NOT NULL,
        not_after           INTEGER NOT NULL,
        revoked_at          INTEGER,
        revoke_reason       TEXT
    ) STRICT;
    CREATE INDEX node_certs_node ON node_certs(node_id);
    CREATE TABLE node_sessions (
        node_id        TEXT PRIMARY KEY REFERENCES nodes(id),
        epoch          INTEGER NOT NULL,
        gateway_id     TEXT NOT NULL,
        state          TEXT NOT NULL CHECK (state IN ('connected', 'disconnected', 'unreachable')),
        state_since    INTEGER NOT NULL,
        disconnect_cause TEXT NOT NULL DEFAULT '',
        incarnation_id TEXT NOT NULL,
        boot_id        TEXT NOT NULL,
        journal_id     TEXT NOT NULL,
        cert_serial    TEXT NOT NULL,
        connected_at   INTEGER NOT NULL,
        last_seen      INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX node_sessions_gateway ON node_sessions(gateway_id, state);
    CREATE TABLE inventory (
        node_id    TEXT NOT NULL REFERENCES nodes(id),
        section    TEXT NOT NULL,
        sha256     TEXT NOT NULL,
        body       BLOB,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (node_id, section)
    ) STRICT;
    CREATE TABLE leases (
        name       TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        renewed_at INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE operators (
        id           TEXT PRIMARY KEY,
        token_sha256 TEXT NOT NULL UNIQUE,
        created_at   INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE controller_state (
        name  TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) STRICT;
    ",
    // 2: commands.
    "
    ALTER TABLE nodes ADD COLUMN next_seq INTEGER NOT NULL DEFAULT 1;
    CREATE TABLE commands (
        id               TEXT PRIMARY KEY,
        node_id          TEXT NOT NULL REFERENCES nodes(id),
        seq              INTEGER NOT NULL,
        kind             TEXT NOT NULL,
        summary          TEXT NOT NULL,
        signed           BLOB NOT NULL,
        not_after        INTEGER NOT NULL,
        min_generation   INTEGER NOT NULL DEFAULT 0,
        idempotency_key  TEXT UNIQUE,
        state            TEXT NOT NULL,
        epoch            INTEGER NOT NULL DEFAULT 0,
        created_at       INTEGER NOT NULL,
        updated_at       INTEGER NOT NULL,
        reason           TEXT NOT NULL DEFAULT '',
        exit_code        INTEGER,
        output           BLOB,
        output_truncated INTEGER NOT NULL DEFAULT 0,
        result_at        INTEGER,
        UNIQUE (node_id, seq)
    ) STRICT;
    CREATE INDEX commands_node_state ON commands(node_id, state, seq);
    CREATE INDEX commands_state_deadline ON commands(state, not_after);
    ",
    // 3: node events.
    "
    CREATE TABLE node_events (
        node_id    TEXT NOT NULL REFERENCES nodes(id),
        journal_id TEXT NOT NULL,
        event_id   INTEGER NOT NULL,
        kind       TEXT NOT NULL,
        body       BLOB NOT NULL,
        at         INTEGER NOT NULL,
        PRIMARY KEY (node_id, journal_id, event_id)
    ) STRICT;
    ",
    // 4: desired state.
    "
    CREATE TABLE node_specs (
        node_id     TEXT PRIMARY KEY REFERENCES nodes(id),
        generation  INTEGER NOT NULL,
        signed      BLOB NOT NULL,
        assignments TEXT NOT NULL,
        updated_at  INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE node_state (
        node_id            TEXT PRIMARY KEY REFERENCES nodes(id),
        applied_generation INTEGER NOT NULL,
        sections           TEXT NOT NULL,
        reported_at        INTEGER NOT NULL
    ) STRICT;
    ",
    // 5: access in the desired state.
    "
    ALTER TABLE node_specs ADD COLUMN access TEXT NOT NULL DEFAULT '{}';
    ",
    // 6: attested bindings and the fleet's security events.
    "
    ALTER TABLE node_certs ADD COLUMN der BLOB;
    CREATE TABLE bindings (
        node_id         TEXT NOT NULL REFERENCES nodes(id),
        allocation_id   TEXT NOT NULL,
        gpus            TEXT NOT NULL,
        state           TEXT NOT NULL CHECK (state IN ('active', 'lost')),
        spec_generation INTEGER NOT NULL,
        updated_at      INTEGER NOT NULL,
        PRIMARY KEY (node_id, allocation_id)
    ) STRICT;
    CREATE TABLE binding_nonces (
        node_id TEXT NOT NULL,
        nonce   TEXT NOT NULL,
        PRIMARY KEY (node_id, nonce)
    ) STRICT;
    CREATE TABLE fleet_events (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        at      INTEGER NOT NULL,
        kind    TEXT NOT NULL,
        node_id TEXT NOT NULL,
        detail  TEXT NOT NULL
    ) STRICT;
    CREATE INDEX fleet_events_node ON fleet_events(node_id, id);
    ",
    // 7: releases.
    "
    CREATE TABLE releases (
        sequence        INTEGER PRIMARY KEY,
        version         TEXT NOT NULL,
        target          TEXT NOT NULL,
        size            INTEGER NOT NULL,
        sha256          TEXT NOT NULL,
        key_id          TEXT NOT NULL,
        signed_manifest BLOB NOT NULL,
        binary          BLOB NOT NULL,
        registered_at   INTEGER NOT NULL
    ) STRICT;
    ",
    // 8: release floors and rollouts.
    "
    ALTER TABLE nodes ADD COLUMN release_floor INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE rollouts (
        id           TEXT PRIMARY KEY,
        sequence     INTEGER NOT NULL REFERENCES releases(sequence),
        selector     TEXT NOT NULL,
        waves        TEXT NOT NULL,
        max_failures INTEGER NOT NULL,
        state        TEXT NOT NULL,
        wave         INTEGER NOT NULL,
        reason       TEXT NOT NULL DEFAULT '',
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE rollout_nodes (
        rollout_id  TEXT NOT NULL REFERENCES rollouts(id),
        node_id     TEXT NOT NULL,
        position    INTEGER NOT NULL,
        command_id  TEXT,
        rollback_id TEXT,
        skipped     INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (rollout_id, node_id)
    ) STRICT;
    ",
    // 9: the audit history the invariant checkers read (`check`). Triggers
    // record every route, liveness transition, gateway lease write, spec
    // generation, release floor and terminal command state as it commits,
    // whichever code path wrote it.
    "
    CREATE TABLE audit (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        at         INTEGER NOT NULL,
        node_id    TEXT NOT NULL,
        kind       TEXT NOT NULL,
        epoch      INTEGER NOT NULL DEFAULT 0,
        gateway_id TEXT NOT NULL DEFAULT '',
        value      INTEGER NOT NULL DEFAULT 0,
        detail     TEXT NOT NULL DEFAULT ''
    ) STRICT;
    CREATE INDEX audit_node ON audit(node_id, id);
    CREATE TRIGGER audit_route_new AFTER INSERT ON node_sessions BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'route',
                NEW.epoch, NEW.gateway_id, NEW.last_seen);
    END;
    CREATE TRIGGER audit_route AFTER UPDATE OF epoch, gateway_id ON node_sessions
    WHEN NEW.epoch != OLD.epoch OR NEW.gateway_id != OLD.gateway_id BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'route',
                NEW.epoch, NEW.gateway_id, NEW.last_seen);
    END;
    CREATE TRIGGER audit_liveness AFTER UPDATE OF state ON node_sessions
    WHEN NEW.state != OLD.state AND NEW.state != 'connected' BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value, detail)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, NEW.state,
                NEW.epoch, NEW.gateway_id, NEW.last_seen, NEW.disconnect_cause);
    END;
    CREATE TRIGGER audit_lease_new AFTER INSERT ON leases WHEN NEW.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), '', 'lease', NEW.owner,
                NEW.expires_at);
    END;
    CREATE TRIGGER audit_lease AFTER UPDATE ON leases WHEN NEW.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), '', 'lease', NEW.owner,
                NEW.expires_at);
    END;
    CREATE TRIGGER audit_lease_gone AFTER DELETE ON leases WHEN OLD.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), '', 'lease', OLD.owner, 0);
    END;
    CREATE TRIGGER audit_generation_new AFTER INSERT ON node_specs BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'generation',
                NEW.generation);
    END;
    CREATE TRIGGER audit_generation AFTER UPDATE OF generation ON node_specs
    WHEN NEW.generation != OLD.generation BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'generation',
                NEW.generation);
    END;
    CREATE TRIGGER audit_floor AFTER UPDATE OF release_floor ON nodes
    WHEN NEW.release_floor != OLD.release_floor BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.id, 'floor',
                NEW.release_floor);
    END;
    CREATE TRIGGER audit_result AFTER UPDATE OF state ON commands
    WHEN NEW.state != OLD.state
        AND NEW.state IN ('succeeded', 'failed', 'expired', 'rejected') BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, detail)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'result',
                NEW.epoch, json_object('command', NEW.id, 'kind', NEW.kind,
                    'from', OLD.state, 'state', NEW.state, 'reason', NEW.reason));
    END;
    CREATE TRIGGER audit_binding AFTER UPDATE OF state ON bindings
    WHEN NEW.state != OLD.state BEGIN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'binding',
                json_object('allocation', NEW.allocation_id, 'state', NEW.state));
    END;
    CREATE TRIGGER audit_binding_gone AFTER DELETE ON bindings BEGIN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), OLD.node_id, 'binding',
                json_object('allocation', OLD.allocation_id, 'state', 'deleted'));
    END;
    ",
    // 10: netboot images, their artifacts, assignments and recorded boots.
    crate::images::MIGRATION,
];

/// A release's signed manifest and its binary.
pub type ReleaseFiles = (Vec<u8>, Vec<u8>);

/// A registered release, without its binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRow {
    pub version: String,
    pub sequence: u64,
    pub target: String,
    pub size: u64,
    pub sha256: String,
    pub key_id: String,
    pub registered_at_ms: i64,
}

/// What became of a binding report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingOutcome {
    Accepted,
    /// Refused; the reason is recorded as `reservation.binding-rejected`.
    Rejected(String),
    /// Refused, and the active binding it tried to replace is now lost.
    MarkedLost(String),
}

/// A binding as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingRow {
    pub allocation_id: String,
    pub gpus: Vec<String>,
    pub state: String,
    pub spec_generation: u64,
}

/// Who may log in and the firewall table, as the store keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Access {
    #[serde(default)]
    pub users: Vec<AccessUser>,
    #[serde(default)]
    pub trusted_user_ca_keys: Vec<String>,
    #[serde(default)]
    pub firewall: Option<Firewall>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AccessUser {
    pub name: String,
    #[serde(default)]
    pub authorized_keys: Vec<String>,
    #[serde(default)]
    pub principals: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Firewall {
    #[serde(default)]
    pub rules: Vec<FirewallRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FirewallRule {
    pub protocol: String,
    pub port: u32,
    #[serde(default)]
    pub source: String,
    pub action: String,
}

/// Everything a NodeSpec says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecBody {
    pub assignments: Vec<Assignment>,
    pub access: Access,
}

/// GPUs bound to one allocation, as the store keeps them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    pub allocation_id: String,
    pub gpus: Vec<String>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// A section of a node's state report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SectionRow {
    pub section: String,
    pub status: String,
    pub message: String,
    /// When the section last changed, derived from the node's age.
    pub since_ms: i64,
}

/// Desired against applied, for `nodes spec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecView {
    pub desired_generation: u64,
    pub assignments: Vec<Assignment>,
    pub access: Access,
    pub applied_generation: u64,
    pub sections: Vec<SectionRow>,
    pub reported_age_ms: Option<i64>,
    pub now_ms: i64,
}

/// Events kept per node; older ones are trimmed as new ones arrive.
pub const EVENTS_KEPT_PER_NODE: i64 = 10_000;

/// An event as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub journal_id: String,
    pub event_id: u64,
    pub kind: String,
    pub body: Vec<u8>,
    pub at_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store")]
    Sql(#[from] rusqlite::Error),
    #[error("the store task failed")]
    Task(#[from] tokio::task::JoinError),
    #[error(
        "store schema version {found} is newer than this binary knows ({known}): run a newer better-compute"
    )]
    TooNew { found: usize, known: usize },
}

/// A request the store turns down, worded for the peer that made it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the join token is not known to this server: create one with better-compute tokens create"
    )]
    UnknownToken,
    #[error("the join token expired: create a new one with better-compute tokens create")]
    ExpiredToken,
    #[error(
        "the join token was already used: create a new one with better-compute tokens create (--uses N for several nodes)"
    )]
    UsedToken,
    #[error(
        "node {0} is not known to this server: join again: bcd join --reset --yes, then bcd join"
    )]
    UnknownNode(String),
    #[error(
        "this node certificate is not known to this server: join again: bcd join --reset --yes, then bcd join"
    )]
    UnknownCertificate,
    #[error("node {0} was deleted: join again: bcd join --reset --yes, then bcd join")]
    DeletedNode(String),
    #[error(
        "this certificate does not belong to node {0}: join again: bcd join --reset --yes, then bcd join"
    )]
    WrongCertificate(String),
    #[error(
        "the node certificate was revoked ({0}): join again: bcd join --reset --yes, then bcd join"
    )]
    Revoked(String),
    #[error("certificate expired; renew and reconnect")]
    Expired,
    #[error("{0}")]
    BadRequest(String),
    #[error("no node {0}: see better-compute nodes list")]
    NoSuchNode(String),
    /// The gateway no longer holds its lease; it fences itself.
    #[error("gateway {0} does not hold its lease; reconnect")]
    Fenced(String),
    /// Logged in full; the peer sees only that the server failed.
    #[error("internal: {0}")]
    Internal(String),
}

/// Either a refusal for the peer or a store failure for the logs.
#[derive(Debug, thiserror::Error)]
pub enum TxError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        TxError::Store(StoreError::Sql(e))
    }
}

#[derive(Debug, Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
}

#[derive(Debug)]
pub struct NewToken<'a> {
    pub id: &'a str,
    pub secret_sha256: &'a str,
    pub ttl: Duration,
    pub uses: u32,
    pub description: &'a str,
}

/// The certificate a join issues, decided before the transaction.
#[derive(Debug)]
pub struct IssuedCert {
    pub der: Vec<u8>,
    pub serial: String,
    pub fingerprint: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
}

/// A command ready to send: its id, sequence and signed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    pub id: String,
    pub seq: u64,
    pub signed: Vec<u8>,
}

/// A command as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRow {
    pub id: String,
    pub node_id: String,
    pub seq: u64,
    pub kind: String,
    pub summary: String,
    pub state: String,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub output: Vec<u8>,
    pub output_truncated: bool,
    pub created_at_ms: i64,
    pub not_after_ms: i64,
    pub result_at_ms: Option<i64>,
    pub epoch: u64,
}

/// What a new command is.
#[derive(Debug)]
pub struct NewCommand<'a> {
    pub node_id: &'a str,
    pub kind: bcd_core::command::Kind,
    pub summary: &'a str,
    /// Relative deadline from the store's now.
    pub not_after: Duration,
    pub min_generation: u64,
    pub idempotency_key: Option<&'a str>,
}

/// A result reported by a node.
#[derive(Debug, Clone)]
pub struct ResultInput {
    pub command_id: String,
    pub outcome: bcd_core::command::Outcome,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub output: Vec<u8>,
    pub output_truncated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultApplied {
    /// The command is now terminal with this result.
    Applied,
    /// It was terminal already; the first result stands.
    Duplicate,
    /// No such command for this node.
    Unknown,
}

#[derive(Debug)]
pub struct HelloInput {
    pub node_id: String,
    pub cert_fingerprint: String,
    pub cert_serial: String,
    pub gateway_id: String,
    pub incarnation_id: String,
    pub boot_id: String,
    pub journal_id: String,
    pub agent_version: String,
    pub release_floor: u64,
    pub last_epoch: u64,
    pub inventory_hashes: Vec<(String, String)>,
    pub journal_running: Vec<String>,
    pub journal_done: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloOutcome {
    pub epoch: u64,
    pub server_time_ms: i64,
    pub inventory_wanted: Vec<String>,
    /// In-flight commands to send again, in sequence order.
    pub replay: Vec<Dispatch>,
    /// Commands the Hello finished (self-terminating after a new boot,
    /// journal lost).
    pub finished: Vec<Finished>,
    /// When the session's certificate expires; the gateway closes the
    /// session then.
    pub cert_not_after_ms: i64,
}

/// A command finished by a Hello: (id, state, reason).
pub type Finished = (String, String, String);

/// A node as `nodes list` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeRow {
    pub node_id: String,
    pub hostname: String,
    pub state: String,
    pub epoch: u64,
    pub gateway_id: String,
    pub cert_not_after_ms: i64,
    pub last_seen_age_ms: i64,
    pub boot_id: String,
    pub journal_id: String,
    pub incarnation_id: String,
    pub agent_version: String,
    pub release_floor: u64,
    pub conditions: Vec<String>,
    pub taints: Vec<String>,
}

/// What a liveness sweep changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    pub disconnected: Vec<String>,
    pub unreachable: Vec<String>,
    pub held: bool,
}

/// Liveness timings the sweep applies.
#[derive(Debug, Clone, Copy)]
pub struct LivenessRules {
    pub node_lease_ttl: Duration,
    pub gateway_loss_grace: Duration,
    pub outage_gap: Duration,
    pub outage_hold: Duration,
}

pub const CONDITION_UNREACHABLE: &str = "NodeUnreachable";
pub const TAINT_UNREACHABLE: &str = "NoSchedule:node.unreachable";

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

fn json_list(s: &str) -> Vec<String> {
    serde_json::from_str(s).unwrap_or_default()
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

impl Store {
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // Several gateway processes share the file: a writer waiting for
        // another's lock retries every 200 µs (SQLite's own busy timeout
        // backs off to 100 ms sleeps, which starves writers under load),
        // for up to 10 s.
        conn.busy_handler(Some(busy_wait))?;
        let store = Store {
            conn: Arc::new(Mutex::new(conn)),
        };
        store.migrate()?;
        Ok(store)
    }

    fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let version = version.max(0) as usize;
        if version > MIGRATIONS.len() {
            return Err(StoreError::TooNew {
                found: version,
                known: MIGRATIONS.len(),
            });
        }
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version) {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
            tx.execute_batch(m)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(())
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-applied
        // transaction (SQLite rolls it back), so a poisoned lock is usable.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs blocking store work off the async runtime.
    pub async fn run<T, E>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| E::from(StoreError::Task(e)))?
    }

    /// `compute_now()`: the store's clock, unix milliseconds.
    pub fn now(&self) -> Result<i64, StoreError> {
        Ok(self
            .lock()
            .query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?)
    }

    // ------------------------------------------------------------ operators

    pub fn add_operator(&self, id: &str, token_sha256: &str) -> Result<(), StoreError> {
        self.lock().execute(
            &format!("INSERT INTO operators (id, token_sha256, created_at) VALUES (?1, ?2, {NOW})"),
            params![id, token_sha256],
        )?;
        Ok(())
    }

    pub fn operator_by_token(&self, token_sha256: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT id FROM operators WHERE token_sha256 = ?1",
                [token_sha256],
                |r| r.get(0),
            )
            .optional()?)
    }

    // ---------------------------------------------------------------- tokens

    /// Returns the expiry in store time.
    pub fn create_token(&self, t: &NewToken<'_>) -> Result<i64, StoreError> {
        Ok(self.lock().query_row(
            &format!(
                "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total, uses_left, description)
                 VALUES (?1, ?2, {NOW}, {NOW} + ?3, ?4, ?4, ?5) RETURNING expires_at"
            ),
            params![t.id, t.secret_sha256, ms(t.ttl), t.uses, t.description],
            |r| r.get(0),
        )?)
    }

    /// Checks and spends one use of a token, creates the node and records
    /// its certificate, in one transaction. `issue` builds the certificate
    /// once the token is known good, from the store's now.
    pub fn join(
        &self,
        token_id: &str,
        secret_sha256: &str,
        hostname: &str,
        ramdisk: bool,
        issue: impl FnOnce(&str, i64) -> Result<IssuedCert, TxError>,
    ) -> Result<(String, IssuedCert, i64), TxError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now: i64 = tx.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let row: Option<(String, i64, i64)> = tx
            .query_row(
                "SELECT secret_sha256, expires_at, uses_left FROM join_tokens WHERE id = ?1",
                [token_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((hash, expires_at, uses_left)) = row else {
            return Err(Refusal::UnknownToken.into());
        };
        if hash != secret_sha256 {
            return Err(Refusal::UnknownToken.into());
        }
        if expires_at < now {
            return Err(Refusal::ExpiredToken.into());
        }
        if uses_left <= 0 {
            return Err(Refusal::UsedToken.into());
        }
        tx.execute(
            "UPDATE join_tokens SET uses_left = uses_left - 1 WHERE id = ?1",
            [token_id],
        )?;
        let node_id = format!("nd-{:012x}", rand::random::<u64>() >> 16);
        let cert = issue(&node_id, now)?;
        tx.execute(
            "INSERT INTO nodes (id, hostname, created_at, identity_generation, ramdisk, join_token)
             VALUES (?1, ?2, ?3, 1, ?4, ?5)",
            params![node_id, hostname, now, ramdisk, token_id],
        )?;
        tx.execute(
            "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
             VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6)",
            params![cert.serial, node_id, cert.fingerprint, cert.not_before_ms, cert.not_after_ms, cert.der],
        )?;
        tx.commit()?;
        Ok((node_id, cert, now))
    }

    /// Issues a next certificate to a node that proved its current one.
    /// `issue` gets the node id, the store's now and whether the node boots
    /// from a ramdisk.
    pub fn renew(
        &self,
        fingerprint: &str,
        issue: impl FnOnce(&str, i64, bool) -> Result<IssuedCert, TxError>,
    ) -> Result<(String, IssuedCert, i64), TxError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (node_id, _, _) = check_cert(&tx, fingerprint)?;
        let now: i64 = tx.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let (ramdisk, generation): (bool, i64) = tx.query_row(
            "SELECT ramdisk, identity_generation FROM nodes WHERE id = ?1",
            [&node_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let cert = issue(&node_id, now, ramdisk)?;
        tx.execute(
            "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![cert.serial, node_id, cert.fingerprint, generation, cert.not_before_ms, cert.not_after_ms, cert.der],
        )?;
        tx.commit()?;
        Ok((node_id, cert, now))
    }

    /// The node a certificate belongs to, if it is valid now.
    pub fn check_cert(&self, fingerprint: &str) -> Result<(String, String, i64), TxError> {
        let conn = self.lock();
        check_cert(&conn, fingerprint)
    }

    // -------------------------------------------------------------- sessions

    /// The Hello transaction: checks the node and its certificate, bumps the
    /// epoch, routes the node to this gateway.
    pub fn hello(&self, h: &HelloInput) -> Result<HelloOutcome, TxError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (cert_node, serial, cert_not_after_ms) = check_cert(&tx, &h.cert_fingerprint)?;
        if cert_node != h.node_id || serial != h.cert_serial {
            return Err(Refusal::WrongCertificate(h.node_id.clone()).into());
        }
        let now: i64 = tx.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        // The routing transaction's fence: this gateway must hold its lease
        // now. A lease that moved or ran out aborts the route (the gateway
        // then fences itself).
        let held: Option<i64> = tx
            .query_row(
                "SELECT expires_at FROM leases WHERE name = 'gateway:' || ?1 AND owner = ?1",
                [&h.gateway_id],
                |r| r.get(0),
            )
            .optional()?;
        if held.is_none_or(|expires| expires < now) {
            return Err(Refusal::Fenced(h.gateway_id.clone()).into());
        }
        let prev: Option<(i64, String, String)> = tx
            .query_row(
                "SELECT epoch, journal_id, boot_id FROM node_sessions WHERE node_id = ?1",
                [&h.node_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let stored = prev.as_ref().map_or(0, |p| p.0 as u64);
        let epoch = bcd_core::epoch::next_epoch(stored, h.last_epoch);
        tx.execute(
            "INSERT INTO node_sessions (node_id, epoch, gateway_id, state, state_since, disconnect_cause,
                 incarnation_id, boot_id, journal_id, cert_serial, connected_at, last_seen)
             VALUES (?1, ?2, ?3, 'connected', ?4, '', ?5, ?6, ?7, ?8, ?4, ?4)
             ON CONFLICT (node_id) DO UPDATE SET
                 epoch = excluded.epoch, gateway_id = excluded.gateway_id, state = 'connected',
                 state_since = excluded.state_since, disconnect_cause = '',
                 incarnation_id = excluded.incarnation_id, boot_id = excluded.boot_id,
                 journal_id = excluded.journal_id, cert_serial = excluded.cert_serial,
                 connected_at = excluded.connected_at, last_seen = excluded.last_seen",
            params![
                h.node_id,
                epoch as i64,
                h.gateway_id,
                now,
                h.incarnation_id,
                h.boot_id,
                h.journal_id,
                h.cert_serial
            ],
        )?;
        // A node that is back is reachable again.
        let (conditions, taints): (String, String) = tx.query_row(
            "SELECT conditions, taints FROM nodes WHERE id = ?1",
            [&h.node_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let conditions = without(&conditions, CONDITION_UNREACHABLE);
        let taints = without(&taints, TAINT_UNREACHABLE);
        tx.execute(
            "UPDATE nodes SET agent_version = ?2, conditions = ?3, taints = ?4,
                 release_floor = MAX(release_floor, ?5) WHERE id = ?1",
            params![
                h.node_id,
                h.agent_version,
                conditions,
                taints,
                h.release_floor as i64
            ],
        )?;
        let mut wanted = Vec::new();
        {
            let mut q = tx.prepare_cached(
                "SELECT sha256 FROM inventory WHERE node_id = ?1 AND section = ?2",
            )?;
            for (section, sha) in &h.inventory_hashes {
                let known: Option<String> = q
                    .query_row(params![h.node_id, section], |r| r.get(0))
                    .optional()?;
                if known.as_deref() != Some(sha.as_str()) {
                    wanted.push(section.clone());
                }
            }
        }
        let new_journal = prev.as_ref().is_some_and(|p| p.1 != h.journal_id);
        let new_boot = prev.as_ref().is_some_and(|p| p.2 != h.boot_id);
        let (replay, finished) = settle_in_flight(&tx, h, epoch, now, new_journal, new_boot)?;
        tx.commit()?;
        Ok(HelloOutcome {
            epoch,
            server_time_ms: now,
            inventory_wanted: wanted,
            replay,
            finished,
            cert_not_after_ms,
        })
    }

    /// Marks a session disconnected, if `epoch` is still its current epoch.
    /// Returns whether it applied.
    pub fn disconnect(
        &self,
        node_id: &str,
        epoch: u64,
        seen_age: Duration,
        cause: &str,
    ) -> Result<bool, StoreError> {
        let n = self.lock().execute(
            &format!(
                "UPDATE node_sessions SET state = 'disconnected', state_since = {NOW},
                     disconnect_cause = ?3, last_seen = MAX(last_seen, {NOW} - ?4)
                 WHERE node_id = ?1 AND epoch = ?2 AND state = 'connected'"
            ),
            params![node_id, epoch as i64, cause, ms(seen_age)],
        )?;
        Ok(n == 1)
    }

    /// Records, for each of a gateway's sessions, that the node was seen
    /// `age` ago. Returns the sessions that are no longer current (a newer
    /// Hello ran elsewhere): the gateway must close them.
    pub fn flush_liveness(
        &self,
        gateway_id: &str,
        seen: &[(String, u64, Duration)],
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut gone = Vec::new();
        {
            let mut q = tx.prepare_cached(&format!(
                "UPDATE node_sessions SET last_seen = MAX(last_seen, {NOW} - ?4)
                 WHERE node_id = ?1 AND epoch = ?2 AND gateway_id = ?3 AND state = 'connected'"
            ))?;
            for (node, epoch, age) in seen {
                if q.execute(params![node, *epoch as i64, gateway_id, ms(*age)])? == 0 {
                    gone.push((node.clone(), *epoch));
                }
            }
        }
        tx.commit()?;
        Ok(gone)
    }

    pub fn put_inventory(
        &self,
        node_id: &str,
        epoch: u64,
        section: &str,
        sha256: &str,
        body: &[u8],
    ) -> Result<bool, StoreError> {
        let conn = self.lock();
        let current: Option<i64> = conn
            .query_row(
                "SELECT epoch FROM node_sessions WHERE node_id = ?1",
                [node_id],
                |r| r.get(0),
            )
            .optional()?;
        if !current.is_some_and(|c| bcd_core::epoch::write_applies(c as u64, epoch)) {
            return Ok(false);
        }
        conn.execute(
            &format!(
                "INSERT INTO inventory (node_id, section, sha256, body, updated_at)
                 VALUES (?1, ?2, ?3, ?4, {NOW})
                 ON CONFLICT (node_id, section) DO UPDATE SET
                     sha256 = excluded.sha256, body = excluded.body, updated_at = excluded.updated_at"
            ),
            params![node_id, section, sha256, body],
        )?;
        Ok(true)
    }

    // -------------------------------------------------------------- commands

    /// Creates a command: assigns the node's next sequence number, lets
    /// `seal` sign the payload (id, seq, store now, absolute deadline), and
    /// stores the signed bytes. A repeated idempotency key returns the first
    /// command instead.
    pub fn create_command(
        &self,
        c: &NewCommand<'_>,
        seal: impl FnOnce(&str, u64, i64, i64) -> Vec<u8>,
    ) -> Result<(CommandRow, bool), TxError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(key) = c.idempotency_key {
            let existing: Option<String> = tx
                .query_row(
                    "SELECT id FROM commands WHERE idempotency_key = ?1",
                    [key],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(id) = existing {
                let row = command_row(&tx, &id)?.expect("the command exists");
                if row.node_id != c.node_id || row.kind != c.kind.name() {
                    return Err(Refusal::BadRequest(format!(
                        "idempotency key {key:?} was used for command {id} ({} on {}); use a new key",
                        row.kind, row.node_id
                    ))
                    .into());
                }
                return Ok((row, false));
            }
        }
        let node: Option<(Option<i64>, i64)> = tx
            .query_row(
                "SELECT deleted_at, next_seq FROM nodes WHERE id = ?1",
                [c.node_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let seq = match node {
            Some((None, seq)) => seq as u64,
            _ => return Err(Refusal::NoSuchNode(c.node_id.to_string()).into()),
        };
        let now: i64 = tx.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let not_after = now + ms(c.not_after);
        let id = format!("cmd-{:016x}", rand::random::<u64>());
        let signed = seal(&id, seq, now, not_after);
        tx.execute(
            "UPDATE nodes SET next_seq = next_seq + 1 WHERE id = ?1",
            [c.node_id],
        )?;
        tx.execute(
            "INSERT INTO commands (id, node_id, seq, kind, summary, signed, not_after, min_generation,
                 idempotency_key, state, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'pending', ?10, ?10)",
            params![
                id,
                c.node_id,
                seq as i64,
                c.kind.name(),
                c.summary,
                signed,
                not_after,
                c.min_generation as i64,
                c.idempotency_key,
                now
            ],
        )?;
        let row = command_row(&tx, &id)?.expect("just inserted");
        tx.commit()?;
        Ok((row, true))
    }

    pub fn get_command(&self, id: &str) -> Result<Option<CommandRow>, StoreError> {
        Ok(command_row(&self.lock(), id)?)
    }

    pub fn list_commands(
        &self,
        node_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<CommandRow>, StoreError> {
        let conn = self.lock();
        let mut q = conn.prepare(&format!(
            "SELECT {COMMAND_COLUMNS} FROM commands
             WHERE (?1 IS NULL OR node_id = ?1) ORDER BY created_at DESC, seq DESC LIMIT ?2"
        ))?;
        let rows = q
            .query_map(params![node_id, limit], read_command)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Pending commands of a node routed to this gateway under this epoch,
    /// marked dispatched, in sequence order. Dispatch is a join on the
    /// node's current route: a node that moved gets nothing here. A command
    /// whose `min_generation` the node has not applied yet waits, and so do
    /// the commands after it, so the node still sees sequence order.
    pub fn take_dispatchable(
        &self,
        gateway_id: &str,
        node_id: &str,
        epoch: u64,
    ) -> Result<Vec<Dispatch>, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out: Vec<Dispatch> = {
            let applied: i64 = tx
                .query_row(
                    "SELECT applied_generation FROM node_state WHERE node_id = ?1",
                    [node_id],
                    |r| r.get(0),
                )
                .optional()?
                .unwrap_or(0);
            let mut q = tx.prepare_cached(
                "SELECT c.id, c.seq, c.signed, c.min_generation FROM commands c
                 JOIN node_sessions s ON s.node_id = c.node_id
                 WHERE c.node_id = ?1 AND c.state = 'pending'
                   AND s.gateway_id = ?2 AND s.epoch = ?3 AND s.state = 'connected'
                 ORDER BY c.seq",
            )?;
            let rows = q
                .query_map(params![node_id, gateway_id, epoch as i64], |r| {
                    Ok((
                        Dispatch {
                            id: r.get(0)?,
                            seq: r.get::<_, i64>(1)? as u64,
                            signed: r.get(2)?,
                        },
                        r.get::<_, i64>(3)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .take_while(|(_, min_generation)| *min_generation <= applied)
                .map(|(d, _)| d)
                .collect()
        };
        for d in &out {
            tx.execute(
                &format!(
                    "UPDATE commands SET state = 'dispatched', epoch = ?2, updated_at = {NOW}
                     WHERE id = ?1 AND state = 'pending'"
                ),
                params![d.id, epoch as i64],
            )?;
        }
        tx.commit()?;
        Ok(out)
    }

    /// The node acknowledged a dispatch (ACCEPTED) or reported it running.
    pub fn command_ack(&self, node_id: &str, id: &str, running: bool) -> Result<bool, StoreError> {
        let n = self.lock().execute(
            &format!(
                "UPDATE commands SET state = ?3, updated_at = {NOW}
                 WHERE id = ?1 AND node_id = ?2
                   AND state IN ('pending', 'dispatched', 'acked', 'running')"
            ),
            params![id, node_id, if running { "running" } else { "acked" }],
        )?;
        Ok(n == 1)
    }

    /// Applies a result: the first terminal result wins, from any epoch.
    pub fn command_result(
        &self,
        node_id: &str,
        r: &ResultInput,
    ) -> Result<ResultApplied, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let state: Option<String> = tx
            .query_row(
                "SELECT state FROM commands WHERE id = ?1 AND node_id = ?2",
                params![r.command_id, node_id],
                |row| row.get(0),
            )
            .optional()?;
        let Some(state) = state.and_then(|s| ServerState::parse(&s)) else {
            return Ok(ResultApplied::Unknown);
        };
        let Some(next) = apply_result(state, r.outcome) else {
            return Ok(ResultApplied::Duplicate);
        };
        tx.execute(
            &format!(
                "UPDATE commands SET state = ?2, reason = ?3, exit_code = ?4, output = ?5,
                     output_truncated = ?6, result_at = {NOW}, updated_at = {NOW}
                 WHERE id = ?1"
            ),
            params![
                r.command_id,
                next.name(),
                r.reason,
                r.exit_code,
                r.output,
                r.output_truncated
            ],
        )?;
        // A confirmed upgrade raised the node's floor to its release (the
        // node reports it in its next Hello as well).
        if next == ServerState::Terminal(bcd_core::command::Outcome::Succeeded) {
            let (kind, summary): (String, String) = tx.query_row(
                "SELECT kind, summary FROM commands WHERE id = ?1",
                [&r.command_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )?;
            if let Some(seq) = (kind == bcd_core::command::Kind::DaemonUpgrade.name())
                .then(|| summary.strip_prefix("release ")?.parse::<i64>().ok())
                .flatten()
            {
                tx.execute(
                    "UPDATE nodes SET release_floor = MAX(release_floor, ?2) WHERE id = ?1",
                    params![node_id, seq],
                )?;
            }
        }
        tx.commit()?;
        Ok(ResultApplied::Applied)
    }

    /// Expires pending commands past their deadline (never one a node may
    /// hold: those are rejected EXPIRED by the node itself). Returns them.
    pub fn sweep_commands(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let mut q = conn.prepare(&format!(
            "UPDATE commands SET state = 'expired', reason = 'not_after passed before dispatch',
                 result_at = {NOW}, updated_at = {NOW}
             WHERE state = 'pending' AND not_after < {NOW} RETURNING id"
        ))?;
        let ids = q
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(ids)
    }

    // ---------------------------------------------------------- desired state

    /// Changes a node's spec: `change` edits the assignments (or refuses),
    /// the generation grows by one, and `seal` signs the new spec.
    pub fn update_spec(
        &self,
        node_id: &str,
        change: impl FnOnce(&mut SpecBody) -> Result<(), Refusal>,
        seal: impl FnOnce(u64, i64, &SpecBody) -> Vec<u8>,
    ) -> Result<(u64, SpecBody), TxError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let deleted: Option<Option<i64>> = tx
            .query_row(
                "SELECT deleted_at FROM nodes WHERE id = ?1",
                [node_id],
                |r| r.get(0),
            )
            .optional()?;
        if !matches!(deleted, Some(None)) {
            return Err(Refusal::NoSuchNode(node_id.to_string()).into());
        }
        let current: Option<(i64, String, String)> = tx
            .query_row(
                "SELECT generation, assignments, access FROM node_specs WHERE node_id = ?1",
                [node_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (generation, mut body) = match current {
            Some((g, a, acc)) => (
                g as u64,
                SpecBody {
                    assignments: serde_json::from_str(&a).unwrap_or_default(),
                    access: serde_json::from_str(&acc).unwrap_or_default(),
                },
            ),
            None => (0, SpecBody::default()),
        };
        change(&mut body)?;
        let now: i64 = tx.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let next = generation + 1;
        let signed = seal(next, now, &body);
        tx.execute(
            "INSERT INTO node_specs (node_id, generation, signed, assignments, access, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (node_id) DO UPDATE SET generation = excluded.generation,
                 signed = excluded.signed, assignments = excluded.assignments,
                 access = excluded.access, updated_at = excluded.updated_at",
            params![
                node_id,
                next as i64,
                signed,
                serde_json::to_string(&body.assignments).expect("assignments serialize"),
                serde_json::to_string(&body.access).expect("access serializes"),
                now
            ],
        )?;
        tx.commit()?;
        Ok((next, body))
    }

    /// The signed spec to send a node, if it has one.
    pub fn signed_spec(&self, node_id: &str) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT generation, signed FROM node_specs WHERE node_id = ?1",
                [node_id],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)),
            )
            .optional()?)
    }

    /// Records a node's state report. Reports are facts: accepted from any
    /// epoch; an applied generation never moves backward unless the node
    /// reports 0 (a new journal).
    pub fn put_state_report(
        &self,
        node_id: &str,
        applied_generation: u64,
        sections: &[(String, String, String, u64)],
    ) -> Result<(), StoreError> {
        let conn = self.lock();
        let now: i64 = conn.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let rows: Vec<SectionRow> = sections
            .iter()
            .map(|(section, status, message, age)| SectionRow {
                section: section.clone(),
                status: status.clone(),
                message: message.clone(),
                since_ms: now - (*age).min(i64::MAX as u64) as i64,
            })
            .collect();
        conn.execute(
            "INSERT INTO node_state (node_id, applied_generation, sections, reported_at)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (node_id) DO UPDATE SET
                 applied_generation = CASE WHEN excluded.applied_generation = 0 THEN 0
                     ELSE MAX(node_state.applied_generation, excluded.applied_generation) END,
                 sections = excluded.sections, reported_at = excluded.reported_at",
            params![
                node_id,
                applied_generation as i64,
                serde_json::to_string(&rows).expect("sections serialize"),
                now
            ],
        )?;
        Ok(())
    }

    pub fn spec_view(&self, node_id: &str) -> Result<Option<SpecView>, StoreError> {
        let conn = self.lock();
        let exists: Option<Option<i64>> = conn
            .query_row(
                "SELECT deleted_at FROM nodes WHERE id = ?1",
                [node_id],
                |r| r.get(0),
            )
            .optional()?;
        if !matches!(exists, Some(None)) {
            return Ok(None);
        }
        let now: i64 = conn.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let (desired_generation, assignments, access) = conn
            .query_row(
                "SELECT generation, assignments, access FROM node_specs WHERE node_id = ?1",
                [node_id],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)? as u64,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                },
            )
            .optional()?
            .map(|(g, a, acc)| {
                (
                    g,
                    serde_json::from_str(&a).unwrap_or_default(),
                    serde_json::from_str(&acc).unwrap_or_default(),
                )
            })
            .unwrap_or((0, Vec::new(), Access::default()));
        let state: Option<(i64, String, i64)> = conn
            .query_row(
                "SELECT applied_generation, sections, reported_at FROM node_state WHERE node_id = ?1",
                [node_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        Ok(Some(SpecView {
            desired_generation,
            assignments,
            access,
            applied_generation: state.as_ref().map_or(0, |s| s.0 as u64),
            sections: state
                .as_ref()
                .map(|s| serde_json::from_str(&s.1).unwrap_or_default())
                .unwrap_or_default(),
            reported_age_ms: state.map(|s| now - s.2),
            now_ms: now,
        }))
    }

    // ------------------------------------------------------------- bindings

    /// Judges a node's signed binding report against the node's current
    /// certificate (never the session it came on: a gateway can forge a
    /// relay but not a signature). `session_node` is the node the stream
    /// belongs to.
    pub fn record_binding(
        &self,
        session_node: &str,
        payload: &[u8],
        signature: &[u8],
    ) -> Result<BindingOutcome, StoreError> {
        use prost::Message;
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now: i64 = tx.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let event = |tx: &Connection, kind: &str, detail: &str| -> rusqlite::Result<()> {
            tx.execute(
                "INSERT INTO fleet_events (at, kind, node_id, detail) VALUES (?1, ?2, ?3, ?4)",
                params![now, kind, session_node, detail],
            )?;
            Ok(())
        };
        let p = match bcd_proto::v1::BindingPayload::decode(payload) {
            Ok(p) => p,
            Err(_) => {
                let reason = "malformed binding report".to_string();
                event(&tx, "reservation.binding-rejected", &reason)?;
                tx.commit()?;
                return Ok(BindingOutcome::Rejected(reason));
            }
        };
        let verdict: Result<(), String> = (|| {
            if p.node_id != session_node {
                return Err(format!(
                    "report for node {} on node {session_node}'s session",
                    p.node_id
                ));
            }
            if signature.is_empty() {
                return Err("unsigned report".into());
            }
            let der: Option<Vec<u8>> = tx
                .query_row(
                    &format!(
                        "SELECT der FROM node_certs WHERE node_id = ?1 AND revoked_at IS NULL
                         AND not_after >= {NOW} AND der IS NOT NULL ORDER BY not_after DESC LIMIT 1"
                    ),
                    [&p.node_id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(|e| e.to_string())?;
            let der = der.ok_or("the node has no current certificate")?;
            if crate::ca::verify_node_signature(&der, payload, signature) {
                Ok(())
            } else {
                Err("signature is not from the node's current certificate".to_string())
            }
        })();
        let existing: Option<String> = tx
            .query_row(
                "SELECT state FROM bindings WHERE node_id = ?1 AND allocation_id = ?2",
                params![session_node, p.allocation_id],
                |r| r.get(0),
            )
            .optional()?;
        if let Err(reason) = verdict {
            let reason = format!("allocation {}: {reason}", p.allocation_id);
            event(&tx, "reservation.binding-rejected", &reason)?;
            let outcome = if existing.as_deref() == Some("active") {
                tx.execute(
                    "UPDATE bindings SET state = 'lost', updated_at = ?3
                     WHERE node_id = ?1 AND allocation_id = ?2",
                    params![session_node, p.allocation_id, now],
                )?;
                event(&tx, "reservation.binding-lost", &reason)?;
                BindingOutcome::MarkedLost(reason)
            } else {
                BindingOutcome::Rejected(reason)
            };
            tx.commit()?;
            return Ok(outcome);
        }
        let fresh = tx.execute(
            "INSERT INTO binding_nonces (node_id, nonce) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![p.node_id, p.nonce],
        )? == 1;
        if !fresh || p.nonce.is_empty() {
            let reason = format!("allocation {}: replayed report", p.allocation_id);
            event(&tx, "reservation.binding-rejected", &reason)?;
            tx.commit()?;
            return Ok(BindingOutcome::Rejected(reason));
        }
        let mut gpus = p.gpu_uuids.clone();
        gpus.sort();
        tx.execute(
            "INSERT INTO bindings (node_id, allocation_id, gpus, state, spec_generation, updated_at)
             VALUES (?1, ?2, ?3, 'active', ?4, ?5)
             ON CONFLICT (node_id, allocation_id) DO UPDATE SET gpus = excluded.gpus,
                 state = 'active', spec_generation = excluded.spec_generation,
                 updated_at = excluded.updated_at",
            params![
                p.node_id,
                p.allocation_id,
                serde_json::to_string(&gpus).expect("gpus serialize"),
                p.spec_generation as i64,
                now
            ],
        )?;
        tx.commit()?;
        Ok(BindingOutcome::Accepted)
    }

    pub fn bindings(&self, node_id: &str) -> Result<Vec<BindingRow>, StoreError> {
        let conn = self.lock();
        let mut q = conn.prepare(
            "SELECT allocation_id, gpus, state, spec_generation FROM bindings
             WHERE node_id = ?1 ORDER BY allocation_id",
        )?;
        let rows = q
            .query_map([node_id], |r| {
                Ok(BindingRow {
                    allocation_id: r.get(0)?,
                    gpus: serde_json::from_str(&r.get::<_, String>(1)?).unwrap_or_default(),
                    state: r.get(2)?,
                    spec_generation: r.get::<_, i64>(3)? as u64,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// A node's recent fleet events, newest first: "kind: detail".
    pub fn fleet_events(&self, node_id: &str, limit: u32) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let mut q = conn.prepare(
            "SELECT kind, detail FROM fleet_events WHERE node_id = ?1 ORDER BY id DESC LIMIT ?2",
        )?;
        let rows = q
            .query_map(params![node_id, limit], |r| {
                Ok(format!(
                    "{}: {}",
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    // -------------------------------------------------------------- releases

    /// Stores a verified release; a sequence already registered is refused.
    pub fn register_release(
        &self,
        manifest: &release::Manifest,
        key_id: &str,
        signed_manifest: &[u8],
        binary: &[u8],
    ) -> Result<ReleaseRow, TxError> {
        let conn = self.lock();
        let n = conn.execute(
            &format!(
                "INSERT INTO releases (sequence, version, target, size, sha256, key_id,
                     signed_manifest, binary, registered_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, {NOW}) ON CONFLICT (sequence) DO NOTHING"
            ),
            params![
                manifest.sequence as i64,
                manifest.version,
                manifest.target,
                manifest.size as i64,
                manifest.sha256,
                key_id,
                signed_manifest,
                binary
            ],
        )?;
        if n == 0 {
            return Err(Refusal::BadRequest(format!(
                "release sequence {} is already registered: sign the new release with a higher --sequence",
                manifest.sequence
            ))
            .into());
        }
        Ok(self
            .list_releases_locked(&conn)?
            .into_iter()
            .find(|r| r.sequence == manifest.sequence)
            .expect("just registered"))
    }

    /// A release's signed manifest and binary.
    pub fn release(&self, sequence: u64) -> Result<Option<ReleaseFiles>, StoreError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT signed_manifest, binary FROM releases WHERE sequence = ?1",
                [sequence as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    pub fn list_releases(&self) -> Result<Vec<ReleaseRow>, StoreError> {
        let conn = self.lock();
        Ok(self.list_releases_locked(&conn)?)
    }

    fn list_releases_locked(&self, conn: &Connection) -> rusqlite::Result<Vec<ReleaseRow>> {
        let mut q = conn.prepare(
            "SELECT version, sequence, target, size, sha256, key_id, registered_at
             FROM releases ORDER BY sequence DESC",
        )?;
        q.query_map([], |r| {
            Ok(ReleaseRow {
                version: r.get(0)?,
                sequence: r.get::<_, i64>(1)? as u64,
                target: r.get(2)?,
                size: r.get::<_, i64>(3)? as u64,
                sha256: r.get(4)?,
                key_id: r.get(5)?,
                registered_at_ms: r.get(6)?,
            })
        })?
        .collect()
    }

    // ---------------------------------------------------------------- events

    /// Stores a batch of a node's events (idempotent: a resent event is
    /// ignored) and returns the id to acknowledge up to. Events are facts:
    /// accepted from any epoch. `at` is derived from the reported age.
    pub fn put_events(
        &self,
        node_id: &str,
        journal_id: &str,
        events: &[(u64, String, Vec<u8>, u64)],
    ) -> Result<u64, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut up_to = 0;
        {
            let mut q = tx.prepare_cached(&format!(
                "INSERT INTO node_events (node_id, journal_id, event_id, kind, body, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, {NOW} - ?6)
                 ON CONFLICT DO NOTHING"
            ))?;
            for (id, kind, body, age_ms) in events {
                q.execute(params![
                    node_id,
                    journal_id,
                    *id as i64,
                    kind,
                    body,
                    (*age_ms).min(i64::MAX as u64) as i64
                ])?;
                up_to = up_to.max(*id);
            }
        }
        tx.execute(
            "DELETE FROM node_events WHERE node_id = ?1 AND rowid IN (
                 SELECT rowid FROM node_events WHERE node_id = ?1
                 ORDER BY at DESC, event_id DESC LIMIT -1 OFFSET ?2)",
            params![node_id, EVENTS_KEPT_PER_NODE],
        )?;
        tx.commit()?;
        Ok(up_to)
    }

    /// A node's events, oldest first.
    pub fn node_events(&self, node_id: &str) -> Result<Vec<EventRow>, StoreError> {
        let conn = self.lock();
        let mut q = conn.prepare(
            "SELECT journal_id, event_id, kind, body, at FROM node_events WHERE node_id = ?1
             ORDER BY at, event_id",
        )?;
        let rows = q
            .query_map([node_id], |r| {
                Ok(EventRow {
                    journal_id: r.get(0)?,
                    event_id: r.get::<_, i64>(1)? as u64,
                    kind: r.get(2)?,
                    body: r.get(3)?,
                    at_ms: r.get(4)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    // ---------------------------------------------------------------- leases

    /// Takes or renews a lease for `owner`. Returns the store's now when the
    /// lease is held, `None` when another owner holds it unexpired.
    pub fn renew_lease(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<i64>, StoreError> {
        let conn = self.lock();
        let now: Option<i64> = conn
            .query_row(
                &format!(
                    "INSERT INTO leases (name, owner, expires_at, renewed_at)
                     VALUES (?1, ?2, {NOW} + ?3, {NOW})
                     ON CONFLICT (name) DO UPDATE SET
                         owner = excluded.owner, expires_at = excluded.expires_at,
                         renewed_at = excluded.renewed_at
                     WHERE leases.owner = excluded.owner OR leases.expires_at < excluded.renewed_at
                     RETURNING renewed_at"
                ),
                params![name, owner, ms(ttl)],
                |r| r.get(0),
            )
            .optional()?;
        Ok(now)
    }

    pub fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        self.lock().execute(
            "DELETE FROM leases WHERE name = ?1 AND owner = ?2",
            params![name, owner],
        )?;
        Ok(())
    }

    /// The liveness controller's sweep. Sessions routed to a gateway whose
    /// `gateway:<id>` lease has expired become disconnected; disconnected
    /// nodes become unreachable once unseen for the node lease TTL (plus the
    /// gateway-loss grace when their gateway died), gaining a NoSchedule
    /// taint and the NodeUnreachable condition. Nothing is released.
    ///
    /// If the previous sweep is more than `outage_gap` ago (the store or this
    /// controller was down), every timed transition is held for
    /// `outage_hold`, so ages that could not be flushed meanwhile do not read
    /// as dead nodes.
    pub fn sweep_liveness(&self, rules: &LivenessRules) -> Result<SweepOutcome, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now: i64 = tx.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let get = |name: &str| -> rusqlite::Result<Option<i64>> {
            tx.query_row(
                "SELECT value FROM controller_state WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .optional()
        };
        let last_sweep = get("liveness.last_sweep")?;
        let mut hold_until = get("liveness.hold_until")?.unwrap_or(0);
        if last_sweep.is_some_and(|l| now - l > ms(rules.outage_gap)) {
            hold_until = now + ms(rules.outage_hold);
        }
        let set = |name: &str, v: i64| -> rusqlite::Result<usize> {
            tx.execute(
                "INSERT INTO controller_state (name, value) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                params![name, v],
            )
        };
        set("liveness.last_sweep", now)?;
        set("liveness.hold_until", hold_until)?;
        let mut out = SweepOutcome {
            held: now < hold_until,
            ..Default::default()
        };
        if out.held {
            tx.commit()?;
            return Ok(out);
        }
        {
            let mut q = tx.prepare(
                "UPDATE node_sessions SET state = 'disconnected', state_since = ?1,
                     disconnect_cause = 'gateway-lost'
                 WHERE state = 'connected' AND NOT EXISTS (
                     SELECT 1 FROM leases WHERE name = 'gateway:' || node_sessions.gateway_id
                         AND expires_at >= ?1)
                 RETURNING node_id",
            )?;
            out.disconnected = q
                .query_map([now], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
        }
        {
            let mut q = tx.prepare(
                "UPDATE node_sessions SET state = 'unreachable', state_since = ?1
                 WHERE state = 'disconnected' AND last_seen + ?2
                     + CASE WHEN disconnect_cause = 'gateway-lost' THEN ?3 ELSE 0 END < ?1
                 RETURNING node_id",
            )?;
            out.unreachable = q
                .query_map(
                    params![now, ms(rules.node_lease_ttl), ms(rules.gateway_loss_grace)],
                    |r| r.get(0),
                )?
                .collect::<rusqlite::Result<_>>()?;
        }
        for node in &out.unreachable {
            let (conditions, taints): (String, String) = tx.query_row(
                "SELECT conditions, taints FROM nodes WHERE id = ?1",
                [node],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            tx.execute(
                "UPDATE nodes SET conditions = ?2, taints = ?3 WHERE id = ?1",
                params![
                    node,
                    with(&conditions, CONDITION_UNREACHABLE),
                    with(&taints, TAINT_UNREACHABLE)
                ],
            )?;
        }
        tx.commit()?;
        Ok(out)
    }

    // ----------------------------------------------------------------- nodes

    pub fn list_nodes(&self) -> Result<(Vec<NodeRow>, i64), StoreError> {
        let conn = self.lock();
        let now: i64 = conn.query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))?;
        let mut q = conn.prepare(
            "SELECT n.id, n.hostname, COALESCE(s.state, 'disconnected'), COALESCE(s.epoch, 0),
                    COALESCE(s.gateway_id, ''),
                    (SELECT MAX(c.not_after) FROM node_certs c
                       WHERE c.node_id = n.id AND c.revoked_at IS NULL),
                    COALESCE(s.last_seen, n.created_at), COALESCE(s.boot_id, ''),
                    COALESCE(s.journal_id, ''), COALESCE(s.incarnation_id, ''),
                    n.agent_version, n.conditions, n.taints, n.release_floor
             FROM nodes n LEFT JOIN node_sessions s ON s.node_id = n.id
             WHERE n.deleted_at IS NULL ORDER BY n.id",
        )?;
        let rows = q
            .query_map([], |r| {
                Ok(NodeRow {
                    node_id: r.get(0)?,
                    hostname: r.get(1)?,
                    state: r.get(2)?,
                    epoch: r.get::<_, i64>(3)? as u64,
                    gateway_id: r.get(4)?,
                    cert_not_after_ms: r.get::<_, Option<i64>>(5)?.unwrap_or(0),
                    last_seen_age_ms: now - r.get::<_, i64>(6)?,
                    boot_id: r.get(7)?,
                    journal_id: r.get(8)?,
                    incarnation_id: r.get(9)?,
                    agent_version: r.get(10)?,
                    conditions: json_list(&r.get::<_, String>(11)?),
                    taints: json_list(&r.get::<_, String>(12)?),
                    release_floor: r.get::<_, i64>(13)? as u64,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok((rows, now))
    }

    /// Deletes a node: it can no longer open sessions, and its certificates
    /// are revoked. Returns false if there was no such node.
    pub fn delete_node(&self, node_id: &str) -> Result<bool, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx.execute(
            &format!("UPDATE nodes SET deleted_at = {NOW} WHERE id = ?1 AND deleted_at IS NULL"),
            [node_id],
        )?;
        tx.execute(
            &format!(
                "UPDATE node_certs SET revoked_at = {NOW}, revoke_reason = 'node-deleted'
                 WHERE node_id = ?1 AND revoked_at IS NULL"
            ),
            [node_id],
        )?;
        tx.commit()?;
        Ok(n == 1)
    }

    /// Certificates revoked at or after `since_ms` (store time): serial,
    /// node, reason, when. The gateways' revocation feed polls this.
    pub fn revoked_since(
        &self,
        since_ms: i64,
    ) -> Result<Vec<(String, String, String, i64)>, StoreError> {
        let conn = self.lock();
        let mut q = conn.prepare_cached(
            "SELECT serial, node_id, COALESCE(revoke_reason, ''), revoked_at FROM node_certs
             WHERE revoked_at IS NOT NULL AND revoked_at >= ?1 ORDER BY revoked_at",
        )?;
        let rows = q
            .query_map([since_ms], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Session facts, for tests and `check`.
    /// Nodes connected through `gateway` with work waiting: a pending
    /// command, or a spec changed since `specs_since_ms`. One query per
    /// gateway instead of a poll per session.
    pub fn nodes_with_work(
        &self,
        gateway: &str,
        specs_since_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let mut q = conn.prepare_cached(
            "SELECT s.node_id FROM node_sessions s
             WHERE s.gateway_id = ?1 AND s.state = 'connected' AND (
                 EXISTS (SELECT 1 FROM commands c
                         WHERE c.node_id = s.node_id AND c.state = 'pending')
                 OR EXISTS (SELECT 1 FROM node_specs p
                            WHERE p.node_id = s.node_id AND p.updated_at >= ?2))",
        )?;
        let rows = q
            .query_map(params![gateway, specs_since_ms], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(rows)
    }

    pub fn session(&self, node_id: &str) -> Result<Option<(u64, String, String)>, StoreError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT epoch, gateway_id, state FROM node_sessions WHERE node_id = ?1",
                [node_id],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }
}

const COMMAND_COLUMNS: &str = "id, node_id, seq, kind, summary, state, reason, exit_code, \
     COALESCE(output, X''), output_truncated, created_at, not_after, result_at, epoch";

fn read_command(r: &rusqlite::Row<'_>) -> rusqlite::Result<CommandRow> {
    Ok(CommandRow {
        id: r.get(0)?,
        node_id: r.get(1)?,
        seq: r.get::<_, i64>(2)? as u64,
        kind: r.get(3)?,
        summary: r.get(4)?,
        state: r.get(5)?,
        reason: r.get(6)?,
        exit_code: r.get(7)?,
        output: r.get(8)?,
        output_truncated: r.get(9)?,
        created_at_ms: r.get(10)?,
        not_after_ms: r.get(11)?,
        result_at_ms: r.get(12)?,
        epoch: r.get::<_, i64>(13)? as u64,
    })
}

fn command_row(conn: &Connection, id: &str) -> rusqlite::Result<Option<CommandRow>> {
    conn.query_row(
        &format!("SELECT {COMMAND_COLUMNS} FROM commands WHERE id = ?1"),
        [id],
        read_command,
    )
    .optional()
}

/// The Hello transaction's part for commands: every in-flight command of
/// the node moves to the new epoch and is replayed, kept, awaited or
/// finished as `bcd_core::command::on_hello` decides.
fn settle_in_flight(
    tx: &Connection,
    h: &HelloInput,
    epoch: u64,
    now: i64,
    new_journal: bool,
    new_boot: bool,
) -> Result<(Vec<Dispatch>, Vec<Finished>), TxError> {
    let in_flight: Vec<(String, u64, String, String, Vec<u8>)> = {
        let mut q = tx.prepare_cached(
            "SELECT id, seq, kind, state, signed FROM commands
             WHERE node_id = ?1 AND state IN ('dispatched', 'acked', 'running') ORDER BY seq",
        )?;
        q.query_map([&h.node_id], |r| {
            Ok((
                r.get(0)?,
                r.get::<_, i64>(1)? as u64,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?
    };
    let mut replay = Vec::new();
    let mut finished = Vec::new();
    for (id, seq, kind, state, signed) in in_flight {
        let (Some(kind), Some(state)) = (Kind::parse(&kind), ServerState::parse(&state)) else {
            continue;
        };
        let report = if h.journal_done.contains(&id) {
            NodeReport::Done
        } else if h.journal_running.contains(&id) {
            NodeReport::Running
        } else {
            NodeReport::Unknown
        };
        match on_hello(kind, state, report, new_journal, new_boot) {
            HelloDecision::Replay => {
                tx.execute(
                    "UPDATE commands SET state = 'dispatched', epoch = ?2, updated_at = ?3 WHERE id = ?1",
                    params![id, epoch as i64, now],
                )?;
                replay.push(Dispatch { id, seq, signed });
            }
            HelloDecision::KeepRunning | HelloDecision::AwaitResult => {
                tx.execute(
                    "UPDATE commands SET epoch = ?2, updated_at = ?3 WHERE id = ?1",
                    params![id, epoch as i64, now],
                )?;
            }
            HelloDecision::Finish(outcome, reason) => {
                let state = ServerState::Terminal(outcome).name();
                tx.execute(
                    "UPDATE commands SET state = ?2, reason = ?3, result_at = ?4, updated_at = ?4
                     WHERE id = ?1",
                    params![id, state, reason, now],
                )?;
                finished.push((id, state.to_string(), reason.to_string()));
            }
        }
    }
    Ok((replay, finished))
}

/// node, serial, revoked_at, revoke_reason, not_after, deleted_at, now
type CertRow = (
    String,
    String,
    Option<i64>,
    Option<String>,
    i64,
    Option<i64>,
    i64,
);

/// The node, serial and expiry of a certificate that is valid now.
fn check_cert(conn: &Connection, fingerprint: &str) -> Result<(String, String, i64), TxError> {
    let row: Option<CertRow> = conn
        .query_row(
            &format!(
                "SELECT c.node_id, c.serial, c.revoked_at, c.revoke_reason, c.not_after,
                        n.deleted_at, {NOW}
                 FROM node_certs c JOIN nodes n ON n.id = c.node_id
                 WHERE c.fingerprint = ?1"
            ),
            [fingerprint],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            },
        )
        .optional()?;
    let Some((node, serial, revoked, reason, not_after, deleted, now)) = row else {
        return Err(Refusal::UnknownCertificate.into());
    };
    if deleted.is_some() {
        return Err(Refusal::DeletedNode(node).into());
    }
    if revoked.is_some() {
        return Err(Refusal::Revoked(reason.unwrap_or_default()).into());
    }
    if not_after < now {
        return Err(Refusal::Expired.into());
    }
    Ok((node, serial, not_after))
}

fn with(list: &str, item: &str) -> String {
    let mut v = json_list(list);
    if !v.iter().any(|x| x == item) {
        v.push(item.to_string());
    }
    serde_json::to_string(&v).expect("list serializes")
}

fn without(list: &str, item: &str) -> String {
    let mut v = json_list(list);
    v.retain(|x| x != item);
    serde_json::to_string(&v).expect("list serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store where the gateways the tests name hold their leases.
    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("store.db")).unwrap();
        for gw in ["gw", "gw2", "gw-a", "gw-b"] {
            s.renew_lease(&format!("gateway:{gw}"), gw, Duration::from_secs(3600))
                .unwrap()
                .unwrap();
        }
        (d, s)
    }

    #[test]
    fn a_gateway_without_its_lease_routes_nothing() {
        let (_d, s) = store();
        let node = joined(&s, 1);
        let fenced = |gw: &str| {
            matches!(
                s.hello(&hello(&node, 1, gw, 0)),
                Err(TxError::Refused(Refusal::Fenced(_)))
            )
        };
        assert!(fenced("gw-never-leased"));
        s.renew_lease("gateway:gw-short", "gw-short", Duration::from_millis(10))
            .unwrap()
            .unwrap();
        assert!(!fenced("gw-short"));
        std::thread::sleep(Duration::from_millis(20));
        assert!(fenced("gw-short"), "an expired lease fences too");
        assert_eq!(s.session(&node).unwrap().unwrap().1, "gw-short");
    }

    fn fake_cert(n: u8) -> IssuedCert {
        IssuedCert {
            der: vec![n],
            serial: format!("serial{n}"),
            fingerprint: format!("fp{n}"),
            not_before_ms: 0,
            not_after_ms: i64::MAX / 2,
        }
    }

    fn joined(s: &Store, cert: u8) -> String {
        let id = format!("{:016x}", cert);
        s.create_token(&NewToken {
            id: &id,
            secret_sha256: "h",
            ttl: Duration::from_secs(60),
            uses: 1,
            description: "",
        })
        .unwrap();
        s.join(&id, "h", "host", false, |_, _| Ok(fake_cert(cert)))
            .unwrap()
            .0
    }

    fn hello(node: &str, cert: u8, gw: &str, last_epoch: u64) -> HelloInput {
        HelloInput {
            node_id: node.into(),
            cert_fingerprint: format!("fp{cert}"),
            cert_serial: format!("serial{cert}"),
            gateway_id: gw.into(),
            incarnation_id: "i".into(),
            boot_id: "b".into(),
            journal_id: "j".into(),
            agent_version: "0".into(),
            release_floor: 0,
            last_epoch,
            inventory_hashes: vec![("gpus".into(), "abc".into())],
            journal_running: vec![],
            journal_done: vec![],
        }
    }

    #[test]
    fn hello_bumps_the_epoch_and_stale_writes_change_nothing() {
        let (_d, s) = store();
        let node = joined(&s, 1);
        let first = s.hello(&hello(&node, 1, "gw-a", 0)).unwrap();
        assert_eq!(first.epoch, 1);
        assert_eq!(first.inventory_wanted, vec!["gpus".to_string()]);
        let second = s.hello(&hello(&node, 1, "gw-b", 0)).unwrap();
        assert_eq!(second.epoch, 2);
        // gw-a's late writes under epoch 1 are fenced.
        assert!(
            !s.disconnect(&node, 1, Duration::ZERO, "stream-ended")
                .unwrap()
        );
        let gone = s
            .flush_liveness("gw-a", &[(node.clone(), 1, Duration::ZERO)])
            .unwrap();
        assert_eq!(gone, vec![(node.clone(), 1)]);
        assert!(!s.put_inventory(&node, 1, "gpus", "abc", b"[]").unwrap());
        assert_eq!(
            s.session(&node).unwrap().unwrap(),
            (2, "gw-b".into(), "connected".into())
        );
        // The current session's writes apply.
        assert!(
            s.flush_liveness("gw-b", &[(node.clone(), 2, Duration::ZERO)])
                .unwrap()
                .is_empty()
        );
        assert!(s.put_inventory(&node, 2, "gpus", "abc", b"[]").unwrap());
        assert!(
            s.disconnect(&node, 2, Duration::ZERO, "stream-ended")
                .unwrap()
        );
        assert_eq!(s.session(&node).unwrap().unwrap().2, "disconnected");
        // Inventory now matches: not wanted again.
        let third = s.hello(&hello(&node, 1, "gw-a", 0)).unwrap();
        assert!(third.inventory_wanted.is_empty());
    }

    #[test]
    fn results_first_one_wins_and_unknown_ones_change_nothing() {
        use bcd_core::command::{Kind, Outcome};
        let (_d, s) = store();
        let node = joined(&s, 1);
        let (c, created) = s
            .create_command(
                &NewCommand {
                    node_id: &node,
                    kind: Kind::ExecRun,
                    summary: "x",
                    not_after: Duration::from_secs(60),
                    min_generation: 0,
                    idempotency_key: None,
                },
                |_, _, _, _| b"signed".to_vec(),
            )
            .unwrap();
        assert!(created);
        assert_eq!((c.seq, c.state.as_str()), (1, "pending"));
        let result = |id: &str, outcome| ResultInput {
            command_id: id.into(),
            outcome,
            reason: String::new(),
            exit_code: Some(0),
            output: vec![],
            output_truncated: false,
        };
        assert_eq!(
            s.command_result(&node, &result("cmd-nope", Outcome::Succeeded))
                .unwrap(),
            ResultApplied::Unknown
        );
        let other = joined(&s, 2);
        assert_eq!(
            s.command_result(&other, &result(&c.id, Outcome::Succeeded))
                .unwrap(),
            ResultApplied::Unknown,
            "another node cannot report it"
        );
        assert_eq!(
            s.command_result(&node, &result(&c.id, Outcome::Succeeded))
                .unwrap(),
            ResultApplied::Applied
        );
        assert_eq!(
            s.command_result(&node, &result(&c.id, Outcome::Failed))
                .unwrap(),
            ResultApplied::Duplicate
        );
        assert_eq!(s.get_command(&c.id).unwrap().unwrap().state, "succeeded");
        assert!(
            !s.command_ack(&node, &c.id, true).unwrap(),
            "a finished command stays finished"
        );
        // Dispatch is a join on the route: nothing goes to a stale epoch.
        let (c2, _) = s
            .create_command(
                &NewCommand {
                    node_id: &node,
                    kind: Kind::ExecRun,
                    summary: "y",
                    not_after: Duration::from_secs(60),
                    min_generation: 0,
                    idempotency_key: None,
                },
                |_, _, _, _| b"signed".to_vec(),
            )
            .unwrap();
        assert_eq!(c2.seq, 2);
        let e1 = s.hello(&hello(&node, 1, "gw-a", 0)).unwrap().epoch;
        let e2 = s.hello(&hello(&node, 1, "gw-b", 0)).unwrap().epoch;
        assert!(s.take_dispatchable("gw-a", &node, e1).unwrap().is_empty());
        let d = s.take_dispatchable("gw-b", &node, e2).unwrap();
        assert_eq!(d.len(), 1);
        assert!(
            s.take_dispatchable("gw-b", &node, e2).unwrap().is_empty(),
            "once"
        );
        // At the next Hello it is in flight and unknown to the node: replayed.
        let h = s.hello(&hello(&node, 1, "gw-a", 0)).unwrap();
        assert_eq!(
            h.replay.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            [c2.id.as_str()]
        );
    }

    #[test]
    fn epoch_rises_above_what_the_node_saw() {
        let (_d, s) = store();
        let node = joined(&s, 1);
        assert_eq!(s.hello(&hello(&node, 1, "gw", 41)).unwrap().epoch, 42);
        assert_eq!(s.hello(&hello(&node, 1, "gw", 0)).unwrap().epoch, 43);
    }

    #[test]
    fn tokens_are_single_use_and_expire() {
        let (_d, s) = store();
        s.create_token(&NewToken {
            id: "t1",
            secret_sha256: "h",
            ttl: Duration::from_secs(60),
            uses: 1,
            description: "",
        })
        .unwrap();
        let refuse =
            |s: &Store, id: &str, secret: &str| match s
                .join(id, secret, "h", false, |_, _| Ok(fake_cert(9)))
            {
                Err(TxError::Refused(r)) => r,
                other => panic!("expected a refusal, got {:?}", other.map(|x| x.0)),
            };
        assert_eq!(refuse(&s, "t1", "wrong"), Refusal::UnknownToken);
        assert_eq!(refuse(&s, "nope", "h"), Refusal::UnknownToken);
        s.join("t1", "h", "h", false, |_, _| Ok(fake_cert(1)))
            .unwrap();
        assert_eq!(refuse(&s, "t1", "h"), Refusal::UsedToken);
        s.create_token(&NewToken {
            id: "t2",
            secret_sha256: "h",
            ttl: Duration::ZERO,
            uses: 5,
            description: "",
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(refuse(&s, "t2", "h"), Refusal::ExpiredToken);
        // A refused join leaves no node behind.
        assert_eq!(s.list_nodes().unwrap().0.len(), 1);
    }

    #[test]
    fn deleted_nodes_and_foreign_certificates_are_refused() {
        let (_d, s) = store();
        let a = joined(&s, 1);
        let b = joined(&s, 2);
        let refusal = |h: HelloInput| match s.hello(&h) {
            Err(TxError::Refused(r)) => r,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(
            refusal(hello(&b, 1, "gw", 0)),
            Refusal::WrongCertificate(b.clone())
        );
        assert_eq!(refusal(hello(&a, 7, "gw", 0)), Refusal::UnknownCertificate);
        assert!(s.delete_node(&a).unwrap());
        assert!(!s.delete_node(&a).unwrap());
        assert_eq!(
            refusal(hello(&a, 1, "gw", 0)),
            Refusal::DeletedNode(a.clone())
        );
        assert_eq!(s.list_nodes().unwrap().0.len(), 1);
    }

    #[test]
    fn gateway_loss_then_unreachable_releases_nothing_and_hello_clears_it() {
        let (_d, s) = store();
        let node = joined(&s, 1);
        let rules = LivenessRules {
            node_lease_ttl: Duration::from_millis(200),
            gateway_loss_grace: Duration::from_millis(200),
            outage_gap: Duration::from_secs(20),
            outage_hold: Duration::from_secs(300),
        };
        assert!(
            s.renew_lease("gateway:gw", "gw", Duration::from_millis(20))
                .unwrap()
                .is_some()
        );
        s.hello(&hello(&node, 1, "gw", 0)).unwrap();
        assert_eq!(s.sweep_liveness(&rules).unwrap(), SweepOutcome::default());
        std::thread::sleep(Duration::from_millis(25));
        let out = s.sweep_liveness(&rules).unwrap();
        assert_eq!(out.disconnected, vec![node.clone()]);
        // Before the node lease TTL plus the grace: still only disconnected.
        assert!(s.sweep_liveness(&rules).unwrap().unreachable.is_empty());
        std::thread::sleep(Duration::from_millis(420));
        let out = s.sweep_liveness(&rules).unwrap();
        assert_eq!(out.unreachable, vec![node.clone()]);
        let row = &s.list_nodes().unwrap().0[0];
        assert_eq!(row.state, "unreachable");
        assert_eq!(row.conditions, vec![CONDITION_UNREACHABLE.to_string()]);
        assert_eq!(row.taints, vec![TAINT_UNREACHABLE.to_string()]);
        assert!(row.cert_not_after_ms > 0, "the certificate is not revoked");
        s.hello(&hello(&node, 1, "gw2", 0)).unwrap();
        let row = &s.list_nodes().unwrap().0[0];
        assert_eq!(row.state, "connected");
        assert!(row.conditions.is_empty() && row.taints.is_empty());
    }

    #[test]
    fn a_sweep_gap_holds_timed_transitions() {
        let (_d, s) = store();
        let node = joined(&s, 1);
        let rules = LivenessRules {
            node_lease_ttl: Duration::ZERO,
            gateway_loss_grace: Duration::ZERO,
            outage_gap: Duration::from_millis(20),
            outage_hold: Duration::from_secs(300),
        };
        s.hello(&hello(&node, 1, "gw", 0)).unwrap();
        s.sweep_liveness(&rules).unwrap();
        let _ = s.hello(&hello(&node, 1, "gw", 0)).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let out = s.sweep_liveness(&rules).unwrap();
        assert!(out.held);
        assert!(out.disconnected.is_empty() && out.unreachable.is_empty());
        assert_eq!(s.session(&node).unwrap().unwrap().2, "connected");
    }

    #[test]
    fn leases_have_one_owner_until_they_expire() {
        let (_d, s) = store();
        assert!(
            s.renew_lease("gateway:a", "a", Duration::from_millis(30))
                .unwrap()
                .is_some()
        );
        assert!(
            s.renew_lease("gateway:a", "b", Duration::from_millis(30))
                .unwrap()
                .is_none()
        );
        assert!(
            s.renew_lease("gateway:a", "a", Duration::from_millis(30))
                .unwrap()
                .is_some()
        );
        std::thread::sleep(Duration::from_millis(40));
        assert!(
            s.renew_lease("gateway:a", "b", Duration::from_millis(30))
                .unwrap()
                .is_some()
        );
        assert!(
            s.renew_lease("gateway:a", "a", Duration::from_millis(30))
                .unwrap()
                .is_none()
        );
    }
}
