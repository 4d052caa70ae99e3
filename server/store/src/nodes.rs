//! Nodes and their certificates.
//!
//! A certificate is valid while its node exists, it is not revoked and it
//! has not run out, all on the store's clock ([`check_cert`]). Deleting a
//! node revokes its certificates and keeps a statement of it signed by a
//! worker key (sealed outside this crate, [`SealStatement`]): the refusal
//! and the revocation feed ([`Revocation`]) carry it, and nodes obey only
//! what such a statement confirms. A node's conditions and taints are lists
//! of names.
//!
//! Facts a node signs (results, state reports, inventory) are judged here
//! ([`judge_signed`]) against the node's valid certificates, with a
//! verifier handed in: the signature must be by the key of one of them
//! (a renewal leaves the old and the new valid together, and a fact
//! journaled before it may be signed with either), and the fact must be
//! about the node whose session it came on.

use crate::bindings::VerifySignature;
use crate::error::Refusal;
use crate::id::{GatewayId, NodeId};

/// The certificate a join or renewal issues, decided before it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCert {
    pub der: Vec<u8>,
    pub serial: String,
    pub fingerprint: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
}

/// Builds a renewing node's next certificate: gets the node id, the
/// store's now and whether the node boots from a ramdisk.
pub type RenewCert = Box<dyn FnOnce(&str, i64, bool) -> Result<IssuedCert, crate::Refusal> + Send>;

/// A certificate as the store keeps it, with its node's deletion time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRow {
    pub node_id: NodeId,
    pub serial: String,
    pub revoked_at_ms: Option<i64>,
    pub revoke_reason: Option<String>,
    pub not_after_ms: i64,
    pub node_deleted_at_ms: Option<i64>,
    /// The signed statement of its revocation (or its node's deletion).
    pub statement: Option<Vec<u8>>,
}

/// A certificate that is valid now: whose it is, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidCert {
    pub node_id: NodeId,
    pub serial: String,
    pub not_after_ms: i64,
}

/// Whether the certificate looked up by fingerprint (`None`: unknown) is
/// valid at `now_ms`.
pub fn check_cert(row: Option<CertRow>, now_ms: i64) -> Result<ValidCert, Refusal> {
    let Some(c) = row else {
        return Err(Refusal::UnknownCertificate);
    };
    if c.node_deleted_at_ms.is_some() {
        return Err(Refusal::DeletedNode(c.node_id.into_string(), c.statement));
    }
    if c.revoked_at_ms.is_some() {
        return Err(Refusal::Revoked(
            c.revoke_reason.unwrap_or_default(),
            c.statement,
        ));
    }
    if c.not_after_ms < now_ms {
        return Err(Refusal::Expired);
    }
    Ok(ValidCert {
        node_id: c.node_id,
        serial: c.serial,
        not_after_ms: c.not_after_ms,
    })
}

/// Whether the certificate looked up by fingerprint may be renewed at
/// `now_ms`: a valid one, or (x509pop) one that ran out at most
/// `expired_grace_ms` ago. Expiry is the only thing the grace forgives: a
/// revoked certificate or a deleted node's is refused as ever.
pub fn check_renewable(
    row: Option<CertRow>,
    now_ms: i64,
    expired_grace_ms: i64,
) -> Result<ValidCert, Refusal> {
    // Judged as of its last valid moment when it ran out within the grace.
    let at = match &row {
        Some(c) if c.not_after_ms < now_ms && now_ms - c.not_after_ms <= expired_grace_ms => {
            c.not_after_ms
        }
        _ => now_ms,
    };
    check_cert(row, at)
}

/// A revoked certificate, for the gateways' revocation feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub serial: String,
    pub node_id: NodeId,
    pub reason: String,
    pub at_ms: i64,
    /// The signed statement that confirms it, relayed to the node.
    pub statement: Option<Vec<u8>>,
}

/// The reason recorded on certificates revoked by deleting their node.
pub const NODE_DELETED: &str = "node-deleted";

/// The reason recorded on certificates revoked by re-enrolling their node
/// (`tokens::PreviousProof`).
pub const REENROLLED: &str = "re-enrolled";

/// What a statement says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatementKind {
    Deleted,
    Revoked,
}

/// What the store decided about a node, for the sealer to sign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementSeal {
    pub node_id: NodeId,
    pub kind: StatementKind,
    /// The certificates revoked now.
    pub serials: Vec<String>,
    pub reason: String,
    pub issued_at_ms: i64,
}

/// Seals a statement inside the transaction that makes it true.
pub type SealStatement = Box<dyn FnOnce(&StatementSeal) -> Vec<u8> + Send>;

/// A fact as a node signed it, and as it arrived on a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed<T> {
    /// The decoded payload; `None` when it did not decode (or names
    /// nothing this server understands).
    pub fact: Option<T>,
    /// The signed bytes, as sent.
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
}

/// A fact names the node it is about.
pub trait About {
    fn node_id(&self) -> &str;
}

/// Judges a signed fact that arrived on `session_node`'s session against
/// the node's valid certificates (DER): the fact, if it may be applied, or
/// why not (recorded as a forgery).
pub fn judge_signed<'a, T: About>(
    session_node: &str,
    signed: &'a Signed<T>,
    certs: &[Vec<u8>],
    verify: VerifySignature,
) -> Result<&'a T, String> {
    let Some(fact) = &signed.fact else {
        return Err("the payload does not decode".to_string());
    };
    if fact.node_id() != session_node {
        return Err(format!(
            "a fact about node {} on node {session_node}'s session",
            fact.node_id()
        ));
    }
    if signed.signature.is_empty() {
        return Err("unsigned".to_string());
    }
    if certs.is_empty() {
        return Err("the node has no valid certificate".to_string());
    }
    if !certs
        .iter()
        .any(|der| verify(der, &signed.payload, &signed.signature))
    {
        return Err("the signature is not from a valid certificate of the node".to_string());
    }
    Ok(fact)
}

/// A node as `nodes list` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRow {
    pub node_id: NodeId,
    pub hostname: String,
    pub state: String,
    pub epoch: u64,
    pub gateway_id: GatewayId,
    pub cert_not_after_ms: i64,
    pub last_seen_age_ms: i64,
    pub boot_id: String,
    pub journal_id: String,
    pub incarnation_id: String,
    pub agent_version: String,
    pub release_floor: u64,
    pub conditions: Vec<String>,
    pub taints: Vec<String>,
    /// The pool its join token named.
    pub pool: Option<String>,
    /// The MAC addresses it reported at its last join.
    pub macs: Vec<String>,
    /// The TPM endorsement key it is bound to (the SHA-256 of the EK's
    /// TPMT_PUBLIC, hex), when it joined by attestation.
    pub ek_sha256: Option<String>,
}

/// Every node, and the store's time of the reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeList {
    pub nodes: Vec<NodeRow>,
    pub now_ms: i64,
}

pub const CONDITION_UNREACHABLE: &str = "NodeUnreachable";
pub const TAINT_UNREACHABLE: &str = "NoSchedule:node.unreachable";
/// Why a certificate was revoked when its node first used a newer one.
pub const SUPERSEDED: &str = "superseded";

/// The node's daemon keeps dying (its supervisor's count, in the Hello).
pub const CONDITION_CRASH_LOOP: &str = "DaemonCrashLoop";

/// A node's conditions once it said Hello: reachable again, and in a crash
/// loop exactly when its supervisor counted enough abnormal exits.
pub fn conditions_at_hello(conditions: Vec<String>, daemon_exits: u32) -> Vec<String> {
    let conditions = without(conditions, CONDITION_UNREACHABLE);
    if bcd_core::crash_loop::is_crash_loop(daemon_exits) {
        with(conditions, CONDITION_CRASH_LOOP)
    } else {
        without(conditions, CONDITION_CRASH_LOOP)
    }
}

/// `list` with `item` in it, once.
pub fn with(mut list: Vec<String>, item: &str) -> Vec<String> {
    if !list.iter().any(|x| x == item) {
        list.push(item.to_string());
    }
    list
}

/// `list` without `item`.
pub fn without(mut list: Vec<String>, item: &str) -> Vec<String> {
    list.retain(|x| x != item);
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> CertRow {
        CertRow {
            node_id: "n".into(),
            serial: "s".into(),
            revoked_at_ms: None,
            revoke_reason: None,
            not_after_ms: 100,
            node_deleted_at_ms: None,
            statement: None,
        }
    }

    #[test]
    fn a_certificate_is_valid_until_its_end_unless_revoked_or_its_node_deleted() {
        assert_eq!(check_cert(Some(row()), 100).unwrap().serial, "s");
        assert_eq!(check_cert(Some(row()), 101), Err(Refusal::Expired));
        assert_eq!(check_cert(None, 0), Err(Refusal::UnknownCertificate));
        let revoked = CertRow {
            revoked_at_ms: Some(5),
            revoke_reason: Some("duplicate-identity".into()),
            ..row()
        };
        assert_eq!(
            check_cert(Some(revoked), 0),
            Err(Refusal::Revoked("duplicate-identity".into(), None))
        );
        let deleted = CertRow {
            revoked_at_ms: Some(5),
            node_deleted_at_ms: Some(5),
            statement: Some(b"signed".to_vec()),
            ..row()
        };
        assert_eq!(
            check_cert(Some(deleted), 0),
            Err(Refusal::DeletedNode("n".into(), Some(b"signed".to_vec()))),
            "deletion is named before the revocation it caused, with its statement"
        );
    }

    #[test]
    fn an_expired_certificate_is_renewable_within_the_grace_and_never_when_revoked() {
        // No grace: as valid.
        assert!(check_renewable(Some(row()), 100, 0).is_ok());
        assert_eq!(check_renewable(Some(row()), 101, 0), Err(Refusal::Expired));
        // Within the grace, to its last millisecond; not after.
        assert_eq!(check_renewable(Some(row()), 150, 50).unwrap().serial, "s");
        assert_eq!(check_renewable(Some(row()), 151, 50), Err(Refusal::Expired));
        // The grace forgives expiry only.
        let revoked = CertRow {
            revoked_at_ms: Some(5),
            revoke_reason: Some("node-deleted".into()),
            ..row()
        };
        assert!(matches!(
            check_renewable(Some(revoked), 120, 50),
            Err(Refusal::Revoked(..))
        ));
        let deleted = CertRow {
            node_deleted_at_ms: Some(5),
            ..row()
        };
        assert!(matches!(
            check_renewable(Some(deleted), 120, 50),
            Err(Refusal::DeletedNode(..))
        ));
        assert_eq!(
            check_renewable(None, 120, 50),
            Err(Refusal::UnknownCertificate)
        );
        // A negative grace is none.
        assert_eq!(check_renewable(Some(row()), 101, -5), Err(Refusal::Expired));
    }

    #[derive(Debug, PartialEq)]
    struct Fact(&'static str);

    impl About for Fact {
        fn node_id(&self) -> &str {
            self.0
        }
    }

    /// A signature is good when it is the certificate's bytes reversed.
    fn verify(cert: &[u8], _message: &[u8], signature: &[u8]) -> bool {
        cert.iter().rev().eq(signature.iter())
    }

    fn signed(node: &'static str, signature: &[u8]) -> Signed<Fact> {
        Signed {
            fact: Some(Fact(node)),
            payload: b"p".to_vec(),
            signature: signature.to_vec(),
        }
    }

    #[test]
    fn a_fact_applies_only_signed_by_a_valid_certificate_of_its_own_node() {
        let certs = vec![b"old".to_vec(), b"new".to_vec()];
        // Either certificate of a renewal verifies.
        assert!(judge_signed("n1", &signed("n1", b"wen"), &certs, verify).is_ok());
        assert!(judge_signed("n1", &signed("n1", b"dlo"), &certs, verify).is_ok());
        let refused =
            |s: &Signed<Fact>, certs: &[Vec<u8>]| judge_signed("n1", s, certs, verify).unwrap_err();
        assert_eq!(
            refused(&signed("n1", b"xyz"), &certs),
            "the signature is not from a valid certificate of the node"
        );
        assert_eq!(refused(&signed("n1", b""), &certs), "unsigned");
        assert_eq!(
            refused(&signed("n2", b"wen"), &certs),
            "a fact about node n2 on node n1's session"
        );
        assert_eq!(
            refused(&signed("n1", b"wen"), &[]),
            "the node has no valid certificate"
        );
        let garbled = Signed::<Fact> {
            fact: None,
            payload: vec![],
            signature: vec![],
        };
        assert_eq!(refused(&garbled, &certs), "the payload does not decode");
    }

    #[test]
    fn conditions_are_added_once_and_removed() {
        let l = with(vec![], CONDITION_UNREACHABLE);
        let l = with(l, CONDITION_UNREACHABLE);
        assert_eq!(l, vec![CONDITION_UNREACHABLE.to_string()]);
        assert!(without(l, CONDITION_UNREACHABLE).is_empty());
    }
}
