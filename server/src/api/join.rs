//! The join service: turns a join token and a certificate request into a
//! node with a certificate (`Join`), or, with a proof of a previous
//! identity (`bcd_proto::reenrol`), into that node again at its next
//! identity generation with its earlier certificates revoked; renews
//! certificates for nodes that prove their current one (`Renew`), and
//! hands releases to nodes (`FetchReleaseChunks`, streamed; the
//! deprecated `FetchRelease`, whole and capped: `super::releases`). It
//! holds the fleet CA.

use std::sync::Arc;
use std::time::Duration;

use bc_store::Refusal;
use bc_store::nodes::{IssuedCert, REENROLLED};
use bc_store::tokens::{JoinInput, PreviousProof};
use bcd_proto::tls::PeerInfo;
use bcd_proto::token::{JoinToken, MalformedToken};
use bcd_proto::v1::{
    FetchReleaseRequest, FetchReleaseResponse, JoinRequest, JoinResponse, ReleaseChunk,
    RenewRequest, RenewResponse, ReplayFloors, join_server::Join,
};
use ring::signature::Ed25519KeyPair;
use tonic::{Request, Response, Status};
use tracing::info;

use super::status::{Turned, bad_request, status, turned};
use crate::pki::Ca;
use crate::pki::ca::IssueError;

#[derive(Debug, Clone, Copy)]
pub struct CertPolicy {
    pub node_ttl: Duration,
    pub ramdisk_ttl: Duration,
}

impl Default for CertPolicy {
    fn default() -> Self {
        CertPolicy {
            node_ttl: Duration::from_secs(24 * 3600),
            ramdisk_ttl: Duration::from_secs(2 * 3600),
        }
    }
}

impl CertPolicy {
    pub fn ttl(&self, ramdisk: bool) -> Duration {
        if ramdisk {
            self.ramdisk_ttl
        } else {
            self.node_ttl
        }
    }
}

#[derive(Debug, Clone)]
pub struct JoinService {
    pub store: bc_store::Store,
    pub ca: Arc<Ca>,
    pub policy: CertPolicy,
    pub worker_keys: Arc<Vec<Vec<u8>>>,
    /// Signs the statement of the revocations a re-enrolment makes.
    pub worker_key: Arc<Ed25519KeyPair>,
    pub release_keys: Arc<Vec<Vec<u8>>>,
}

/// Issues a node certificate inside the store's join or renewal
/// transaction, at the store's now.
fn issue(
    ca: &Ca,
    csr: &[u8],
    node_id: &str,
    now: i64,
    ttl: Duration,
) -> Result<IssuedCert, Refusal> {
    let c = ca
        .issue_node_cert(csr, node_id, now, ttl)
        .map_err(|e| match e {
            IssueError::Csr(e) => Refusal::BadRequest(e.to_string()),
            IssueError::Ca(e) => Refusal::Internal(format!("{e:#}")),
        })?;
    Ok(IssuedCert {
        fingerprint: bcd_proto::fingerprint(&c.der),
        der: c.der.to_vec(),
        serial: c.serial,
        not_before_ms: c.not_before_ms,
        not_after_ms: c.not_after_ms,
    })
}

fn peer_fingerprint<T>(r: &Request<T>) -> Option<String> {
    r.extensions()
        .get::<PeerInfo>()
        .and_then(|p| p.cert_fingerprint.clone())
}

#[tonic::async_trait]
impl Join for JoinService {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let r = request.into_inner();
        let (id, secret) = JoinToken::split_credential(&r.token)
            .ok_or_else(|| bad_request(MalformedToken.to_string()))?;
        let ttl = self.policy.ttl(r.ramdisk);
        let input = JoinInput {
            token_id: id.to_string(),
            secret_sha256: bcd_proto::fingerprint(secret.as_bytes()),
            hostname: r.hostname.chars().take(253).collect(),
            ramdisk: r.ramdisk,
        };
        let proof = r
            .previous
            .as_ref()
            .map(bcd_proto::reenrol::proof)
            .transpose()
            .map_err(|e| bad_request(e.to_string()))?;
        let proof = proof.map(|p| PreviousProof {
            message: bcd_proto::reenrol::statement(&p.node_id, id, &r.csr_der),
            node_id: p.node_id,
            signature: p.signature,
            verify: crate::pki::ca::verify_node_signature,
        });
        let (ca, csr) = (self.ca.clone(), r.csr_der);
        let issue_cert: bc_store::tokens::IssueCert =
            Box::new(move |node, now| issue(&ca, &csr, node, now, ttl));
        let joined = match &proof {
            None => self.store.join(&input, issue_cert).await,
            Some(proof) => {
                let seal = crate::pki::seal::statement_sealer(self.worker_key.clone());
                self.store.reenrol(&input, proof, issue_cert, seal).await
            }
        }
        .map_err(status)?;
        let cert = joined.cert;
        if proof.is_some() {
            info!(
                node = %joined.node_id,
                serial = %cert.serial,
                generation = joined.identity_generation,
                reason = REENROLLED,
                "node re-enrolled; its earlier certificates are revoked"
            );
        } else {
            info!(node = %joined.node_id, serial = %cert.serial, "node joined");
        }
        Ok(Response::new(JoinResponse {
            node_id: joined.node_id,
            cert_der: cert.der,
            ca_der: self.ca.cert.to_vec(),
            cert_serial: cert.serial,
            not_after_ms: cert.not_after_ms,
            server_time_ms: joined.now_ms,
            worker_keys: self.worker_keys.as_ref().clone(),
            release_keys: self.release_keys.as_ref().clone(),
            identity_generation: joined.identity_generation,
            floors: Some(ReplayFloors {
                command_seq: joined.command_seq_floor,
                spec_generation: joined.spec_generation_floor,
            }),
        }))
    }

    async fn fetch_release(
        &self,
        request: Request<FetchReleaseRequest>,
    ) -> Result<Response<FetchReleaseResponse>, Status> {
        let fingerprint = peer_fingerprint(&request).ok_or_else(|| {
            turned(Turned::NoCertificate(
                "releases are for nodes: present the node certificate",
            ))
        })?;
        let sequence = request.into_inner().sequence;
        self.store.check_cert(&fingerprint).await.map_err(status)?;
        super::releases::whole_release(&self.store, sequence)
            .await
            .map(Response::new)
    }

    type FetchReleaseChunksStream =
        tokio_stream::wrappers::ReceiverStream<Result<ReleaseChunk, Status>>;

    async fn fetch_release_chunks(
        &self,
        request: Request<FetchReleaseRequest>,
    ) -> Result<Response<Self::FetchReleaseChunksStream>, Status> {
        let fingerprint = peer_fingerprint(&request).ok_or_else(|| {
            turned(Turned::NoCertificate(
                "releases are for nodes: present the node certificate",
            ))
        })?;
        let r = request.into_inner();
        self.store.check_cert(&fingerprint).await.map_err(status)?;
        super::releases::stream_release(self.store.clone(), r.sequence, r.offset)
            .await
            .map(Response::new)
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let fingerprint = peer_fingerprint(&request).ok_or_else(|| {
            turned(Turned::NoCertificate(
                "renewal needs the current node certificate",
            ))
        })?;
        let csr = request.into_inner().csr_der;
        let (ca, policy) = (self.ca.clone(), self.policy);
        let renewed = self
            .store
            .renew(
                &fingerprint,
                Box::new(move |node, now, ramdisk| {
                    issue(&ca, &csr, node, now, policy.ttl(ramdisk))
                }),
            )
            .await
            .map_err(status)?;
        let cert = renewed.cert;
        info!(node = %renewed.node_id, serial = %cert.serial, "certificate renewed");
        Ok(Response::new(RenewResponse {
            cert_der: cert.der,
            cert_serial: cert.serial,
            not_after_ms: cert.not_after_ms,
            server_time_ms: renewed.now_ms,
        }))
    }
}
