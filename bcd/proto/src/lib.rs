//! The wire protocol between bcd, the gateway, the join service and the
//! operator API, and the TLS transport both ends use.
//!
//! `v1` holds the tonic/prost code generated from `proto/bcd.proto`;
//! `typed` converts its enums to and from the domain types of `bcd-core`
//! with exhaustive matches and gives each value its one spelling; `sign`
//! seals and opens worker-signed envelopes and checks statements about a
//! node; `refusal` carries a typed reason in an error status. `tls`
//! builds rustls configurations on the one crypto provider of the project
//! (ring), connects tonic channels over our own TLS so the client can pin the
//! fleet CA, and accepts server connections so handlers can see the client
//! certificate. This crate holds no policy: who may do what is decided by the
//! server (`server/`) and the agent (`bcd/agent`).
#![forbid(unsafe_code)]

pub mod attest;
pub mod doctor;
pub mod gateways;
pub mod hello;
pub mod joined;
#[cfg(feature = "serde")]
pub mod json;
pub mod receipts;
pub mod reenrol;
pub mod refusal;
pub mod renew;
pub mod seal;
pub mod secret;
pub mod sign;
pub mod ticket;
pub mod tls;
pub mod token;
pub mod tunnel;
pub mod typed;

#[allow(clippy::all, missing_debug_implementations)]
pub mod v1 {
    tonic::include_proto!("bcd.v1");
}

/// The DNS name every gateway serving certificate carries. Nodes reach
/// gateways by whatever address the operator gives (an IP, a balancer, a
/// qemu forward); trust comes from the pinned fleet CA, so the name checked
/// is this fixed one rather than the dialed host.
pub const GATEWAY_NAME: &str = "gateway.better-compute.internal";

/// The DNS name the operator API's serving certificate carries (issued by
/// the operator CA, never the fleet CA): the name the operator CLI checks,
/// whatever address it dials.
pub const API_NAME: &str = "bc-api";

/// SHA-256 of DER bytes, as lowercase hex: how certificates are pinned and
/// looked up.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, der).as_ref())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::v1;

    proptest! {
        /// Every message a peer sends is decoded from untrusted bytes: any
        /// input decodes or fails cleanly, and what decodes re-encodes to
        /// something that decodes to the same message.
        #[test]
        fn peer_messages_decode_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
            if let Ok(m) = v1::NodeMessage::decode(bytes.as_slice()) {
                prop_assert_eq!(v1::NodeMessage::decode(m.encode_to_vec().as_slice()).unwrap(), m);
            }
            if let Ok(m) = v1::ServerMessage::decode(bytes.as_slice()) {
                prop_assert_eq!(v1::ServerMessage::decode(m.encode_to_vec().as_slice()).unwrap(), m);
            }
            let _ = v1::CommandPayload::decode(bytes.as_slice());
            let _ = v1::SignedEnvelope::decode(bytes.as_slice());
            let _ = v1::JoinRequest::decode(bytes.as_slice());
            let _ = v1::AttestationRequest::decode(bytes.as_slice());
            let _ = v1::AttestationChallenge::decode(bytes.as_slice());
            let _ = v1::RenewRequest::decode(bytes.as_slice());
            let _ = v1::KeyCertification::decode(bytes.as_slice());
        }

        #[test]
        fn hellos_round_trip(node in "[a-z0-9-]{0,20}", epoch: u64, running in prop::collection::vec("[a-z0-9-]{1,20}", 0..5)) {
            let m = v1::NodeMessage {
                msg: Some(v1::node_message::Msg::Hello(v1::Hello {
                    node_id: node,
                    last_epoch: epoch,
                    journal_running: running,
                    ..Default::default()
                })),
            };
            prop_assert_eq!(v1::NodeMessage::decode(m.encode_to_vec().as_slice()).unwrap(), m);
        }
    }
}
