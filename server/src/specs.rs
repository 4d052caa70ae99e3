//! NodeSpecs: what the server wants a node to be, signed by a worker key.

use bcd_proto::v1::{self, DevicesSpec, GpuAssignment, NodeSpec};

use crate::store::{Access, Assignment, SpecBody};

pub fn to_wire(a: Assignment) -> GpuAssignment {
    GpuAssignment {
        allocation_id: a.allocation_id,
        gpus: a.gpus,
        env: a.env.into_iter().collect(),
    }
}

pub fn access_to_wire(a: &Access) -> v1::AccessSpec {
    v1::AccessSpec {
        users: a
            .users
            .iter()
            .map(|u| v1::AccessUser {
                name: u.name.clone(),
                authorized_keys: u.authorized_keys.clone(),
                principals: u.principals.clone(),
            })
            .collect(),
        trusted_user_ca_keys: a.trusted_user_ca_keys.clone(),
        firewall: a.firewall.as_ref().map(|f| v1::FirewallSpec {
            rules: f
                .rules
                .iter()
                .map(|r| v1::FirewallRule {
                    protocol: r.protocol.clone(),
                    port: r.port,
                    source: r.source.clone(),
                    action: r.action.clone(),
                })
                .collect(),
        }),
    }
}

/// The spec a worker signs for `node` at `generation`.
pub fn payload(node: &str, generation: u64, issued_at_ms: i64, body: &SpecBody) -> NodeSpec {
    NodeSpec {
        node_id: node.to_string(),
        generation,
        issued_at_ms,
        devices: Some(DevicesSpec {
            assignments: body.assignments.iter().cloned().map(to_wire).collect(),
        }),
        access: Some(access_to_wire(&body.access)),
    }
}
