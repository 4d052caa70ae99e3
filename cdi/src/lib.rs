//! Container Device Interface (CDI) specs.
//!
//! The model of a CDI spec file (`cdiVersion` 0.3.0 through 1.1.0), parsing
//! with validation, the minimum `cdiVersion` a spec's content needs (a spec
//! we write declares exactly that, so older runtimes can read it), and the
//! generation of an `nvidia.com/gpu` spec from a GPU inventory ([`nvidia`]).
//!
//! This crate does no I/O: the agent's devices converger reads the host and
//! writes the file atomically; the server validates specs it is shown. Specs
//! we write are checked against the upstream JSON schema in the tests.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod nvidia;

/// Known versions, oldest first. Specs older than 0.3.0 are not supported.
pub const VERSIONS: &[&str] = &[
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiError {
    #[error("not a CDI spec: {0}")]
    Json(String),
    #[error("unknown cdiVersion {0:?}: one of {versions}", versions = VERSIONS.join(", "))]
    UnknownVersion(String),
    #[error("cdiVersion {declared} is too old for this spec's content: it needs at least {needed}")]
    VersionTooOld { declared: String, needed: String },
    #[error("kind {0:?} is not of the form vendor.com/class")]
    BadKind(String),
    #[error(
        "device name {0:?} is not valid: letters, digits, '_', '-', '.', ':', starting with a letter or digit"
    )]
    BadDeviceName(String),
    #[error("device {0:?} appears twice")]
    DuplicateDevice(String),
    #[error("a spec needs at least one device")]
    NoDevices,
    #[error("{what} path {path:?} must be absolute")]
    RelativePath { what: &'static str, path: String },
    #[error("environment entry {0:?} is not NAME=VALUE")]
    BadEnv(String),
    #[error("device node {path:?} has type {kind:?}: one of b, c, u, p")]
    BadNodeType { path: String, kind: String },
    #[error("hook {0:?} is not an OCI hook name")]
    BadHookName(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    #[serde(
        default,
        rename = "additionalGids",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub additional_gids: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        *self == ContainerEdits::default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_path: String,
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub major: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub minor: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub permissions: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IntelRdt {
    #[serde(default, rename = "closID", skip_serializing_if = "String::is_empty")]
    pub clos_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub l3_cache_schema: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mem_bw_schema: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_cmt: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_mbm: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_monitoring: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetDevice {
    pub host_interface_name: String,
    pub name: String,
}

const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

fn version_index(v: &str) -> Option<usize> {
    VERSIONS
        .iter()
        .position(|k| *k == v.trim_start_matches('v'))
}

impl Spec {
    /// Parses and validates a spec file.
    pub fn parse(bytes: &[u8]) -> Result<Spec, CdiError> {
        let spec: Spec =
            serde_json::from_slice(bytes).map_err(|e| CdiError::Json(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// The spec as we write it: pretty JSON with a trailing newline, the same
    /// bytes for the same spec.
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a spec serializes");
        v.push(b'\n');
        v
    }

    /// `vendor.com/class` split in two.
    pub fn qualifier(&self) -> Option<(&str, &str)> {
        self.kind.split_once('/')
    }

    /// The oldest `cdiVersion` that can express this spec's content.
    pub fn minimum_version(&self) -> &'static str {
        let edits = || {
            std::iter::once(&self.container_edits)
                .chain(self.devices.iter().map(|d| &d.container_edits))
        };
        let v110 = edits().any(|e| {
            !e.net_devices.is_empty()
                || e.intel_rdt
                    .as_ref()
                    .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring)
        });
        let v070 = edits().any(|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty());
        let v060 = !self.annotations.is_empty()
            || self.devices.iter().any(|d| !d.annotations.is_empty())
            || self
                .qualifier()
                .is_some_and(|(_, class)| class.contains('.'));
        let v050 = self.devices.iter().any(|d| {
            d.name
                .chars()
                .next()
                .is_some_and(|c| !c.is_ascii_alphabetic())
        }) || edits().any(|e| e.device_nodes.iter().any(|n| !n.host_path.is_empty()));
        let v040 = edits().any(|e| e.mounts.iter().any(|m| !m.kind.is_empty()));
        if v110 {
            "1.1.0"
        } else if v070 {
            "0.7.0"
        } else if v060 {
            "0.6.0"
        } else if v050 {
            "0.5.0"
        } else if v040 {
            "0.4.0"
        } else {
            "0.3.0"
        }
    }

    /// Checks what the JSON schema cannot: a known version that covers the
    /// content, a qualified kind, valid and unique device names, absolute
    /// paths, `NAME=VALUE` environment entries, node types, hook names.
    pub fn validate(&self) -> Result<(), CdiError> {
        let declared = version_index(&self.cdi_version)
            .ok_or_else(|| CdiError::UnknownVersion(self.cdi_version.clone()))?;
        let needed = self.minimum_version();
        if declared < version_index(needed).expect("known") {
            return Err(CdiError::VersionTooOld {
                declared: self.cdi_version.clone(),
                needed: needed.to_string(),
            });
        }
        let (vendor, class) = self
            .qualifier()
            .ok_or_else(|| CdiError::BadKind(self.kind.clone()))?;
        let label = |s: &str, dots: bool| {
            !s.is_empty()
                && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
                && s.chars().all(|c| {
                    c.is_ascii_alphanumeric() || c == '-' || c == '_' || (dots && c == '.')
                })
        };
        if !label(vendor, true) || !label(class, true) || vendor.contains("..") {
            return Err(CdiError::BadKind(self.kind.clone()));
        }
        if self.devices.is_empty() {
            return Err(CdiError::NoDevices);
        }
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.devices {
            let ok = d
                .name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
                && d.name
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_ascii_alphanumeric())
                && d.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
            if !ok {
                return Err(CdiError::BadDeviceName(d.name.clone()));
            }
            if !seen.insert(d.name.as_str()) {
                return Err(CdiError::DuplicateDevice(d.name.clone()));
            }
            validate_edits(&d.container_edits)?;
        }
        validate_edits(&self.container_edits)
    }
}

fn absolute(what: &'static str, path: &str) -> Result<(), CdiError> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(CdiError::RelativePath {
            what,
            path: path.to_string(),
        })
    }
}

fn validate_edits(e: &ContainerEdits) -> Result<(), CdiError> {
    for env in &e.env {
        match env.split_once('=') {
            Some((name, _)) if !name.is_empty() => {}
            _ => return Err(CdiError::BadEnv(env.clone())),
        }
    }
    for n in &e.device_nodes {
        absolute("device node", &n.path)?;
        if !n.host_path.is_empty() {
            absolute("device node host", &n.host_path)?;
        }
        if !n.kind.is_empty() && !matches!(n.kind.as_str(), "b" | "c" | "u" | "p") {
            return Err(CdiError::BadNodeType {
                path: n.path.clone(),
                kind: n.kind.clone(),
            });
        }
    }
    for m in &e.mounts {
        absolute("mount host", &m.host_path)?;
        absolute("mount container", &m.container_path)?;
    }
    for h in &e.hooks {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(CdiError::BadHookName(h.hook_name.clone()));
        }
        absolute("hook", &h.path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            cdi_version: "0.3.0".into(),
            kind: "vendor.com/device".into(),
            devices: vec![Device {
                name: "dev0".into(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: "/dev/card0".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn minimum_version_follows_the_features_used() {
        let mut s = spec();
        assert_eq!(s.minimum_version(), "0.3.0");
        s.container_edits.mounts.push(Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            kind: "bind".into(),
            ..Default::default()
        });
        assert_eq!(s.minimum_version(), "0.4.0");
        s.devices[0].name = "0".into();
        assert_eq!(s.minimum_version(), "0.5.0");
        s.annotations.insert("a".into(), "b".into());
        assert_eq!(s.minimum_version(), "0.6.0");
        s.devices[0].container_edits.additional_gids.push(44);
        assert_eq!(s.minimum_version(), "0.7.0");
        s.container_edits.net_devices.push(NetDevice {
            host_interface_name: "eth1".into(),
            name: "net1".into(),
        });
        assert_eq!(s.minimum_version(), "1.1.0");
        let err = s.validate().unwrap_err();
        assert_eq!(
            err,
            CdiError::VersionTooOld {
                declared: "0.3.0".into(),
                needed: "1.1.0".into()
            }
        );
        s.cdi_version = "1.1.0".into();
        s.validate().unwrap();
    }

    #[test]
    fn validation_refuses_what_runtimes_refuse() {
        let check = |f: &dyn Fn(&mut Spec)| {
            let mut s = spec();
            s.cdi_version = "1.1.0".into();
            f(&mut s);
            s.validate()
        };
        assert!(check(&|_| {}).is_ok());
        assert!(matches!(
            check(&|s| s.cdi_version = "0.2.0".into()),
            Err(CdiError::UnknownVersion(_))
        ));
        assert!(matches!(
            check(&|s| s.kind = "device".into()),
            Err(CdiError::BadKind(_))
        ));
        assert!(matches!(
            check(&|s| s.kind = "vendor.com/".into()),
            Err(CdiError::BadKind(_))
        ));
        assert!(matches!(
            check(&|s| s.devices[0].name = "bad name".into()),
            Err(CdiError::BadDeviceName(_))
        ));
        assert!(matches!(
            check(&|s| {
                let d = s.devices[0].clone();
                s.devices.push(d)
            }),
            Err(CdiError::DuplicateDevice(_))
        ));
        assert!(matches!(
            check(&|s| s.devices.clear()),
            Err(CdiError::NoDevices)
        ));
        assert!(matches!(
            check(&|s| s.devices[0].container_edits.device_nodes[0].path = "dev/x".into()),
            Err(CdiError::RelativePath { .. })
        ));
        assert!(matches!(
            check(&|s| s.container_edits.env.push("NOVALUE".into())),
            Err(CdiError::BadEnv(_))
        ));
        assert!(matches!(
            check(&|s| s.devices[0].container_edits.device_nodes[0].kind = "x".into()),
            Err(CdiError::BadNodeType { .. })
        ));
        assert!(matches!(
            check(&|s| s.container_edits.hooks.push(Hook {
                hook_name: "later".into(),
                path: "/h".into(),
                ..Default::default()
            })),
            Err(CdiError::BadHookName(_))
        ));
    }

    #[test]
    fn serialization_is_stable_and_round_trips() {
        let s = spec();
        assert_eq!(s.to_json(), s.to_json());
        assert_eq!(Spec::parse(&s.to_json()).unwrap(), s);
        let text = String::from_utf8(s.to_json()).unwrap();
        assert!(
            !text.contains("annotations") && !text.contains("hostPath"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Spec files come from disk and from peers: any bytes parse or fail
        /// cleanly, and what parses serializes to something that parses to
        /// the same spec.
        #[test]
        fn parse_never_panics_and_round_trips(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
            if let Ok(s) = Spec::parse(&bytes) {
                prop_assert_eq!(Spec::parse(&s.to_json()).unwrap(), s);
            }
        }

        #[test]
        fn generated_specs_always_validate(
            gpus in prop::collection::vec((0u32..64, any::<bool>(), 0u32..1024), 0..16),
            files in prop::collection::vec("/[a-z]{1,8}(/[a-z0-9.]{1,8}){0,3}", 0..6),
        ) {
            let mut seen = std::collections::BTreeSet::new();
            let inv = nvidia::Inventory {
                gpus: gpus
                    .into_iter()
                    .filter(|(i, _, _)| seen.insert(*i))
                    .map(|(i, uuid, minor)| nvidia::Gpu {
                        index: i,
                        uuid: uuid.then(|| format!("GPU-{i:08x}")),
                        node: nvidia::Node { path: format!("/dev/nvidia{i}"), major: 195, minor },
                    })
                    .collect(),
                control_nodes: vec![],
                driver_files: files,
            };
            let s = nvidia::spec(&inv);
            if inv.gpus.is_empty() {
                prop_assert_eq!(s.validate(), Err(CdiError::NoDevices));
            } else {
                prop_assert!(s.validate().is_ok());
                prop_assert_eq!(Spec::parse(&s.to_json()).unwrap(), s);
            }
        }
    }
}
