//! The audit history and the facts the invariant checkers read.
//!
//! Triggers fill the audit history as routes, liveness transitions, gateway
//! lease writes, spec generations, release floors, bindings and terminal
//! command states commit, whichever code path wrote them, each stamped with
//! `compute_now()`. An [`AuditSnapshot`] is that history with the current
//! tables it is checked against, read in one transaction.

use std::collections::BTreeMap;

/// One row of the audit history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
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
    pub audit: Vec<AuditRow>,
    pub sessions: Vec<SessionFact>,
    /// Gateway id → its lease's expiry.
    pub leases: BTreeMap<String, i64>,
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
