//! Desired state: each node's NodeSpec, sealed by a worker key, and what
//! the node reports applied.
//!
//! A change edits the spec body (GPU assignments, access) or refuses; the
//! generation grows by one and the sealer signs the new spec, all in one
//! transaction. A spec lives [`LIFETIME`] from its signing: nodes refuse a
//! spec that arrives after its `not_after` (a replay), so workers sign a
//! new generation of the same body before then ([`RESIGN_WITHIN`]).
//!
//! State reports are the node's signed facts ([`crate::nodes::judge_signed`];
//! a forged one is recorded as `security.state-report.forged`), accepted
//! from the node's latest session or a later one, never an older one; an
//! applied generation never moves backward except to 0, which a node with
//! a new journal reports ([`applied_generation`]).

use crate::id::NodeId;
use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::Refusal;

/// How long a signed spec lives.
pub const LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Specs expiring within this are signed again.
pub const RESIGN_WITHIN: Duration = Duration::from_secs(12 * 3600);

/// The fleet event a forged state report is recorded as.
pub const FORGED: &str = "security.state-report.forged";

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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRef>,
}

/// A secret an allocation holds, by name and version
/// (`crate::secrets`), and the file the node writes it to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretRef {
    pub name: String,
    pub version: u64,
    /// Empty: the name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
}

/// Everything a NodeSpec says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecBody {
    pub assignments: Vec<Assignment>,
    pub access: Access,
    /// The operator's labels and cordon: signed with the rest, kept in no
    /// column (whoever reads them opens the signed spec).
    pub intent: Intent,
}

/// What the control plane intends for a node beside what it applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Intent {
    pub labels: BTreeMap<String, String>,
    pub cordon: Option<Cordon>,
}

/// Why and since when a node is cordoned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cordon {
    pub reason: String,
    pub since_ms: i64,
}

/// Edits a node's spec body, or refuses the change.
pub type ChangeSpec = Box<dyn FnOnce(&mut SpecBody) -> Result<(), Refusal> + Send>;

/// What the store decided about a spec, for the sealer to sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecSeal {
    pub generation: u64,
    pub issued_at_ms: i64,
    pub not_after_ms: i64,
}

/// Seals a spec inside its changing transaction; returns the signed bytes.
pub type SealSpec = Box<dyn FnOnce(&SpecSeal, &SpecBody) -> Vec<u8> + Send>;

/// What a worker key signed, read back from a node's stored spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedSpec {
    pub generation: u64,
    pub body: SpecBody,
}

/// Verifies a node's stored signed spec (the key that signed it, the node
/// it names) and reads its body back, or says why it is not one a worker
/// signed. A change starts from what it returns, never from the store's
/// unsigned columns, which whoever can write the store can rewrite.
pub type OpenSpec = Box<dyn FnOnce(&[u8]) -> Result<OpenedSpec, String> + Send>;

/// The fleet event a stored spec no worker key signed is recorded as.
pub const SPEC_FORGED: &str = "security.spec.forged";

/// Where a change of a node's spec starts: the generation and body its
/// stored signed bytes hold (`None`: the node has no spec yet), or why
/// those bytes are not a worker's.
pub fn start_from(stored: Option<&[u8]>, open: OpenSpec) -> Result<(u64, SpecBody), String> {
    match stored {
        None => Ok((0, SpecBody::default())),
        Some(bytes) => open(bytes).map(|o| (o.generation, o.body)),
    }
}

/// The refusal of a change whose stored spec did not open: nothing is
/// signed from it, and the node keeps enforcing the last spec it verified.
pub fn forged_refusal(node_id: &str, why: &str) -> Refusal {
    Refusal::Conflict(format!(
        "the stored spec of node {node_id} is not one a worker key signed ({why}); recorded as \
         {SPEC_FORGED}: the store was written outside the control plane. Nothing was signed and \
         the node keeps its last verified spec; restore the store from a backup \
         (better-compute backup restore) or delete and join the node again"
    ))
}

/// A state report as the node signed it (inside a
/// [`crate::nodes::Signed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateReportInput {
    pub node_id: NodeId,
    /// The session epoch the node sent it under.
    pub epoch: u64,
    pub applied_generation: u64,
    pub sections: Vec<SectionReport>,
}

impl crate::nodes::About for StateReportInput {
    fn node_id(&self) -> &str {
        &self.node_id
    }
}

/// What became of a signed fact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FactApplied {
    Applied,
    /// Verified, but from an older session than what is applied already
    /// (or, for inventory, not from the current one): nothing changes.
    Stale,
    /// Not the node's signed fact: recorded, applied nowhere.
    Forged(String),
}

/// Whether a report sent under `epoch` may replace one sent under
/// `stored_epoch`: the same session or a later one.
pub fn report_applies(stored_epoch: u64, epoch: u64) -> bool {
    epoch >= stored_epoch
}

/// One section of a node's state report, as the node sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionReport {
    pub section: String,
    /// `bcd_core::report::Status`'s name: the one spelling in the store.
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
    fn a_report_from_an_older_session_changes_nothing() {
        assert!(report_applies(3, 3));
        assert!(report_applies(3, 4));
        assert!(!report_applies(4, 3));
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
