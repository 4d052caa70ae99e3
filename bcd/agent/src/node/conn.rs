//! The session stream: dialing the gateway, sending, and what a stream's
//! end means to the session: the typed reason in the status details and
//! the worker-signed statement it carries, never the code or the words
//! (`bcd_core::Event::stream_error` decides).

use bcd_core::{Claim, Event, Me, Statement, StatementKind};
use bcd_proto::v1::{self, NodeMessage, node_message};
use tokio::task::JoinHandle;

use crate::client::{self, Stream};
use crate::identity::Identity;

/// The open stream, if any.
pub(super) type Conn = Option<Stream>;

/// The session in progress as the parts see it. The session loop alone
/// writes it; the parts that sign or date what they send read it.
#[derive(Debug, Default)]
pub(super) struct Link {
    /// The epoch of the session established now, if any: what state
    /// reports and inventory are signed under.
    pub epoch: Option<u64>,
    /// The session clock's server time at the loop's last turn.
    pub server_now_ms: Option<i64>,
    /// The boot and journal the last Hello came from: the identity keeps
    /// them once a Welcome confirms the session.
    pub hello_from: (String, String),
}

/// Dials in the background; the loop awaits the handle.
pub(super) fn spawn_dial(
    identity: &Identity,
    stream_buffer: usize,
) -> JoinHandle<Result<Stream, String>> {
    let identity = identity.clone();
    tokio::spawn(async move { client::open_session(&identity, stream_buffer).await })
}

/// Sends a message when a stream is open. A failed send means the stream
/// is gone; its end arrives as an event.
pub(super) async fn send(conn: &Conn, msg: node_message::Msg) {
    if let Some(c) = conn {
        let _ = c.tx.send(Box::new(NodeMessage { msg: Some(msg) })).await;
    }
}

/// A command acknowledgement.
pub(super) fn ack(id: &str, seq: u64, state: v1::AckState) -> node_message::Msg {
    node_message::Msg::CommandAck(v1::CommandAck {
        command_id: id.to_string(),
        seq,
        state: state as i32,
    })
}

/// A statement relayed with a refusal or a revocation notice, if its
/// signature verifies against the worker keys; `Err` says why not (for the
/// log and the security event).
pub(super) fn statement(envelope: &[u8], worker_keys: &[Vec<u8>]) -> Result<Statement, String> {
    if envelope.is_empty() {
        return Err("no statement".into());
    }
    let s = bcd_proto::sign::open_statement(envelope, worker_keys)
        .map_err(|e| format!("statement: {e}"))?;
    let kind = match v1::NodeStatementKind::try_from(s.kind) {
        Ok(v1::NodeStatementKind::Deleted) => StatementKind::Deleted,
        Ok(v1::NodeStatementKind::Revoked) => StatementKind::Revoked,
        Ok(v1::NodeStatementKind::Unspecified) | Err(_) => {
            return Err(format!("statement of an unknown kind {}", s.kind));
        }
    };
    Ok(Statement {
        node_id: s.node_id,
        kind,
        serials: s.serials,
        reason: s.reason,
    })
}

/// What a stream's end claims, and the statement that came with it.
#[derive(Debug)]
pub(super) struct Ended {
    pub event: Event,
    /// A deletion or revocation was claimed but not confirmed: why.
    pub unconfirmed: Option<String>,
}

/// The session event for a stream the gateway ended with an error status.
pub(super) fn stream_error(status: &tonic::Status, me: Me<'_>, worker_keys: &[Vec<u8>]) -> Ended {
    let refusal = bcd_proto::refusal::of(status);
    let claim = match refusal
        .as_ref()
        .and_then(|r| v1::RefusalReason::try_from(r.reason).ok())
    {
        Some(v1::RefusalReason::NodeDeleted) => Claim::NodeDeleted,
        Some(v1::RefusalReason::CertificateRevoked) => Claim::CertificateRevoked,
        _ => Claim::Other,
    };
    let checked = match claim {
        Claim::Other => None,
        Claim::NodeDeleted | Claim::CertificateRevoked => Some(statement(
            refusal.as_ref().map_or(&[][..], |r| r.statement.as_slice()),
            worker_keys,
        )),
    };
    let verified = checked.as_ref().and_then(|c| c.as_ref().ok());
    let event = Event::stream_error(
        claim,
        verified,
        me,
        &status.code().to_string(),
        status.message(),
    );
    let unconfirmed = match (&event, checked) {
        (Event::Refused { .. }, _) | (_, None) => None,
        (_, Some(Err(why))) => Some(why),
        (_, Some(Ok(s))) => Some(format!(
            "the statement is about node {} ({:?} {:?}), not this node and certificate",
            s.node_id, s.kind, s.serials
        )),
    };
    Ended { event, unconfirmed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::KeyPair;

    const ME: Me<'static> = Me {
        node_id: "nd-1",
        serial: "0a",
    };

    fn key() -> ring::signature::Ed25519KeyPair {
        ring::signature::Ed25519KeyPair::from_seed_unchecked(&[9; 32]).unwrap()
    }

    fn deleted(node: &str, signer: &ring::signature::Ed25519KeyPair) -> Vec<u8> {
        bcd_proto::sign::seal_statement(
            signer,
            &v1::NodeStatement {
                node_id: node.into(),
                kind: v1::NodeStatementKind::Deleted as i32,
                reason: "node-deleted".into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn only_the_typed_reason_and_a_verified_statement_stop_the_node() {
        let k = key();
        let keys = vec![k.public_key().as_ref().to_vec()];
        let refused = |reason, statement| {
            bcd_proto::refusal::status(
                tonic::Code::Unauthenticated,
                reason,
                "node nd-1 was deleted",
                statement,
            )
        };
        let e = stream_error(
            &refused(v1::RefusalReason::NodeDeleted, deleted("nd-1", &k)),
            ME,
            &keys,
        );
        assert!(matches!(e.event, Event::Refused { .. }), "{e:?}");
        assert_eq!(e.unconfirmed, None);
        // The same words without details, with a forged or foreign
        // statement, or under another reason: a reconnect.
        let forged = key_from(3);
        for (status, why) in [
            (
                tonic::Status::unauthenticated("node nd-1 was deleted"),
                None,
            ),
            (
                tonic::Status::permission_denied("node nd-1 was deleted"),
                None,
            ),
            (
                refused(v1::RefusalReason::NodeDeleted, vec![]),
                Some("no statement"),
            ),
            (
                refused(v1::RefusalReason::NodeDeleted, deleted("nd-1", &forged)),
                Some("not signed by a worker key"),
            ),
            (
                refused(v1::RefusalReason::NodeDeleted, deleted("nd-2", &k)),
                Some("about node nd-2"),
            ),
            (
                refused(v1::RefusalReason::UnknownCertificate, deleted("nd-1", &k)),
                None,
            ),
        ] {
            let e = stream_error(&status, ME, &keys);
            assert!(matches!(e.event, Event::Closed { .. }), "{status:?}: {e:?}");
            match why {
                Some(w) => assert!(
                    e.unconfirmed.as_deref().is_some_and(|u| u.contains(w)),
                    "{status:?}: {e:?}"
                ),
                None => assert_eq!(e.unconfirmed, None),
            }
        }
        let fenced = tonic::Status::unavailable("the gateway fenced itself");
        let Event::Closed { error } = stream_error(&fenced, ME, &keys).event else {
            panic!("unavailable is a reconnect");
        };
        assert!(error.contains("fenced"), "{error}");
    }

    fn key_from(seed: u8) -> ring::signature::Ed25519KeyPair {
        ring::signature::Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
    }
}
