//! What backs a command's result: the reader's judgement, never the row's.
//!
//! A gateway writes a command's state and result columns (it relays the
//! node's result), so whoever reports or acts on a result (`commands
//! show`, the rollout controller, `check`) reads it again from the bytes
//! the node signed, kept with it (`CommandRow::signed_result`), verified
//! against a certificate the fleet CA issued that node. A terminal row
//! that no node signed is believed only where the control plane itself
//! ends a command that way (a deadline swept, a rollout's cancel), or
//! where a Hello did and keeps the node's proof of it: a journal lost or a
//! reboot after the node started the command (`bcd_proto::hello::proves_ending`);
//! any other is [`Evidence::Forged`].

use bc_store::commands::CommandRow;
use bcd_core::command::{Kind, Outcome, ServerState, reason};
use bcd_proto::v1;
use prost::Message;

/// What a command's result rests on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// Not finished.
    Unfinished,
    /// Its node signed this result, under a certificate the fleet CA
    /// issued it, and the row says what the node said.
    NodeSigned,
    /// The control plane ended it, as only it ends a command so: why.
    Decided(&'static str),
    /// It finished before results kept their node's signature: the row is
    /// all there is, believed as it was before the upgrade.
    Legacy,
    /// The row claims a result no node signed (or not this one): why.
    Forged(String),
}

impl Evidence {
    /// Whether a reader may act on the row's outcome.
    pub fn believed(&self) -> bool {
        !matches!(self, Evidence::Forged(_))
    }

    /// The wire's words.
    pub fn to_wire(&self) -> (v1::ResultEvidence, String) {
        match self {
            Evidence::Unfinished => (v1::ResultEvidence::Unfinished, String::new()),
            Evidence::NodeSigned => (v1::ResultEvidence::NodeSigned, String::new()),
            Evidence::Decided(why) => (v1::ResultEvidence::Decided, (*why).to_string()),
            Evidence::Legacy => (v1::ResultEvidence::Legacy, LEGACY.to_string()),
            Evidence::Forged(why) => (v1::ResultEvidence::Forged, why.clone()),
        }
    }
}

/// Why a [`Evidence::Legacy`] result is believed.
pub const LEGACY: &str = "it finished before results kept their node's signature: \
                          the row is the only record";

/// How the control plane itself ends a command, without a node's result.
fn decided(outcome: Outcome, why: &str) -> Option<&'static str> {
    Some(match (outcome, why) {
        (Outcome::Expired, bc_store::commands::SWEPT) => "its deadline passed before dispatch",
        (Outcome::Expired, bc_store::rollouts::CANCELLED) => "its rollout was aborted",
        _ => return None,
    })
}

/// How a node's Hello ends a command: whether by a reboot (else a lost
/// journal), and why it is believed once the Hello's proof shows it.
fn hello_ending(kind: Kind, outcome: Outcome, why: &str) -> Option<(bool, &'static str)> {
    Some(match (outcome, why) {
        (Outcome::Failed, reason::JOURNAL_LOST) if !kind.retry_safe() => (
            false,
            "the node came back with a new journal that does not know it (its signed Hello \
             says so)",
        ),
        (Outcome::Succeeded, reason::REBOOTED) if kind.self_terminating() => (
            true,
            "the node came back from a new boot after it started it (its signed Hello says so)",
        ),
        _ => return None,
    })
}

/// Judges a command the Hello ended (`reboot` or a lost journal) by the
/// proof kept with it.
fn judge_hello_ending(
    row: &CommandRow,
    certs: &[Vec<u8>],
    ca_der: &[u8],
    (reboot, why): (bool, &'static str),
) -> Evidence {
    let what = if reboot {
        "a new boot"
    } else {
        "a lost journal"
    };
    let Some(signed) = &row.signed_result else {
        return if row.legacy {
            Evidence::Legacy
        } else {
            Evidence::Forged(format!(
                "the row says {} ({}) and no Hello its node signed shows {what} after it started \
                 the command (a daemon before Hello proofs signs none)",
                row.state, row.reason
            ))
        };
    };
    let Ok(proof) = bcd_proto::hello::decode(&signed.payload) else {
        return Evidence::Forged(format!(
            "the row says {} but keeps no Hello proof",
            row.reason
        ));
    };
    let message = bcd_proto::hello::signed_message(&signed.payload);
    let signer = certs.iter().find(|der| {
        crate::certs::issued_by(der, ca_der)
            && crate::certs::named(der, "urn:bc:node:").is_some_and(|(node, _)| node == row.node_id)
            && crate::certs::verify_node_signature(der, &message, &signed.signature)
    });
    if signer.is_none() || proof.node_id != row.node_id {
        return Evidence::Forged(format!(
            "its Hello proof verifies under no certificate the fleet CA issued node {}",
            row.node_id
        ));
    }
    match bcd_proto::hello::proves_ending(&proof, row.seq, reboot) {
        Ok(()) => Evidence::Decided(why),
        Err(e) => Evidence::Forged(format!("the row says {}, but {e}", row.reason)),
    }
}

/// Judges `row` against `certs`, every certificate the store holds for
/// its node (DER), of which only those `ca_der` issued count.
pub fn judge(row: &CommandRow, certs: &[Vec<u8>], ca_der: &[u8]) -> Evidence {
    let Some(ServerState::Terminal(outcome)) = row.state.known() else {
        return Evidence::Unfinished;
    };
    let Some(kind) = row.kind.known() else {
        return Evidence::Forged(format!(
            "the row names an unknown kind {:?}",
            row.kind.text()
        ));
    };
    // A result the node signed itself may say `rebooted` too (its journal
    // knew the command across the reboot): that is a result, not a proof.
    let proved = row
        .signed_result
        .as_ref()
        .is_some_and(|s| bcd_proto::hello::decode(&s.payload).is_ok());
    if let Some(ending) = hello_ending(kind, outcome, &row.reason)
        && (proved || row.signed_result.is_none())
    {
        return judge_hello_ending(row, certs, ca_der, ending);
    }
    let Some(signed) = &row.signed_result else {
        return match decided(outcome, &row.reason) {
            Some(why) => Evidence::Decided(why),
            None if row.legacy => Evidence::Legacy,
            None => Evidence::Forged(format!(
                "the row says {} ({}) and no node signed it",
                row.state, row.reason
            )),
        };
    };
    let signer = certs.iter().find(|der| {
        crate::certs::issued_by(der, ca_der)
            && crate::certs::named(der, "urn:bc:node:").is_some_and(|(node, _)| node == row.node_id)
            && crate::certs::verify_node_signature(der, &signed.payload, &signed.signature)
    });
    if signer.is_none() {
        return Evidence::Forged(format!(
            "its signature verifies under no certificate the fleet CA issued node {}",
            row.node_id
        ));
    }
    let Ok(r) = v1::CommandResult::decode(signed.payload.as_slice()) else {
        return Evidence::Forged("the signed result does not decode".into());
    };
    let said = (
        r.node_id.as_str(),
        r.command_id.as_str(),
        bcd_proto::typed::outcome(r.outcome),
        r.reason.as_str(),
        r.has_exit_code.then_some(r.exit_code),
        r.output.as_slice(),
        r.output_truncated,
    );
    let row_says = (
        row.node_id.as_str(),
        row.id.as_str(),
        Some(outcome),
        row.reason.as_str(),
        row.exit_code,
        row.output.as_slice(),
        row.output_truncated,
    );
    if said != row_says {
        return Evidence::Forged(format!(
            "the row says {} ({}) but node {} signed {} ({}) for command {}",
            row.state,
            row.reason,
            r.node_id,
            bcd_proto::typed::outcome(r.outcome).map_or("nothing known", |o| o.name()),
            r.reason,
            r.command_id
        ));
    }
    Evidence::NodeSigned
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_store::named::Named;
    use rcgen::{CertificateParams, KeyPair};
    use std::time::Duration;

    /// A fleet CA, and a certificate it issued `node` for `key`.
    fn issued(dir: &std::path::Path, node: &str, key: &KeyPair) -> (Vec<u8>, Vec<u8>) {
        let ca = crate::pki::Ca::load_or_create(dir, &[], 1_800_000_000_000).unwrap();
        let csr = CertificateParams::default().serialize_request(key).unwrap();
        let cert = ca
            .issue_node_cert(
                csr.der(),
                node,
                None,
                1_800_000_000_000,
                Duration::from_secs(86_400),
            )
            .unwrap();
        (ca.cert.to_vec(), cert.der.to_vec())
    }

    fn sign(key: &KeyPair, message: &[u8]) -> Vec<u8> {
        let pkcs8 = key.serialize_der();
        let signer = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &pkcs8,
            &ring::rand::SystemRandom::new(),
        )
        .unwrap();
        signer
            .sign(&ring::rand::SystemRandom::new(), message)
            .unwrap()
            .as_ref()
            .to_vec()
    }

    /// A row as the store keeps a result of `node` that `key` signed.
    fn row(node: &str, key: &KeyPair) -> CommandRow {
        let payload = v1::CommandResult {
            node_id: node.into(),
            command_id: "cmd-1".into(),
            outcome: v1::Outcome::Succeeded as i32,
            reason: String::new(),
            exit_code: 0,
            has_exit_code: true,
            output: b"out".to_vec(),
            output_truncated: false,
            ..Default::default()
        }
        .encode_to_vec();
        CommandRow {
            id: "cmd-1".into(),
            node_id: node.into(),
            seq: 1,
            kind: Named::read("exec.run".into()),
            summary: String::new(),
            state: Named::read("succeeded".into()),
            reason: String::new(),
            exit_code: Some(0),
            output: b"out".to_vec(),
            output_truncated: false,
            created_at_ms: 0,
            not_after_ms: 0,
            result_at_ms: Some(1),
            epoch: 1,
            signed_result: Some(bc_store::commands::SignedResult {
                signature: sign(key, &payload),
                payload,
            }),
            legacy: false,
        }
    }

    fn forged(e: Evidence) -> String {
        match e {
            Evidence::Forged(why) => why,
            other => panic!("believed: {other:?}"),
        }
    }

    #[test]
    fn a_result_its_node_signed_is_believed_and_an_edited_row_is_not() {
        let d = tempfile::tempdir().unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let (ca, cert) = issued(d.path(), "nd-1", &key);
        let certs = vec![cert.clone()];
        let good = row("nd-1", &key);
        assert_eq!(judge(&good, &certs, &ca), Evidence::NodeSigned);

        // The columns a gateway writes, edited under the signed bytes.
        let mut edited = good.clone();
        edited.output = b"forged".to_vec();
        assert!(forged(judge(&edited, &certs, &ca)).contains("signed"));
        let mut failed = good.clone();
        failed.state = Named::read("failed".into());
        assert!(forged(judge(&failed, &certs, &ca)).contains("signed SUCCEEDED"));
        // Its signed bytes moved to another command.
        let mut moved = good.clone();
        moved.id = "cmd-2".into();
        assert!(forged(judge(&moved, &certs, &ca)).contains("cmd-1"));
        // The signature dropped: a success no node signed.
        let mut unsigned = good.clone();
        unsigned.signed_result = None;
        assert!(forged(judge(&unsigned, &certs, &ca)).contains("no node signed"));
        // Unless it finished before results were signed (a list the
        // migration wrote): then the row is all there is.
        unsigned.legacy = true;
        assert_eq!(judge(&unsigned, &certs, &ca), Evidence::Legacy);
        // A legacy mark covers no signature that fails.
        let mut marked = edited.clone();
        marked.legacy = true;
        assert!(forged(judge(&marked, &certs, &ca)).contains("signed"));
        // Signed by a key whose certificate the fleet CA did not issue, or
        // issued for another node.
        let other = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params.subject_alt_names =
            vec![rcgen::SanType::URI("urn:bc:node:nd-1".try_into().unwrap())];
        let mine = params.self_signed(&other).unwrap().der().to_vec();
        let planted = row("nd-1", &other);
        assert!(forged(judge(&planted, &[cert.clone(), mine], &ca)).contains("no certificate"));
        let (_, elsewhere) = issued(d.path(), "nd-2", &other);
        assert!(forged(judge(&planted, &[cert, elsewhere], &ca)).contains("no certificate"));
    }

    #[test]
    fn only_the_control_planes_own_endings_go_unsigned() {
        let d = tempfile::tempdir().unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let (ca, cert) = issued(d.path(), "nd-1", &key);
        let ended = |kind: &str, state: &str, reason: &str| {
            let mut r = row("nd-1", &key);
            r.kind = Named::read(kind.into());
            r.state = Named::read(state.into());
            r.reason = reason.into();
            r.signed_result = None;
            judge(&r, std::slice::from_ref(&cert), &ca)
        };
        let decided = |e: Evidence| matches!(e, Evidence::Decided(_));
        assert!(decided(ended(
            "exec.run",
            "expired",
            bc_store::commands::SWEPT
        )));
        assert!(decided(ended(
            "daemon.upgrade",
            "expired",
            bc_store::rollouts::CANCELLED
        )));
        // A Hello's endings, with no proof kept: a gateway's word only.
        let why = forged(ended("exec.run", "failed", reason::JOURNAL_LOST));
        assert!(
            why.contains("no Hello its node signed shows a lost journal"),
            "{why}"
        );
        let why = forged(ended("node.reboot", "succeeded", reason::REBOOTED));
        assert!(why.contains("shows a new boot"), "{why}");
        // The same words where the control plane never writes them.
        forged(ended("exec.run", "succeeded", reason::REBOOTED));
        forged(ended("daemon.upgrade", "succeeded", reason::REBOOTED));
        forged(ended("inventory.refresh", "failed", reason::JOURNAL_LOST));
        forged(ended("exec.run", "succeeded", bc_store::commands::SWEPT));
        // A kind a gateway wrote that names none: forged, whatever else
        // the row says; a state that names none is not an ending.
        assert!(forged(ended("exec.root", "succeeded", "")).contains("unknown kind"));
        let mut odd = row("nd-1", &key);
        odd.state = Named::read("won".into());
        assert_eq!(judge(&odd, &[], &ca), Evidence::Unfinished);
        // Unfinished rows rest on nothing yet.
        let mut running = row("nd-1", &key);
        running.state = Named::read("running".into());
        assert_eq!(judge(&running, &[], &ca), Evidence::Unfinished);
    }

    /// A row a Hello ended, keeping that Hello's proof signed by `key`.
    fn ended_by_hello(
        key: &KeyPair,
        kind: &str,
        (state, why): (&str, &str),
        before: bcd_proto::hello::Before,
    ) -> CommandRow {
        let hello = v1::Hello {
            node_id: "nd-1".into(),
            boot_id: "boot-2".into(),
            journal_id: "j-2".into(),
            ..Default::default()
        };
        let payload = bcd_proto::hello::proof_after(&hello, 9, before).encode_to_vec();
        let mut r = row("nd-1", key);
        r.seq = 5;
        r.kind = Named::read(kind.into());
        r.state = Named::read(state.into());
        r.reason = why.into();
        r.exit_code = None;
        r.output = vec![];
        r.signed_result = Some(bc_store::commands::SignedResult {
            signature: sign(key, &bcd_proto::hello::signed_message(&payload)),
            payload,
        });
        r
    }

    #[test]
    fn a_hello_ending_is_believed_from_the_proof_it_keeps_only() {
        let d = tempfile::tempdir().unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let (ca, cert) = issued(d.path(), "nd-1", &key);
        let certs = std::slice::from_ref(&cert);
        let before = bcd_proto::hello::Before {
            boot_id: "boot-1".into(),
            journal_id: "j-1".into(),
            command_floor: 5,
        };
        let lost = ("failed", reason::JOURNAL_LOST);
        let rebooted = ("succeeded", reason::REBOOTED);
        for (kind, ending) in [("exec.run", lost), ("node.reboot", rebooted)] {
            let r = ended_by_hello(&key, kind, ending, before.clone());
            assert!(
                matches!(judge(&r, certs, &ca), Evidence::Decided(w) if w.contains("signed Hello")),
                "{kind}"
            );
            // A command the node never started (above its floor).
            let mut later = r.clone();
            later.seq = 6;
            assert!(forged(judge(&later, certs, &ca)).contains("above sequence 5"));
            // Another node's row, or a proof of a key the CA never
            // certified for this node.
            let mut other = r.clone();
            other.node_id = "nd-2".into();
            assert!(forged(judge(&other, certs, &ca)).contains("no certificate"));
            let stranger = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let foreign = ended_by_hello(&stranger, kind, ending, before.clone());
            assert!(forged(judge(&foreign, certs, &ca)).contains("no certificate"));
        }
        // A proof that shows no change since the node's last session.
        let same = bcd_proto::hello::Before {
            boot_id: "boot-2".into(),
            journal_id: "j-2".into(),
            command_floor: 5,
        };
        let r = ended_by_hello(&key, "node.reboot", rebooted, same.clone());
        assert!(forged(judge(&r, certs, &ca)).contains("no new boot"));
        let r = ended_by_hello(&key, "exec.run", lost, same);
        assert!(forged(judge(&r, certs, &ca)).contains("no new journal"));
        // A proof kept with an ending no Hello writes proves nothing.
        let r = ended_by_hello(&key, "exec.run", ("succeeded", ""), before);
        assert!(forged(judge(&r, certs, &ca)).contains("no certificate"));
    }
}
