//! The facts a node signs, decoded for the store.
//!
//! A result, a state report or an inventory section arrives as the node's
//! signed bytes (`NodeSigned`). What is decoded here is only what the store
//! judges: the store applies it only when the signature verifies against a
//! valid certificate of the node the payload names, and records anything
//! else as a forgery (`bc_store::nodes::judge_signed`). Bytes that do not
//! decode, or name an outcome or status this server does not know, become
//! a fact the store records as forged, so every attempt is visible. A
//! section this server does not know (of a state report or an inventory)
//! is not understood rather than forged, as a newer node may send one: a
//! state report leaves it out, an inventory section is turned away by its
//! number before the store.

use bc_store::commands::ResultInput;
use bc_store::inventory::InventoryInput;
use bc_store::nodes::Signed;
use bc_store::specs::{SectionReport, StateReportInput};
use bc_store::{CommandId, NodeId};
use bcd_proto::v1;
use prost::Message;

/// Sections of a state report kept, and the length of their messages.
const MAX_SECTIONS: usize = 32;
const MAX_MESSAGE: usize = 1024;

fn signed<T>(s: v1::NodeSigned, fact: Option<T>) -> Signed<T> {
    Signed {
        fact,
        payload: s.payload,
        signature: s.signature,
    }
}

/// A signed command result.
pub fn result(s: v1::NodeSigned) -> Signed<ResultInput> {
    let fact = v1::CommandResult::decode(s.payload.as_slice())
        .ok()
        .and_then(|r| {
            Some(ResultInput {
                outcome: bcd_proto::typed::outcome(r.outcome)?,
                node_id: NodeId::from(r.node_id),
                command_id: CommandId::from(r.command_id),
                reason: r.reason,
                exit_code: r.has_exit_code.then_some(r.exit_code),
                output: r.output,
                output_truncated: r.output_truncated,
            })
        });
    signed(s, fact)
}

/// A signed state report.
pub fn state_report(s: v1::NodeSigned) -> Signed<StateReportInput> {
    let fact = v1::StateReport::decode(s.payload.as_slice())
        .ok()
        .and_then(|r| {
            let sections = r
                .sections
                .into_iter()
                .take(MAX_SECTIONS)
                // A section this gateway does not know is left out; a
                // status it does not know makes the report unreadable.
                .filter_map(|s| {
                    let section = bcd_proto::typed::state_section(s.section)?;
                    Some(
                        bcd_proto::typed::section_status(s.status).map(|status| SectionReport {
                            status: status.name().to_string(),
                            section: section.name().to_string(),
                            message: s.message.chars().take(MAX_MESSAGE).collect(),
                            age_ms: s.age_ms,
                        }),
                    )
                })
                .collect::<Option<Vec<_>>>()?;
            Some(StateReportInput {
                node_id: NodeId::from(r.node_id),
                epoch: r.epoch,
                applied_generation: r.applied_generation,
                sections,
            })
        });
    signed(s, fact)
}

/// A signed inventory section, or the number of a section this gateway
/// does not know (a newer node's, or none), which is turned away before
/// the store: not understood, not forged.
pub fn inventory(s: v1::NodeSigned) -> Result<Signed<InventoryInput>, i32> {
    let decoded = v1::Inventory::decode(s.payload.as_slice()).ok();
    let fact = match decoded {
        Some(i) => Some(InventoryInput {
            section: bcd_proto::typed::inventory_section(i.section).ok_or(i.section)?,
            node_id: NodeId::from(i.node_id),
            epoch: i.epoch,
            sha256: i.sha256,
            body: i.body,
        }),
        None => None,
    };
    Ok(signed(s, fact))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(payload: Vec<u8>) -> v1::NodeSigned {
        v1::NodeSigned {
            payload,
            signature: vec![1, 2],
        }
    }

    /// An inventory section this gateway does not know is turned away by
    /// its number, not handed to the store as forged; an undecodable one
    /// is (the store records the forgery).
    #[test]
    fn an_unknown_inventory_section_is_not_understood_not_forged() {
        let sent = v1::Inventory {
            section: v1::InventoryKind::Gpus as i32,
            sha256: "ab".repeat(32),
            body: b"{}".to_vec(),
            node_id: "nd-1".into(),
            epoch: 3,
        };
        let known = inventory(wrap(sent.encode_to_vec())).unwrap();
        assert_eq!(
            known.fact.map(|f| f.section),
            Some(bcd_core::report::InventorySection::Gpus)
        );
        for unknown in [0, 42] {
            let newer = v1::Inventory {
                section: unknown,
                ..sent.clone()
            };
            assert_eq!(inventory(wrap(newer.encode_to_vec())).unwrap_err(), unknown);
        }
        assert_eq!(inventory(wrap(vec![0xff])).unwrap().fact, None);
    }

    #[test]
    fn facts_decode_and_what_is_not_understood_is_kept_for_the_store_to_refuse() {
        let r = v1::CommandResult {
            command_id: "cmd-1".into(),
            outcome: v1::Outcome::Failed as i32,
            has_exit_code: true,
            exit_code: 3,
            node_id: "nd-1".into(),
            ..Default::default()
        };
        let s = result(wrap(r.encode_to_vec()));
        let fact = s.fact.unwrap();
        assert_eq!(
            (fact.node_id.as_str(), fact.exit_code, fact.outcome),
            ("nd-1", Some(3), bcd_core::command::Outcome::Failed)
        );
        assert_eq!(s.payload, r.encode_to_vec(), "the signed bytes, untouched");
        // No outcome: nothing the store could apply.
        let none = v1::CommandResult {
            outcome: 0,
            ..r.clone()
        };
        assert_eq!(result(wrap(none.encode_to_vec())).fact, None);
        assert_eq!(result(wrap(vec![0xff])).fact, None);
        let report = v1::StateReport {
            applied_generation: 2,
            sections: vec![v1::SectionStatus {
                section: v1::StateSection::Devices as i32,
                status: v1::SectionState::Ready as i32,
                message: "x".repeat(5000),
                age_ms: 1,
            }],
            node_id: "nd-1".into(),
            epoch: 4,
        };
        let fact = state_report(wrap(report.encode_to_vec())).fact.unwrap();
        assert_eq!(fact.sections[0].status, "READY");
        assert_eq!(fact.sections[0].message.len(), MAX_MESSAGE);
        assert_eq!(fact.epoch, 4);
        let unknown = v1::StateReport {
            sections: vec![v1::SectionStatus {
                status: 42,
                ..report.sections[0].clone()
            }],
            ..report.clone()
        };
        assert_eq!(state_report(wrap(unknown.encode_to_vec())).fact, None);
        // A section this gateway does not know (a newer node's, or none)
        // is left out; the rest of the report stands.
        let newer = v1::StateReport {
            sections: vec![
                v1::SectionStatus {
                    section: 42,
                    ..report.sections[0].clone()
                },
                v1::SectionStatus {
                    section: 0,
                    ..report.sections[0].clone()
                },
                report.sections[0].clone(),
            ],
            ..report.clone()
        };
        let fact = state_report(wrap(newer.encode_to_vec())).fact.unwrap();
        assert_eq!(fact.sections.len(), 1);
        assert_eq!(fact.sections[0].section, "devices");
    }
}
