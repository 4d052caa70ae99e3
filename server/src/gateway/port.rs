//! What a gateway needs from the process that holds the keys, and the
//! node-facing join service built on it.
//!
//! A gateway holds no CA and no signing key. A node's join and renewal
//! reach the join service through [`GatewayServices`]: in the same process
//! when `serve` runs every role, over mutual TLS to the key-holding process
//! when it runs as a gateway only ([`Upstream`]). The join service checks
//! a renewal's proof of possession by the node's current key itself
//! (`bcd_proto::renew`), so a gateway that forwards a renewal cannot mint a
//! certificate for a key of its own. Release downloads need no key: the
//! gateway hands out the signed bytes the store keeps.

use bc_store::ReleaseSeq;
use std::sync::Arc;

use bc_store::GatewayStore;
use bcd_proto::tls::PeerInfo;
use bcd_proto::v1::{
    self, AttestationChallenge, AttestationRequest, FetchReleaseRequest, FetchReleaseResponse,
    ForwardedRenew, JoinRequest, JoinResponse, ReleaseChunk, RenewRequest, RenewResponse,
    gateway_services_client::GatewayServicesClient, join_server::Join,
};
use tonic::{Request, Response, Status};

use super::credential::UpstreamLink;
use crate::api::status::{Turned, status, turned};
pub use crate::services::GatewayServices;

/// The join service nodes call on a gateway's listener.
#[derive(Debug, Clone)]
pub struct NodeJoin {
    pub services: Arc<dyn GatewayServices>,
    pub store: GatewayStore,
}

fn peer(r: &Request<impl Sized>) -> Option<&PeerInfo> {
    r.extensions().get::<PeerInfo>()
}

#[tonic::async_trait]
impl Join for NodeJoin {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        self.services
            .join(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn begin_attestation(
        &self,
        request: Request<AttestationRequest>,
    ) -> Result<Response<AttestationChallenge>, Status> {
        self.services
            .begin_attestation(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        // The certificate the TLS session presented; else (x509pop: one
        // that ran out cannot be presented) the one the request carries,
        // which is taken only with the proof made by its key.
        let presented = peer(&request).and_then(|p| p.cert.clone());
        let r = request.into_inner();
        let cert = match presented {
            Some(cert) => cert.to_vec(),
            None => bcd_proto::renew::expired_cert(&r)
                .map_err(|e| crate::api::status::bad_request(e.to_string()))?
                .map(<[u8]>::to_vec)
                .ok_or_else(|| {
                    turned(Turned::NoCertificate(
                        "renewal needs the current node certificate",
                    ))
                })?,
        };
        self.services.renew(cert, r).await.map(Response::new)
    }

    async fn fetch_secret(
        &self,
        request: Request<v1::SecretRequest>,
    ) -> Result<Response<v1::SecretDelivery>, Status> {
        let cert = peer(&request).and_then(|p| p.cert.clone()).ok_or_else(|| {
            turned(Turned::NoCertificate(
                "secrets are for nodes: present the node certificate",
            ))
        })?;
        self.services
            .fetch_secret(cert.to_vec(), request.into_inner())
            .await
            .map(Response::new)
    }

    async fn fetch_release(
        &self,
        request: Request<FetchReleaseRequest>,
    ) -> Result<Response<FetchReleaseResponse>, Status> {
        self.node_cert(&request).await?;
        super::releases::whole_release(&self.store, ReleaseSeq::new(request.into_inner().sequence))
            .await
            .map(Response::new)
    }

    type FetchReleaseChunksStream =
        tokio_stream::wrappers::ReceiverStream<Result<ReleaseChunk, Status>>;

    async fn fetch_release_chunks(
        &self,
        request: Request<FetchReleaseRequest>,
    ) -> Result<Response<Self::FetchReleaseChunksStream>, Status> {
        self.node_cert(&request).await?;
        let r = request.into_inner();
        super::releases::stream_release(self.store.clone(), ReleaseSeq::new(r.sequence), r.offset)
            .await
            .map(Response::new)
    }

    type FetchImageStream = tokio_stream::wrappers::ReceiverStream<Result<v1::ImageChunk, Status>>;

    async fn fetch_image(
        &self,
        request: Request<v1::FetchImageRequest>,
    ) -> Result<Response<Self::FetchImageStream>, Status> {
        self.node_cert(&request).await?;
        let r = request.into_inner();
        super::images::stream_image(self.store.clone(), &r.image_id)
            .await
            .map(Response::new)
    }
}

impl NodeJoin {
    /// Releases and images are for nodes: the caller presents a valid
    /// node certificate.
    async fn node_cert<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let fingerprint = peer(request)
            .and_then(|p| p.cert_fingerprint.clone())
            .ok_or_else(|| {
                turned(Turned::NoCertificate(
                    "releases and images are for nodes: present the node certificate",
                ))
            })?;
        self.store.check_cert(&fingerprint).await.map_err(status)?;
        Ok(())
    }
}

/// The key-holding process's GatewayServices port, over mutual TLS with
/// this gateway's certificate.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub link: UpstreamLink,
}

/// A failure to reach the port, as the node sees it: the join service is
/// unreachable for now and the node retries. A status the port itself sent
/// (a refusal with its typed reason) goes to the node as it came.
fn relayed(s: Status) -> Status {
    if s.details().is_empty() && matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown)
    {
        tracing::warn!(error = %s.message(), "the join service is unreachable");
        return bcd_proto::refusal::status(
            tonic::Code::Unavailable,
            v1::RefusalReason::Unavailable,
            "the join service is unreachable from this gateway; retry",
            vec![],
        );
    }
    s
}

#[tonic::async_trait]
impl GatewayServices for Upstream {
    async fn join(&self, request: JoinRequest) -> Result<JoinResponse, Status> {
        GatewayServicesClient::new(self.link.channel())
            .join(request)
            .await
            .map(Response::into_inner)
            .map_err(relayed)
    }

    async fn begin_attestation(
        &self,
        request: AttestationRequest,
    ) -> Result<AttestationChallenge, Status> {
        GatewayServicesClient::new(self.link.channel())
            .begin_attestation(request)
            .await
            .map(Response::into_inner)
            .map_err(relayed)
    }

    async fn renew(
        &self,
        node_cert_der: Vec<u8>,
        request: RenewRequest,
    ) -> Result<RenewResponse, Status> {
        GatewayServicesClient::new(self.link.channel())
            .renew(ForwardedRenew {
                node_cert_der,
                request: Some(request),
            })
            .await
            .map(Response::into_inner)
            .map_err(relayed)
    }

    async fn fetch_secret(
        &self,
        node_cert_der: Vec<u8>,
        request: v1::SecretRequest,
    ) -> Result<v1::SecretDelivery, Status> {
        GatewayServicesClient::new(self.link.channel())
            .fetch_secret(v1::ForwardedSecret {
                node_cert_der,
                request: Some(request),
            })
            .await
            .map(Response::into_inner)
            .map_err(relayed)
    }
}
