//! Nodes: `ListNodes`, `GetNodeInventory`, `DeleteNode`.

use bc_store::NodeId;
use bc_store::nodes::NodeRow;
use bc_store::specs::Intent;
use bcd_core::report::InventorySection;
use bcd_proto::v1::{
    self, DeleteNodeRequest, DeleteNodeResponse, ListNodesRequest, ListNodesResponse, NodeInfo,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, unavailable};
use crate::labels::Selector;

fn info(n: NodeRow, now: i64) -> NodeInfo {
    let state = bcd_proto::typed::parse::<v1::NodeState>(&n.state)
        .unwrap_or(v1::NodeState::Unspecified) as i32;
    NodeInfo {
        node_id: n.node_id.into_string(),
        hostname: n.hostname,
        state,
        epoch: n.epoch,
        gateway_id: n.gateway_id.into_string(),
        cert_not_after_ms: n.cert_not_after_ms,
        last_seen_age_ms: n.last_seen_age_ms,
        boot_id: n.boot_id,
        journal_id: n.journal_id,
        incarnation_id: n.incarnation_id,
        conditions: n.conditions,
        taints: n.taints,
        agent_version: n.agent_version,
        release_floor: n.release_floor,
        server_time_ms: now,
        pool: n.pool.unwrap_or_default(),
        macs: n.macs,
        ek_sha256: n.ek_sha256.unwrap_or_default(),
        intent: None,
        intent_error: String::new(),
    }
}

/// `ListNodes`: every live node, or those the request's filters keep, a
/// page at a time. Labels and cordons come from each node's signed spec;
/// a node whose spec does not open matches no label selector.
pub async fn list(svc: &AdminService, r: ListNodesRequest) -> Result<ListNodesResponse, Status> {
    let selector = Selector::parse(&r.label_selector).map_err(bad_request)?;
    let state = r.state();
    let (list, mut intents) = if r.node_id.is_empty() {
        let list = svc.store.list_nodes().await.map_err(unavailable)?;
        let intents = crate::pki::seal::intents(&svc.store, &svc.worker_key)
            .await
            .map_err(unavailable)?;
        (list, intents)
    } else {
        let node = NodeId::from(r.node_id);
        let list = svc.store.node(&node).await.map_err(unavailable)?;
        let intent = crate::pki::seal::node_intent(&svc.store, &svc.worker_key, &node)
            .await
            .map_err(unavailable)?;
        (list, [(node, intent)].into())
    };
    let now = list.now_ms;
    let limit = if r.limit == 0 {
        usize::MAX
    } else {
        r.limit as usize
    };
    let mut nodes = Vec::new();
    let mut next_after = String::new();
    for n in list.nodes {
        if !r.after.is_empty() && n.node_id.as_str() <= r.after.as_str() {
            continue;
        }
        if !r.pool.is_empty() && n.pool.as_deref() != Some(r.pool.as_str()) {
            continue;
        }
        let intent = intents.remove(&n.node_id).unwrap_or(Ok(Intent::default()));
        let mut node = info(n, now);
        if state != v1::NodeState::Unspecified && node.state() != state {
            continue;
        }
        match intent {
            Ok(i) => {
                if !selector.matches(&i.labels) {
                    continue;
                }
                node.intent = crate::pki::seal::intent(&i);
            }
            Err(why) => {
                if !selector.is_empty() {
                    continue;
                }
                node.intent_error = why;
            }
        }
        if nodes.len() == limit {
            next_after = nodes
                .last()
                .map(|n: &NodeInfo| n.node_id.clone())
                .unwrap_or_default();
            break;
        }
        nodes.push(node);
    }
    Ok(ListNodesResponse {
        server_time_ms: now,
        nodes,
        next_after,
    })
}

pub async fn inventory(
    svc: &AdminService,
    r: v1::GetNodeInventoryRequest,
) -> Result<v1::NodeInventory, Status> {
    let node = r.node_id;
    let id = NodeId::from(&node);
    let known = !svc
        .store
        .node(&id)
        .await
        .map_err(unavailable)?
        .nodes
        .is_empty();
    if !known {
        return Err(refusal(bc_store::Refusal::NoSuchNode(node)));
    }
    let mut sections = Vec::new();
    for section in InventorySection::ALL {
        if let Some(row) = svc
            .store
            .inventory(&id, section)
            .await
            .map_err(unavailable)?
        {
            sections.push(v1::InventorySection {
                section: v1::InventoryKind::from(section) as i32,
                sha256: row.sha256,
                body: row.body,
                updated_at_ms: row.updated_at_ms,
            });
        }
    }
    Ok(v1::NodeInventory {
        node_id: node,
        sections,
    })
}

pub async fn delete(
    svc: &AdminService,
    r: DeleteNodeRequest,
) -> Result<DeleteNodeResponse, Status> {
    let node = r.node_id;
    // The worker key signs the statement of it: the one thing that makes
    // the node stop for good (a gateway relays it, and cannot forge it).
    let seal = crate::pki::seal::statement_sealer(svc.worker_key.clone());
    if !svc
        .store
        .delete_node(&NodeId::from(&node), seal)
        .await
        .map_err(unavailable)?
    {
        return Err(refusal(bc_store::Refusal::NoSuchNode(node)));
    }
    info!(%node, "node deleted");
    Ok(DeleteNodeResponse {})
}
