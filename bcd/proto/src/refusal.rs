//! Typed refusals in error statuses.
//!
//! Every error status the server sends carries a [`v1::Refusal`] in its
//! details (`grpc-status-details-bin`): the reason as an enum, the message
//! again, and for a deletion or revocation the worker-signed statement
//! that confirms it. A peer decides on the reason; the code and the words
//! are for people and for peers that predate the details.

use prost::Message;
use tonic::{Code, Status};

use crate::v1;

/// An error status with its typed reason in the details.
pub fn status(
    code: Code,
    reason: v1::RefusalReason,
    message: impl Into<String>,
    statement: Vec<u8>,
) -> Status {
    let message = message.into();
    let details = v1::Refusal {
        reason: reason as i32,
        message: message.clone(),
        statement,
    }
    .encode_to_vec();
    Status::with_details(code, message, details.into())
}

/// The typed refusal a status carries; `None` when it carries none (or
/// details that do not decode).
pub fn of(status: &Status) -> Option<v1::Refusal> {
    if status.details().is_empty() {
        return None;
    }
    v1::Refusal::decode(status.details()).ok()
}

/// The reason a status carries; UNSPECIFIED when it carries none, or one
/// this side does not know.
pub fn reason(status: &Status) -> v1::RefusalReason {
    of(status)
        .and_then(|r| v1::RefusalReason::try_from(r.reason).ok())
        .unwrap_or(v1::RefusalReason::Unspecified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_and_statement_survive_the_status() {
        let s = status(
            Code::Unauthenticated,
            v1::RefusalReason::NodeDeleted,
            "node nd-1 was deleted",
            vec![1, 2, 3],
        );
        assert_eq!(s.code(), Code::Unauthenticated);
        assert_eq!(s.message(), "node nd-1 was deleted");
        let r = of(&s).unwrap();
        assert_eq!(r.reason, v1::RefusalReason::NodeDeleted as i32);
        assert_eq!(r.statement, [1, 2, 3]);
        assert_eq!(reason(&s), v1::RefusalReason::NodeDeleted);
        // A bare status has no reason, whatever it says.
        let bare = Status::unauthenticated("node nd-1 was deleted");
        assert_eq!(of(&bare), None);
        assert_eq!(reason(&bare), v1::RefusalReason::Unspecified);
        let garbage = Status::with_details(Code::Unavailable, "x", vec![0xff, 0xff].into());
        assert_eq!(reason(&garbage), v1::RefusalReason::Unspecified);
    }
}
