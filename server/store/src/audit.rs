//! The audit history and the facts the invariant checkers read.
//!
//! Triggers fill the audit history as routes, liveness transitions, gateway
//! lease writes, spec generations, release floors, bindings and terminal
//! command states commit, whichever code path wrote them, each stamped with
//! `compute_now()`. An [`AuditSnapshot`] is that history with the current
//! tables it is checked against, read in one transaction.
//!
//! The history is a hash chain. As each record commits, the store gives it
//! the next sequence number and the hash of its content and of the record
//! before it ([`chain_hash`]), and moves the chain's head (`audit_head`: the
//! last sequence number and hash) on. Sequence numbers come from the head,
//! inside the writing transaction, so they are gapless and never repeat, a
//! database restart included. A record edited afterwards no longer matches
//! its hash; a removed one leaves a gap, or (the last ones) a head that
//! points past the history. [`verify_chain`] checks all of it.

use std::collections::BTreeMap;

/// One row of the audit history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// Its place in the history: the chain's sequence number (0 for a
    /// record the chain never sealed, which [`verify_chain`] reports).
    pub id: i64,
    pub at: i64,
    pub node_id: String,
    /// `route`, `disconnected`, `unreachable`, `lease`, `generation`,
    /// `floor`, `result`, `binding`, `backup`.
    pub kind: String,
    pub epoch: u64,
    pub gateway_id: String,
    pub value: i64,
    pub detail: String,
    /// The hash of the record before it (the chain's start: [`GENESIS`]).
    pub prev_hash: String,
    /// The hash of this record's content and `prev_hash`.
    pub hash: String,
}

/// The `prev_hash` of the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The chain's head: the last sequence number given and its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHead {
    pub seq: i64,
    pub hash: String,
}

/// The hash of one audit record: SHA-256, in lowercase hex, of its fields
/// and the hash before it, each on its own line, text fields prefixed by
/// their length in characters (so no field can borrow from the next).
/// PostgreSQL computes the same text in SQL (`audit_hash` in migration
/// 0013); the version tag names this layout.
#[allow(clippy::too_many_arguments)]
pub fn chain_hash(
    prev: &str,
    seq: i64,
    at: i64,
    node_id: &str,
    kind: &str,
    epoch: i64,
    gateway_id: &str,
    value: i64,
    detail: &str,
) -> String {
    fn text(s: &str) -> String {
        format!("{}:{s}", s.chars().count())
    }
    let canonical = format!(
        "bc-audit-v1\n{prev}\n{seq}\n{at}\n{}\n{}\n{epoch}\n{}\n{value}\n{}",
        text(node_id),
        text(kind),
        text(gateway_id),
        text(detail),
    );
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(canonical.as_bytes()))
}

impl AuditRow {
    /// What this record's hash must be.
    pub fn expected_hash(&self) -> String {
        chain_hash(
            &self.prev_hash,
            self.id,
            self.at,
            &self.node_id,
            &self.kind,
            self.epoch as i64,
            &self.gateway_id,
            self.value,
            &self.detail,
        )
    }
}

/// Checks the history (in sequence order) against itself and the head:
/// every record sealed, sequence numbers 1, 2, 3... with none missing or
/// repeated, each record's `prev_hash` the hash before it, each hash
/// matching the record's content, and the head at the last record. Returns
/// one sentence per break.
pub fn verify_chain(audit: &[AuditRow], head: &ChainHead) -> Vec<String> {
    let mut v = Vec::new();
    let mut expected_seq = 1;
    let mut prev = GENESIS.to_string();
    for r in audit {
        if r.id == 0 || r.hash.is_empty() {
            v.push(format!(
                "an audit record ({} of node '{}' at {}) was never sealed into the chain: it was written around the store",
                r.kind, r.node_id, r.at
            ));
            continue;
        }
        if r.id < expected_seq {
            v.push(format!("audit record {} appears twice", r.id));
            continue;
        }
        if r.id > expected_seq {
            v.push(if r.id == expected_seq + 1 {
                format!("audit record {expected_seq} is missing: it was removed")
            } else {
                format!(
                    "audit records {expected_seq} to {} are missing: they were removed",
                    r.id - 1
                )
            });
        } else if r.prev_hash != prev {
            v.push(format!(
                "audit record {} does not follow the record before it: the chain was rewritten",
                r.id
            ));
        }
        if r.hash != r.expected_hash() {
            v.push(format!(
                "audit record {} ({} of node '{}') was edited: its content no longer matches its hash",
                r.id, r.kind, r.node_id
            ));
        }
        expected_seq = r.id + 1;
        prev = r.hash.clone();
    }
    let last = expected_seq - 1;
    if head.seq > last {
        v.push(format!(
            "the audit history ends at record {last} but the chain's head is at {}: the last records were removed",
            head.seq
        ));
    } else if head.seq < last {
        v.push(format!(
            "the chain's head is at record {} but the history goes on to {last}: records were added around the store",
            head.seq
        ));
    } else if head.hash != prev && last > 0 {
        v.push(format!(
            "the chain's head does not carry the hash of record {last}: the last record was replaced"
        ));
    }
    v
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFact {
    pub node_id: String,
    pub epoch: u64,
    pub gateway_id: String,
    pub state: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandFact {
    pub id: String,
    pub node_id: String,
    pub kind: String,
    pub state: String,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingFact {
    pub node_id: String,
    pub allocation_id: String,
    pub gpus: Vec<String>,
    pub state: String,
}

/// The audit history and the current tables, as of one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSnapshot {
    pub now: i64,
    /// In sequence order.
    pub audit: Vec<AuditRow>,
    pub head: ChainHead,
    pub sessions: Vec<SessionFact>,
    /// Gateway id → its lease's expiry.
    pub leases: BTreeMap<String, i64>,
    /// Every lease (gateway and controller): name → (owner, expiry).
    pub all_leases: BTreeMap<String, (String, i64)>,
    /// The nodes the store knows.
    pub nodes: std::collections::BTreeSet<String>,
    pub commands: Vec<CommandFact>,
    pub bindings: Vec<BindingFact>,
    /// Node → desired spec generation.
    pub desired: BTreeMap<String, u64>,
    /// Node → the applied spec generation it reported.
    pub applied: BTreeMap<String, u64>,
    /// Every backup set.
    pub backups: Vec<crate::backups::BackupRow>,
}

/// How far the fleet is from settled: commands not finished, and nodes
/// whose applied spec generation is not the desired one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settling {
    pub open_commands: usize,
    pub unapplied_specs: usize,
}
