//! Node inventory: one body per section, keyed by its SHA-256.
//!
//! The node sends hashes in its Hello; the Welcome names the sections whose
//! hash the store lacks ([`crate::sessions::inventory_wanted`]); the node
//! sends only those, signed by its key and naming the session epoch, and a
//! write applies only when it verifies ([`crate::nodes::judge_signed`]; a
//! forged one is recorded as `security.inventory.forged`) and names the
//! current epoch.

use crate::id::NodeId;
use bcd_core::report::InventorySection;

/// The fleet event a forged inventory section is recorded as.
pub const FORGED: &str = "security.inventory.forged";

/// An inventory section as the node signed it (inside a
/// [`crate::nodes::Signed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryInput {
    pub node_id: NodeId,
    /// The session epoch the node sent it under.
    pub epoch: u64,
    /// A section this release knows: a gateway turns away any other
    /// before the store.
    pub section: InventorySection,
    pub sha256: String,
    pub body: Vec<u8>,
}

impl crate::nodes::About for InventoryInput {
    fn node_id(&self) -> &str {
        &self.node_id
    }
}

/// A stored inventory section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryRow {
    pub sha256: String,
    pub body: Vec<u8>,
    pub updated_at_ms: i64,
}

/// The MAC addresses a node's signed `host` inventory section reports, as
/// the store keeps them (parsed, deduplicated, sorted), so a node whose
/// network cards changed since it joined is found by its MACs again.
/// `None` for another section, a host section without the list (an older
/// agent), or one whose list is too long or holds something that is not a
/// MAC: the MACs recorded before stay.
pub fn host_macs(section: InventorySection, body: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Host {
        macs: Option<Vec<String>>,
    }
    if section != InventorySection::Host {
        return None;
    }
    let macs = serde_json::from_slice::<Host>(body).ok()?.macs?;
    if macs.len() > crate::images::MAX_MACS {
        return None;
    }
    let mut out = macs
        .iter()
        .map(|m| crate::images::parse_mac(m))
        .collect::<Option<Vec<_>>>()?;
    out.sort();
    out.dedup();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::{InventorySection, host_macs};
    use proptest::prelude::*;

    #[test]
    fn the_host_section_names_the_macs_and_nothing_else_changes_them() {
        let body = br#"{"hostname":"n","agent_version":"0.1.0","macs":["52:54:00:AB:cd:01","02-bc-00-00-00-01","52:54:00:ab:cd:01"]}"#;
        assert_eq!(
            host_macs(InventorySection::Host, body),
            Some(vec!["02:bc:00:00:00:01".into(), "52:54:00:ab:cd:01".into()])
        );
        assert_eq!(host_macs(InventorySection::Gpus, body), None);
        assert_eq!(
            host_macs(
                InventorySection::Host,
                br#"{"hostname":"n","agent_version":"0.0.9"}"#
            ),
            None,
            "an older agent reports none: the join's stay"
        );
        assert_eq!(
            host_macs(InventorySection::Host, br#"{"macs":[]}"#),
            Some(vec![])
        );
        assert_eq!(
            host_macs(InventorySection::Host, br#"{"macs":["not a mac"]}"#),
            None
        );
        let many: Vec<String> = (0..65).map(|i| format!("02:00:00:00:00:{i:02x}")).collect();
        let body = serde_json::to_vec(&serde_json::json!({ "macs": many })).unwrap();
        assert_eq!(host_macs(InventorySection::Host, &body), None);
    }

    proptest! {
        // Whatever bytes a node signs, the reading ends in a bounded list
        // of well-formed MACs or in nothing.
        #[test]
        fn any_body_gives_well_formed_macs_or_none(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Some(macs) = host_macs(InventorySection::Host, &body) {
                prop_assert!(macs.len() <= crate::images::MAX_MACS);
                for m in macs {
                    prop_assert!(crate::images::parse_mac(&m).as_deref() == Some(m.as_str()));
                }
            }
        }

        #[test]
        fn listed_macs_come_back_normalised(raw in proptest::collection::vec(any::<[u8; 6]>(), 0..64)) {
            let listed: Vec<String> = raw
                .iter()
                .map(|b| b.iter().map(|x| format!("{x:02X}")).collect::<Vec<_>>().join("-"))
                .collect();
            let body = serde_json::to_vec(&serde_json::json!({ "macs": listed })).unwrap();
            let got = host_macs(InventorySection::Host, &body).unwrap();
            let mut want: Vec<String> = raw
                .iter()
                .map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":"))
                .collect();
            want.sort();
            want.dedup();
            prop_assert_eq!(got, want);
        }
    }
}
