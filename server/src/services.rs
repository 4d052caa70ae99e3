//! The GatewayServices port: what a gateway needs from the process that
//! holds the keys (a node's join, renewal and secrets). The join service implements
//! it (`api::join`); the gateway calls it in the same process, or over
//! mutual TLS through `gateway::port::Upstream`. It sits apart from both so
//! that neither names the other.

use bcd_proto::v1::{
    AttestationChallenge, AttestationRequest, JoinRequest, JoinResponse, RenewRequest,
    RenewResponse,
};
use tonic::Status;

/// The join service as a gateway reaches it.
#[tonic::async_trait]
pub trait GatewayServices: Send + Sync + std::fmt::Debug {
    async fn join(&self, request: JoinRequest) -> Result<JoinResponse, Status>;

    /// The first round trip of a join by TPM attestation
    /// (`bcd_proto::attest`).
    async fn begin_attestation(
        &self,
        request: AttestationRequest,
    ) -> Result<AttestationChallenge, Status>;

    /// A renewal by the node that presented `node_cert_der` to this
    /// gateway.
    async fn renew(
        &self,
        node_cert_der: Vec<u8>,
        request: RenewRequest,
    ) -> Result<RenewResponse, Status>;

    /// A secret request by the node that presented `node_cert_der` to this
    /// gateway (`api::secrets`).
    async fn fetch_secret(
        &self,
        node_cert_der: Vec<u8>,
        request: bcd_proto::v1::SecretRequest,
    ) -> Result<bcd_proto::v1::SecretDelivery, Status>;
}
