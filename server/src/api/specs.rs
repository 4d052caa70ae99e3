//! Desired state: `AssignGpus`, `Unassign`, `SetAccess` (each a change of
//! the node's spec, sealed as its next generation) and `GetNodeSpec`.

use bc_store::NodeId;
use bc_store::Refusal;
use bc_store::specs::{Assignment, Cordon, SpecBody};
use bcd_proto::v1::{
    self, AssignGpusRequest, BindingInfo, CordonNodeRequest, LabelNodeRequest, NodeSpecInfo,
    SectionStatus, SetAccessRequest, UnassignRequest,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, status, unavailable};
use crate::pki::seal;

/// An allocation's id and environment, checked by the rules the node
/// applies before it writes the env file (`bcd_helper::validate`): an id
/// that is a safe file name; variable names without `=`, NUL or a line
/// break, none that bcd writes itself (NVIDIA_VISIBLE_DEVICES, ...) or
/// that steers the dynamic loader (LD_*); values without a line break.
pub fn check_allocation(
    allocation_id: &str,
    env: &std::collections::HashMap<String, String>,
) -> Result<(), String> {
    use bcd_helper::validate;
    validate::AllocationId::parse(allocation_id).map_err(|e| e.to_string())?;
    if env.len() > validate::MAX_ENV {
        return Err(format!(
            "allocation {allocation_id}: {} variables, more than {}",
            env.len(),
            validate::MAX_ENV
        ));
    }
    let mut keys: Vec<&String> = env.keys().collect();
    keys.sort();
    for k in keys {
        validate::check_env_key(k).map_err(|e| format!("allocation {allocation_id}: {e}"))?;
        validate::check_env_value(k, &env[k])
            .map_err(|e| format!("allocation {allocation_id}: {e}"))?;
    }
    Ok(())
}

/// Changes a node's spec and seals the new generation; wakes the node's
/// session to send it.
pub(super) async fn change(
    svc: &AdminService,
    node: String,
    edit: impl FnOnce(&mut SpecBody) -> Result<(), Refusal> + Send + 'static,
) -> Result<NodeSpecInfo, Status> {
    svc.store
        .update_spec(
            &NodeId::from(&node),
            Box::new(edit),
            seal::own_spec_opener(&svc.worker_key, &node),
            seal::spec_sealer(svc.worker_key.clone(), svc.ticket_key.clone(), &node),
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
    let id = NodeId::from(&node);
    let bindings = store.bindings(&id).await.map_err(unavailable)?;
    let events = store.fleet_events(&id, 20).await.map_err(unavailable)?;
    let mut view = store
        .spec_view(&id)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| refusal(Refusal::NoSuchNode(node.clone())))?;
    let mut intent = None;
    // What the operator sees desired is what the worker signed, as the node
    // will read it; the columns only where the envelope does not open (its
    // forgery is among the events, and changes are refused).
    if let Some((_, signed)) = store.signed_spec(&id).await.map_err(unavailable)?
        && let Ok(opened) = seal::own_spec_opener(&svc.worker_key, &node)(&signed)
    {
        view.desired_generation = opened.generation;
        view.assignments = opened.body.assignments;
        view.access = opened.body.access;
        intent = Some(seal::intent(&opened.body.intent).unwrap_or_default());
    }
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
                state: bcd_proto::typed::parse::<v1::BindingState>(&b.state)
                    .unwrap_or(v1::BindingState::Unspecified) as i32,
                spec_generation: b.spec_generation,
            })
            .collect(),
        events,
        sections: view
            .sections
            .into_iter()
            .map(|s| SectionStatus {
                section: bcd_core::report::StateSection::from_name(&s.section)
                    .map_or(v1::StateSection::Unspecified, v1::StateSection::from)
                    as i32,
                status: bcd_proto::typed::parse::<v1::SectionState>(&s.status)
                    .unwrap_or(v1::SectionState::Unspecified) as i32,
                message: s.message,
                age_ms: (view.now_ms - s.since_ms).max(0) as u64,
            })
            .collect(),
        reported_age_ms: view.reported_age_ms.unwrap_or(-1),
        intent,
    })
}

/// `AssignGpus`: one allocation per GPU, holding `secrets` (resolved to
/// the broker's versions by `api::secrets::resolve`).
pub async fn assign_gpus(
    svc: &AdminService,
    r: AssignGpusRequest,
    secrets: Vec<bc_store::specs::SecretRef>,
) -> Result<NodeSpecInfo, Status> {
    check_allocation(&r.allocation_id, &r.env).map_err(bad_request)?;
    if r.gpus.is_empty() || r.gpus.iter().any(|g| g.is_empty()) {
        return Err(bad_request("name at least one GPU, by UUID or index"));
    }
    for g in &r.gpus {
        bcd_helper::validate::check_device_name(g).map_err(|e| bad_request(e.to_string()))?;
    }
    let node = r.node_id.clone();
    let info = change(svc, r.node_id.clone(), move |body| {
        // A cordoned node takes no new allocation; one it holds may change.
        if let Some(c) = &body.intent.cordon
            && !body
                .assignments
                .iter()
                .any(|a| a.allocation_id == r.allocation_id)
        {
            return Err(Refusal::Conflict(format!(
                "node {node} is cordoned{}: no new allocation lands on it \
                 (better-compute nodes uncordon {node} first)",
                if c.reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", c.reason)
                }
            )));
        }
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
            secrets,
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
    let access = seal::access_from_wire(r.access.unwrap_or_default()).map_err(bad_request)?;
    let info = change(svc, r.node_id, move |body| {
        body.access = access;
        Ok(())
    })
    .await?;
    info!(node = %info.node_id, generation = info.desired_generation, "access set");
    Ok(info)
}

/// `LabelNode`: sets and removes labels, signed as the node's next spec.
pub async fn label(svc: &AdminService, r: LabelNodeRequest) -> Result<NodeSpecInfo, Status> {
    let set: std::collections::BTreeMap<String, String> = r.set.into_iter().collect();
    let remove = r.remove;
    crate::labels::apply(&mut Default::default(), &set, &remove).map_err(bad_request)?;
    let info = change(svc, r.node_id, move |body| {
        crate::labels::apply(&mut body.intent.labels, &set, &remove).map_err(Refusal::BadRequest)
    })
    .await?;
    info!(node = %info.node_id, generation = info.desired_generation, "labels changed");
    Ok(info)
}

/// The longest cordon reason.
pub const MAX_REASON: usize = 256;

/// `CordonNode`: cordons (no new allocation, no rollout wave) or
/// uncordons, signed as the node's next spec. Cordoning a cordoned node
/// keeps its first time and takes the new reason.
pub async fn cordon(svc: &AdminService, r: CordonNodeRequest) -> Result<NodeSpecInfo, Status> {
    let reason = r.reason.trim().to_string();
    if reason.len() > MAX_REASON || reason.chars().any(char::is_control) {
        return Err(bad_request(format!(
            "the reason must be one line of at most {MAX_REASON} bytes"
        )));
    }
    let now_ms = crate::clock::unix_ms();
    let cordon = r.cordon;
    let info = change(svc, r.node_id, move |body| {
        body.intent.cordon = cordon.then(|| Cordon {
            since_ms: body.intent.cordon.as_ref().map_or(now_ms, |c| c.since_ms),
            reason,
        });
        Ok(())
    })
    .await?;
    info!(node = %info.node_id, cordon, generation = info.desired_generation, "cordon changed");
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn allocation_ids_and_environments_follow_the_nodes_rules() {
        assert_eq!(check_allocation("job-1.a_b", &env(&[("JOB", "1")])), Ok(()));
        for id in ["", "../x", "a/b", "..", ".hidden", "a\nb", &"x".repeat(65)] {
            let e = check_allocation(id, &env(&[])).unwrap_err();
            assert!(e.contains("allocation id"), "{id:?}: {e}");
        }
        for (k, v, why) in [
            ("NVIDIA_VISIBLE_DEVICES", "all", "reserved"),
            ("CDI_DEVICES", "x", "reserved"),
            ("LD_PRELOAD", "/x.so", "reserved"),
            ("A=B", "1", "not an environment variable name"),
            ("A\nB", "1", "not an environment variable name"),
            ("", "1", "not an environment variable name"),
            ("OK", "two\nlines", "line break"),
            ("OK", "nul\0", "NUL"),
        ] {
            let e = check_allocation("job", &env(&[(k, v)])).unwrap_err();
            assert!(
                e.contains(why) && e.starts_with("allocation job:"),
                "{k}={v:?}: {e}"
            );
        }
    }
}
