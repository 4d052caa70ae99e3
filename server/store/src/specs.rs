//! Desired state: each node's NodeSpec, sealed by a worker key, and what
//! the node reports applied.
//!
//! A change edits the spec body (GPU assignments, access) or refuses; the
//! generation grows by one and the sealer signs the new spec, all in one
//! transaction. State reports are facts, accepted from any epoch; an
//! applied generation never moves backward except to 0, which a node with
//! a new journal reports ([`applied_generation`]).

use std::collections::BTreeMap;

use crate::error::Refusal;

/// Who may log in and the firewall table, as the store keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Access {
    #[serde(default)]
    pub users: Vec<AccessUser>,
    #[serde(default)]
    pub trusted_user_ca_keys: Vec<String>,
    #[serde(default)]
    pub firewall: Option<Firewall>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AccessUser {
    pub name: String,
    #[serde(default)]
    pub authorized_keys: Vec<String>,
    #[serde(default)]
    pub principals: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Firewall {
    #[serde(default)]
    pub rules: Vec<FirewallRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FirewallRule {
    pub protocol: String,
    pub port: u32,
    #[serde(default)]
    pub source: String,
    pub action: String,
}

/// GPUs bound to one allocation, as the store keeps them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    pub allocation_id: String,
    pub gpus: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Everything a NodeSpec says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecBody {
    pub assignments: Vec<Assignment>,
    pub access: Access,
}

/// Edits a node's spec body, or refuses the change.
pub type ChangeSpec = Box<dyn FnOnce(&mut SpecBody) -> Result<(), Refusal> + Send>;

/// Seals a spec inside its changing transaction: gets the new generation,
/// the store's now and the body; returns the signed bytes.
pub type SealSpec = Box<dyn FnOnce(u64, i64, &SpecBody) -> Vec<u8> + Send>;

/// One section of a node's state report, as the node sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionReport {
    pub section: String,
    pub status: String,
    pub message: String,
    /// How long ago, on the node's monotonic clock, the section changed.
    pub age_ms: u64,
}

/// A section of a node's state report, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SectionRow {
    pub section: String,
    pub status: String,
    pub message: String,
    /// When the section last changed, derived from the node's age.
    pub since_ms: i64,
}

/// Desired against applied, for `nodes spec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecView {
    pub desired_generation: u64,
    pub assignments: Vec<Assignment>,
    pub access: Access,
    pub applied_generation: u64,
    pub sections: Vec<SectionRow>,
    pub reported_age_ms: Option<i64>,
    pub now_ms: i64,
}

/// The applied generation after a report: it never moves backward, except
/// to 0 (a new journal holds no spec).
pub fn applied_generation(stored: Option<u64>, reported: u64) -> u64 {
    match stored {
        Some(s) if reported != 0 => s.max(reported),
        _ => reported,
    }
}

/// The report's sections with their times on the store's clock.
pub fn sections_at(now_ms: i64, reports: &[SectionReport]) -> Vec<SectionRow> {
    reports
        .iter()
        .map(|s| SectionRow {
            section: s.section.clone(),
            status: s.status.clone(),
            message: s.message.clone(),
            since_ms: now_ms - s.age_ms.min(i64::MAX as u64) as i64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applied_generation_rises_or_restarts_at_zero() {
        assert_eq!(applied_generation(None, 3), 3);
        assert_eq!(applied_generation(Some(5), 3), 5, "a late report");
        assert_eq!(applied_generation(Some(5), 6), 6);
        assert_eq!(applied_generation(Some(5), 0), 0, "a new journal");
    }

    #[test]
    fn section_times_come_from_the_reported_age() {
        let rows = sections_at(
            10_000,
            &[SectionReport {
                section: "devices".into(),
                status: "OBSERVED".into(),
                message: String::new(),
                age_ms: 2_500,
            }],
        );
        assert_eq!(rows[0].since_ms, 7_500);
    }
}
