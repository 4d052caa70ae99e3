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
    /// The database failed (I/O, a lock held too long, a constraint).
    #[error("store database: {0}")]
    Database(#[source] Box<dyn std::error::Error + Send + Sync>),
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
    /// A stored value does not parse: a bug or a hand-edited store.
    #[error("the store holds a value it cannot read: {0}")]
    Corrupt(String),
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
