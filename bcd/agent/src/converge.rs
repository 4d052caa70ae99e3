//! Convergers: make the machine what the NodeSpec says, and say how far it
//! got.
//!
//! The devices converger writes, for the GPUs the spec assigns to
//! allocations, the `nvidia.com/gpu` CDI spec (`bcd-nvidia-gpu.json` in the
//! CDI spec directory) and one env file per allocation (`<allocation>.env`).
//! Every pass re-reads the host and compares bytes, so drift (a device node
//! whose numbers changed, a GPU gone, a file edited by hand) is repaired or
//! reported, and a pass with nothing to change writes nothing. A spec that
//! names a GPU the node does not have fails without touching the files: the
//! last good state stays enforced.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use bcd_proto::v1::NodeSpec;

pub const CDI_FILE: &str = "bcd-nvidia-gpu.json";

#[derive(Debug, Clone)]
pub struct Paths {
    /// CDI spec directory (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Per-allocation env files (`/run/bcd/env`).
    pub env_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ready,
    /// Not there yet; retried on the next pass.
    Progressing,
    /// The spec cannot be applied as it is.
    Failed,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ready => "READY",
            Status::Progressing => "PROGRESSING",
            Status::Failed => "FAILED",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub message: String,
    /// Files were written or removed in this pass.
    pub changed: bool,
}

/// Writes `bytes` durably unless the file already holds them; says whether
/// it wrote. The error is worded for a section's status message.
pub(crate) fn write_if_changed(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, String> {
    bcd_sys::fs::write_if_changed(path, bytes, mode).map_err(|e| bcd_sys::error::chain(&e))
}

fn remove(path: &Path) -> Result<bool, String> {
    bcd_sys::fs::remove_if_present(path).map_err(|e| bcd_sys::error::chain(&e))
}

/// The env file of one allocation.
pub fn env_file(names: &[String], extra: &std::collections::BTreeMap<&String, &String>) -> String {
    let mut s = String::from("# Written by bcd from the node's spec; edits are undone.\n");
    let _ = writeln!(s, "NVIDIA_VISIBLE_DEVICES={}", names.join(","));
    let cdi: Vec<String> = names
        .iter()
        .map(|n| format!("{}={n}", cdi::nvidia::KIND))
        .collect();
    let _ = writeln!(s, "CDI_DEVICES={}", cdi.join(","));
    for (k, v) in extra {
        let _ = writeln!(s, "{k}={v}");
    }
    s
}

/// One pass of the devices converger.
pub fn devices(paths: &Paths, spec: &NodeSpec, inv: &cdi::nvidia::Inventory) -> Outcome {
    let fail = |status, message: String| Outcome {
        status,
        message,
        changed: false,
    };
    let assignments = spec
        .devices
        .as_ref()
        .map(|d| d.assignments.clone())
        .unwrap_or_default();
    // Resolve every reference before touching anything.
    let mut selected: Vec<cdi::nvidia::Gpu> = Vec::new();
    let mut per_allocation = Vec::new();
    for a in &assignments {
        let mut names = Vec::new();
        for r in &a.gpus {
            let Some(g) = inv
                .gpus
                .iter()
                .find(|g| g.uuid.as_deref() == Some(r.as_str()) || g.index.to_string() == *r)
            else {
                return fail(
                    Status::Failed,
                    format!(
                        "allocation {}: GPU {r} is not on this node",
                        a.allocation_id
                    ),
                );
            };
            if !selected.iter().any(|s| s.index == g.index) {
                selected.push(g.clone());
            }
            names.push(g.uuid.clone().unwrap_or_else(|| g.index.to_string()));
        }
        per_allocation.push((a.allocation_id.clone(), names, a.env.iter().collect()));
    }
    let mut changed = false;
    let cdi_path = paths.cdi_dir.join(CDI_FILE);
    let step = if selected.is_empty() {
        remove(&cdi_path)
    } else {
        let spec = cdi::nvidia::spec(&cdi::nvidia::Inventory {
            gpus: selected,
            control_nodes: inv.control_nodes.clone(),
            driver_files: inv.driver_files.clone(),
        });
        match spec.validate() {
            Ok(()) => write_if_changed(&cdi_path, &spec.to_json(), 0o644),
            Err(e) => {
                return fail(
                    Status::Failed,
                    format!("the CDI spec would be invalid: {e}"),
                );
            }
        }
    };
    match step {
        Ok(c) => changed |= c,
        Err(e) => return fail(Status::Progressing, e),
    }
    let mut wanted = std::collections::BTreeSet::new();
    for (id, names, extra) in &per_allocation {
        let path = paths.env_dir.join(format!("{id}.env"));
        wanted.insert(path.clone());
        match write_if_changed(&path, env_file(names, extra).as_bytes(), 0o644) {
            Ok(c) => changed |= c,
            Err(e) => return fail(Status::Progressing, e),
        }
    }
    if let Ok(entries) = std::fs::read_dir(&paths.env_dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "env") && !wanted.contains(&p) {
                match remove(&p) {
                    Ok(c) => changed |= c,
                    Err(e) => return fail(Status::Progressing, e),
                }
            }
        }
    }
    Outcome {
        status: Status::Ready,
        message: String::new(),
        changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_proto::v1::{DevicesSpec, GpuAssignment};

    fn inv() -> cdi::nvidia::Inventory {
        let node = |i: u32| cdi::nvidia::Node {
            path: format!("/dev/nvidia{i}"),
            major: 195,
            minor: i,
        };
        cdi::nvidia::Inventory {
            gpus: (0..4)
                .map(|i| cdi::nvidia::Gpu {
                    index: i,
                    uuid: Some(format!("GPU-{i:08x}-0000-0000-0000-000000000000")),
                    node: node(i),
                })
                .collect(),
            control_nodes: vec![cdi::nvidia::Node {
                path: "/dev/nvidiactl".into(),
                major: 195,
                minor: 255,
            }],
            driver_files: vec![],
        }
    }

    fn spec(assign: &[(&str, &[&str])]) -> NodeSpec {
        NodeSpec {
            node_id: "nd-1".into(),
            generation: 1,
            issued_at_ms: 0,
            devices: Some(DevicesSpec {
                assignments: assign
                    .iter()
                    .map(|(id, gpus)| GpuAssignment {
                        allocation_id: id.to_string(),
                        gpus: gpus.iter().map(|g| g.to_string()).collect(),
                        env: [("JOB".to_string(), id.to_string())].into(),
                    })
                    .collect(),
            }),
            access: None,
        }
    }

    fn paths(d: &Path) -> Paths {
        Paths {
            cdi_dir: d.join("cdi"),
            env_dir: d.join("env"),
        }
    }

    #[test]
    fn writes_the_cdi_spec_and_env_files_then_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        let s = spec(&[("job-a", &["0", "GPU-00000001-0000-0000-0000-000000000000"])]);
        let o = devices(&p, &s, &inv());
        assert_eq!((o.status, o.changed), (Status::Ready, true));
        let cdi_bytes = std::fs::read(p.cdi_dir.join(CDI_FILE)).unwrap();
        let parsed = cdi::Spec::parse(&cdi_bytes).unwrap();
        let names: Vec<&str> = parsed.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names.len(),
            5,
            "two GPUs by index and UUID, and all: {names:?}"
        );
        assert_eq!(
            std::fs::read_to_string(p.env_dir.join("job-a.env")).unwrap(),
            "# Written by bcd from the node's spec; edits are undone.\n\
             NVIDIA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000,GPU-00000001-0000-0000-0000-000000000000\n\
             CDI_DEVICES=nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000,nvidia.com/gpu=GPU-00000001-0000-0000-0000-000000000000\n\
             JOB=job-a\n"
        );
        let before = std::fs::metadata(p.cdi_dir.join(CDI_FILE)).unwrap();
        let o = devices(&p, &s, &inv());
        assert_eq!(
            (o.status, o.changed),
            (Status::Ready, false),
            "a second pass writes nothing"
        );
        let after = std::fs::metadata(p.cdi_dir.join(CDI_FILE)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(before.ino(), after.ino());
    }

    #[test]
    fn drift_is_repaired() {
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        let s = spec(&[("job-a", &["1"])]);
        devices(&p, &s, &inv());
        // Edited by hand.
        std::fs::write(p.cdi_dir.join(CDI_FILE), b"{}").unwrap();
        std::fs::write(p.env_dir.join("job-a.env"), b"NVIDIA_VISIBLE_DEVICES=all\n").unwrap();
        // A device node's major changed (a driver reload).
        let mut moved = inv();
        moved.gpus[1].node.major = 500;
        let o = devices(&p, &s, &moved);
        assert_eq!((o.status, o.changed), (Status::Ready, true));
        let spec = cdi::Spec::parse(&std::fs::read(p.cdi_dir.join(CDI_FILE)).unwrap()).unwrap();
        assert_eq!(spec.devices[0].container_edits.device_nodes[0].major, 500);
        assert!(
            std::fs::read_to_string(p.env_dir.join("job-a.env"))
                .unwrap()
                .contains("GPU-00000001")
        );
    }

    #[test]
    fn a_missing_gpu_fails_and_leaves_the_last_good_state() {
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        devices(&p, &spec(&[("job-a", &["0"])]), &inv());
        let good = std::fs::read(p.cdi_dir.join(CDI_FILE)).unwrap();
        let o = devices(&p, &spec(&[("job-a", &["0"]), ("job-b", &["7"])]), &inv());
        assert_eq!(o.status, Status::Failed);
        assert_eq!(o.message, "allocation job-b: GPU 7 is not on this node");
        assert_eq!(std::fs::read(p.cdi_dir.join(CDI_FILE)).unwrap(), good);
        assert!(!p.env_dir.join("job-b.env").exists());
    }

    #[test]
    fn dropped_allocations_lose_their_files() {
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        devices(&p, &spec(&[("job-a", &["0"]), ("job-b", &["1"])]), &inv());
        devices(&p, &spec(&[("job-b", &["1"])]), &inv());
        assert!(!p.env_dir.join("job-a.env").exists());
        assert!(p.env_dir.join("job-b.env").exists());
        let o = devices(&p, &spec(&[]), &inv());
        assert_eq!((o.status, o.changed), (Status::Ready, true));
        assert!(!p.cdi_dir.join(CDI_FILE).exists());
    }

    #[test]
    fn an_unwritable_cdi_directory_is_progressing() {
        let d = tempfile::tempdir().unwrap();
        let blocker = d.path().join("cdi");
        std::fs::write(&blocker, b"a file where the directory should be").unwrap();
        let o = devices(&paths(d.path()), &spec(&[("job-a", &["0"])]), &inv());
        assert_eq!(o.status, Status::Progressing);
        assert!(o.message.contains("cdi"), "{}", o.message);
    }
}
