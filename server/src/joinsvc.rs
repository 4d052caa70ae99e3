//! The join service: turns a join token and a certificate request into a
//! node with a certificate; renews certificates for nodes that prove their
//! current one.

use std::sync::Arc;
use std::time::Duration;

use bcd_proto::tls::PeerInfo;
use bcd_proto::token::{JoinToken, MalformedToken};
use bcd_proto::v1::{
    FetchReleaseRequest, FetchReleaseResponse, JoinRequest, JoinResponse, RenewRequest,
    RenewResponse, join_server::Join,
};
use tonic::{Request, Response, Status};
use tracing::info;

use crate::ca::{Ca, IssueError};
use crate::gateway::refusal_status;
use crate::store::{IssuedCert, Store, TxError};

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

#[derive(Debug, Clone)]
pub struct JoinService {
    pub store: Store,
    pub ca: Arc<Ca>,
    pub policy: CertPolicy,
    pub worker_keys: Arc<Vec<Vec<u8>>>,
    pub release_keys: Arc<Vec<Vec<u8>>>,
}

fn issue(
    ca: &Ca,
    csr: &[u8],
    node_id: &str,
    now: i64,
    ttl: Duration,
) -> Result<IssuedCert, TxError> {
    let c = ca
        .issue_node_cert(csr, node_id, now, ttl)
        .map_err(|e| match e {
            IssueError::Csr(e) => {
                TxError::Refused(crate::store::Refusal::BadRequest(e.to_string()))
            }
            IssueError::Ca(e) => {
                TxError::Refused(crate::store::Refusal::Internal(format!("{e:#}")))
            }
        })?;
    Ok(IssuedCert {
        fingerprint: bcd_proto::fingerprint(&c.der),
        der: c.der.to_vec(),
        serial: c.serial,
        not_before_ms: c.not_before_ms,
        not_after_ms: c.not_after_ms,
    })
}

#[tonic::async_trait]
impl Join for JoinService {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let r = request.into_inner();
        let (id, secret) = JoinToken::split_credential(&r.token)
            .ok_or_else(|| Status::invalid_argument(MalformedToken.to_string()))?;
        let (id, secret_sha) = (id.to_string(), bcd_proto::fingerprint(secret.as_bytes()));
        let ttl = if r.ramdisk {
            self.policy.ramdisk_ttl
        } else {
            self.policy.node_ttl
        };
        let hostname: String = r.hostname.chars().take(253).collect();
        let ca = self.ca.clone();
        let csr = r.csr_der;
        let ramdisk = r.ramdisk;
        let (node_id, cert, now) = self
            .store
            .run(move |s| {
                s.join(&id, &secret_sha, &hostname, ramdisk, |node, now| {
                    issue(&ca, &csr, node, now, ttl)
                })
            })
            .await
            .map_err(refusal_status)?;
        info!(node = %node_id, serial = %cert.serial, "node joined");
        Ok(Response::new(JoinResponse {
            node_id,
            cert_der: cert.der,
            ca_der: self.ca.cert.to_vec(),
            cert_serial: cert.serial,
            not_after_ms: cert.not_after_ms,
            server_time_ms: now,
            worker_keys: self.worker_keys.as_ref().clone(),
            release_keys: self.release_keys.as_ref().clone(),
            identity_generation: 1,
        }))
    }

    async fn fetch_release(
        &self,
        request: Request<FetchReleaseRequest>,
    ) -> Result<Response<FetchReleaseResponse>, Status> {
        let fingerprint = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.cert_fingerprint.clone())
            .ok_or_else(|| {
                Status::unauthenticated("releases are for nodes: present the node certificate")
            })?;
        let sequence = request.into_inner().sequence;
        let found = self
            .store
            .run(move |s| {
                s.check_cert(&fingerprint)?;
                Ok::<_, TxError>(s.release(sequence)?)
            })
            .await
            .map_err(refusal_status)?;
        let (signed_manifest, binary) = found
            .ok_or_else(|| Status::not_found(format!("no release with sequence {sequence}")))?;
        Ok(Response::new(FetchReleaseResponse {
            signed_manifest,
            binary,
        }))
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let fingerprint = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.cert_fingerprint.clone())
            .ok_or_else(|| Status::unauthenticated("renewal needs the current node certificate"))?;
        let csr = request.into_inner().csr_der;
        let (ca, policy) = (self.ca.clone(), self.policy);
        let (node_id, cert, now) = self
            .store
            .run(move |s| {
                s.renew(&fingerprint, |node, now, ramdisk| {
                    let ttl = if ramdisk {
                        policy.ramdisk_ttl
                    } else {
                        policy.node_ttl
                    };
                    issue(&ca, &csr, node, now, ttl)
                })
            })
            .await
            .map_err(refusal_status)?;
        info!(node = %node_id, serial = %cert.serial, "certificate renewed");
        Ok(Response::new(RenewResponse {
            cert_der: cert.der,
            cert_serial: cert.serial,
            not_after_ms: cert.not_after_ms,
            server_time_ms: now,
        }))
    }
}
