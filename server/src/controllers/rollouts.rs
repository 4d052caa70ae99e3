//! The rollout controller: a release reaches a selection of nodes in
//! waves.
//!
//! A rollout fixes its nodes when it starts and walks cumulative waves
//! (1%, 10%, 50%, 100% of them by default). Each node gets one
//! `daemon.upgrade`, issued under the idempotency key
//! `rollout:<id>:<node>`, so a controller that dies between creating a
//! command and recording it (or two gateways running the controller at
//! once) never upgrades a node twice. A wave is over when every node in it
//! has confirmed, failed or been skipped (it already runs the release or a
//! later one). More failures than `max_failures` halt the rollout by
//! itself. Operators pause, resume and abort through `api::rollouts`.
//!
//! A node confirms only on a result its node signed: an upgrade the store
//! says succeeded is judged from the signed bytes first
//! ([`crate::evidence`], [`Believed`]), and a forged one counts as failed.
//! A cordoned node is not given its upgrade while it stays cordoned (its
//! signed spec says so, [`held_back`]): its wave waits for it.
//!
//! Release floors rise the same way, for every upgrade a rollout's or an
//! operator's ([`raise_floors`]): a gateway's row raises none.
//!
//! [`decide`] is the decision, pure; [`tick`] reads each running rollout
//! from the store, decides, and writes what was decided.

use std::sync::Arc;

use bc_store::commands::NewCommand;
use bc_store::rollouts::{NodeStatus, RolloutCommand, RolloutState};
use bc_store::{CommandId, NodeId, Store, TxError};
use bcd_core::command::Kind;
use bcd_proto::v1::{UpgradeArgs, command_payload};
use tracing::{info, warn};

use crate::api::rollouts::COMMAND_NOT_AFTER;

/// What the controller does next for a running rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Give these positions (in the rollout's order) the upgrade.
    Issue(Vec<usize>),
    /// The current wave is over: start the next.
    Advance(usize),
    Halt(String),
    Done,
    Wait,
}

/// Nodes in the first `wave + 1` waves: `pct` percent of `total`, rounded
/// up, at least one.
pub fn wave_end(total: usize, pct: u32) -> usize {
    if total == 0 {
        return 0;
    }
    (total * pct as usize).div_ceil(100).clamp(1, total)
}

/// The controller's decision for a running rollout, from each node's status
/// in rollout order.
pub fn decide(waves: &[u32], wave: usize, max_failures: u32, nodes: &[NodeStatus]) -> Step {
    let failures = nodes.iter().filter(|s| **s == NodeStatus::Failed).count();
    if failures > max_failures as usize {
        return Step::Halt(format!(
            "the failure budget is spent: {failures} failed upgrades, {max_failures} allowed"
        ));
    }
    let Some(pct) = waves.get(wave) else {
        return Step::Done;
    };
    let end = wave_end(nodes.len(), *pct);
    let issue: Vec<usize> = (0..end)
        .filter(|&i| nodes[i] == NodeStatus::Waiting)
        .collect();
    if !issue.is_empty() {
        return Step::Issue(issue);
    }
    if nodes[..end].iter().all(|s| s.settled()) {
        if wave + 1 < waves.len() {
            return Step::Advance(wave + 1);
        }
        return Step::Done;
    }
    Step::Wait
}

/// Upgrade results already judged, by command: a confirmed node's result
/// is verified once, not at every pass.
#[derive(Debug)]
pub struct Believed {
    ca_der: Arc<Vec<u8>>,
    judged: std::sync::Mutex<std::collections::HashMap<String, bool>>,
}

impl Believed {
    pub fn new(ca_der: Arc<Vec<u8>>) -> Believed {
        Believed {
            ca_der,
            judged: Default::default(),
        }
    }

    /// Whether the result of `command_id` may be acted on.
    async fn believed(&self, store: &Store, command_id: &str) -> Result<bool, TxError> {
        if let Some(&known) = self
            .judged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(command_id)
        {
            return Ok(known);
        }
        let Some(row) = store.get_command(&CommandId::from(command_id)).await? else {
            return Ok(false);
        };
        let certs = store.node_certificates(&row.node_id).await?;
        let evidence = crate::evidence::judge(&row, &certs, &self.ca_der);
        if let crate::evidence::Evidence::Forged(why) = &evidence {
            warn!(cmd = %command_id, node = %row.node_id, %why, "{}", FORGED_UPGRADE);
        }
        let believed = evidence.believed();
        self.judged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(command_id.to_string(), believed);
        Ok(believed)
    }
}

/// The log line of an upgrade result no node signed.
pub const FORGED_UPGRADE: &str = "an upgrade result in the store was not signed by its node: \
                                  the node counts as failed";

/// Upgrades judged for their floors in one pass at most.
const FLOORS_BATCH: u32 = 100;

/// Raises the release floors of nodes whose upgrades succeeded since the
/// last pass, each only when the node signed the result (a success no node
/// signed raises nothing, and is not looked at again).
pub async fn raise_floors(store: &Store, believed: &Believed) -> Result<(), TxError> {
    for id in store.upgrades_unjudged(FLOORS_BATCH).await? {
        let signed = believed.believed(store, &id).await?;
        if let Some(floor) = store.judge_upgrade_floor(&id, signed).await? {
            info!(cmd = %id, floor, "a confirmed upgrade raised its node's release floor");
        }
    }
    Ok(())
}

/// One pass: release floors from confirmed upgrades ([`raise_floors`]),
/// then the running rollouts. Returns the nodes given a command (their
/// gateway sessions are woken).
/// Whether `node` is cordoned, by its signed spec (one that does not open
/// counts as cordoned).
pub async fn held_back(
    store: &Store,
    key: &ring::signature::Ed25519KeyPair,
    node: &str,
) -> Result<bool, TxError> {
    let intent = crate::pki::seal::node_intent(store, key, node).await?;
    Ok(!matches!(intent, Ok(i) if i.cordon.is_none()))
}

pub async fn tick(
    store: &Store,
    key: &Arc<ring::signature::Ed25519KeyPair>,
    believed: &Believed,
    lease: &bc_store::leases::Held,
) -> Result<Vec<NodeId>, TxError> {
    raise_floors(store, believed).await?;
    let mut woken = Vec::new();
    let running: Vec<String> = store
        .list_rollouts()
        .await?
        .into_iter()
        .filter(|r| r.state == RolloutState::Running)
        .map(|r| r.id)
        .collect();
    for id in running {
        let Some(r) = store.rollout(&id).await? else {
            continue;
        };
        let mut statuses: Vec<NodeStatus> = Vec::with_capacity(r.nodes.len());
        for n in &r.nodes {
            let status = match (&n.status, &n.command_id) {
                (NodeStatus::Confirmed, Some(cmd)) if !believed.believed(store, cmd).await? => {
                    NodeStatus::Failed
                }
                _ => n.status,
            };
            statuses.push(status);
        }
        match decide(&r.waves, r.wave, r.max_failures, &statuses) {
            Step::Issue(positions) => {
                for i in positions {
                    let n = &r.nodes[i];
                    if n.release_floor >= r.sequence.get() {
                        store.skip_rollout_node(&id, &n.node_id, lease).await?;
                        continue;
                    }
                    // A cordoned node waits in its wave, as does one whose
                    // signed spec does not open (its cordon is unknown):
                    // the wave goes on with the others and ends once it is
                    // uncordoned, or the rollout is aborted.
                    if held_back(store, key, &n.node_id).await? {
                        continue;
                    }
                    let new = NewCommand {
                        node_id: n.node_id.clone(),
                        kind: Kind::DaemonUpgrade,
                        summary: format!("release {}", r.sequence),
                        not_after: COMMAND_NOT_AFTER,
                        min_generation: 0,
                        idempotency_key: Some(format!("rollout:{id}:{}", n.node_id)),
                    };
                    let args = command_payload::Args::Upgrade(UpgradeArgs {
                        sequence: r.sequence.get(),
                    });
                    let (row, created) =
                        crate::pki::seal::create_command(store, key, &new, args).await?;
                    store
                        .record_rollout_command(&id, &n.node_id, RolloutCommand::Upgrade, &row.id)
                        .await?;
                    if created {
                        info!(rollout = %id, node = %n.node_id, cmd = %row.id, "upgrade issued");
                        woken.push(n.node_id.clone());
                    }
                }
            }
            Step::Advance(to) => {
                if store.advance_rollout(&id, r.wave, to, lease).await? {
                    info!(rollout = %id, wave = to, pct = r.waves[to], "next wave");
                }
            }
            Step::Halt(reason) => {
                if store
                    .set_rollout_state(&id, &[RolloutState::Running], RolloutState::Halted, &reason)
                    .await?
                {
                    warn!(rollout = %id, %reason, "rollout halted");
                }
            }
            Step::Done => {
                if store
                    .set_rollout_state(&id, &[RolloutState::Running], RolloutState::Done, "")
                    .await?
                {
                    info!(rollout = %id, "rollout done");
                }
            }
            Step::Wait => {}
        }
    }
    Ok(woken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeStatus::*;

    #[test]
    fn waves_round_up_and_cover_everyone_at_100() {
        assert_eq!(wave_end(1000, 1), 10);
        assert_eq!(wave_end(10, 1), 1);
        assert_eq!(wave_end(10, 15), 2);
        assert_eq!(wave_end(10, 100), 10);
        assert_eq!(wave_end(0, 50), 0);
    }

    #[test]
    fn a_wave_issues_then_waits_then_advances() {
        let waves = [10, 100];
        let mut nodes = vec![Waiting; 10];
        assert_eq!(decide(&waves, 0, 0, &nodes), Step::Issue(vec![0]));
        nodes[0] = Upgrading;
        assert_eq!(decide(&waves, 0, 0, &nodes), Step::Wait);
        nodes[0] = Confirmed;
        assert_eq!(decide(&waves, 0, 0, &nodes), Step::Advance(1));
        assert_eq!(decide(&waves, 1, 0, &nodes), Step::Issue((1..10).collect()));
        for n in &mut nodes[1..] {
            *n = Confirmed;
        }
        nodes[3] = Skipped;
        assert_eq!(decide(&waves, 1, 0, &nodes), Step::Done);
    }

    #[test]
    fn the_failure_budget_halts() {
        let waves = [50, 100];
        let mut nodes = vec![Waiting; 4];
        nodes[0] = Failed;
        nodes[1] = Upgrading;
        assert_eq!(decide(&waves, 0, 1, &nodes), Step::Wait, "within budget");
        nodes[1] = Failed;
        assert!(matches!(decide(&waves, 0, 1, &nodes), Step::Halt(_)));
        // Nodes past the halted wave never got anything.
        assert_eq!(nodes[2], Waiting);
    }
}
