//! The devices converger: the `nvidia.com/gpu` CDI spec for the GPUs the
//! spec assigns to allocations (`bcd-nvidia-gpu.json` in the CDI spec
//! directory) and one env file per allocation (`<allocation>.env`).
//!
//! [`plan`] resolves every GPU reference against the host's inventory and
//! computes every file's bytes without touching anything: a spec that names
//! a GPU the node does not have, or an allocation id or environment the
//! helper's rules refuse (`bcd_helper::validate::EnvFile`: an id that is a
//! safe file name, variable names without `=`, NUL or a line break, none
//! that bcd writes itself or that steers the dynamic loader, values
//! without a line break), fails there, and the last good state stays
//! enforced. Env files are written 0640: they may carry a workload's
//! settings. [`DeviceFiles::apply`] makes the files so, comparing bytes:
//! drift (a device node whose numbers changed, a GPU gone, a file edited by
//! hand) is repaired, and a pass with nothing to change writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use bcd_proto::v1::NodeSpec;

use super::access::StepError;
use super::{Outcome, Status};

pub const CDI_FILE: &str = "bcd-nvidia-gpu.json";

/// One allocation's env file: the GPUs it names (as the CDI spec names
/// them) and the spec's extra variables.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvFile {
    pub devices: Vec<String>,
    pub env: BTreeMap<String, String>,
}

impl EnvFile {
    /// The file's bytes ([`env_file`]).
    pub fn render(&self) -> String {
        env_file(&self.devices, &self.env.iter().collect())
    }
}

/// What the device files must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DevicePlan {
    /// The CDI spec's bytes; `None`: no GPU assigned, no spec file.
    pub cdi_spec: Option<Vec<u8>>,
    /// Allocation id → its env file.
    pub env_files: BTreeMap<String, EnvFile>,
}

/// Writes the CDI spec and the env files (a privileged act: the CDI spec
/// directory and `/run` belong to root).
pub trait DeviceFiles: Send + Sync + std::fmt::Debug {
    /// Makes the files what `plan` says, removing env files of allocations
    /// it does not name; says whether anything changed. The error is worded
    /// for the section's status: `Progressing` is retried, `Failed` means
    /// the files cannot be written as planned.
    fn apply(&self, plan: &DevicePlan) -> Result<bool, StepError>;
}

/// The env files of `dir`, by allocation id.
pub fn env_files_in(dir: &std::path::Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".env"))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// The files in two directories of this machine.
#[derive(Debug, Clone)]
pub struct DeviceDirs {
    /// CDI spec directory (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Per-allocation env files (`/run/bcd/env`).
    pub env_dir: PathBuf,
}

fn chain(e: bcd_sys::fs::FsError) -> StepError {
    (Status::Progressing, bcd_sys::error::chain(&e))
}

impl DeviceFiles for DeviceDirs {
    fn apply(&self, plan: &DevicePlan) -> Result<bool, StepError> {
        let mut changed = false;
        let cdi_path = self.cdi_dir.join(CDI_FILE);
        changed |= match &plan.cdi_spec {
            Some(bytes) => bcd_sys::fs::write_if_changed(&cdi_path, bytes, 0o644),
            None => bcd_sys::fs::remove_if_present(&cdi_path),
        }
        .map_err(chain)?;
        let mut wanted = BTreeSet::new();
        for (id, file) in &plan.env_files {
            let path = self.env_dir.join(format!("{id}.env"));
            changed |= bcd_sys::fs::write_if_changed(&path, file.render().as_bytes(), ENV_MODE)
                .map_err(chain)?;
            wanted.insert(path);
        }
        if let Ok(entries) = std::fs::read_dir(&self.env_dir) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "env") && !wanted.contains(&p) {
                    changed |= bcd_sys::fs::remove_if_present(&p).map_err(chain)?;
                }
            }
        }
        Ok(changed)
    }
}

/// The mode of an allocation's env file.
pub const ENV_MODE: u32 = 0o640;

/// Checks one allocation's env file by the helper's rules (the rules the
/// helper applies when it writes the file for an unprivileged node).
pub fn check_env_file(
    allocation_id: &str,
    names: &[String],
    extra: &std::collections::HashMap<String, String>,
) -> Result<(), String> {
    bcd_helper::validate::EnvFile::parse(bcd_helper::wire::WriteEnvFile {
        allocation_id: allocation_id.to_string(),
        devices: names.to_vec(),
        env: extra.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    })
    .map(drop)
    .map_err(|e| e.to_string())
}

/// The env file of one allocation.
pub fn env_file(names: &[String], extra: &BTreeMap<&String, &String>) -> String {
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

/// Resolves the spec's GPU assignments against the inventory and computes
/// the files; the error says why the spec cannot be applied.
pub fn plan(spec: &NodeSpec, inv: &cdi::nvidia::Inventory) -> Result<DevicePlan, String> {
    let assignments = spec
        .devices
        .as_ref()
        .map(|d| d.assignments.as_slice())
        .unwrap_or_default();
    let mut selected: Vec<cdi::nvidia::Gpu> = Vec::new();
    let mut env_files = BTreeMap::new();
    for a in assignments {
        let mut names = Vec::new();
        for r in &a.gpus {
            let Some(g) = inv
                .gpus
                .iter()
                .find(|g| g.uuid.as_deref() == Some(r.as_str()) || g.index.to_string() == *r)
            else {
                return Err(format!(
                    "allocation {}: GPU {r} is not on this node",
                    a.allocation_id
                ));
            };
            if !selected.iter().any(|s| s.index == g.index) {
                selected.push(g.clone());
            }
            names.push(g.uuid.clone().unwrap_or_else(|| g.index.to_string()));
        }
        check_env_file(&a.allocation_id, &names, &a.env)?;
        env_files.insert(
            a.allocation_id.clone(),
            EnvFile {
                devices: names,
                env: a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            },
        );
    }
    let cdi_spec = if selected.is_empty() {
        None
    } else {
        let spec = cdi::nvidia::spec(&cdi::nvidia::Inventory {
            gpus: selected,
            control_nodes: inv.control_nodes.clone(),
            driver_files: inv.driver_files.clone(),
        });
        spec.validate()
            .map_err(|e| format!("the CDI spec would be invalid: {e}"))?;
        Some(spec.to_json())
    };
    Ok(DevicePlan {
        cdi_spec,
        env_files,
    })
}

/// One pass of the devices converger.
pub fn converge(files: &dyn DeviceFiles, spec: &NodeSpec, inv: &cdi::nvidia::Inventory) -> Outcome {
    let plan = match plan(spec, inv) {
        Ok(p) => p,
        Err(message) => return Outcome::not(Status::Failed, message),
    };
    match files.apply(&plan) {
        Ok(changed) => Outcome::ready(changed),
        Err((status, message)) => Outcome::not(status, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_proto::v1::{DevicesSpec, GpuAssignment};
    use std::path::Path;

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
                        secrets: vec![],
                    })
                    .collect(),
            }),
            access: None,
            not_after_ms: 0,
            ticket_jwks: String::new(),
            intent: None,
        }
    }

    fn paths(d: &Path) -> DeviceDirs {
        DeviceDirs {
            cdi_dir: d.join("cdi"),
            env_dir: d.join("env"),
        }
    }

    #[test]
    fn writes_the_cdi_spec_and_env_files_then_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        let s = spec(&[("job-a", &["0", "GPU-00000001-0000-0000-0000-000000000000"])]);
        let o = converge(&p, &s, &inv());
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
        let o = converge(&p, &s, &inv());
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
        converge(&p, &s, &inv());
        // Edited by hand.
        std::fs::write(p.cdi_dir.join(CDI_FILE), b"{}").unwrap();
        std::fs::write(p.env_dir.join("job-a.env"), b"NVIDIA_VISIBLE_DEVICES=all\n").unwrap();
        // A device node's major changed (a driver reload).
        let mut moved = inv();
        moved.gpus[1].node.major = 500;
        let o = converge(&p, &s, &moved);
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
        converge(&p, &spec(&[("job-a", &["0"])]), &inv());
        let good = std::fs::read(p.cdi_dir.join(CDI_FILE)).unwrap();
        let o = converge(&p, &spec(&[("job-a", &["0"]), ("job-b", &["7"])]), &inv());
        assert_eq!(o.status, Status::Failed);
        assert_eq!(o.message, "allocation job-b: GPU 7 is not on this node");
        assert_eq!(std::fs::read(p.cdi_dir.join(CDI_FILE)).unwrap(), good);
        assert!(!p.env_dir.join("job-b.env").exists());
    }

    #[test]
    fn env_files_are_0640_and_unsafe_ids_or_variables_change_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        converge(&p, &spec(&[("job-a", &["0"])]), &inv());
        let mode = std::fs::metadata(p.env_dir.join("job-a.env"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        let good = std::fs::read(p.cdi_dir.join(CDI_FILE)).unwrap();
        for id in ["../../etc/cron.d/x", "a/b", "..", ".hidden", "a\nb", ""] {
            let o = converge(&p, &spec(&[("job-a", &["0"]), (id, &["1"])]), &inv());
            assert_eq!(o.status, Status::Failed, "{id:?}");
            assert!(o.message.contains("allocation id"), "{}", o.message);
        }
        for (k, v) in [
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("LD_PRELOAD", "/tmp/x.so"),
            ("A=B", "1"),
            ("OK", "two\nlines"),
            ("NUL", "a\0b"),
        ] {
            let mut s = spec(&[("job-b", &["1"])]);
            s.devices.as_mut().unwrap().assignments[0]
                .env
                .insert(k.to_string(), v.to_string());
            let o = converge(&p, &s, &inv());
            assert_eq!(o.status, Status::Failed, "{k}={v:?}");
        }
        assert_eq!(std::fs::read(p.cdi_dir.join(CDI_FILE)).unwrap(), good);
        let names: Vec<String> = std::fs::read_dir(&p.env_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["job-a.env"], "nothing else was written");
    }

    #[test]
    fn dropped_allocations_lose_their_files() {
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        converge(&p, &spec(&[("job-a", &["0"]), ("job-b", &["1"])]), &inv());
        converge(&p, &spec(&[("job-b", &["1"])]), &inv());
        assert!(!p.env_dir.join("job-a.env").exists());
        assert!(p.env_dir.join("job-b.env").exists());
        let o = converge(&p, &spec(&[]), &inv());
        assert_eq!((o.status, o.changed), (Status::Ready, true));
        assert!(!p.cdi_dir.join(CDI_FILE).exists());
    }

    #[test]
    fn an_unwritable_cdi_directory_is_progressing() {
        let d = tempfile::tempdir().unwrap();
        let blocker = d.path().join("cdi");
        std::fs::write(&blocker, b"a file where the directory should be").unwrap();
        let o = converge(&paths(d.path()), &spec(&[("job-a", &["0"])]), &inv());
        assert_eq!(o.status, Status::Progressing);
        assert!(o.message.contains("cdi"), "{}", o.message);
    }
}
