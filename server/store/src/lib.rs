//! `bc-store`: the control plane's only source of truth.
//!
//! It owns the fleet's state (tokens, nodes and their certificates,
//! sessions, liveness, leases, inventory, commands, specs, bindings,
//! events, releases, images, rollouts, the audit history, backup sets)
//! behind one async
//! interface, [`Backend`], and the decisions taken inside its transactions
//! (one pure module per domain). [`Store`] is a cheap handle over a
//! backend; `store.hello(&input).await` calls it.
//!
//! It must not know the wire (no tonic, no protobuf), certificates (a
//! verifier and certificate builders are handed in) or signing keys (a
//! sealer is handed in). Its clock is injected ([`Clock`]): every time it
//! records comes from `compute_now()`, never from a caller. Errors that
//! reach a peer are [`Refusal`]s with their own wording; a [`StoreError`]
//! carries the database's text for logs only.
//!
//! Backends: SQLite ([`sqlite`]; one file, several processes on one host,
//! the embedded default) and PostgreSQL ([`postgres`]; gateways and
//! controllers on several hosts). [`Location`] names one: a path or
//! `sqlite:PATH`, or `postgres://...`; the same suite of behaviour runs
//! against both (`tests/suite`). Its neighbours: the server
//! (`server/src`) drives it; `bcd-core` supplies the shared epoch and
//! command rules.
#![forbid(unsafe_code)]

/// The schema's migrations, in order, as `&[&str]`: each backend keeps its
/// own SQL for each under `$dir` (relative to the file that names them), the
/// same file names and numbers meaning the same schema. A new migration is
/// a line here and a file in each backend's folder.
macro_rules! migrations {
    ($dir:literal) => {
        &[
            include_str!(concat!($dir, "/0001_join_nodes_sessions.sql")),
            include_str!(concat!($dir, "/0002_commands.sql")),
            include_str!(concat!($dir, "/0003_node_events.sql")),
            include_str!(concat!($dir, "/0004_desired_state.sql")),
            include_str!(concat!($dir, "/0005_access.sql")),
            include_str!(concat!($dir, "/0006_bindings_fleet_events.sql")),
            include_str!(concat!($dir, "/0007_releases.sql")),
            include_str!(concat!($dir, "/0008_release_floors_rollouts.sql")),
            include_str!(concat!($dir, "/0009_audit.sql")),
            include_str!(concat!($dir, "/0010_images.sql")),
            include_str!(concat!($dir, "/0011_compute_now.sql")),
            include_str!(concat!($dir, "/0012_signed_facts_statements.sql")),
            include_str!(concat!($dir, "/0013_audit_chain.sql")),
            include_str!(concat!($dir, "/0014_backups.sql")),
            include_str!(concat!($dir, "/0015_cert_sightings.sql")),
            include_str!(concat!($dir, "/0016_operator_certificates.sql")),
            include_str!(concat!($dir, "/0017_gateway_credentials.sql")),
            include_str!(concat!($dir, "/0018_node_ek.sql")),
            include_str!(concat!($dir, "/0019_audit_chains.sql")),
            include_str!(concat!($dir, "/0020_machine_enrolments.sql")),
            include_str!(concat!($dir, "/0021_ek_ca_intermediates.sql")),
            include_str!(concat!($dir, "/0022_boot_access.sql")),
            include_str!(concat!($dir, "/0023_hello_cost.sql")),
            include_str!(concat!($dir, "/0024_signed_results.sql")),
            include_str!(concat!($dir, "/0025_revocations_stay.sql")),
            include_str!(concat!($dir, "/0026_legacy_results.sql")),
            include_str!(concat!($dir, "/0027_controller_leases.sql")),
            include_str!(concat!($dir, "/0028_hello_proofs.sql")),
            include_str!(concat!($dir, "/0029_legacy_hello_endings.sql")),
            include_str!(concat!($dir, "/0030_endings_written_once.sql")),
            include_str!(concat!($dir, "/0031_sightings_watched.sql")),
            include_str!(concat!($dir, "/0032_hello_proofs_required.sql")),
            include_str!(concat!($dir, "/0033_floors_from_signed_upgrades.sql")),
            include_str!(concat!($dir, "/0034_gateway_revocations.sql")),
            include_str!(concat!($dir, "/0035_result_receipts.sql")),
            include_str!(concat!($dir, "/0036_node_security_events.sql")),
            include_str!(concat!($dir, "/0037_security_events_by_body.sql")),
            include_str!(concat!($dir, "/0038_operator_revocations.sql")),
            include_str!(concat!($dir, "/0039_unknown_results.sql")),
            include_str!(concat!($dir, "/0040_secrets.sql")),
            include_str!(concat!($dir, "/0041_lease_generation.sql")),
            include_str!(concat!($dir, "/0042_lease_absorption.sql")),
        ]
    };
}

pub mod audit;
pub mod backend;
pub mod backups;
pub mod bindings;
pub mod clock;
pub mod clones;
pub mod commands;
pub mod error;
pub mod events;
#[doc(hidden)]
pub mod fixtures;
pub mod gateways;
pub mod id;
pub mod images;
pub mod inventory;
pub mod leases;
pub mod liveness;
pub mod machines;
pub mod named;
pub mod nodes;
pub mod postgres;
pub mod reconcile;
pub mod releases;
pub mod rollouts;
pub mod secrets;
pub mod sessions;
pub mod specs;
mod sql;
pub mod sqlite;
pub mod tokens;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use backend::{Backend, GatewayBackend};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Refusal, StoreError, TxError};
pub use id::{CommandId, GatewayId, ImageId, NodeId, OperatorId, ReleaseSeq, TokenId};

/// A handle on a store: clone it freely. Its methods are [`Backend`]'s.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
}

/// A gateway's handle on a store: only [`GatewayBackend`]'s methods, so
/// gateway code cannot even call what writes intent, identity or keys.
/// A gateway-only process opens one with [`GatewayStore::open`]; the key
/// holder hands its gateway [`Store::gateway`].
#[derive(Clone)]
pub struct GatewayStore {
    backend: Arc<dyn GatewayBackend>,
}

impl std::fmt::Debug for GatewayStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("GatewayStore").field(&self.backend).finish()
    }
}

impl std::ops::Deref for GatewayStore {
    type Target = dyn GatewayBackend;

    fn deref(&self) -> &Self::Target {
        self.backend.as_ref()
    }
}

impl GatewayStore {
    /// Opens the store at `location` for a gateway: nothing is created
    /// and no migration runs (only the key holder migrates), and a store
    /// whose schema is not the one this binary writes is refused with
    /// what to do ([`StoreError::Schema`]).
    pub async fn open(
        location: &Location,
        clock: Arc<dyn Clock>,
    ) -> Result<GatewayStore, StoreError> {
        let store = Store::open_existing(location, clock).await?;
        let found = store.schema_version().await?;
        let known = Store::schema_target(location);
        if found > known {
            return Err(StoreError::TooNew { found, known });
        }
        if found < known {
            return Err(StoreError::Schema { found, known });
        }
        Ok(store.gateway())
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Store").field(&self.backend).finish()
    }
}

impl Store {
    pub fn new(backend: Arc<dyn Backend>) -> Store {
        Store { backend }
    }

    /// The same store, seen as a gateway sees it.
    pub fn gateway(&self) -> GatewayStore {
        GatewayStore {
            backend: self.backend.clone(),
        }
    }

    /// Opens (creating and migrating) the SQLite store at `path`.
    pub async fn open_sqlite(path: &Path, clock: Arc<dyn Clock>) -> Result<Store, StoreError> {
        let backend = sqlite::SqliteBackend::open(path.to_path_buf(), clock).await?;
        Ok(Store::new(Arc::new(backend)))
    }

    /// Opens (migrating) the PostgreSQL store at `url`. Its clock is the
    /// database's, unless `clock` is an injected one (tests).
    pub async fn open_postgres(url: &str, clock: Arc<dyn Clock>) -> Result<Store, StoreError> {
        let clock = (!clock.is_host_clock()).then_some(clock);
        let backend = postgres::PostgresBackend::open(url, clock).await?;
        Ok(Store::new(Arc::new(backend)))
    }

    /// Opens the store at `location` as it is, for reading: nothing is
    /// created and no migration runs. A SQLite file that is not there is
    /// [`StoreError::Missing`]; a PostgreSQL store connects at the first
    /// call.
    pub async fn open_existing(
        location: &Location,
        clock: Arc<dyn Clock>,
    ) -> Result<Store, StoreError> {
        Ok(Store::new(match location {
            Location::Sqlite(path) => {
                Arc::new(sqlite::SqliteBackend::open_existing(path.clone(), clock).await?)
            }
            Location::Postgres(url) => {
                let clock = (!clock.is_host_clock()).then_some(clock);
                Arc::new(postgres::PostgresBackend::open_existing(url, clock)?)
            }
        }))
    }

    /// The schema version this binary writes to the store at `location`.
    pub fn schema_target(location: &Location) -> u32 {
        match location {
            Location::Sqlite(_) => sqlite::SCHEMA_VERSION,
            Location::Postgres(_) => postgres::SCHEMA_VERSION,
        }
    }

    /// Opens the store at `location`.
    pub async fn open(location: &Location, clock: Arc<dyn Clock>) -> Result<Store, StoreError> {
        match location {
            Location::Sqlite(path) => Store::open_sqlite(path, clock).await,
            Location::Postgres(url) => Store::open_postgres(url, clock).await,
        }
    }
}

/// Where a store is: `sqlite:PATH` (or a plain path), or a PostgreSQL
/// address (`postgres://...`, `postgresql://...`).
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Location {
    pub fn parse(s: &str) -> Location {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Location::Postgres(s.to_string())
        } else {
            Location::Sqlite(PathBuf::from(s.strip_prefix("sqlite:").unwrap_or(s)))
        }
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Location::Postgres(_))
    }
}

/// Shown without a PostgreSQL address's credentials, host or options: a
/// location may end up in a log or an error, which must never carry it.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(p) => write!(f, "the SQLite store {}", p.display()),
            Location::Postgres(_) => f.write_str("the PostgreSQL store"),
        }
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &Self::Target {
        self.backend.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::Location;

    #[test]
    fn locations_parse_and_never_show_an_address() {
        assert_eq!(
            Location::parse("sqlite:/var/lib/bc/store.db"),
            Location::Sqlite("/var/lib/bc/store.db".into())
        );
        assert_eq!(
            Location::parse("/tmp/store.db"),
            Location::Sqlite("/tmp/store.db".into())
        );
        let pg = Location::parse("postgres://bc:secret@db.internal:5432/fleet");
        assert!(pg.is_postgres());
        let shown = format!("{pg} {pg:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("db.internal"),
            "{shown}"
        );
        assert!(Location::parse("postgresql:///fleet?host=/run/pg").is_postgres());
    }
}
