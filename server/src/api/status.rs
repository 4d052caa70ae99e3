//! The one mapping of the store's refusals and failures to gRPC statuses.
//!
//! The match over [`Refusal`] is exhaustive, with no catch-all arm: a new
//! refusal does not compile until someone decides its status here. That
//! matters because nodes act on the code: UNAUTHENTICATED and
//! PERMISSION_DENIED make `bcd node` stop for good, UNAVAILABLE makes it
//! retry. A store failure is logged in full and reported as UNAVAILABLE
//! without its text: a peer never sees SQL, a path or a driver's message.

use bc_store::{Refusal, StoreError, TxError};
use tonic::{Code, Status};
use tracing::warn;

/// The status a refusal goes out with.
pub fn code(r: &Refusal) -> Code {
    match r {
        // A node whose join token is bad: it may not join, and retrying with
        // the same token cannot help.
        Refusal::UnknownToken | Refusal::ExpiredToken | Refusal::UsedToken => {
            Code::PermissionDenied
        }
        // The node's identity is not (or no longer) good: it stops for good
        // and needs a new join. An expired certificate is renewed first.
        Refusal::UnknownCertificate
        | Refusal::DeletedNode(_)
        | Refusal::WrongCertificate(_)
        | Refusal::Revoked(_)
        | Refusal::Expired => Code::Unauthenticated,
        Refusal::BadRequest(_) => Code::InvalidArgument,
        Refusal::NoSuchNode(_) | Refusal::NotFound(_) => Code::NotFound,
        Refusal::Conflict(_) => Code::FailedPrecondition,
        // The gateway lost its lease: the node reconnects, elsewhere.
        Refusal::Fenced(_) => Code::Unavailable,
        Refusal::Internal(_) => Code::Internal,
    }
}

/// A refusal as a status, worded for the peer.
pub fn refusal(r: Refusal) -> Status {
    let code = code(&r);
    match r {
        Refusal::Internal(detail) => {
            warn!(error = %detail, "internal error");
            Status::internal("the server failed to handle the request; see its log")
        }
        r => Status::new(code, r.to_string()),
    }
}

/// A store failure: logged, and reported without its text.
pub fn unavailable(e: StoreError) -> Status {
    // The database's own text is in the error's message, for the log.
    warn!(error = %e, "store error");
    Status::unavailable("the server's store is unavailable; retry later")
}

/// Either.
pub fn status(e: TxError) -> Status {
    match e {
        TxError::Refused(r) => refusal(r),
        TxError::Store(e) => unavailable(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_their_words_and_nodes_their_codes() {
        let s = refusal(Refusal::Revoked("duplicate-identity".into()));
        assert_eq!(s.code(), Code::Unauthenticated);
        assert!(
            s.message()
                .starts_with("the node certificate was revoked (duplicate-identity)")
        );
        assert_eq!(
            refusal(Refusal::Expired).message(),
            "certificate expired; renew and reconnect"
        );
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
        assert!(!s.message().contains("SELECT"), "{}", s.message());
    }
}
