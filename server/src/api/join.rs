//! The join service: turns a join token and a certificate request into a
//! node with a certificate (`Join`), or, with a proof of a previous
//! identity (`bcd_proto::reenrol`), into that node again at its next
//! identity generation with its earlier certificates revoked; renews
//! certificates for nodes that prove their current one (`Renew`). It holds
//! the fleet CA, and gateways reach it through their GatewayServices port
//! (`crate::services`): in this process, or over mutual TLS
//! ([`crate::api::gateway_port`]).

use bc_store::{NodeId, TokenId};
use std::sync::Arc;
use std::time::Duration;

use bc_store::Refusal;
use bc_store::machines::Enrolled;
use bc_store::nodes::{IssuedCert, REENROLLED};
use bc_store::tokens::{JoinInput, PreviousProof};
use bcd_proto::token::{JoinToken, MalformedToken};
use bcd_proto::v1::{
    AttestationChallenge, AttestationRequest, JoinRequest, JoinResponse, RenewRequest,
    RenewResponse, ReplayFloors,
};
use ring::signature::Ed25519KeyPair;
use tonic::Status;
use tracing::{info, warn};

use super::status::{bad_request, status, unavailable};
use crate::certs::verify_node_signature;
use crate::pki::Ca;
use crate::pki::ca::IssueError;
use crate::services::GatewayServices;

#[derive(Debug, Clone, Copy)]
pub struct CertPolicy {
    pub node_ttl: Duration,
    pub ramdisk_ttl: Duration,
    /// The x509pop attestor: a certificate that ran out at most
    /// [`bcd_proto::renew::X509POP_WINDOW_MS`] ago renews when the node
    /// proves its key.
    pub x509pop: bool,
    /// How long a signed list of revoked gateway certificates holds (the
    /// controller that signs it is `controllers::gateway_revocations`).
    pub gateway_revocations_life: Duration,
}

/// How long a signed list of revoked gateway certificates holds by
/// default: past it, a node leaves a gateway that handed no newer one.
pub const GATEWAY_REVOCATIONS_LIFE: Duration = Duration::from_secs(600);

impl Default for CertPolicy {
    fn default() -> Self {
        CertPolicy {
            node_ttl: Duration::from_secs(24 * 3600),
            ramdisk_ttl: Duration::from_secs(2 * 3600),
            x509pop: false,
            gateway_revocations_life: GATEWAY_REVOCATIONS_LIFE,
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
    /// Netboot image keys (`serve --image-pubkey`): the images a node
    /// boots by `boot.kexec image=`.
    pub image_keys: Arc<Vec<Vec<u8>>>,
    /// What `bct2` tokens are sealed to (derived from the CA).
    pub seal: Arc<crate::pki::token_seal::TokenSealKey>,
    /// What the secret broker seals values under (`api::secrets`).
    pub secrets_key: Arc<crate::pki::secrets::SecretsKey>,
    /// Signs the broker's deliveries (nodes hold its JWKS).
    pub tickets: Arc<crate::pki::tickets::TicketKey>,
    /// Each node's budget of secret requests.
    pub secret_requests: Arc<super::budget::PerNode>,
}

/// Which way a join reached the join service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A gateway in this process: the key holder's own listener.
    Listener,
    /// A gateway in another process, through the GatewayServices port: it
    /// holds no key, and must not see a token it could spend.
    Gateway,
}

/// The refusal of a plain (`bct1`) token relayed by a gateway.
pub const PLAIN_TOKEN_RELAYED: &str = "this join came through a gateway with a bct1 join token, \
     whose secret the gateway could read and spend: create a new token (better-compute tokens \
     create prints a bct2 one, sealed to the join service) and join with it, or join with this \
     one through the key holder's own listener";

/// Issues a node certificate inside the store's join or renewal
/// transaction, at the store's now.
fn issue(
    ca: &Ca,
    csr: &[u8],
    node_id: &str,
    ak_name: Option<&[u8]>,
    now: i64,
    ttl: Duration,
) -> Result<IssuedCert, Refusal> {
    issued(ca.issue_node_cert(csr, node_id, ak_name, now, ttl))
}

fn issued(c: Result<crate::pki::ca::NodeCert, IssueError>) -> Result<IssuedCert, Refusal> {
    let c = c.map_err(|e| match e {
        IssueError::Csr(e) => Refusal::BadRequest(e.to_string()),
        IssueError::Ca(e) => Refusal::Internal(bcd_sys::error::chain(&e)),
    })?;
    Ok(IssuedCert {
        fingerprint: bcd_proto::fingerprint(&c.der),
        der: c.der.to_vec(),
        serial: c.serial,
        not_before_ms: c.not_before_ms,
        not_after_ms: c.not_after_ms,
    })
}

/// A renewal's refusal: an expired certificate's says what the node can
/// do about it (with x509pop the window has passed; without it the
/// control plane does not take expired certificates at all).
fn expired_refusal(e: bc_store::TxError, x509pop: bool) -> Status {
    if e.refusal() != Some(&Refusal::Expired) {
        return status(e);
    }
    let why = if x509pop {
        "the node certificate ran out more than 7 days ago"
    } else {
        "the node certificate ran out, and this control plane renews no expired certificate \
         (start it with --x509pop to let nodes renew by their old key within 7 days)"
    };
    let (code, reason) = super::status::classify(&Refusal::Expired);
    super::status::typed(
        code,
        reason,
        format!("{why}: join again: bcd join --reset --yes, then bcd join"),
        vec![],
    )
}

/// Whether a renewal must carry its proof of possession: one relayed by a
/// gateway in another process must; one whose TLS session ended in this
/// process (the handshake proved the key) may come without it, from a node
/// older than the proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    Required,
    IfPresent,
}

#[tonic::async_trait]
impl GatewayServices for JoinService {
    async fn join(&self, r: JoinRequest) -> Result<JoinResponse, Status> {
        self.join_via(r, Via::Listener).await
    }

    async fn begin_attestation(
        &self,
        r: AttestationRequest,
    ) -> Result<AttestationChallenge, Status> {
        let now = self.store.now().await.map_err(unavailable)?;
        super::attest::challenge(&self.ca.challenge_key(), &r, now).map_err(|e| {
            warn!(error = %e, "an attestation was refused at its start");
            bad_request(e.to_string())
        })
    }

    async fn renew(
        &self,
        node_cert_der: Vec<u8>,
        request: RenewRequest,
    ) -> Result<RenewResponse, Status> {
        self.renew_with(&node_cert_der, request, Proof::IfPresent)
            .await
    }

    async fn fetch_secret(
        &self,
        node_cert_der: Vec<u8>,
        request: bcd_proto::v1::SecretRequest,
    ) -> Result<bcd_proto::v1::SecretDelivery, Status> {
        self.deliver_secret(&node_cert_der, request).await
    }
}

impl JoinService {
    /// A join, as it came (`via`): a `bct2` token is opened from its seal
    /// under the request's CSR; a plain one is taken only from this
    /// process's own listener.
    pub async fn join_via(&self, r: JoinRequest, via: Via) -> Result<JoinResponse, Status> {
        let credential = match (r.sealed_token.is_empty(), r.token.is_empty()) {
            (false, false) => {
                return Err(bad_request(
                    "a join carries its token sealed or plain, not both",
                ));
            }
            (false, true) => self.seal.open(&r.sealed_token, &r.csr_der).map_err(|e| {
                bad_request(format!(
                    "{e}: join with a token this control plane printed (better-compute tokens \
                     create)"
                ))
            })?,
            (true, false) if via == Via::Gateway => {
                return Err(bad_request(PLAIN_TOKEN_RELAYED));
            }
            (true, _) => r.token.clone(),
        };
        // A TPM enrolled by its EK, or bound to a node, joins with no token.
        let tokenless = credential.is_empty() && r.tpm.is_some();
        let (id, secret) = if tokenless {
            ("", "")
        } else {
            JoinToken::split_credential(&credential)
                .ok_or_else(|| bad_request(MalformedToken.to_string()))?
        };
        let ttl = self.policy.ttl(r.ramdisk);
        let macs = crate::boot::parse::join_macs(&r.macs).map_err(bad_request)?;
        let input = JoinInput {
            token_id: TokenId::from(id),
            // Keyed by the fleet CA: a token row planted with a secret of
            // its own matches nothing.
            secret_sha256: self.ca.secret_digest().of(secret),
            hostname: r.hostname.chars().take(253).collect(),
            ramdisk: r.ramdisk,
            macs,
        };
        let proof = r
            .previous
            .as_ref()
            .map(bcd_proto::reenrol::proof)
            .transpose()
            .map_err(|e| bad_request(e.to_string()))?;
        let ca_der = self.ca.cert.to_vec();
        let proof = proof.map(|p| PreviousProof {
            message: bcd_proto::reenrol::statement(&p.node_id, id, &r.csr_der),
            node_id: NodeId::from(p.node_id),
            signature: p.signature,
            // A certificate row proves a key only if the fleet CA issued
            // the certificate in it.
            verify: Arc::new(move |cert, message, signature| {
                crate::certs::issued_by(cert, &ca_der)
                    && verify_node_signature(cert, message, signature)
            }),
        });
        let csr_der = r.csr_der.clone();
        let attested = match &r.tpm {
            None => None,
            Some(_) if proof.is_some() => {
                return Err(bad_request(
                    "a join by TPM attestation proves the machine by its TPM, not by a previous \
                     key: send one or the other",
                ));
            }
            Some(t) => {
                let now = self.store.now().await.map_err(unavailable)?;
                let a = super::attest::verify_join(&self.ca.challenge_key(), t, &csr_der, now)
                    .map_err(|e| {
                        warn!(error = %e, "a join by TPM attestation was refused");
                        bad_request(e.to_string())
                    })?;
                let ek_ca = if tokenless {
                    self.enrolled_ek_ca(&a, &t.ek_certificate, &t.ek_chain, now)
                        .await?
                } else {
                    None
                };
                Some((a, ek_ca))
            }
        };
        let (ca, csr) = (self.ca.clone(), r.csr_der);
        let ak_name = attested.as_ref().map(|(a, _)| a.ak_name.clone());
        let issue_cert: bc_store::tokens::IssueCert =
            Box::new(move |node, now| issue(&ca, &csr, node, ak_name.as_deref(), now, ttl));
        let seal = || crate::pki::seal::statement_sealer(self.worker_key.clone());
        let joined = match (&proof, &attested) {
            (None, None) => self.store.join(&input, issue_cert).await,
            (Some(proof), _) => self.store.reenrol(&input, proof, issue_cert, seal()).await,
            (None, Some((a, ek_ca))) if tokenless => {
                let boot_id: String = r.boot_id.chars().take(64).collect();
                // The node its EK is bound to is this machine only if a
                // certificate the fleet CA issued it names the AK this
                // machine just proved: the binding column alone proves
                // nothing.
                let (ca_der, ak_hex) = (self.ca.cert.to_vec(), hex::encode(&a.ak_name));
                let proves: bc_store::machines::ProvesMachine = Box::new(move |node, der| {
                    crate::certs::issued_by(der, &ca_der)
                        && crate::certs::named(der, "urn:bc:node:").is_some_and(|(n, _)| n == node)
                        && crate::certs::named(der, bcd_proto::attest::AK_URN)
                            .is_some_and(|(ak, _)| ak == ak_hex)
                });
                match self
                    .store
                    .join_enrolled(
                        &input,
                        &a.ek_sha256,
                        ek_ca.as_deref(),
                        &boot_id,
                        issue_cert,
                        seal(),
                        proves,
                    )
                    .await
                {
                    Ok(Enrolled::Joined(j)) => Ok(j),
                    Ok(Enrolled::Forged { node_id }) => {
                        warn!(
                            node = %node_id,
                            ek_sha256 = %a.ek_sha256,
                            "a join with no token named a node whose certificates name another TPM"
                        );
                        return Err(status(
                            Refusal::NotReenrolled(
                                node_id.into_string(),
                                format!(
                                    "no certificate of it names this TPM's attestation key (its \
                                     EK binding does not match what the fleet CA certified; \
                                     recorded as {})",
                                    bc_store::machines::EK_BINDING_FORGED
                                ),
                            )
                            .into(),
                        ));
                    }
                    Ok(Enrolled::Quarantined { node_id }) => {
                        warn!(
                            node = %node_id,
                            ek_sha256 = %a.ek_sha256,
                            boot = %boot_id,
                            "node quarantined: machines alternate on its TPM identity"
                        );
                        return Err(super::status::refusal(Refusal::Quarantined(
                            node_id.into_string(),
                        )));
                    }
                    Err(e) => Err(e),
                }
            }
            (None, Some((a, _))) => {
                self.store
                    .join_attested(&input, &a.ek_sha256, issue_cert, seal())
                    .await
            }
        }
        .map_err(status)?;
        let cert = joined.cert;
        if let Some((a, _)) = &attested {
            info!(
                node = %joined.node_id,
                serial = %cert.serial,
                generation = joined.identity_generation,
                ek_sha256 = %a.ek_sha256,
                ak = %hex::encode(&a.ak_name),
                "node joined by TPM attestation"
            );
        } else if proof.is_some() {
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
        let mut response = JoinResponse {
            node_id: joined.node_id.into_string(),
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
            signature: vec![],
            image_keys: self.image_keys.as_ref().clone(),
            image_keys_signature: vec![],
        };
        // Signed by the fleet CA, so a gateway relaying it changes nothing
        // the node keeps; the image keys apart, so a node that predates
        // them still verifies the rest.
        response.signature = self.sign(&bcd_proto::joined::statement(&response, &csr_der))?;
        if !response.image_keys.is_empty() {
            response.image_keys_signature = self.sign(&bcd_proto::joined::image_keys_statement(
                &response, &csr_der,
            ))?;
        }
        Ok(response)
    }

    /// For a join with no token: the enrolled EK CA that certified the
    /// attested EK, if the node sent an EK certificate of that EK and one
    /// did. A certificate that names another EK, or none the server can
    /// read, admits nothing (the EK may still be enrolled by its hash, or
    /// bound to a node).
    async fn enrolled_ek_ca(
        &self,
        attested: &super::attest::Attested,
        ek_certificate: &[u8],
        ek_chain: &[Vec<u8>],
        now: i64,
    ) -> Result<Option<String>, Status> {
        use super::attest;
        if ek_certificate.is_empty() {
            return Ok(None);
        }
        if ek_chain.len() > attest::MAX_INTERMEDIATES
            || ek_chain.iter().any(|c| c.len() > attest::MAX_CHAIN_CERT)
        {
            return Err(bad_request(format!(
                "the join sends {} EK chain certificates of up to {} bytes; a server follows at \
                 most {} of at most {} bytes each: enrol the machine by its EK SHA-256 instead",
                ek_chain.len(),
                ek_chain.iter().map(Vec::len).max().unwrap_or(0),
                attest::MAX_INTERMEDIATES,
                attest::MAX_CHAIN_CERT
            )));
        }
        match attest::ek_from_certificate(ek_certificate) {
            Ok(ek) if attest::ek_hash(&ek) == attested.ek_sha256 => {}
            Ok(_) => {
                warn!(
                    ek_sha256 = %attested.ek_sha256,
                    "a join's EK certificate is for another EK than its TPM attested; ignored"
                );
                return Ok(None);
            }
            Err(e) => {
                info!(ek_sha256 = %attested.ek_sha256, error = %e, "EK certificate not used");
                return Ok(None);
            }
        }
        let cas: Vec<(String, Vec<u8>, Vec<u8>)> = self
            .store
            .list_enrolments()
            .await
            .map_err(unavailable)?
            .into_iter()
            .filter_map(|e| Some((e.id, e.ca_der?, e.ca_intermediates.unwrap_or_default())))
            .collect();
        let by = attest::ek_certified_by(
            ek_certificate,
            cas.iter()
                .map(|(id, der, between)| (id.as_str(), der.as_slice(), between.as_slice())),
            ek_chain,
            now,
        )
        .map_err(|e| bad_request(e.to_string()))?;
        Ok(by.map(str::to_string))
    }

    /// The AK a renewal's certificate names, once the request's next key
    /// is certified by it; `None` for a certificate that names no AK. A
    /// certificate naming an AK renews only so: never to a key outside
    /// that TPM.
    fn next_key(
        &self,
        node_cert_der: &[u8],
        r: &RenewRequest,
        proof: Option<&bcd_proto::renew::Proof>,
    ) -> Result<Option<Vec<u8>>, RenewRefused> {
        let named = crate::certs::named(node_cert_der, bcd_proto::attest::AK_URN)
            .and_then(|(name, _)| hex::decode(name).ok());
        match (named, &r.next_key, proof) {
            (None, None, _) => Ok(None),
            (None, Some(_), _) => Err(RenewRefused::new(
                "renew:key-attestation-unexpected",
                bad_request(
                    "the renewal certifies its next key with a TPM attestation key, but the \
                     certificate names none",
                ),
            )),
            (Some(_), None, _) => {
                warn!("a renewal of a TPM-attested certificate came without a certified next key");
                Err(RenewRefused::new(
                    "renew:key-attestation-missing",
                    bad_request(
                        "the certificate names a TPM attestation key (urn:bc:tpm-ak:): it renews \
                         only with a next key that AK certified, which this request does not \
                         carry (renew:key-attestation-missing): upgrade bcd, or join again: bcd \
                         join --reset --yes --attestor tpm",
                    ),
                ))
            }
            (Some(_), Some(_), None) => Err(RenewRefused::new(
                "renew:proof-missing",
                bad_request(
                    "a renewal with a TPM-certified next key needs its proof of possession",
                ),
            )),
            (Some(ak), Some(k), Some(p)) => {
                super::attest::verify_next_key(&ak, k, &p.statement, &r.csr_der).map_err(|e| {
                    warn!(error = %e, "a TPM renewal was refused");
                    RenewRefused::new("renew:key-attestation-invalid", bad_request(e.to_string()))
                })?;
                Ok(Some(ak))
            }
        }
    }

    /// Signs a response statement with the fleet CA's key.
    fn sign(&self, statement: &[u8]) -> Result<Vec<u8>, Status> {
        self.ca.sign(statement).map_err(|e| {
            tracing::error!(error = %bcd_sys::error::chain(&e), "cannot sign a response");
            super::status::refusal(Refusal::Internal("cannot sign the response".into()))
        })
    }

    /// Renews the certificate `node_cert_der` for the key of the request's
    /// CSR, once the proof of possession (as `rule` asks) holds: made by
    /// that certificate's key, for the node it names, within a minute of
    /// the store's time.
    pub async fn renew_with(
        &self,
        node_cert_der: &[u8],
        r: RenewRequest,
        rule: Proof,
    ) -> Result<RenewResponse, Status> {
        let proof = bcd_proto::renew::proof(&r).map_err(|e| bad_request(e.to_string()))?;
        // The certificate comes from the peer (a relaying gateway, or the
        // request itself for x509pop), and the store's row for it from
        // whoever can write the store: only one the fleet CA issued backs
        // a renewal.
        self.issued_here(node_cert_der)?;
        // x509pop: only a renewal that proved the certificate's key may
        // have it taken after its end.
        let grace_ms = match (&proof, self.policy.x509pop) {
            (Some(_), true) => bcd_proto::renew::X509POP_WINDOW_MS,
            _ => 0,
        };
        match (&proof, rule) {
            (None, Proof::Required) => {
                return Err(bad_request(
                    "a renewal through a gateway needs a proof of possession of the current \
                     node key, which this bcd does not send: upgrade bcd, or let it renew \
                     against the control plane itself",
                ));
            }
            (None, Proof::IfPresent) => {}
            (Some(p), _) => {
                let named = crate::certs::named(node_cert_der, "urn:bc:node:").map(|(id, _)| id);
                if named.as_deref() != Some(p.node_id.as_str()) {
                    warn!(node = %p.node_id, "a renewal's proof names another node than its certificate");
                    return Err(bad_request(
                        "the renewal's proof names another node than the certificate",
                    ));
                }
                if !verify_node_signature(node_cert_der, &p.statement, &p.signature) {
                    warn!(node = %p.node_id, "a renewal's proof of possession does not verify");
                    return Err(bad_request(
                        "the renewal's proof of possession was not made by the current node key",
                    ));
                }
                let now = self.store.now().await.map_err(unavailable)?;
                if !bcd_proto::renew::fresh(p.time_ms, now) {
                    return Err(bad_request(format!(
                        "the renewal's proof is dated {}s away from the server's time (60s at \
                         most): the node retries with a fresh one",
                        p.time_ms.saturating_sub(now) / 1000
                    )));
                }
            }
        }
        // The node proved its current key (by the proof, or by the TLS
        // session that ended here): a refusal from here on is published,
        // naming it.
        let proven = crate::certs::named(node_cert_der, "urn:bc:node:").map(|(id, _)| id);
        match self
            .renew_proven(node_cert_der, r, proof.as_ref(), grace_ms)
            .await
        {
            Ok(response) => Ok(response),
            Err(refused) => {
                if let (Some(reason), Some(node)) = (refused.reason, proven) {
                    let detail = format!("{reason}: {}", refused.status.message());
                    if let Err(e) = self
                        .store
                        .publish_fleet_event(RENEW_REFUSED, &NodeId::from(&node), &detail)
                        .await
                    {
                        warn!(error = %e, %node, "cannot publish a refused renewal");
                    }
                }
                Err(refused.status)
            }
        }
    }

    /// Refuses a certificate the fleet CA did not issue, whatever the
    /// store has on it.
    pub fn issued_here(&self, cert_der: &[u8]) -> Result<(), Status> {
        if crate::certs::issued_by(cert_der, &self.ca.cert) {
            return Ok(());
        }
        let named = crate::certs::named(cert_der, "urn:bc:node:").map(|(id, _)| id);
        warn!(node = ?named, fingerprint = %bcd_proto::fingerprint(cert_der), "a request came with a certificate the fleet CA did not issue");
        Err(bad_request(NOT_ISSUED_HERE))
    }

    /// Renews once the current key is proven: the next key (certified by
    /// the certificate's AK where it names one), then the store's checks.
    async fn renew_proven(
        &self,
        node_cert_der: &[u8],
        r: RenewRequest,
        proof: Option<&bcd_proto::renew::Proof>,
        grace_ms: i64,
    ) -> Result<RenewResponse, RenewRefused> {
        // The certificate's own end, not the store's column for it.
        let now = self
            .store
            .now()
            .await
            .map_err(|e| RenewRefused::unpublished(unavailable(e)))?;
        if crate::certs::not_after_ms(node_cert_der).is_none_or(|end| end + grace_ms < now) {
            return Err(RenewRefused::new(
                "renew:certificate-expired",
                expired_refusal(Refusal::Expired.into(), self.policy.x509pop),
            ));
        }
        let ak_name = self.next_key(node_cert_der, &r, proof)?;
        let fingerprint = bcd_proto::fingerprint(node_cert_der);
        let csr_der = r.csr_der.clone();
        let csr = r.csr_der;
        let (ca, policy) = (self.ca.clone(), self.policy);
        let renewed = self
            .store
            .renew_within(
                &fingerprint,
                Box::new(move |node, now, ramdisk| {
                    issue(
                        &ca,
                        &csr,
                        node,
                        ak_name.as_deref(),
                        now,
                        policy.ttl(ramdisk),
                    )
                }),
                grace_ms,
            )
            .await
            .map_err(|e| RenewRefused {
                reason: store_reason(&e),
                status: expired_refusal(e, self.policy.x509pop),
            })?;
        let cert = renewed.cert;
        info!(node = %renewed.node_id, serial = %cert.serial, "certificate renewed");
        let mut response = RenewResponse {
            cert_der: cert.der,
            cert_serial: cert.serial,
            not_after_ms: cert.not_after_ms,
            server_time_ms: renewed.now_ms,
            signature: vec![],
        };
        response.signature = self
            .sign(&bcd_proto::joined::renewal_statement(&response, &csr_der))
            .map_err(RenewRefused::unpublished)?;
        Ok(response)
    }
}

/// The refusal of a renewal whose certificate the fleet CA did not issue.
pub const NOT_ISSUED_HERE: &str =
    "the node certificate was not issued by this fleet's CA: nothing is done for it";

/// The fleet event a certificate the fleet CA did not issue, relayed by a
/// gateway for a renewal, is recorded as.
pub const CERTIFICATE_FORGED: &str = "security.certificate.forged";

/// The fleet event a refused renewal is published as, once the node proved
/// its current key.
pub const RENEW_REFUSED: &str = "security.renew.refused";

/// A refused renewal: its status, and the reason it is published with
/// (`None`: not a refusal of the node's, e.g. the store unavailable).
#[derive(Debug)]
struct RenewRefused {
    reason: Option<&'static str>,
    status: Status,
}

impl RenewRefused {
    fn new(reason: &'static str, status: Status) -> RenewRefused {
        RenewRefused {
            reason: Some(reason),
            status,
        }
    }

    fn unpublished(status: Status) -> RenewRefused {
        RenewRefused {
            reason: None,
            status,
        }
    }
}

/// The published reason of a renewal the store refused.
fn store_reason(e: &bc_store::TxError) -> Option<&'static str> {
    Some(match e.refusal()? {
        Refusal::Expired => "renew:certificate-expired",
        Refusal::Revoked(..) => "renew:certificate-revoked",
        Refusal::DeletedNode(..) => "renew:node-deleted",
        Refusal::UnknownCertificate => "renew:certificate-unknown",
        _ => "renew:refused",
    })
}
