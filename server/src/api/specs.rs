//! Desired state: `AssignGpus`, `Unassign`, `SetAccess` (each a change of
//! the node's spec, sealed as its next generation) and `GetNodeSpec`.

use bc_store::Refusal;
use bc_store::specs::{Assignment, SpecBody};
use bcd_proto::v1::{
    AssignGpusRequest, BindingInfo, NodeSpecInfo, SectionStatus, SetAccessRequest, UnassignRequest,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{refusal, status, unavailable};
use crate::pki::seal;

fn valid_allocation(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Changes a node's spec and seals the new generation; wakes the node's
/// session to send it.
async fn change(
    svc: &AdminService,
    node: String,
    edit: impl FnOnce(&mut SpecBody) -> Result<(), Refusal> + Send + 'static,
) -> Result<NodeSpecInfo, Status> {
    svc.store
        .update_spec(
            &node,
            Box::new(edit),
            seal::spec_sealer(svc.worker_key.clone(), &node),
        )
        .await
        .map_err(status)?;
    svc.wake(&node);
    info(svc, node).await
}

/// `GetNodeSpec`: desired against applied, with the node's bindings and
/// recent fleet events.
pub async fn info(svc: &AdminService, node: String) -> Result<NodeSpecInfo, Status> {
    let store = &svc.store;
    let bindings = store.bindings(&node).await.map_err(unavailable)?;
    let events = store.fleet_events(&node, 20).await.map_err(unavailable)?;
    let view = store
        .spec_view(&node)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| refusal(Refusal::NoSuchNode(node.clone())))?;
    Ok(NodeSpecInfo {
        node_id: node,
        desired_generation: view.desired_generation,
        applied_generation: view.applied_generation,
        assignments: view.assignments.iter().map(seal::assignment).collect(),
        access: Some(seal::access(&view.access)),
        bindings: bindings
            .into_iter()
            .map(|b| BindingInfo {
                allocation_id: b.allocation_id,
                gpu_uuids: b.gpus,
                state: b.state,
                spec_generation: b.spec_generation,
            })
            .collect(),
        events,
        sections: view
            .sections
            .into_iter()
            .map(|s| SectionStatus {
                section: s.section,
                status: s.status,
                message: s.message,
                age_ms: (view.now_ms - s.since_ms).max(0) as u64,
            })
            .collect(),
        reported_age_ms: view.reported_age_ms.unwrap_or(-1),
    })
}

/// `AssignGpus`: one allocation per GPU.
pub async fn assign_gpus(svc: &AdminService, r: AssignGpusRequest) -> Result<NodeSpecInfo, Status> {
    if !valid_allocation(&r.allocation_id) {
        return Err(Status::invalid_argument(format!(
            "allocation id {:?} must be 1-64 letters, digits, '-', '_' or '.'",
            r.allocation_id
        )));
    }
    if r.gpus.is_empty() || r.gpus.iter().any(|g| g.is_empty()) {
        return Err(Status::invalid_argument(
            "name at least one GPU, by UUID or index",
        ));
    }
    for k in r.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\n') {
            return Err(Status::invalid_argument(format!(
                "{k:?} is not an environment variable name"
            )));
        }
    }
    let info = change(svc, r.node_id.clone(), move |body| {
        let assignments = &mut body.assignments;
        // A GPU is bound to one allocation at a time.
        for a in assignments.iter() {
            if a.allocation_id == r.allocation_id {
                continue;
            }
            if let Some(g) = r.gpus.iter().find(|g| a.gpus.contains(g)) {
                return Err(Refusal::BadRequest(format!(
                    "GPU {g} is already assigned to allocation {} on this node",
                    a.allocation_id
                )));
            }
        }
        assignments.retain(|a| a.allocation_id != r.allocation_id);
        assignments.push(Assignment {
            allocation_id: r.allocation_id,
            gpus: r.gpus,
            env: r.env.into_iter().collect(),
        });
        assignments.sort_by(|a, b| a.allocation_id.cmp(&b.allocation_id));
        Ok(())
    })
    .await?;
    info!(node = %info.node_id, generation = info.desired_generation, "GPUs assigned");
    Ok(info)
}

/// `Unassign`.
pub async fn unassign(svc: &AdminService, r: UnassignRequest) -> Result<NodeSpecInfo, Status> {
    change(svc, r.node_id.clone(), move |body| {
        let assignments = &mut body.assignments;
        let before = assignments.len();
        assignments.retain(|a| a.allocation_id != r.allocation_id);
        if assignments.len() == before {
            return Err(Refusal::BadRequest(format!(
                "no allocation {} on this node: see better-compute nodes spec",
                r.allocation_id
            )));
        }
        Ok(())
    })
    .await
}

/// `SetAccess`.
pub async fn set_access(svc: &AdminService, r: SetAccessRequest) -> Result<NodeSpecInfo, Status> {
    let access = seal::access_from_wire(r.access.unwrap_or_default());
    let info = change(svc, r.node_id, move |body| {
        body.access = access;
        Ok(())
    })
    .await?;
    info!(node = %info.node_id, generation = info.desired_generation, "access set");
    Ok(info)
}
