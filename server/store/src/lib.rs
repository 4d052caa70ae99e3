//! `bc-store`: the control plane's only source of truth.
//!
//! It owns the fleet's state (tokens, nodes and their certificates,
//! sessions, liveness, leases, inventory, commands, specs, bindings,
//! events, releases, images, rollouts, the audit history) behind one async
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
//! Backends: SQLite ([`sqlite`]; one file, several processes). Its
//! neighbours: the server (`server/src`) drives it; `bcd-core` supplies the
//! shared epoch and command rules.
#![forbid(unsafe_code)]

pub mod audit;
pub mod backend;
pub mod bindings;
pub mod clock;
pub mod commands;
pub mod error;
pub mod events;
pub mod images;
pub mod inventory;
pub mod leases;
pub mod liveness;
pub mod nodes;
pub mod releases;
pub mod rollouts;
pub mod sessions;
pub mod specs;
pub mod sqlite;
pub mod tokens;

use std::path::Path;
use std::sync::Arc;

pub use backend::Backend;
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Refusal, StoreError, TxError};

/// A handle on a store: clone it freely. Its methods are [`Backend`]'s.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
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

    /// Opens (creating and migrating) the SQLite store at `path`.
    pub async fn open_sqlite(path: &Path, clock: Arc<dyn Clock>) -> Result<Store, StoreError> {
        let backend = sqlite::SqliteBackend::open(path.to_path_buf(), clock).await?;
        Ok(Store::new(Arc::new(backend)))
    }
}

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &Self::Target {
        self.backend.as_ref()
    }
}
