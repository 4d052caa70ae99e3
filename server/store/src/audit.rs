//! The audit history and the facts the invariant checkers read.
//!
//! Triggers fill the audit history as routes, liveness transitions, gateway
//! lease writes, spec generations, release floors, bindings and terminal
//! command states commit, whichever code path wrote them, each stamped with
//! `compute_now()`. An [`AuditSnapshot`] is that history with the current
//! tables it is checked against, read in one transaction.
//!
//! The history is a set of hash chains. As each record commits, the store
//! puts it in one chain ([`chain_of`]: chosen by the record's node, or its
//! gateway for a record of no node) and gives it that chain's next sequence
//! number and the hash of its content and of the chain's record before it
//! ([`chain_hash`]), and moves the chain's head (`audit_head`: one row per
//! chain, its last sequence number and hash) on. Sequence numbers come from
//! the head, inside the writing transaction, so each chain is gapless and
//! never repeats a number, a database restart included. Transactions that
//! write to different chains do not wait for each other's heads (on
//! PostgreSQL a head's row lock is held to the commit, so one chain would
//! let only one audited transaction commit at a time). A record edited
//! afterwards no longer matches its hash; a removed one leaves a gap in its
//! chain, or (a chain's last ones) a head that points past the chain.
//! [`verify_chain`] checks every chain.
//!
//! Chain 0 ([`SEALED_CHAIN`]) is the single chain every record went into
//! before migration 0019: its records keep their place and their hashes
//! (`bc-audit-v1`), and no record is added to it. Chains 1 to
//! [`AUDIT_CHAINS`] hash their chain's number too (`bc-audit-v2`).

use crate::id::{CommandId, GatewayId, NodeId};
use std::collections::BTreeMap;

/// The audit history in the order of [`AuditRow::id`], with the columns
/// [`AuditRow`] takes (`id` is its place in the result), on both backends.
pub const AUDIT_IN_ORDER: &str = "SELECT COALESCE(chain, 0), COALESCE(seq, 0), at, node_id, kind, \
     epoch, gateway_id, value, detail, COALESCE(prev_hash, ''), COALESCE(hash, '') FROM audit \
     ORDER BY CASE WHEN seq IS NULL THEN 0 WHEN chain = 0 THEN 1 ELSE 2 END, \
     CASE WHEN chain = 0 THEN seq ELSE id END";

/// One row of the audit history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// Its place in the history, from 1: the records of [`SEALED_CHAIN`]
    /// in their sequence, then the later ones in the order they were
    /// written. Records that change one row (a node's session, a gateway's
    /// lease, a command) are written in the order they commit, since each
    /// holds that row's lock to its commit.
    pub id: i64,
    /// The chain it was sealed into.
    pub chain: i64,
    /// Its sequence number in its chain (0 for a record the store never
    /// sealed, which [`verify_chain`] reports).
    pub seq: i64,
    pub at: i64,
    pub node_id: NodeId,
    /// `route`, `disconnected`, `unreachable`, `lease`, `generation`,
    /// `floor`, `result`, `binding`, `backup`.
    pub kind: String,
    pub epoch: u64,
    pub gateway_id: GatewayId,
    pub value: i64,
    pub detail: String,
    /// The hash of the record before it (the chain's start: [`GENESIS`]).
    pub prev_hash: String,
    /// The hash of this record's content and `prev_hash`.
    pub hash: String,
}

/// The `prev_hash` of the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The chain the history was written to before migration 0019, closed
/// since: its records are hashed without a chain number (`bc-audit-v1`).
pub const SEALED_CHAIN: i64 = 0;

/// How many chains records are added to (numbered 1 to this): enough that
/// concurrent audited transactions rarely wait for one head. The
/// migrations that made them (0019) fix the number on both backends.
pub const AUDIT_CHAINS: i64 = 16;

/// The chain a record goes into: by its node, or its gateway for a record
/// of no node, so each node's records are in one chain, in order. SHA-256
/// of the key, first byte, modulo [`AUDIT_CHAINS`], plus one; PostgreSQL
/// computes the same in SQL (`audit_chain_of` in migration 0019).
pub fn chain_of(node_id: &str, gateway_id: &str) -> i64 {
    use sha2::Digest;
    let key = if node_id.is_empty() {
        gateway_id
    } else {
        node_id
    };
    1 + i64::from(sha2::Sha256::digest(key.as_bytes())[0]) % AUDIT_CHAINS
}

/// One chain's head: the last sequence number given and its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHead {
    pub chain: i64,
    pub seq: i64,
    pub hash: String,
}

/// The hash of one audit record: SHA-256, in lowercase hex, of its fields
/// and the hash before it, each on its own line, text fields prefixed by
/// their length in characters (so no field can borrow from the next).
/// The version tag names the layout: `bc-audit-v1` for [`SEALED_CHAIN`];
/// `bc-audit-v2`, with the chain's number on the line after the tag, for
/// the others. PostgreSQL computes the same text in SQL (`audit_hash` in
/// migration 0013, `audit_hash_v2` in 0019).
#[allow(clippy::too_many_arguments)]
pub fn chain_hash(
    chain: i64,
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
    let tag = if chain == SEALED_CHAIN {
        "bc-audit-v1".to_string()
    } else {
        format!("bc-audit-v2\n{chain}")
    };
    let canonical = format!(
        "{tag}\n{prev}\n{seq}\n{at}\n{}\n{}\n{epoch}\n{}\n{value}\n{}",
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
            self.chain,
            &self.prev_hash,
            self.seq,
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

/// Checks the history against itself and the heads: every record sealed;
/// in each chain, sequence numbers 1, 2, 3... with none missing or
/// repeated, each record's `prev_hash` the hash before it, each hash
/// matching the record's content, and the chain's head at its last record;
/// a head for [`SEALED_CHAIN`] and for each of the [`AUDIT_CHAINS`], and
/// no record in a chain without one. Returns one sentence per break.
pub fn verify_chain(audit: &[AuditRow], heads: &[ChainHead]) -> Vec<String> {
    let mut v = Vec::new();
    let mut chains: BTreeMap<i64, Vec<&AuditRow>> = BTreeMap::new();
    for r in audit {
        if r.seq == 0 || r.hash.is_empty() {
            v.push(format!(
                "an audit record ({} of node '{}' at {}) was never sealed into the chain: it was written around the store",
                r.kind, r.node_id, r.at
            ));
            continue;
        }
        chains.entry(r.chain).or_default().push(r);
    }
    let heads: BTreeMap<i64, &ChainHead> = heads.iter().map(|h| (h.chain, h)).collect();
    for chain in SEALED_CHAIN..=AUDIT_CHAINS {
        if !heads.contains_key(&chain) {
            v.push(format!(
                "the head of audit chain {chain} is missing: it was removed"
            ));
        }
    }
    for (chain, records) in &mut chains {
        if !heads.contains_key(chain) {
            v.push(format!(
                "{} audit records are in chain {chain}, which the store does not keep: they were written around the store",
                records.len()
            ));
        }
        records.sort_by_key(|r| r.seq);
    }
    for (chain, head) in heads {
        if !(SEALED_CHAIN..=AUDIT_CHAINS).contains(&chain) {
            v.push(format!(
                "the store keeps no audit chain {chain}, but it has a head: it was written around the store"
            ));
        }
        let records = chains.get(&chain).map_or(&[][..], |r| &r[..]);
        verify_one(chain, records, head, &mut v);
    }
    v
}

/// [`verify_chain`] for one chain's records, in sequence order.
fn verify_one(chain: i64, records: &[&AuditRow], head: &ChainHead, v: &mut Vec<String>) {
    let mut expected_seq = 1;
    let mut prev = GENESIS.to_string();
    for r in records {
        if r.seq < expected_seq {
            v.push(format!(
                "audit record {} of chain {chain} appears twice",
                r.seq
            ));
            continue;
        }
        if r.seq > expected_seq {
            v.push(if r.seq == expected_seq + 1 {
                format!("audit record {expected_seq} of chain {chain} is missing: it was removed")
            } else {
                format!(
                    "audit records {expected_seq} to {} of chain {chain} are missing: they were removed",
                    r.seq - 1
                )
            });
        } else if r.prev_hash != prev {
            v.push(format!(
                "audit record {} of chain {chain} does not follow the record before it: the chain was rewritten",
                r.seq
            ));
        }
        if r.hash != r.expected_hash() {
            v.push(format!(
                "audit record {} of chain {chain} ({} of node '{}') was edited: its content no longer matches its hash",
                r.seq, r.kind, r.node_id
            ));
        }
        expected_seq = r.seq + 1;
        prev = r.hash.clone();
    }
    let last = expected_seq - 1;
    if head.seq > last {
        v.push(format!(
            "audit chain {chain} ends at record {last} but its head is at {}: the last records were removed",
            head.seq
        ));
    } else if head.seq < last {
        v.push(format!(
            "the head of audit chain {chain} is at record {} but the chain goes on to {last}: records were added around the store",
            head.seq
        ));
    } else if head.hash != prev && last > 0 {
        v.push(format!(
            "the head of audit chain {chain} does not carry the hash of record {last}: the last record was replaced"
        ));
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFact {
    pub node_id: NodeId,
    pub epoch: u64,
    pub gateway_id: GatewayId,
    pub state: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandFact {
    pub id: CommandId,
    pub node_id: NodeId,
    pub kind: String,
    pub state: String,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingFact {
    pub node_id: NodeId,
    pub allocation_id: String,
    pub gpus: Vec<String>,
    pub state: String,
}

/// The audit history alone: every record in order and every chain's head,
/// as of one moment (what `audit list|verify|export` read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditHistory {
    pub now: i64,
    /// In the order of [`AuditRow::id`].
    pub audit: Vec<AuditRow>,
    /// Every chain's head, by chain.
    pub heads: Vec<ChainHead>,
}

/// The audit history and the current tables, as of one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSnapshot {
    pub now: i64,
    /// In the order of [`AuditRow::id`].
    pub audit: Vec<AuditRow>,
    /// Every chain's head, by chain.
    pub heads: Vec<ChainHead>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(chain: i64) -> String {
        chain_hash(
            chain,
            GENESIS,
            1,
            1000,
            "n1",
            "route",
            2,
            "gw-a",
            0,
            r#"{"a":1}"#,
        )
    }

    /// The layouts are persisted: a record sealed today verifies forever.
    #[test]
    fn the_hash_layouts_and_the_choice_of_chain_are_pinned() {
        assert_eq!(
            record(SEALED_CHAIN),
            "8e7ea81f2bcfdf6796bb41d04f6aae32301974d5f8299698cfc22daea1ca158c"
        );
        assert_eq!(
            record(3),
            "feb975f1437c825595075c6606949679dbdc67bc8be24719f395d5ca1c45e6be"
        );
        assert_eq!(chain_of("n1", "gw-a"), 8);
        assert_eq!(chain_of("", "gw-a"), 12);
        assert_eq!(chain_of("", ""), 4);
        for k in 0..1000 {
            let c = chain_of(&format!("node-{k}"), "");
            assert!((1..=AUDIT_CHAINS).contains(&c), "{c}");
        }
    }
}
