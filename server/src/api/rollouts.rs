//! Rollouts: `StartRollout`, `ListRollouts`, `GetRollout`, and
//! `ChangeRollout` (pause, resume, abort; abort with rollback swaps back
//! only nodes whose upgrade is still in flight: a confirmed node keeps its
//! release, and a bad release that confirmed is fixed by rolling forward).
//! The controller that walks running rollouts is
//! `controllers::rollouts`.

use bc_store::ReleaseSeq;
use std::time::Duration;

use bc_store::Refusal;
use bc_store::commands::NewCommand;
use bc_store::rollouts::{
    CANCELLED, DEFAULT_WAVES, NewRollout, Rollout, RolloutCommand, RolloutState,
};
use bcd_core::command::{Kind, ServerState};
use bcd_proto::v1::{
    self, ChangeRolloutRequest, ListRolloutsResponse, NoArgs, RolloutInfo, StartRolloutRequest,
    command_payload,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, status, unavailable};

/// How long a rollout's upgrade or rollback command may wait for its node.
pub const COMMAND_NOT_AFTER: Duration = Duration::from_secs(24 * 3600);

/// What the operator asks of a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Pause,
    Resume,
    Abort { rollback: bool },
}

impl Change {
    /// The states it moves a rollout from, and to.
    fn transition(self) -> (&'static [RolloutState], RolloutState, &'static str) {
        match self {
            Change::Pause => (&[RolloutState::Running], RolloutState::Paused, "paused"),
            Change::Resume => (
                &[RolloutState::Paused, RolloutState::Halted],
                RolloutState::Running,
                "",
            ),
            Change::Abort { .. } => (
                &[
                    RolloutState::Running,
                    RolloutState::Paused,
                    RolloutState::Halted,
                ],
                RolloutState::Aborted,
                "aborted by an operator",
            ),
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Change::Pause => "pause it",
            Change::Resume => "resume it",
            Change::Abort { .. } => "abort it",
        }
    }
}

fn no_rollout(id: &str) -> Status {
    refusal(Refusal::NotFound(format!(
        "no rollout {id}: see better-compute rollouts status"
    )))
}

pub fn info(r: Rollout) -> RolloutInfo {
    RolloutInfo {
        id: r.id,
        sequence: r.sequence.get(),
        version: r.version,
        selector: r.selector,
        waves: r.waves,
        max_failures: r.max_failures,
        state: bcd_proto::typed::parse::<v1::RolloutState>(r.state.name())
            .unwrap_or(v1::RolloutState::Unspecified) as i32,
        wave: r.wave as u32,
        reason: r.reason,
        created_at_ms: r.created_at_ms,
        nodes: r
            .nodes
            .into_iter()
            .map(|n| v1::RolloutNode {
                node_id: n.node_id.into_string(),
                position: n.position as u32,
                status: bcd_proto::typed::parse::<v1::RolloutNodeStatus>(n.status.name())
                    .unwrap_or(v1::RolloutNodeStatus::Unspecified) as i32,
                command_id: n.command_id.unwrap_or_default().into_string(),
                reason: n.reason,
                rollback_command_id: n.rollback_id.unwrap_or_default().into_string(),
            })
            .collect(),
    }
}

pub async fn get(svc: &AdminService, id: String) -> Result<RolloutInfo, Status> {
    svc.store
        .rollout(&id)
        .await
        .map_err(unavailable)?
        .map(info)
        .ok_or_else(|| no_rollout(&id))
}

pub async fn list(svc: &AdminService) -> Result<ListRolloutsResponse, Status> {
    let rows = svc.store.list_rollouts().await.map_err(unavailable)?;
    Ok(ListRolloutsResponse {
        rollouts: rows.into_iter().map(info).collect(),
    })
}

pub async fn start(svc: &AdminService, r: StartRolloutRequest) -> Result<RolloutInfo, Status> {
    let waves = if r.waves.is_empty() {
        DEFAULT_WAVES.to_vec()
    } else {
        r.waves
    };
    let selector = crate::labels::Selector::parse(&r.label_selector).map_err(bad_request)?;
    let labels = if selector.is_empty() {
        None
    } else {
        // Read from the signed specs: a node whose spec does not open
        // matches no label selector.
        let among = crate::pki::seal::intents(&svc.store, &svc.worker_key)
            .await
            .map_err(unavailable)?
            .into_iter()
            .filter(|(_, i)| i.as_ref().is_ok_and(|i| selector.matches(&i.labels)))
            .map(|(n, _)| n)
            .collect();
        Some((selector.to_string(), among))
    };
    let rollout = svc
        .store
        .start_rollout(&NewRollout {
            sequence: ReleaseSeq::new(r.sequence),
            selector: r.selector,
            waves,
            max_failures: r.max_failures,
            labels,
        })
        .await
        .map_err(status)?;
    info!(rollout = %rollout.id, sequence = rollout.sequence.get(), nodes = rollout.nodes.len(), "rollout started");
    svc.rollouts.notify_one();
    Ok(info(rollout))
}

pub async fn change(svc: &AdminService, r: ChangeRolloutRequest) -> Result<RolloutInfo, Status> {
    let change = match v1::RolloutAction::try_from(r.action) {
        Ok(v1::RolloutAction::Pause) => Change::Pause,
        Ok(v1::RolloutAction::Resume) => Change::Resume,
        Ok(v1::RolloutAction::Abort) => Change::Abort {
            rollback: r.rollback,
        },
        Ok(v1::RolloutAction::Unspecified) | Err(_) => {
            return Err(bad_request(format!(
                "unknown rollout action (value {}): pause, resume or abort",
                r.action
            )));
        }
    };
    let rolled_back = apply(svc, &r.id, change).await?;
    info!(rollout = %r.id, action = ?change, rolled_back = rolled_back.len(), "rollout changed");
    for n in &rolled_back {
        svc.wake(n);
    }
    svc.rollouts.notify_one();
    get(svc, r.id).await
}

/// Applies an operator's change. Returns the nodes that were sent a
/// rollback (with `abort --rollback`).
async fn apply(svc: &AdminService, id: &str, change: Change) -> Result<Vec<String>, Status> {
    let store = &svc.store;
    let rollout = store
        .rollout(id)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| no_rollout(id))?;
    let (from, to, reason) = change.transition();
    if !store
        .set_rollout_state(id, from, to, reason)
        .await
        .map_err(unavailable)?
    {
        return Err(refusal(Refusal::Conflict(format!(
            "rollout {id} is {}: cannot {}",
            rollout.state.name(),
            change.verb()
        ))));
    }
    let Change::Abort { rollback } = change else {
        return Ok(Vec::new());
    };
    let mut rolled_back = Vec::new();
    for n in &rollout.nodes {
        let (Some(cmd), Some(state)) = (&n.command_id, &n.command_state) else {
            continue;
        };
        if state == "pending"
            && store
                .cancel_pending_command(cmd, CANCELLED)
                .await
                .map_err(unavailable)?
        {
            continue;
        }
        // Re-read: a command may have finished since.
        let now_state = store
            .get_command(cmd)
            .await
            .map_err(unavailable)?
            .map(|c| c.state);
        let in_flight = matches!(
            now_state.and_then(|s| s.known()),
            Some(ServerState::Dispatched | ServerState::Acked | ServerState::Running)
        );
        if rollback && in_flight {
            let new = NewCommand {
                node_id: n.node_id.clone(),
                kind: Kind::DaemonRollback,
                summary: format!("roll back release {}", rollout.sequence),
                not_after: COMMAND_NOT_AFTER,
                min_generation: 0,
                idempotency_key: Some(format!("rollout:{id}:{}:rollback", n.node_id)),
            };
            let (row, _) = crate::pki::seal::create_command(
                store,
                &svc.worker_key,
                &new,
                command_payload::Args::None(NoArgs {}),
            )
            .await
            .map_err(status)?;
            store
                .record_rollout_command(id, &n.node_id, RolloutCommand::Rollback, &row.id)
                .await
                .map_err(unavailable)?;
            rolled_back.push(n.node_id.to_string());
        }
    }
    Ok(rolled_back)
}
