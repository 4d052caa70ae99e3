//! The one mapping of refusals and failures to gRPC statuses.
//!
//! Every error status the server sends carries a typed reason in its
//! details (`bcd_proto::refusal`): peers decide on the reason, never on
//! the code or the words. The match over [`Refusal`] is exhaustive, with no
//! catch-all arm: a new refusal does not compile until someone decides its
//! code and reason here. The refusals the server makes outside the store
//! (a session without a certificate, a gateway without its lease, too many
//! Hellos, a session's end) are [`Turned`], mapped here too.
//!
//! A node stops for good only on NODE_DELETED or CERTIFICATE_REVOKED with
//! the worker-signed statement the store kept (`statement`); every other
//! reason is a reason for it to retry later. A store failure is logged in
//! full and reported as UNAVAILABLE without its text: a peer never sees
//! SQL, a path or a driver's message.

use std::time::Duration;

use bc_store::{Refusal, StoreError, TxError};
use bcd_proto::v1::RefusalReason;
use tonic::{Code, Status};
use tracing::warn;

/// An error status with its typed reason.
pub fn typed(
    code: Code,
    reason: RefusalReason,
    message: impl Into<String>,
    statement: Vec<u8>,
) -> Status {
    bcd_proto::refusal::status(code, reason, message, statement)
}

/// The code and typed reason a refusal goes out with.
pub fn classify(r: &Refusal) -> (Code, RefusalReason) {
    match r {
        // A node whose join token is bad: it may not join, and retrying with
        // the same token cannot help.
        Refusal::UnknownToken => (Code::PermissionDenied, RefusalReason::UnknownToken),
        Refusal::ExpiredToken => (Code::PermissionDenied, RefusalReason::ExpiredToken),
        Refusal::UsedToken => (Code::PermissionDenied, RefusalReason::UsedToken),
        // A machine with no token whose TPM is not enrolled: retrying cannot
        // help until an operator enrols it.
        Refusal::NotEnrolled(_) => (Code::PermissionDenied, RefusalReason::NotEnrolled),
        // A cloned identity: only an operator's join with a token ends it.
        Refusal::Quarantined(_) => (Code::PermissionDenied, RefusalReason::Quarantined),
        // The node proves its Hellos: this one is another machine's, or an
        // older release's, and retrying does not make it proved.
        Refusal::HelloUnproved(..) => (Code::PermissionDenied, RefusalReason::HelloUnproved),
        // The node's identity is not (or no longer) good. Only a deletion or
        // revocation with its statement ends the node; an expired
        // certificate is renewed first.
        Refusal::UnknownCertificate => (Code::Unauthenticated, RefusalReason::UnknownCertificate),
        Refusal::DeletedNode(..) => (Code::Unauthenticated, RefusalReason::NodeDeleted),
        Refusal::WrongCertificate(_) => (Code::Unauthenticated, RefusalReason::WrongCertificate),
        Refusal::Revoked(..) => (Code::Unauthenticated, RefusalReason::CertificateRevoked),
        Refusal::Expired => (Code::Unauthenticated, RefusalReason::CertificateExpired),
        Refusal::BadRequest(_) => (Code::InvalidArgument, RefusalReason::BadRequest),
        Refusal::NoSuchNode(_) | Refusal::NotFound(_) => (Code::NotFound, RefusalReason::NotFound),
        Refusal::Conflict(_) => (Code::FailedPrecondition, RefusalReason::Conflict),
        // The machine proved no identity the store would re-enrol; it may
        // join as a new node with the same token (nothing was spent).
        Refusal::NotReenrolled(..) => (Code::FailedPrecondition, RefusalReason::Conflict),
        // The gateway lost its lease: the node reconnects, elsewhere.
        Refusal::Fenced(_) => (Code::Unavailable, RefusalReason::Fenced),
        Refusal::Internal(_) => (Code::Internal, RefusalReason::Internal),
    }
}

/// A refusal as a status, worded for the peer, with its statement.
pub fn refusal(r: Refusal) -> Status {
    let (code, reason) = classify(&r);
    match r {
        Refusal::Internal(detail) => {
            warn!(error = %detail, "internal error");
            typed(
                code,
                reason,
                "the server failed to handle the request; see its log",
                vec![],
            )
        }
        Refusal::DeletedNode(_, ref statement) | Refusal::Revoked(_, ref statement) => {
            let statement = statement.clone().unwrap_or_default();
            typed(code, reason, r.to_string(), statement)
        }
        r => typed(code, reason, r.to_string(), vec![]),
    }
}

/// A request the operator (or a peer) got wrong; the message says how.
pub fn bad_request(message: impl Into<String>) -> Status {
    refusal(Refusal::BadRequest(message.into()))
}

/// A store failure: logged, and reported without its text.
pub fn unavailable(e: StoreError) -> Status {
    // The database's own text is in the error's message, for the log.
    warn!(error = %e, "store error");
    typed(
        Code::Unavailable,
        RefusalReason::Unavailable,
        "the server's store is unavailable; retry later",
        vec![],
    )
}

/// Either.
pub fn status(e: TxError) -> Status {
    match e {
        TxError::Refused(r) => refusal(r),
        TxError::Store(e) => unavailable(e),
    }
}

/// Refusals the server makes outside the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turned {
    /// A call that needs a node certificate came without one.
    NoCertificate(&'static str),
    /// This gateway holds no lease now.
    GatewayFenced(String),
    /// An operator drains this gateway.
    GatewayDraining(String),
    /// Too many Hello transactions in flight.
    Busy,
    /// The peer broke the protocol.
    Protocol(&'static str),
    /// The node went silent for this long.
    MissedHeartbeats(Duration),
    /// A newer session took the node.
    Superseded,
    /// The node's certificate was revoked, with the statement that says so.
    Revoked {
        reason: String,
        statement: Option<Vec<u8>>,
    },
    /// The operator API's credential is missing, unknown or revoked.
    Operator(String),
    /// The operator's role does not allow the call.
    Forbidden(String),
}

/// The status a [`Turned`] goes out with.
pub fn turned(t: Turned) -> Status {
    match t {
        Turned::NoCertificate(m) => typed(
            Code::Unauthenticated,
            RefusalReason::NoCertificate,
            m,
            vec![],
        ),
        Turned::GatewayFenced(gateway) => typed(
            Code::Unavailable,
            RefusalReason::Fenced,
            format!("gateway {gateway} holds no lease right now; reconnect"),
            vec![],
        ),
        Turned::GatewayDraining(gateway) => typed(
            Code::Unavailable,
            RefusalReason::Draining,
            format!("gateway {gateway} is draining; reconnect to another"),
            vec![],
        ),
        Turned::Busy => typed(
            Code::ResourceExhausted,
            RefusalReason::Busy,
            "too many Hellos in flight; retry",
            vec![],
        ),
        Turned::Protocol(m) => typed(Code::InvalidArgument, RefusalReason::Protocol, m, vec![]),
        Turned::MissedHeartbeats(silent) => typed(
            Code::Unavailable,
            RefusalReason::MissedHeartbeats,
            format!("no heartbeat for {}s; reconnect", silent.as_secs()),
            vec![],
        ),
        Turned::Superseded => typed(
            Code::Aborted,
            RefusalReason::Superseded,
            "session superseded by a newer one",
            vec![],
        ),
        Turned::Revoked { reason, statement } => refusal(Refusal::Revoked(reason, statement)),
        Turned::Operator(m) => typed(
            Code::Unauthenticated,
            RefusalReason::OperatorUnauthenticated,
            m,
            vec![],
        ),
        Turned::Forbidden(m) => typed(
            Code::PermissionDenied,
            RefusalReason::OperatorForbidden,
            m,
            vec![],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(s: &Status) -> RefusalReason {
        bcd_proto::refusal::reason(s)
    }

    #[test]
    fn refusals_keep_their_words_and_carry_their_typed_reason() {
        let s = refusal(Refusal::Revoked(
            "duplicate-identity".into(),
            Some(b"st".to_vec()),
        ));
        assert_eq!(s.code(), Code::Unauthenticated);
        assert_eq!(reason(&s), RefusalReason::CertificateRevoked);
        assert_eq!(bcd_proto::refusal::of(&s).unwrap().statement, b"st");
        assert!(
            s.message()
                .starts_with("the node certificate was revoked (duplicate-identity)")
        );
        let s = refusal(Refusal::DeletedNode("nd-1".into(), None));
        assert_eq!(reason(&s), RefusalReason::NodeDeleted);
        assert!(bcd_proto::refusal::of(&s).unwrap().statement.is_empty());
        let expired = refusal(Refusal::Expired);
        assert_eq!(
            expired.message(),
            "certificate expired; renew and reconnect"
        );
        assert_eq!(reason(&expired), RefusalReason::CertificateExpired);
        assert_eq!(refusal(Refusal::UsedToken).code(), Code::PermissionDenied);
        assert_eq!(
            refusal(Refusal::Fenced("gw".into())).code(),
            Code::Unavailable
        );
        assert_eq!(
            refusal(Refusal::NoSuchNode("n".into())).code(),
            Code::NotFound
        );
        assert_eq!(
            refusal(Refusal::Conflict("x".into())).code(),
            Code::FailedPrecondition
        );
        assert_eq!(reason(&bad_request("no")), RefusalReason::BadRequest);
    }

    #[test]
    fn every_refusal_has_a_reason() {
        for r in [
            Refusal::UnknownToken,
            Refusal::ExpiredToken,
            Refusal::UsedToken,
            Refusal::UnknownCertificate,
            Refusal::DeletedNode("n".into(), None),
            Refusal::WrongCertificate("n".into()),
            Refusal::Revoked("r".into(), None),
            Refusal::Expired,
            Refusal::NotEnrolled("e4".into()),
            Refusal::Quarantined("n".into()),
            Refusal::HelloUnproved("n".into()),
            Refusal::BadRequest("b".into()),
            Refusal::NoSuchNode("n".into()),
            Refusal::NotFound("x".into()),
            Refusal::Conflict("c".into()),
            Refusal::Fenced("g".into()),
            Refusal::Internal("i".into()),
        ] {
            let s = refusal(r.clone());
            assert_ne!(reason(&s), RefusalReason::Unspecified, "{r:?}");
            assert_eq!(s.code(), classify(&r).0);
        }
        for t in [
            Turned::NoCertificate("x"),
            Turned::GatewayFenced("g".into()),
            Turned::GatewayDraining("g".into()),
            Turned::Busy,
            Turned::Protocol("p"),
            Turned::MissedHeartbeats(Duration::from_secs(30)),
            Turned::Superseded,
            Turned::Revoked {
                reason: "r".into(),
                statement: None,
            },
            Turned::Operator("o".into()),
            Turned::Forbidden("f".into()),
        ] {
            assert_ne!(
                reason(&turned(t.clone())),
                RefusalReason::Unspecified,
                "{t:?}"
            );
        }
        assert_eq!(
            turned(Turned::MissedHeartbeats(Duration::from_secs(30))).message(),
            "no heartbeat for 30s; reconnect"
        );
    }

    #[test]
    fn internals_never_reach_the_peer() {
        let s = refusal(Refusal::Internal("rcgen: key at /var/lib/x".into()));
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains("/var/lib"), "{}", s.message());
        let e = StoreError::Database(Box::new(std::io::Error::other(
            "disk I/O error in SELECT der FROM node_certs",
        )));
        let s = unavailable(e);
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(reason(&s), RefusalReason::Unavailable);
        assert!(!s.message().contains("SELECT"), "{}", s.message());
        let details = bcd_proto::refusal::of(&s).unwrap();
        assert!(!details.message.contains("SELECT"));
    }
}
