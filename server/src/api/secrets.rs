//! The secret broker: `secrets put|rotate|list|delete` for operators, the
//! secrets an allocation holds (`nodes assign --secret`), and the delivery
//! of a value to the node whose signed spec names it.
//!
//! Values are sealed under the key holder's secrets key before the store
//! sees them (`pki::secrets`). A node asks through whichever gateway holds
//! its session, with a one-time X25519 key it signs with its node key
//! (`bcd_proto::secret`); the broker checks the certificate against the
//! fleet CA and the store's revocations, the signature, the request's
//! time, and that the node's worker-signed spec names that secret at that
//! version for that allocation, then answers with the value as a JWE to
//! the one-time key inside a delivery signed by the ticket key. What a
//! relaying gateway sees is ciphertext for a key it does not have.

use bc_store::NodeId;
use std::collections::BTreeMap;

use bc_store::Refusal;
use bc_store::secrets::{Put, SecretSummary};
use bcd_proto::secret::{self, Delivery, Request};
use bcd_proto::v1::{self, SecretDelivery, SecretInfo, SecretRequest};
use tonic::Status;
use tracing::{info, warn};

use super::AdminService;
use super::join::JoinService;
use super::status::{bad_request, refusal, status, unavailable};
use crate::certs::verify_node_signature;
use crate::pki::seal;

/// The fleet event each delivery is recorded as (never with the value).
pub const DELIVERED: &str = "secret.delivered";

/// The fleet event of a secret request the node key did not sign.
pub const FORGED: &str = "security.secret-request.forged";

fn info_of(s: SecretSummary, nodes: Vec<String>) -> SecretInfo {
    SecretInfo {
        name: s.name,
        version: s.version,
        created_at_ms: s.created_ms,
        created_by: s.created_by,
        nodes,
    }
}

/// Every node whose worker-signed spec names each secret, by secret name.
/// Read from the signed bytes, never the store's columns.
async fn named_by(svc: &AdminService) -> Result<BTreeMap<String, Vec<String>>, Status> {
    let nodes = svc.store.list_nodes().await.map_err(unavailable)?;
    let mut by = BTreeMap::<String, Vec<String>>::new();
    for n in nodes.nodes {
        let Some((_, signed)) = svc
            .store
            .signed_spec(&n.node_id)
            .await
            .map_err(unavailable)?
        else {
            continue;
        };
        let Ok(opened) = seal::own_spec_opener(&svc.worker_key, &n.node_id)(&signed) else {
            continue;
        };
        let mut names: Vec<&str> = opened
            .body
            .assignments
            .iter()
            .flat_map(|a| a.secrets.iter().map(|s| s.name.as_str()))
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            by.entry(name.to_string())
                .or_default()
                .push(n.node_id.to_string());
        }
    }
    Ok(by)
}

/// `PutSecret`: a new secret, or (`rotate`) its next version, which every
/// spec naming it is signed again for.
pub async fn put(
    svc: &AdminService,
    operator: &str,
    r: v1::PutSecretRequest,
) -> Result<SecretInfo, Status> {
    secret::check_name("secret name", &r.name).map_err(bad_request)?;
    if r.value.is_empty() {
        return Err(bad_request(
            "the secret's value is empty: give it one with --from-file or --from-env",
        ));
    }
    if r.value.len() > secret::MAX_VALUE {
        return Err(bad_request(format!(
            "the secret's value is {} bytes; a secret holds {} at most",
            r.value.len(),
            secret::MAX_VALUE
        )));
    }
    let key = svc.secrets_key.clone();
    let (name, value) = (r.name.clone(), r.value);
    let put = if r.rotate { Put::Rotate } else { Put::New };
    let summary = svc
        .store
        .put_secret(
            &r.name,
            put,
            operator,
            Box::new(move |version| key.seal(&name, version, &value)),
        )
        .await
        .map_err(status)?;
    info!(secret = %summary.name, version = summary.version, %operator, "secret put");
    let mut nodes = Vec::new();
    if r.rotate {
        let version = summary.version;
        for node in named_by(svc).await?.remove(&r.name).unwrap_or_default() {
            let name = r.name.clone();
            super::specs::change(svc, node.clone(), move |body| {
                for s in body
                    .assignments
                    .iter_mut()
                    .flat_map(|a| a.secrets.iter_mut())
                    .filter(|s| s.name == name)
                {
                    s.version = version;
                }
                Ok(())
            })
            .await?;
            nodes.push(node);
        }
        info!(secret = %summary.name, version, nodes = nodes.len(), "specs signed again for a rotated secret");
    }
    Ok(info_of(summary, nodes))
}

/// `ListSecrets`: names, newest versions and the nodes naming each; never
/// a value.
pub async fn list(svc: &AdminService) -> Result<v1::ListSecretsResponse, Status> {
    let secrets = svc.store.list_secrets().await.map_err(unavailable)?;
    let mut by = named_by(svc).await?;
    Ok(v1::ListSecretsResponse {
        secrets: secrets
            .into_iter()
            .map(|s| {
                let nodes = by.remove(&s.name).unwrap_or_default();
                info_of(s, nodes)
            })
            .collect(),
    })
}

/// `DeleteSecret`: only one no spec names; every version's value is
/// wiped.
pub async fn delete(svc: &AdminService, r: v1::DeleteSecretRequest) -> Result<SecretInfo, Status> {
    if let Some(nodes) = named_by(svc).await?.remove(&r.name) {
        return Err(refusal(Refusal::Conflict(format!(
            "secret {} is held by allocations on {}: take it off them first \
             (better-compute nodes assign NODE ALLOCATION without --secret {}, or nodes unassign)",
            r.name,
            nodes.join(", "),
            r.name
        ))));
    }
    let summary = svc.store.delete_secret(&r.name).await.map_err(status)?;
    info!(secret = %summary.name, "secret deleted");
    Ok(info_of(summary, Vec::new()))
}

/// The secrets an assignment asks for, each at the broker's newest version;
/// refused when one does not exist or two write the same file.
pub async fn resolve(
    svc: &AdminService,
    wanted: Vec<v1::SecretRef>,
) -> Result<Vec<bc_store::specs::SecretRef>, Status> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let live = svc.store.list_secrets().await.map_err(unavailable)?;
    let mut out: Vec<bc_store::specs::SecretRef> = Vec::new();
    for w in wanted {
        secret::check_name("secret name", &w.name).map_err(bad_request)?;
        if !w.file.is_empty() {
            secret::check_name("secret file", &w.file).map_err(bad_request)?;
        }
        let Some(s) = live.iter().find(|s| s.name == w.name) else {
            return Err(refusal(Refusal::NotFound(format!(
                "no secret {}: put it first (better-compute secrets put {} --from-file FILE)",
                w.name, w.name
            ))));
        };
        let file = if w.file.is_empty() {
            w.name.clone()
        } else {
            w.file
        };
        if out.iter().any(|o| o.file == file) {
            return Err(bad_request(format!(
                "two secrets of the allocation are written to the same file {file}: name \
                 another with --secret NAME=FILE"
            )));
        }
        out.push(bc_store::specs::SecretRef {
            name: w.name,
            version: s.version,
            file,
        });
    }
    Ok(out)
}

impl JoinService {
    /// `node`'s stored spec, opened as the node opens it: signed by a
    /// worker key of this key holder's, naming the node.
    fn opened_spec(&self, node: &str, signed: &[u8]) -> Result<v1::NodeSpec, Status> {
        use prost::Message;
        bcd_proto::sign::open(signed, &self.worker_keys)
            .ok()
            .and_then(|p| v1::NodeSpec::decode(p.as_slice()).ok())
            .filter(|s| s.node_id == node)
            .ok_or_else(|| {
                warn!(%node, "a node's stored spec does not open under the worker key");
                Status::failed_precondition("the node's stored spec does not verify")
            })
    }

    /// A node's secret request, as the gateway that holds its session
    /// relayed it with the certificate the node presented.
    pub async fn deliver_secret(
        &self,
        node_cert_der: &[u8],
        r: SecretRequest,
    ) -> Result<SecretDelivery, Status> {
        self.issued_here(node_cert_der)?;
        let now = self.store.now().await.map_err(unavailable)?;
        if crate::certs::not_after_ms(node_cert_der).is_none_or(|end| end < now) {
            return Err(refusal(Refusal::Expired));
        }
        // Valid in the store too: not revoked, its node not deleted.
        let valid = self
            .store
            .check_cert(&bcd_proto::fingerprint(node_cert_der))
            .await
            .map_err(status)?;
        let named = crate::certs::named(node_cert_der, "urn:bc:node:").map(|(id, _)| id);
        if named.as_deref() != Some(r.node_id.as_str()) || valid.node_id != r.node_id {
            return Err(bad_request(
                "the secret request names another node than the certificate it came with",
            ));
        }
        let statement = secret::request_statement(&Request::from(&r));
        if !verify_node_signature(node_cert_der, &statement, &r.signature) {
            warn!(node = %r.node_id, secret = %r.name, "a secret request the node key did not sign");
            let detail = format!(
                "a secret request for {} v{} (allocation {}) carried a signature the node key \
                 did not make: a relaying gateway changed it",
                r.name, r.version, r.allocation_id
            );
            if let Err(e) = self
                .store
                .publish_fleet_event(FORGED, &NodeId::from(&r.node_id), &detail)
                .await
            {
                warn!(error = %e, "cannot record a forged secret request");
            }
            return Err(bad_request(
                "the secret request was not signed by the node key",
            ));
        }
        if let Err(wait_ms) = self.secret_requests.take(&r.node_id, now.max(0) as u64) {
            use super::budget::{BURST, REFILL_MS};
            return Err(Status::resource_exhausted(format!(
                "node {} asked for {BURST} secrets in a row; the broker takes one more each {} s: \
                 the node asks again in {} s",
                r.node_id,
                REFILL_MS / 1000,
                wait_ms.div_ceil(1000)
            )));
        }
        if r.one_time_key.len() != 32 {
            return Err(bad_request(
                "the secret request's one-time key is not an X25519 public key",
            ));
        }
        // Any i64 a peer sends: no overflow, either way.
        if r.time_ms.abs_diff(now) > secret::REQUEST_SLACK_MS.unsigned_abs() {
            return Err(bad_request(format!(
                "the secret request is dated {} ms from the broker's time; a request is good \
                 for {} s: the node asks again",
                r.time_ms.saturating_sub(now),
                secret::REQUEST_SLACK_MS / 1000
            )));
        }
        // The node's worker-signed spec names this secret at this version
        // for this allocation: the store's columns decide nothing.
        let spec = match self
            .store
            .signed_spec(&NodeId::from(&r.node_id))
            .await
            .map_err(unavailable)?
        {
            Some((_, signed)) => Some(self.opened_spec(&r.node_id, &signed)?),
            None => None,
        };
        let held = spec.as_ref().is_some_and(|s| {
            s.devices.iter().flat_map(|d| &d.assignments).any(|a| {
                a.allocation_id == r.allocation_id
                    && a.secrets
                        .iter()
                        .any(|s| s.name == r.name && s.version == r.version)
            })
        });
        let (true, Some(spec)) = (held, spec) else {
            return Err(refusal(Refusal::NotFound(format!(
                "node {}'s spec gives allocation {} no secret {} v{}",
                r.node_id, r.allocation_id, r.name, r.version
            ))));
        };
        let row = self
            .store
            .secret(&r.name, r.version)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                refusal(Refusal::NotFound(format!(
                    "secret {} v{} was deleted",
                    r.name, r.version
                )))
            })?;
        let value = self
            .secrets_key
            .open(&r.name, r.version, &row.sealed)
            .ok_or_else(|| {
                warn!(secret = %r.name, version = r.version, "a stored secret does not open under the secrets key");
                Status::internal(
                    "the stored secret does not open under this key holder's secrets key",
                )
            })?;
        let jwe = secret::seal(&value, &r.one_time_key).map_err(|e| bad_request(e.to_string()))?;
        let delivery = Delivery {
            iss: bcd_proto::ticket::ISSUER.into(),
            node: r.node_id.clone(),
            allocation: r.allocation_id.clone(),
            name: r.name.clone(),
            version: r.version,
            req: secret::request_digest(&statement),
            iat: now / 1000,
            jwe,
        };
        // Signed with the newest ticket key the node's spec names, which is
        // the one it verifies with.
        let jws = self
            .tickets
            .deliver(&spec.ticket_jwks, &delivery)
            .ok_or_else(|| {
                Status::unavailable(
                    "the node's spec names none of the ticket keys yet: it asks again once it \
                     took a spec naming them",
                )
            })?;
        let detail = format!(
            "{} v{} to allocation {}",
            r.name, r.version, r.allocation_id
        );
        if let Err(e) = self
            .store
            .publish_fleet_event(DELIVERED, &NodeId::from(&r.node_id), &detail)
            .await
        {
            warn!(error = %e, "cannot record a secret delivery");
        }
        info!(node = %r.node_id, secret = %r.name, version = r.version, "secret delivered");
        Ok(SecretDelivery { jws })
    }
}
