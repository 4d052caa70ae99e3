//! The `nvidia.com/gpu` spec for a machine's GPUs.
//!
//! One device per GPU by index (`nvidia.com/gpu=0`) and by UUID
//! (`nvidia.com/gpu=GPU-...`), and `all`. Each carries its `/dev/nvidiaN`
//! node with the major and minor the host has; the control nodes
//! (`/dev/nvidiactl`, `/dev/nvidia-uvm*`, `/dev/nvidia-caps/*`) and the
//! driver's libraries and binaries that are present go into the spec-wide
//! edits, mounted read-only at the same path.

use crate::{ContainerEdits, Device, DeviceNode, Mount, Spec};

pub const KIND: &str = "nvidia.com/gpu";

/// A character device node as the host has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// The driver's minor number: `/dev/nvidia<index>`.
    pub index: u32,
    pub uuid: Option<String>,
    pub node: Node,
}

/// What the host offers, as read by the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    pub control_nodes: Vec<Node>,
    /// Driver libraries and binaries present on the host, absolute paths.
    pub driver_files: Vec<String>,
}

fn node(n: &Node) -> DeviceNode {
    DeviceNode {
        path: n.path.clone(),
        kind: "c".into(),
        major: i64::from(n.major),
        minor: i64::from(n.minor),
        ..Default::default()
    }
}

/// The spec for `inv`, declaring the minimum `cdiVersion` it needs.
pub fn spec(inv: &Inventory) -> Spec {
    let mut gpus = inv.gpus.clone();
    gpus.sort_by_key(|g| g.index);
    let mut devices = Vec::new();
    for g in &gpus {
        devices.push(Device {
            name: g.index.to_string(),
            container_edits: ContainerEdits {
                device_nodes: vec![node(&g.node)],
                ..Default::default()
            },
            ..Default::default()
        });
    }
    for g in &gpus {
        if let Some(uuid) = &g.uuid {
            devices.push(Device {
                name: uuid.clone(),
                container_edits: ContainerEdits {
                    device_nodes: vec![node(&g.node)],
                    ..Default::default()
                },
                ..Default::default()
            });
        }
    }
    if !gpus.is_empty() {
        devices.push(Device {
            name: "all".into(),
            container_edits: ContainerEdits {
                device_nodes: gpus.iter().map(|g| node(&g.node)).collect(),
                ..Default::default()
            },
            ..Default::default()
        });
    }
    let mut control = inv.control_nodes.clone();
    control.sort_by(|a, b| a.path.cmp(&b.path));
    let mut files = inv.driver_files.clone();
    files.sort();
    files.dedup();
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: KIND.into(),
        devices,
        container_edits: ContainerEdits {
            device_nodes: control.iter().map(node).collect(),
            mounts: files
                .into_iter()
                .map(|f| Mount {
                    container_path: f.clone(),
                    host_path: f,
                    options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    spec.cdi_version = spec.minimum_version().to_string();
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn h200x2() -> Inventory {
        Inventory {
            gpus: vec![
                Gpu {
                    index: 1,
                    uuid: Some("GPU-8d1c2e6a-93b1-4c3f-a2d4-5e6f7a8b9c0d".into()),
                    node: Node {
                        path: "/dev/nvidia1".into(),
                        major: 195,
                        minor: 1,
                    },
                },
                Gpu {
                    index: 0,
                    uuid: Some("GPU-4b6e0c3a-1f2d-4e5f-8a9b-0c1d2e3f4a5b".into()),
                    node: Node {
                        path: "/dev/nvidia0".into(),
                        major: 195,
                        minor: 0,
                    },
                },
            ],
            control_nodes: vec![
                Node {
                    path: "/dev/nvidiactl".into(),
                    major: 195,
                    minor: 255,
                },
                Node {
                    path: "/dev/nvidia-uvm".into(),
                    major: 509,
                    minor: 0,
                },
                Node {
                    path: "/dev/nvidia-uvm-tools".into(),
                    major: 509,
                    minor: 1,
                },
            ],
            driver_files: vec![
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15".into(),
                "/usr/bin/nvidia-smi".into(),
            ],
        }
    }

    #[test]
    fn two_gpus_by_index_uuid_and_all() {
        let s = spec(&h200x2());
        let names: Vec<&str> = s.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "0",
                "1",
                "GPU-4b6e0c3a-1f2d-4e5f-8a9b-0c1d2e3f4a5b",
                "GPU-8d1c2e6a-93b1-4c3f-a2d4-5e6f7a8b9c0d",
                "all"
            ]
        );
        // Names starting with a digit need 0.5.0; nothing else is newer.
        assert_eq!(s.cdi_version, "0.5.0");
        s.validate().unwrap();
        assert_eq!(s.devices[4].container_edits.device_nodes.len(), 2);
        assert_eq!(s.devices[0].container_edits.device_nodes[0].major, 195);
        // Golden file; `BLESS=1 cargo test -p cdi` rewrites it after a
        // deliberate change.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/h200x2.json");
        if std::env::var_os("BLESS").is_some() {
            std::fs::write(&path, s.to_json()).unwrap();
        }
        let golden = std::fs::read_to_string(&path).unwrap();
        assert_eq!(String::from_utf8(s.to_json()).unwrap(), golden);
    }

    #[test]
    fn no_gpus_is_an_empty_spec_we_do_not_write() {
        let s = spec(&Inventory::default());
        assert!(s.devices.is_empty());
        assert_eq!(s.validate(), Err(crate::CdiError::NoDevices));
    }
}
