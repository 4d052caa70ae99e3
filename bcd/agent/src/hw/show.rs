//! `bcd gpus`: this machine's GPUs as bcd sees them, as a table, as JSON,
//! or as the CDI spec it would write for them.

use super::Host;

/// How `bcd gpus` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    Table,
    Json,
    /// The nvidia.com/gpu CDI spec, validated.
    Cdi,
}

/// What `bcd gpus` prints for `host`.
pub fn gpus(host: &dyn Host, how: Show) -> anyhow::Result<String> {
    let gpus = host.gpus().list()?;
    let inv = host.gpus().cdi_inventory()?;
    Ok(match how {
        Show::Cdi => {
            let spec = cdi::nvidia::spec(&inv);
            spec.validate()
                .map_err(|e| anyhow::anyhow!("no CDI spec for this machine: {e}"))?;
            String::from_utf8_lossy(&spec.to_json()).into_owned()
        }
        Show::Json => {
            let nodes: Vec<_> = inv
                .gpus
                .iter()
                .map(|g| serde_json::json!({"index": g.index, "uuid": g.uuid, "path": g.node.path, "major": g.node.major, "minor": g.node.minor}))
                .collect();
            let control: Vec<_> = inv
                .control_nodes
                .iter()
                .map(|n| serde_json::json!({"path": n.path, "major": n.major, "minor": n.minor}))
                .collect();
            let mut text = serde_json::to_string_pretty(&serde_json::json!({
                "gpus": gpus, "device_nodes": nodes, "control_nodes": control,
                "driver_files": inv.driver_files,
            }))?;
            text.push('\n');
            text
        }
        Show::Table => {
            use std::fmt::Write;
            let mut out = String::new();
            let _ = writeln!(
                out,
                "{:<14} {:<8} {:<42} {:<34} NODE",
                "PCI", "DEVICE", "UUID", "MODEL"
            );
            for g in &gpus {
                let node = g
                    .minor
                    .and_then(|m| inv.gpus.iter().find(|n| n.index == m))
                    .map(|n| format!("{} ({}:{})", n.node.path, n.node.major, n.node.minor))
                    .unwrap_or_else(|| "-".into());
                let _ = writeln!(
                    out,
                    "{:<14} {:<8} {:<42} {:<34} {}",
                    g.pci_address,
                    g.device_id,
                    g.uuid.as_deref().unwrap_or("-"),
                    g.model.as_deref().unwrap_or("-"),
                    node
                );
            }
            if gpus.is_empty() {
                out.push_str("(no NVIDIA GPUs on this machine)\n");
            }
            out
        }
    })
}
