//! Attested GPU bindings.
//!
//! A node reports each binding it holds as a payload signed with its node
//! key. The store judges the signature against the node's current
//! certificate (never the session it came on: a gateway can relay forged
//! bytes but cannot sign them) with a verifier handed in by the caller, so
//! this crate knows no certificate format. Unsigned, foreign-signed and
//! replayed reports are rejected and recorded as
//! `reservation.binding-rejected`; a rejected report against an active
//! binding marks it lost (`reservation.binding-lost`) instead of replacing
//! it.
//!
//! Only a real verification failure is a rejection. A store failure while
//! judging is a store error: nothing changes, nothing is recorded.

use crate::id::NodeId;

/// The fields of a node's binding payload, decoded by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingReport {
    pub node_id: NodeId,
    pub allocation_id: String,
    pub gpu_uuids: Vec<String>,
    pub spec_generation: u64,
    pub nonce: String,
}

/// A binding report as it arrived on a node's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingInput {
    /// The node the session belongs to.
    pub session_node: NodeId,
    /// The decoded payload; `None` when it did not decode.
    pub report: Option<BindingReport>,
    /// The signed bytes, as the node sent them.
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
}

/// Whether `signature` over `message` was made by the key of the
/// certificate `cert_der`.
pub type VerifySignature = fn(cert_der: &[u8], message: &[u8], signature: &[u8]) -> bool;

/// What became of a binding report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingOutcome {
    Accepted,
    /// Refused; the reason is recorded as `reservation.binding-rejected`.
    Rejected(String),
    /// Refused, and the active binding it tried to replace is now lost.
    MarkedLost(String),
}

/// A binding as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingRow {
    pub allocation_id: String,
    pub gpus: Vec<String>,
    pub state: String,
    pub spec_generation: u64,
}

pub const REJECTED: &str = "reservation.binding-rejected";
pub const LOST: &str = "reservation.binding-lost";
pub const ACTIVE: &str = "active";

/// The judgement of a report, before its nonce is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Signed by the node's current key: accepted unless replayed.
    Verified(&'a BindingReport),
    Reject(String),
    /// Rejected, and the active binding it names is lost.
    MarkLost(String),
}

/// Judges a report. `current_cert` is the DER of the session node's
/// current certificate (`None`: it has none); `existing` the state of the
/// binding the report names.
pub fn judge<'a>(
    input: &'a BindingInput,
    current_cert: Option<&[u8]>,
    verify: VerifySignature,
    existing: Option<&str>,
) -> Verdict<'a> {
    let Some(report) = &input.report else {
        return Verdict::Reject("malformed binding report".into());
    };
    let why = if report.node_id != input.session_node {
        Some(format!(
            "report for node {} on node {}'s session",
            report.node_id, input.session_node
        ))
    } else if input.signature.is_empty() {
        Some("unsigned report".to_string())
    } else {
        match current_cert {
            None => Some("the node has no current certificate".to_string()),
            Some(der) if !verify(der, &input.payload, &input.signature) => {
                Some("signature is not from the node's current certificate".to_string())
            }
            Some(_) => None,
        }
    };
    match why {
        None => Verdict::Verified(report),
        Some(why) => {
            let reason = format!("allocation {}: {why}", report.allocation_id);
            if existing == Some(ACTIVE) {
                Verdict::MarkLost(reason)
            } else {
                Verdict::Reject(reason)
            }
        }
    }
}

/// The reason recorded for a report whose nonce was seen before (or that
/// has none).
pub fn replayed(report: &BindingReport) -> String {
    format!("allocation {}: replayed report", report.allocation_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(node: &str, signature: &[u8]) -> BindingInput {
        BindingInput {
            session_node: "n1".into(),
            report: Some(BindingReport {
                node_id: node.into(),
                allocation_id: "a".into(),
                gpu_uuids: vec!["GPU-1".into()],
                spec_generation: 1,
                nonce: "x".into(),
            }),
            payload: b"payload".to_vec(),
            signature: signature.to_vec(),
        }
    }

    /// A signature is good when it is the certificate's bytes reversed.
    fn verify(cert: &[u8], _message: &[u8], signature: &[u8]) -> bool {
        cert.iter().rev().eq(signature.iter())
    }

    #[test]
    fn only_the_current_certificates_key_binds() {
        let good = input("n1", b"tr");
        assert!(matches!(
            judge(&good, Some(b"rt"), verify, None),
            Verdict::Verified(_)
        ));
        assert_eq!(
            judge(&good, Some(b"zz"), verify, None),
            Verdict::Reject(
                "allocation a: signature is not from the node's current certificate".into()
            )
        );
        assert_eq!(
            judge(&good, None, verify, None),
            Verdict::Reject("allocation a: the node has no current certificate".into())
        );
        assert_eq!(
            judge(&input("n1", b""), Some(b"rt"), verify, None),
            Verdict::Reject("allocation a: unsigned report".into())
        );
        assert_eq!(
            judge(&input("n2", b"tr"), Some(b"rt"), verify, None),
            Verdict::Reject("allocation a: report for node n2 on node n1's session".into())
        );
    }

    #[test]
    fn a_forgery_against_an_active_binding_marks_it_lost() {
        assert_eq!(
            judge(&input("n1", b""), Some(b"rt"), verify, Some(ACTIVE)),
            Verdict::MarkLost("allocation a: unsigned report".into())
        );
        assert!(matches!(
            judge(&input("n1", b""), Some(b"rt"), verify, Some("lost")),
            Verdict::Reject(_)
        ));
    }

    #[test]
    fn an_undecodable_report_is_rejected_as_malformed() {
        let mut bad = input("n1", b"tr");
        bad.report = None;
        assert_eq!(
            judge(&bad, Some(b"rt"), verify, Some(ACTIVE)),
            Verdict::Reject("malformed binding report".into())
        );
    }
}
