//! The GatewayServices port as the key-holding process serves it, for
//! gateway processes that hold no key.
//!
//! `Certify` takes a gateway's credential (its name and secret, whose
//! SHA-256 the store keeps: `bc_store::gateways`) and a CSR for a key the
//! gateway made in memory, and issues a serving certificate naming it.
//! `Join` and `Renew` take that certificate as the TLS client certificate:
//! its name must have a live credential that was added no later than the
//! certificate was issued. A relayed renewal must prove possession of the
//! node's current key (`Proof::Required`), so a gateway cannot mint a
//! certificate for a key of its own; a relayed join spends the node's
//! token as a direct one would.

use bc_store::GatewayId;
use bc_store::NodeId;
use std::sync::Arc;

use bc_store::gateways::valid_name;
use bcd_proto::tls::PeerInfo;
use bcd_proto::v1::{
    self, AttestationChallenge, AttestationRequest, CertifyRequest, CertifyResponse,
    ForwardedRenew, JoinRequest, JoinResponse, RefusalReason, RenewResponse,
    gateway_services_server::GatewayServices as Port,
};
use tonic::{Code, Request, Response, Status};
use tracing::{info, warn};

use super::join::{CERTIFICATE_FORGED, JoinService, Proof};
use super::status::{bad_request, typed, unavailable};
use crate::pki::ca::{GATEWAY_BACKDATE_MS, GATEWAY_URI, IssueError};
use crate::services::GatewayServices;

/// Extra names a gateway may ask its certificate for, and their length.
const MAX_NAMES: usize = 16;
const MAX_NAME_LEN: usize = 253;

#[derive(Debug, Clone)]
pub struct GatewayPort {
    pub join: JoinService,
    /// Tunnels asked of the gateways that hold no key.
    pub tunnels: Arc<super::tunnels::RemoteTunnels>,
}

type RelayStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<bcd_proto::v1::TunnelRelayFrame, Status>> + Send>,
>;

fn denied(message: impl Into<String>) -> Status {
    typed(
        Code::PermissionDenied,
        RefusalReason::UnknownToken,
        message,
        vec![],
    )
}

fn unauthenticated(message: impl Into<String>) -> Status {
    typed(
        Code::Unauthenticated,
        RefusalReason::NoCertificate,
        message,
        vec![],
    )
}

impl GatewayPort {
    /// The gateway the request's client certificate names, if its
    /// credential still admits that certificate.
    async fn gateway<T>(&self, r: &Request<T>) -> Result<String, Status> {
        let cert: Arc<_> = r
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.cert.clone())
            .ok_or_else(|| unauthenticated("the gateway services need a gateway's certificate"))?;
        let (name, not_before_ms) = crate::certs::named(&cert, GATEWAY_URI)
            .ok_or_else(|| unauthenticated("this certificate names no gateway"))?;
        let credential = self
            .join
            .store
            .gateway_credential(&GatewayId::from(&name))
            .await
            .map_err(unavailable)?;
        match credential {
            // A certificate's times are whole seconds: the issue time is
            // known to within one.
            Some(c) if c.admits(not_before_ms + GATEWAY_BACKDATE_MS + 999) => Ok(name),
            _ => {
                warn!(gateway = %name, not_before_ms, credential = ?credential.as_ref().map(|c| (c.created_ms, c.revoked_ms)), "a gateway certificate without a live credential was refused");
                Err(unauthenticated(format!(
                    "gateway {name}'s credential was revoked or replaced: add it again \
                     (better-compute gateways add {name}) and restart that gateway"
                )))
            }
        }
    }
}

#[tonic::async_trait]
impl Port for GatewayPort {
    type TunnelRequestsStream =
        tokio_stream::wrappers::ReceiverStream<Result<bcd_proto::v1::TunnelOpenRequest, Status>>;

    async fn tunnel_requests(
        &self,
        request: Request<bcd_proto::v1::TunnelRequestsHello>,
    ) -> Result<Response<Self::TunnelRequestsStream>, Status> {
        let name = self.gateway(&request).await?;
        let id = request.into_inner().gateway_id;
        info!(gateway = %name, %id, "a gateway takes tunnel requests");
        let mut requests = self.tunnels.register(&id);
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(r) = requests.recv().await {
                if tx.send(Ok(r)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    type TunnelRelayStream = RelayStream;

    async fn tunnel_relay(
        &self,
        request: Request<tonic::Streaming<bcd_proto::v1::TunnelRelayFrame>>,
    ) -> Result<Response<RelayStream>, Status> {
        self.gateway(&request).await?;
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            Status::invalid_argument("a tunnel relay starts with its first frame")
        })?;
        Ok(Response::new(
            match self.tunnels.answered(first, inbound)? {
                Some(down) => Box::pin(tokio_stream::wrappers::ReceiverStream::new(down)),
                None => Box::pin(tokio_stream::empty()),
            },
        ))
    }

    async fn certify(
        &self,
        request: Request<CertifyRequest>,
    ) -> Result<Response<CertifyResponse>, Status> {
        let r = request.into_inner();
        if !valid_name(&r.name) {
            return Err(bad_request(
                "a gateway name is 1 to 63 of a-z, 0-9 and -, not starting with -",
            ));
        }
        if r.names.len() > MAX_NAMES
            || r.names
                .iter()
                .any(|n| n.is_empty() || n.len() > MAX_NAME_LEN)
        {
            return Err(bad_request(format!(
                "a gateway certificate takes at most {MAX_NAMES} extra names of at most \
                 {MAX_NAME_LEN} characters"
            )));
        }
        let store = &self.join.store;
        let credential = store
            .gateway_credential(&GatewayId::from(&r.name))
            .await
            .map_err(unavailable)?;
        // The digest is keyed by the fleet CA: a credential row planted
        // with a secret of its own certifies nothing.
        let digest = self.join.ca.secret_digest().of(&r.secret);
        let live = credential.as_ref().filter(|c| c.revoked_ms.is_none());
        if live.is_some_and(|c| c.secret_sha256 == bcd_proto::fingerprint(r.secret.as_bytes())) {
            warn!(gateway = %r.name, "a gateway credential from before keyed digests was refused");
            return Err(denied(format!(
                "the credential of gateway {} was added before gateway credentials were keyed to \
                 the fleet CA and no longer certifies: add it again (better-compute gateways \
                 revoke {}, then better-compute gateways add {} --upstream URL --out FILE) and \
                 restart that gateway with the new file",
                r.name, r.name, r.name
            )));
        }
        if live.is_none_or(|c| c.secret_sha256 != digest) {
            warn!(gateway = %r.name, "a gateway credential was refused");
            return Err(denied(format!(
                "the credential of gateway {} is not known to this server (revoked, replaced or \
                 mistyped): add one with better-compute gateways add {}",
                r.name, r.name
            )));
        }
        let now = store.now().await.map_err(unavailable)?;
        let cert = self
            .join
            .ca
            .issue_gateway_cert(&r.csr_der, &r.name, &r.names, now)
            .map_err(|e| match e {
                IssueError::Csr(e) => bad_request(e.to_string()),
                IssueError::Ca(e) => {
                    warn!(error = %bcd_sys::error::chain(&e), "cannot issue a gateway certificate");
                    bad_request(
                        "cannot issue a certificate for these names: give DNS names or IP \
                         addresses",
                    )
                }
            })?;
        // Recorded before it is handed over, so that a revocation can name
        // it in the list nodes are handed.
        let leaf = cert
            .chain
            .first()
            .ok_or_else(|| Status::internal("an issued chain has a certificate"))?;
        store
            .record_gateway_cert(&bc_store::gateways::GatewayCert {
                name: GatewayId::from(r.name.clone()),
                sha256: bcd_proto::fingerprint(leaf),
                issued_ms: now,
                not_after_ms: cert.not_after_ms,
            })
            .await
            .map_err(unavailable)?;
        info!(gateway = %r.name, "gateway certificate issued");
        Ok(Response::new(CertifyResponse {
            chain_der: cert.chain.into_iter().map(|c| c.to_vec()).collect(),
            not_after_ms: cert.not_after_ms,
            server_time_ms: now,
        }))
    }

    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        self.gateway(&request).await?;
        self.join
            .join_via(request.into_inner(), super::join::Via::Gateway)
            .await
            .map(Response::new)
    }

    async fn begin_attestation(
        &self,
        request: Request<AttestationRequest>,
    ) -> Result<Response<AttestationChallenge>, Status> {
        self.gateway(&request).await?;
        GatewayServices::begin_attestation(&self.join, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn renew(
        &self,
        request: Request<ForwardedRenew>,
    ) -> Result<Response<RenewResponse>, Status> {
        let gateway = self.gateway(&request).await?;
        let r = request.into_inner();
        let renewal = r
            .request
            .ok_or_else(|| bad_request("a forwarded renewal carries the node's request"))?;
        self.issued_here(&gateway, &r.node_cert_der, "a renewal")
            .await?;
        self.join
            .renew_with(&r.node_cert_der, renewal, Proof::Required)
            .await
            .inspect_err(|e| {
                if e.code() == Code::InvalidArgument {
                    warn!(%gateway, error = %e.message(), "a relayed renewal was refused");
                }
            })
            .map(Response::new)
    }

    async fn fetch_secret(
        &self,
        request: Request<v1::ForwardedSecret>,
    ) -> Result<Response<v1::SecretDelivery>, Status> {
        let gateway = self.gateway(&request).await?;
        let r = request.into_inner();
        let secret = r
            .request
            .ok_or_else(|| bad_request("a forwarded secret request carries the node's request"))?;
        self.issued_here(&gateway, &r.node_cert_der, "a secret request")
            .await?;
        self.join
            .deliver_secret(&r.node_cert_der, secret)
            .await
            .inspect_err(|e| {
                if e.code() == Code::InvalidArgument {
                    warn!(%gateway, error = %e.message(), "a relayed secret request was refused");
                }
            })
            .map(Response::new)
    }
}

impl GatewayPort {
    /// A node certificate a gateway relayed: one the fleet CA did not
    /// issue, from an authenticated gateway, was forged or planted in the
    /// store by it, and is recorded against the node it names.
    async fn issued_here(&self, gateway: &str, cert: &[u8], what: &str) -> Result<(), Status> {
        let Err(refused) = self.join.issued_here(cert) else {
            return Ok(());
        };
        if let Some((node, _)) = crate::certs::named(cert, "urn:bc:node:") {
            let detail = format!(
                "gateway {gateway} relayed {what} with a certificate the fleet CA did not issue \
                 (SHA-256 {})",
                bcd_proto::fingerprint(cert)
            );
            if let Err(e) = self
                .join
                .store
                .publish_fleet_event(CERTIFICATE_FORGED, &NodeId::from(&node), &detail)
                .await
            {
                warn!(error = %e, %node, "cannot record a forged certificate");
            }
        }
        Err(refused)
    }
}
