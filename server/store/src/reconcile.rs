//! What every start of the key holder reconciles (`Backend::reconcile`),
//! in one transaction, idempotently: running it twice in a row changes
//! nothing the second time but the audit record it leaves.
//!
//! - Leases dead for longer than `dead_after` (their holder is gone and
//!   nothing took them over) are removed; the sweeper does the same on each
//!   tick, so none lingers.
//! - Derived node state is recomputed from the session it derives from:
//!   a node carries the unreachable condition and taint exactly while its
//!   session is unreachable.
//! - What the running controllers take over is counted, not touched:
//!   routes that name a gateway with no live lease (the liveness sweep
//!   disconnects them on the store's clock), commands dispatched to a node
//!   that is away (the node holds them; its result, or its journal's replay
//!   on reconnect, ends each exactly once) and rollouts mid-wave (resumed
//!   from their recorded wave).
//!
//! The outcome is written to the audit history as a `reconcile` record.

use serde::Serialize;

use crate::nodes::{CONDITION_UNREACHABLE, TAINT_UNREACHABLE, with, without};

/// What one reconcile found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reconciled {
    /// Leases removed, by name.
    pub leases_removed: Vec<String>,
    /// Nodes whose conditions or taints were recomputed to a new value.
    pub derived_fixed: Vec<String>,
    /// Connected sessions routed through a gateway with no live lease.
    pub routes_to_dead_gateways: u64,
    /// Commands dispatched or running on a node that is not connected.
    pub commands_held_by_away_nodes: u64,
    /// Rollouts in progress.
    pub rollouts_running: u64,
}

/// How much history the sweeper keeps where a peer can add rows: security
/// events per node (a hostile gateway forging facts adds one per
/// attempt) and boot records (every `/boot/ipxe` request adds one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    pub fleet_events_per_node: u32,
    pub boots_per_mac: u32,
    pub boots: u32,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        HistoryLimits {
            fleet_events_per_node: 1_000,
            boots_per_mac: 100,
            boots: 10_000,
        }
    }
}

/// Rows the sweeper removed, oldest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub fleet_events: u64,
    pub boots: u64,
}

/// A node's conditions and taints as its session state says they must be.
pub fn derived(
    conditions: Vec<String>,
    taints: Vec<String>,
    session_state: Option<&str>,
) -> (Vec<String>, Vec<String>) {
    if session_state == Some("unreachable") {
        (
            with(conditions, CONDITION_UNREACHABLE),
            with(taints, TAINT_UNREACHABLE),
        )
    } else {
        (
            without(conditions, CONDITION_UNREACHABLE),
            without(taints, TAINT_UNREACHABLE),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_is_derived_from_the_session_alone() {
        let other = vec!["DaemonCrashLoop".to_string()];
        let (c, t) = derived(other.clone(), vec![], Some("unreachable"));
        assert!(c.contains(&CONDITION_UNREACHABLE.to_string()) && c.contains(&other[0]));
        assert_eq!(t, vec![TAINT_UNREACHABLE.to_string()]);
        for state in [Some("connected"), Some("disconnected"), None] {
            let (c2, t2) = derived(c.clone(), t.clone(), state);
            assert_eq!(c2, other);
            assert!(t2.is_empty());
        }
        // Idempotent.
        let once = derived(c.clone(), t.clone(), Some("unreachable"));
        assert_eq!(
            derived(once.0.clone(), once.1.clone(), Some("unreachable")),
            once
        );
    }
}
