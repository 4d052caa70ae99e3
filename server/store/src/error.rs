//! What can go wrong in the store, and for whom.
//!
//! A [`Refusal`] is a request the store turns down, worded for the peer that
//! made it (an operator or a node): what happened and what to do next. A
//! [`StoreError`] is a failure of the store itself; it carries the
//! database's own message and is for the logs only: the API reports it as
//! "unavailable" without its text. [`TxError`] is either, for operations
//! that can be refused.

/// A failure of the store: for logs, never for a peer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed (I/O, a lock held too long, a constraint). It
    /// reads as [`describe`] says: the database's code and what kind of
    /// failure it is, never the driver's words (which name statements,
    /// addresses and files); the error itself stays inside for a caller
    /// that asks what it was (`downcast_ref`), and is no `source()`, so no
    /// error chain prints it.
    #[error("{}", describe(.0.as_ref()))]
    Database(Box<dyn std::error::Error + Send + Sync>),
    /// The blocking task running the work failed (a panic).
    #[error("the store task failed")]
    Task(#[source] tokio::task::JoinError),
    #[error(
        "store schema version {found} is newer than this binary knows ({known}): run a newer better-compute"
    )]
    TooNew { found: u32, known: u32 },
    /// A gateway found the store at another schema version than its own:
    /// only the key holder migrates.
    #[error(
        "the store's schema is version {found} and this gateway's is {known}: only the key holder \
         migrates: run better-compute serve (without --role gateway) of the same version first, \
         then start this gateway"
    )]
    Schema { found: u32, known: u32 },
    /// There is no store where it was looked for (opened as it is).
    #[error("there is no store there yet: better-compute serve creates it")]
    Missing,
    /// The store's address or a file it names (TLS, a password) is wrong;
    /// the message says how, and carries no secret.
    #[error("{0}")]
    Address(String),
    /// A write made under a lease its owner no longer holds at that
    /// generation (it ran out, another process took it, or it was taken
    /// again since): nothing was written; another process runs that work.
    #[error(
        "{owner} no longer holds lease {lease} (generation {generation}): nothing was written; \
         the process holding it now does this work"
    )]
    LeaseLost {
        lease: String,
        owner: String,
        generation: u64,
    },
    /// A stored value does not parse: a bug or a hand-edited store.
    #[error("the store holds a value it cannot read: {0}")]
    Corrupt(String),
}

/// What a database failure says in a log line or an error chain: for
/// PostgreSQL its SQLSTATE and class, or that the connection failed or
/// timed out; for SQLite its result code; the store's own messages as
/// they are.
pub fn describe(e: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    use deadpool_postgres::PoolError;
    if let Some(pg) = e.downcast_ref::<tokio_postgres::Error>() {
        return match pg.code() {
            Some(code) => format!(
                "the store's database refused the transaction (PostgreSQL error {}{})",
                code.code(),
                postgres_class(code.code())
            ),
            None if pg.is_closed() => "the connection to the store's database closed".into(),
            None => "the store's database connection failed".into(),
        };
    }
    if let Some(pool) = e.downcast_ref::<PoolError>() {
        return match pool {
            PoolError::Backend(pg) => describe(pg),
            PoolError::Timeout(_) => {
                "no connection to the store's database within the pool's wait".into()
            }
            PoolError::Closed => "the pool of store connections is closed".into(),
            _ => "the store's database connection could not be made".into(),
        };
    }
    if let Some(sqlite) = e.downcast_ref::<rusqlite::Error>() {
        return match sqlite {
            rusqlite::Error::SqliteFailure(f, _) => format!(
                "the store's SQLite database failed ({:?}, result code {})",
                f.code, f.extended_code
            ),
            _ => "the store's SQLite database failed".into(),
        };
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return format!("the store's database failed (I/O: {:?})", io.kind());
    }
    // The store's own words (a row it expected and did not find).
    format!("store database: {e}")
}

/// The kind of failure a SQLSTATE's class names (the first two
/// characters).
fn postgres_class(code: &str) -> &'static str {
    match code.get(..2).unwrap_or_default() {
        "08" => ": connection exception",
        "23" => ": integrity constraint violation",
        "25" => ": invalid transaction state",
        "28" => ": invalid authorization",
        "3D" => ": the database does not exist",
        "40" => ": transaction rollback (serialization or deadlock)",
        "42" => ": syntax error or access rule violation",
        "53" => ": insufficient resources",
        "55" => ": object not in prerequisite state (a lock not available)",
        "57" => ": operator intervention (shutdown, cancel, timeout)",
        "58" => ": system error",
        _ => "",
    }
}

/// A request the store turns down, worded for the peer that made it.
///
/// Which status each becomes on the wire is decided in one place, the
/// server's `api::status`, by an exhaustive match: a new variant does not
/// compile until it has a status.
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
        "this node certificate is not known to this server: join again: bcd join --reset --yes, then bcd join"
    )]
    UnknownCertificate,
    /// With the signed statement of the deletion, when the store has one.
    #[error("node {0} was deleted: join again: bcd join --reset --yes, then bcd join --new-node")]
    DeletedNode(String, Option<Vec<u8>>),
    #[error(
        "this certificate does not belong to node {0}: join again: bcd join --reset --yes, then bcd join"
    )]
    WrongCertificate(String),
    /// With the signed statement of the revocation, when the store has one.
    #[error(
        "the node certificate was revoked ({0}): join again: bcd join --reset --yes, then bcd join --new-node"
    )]
    Revoked(String, Option<Vec<u8>>),
    /// A join's proof of a previous identity does not hold: the node and
    /// why. Nothing was spent.
    #[error(
        "cannot re-enrol node {0}: {1}: join as a new node instead (bcd join --new-node --server \
         https://HOST:PORT --token TOKEN), or ask an operator whether node {0} should go \
         (better-compute nodes delete {0} --yes)"
    )]
    NotReenrolled(String, String),
    #[error("certificate expired; renew and reconnect")]
    Expired,
    /// A join with no token whose EK (the SHA-256, hex) is neither bound
    /// to a node nor enrolled. Nothing was recorded.
    #[error(
        "this machine's TPM is not enrolled (EK SHA-256 {0}): ask an operator to enrol it \
         (better-compute machines enroll --ek-sha256 {0}), or join with a token: bcd join \
         --attestor tpm --server https://HOST:PORT --token TOKEN"
    )]
    NotEnrolled(String),
    /// A join with no token of a node quarantined as a cloned identity.
    #[error(
        "node {0} is quarantined: two machines presented its TPM's identity (a copied TPM \
         state?); an operator joins the real machine again with a token: bcd join --reset --yes \
         --attestor tpm --token TOKEN"
    )]
    Quarantined(String),
    /// A Hello with no proof that verifies from a node whose Hellos the
    /// key holder saw proved from a confirmed release.
    #[error(
        "node {0} signs its Hellos and this one carries no proof that verifies: another machine \
         with a copy of its key, or a bcd from before Hello proofs (run a release that signs its \
         Hellos, or join again: bcd join --reset --yes, then bcd join)"
    )]
    HelloUnproved(String),
    /// The request itself is wrong; the message says how.
    #[error("{0}")]
    BadRequest(String),
    #[error("no node {0}: see better-compute nodes list")]
    NoSuchNode(String),
    /// Something else the operator named does not exist; the message names
    /// it and where to look.
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the state forbids it now (a rollout still
    /// active, a sequence already registered); the message says what to do.
    #[error("{0}")]
    Conflict(String),
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

impl TxError {
    /// The refusal, if this is one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            TxError::Refused(r) => Some(r),
            TxError::Store(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_failure_reads_without_the_drivers_words() {
        let sqlite = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("database is locked in UPDATE nodes SET taints = ?1".into()),
        );
        let text = StoreError::Database(Box::new(sqlite)).to_string();
        assert!(
            text.contains("DatabaseBusy") && text.contains("result code 5"),
            "{text}"
        );
        assert!(!text.contains("UPDATE"), "{text}");
        let io = std::io::Error::other("disk I/O error in SELECT der FROM node_certs");
        let e = StoreError::Database(Box::new(io));
        assert!(!e.to_string().contains("SELECT"), "{e}");
        assert!(
            std::error::Error::source(&e).is_none(),
            "no chain prints the driver's error"
        );
        let own = StoreError::Database("compute_now() returned no row".into());
        assert_eq!(
            own.to_string(),
            "store database: compute_now() returned no row"
        );
    }
}
