//! What the node tells the server about its state, and when.
//!
//! The convergers report each section's status after every pass; the
//! server hears only what changed: a state report when a section's status
//! or message or the applied generation changed since the last report of
//! this session, each GPU binding once per session (and again when its
//! GPUs change), and an inventory section when the server asked for it or
//! its hash changed since the server last had it. A new session starts
//! over: the server may have lost what the old one sent.

use std::collections::BTreeMap;
use std::time::Duration;

/// An inventory section a node reports; a server takes no other (each is
/// one row per node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InventorySection {
    /// Hostname, agent version, network cards.
    Host,
    /// The GPUs.
    Gpus,
    /// The TPM.
    Tpm,
}

impl InventorySection {
    /// Every section, in the order a node reports them.
    pub const ALL: [InventorySection; 3] = [
        InventorySection::Host,
        InventorySection::Gpus,
        InventorySection::Tpm,
    ];

    /// Its name in the store, the operator's tools and `--json`.
    pub fn name(self) -> &'static str {
        match self {
            InventorySection::Host => "host",
            InventorySection::Gpus => "gpus",
            InventorySection::Tpm => "tpm",
        }
    }

    /// The section a name names; `None` for any other.
    pub fn from_name(name: &str) -> Option<InventorySection> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A part of the desired state the node converges and reports on: one
/// status each in a state report, in name order (the order a report lists
/// them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateSection {
    /// sshd's access and the node's nftables table.
    Access,
    /// The CDI spec and the allocations' env files.
    Devices,
    /// The secrets the spec gives allocations.
    Secrets,
}

impl StateSection {
    /// Every section, in name order.
    pub const ALL: [StateSection; 3] = [
        StateSection::Access,
        StateSection::Devices,
        StateSection::Secrets,
    ];

    /// Its name in the store, the logs, the metrics and the operator's
    /// tools.
    pub fn name(self) -> &'static str {
        match self {
            StateSection::Devices => "devices",
            StateSection::Access => "access",
            StateSection::Secrets => "secrets",
        }
    }

    /// The section a name names; `None` for any other.
    pub fn from_name(name: &str) -> Option<StateSection> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A section's status after a convergence pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    Ready,
    /// Not there yet; retried on the next pass.
    Progressing,
    /// The spec cannot be applied as it is.
    Failed,
}

impl Status {
    /// The name on the wire and in the store.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ready => "READY",
            Status::Progressing => "PROGRESSING",
            Status::Failed => "FAILED",
        }
    }
}

/// One section in a state report. `age` is how long ago its status last
/// changed, on the node's monotonic clock (the server derives the time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionReport {
    pub section: StateSection,
    pub status: Status,
    pub message: String,
    pub age: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateReport {
    pub applied_generation: u64,
    pub sections: Vec<SectionReport>,
}

/// What a report said: the applied generation and each section's status
/// and message (ages are not news).
type Summary = (u64, Vec<(StateSection, Status, String)>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Section {
    status: Status,
    message: String,
    since: Duration,
}

/// The reports of one node process.
#[derive(Debug, Clone, Default)]
pub struct Reports {
    sections: BTreeMap<StateSection, Section>,
    /// What the last state report of this session said.
    sent: Option<Summary>,
    /// Bindings reported in this session: allocation → GPU UUIDs, sorted.
    bound: BTreeMap<String, Vec<String>>,
    /// Inventory hashes the server has, by section (its index in
    /// [`InventorySection::ALL`]).
    inventory: [Option<String>; InventorySection::ALL.len()],
}

impl Reports {
    pub fn new() -> Reports {
        Reports::default()
    }

    /// A pass's outcome for a section at `now`. True when its status or
    /// message changed (the shell logs those).
    pub fn observe(
        &mut self,
        section: StateSection,
        status: Status,
        message: &str,
        now: Duration,
    ) -> bool {
        let changed = self
            .sections
            .get(&section)
            .is_none_or(|s| s.status != status || s.message != message);
        if changed {
            self.sections.insert(
                section,
                Section {
                    status,
                    message: message.to_string(),
                    since: now,
                },
            );
        }
        changed
    }

    /// Whether every section observed is ready (and at least one was).
    pub fn all_ready(&self) -> bool {
        !self.sections.is_empty() && self.sections.values().all(|s| s.status == Status::Ready)
    }

    /// The state report to send now, if it says something the server has
    /// not heard in this session. A node with no spec, nothing applied and
    /// no section yet says nothing (it would cost the store a write).
    pub fn state_report(
        &mut self,
        applied_generation: u64,
        has_spec: bool,
        now: Duration,
    ) -> Option<StateReport> {
        if !has_spec && applied_generation == 0 && self.sections.is_empty() {
            return None;
        }
        let summary: Vec<(StateSection, Status, String)> = self
            .sections
            .iter()
            .map(|(n, s)| (*n, s.status, s.message.clone()))
            .collect();
        if self
            .sent
            .as_ref()
            .is_some_and(|(g, s)| *g == applied_generation && *s == summary)
        {
            return None;
        }
        let sections = self
            .sections
            .iter()
            .map(|(n, s)| SectionReport {
                section: *n,
                status: s.status,
                message: s.message.clone(),
                age: now.saturating_sub(s.since),
            })
            .collect();
        self.sent = Some((applied_generation, summary));
        Some(StateReport {
            applied_generation,
            sections,
        })
    }

    /// A new session: nothing reported in the last one counts.
    pub fn new_session(&mut self) {
        self.sent = None;
        self.bound.clear();
    }

    /// Forgets the bindings of allocations no longer `assigned`: one that
    /// is assigned again is reported again.
    pub fn retain_bindings(&mut self, assigned: &[&str]) {
        self.bound.retain(|a, _| assigned.contains(&a.as_str()));
    }

    /// Whether the binding of `allocation` to `gpus` must be reported:
    /// not yet in this session, or with other GPUs.
    pub fn binding_needed(&self, allocation: &str, gpus: &[String]) -> bool {
        let mut sorted = gpus.to_vec();
        sorted.sort();
        self.bound.get(allocation) != Some(&sorted)
    }

    /// The binding was sent.
    pub fn binding_sent(&mut self, allocation: &str, gpus: &[String]) {
        let mut sorted = gpus.to_vec();
        sorted.sort();
        self.bound.insert(allocation.to_string(), sorted);
    }

    /// Whether to send an inventory section with this hash: after a
    /// Welcome (`wanted` is the list the server asked for) only those it
    /// asked for; otherwise those whose hash changed since the server last
    /// had them. Records the hash as the server's either way.
    pub fn inventory_needed(
        &mut self,
        section: InventorySection,
        sha256: &str,
        wanted: Option<&[InventorySection]>,
    ) -> bool {
        let needed = match wanted {
            Some(w) => w.contains(&section),
            None => self.inventory[section as usize].as_deref() != Some(sha256),
        };
        self.inventory[section as usize] = Some(sha256.to_string());
        needed
    }

    /// `inventory.refresh`: send every section on the next pass.
    pub fn forget_inventory(&mut self) {
        self.inventory = Default::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_node_without_a_spec_says_nothing() {
        let mut r = Reports::new();
        assert_eq!(r.state_report(0, false, S), None);
        // A journaled generation is news even before a pass.
        assert!(r.state_report(3, false, S).is_some());
    }

    #[test]
    fn reports_only_changes_and_ages_from_the_last_change() {
        let mut r = Reports::new();
        assert!(r.observe(StateSection::Devices, Status::Progressing, "waiting", S));
        assert!(r.observe(StateSection::Access, Status::Ready, "", S));
        let first = r.state_report(0, true, 2 * S).unwrap();
        assert_eq!(first.sections.len(), 2);
        assert_eq!(first.sections[1].section, StateSection::Devices);
        assert_eq!(first.sections[1].age, S);
        // The same again: nothing to say, however much time passed.
        assert!(!r.observe(StateSection::Devices, Status::Progressing, "waiting", 5 * S));
        assert_eq!(r.state_report(0, true, 10 * S), None);
        // A new message is news; the age counts from the change.
        assert!(r.observe(StateSection::Devices, Status::Ready, "", 10 * S));
        assert!(r.all_ready());
        let next = r.state_report(0, true, 12 * S).unwrap();
        assert_eq!(next.sections[1].status, Status::Ready);
        assert_eq!(next.sections[1].age, 2 * S);
        assert_eq!(next.sections[0].age, 11 * S, "access unchanged since 1 s");
        // A new applied generation alone is news.
        assert!(r.state_report(1, true, 13 * S).is_some());
        assert_eq!(r.state_report(1, true, 14 * S), None);
        // A new session hears everything again.
        r.new_session();
        assert!(r.state_report(1, true, 15 * S).is_some());
    }

    #[test]
    fn bindings_once_per_session_and_again_when_their_gpus_change() {
        let mut r = Reports::new();
        let gpus = vec!["GPU-b".to_string(), "GPU-a".to_string()];
        r.retain_bindings(&["job"]);
        assert!(r.binding_needed("job", &gpus));
        r.binding_sent("job", &gpus);
        let reordered = vec!["GPU-a".to_string(), "GPU-b".to_string()];
        assert!(
            !r.binding_needed("job", &reordered),
            "order does not matter"
        );
        assert!(r.binding_needed("job", &["GPU-a".to_string()]));
        // Unassigned, then assigned again: reported again.
        r.retain_bindings(&[]);
        r.retain_bindings(&["job"]);
        assert!(r.binding_needed("job", &gpus));
        r.binding_sent("job", &gpus);
        assert!(!r.binding_needed("job", &gpus));
        r.new_session();
        assert!(r.binding_needed("job", &gpus));
    }

    #[test]
    fn inventory_sections_go_when_asked_for_or_changed() {
        use InventorySection::{Gpus, Host};
        let mut r = Reports::new();
        let wanted = vec![Gpus];
        assert!(!r.inventory_needed(Host, "h1", Some(&wanted)));
        assert!(r.inventory_needed(Gpus, "g1", Some(&wanted)));
        // Between Welcomes: only what changed.
        assert!(!r.inventory_needed(Host, "h1", None));
        assert!(!r.inventory_needed(Gpus, "g1", None));
        assert!(r.inventory_needed(Gpus, "g2", None));
        assert!(!r.inventory_needed(Gpus, "g2", None));
        r.forget_inventory();
        assert!(r.inventory_needed(Host, "h1", None));
    }

    #[test]
    fn inventory_sections_are_named_once() {
        for (i, s) in InventorySection::ALL.into_iter().enumerate() {
            assert_eq!(s as usize, i, "{s:?} indexes the hashes");
            assert_eq!(InventorySection::from_name(s.name()), Some(s));
        }
        assert_eq!(InventorySection::from_name("devices"), None);
    }

    #[test]
    fn state_sections_are_named_once_in_name_order() {
        let names: Vec<_> = StateSection::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["access", "devices", "secrets"]);
        for s in StateSection::ALL {
            assert_eq!(StateSection::from_name(s.name()), Some(s));
        }
        assert_eq!(StateSection::from_name("gpus"), None);
    }

    proptest! {
        /// Whatever the sequence of passes, two reports in a row never say
        /// the same thing, and every change is reported by the next call.
        #[test]
        fn never_the_same_report_twice_and_no_change_lost(
            passes in proptest::collection::vec((0usize..2, 0usize..3, 0usize..3, 0u64..3), 1..80),
        ) {
            let statuses = [Status::Ready, Status::Progressing, Status::Failed];
            let names = [StateSection::Devices, StateSection::Access];
            let mut r = Reports::new();
            let mut last: Option<Summary> = None;
            for (i, (n, st, msg, generation)) in passes.into_iter().enumerate() {
                let now = Duration::from_millis(i as u64 * 100);
                r.observe(names[n], statuses[st], &format!("m{msg}"), now);
                let summary: Vec<_> = r.sections.iter().map(|(k, s)| (*k, s.status, s.message.clone())).collect();
                let expect_new = last.as_ref() != Some(&(generation, summary.clone()));
                let report = r.state_report(generation, true, now);
                prop_assert_eq!(report.is_some(), expect_new);
                if report.is_some() {
                    last = Some((generation, summary));
                }
            }
        }
    }
}
