//! The session stream: dialing the gateway, sending, and what a stream's
//! end means to the session.

use bcd_core::{Event, StreamStatus};
use bcd_proto::v1::{self, NodeMessage, node_message};
use tokio::task::JoinHandle;

use crate::client::{self, Stream};
use crate::identity::Identity;

/// The open stream, if any.
pub(super) type Conn = Option<Stream>;

/// Dials in the background; the loop awaits the handle.
pub(super) fn spawn_dial(identity: &Identity) -> JoinHandle<Result<Stream, String>> {
    let identity = identity.clone();
    tokio::spawn(async move { client::open_session(&identity).await })
}

/// Sends a message when a stream is open. A failed send means the stream
/// is gone; its end arrives as an event.
pub(super) async fn send(conn: &Conn, msg: node_message::Msg) {
    if let Some(c) = conn {
        let _ = c.tx.send(NodeMessage { msg: Some(msg) }).await;
    }
}

/// A command acknowledgement.
pub(super) fn ack(id: &str, seq: u64, state: &str) -> node_message::Msg {
    node_message::Msg::CommandAck(v1::CommandAck {
        command_id: id.to_string(),
        seq,
        state: state.to_string(),
        reason: String::new(),
    })
}

/// The session event for a stream the gateway ended with an error status
/// (`bcd_core::Event::stream_error` decides).
pub(super) fn stream_error(status: &tonic::Status) -> Event {
    let kind = match status.code() {
        tonic::Code::Unauthenticated => StreamStatus::Unauthenticated,
        tonic::Code::PermissionDenied => StreamStatus::PermissionDenied,
        _ => StreamStatus::Other,
    };
    Event::stream_error(kind, &status.code().to_string(), status.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_codes_map_onto_the_session_rules() {
        let expired = tonic::Status::unauthenticated("certificate expired; renew and reconnect");
        assert!(matches!(stream_error(&expired), Event::Closed { .. }));
        let deleted = tonic::Status::permission_denied("node nd-1 was deleted");
        assert!(matches!(stream_error(&deleted), Event::Refused { .. }));
        let fenced = tonic::Status::unavailable("the gateway fenced itself");
        let Event::Closed { error } = stream_error(&fenced) else {
            panic!("unavailable is a reconnect");
        };
        assert!(error.contains("fenced"), "{error}");
    }
}
