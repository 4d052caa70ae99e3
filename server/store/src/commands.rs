//! Commands: created signed, dispatched along the node's current route,
//! finished by the first terminal result.
//!
//! A command gets the node's next sequence number and is sealed (signed by
//! a worker key, outside this crate) inside the creating transaction, so
//! its payload names its id, sequence and deadline. A repeated idempotency
//! key returns the first command. Dispatch is a join on the node's session:
//! a node routed elsewhere, or a stale epoch, gets nothing. A result is
//! the node's signed fact ([`crate::nodes::judge_signed`]): one that does
//! not verify is recorded as `security.result.forged` and applied nowhere,
//! so neither a release floor nor a rollout moves on it. The first terminal
//! result wins, from any epoch (`bcd_core::command::apply_result`).
//! The sweeper expires commands still pending after their deadline, never
//! one a node may hold.

use crate::id::{CommandId, GatewayId, NodeId};
use std::time::Duration;

use bcd_core::command::{Kind, ServerState};

use crate::error::Refusal;
use crate::named::Named;

/// A command to create.
#[derive(Debug, Clone)]
pub struct NewCommand {
    pub node_id: NodeId,
    pub kind: Kind,
    pub summary: String,
    /// Relative deadline from the store's now.
    pub not_after: Duration,
    pub min_generation: u64,
    pub idempotency_key: Option<String>,
}

/// What the sealer signs: everything the store decides about a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSeal {
    pub id: CommandId,
    pub node_id: NodeId,
    pub seq: u64,
    pub kind: Kind,
    pub issued_at_ms: i64,
    pub not_after_ms: i64,
    pub min_generation: u64,
}

/// Seals a command inside its creating transaction: returns the signed
/// bytes the store keeps and the node verifies.
pub type SealCommand = Box<dyn FnOnce(&CommandSeal) -> Vec<u8> + Send>;

/// A command ready to send: its id, sequence and signed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    pub id: CommandId,
    pub seq: u64,
    pub signed: Vec<u8>,
    /// How long the command waited in the store before this, its first
    /// dispatch (store clock); `None` when it is sent again (a replay).
    pub waited_ms: Option<i64>,
}

/// A command as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRow {
    pub id: CommandId,
    pub node_id: NodeId,
    pub seq: u64,
    pub kind: Named<Kind>,
    pub summary: String,
    pub state: Named<ServerState>,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub output: Vec<u8>,
    pub output_truncated: bool,
    pub created_at_ms: i64,
    pub not_after_ms: i64,
    pub result_at_ms: Option<i64>,
    pub epoch: u64,
    /// The result as its node signed it, when a node's result ended the
    /// command (`None` for one the store decided, or from before results
    /// kept their signature): what a reader verifies instead of believing
    /// the columns above, which a gateway writes.
    pub signed_result: Option<SignedResult>,
    /// Whether it finished before results kept their node's signature
    /// (listed once, by the migration that began keeping them, in a table
    /// no gateway writes): its row is all there is, as before.
    pub legacy: bool,
}

/// A result's signed bytes (a `CommandResult`) and the node's signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedResult {
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
}

/// The stored pair, when both are there.
pub fn signed_result(payload: Option<Vec<u8>>, signature: Option<Vec<u8>>) -> Option<SignedResult> {
    Some(SignedResult {
        payload: payload?,
        signature: signature?,
    })
}

/// A result as the node signed it (inside a [`crate::nodes::Signed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultInput {
    /// The node the result says ran the command.
    pub node_id: NodeId,
    pub command_id: CommandId,
    pub outcome: bcd_core::command::Outcome,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub output: Vec<u8>,
    pub output_truncated: bool,
}

impl crate::nodes::About for ResultInput {
    fn node_id(&self) -> &str {
        &self.node_id
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultApplied {
    /// The command is now terminal with this result.
    Applied,
    /// It was terminal already; the first result stands.
    Duplicate,
    /// No such command for this node.
    Unknown,
    /// Not the node's signed fact: recorded as [`FORGED`], applied nowhere.
    Forged(String),
}

/// A result a node signed for a command the store does not know (it was
/// restored from a set taken before the command), kept as the node sent it
/// so the key holder can verify and receipt it, and the node forget it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownResult {
    pub node_id: NodeId,
    pub command_id: CommandId,
    /// The signed `CommandResult`, as sent.
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
}

/// Unknown results kept per node at most: a node that makes them up fills
/// nothing (past it, they are not stored and get no receipt).
pub const UNKNOWN_RESULTS_PER_NODE: i64 = 1_000;

/// The fleet event a forged result is recorded as.
pub const FORGED: &str = "security.result.forged";

/// The reason the sweeper records.
pub const SWEPT: &str = "not_after passed before dispatch";

/// A fresh command id.
/// The session a node's message came on: its gateway and epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub gateway_id: GatewayId,
    pub node_id: NodeId,
    pub epoch: u64,
}

/// What an ack moves a command to, and the states (an SQL list) it may
/// move it from: only forward, so an ACCEPTED that arrives late (or is
/// replayed) cannot take a running command back to acked.
pub fn ack_moves(running: bool) -> (&'static str, &'static str) {
    if running {
        (ServerState::Running.name(), "'dispatched', 'acked'")
    } else {
        (ServerState::Acked.name(), "'dispatched'")
    }
}

pub fn new_command_id() -> String {
    format!("cmd-{:016x}", rand::random::<u64>())
}

/// An idempotency key that names a command of another node or kind is a
/// mistake, not a repeat.
pub fn same_request(existing: &CommandRow, new: &NewCommand, key: &str) -> Result<(), Refusal> {
    if existing.node_id != new.node_id || existing.kind != new.kind {
        return Err(Refusal::Conflict(format!(
            "idempotency key {key:?} was used for command {} ({} on {}); use a new key",
            existing.id, existing.kind, existing.node_id
        )));
    }
    Ok(())
}

/// The pending commands that may go to the node now, in sequence order: a
/// command whose `min_generation` the node has not applied waits, and so
/// do the commands after it, so the node still sees sequence order.
pub fn dispatchable(pending: Vec<(Dispatch, u64)>, applied_generation: u64) -> Vec<Dispatch> {
    pending
        .into_iter()
        .take_while(|(_, min_generation)| *min_generation <= applied_generation)
        .map(|(d, _)| d)
        .collect()
}

/// The release floor a succeeded command raises its node to: a confirmed
/// `daemon.upgrade` of release N (summary `release N`).
pub fn raises_floor(kind: &str, summary: &str) -> Option<u64> {
    (kind == Kind::DaemonUpgrade.name())
        .then(|| summary.strip_prefix("release ")?.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: &str, seq: u64) -> Dispatch {
        Dispatch {
            id: id.into(),
            seq,
            signed: vec![],
            waited_ms: Some(0),
        }
    }

    #[test]
    fn a_command_waiting_for_a_generation_holds_back_the_ones_after_it() {
        let pending = vec![(d("a", 1), 0), (d("b", 2), 3), (d("c", 3), 0)];
        let ids = |v: Vec<Dispatch>| v.into_iter().map(|d| d.id).collect::<Vec<_>>();
        assert_eq!(ids(dispatchable(pending.clone(), 2)), ["a"]);
        assert_eq!(ids(dispatchable(pending, 3)), ["a", "b", "c"]);
    }

    #[test]
    fn only_a_confirmed_upgrade_raises_the_floor() {
        assert_eq!(raises_floor("daemon.upgrade", "release 7"), Some(7));
        assert_eq!(raises_floor("daemon.upgrade", "release x"), None);
        assert_eq!(raises_floor("exec.run", "release 7"), None);
    }

    #[test]
    fn a_reused_idempotency_key_must_name_the_same_node_and_kind() {
        let row = CommandRow {
            id: "cmd-1".into(),
            node_id: "n1".into(),
            seq: 1,
            kind: Kind::ExecRun.into(),
            summary: String::new(),
            state: ServerState::Pending.into(),
            reason: String::new(),
            exit_code: None,
            output: vec![],
            output_truncated: false,
            created_at_ms: 0,
            not_after_ms: 0,
            result_at_ms: None,
            epoch: 0,
            signed_result: None,
            legacy: false,
        };
        let new = NewCommand {
            node_id: "n1".into(),
            kind: Kind::ExecRun,
            summary: String::new(),
            not_after: Duration::ZERO,
            min_generation: 0,
            idempotency_key: Some("k".into()),
        };
        assert_eq!(same_request(&row, &new, "k"), Ok(()));
        let other = NewCommand {
            node_id: "n2".into(),
            ..new
        };
        assert!(matches!(
            same_request(&row, &other, "k"),
            Err(Refusal::Conflict(m)) if m.contains("was used for command cmd-1")
        ));
    }
}
