//! NodeSpecs: what the server wants a node to be, signed by a worker key.

use bcd_proto::v1::{DevicesSpec, GpuAssignment, NodeSpec};

use crate::store::Assignment;

pub fn to_wire(a: Assignment) -> GpuAssignment {
    GpuAssignment {
        allocation_id: a.allocation_id,
        gpus: a.gpus,
        env: a.env.into_iter().collect(),
    }
}

/// The spec a worker signs for `node` at `generation`.
pub fn payload(
    node: &str,
    generation: u64,
    issued_at_ms: i64,
    assignments: &[Assignment],
) -> NodeSpec {
    NodeSpec {
        node_id: node.to_string(),
        generation,
        issued_at_ms,
        devices: Some(DevicesSpec {
            assignments: assignments.iter().cloned().map(to_wire).collect(),
        }),
    }
}
