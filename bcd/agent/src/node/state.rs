//! Desired state: a spec from the server is verified, judged
//! (`bcd_core::spec::judge`: not another node's, not older than what is
//! enforced or than the generation floor, not expired), its generation
//! written to the floor in `identity.json`, journaled and converged; the
//! convergers run again on a timer; what changed is reported
//! (`bcd_core::Reports` decides what is news). State reports, GPU bindings
//! and inventory sections are signed by the node key, and state reports
//! and inventory name the session epoch they were sent under.

use bcd_core::Reports;
use bcd_core::report::{InventorySection, StateSection, Status};
use bcd_core::spec::{self, Verdict};
use bcd_proto::v1::{self, node_message};
use prost::Message;
use tracing::{info, warn};

use super::Shared;
use super::conn::{Conn, Link, send};
use super::secrets::Secrets;
use crate::converge::{self, Outcome};
use crate::events::SpecRefused;
use crate::hw;
use crate::identity::ReplayFloors;

/// The desired state: the spec this node enforces and what the server has
/// heard of how far the machine got. This module alone reads or changes
/// it; the others see the spec through [`Desired::spec`].
#[derive(Debug)]
pub(super) struct Desired {
    /// The spec this node enforces (verified when it arrived).
    spec: Option<v1::NodeSpec>,
    /// What the server has heard from this process.
    reports: Reports,
}

impl Desired {
    /// The spec the journal held at start (verified then), and nothing
    /// reported yet.
    pub(super) fn new(spec: Option<v1::NodeSpec>) -> Desired {
        Desired {
            spec,
            reports: Reports::new(),
        }
    }

    /// The spec this node enforces, if any.
    pub(super) fn spec(&self) -> Option<&v1::NodeSpec> {
        self.spec.as_ref()
    }

    /// A new session: the server has heard none of this process's reports.
    pub(super) fn new_session(&mut self) {
        self.reports.new_session();
    }

    /// The server is to get every inventory section again.
    pub(super) fn forget_inventory(&mut self) {
        self.reports.forget_inventory();
    }

    /// A new spec from the server: verified, judged, journaled, converged.
    pub(super) async fn on_desired_state(
        &mut self,
        shared: &mut Shared,
        secrets: &mut Secrets,
        d: v1::DesiredState,
        conn: &Conn,
        link: &Link,
        server_now: Option<i64>,
    ) -> Result<(), String> {
        let held = spec::Held {
            node_id: &shared.identity.file.node_id,
            current: self.spec.as_ref().map_or(0, |s| s.generation),
            floor: shared.identity.file.replay_floors.spec_generation,
            server_now_ms: server_now,
        };
        let verdict = bcd_proto::sign::open(&d.signed_spec, &shared.worker_keys())
            .map_err(|e| e.to_string())
            .and_then(|p| {
                v1::NodeSpec::decode(p.as_slice()).map_err(|e| format!("does not decode: {e}"))
            })
            .map(|s| {
                let v = spec::judge(
                    held,
                    spec::Offered {
                        node_id: &s.node_id,
                        generation: s.generation,
                        not_after_ms: s.not_after_ms,
                    },
                );
                (s, v)
            });
        let spec = match verdict {
            Ok((s, Verdict::Apply)) => s,
            Ok((_, Verdict::Same)) => return Ok(()),
            Ok((_, Verdict::Refuse(reason))) | Err(reason) => {
                warn!(generation = d.generation, %reason, "spec refused; the last good one stays enforced");
                shared.event(&SpecRefused {
                    generation: d.generation,
                    reason: reason.to_string(),
                });
                return Ok(());
            }
        };
        // The floor first: once it is written, no lost journal lets an
        // older generation back in.
        let floors = ReplayFloors {
            spec_generation: spec.generation,
            ..shared.identity.file.replay_floors
        };
        if let Err(e) = shared.identity.raise_floors(floors) {
            warn!(generation = spec.generation, error = %bcd_sys::error::chain(&e),
                "cannot persist the spec generation floor; the spec is not taken now");
            return Ok(());
        }
        shared
            .journal
            .set_spec(spec.generation, &d.signed_spec)
            .map_err(|e| format!("journal: {e}"))?;
        info!(generation = spec.generation, "new spec");
        self.spec = Some(spec);
        self.converge(shared, secrets, conn, link).await
    }

    /// One pass of the convergers (the secrets' among them); reports what
    /// changed.
    pub(super) async fn converge(
        &mut self,
        shared: &mut Shared,
        secrets: &mut Secrets,
        conn: &Conn,
        link: &Link,
    ) -> Result<(), String> {
        let Some(spec) = self.spec.clone() else {
            return Ok(());
        };
        let inv = shared.machine.host.gpus().cdi_inventory();
        let devices = match &inv {
            Ok(inv) => converge::devices::converge(shared.machine.devices.as_ref(), &spec, inv),
            Err(e) => Outcome::not(
                Status::Progressing,
                format!("cannot read the GPU inventory: {e}"),
            ),
        };
        if devices.status == Status::Ready
            && let Ok(inv) = &inv
        {
            self.report_bindings(shared, conn, &spec, inv).await;
        }
        let access = converge::access::converge(
            shared.machine.sshd.as_ref(),
            shared.machine.firewall.as_ref(),
            &spec.access.clone().unwrap_or_default(),
        );
        let secrets = secrets.converge(shared, &spec, conn, link.server_now_ms);
        let now = shared.now();
        for (section, outcome) in [
            (StateSection::Devices, devices),
            (StateSection::Access, access),
            (StateSection::Secrets, secrets),
        ] {
            let name = section.name();
            super::observe::section(shared, name, &outcome.status.name().to_ascii_lowercase());
            if outcome.changed {
                info!(generation = spec.generation, section = name, "converged");
            }
            if self
                .reports
                .observe(section, outcome.status, &outcome.message, now)
                && outcome.status != Status::Ready
            {
                warn!(section = name, status = outcome.status.name(), message = %outcome.message, "not converged");
            }
        }
        if self.reports.all_ready()
            && shared
                .journal
                .applied_generation()
                .map_err(|e| format!("journal: {e}"))?
                != spec.generation
        {
            shared
                .journal
                .set_applied_generation(spec.generation)
                .map_err(|e| format!("journal: {e}"))?;
        }
        self.report(shared, conn, link).await;
        Ok(())
    }

    /// Reports each active GPU binding once per session, signed by the node
    /// key, so the server can tell it from anything a gateway makes up.
    async fn report_bindings(
        &mut self,
        shared: &mut Shared,
        conn: &Conn,
        spec: &v1::NodeSpec,
        inv: &cdi::nvidia::Inventory,
    ) {
        if conn.is_none() {
            return;
        }
        let assignments = spec
            .devices
            .as_ref()
            .map(|d| d.assignments.clone())
            .unwrap_or_default();
        let assigned: Vec<&str> = assignments
            .iter()
            .map(|a| a.allocation_id.as_str())
            .collect();
        self.reports.retain_bindings(&assigned);
        for a in &assignments {
            let mut uuids: Vec<String> = a
                .gpus
                .iter()
                .filter_map(|r| {
                    inv.gpus
                        .iter()
                        .find(|g| {
                            g.uuid.as_deref() == Some(r.as_str()) || g.index.to_string() == *r
                        })
                        .map(|g| g.uuid.clone().unwrap_or_else(|| g.index.to_string()))
                })
                .collect();
            uuids.sort();
            if !self.reports.binding_needed(&a.allocation_id, &uuids) {
                continue;
            }
            let payload = v1::BindingPayload {
                node_id: shared.identity.file.node_id.clone(),
                allocation_id: a.allocation_id.clone(),
                gpu_uuids: uuids.clone(),
                spec_generation: spec.generation,
                nonce: crate::journal::new_id(),
            }
            .encode_to_vec();
            let Some(signature) = shared.sign(&payload) else {
                warn!(allocation = %a.allocation_id, "cannot sign the binding report");
                continue;
            };
            send(
                conn,
                node_message::Msg::AllocationBound(v1::AllocationBound { payload, signature }),
            )
            .await;
            self.reports.binding_sent(&a.allocation_id, &uuids);
        }
    }

    /// Sends a StateReport if it says something new, signed, once the
    /// session is established.
    pub(super) async fn report(&mut self, shared: &mut Shared, conn: &Conn, link: &Link) {
        let (true, Some(epoch)) = (conn.is_some(), link.epoch) else {
            return;
        };
        let applied = shared.journal.applied_generation().unwrap_or(0);
        let now = shared.now();
        let Some(report) = self.reports.state_report(applied, self.spec.is_some(), now) else {
            return;
        };
        let sections = report
            .sections
            .into_iter()
            .map(|s| v1::SectionStatus {
                section: v1::StateSection::from(s.section) as i32,
                status: v1::SectionState::from(s.status) as i32,
                message: s.message,
                age_ms: s.age.as_millis() as u64,
            })
            .collect();
        let payload = v1::StateReport {
            applied_generation: report.applied_generation,
            sections,
            node_id: shared.identity.file.node_id.clone(),
            epoch,
        }
        .encode_to_vec();
        let Some(signature) = shared.sign(&payload) else {
            warn!("cannot sign the state report");
            return;
        };
        send(
            conn,
            node_message::Msg::StateReport(v1::NodeSigned { payload, signature }),
        )
        .await;
    }

    /// Sends inventory sections: after a Welcome the ones the server asked
    /// for; otherwise the ones whose hash changed since the server last
    /// had them (a GPU that appeared or vanished shows up within a pass).
    pub(super) async fn send_inventory(
        &mut self,
        shared: &mut Shared,
        conn: &Conn,
        link: &Link,
        wanted: Option<&[InventorySection]>,
    ) {
        let (true, Some(epoch)) = (conn.is_some(), link.epoch) else {
            return;
        };
        for section in hw::inventory(shared.machine.host.as_ref()) {
            if self
                .reports
                .inventory_needed(section.name, &section.sha256, wanted)
            {
                let payload = v1::Inventory {
                    section: v1::InventoryKind::from(section.name) as i32,
                    sha256: section.sha256,
                    body: section.body,
                    node_id: shared.identity.file.node_id.clone(),
                    epoch,
                }
                .encode_to_vec();
                let Some(signature) = shared.sign(&payload) else {
                    warn!(
                        section = section.name.name(),
                        "cannot sign the inventory section"
                    );
                    continue;
                };
                send(
                    conn,
                    node_message::Msg::Inventory(v1::NodeSigned { payload, signature }),
                )
                .await;
            }
        }
    }
}
