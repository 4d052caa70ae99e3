//! The bodies of the events a node journals and sends (`v1::Event`'s
//! `body`): JSON, one type per kind, so what a node writes and what a
//! reader expects are the same declaration. Each type's [`Body::KIND`] is
//! its event kind; `testdata/events/` pins each one's bytes.
//!
//! A body is written as a JSON object with its keys in sorted order
//! ([`encode`]), the form nodes have always sent, so the SHA-256 a receipt
//! names stays the same for the same fields. A body type gains fields only
//! as optional ones (`#[serde(default)]`), so every body already journaled
//! still reads.
//!
//! The `security.*` kinds a node journals when it refuses something a
//! gateway sent are a [`Refused`] around the detail type of each.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An event body and the kind it is the body of.
pub trait Body: Serialize + DeserializeOwned {
    /// The event's kind (`v1::Event.kind`).
    const KIND: &'static str;
}

/// The bytes of `body`: a JSON object, keys sorted.
pub fn encode<B: Serialize>(body: &B) -> Vec<u8> {
    // Through a `Value`, whose objects keep their keys sorted: the bytes do
    // not depend on the order fields are declared in.
    match serde_json::to_value(body) {
        Ok(v) => v.to_string().into_bytes(),
        Err(e) => unreachable!("an event body always serializes: {e}"),
    }
}

/// Reads a body of type `B` from an event's bytes.
pub fn decode<B: Body>(bytes: &[u8]) -> Result<B, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("a {} event body: {e}", B::KIND))
}

/// `command.accepted`: a command passed the node's checks and is journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandAccepted {
    pub command_id: String,
    pub seq: u64,
    /// The command's kind (`exec.run`, ...).
    pub kind: String,
}

impl Body for CommandAccepted {
    const KIND: &'static str = "command.accepted";
}

/// `command.running`: its side effect starts, in this boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRunning {
    pub command_id: String,
    pub boot_id: String,
}

impl Body for CommandRunning {
    const KIND: &'static str = "command.running";
}

/// `command.finished`: its result is journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandFinished {
    pub command_id: String,
    /// `succeeded`, `failed`, `interrupted`, ...
    pub outcome: String,
    pub reason: String,
}

impl Body for CommandFinished {
    const KIND: &'static str = "command.finished";
}

/// `node.load`: the load averages, sent as a metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeLoad {
    pub load1: f64,
    pub load5: f64,
    pub load15: f64,
}

impl Body for NodeLoad {
    const KIND: &'static str = "node.load";
}

/// `spec.refused`: a desired state that did not verify or apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecRefused {
    pub generation: u64,
    pub reason: String,
}

impl Body for SpecRefused {
    const KIND: &'static str = "spec.refused";
}

/// `tunnel.ended`: an exec or port-forward tunnel closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelEnded {
    pub sid: String,
    /// The ticket's id.
    pub jti: String,
    /// The operator the ticket names.
    pub operator: String,
    /// The command, or `port:N`.
    pub what: Vec<String>,
    pub user: String,
    /// Record bytes from the CLI and to it.
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub exit_code: Option<i32>,
    pub signal: i32,
    pub error: String,
    pub seconds: u64,
}

impl Body for TunnelEnded {
    const KIND: &'static str = "tunnel.ended";
}

/// `security.release.running`: a new release's first session asks the key
/// holder to confirm it (the node keeps it until the receipt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRunning {
    pub command_id: String,
    pub release_sequence: u64,
}

impl Body for ReleaseRunning {
    const KIND: &'static str = "security.release.running";
}

/// `security.gateway.revoked` and `security.gateway.stale`: the node left a
/// gateway the signed list names, or one whose list ran out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayLeft {
    pub gateway_sha256: String,
    pub why: String,
}

impl Body for GatewayLeft {
    const KIND: &'static str = "security.gateway.revoked";
}

/// The kind of a [`GatewayLeft`] for a gateway whose list ran out.
pub const GATEWAY_STALE: &str = "security.gateway.stale";

/// A frame from the gateway the node refused: the detail of its kind
/// (journaled a few KiB at most; a longer one becomes a string cut
/// short), and how many of the same kind were held back since the last
/// one journaled (at most one a minute is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused<D> {
    pub detail: D,
    pub held_back: u64,
}

/// The details of refused frames, by kind: the type and its kind.
pub trait Detail: Serialize + DeserializeOwned {
    const KIND: &'static str;
}

impl<D: Detail> Body for Refused<D> {
    const KIND: &'static str = D::KIND;
}

/// `security.command.refused`: a dispatch that failed the node's checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRefused {
    pub command_id: String,
    pub seq: u64,
    pub reason: String,
}

impl Detail for CommandRefused {
    const KIND: &'static str = "security.command.refused";
}

/// `security.receipt.refused`: a receipt no worker key signed, or for
/// another node, journal, kind or body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptRefused {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_id: Option<String>,
    pub why: String,
}

impl Detail for ReceiptRefused {
    const KIND: &'static str = "security.receipt.refused";
}

/// `security.secret.refused`: a secret whose sealing did not open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRefused {
    pub allocation: String,
    pub secret: String,
    pub version: u64,
    pub why: String,
}

impl Detail for SecretRefused {
    const KIND: &'static str = "security.secret.refused";
}

/// `security.welcome.refused`: a Welcome with a stale epoch or a clock
/// the node refuses (the reason, as a string).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WelcomeRefused(pub String);

impl Detail for WelcomeRefused {
    const KIND: &'static str = "security.welcome.refused";
}

/// `security.clock.ahead`: a gateway's time past what the key holder's
/// signed times allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockAhead {
    pub said_ms: i64,
    pub limit_ms: i64,
    pub why: String,
}

impl Detail for ClockAhead {
    const KIND: &'static str = "security.clock.ahead";
}

/// `security.refusal.unconfirmed`: a refusal for good that no key
/// confirmed, so the node dials again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalUnconfirmed {
    pub code: String,
    pub message: String,
    pub why: String,
}

impl Detail for RefusalUnconfirmed {
    const KIND: &'static str = "security.refusal.unconfirmed";
}

/// `security.revocation.unconfirmed`: a revocation no key confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationUnconfirmed {
    pub reason: String,
    pub why: String,
}

impl Detail for RevocationUnconfirmed {
    const KIND: &'static str = "security.revocation.unconfirmed";
}

/// `security.drain.clamped`: a drain window past the node's bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainClamped {
    pub asked_ms: u64,
    pub clamped_ms: u64,
}

impl Detail for DrainClamped {
    const KIND: &'static str = "security.drain.clamped";
}

/// `security.gateway_revocations.refused`: a gateway revocation list that
/// did not verify.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayRevocationsRefused {
    pub why: String,
}

impl Detail for GatewayRevocationsRefused {
    const KIND: &'static str = "security.gateway_revocations.refused";
}

/// `security.tunnel.refused`: a tunnel whose ticket did not admit it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelRefused {
    pub sid: String,
    pub why: String,
}

impl Detail for TunnelRefused {
    const KIND: &'static str = "security.tunnel.refused";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_written_with_their_keys_sorted() {
        let b = CommandAccepted {
            command_id: "c".into(),
            seq: 1,
            kind: "exec.run".into(),
        };
        assert_eq!(
            String::from_utf8(encode(&b)).unwrap(),
            r#"{"command_id":"c","kind":"exec.run","seq":1}"#
        );
    }

    #[test]
    fn a_body_of_the_wrong_shape_is_an_error_naming_its_kind() {
        let e = decode::<CommandRunning>(b"{\"command_id\":1}").unwrap_err();
        assert!(e.starts_with("a command.running event body: "), "{e}");
    }
}
