//! A gateway that holds no key: its credential file, and the serving
//! certificate it gets for a key made in memory.
//!
//! `serve --role gateway --credential FILE` starts from a directory with no
//! private key. The credential (`better-compute gateways add`) names the
//! gateway, holds its secret, the address of the process that holds the
//! keys (its GatewayServices port) and the fleet CA. At start the gateway
//! makes an ECDSA P-256 key in memory, proves its secret to the port with a
//! CSR for that key, and serves with the certificate it gets back (30 days);
//! the same certificate is its client certificate towards the port. It asks
//! again at 60% of the certificate's life and swaps the new pair in for the
//! next handshakes. Nothing of this is written to disk.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use bcd_proto::tls::{self, ClientIdentity, ServerTrust};
use bcd_proto::v1::{CertifyRequest, gateway_services_client::GatewayServicesClient};
use rcgen::{CertificateParams, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;
use tracing::{info, warn};

/// What `gateways add` writes: readable by its owner only.
#[derive(Clone, Serialize, Deserialize)]
pub struct GatewayCredential {
    pub name: String,
    pub secret: String,
    /// The key-holding process's node listener, `https://HOST:PORT`.
    pub upstream: String,
    /// The fleet CA certificate, PEM.
    pub ca_pem: String,
}

impl std::fmt::Debug for GatewayCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayCredential")
            .field("name", &self.name)
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl GatewayCredential {
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).expect("plain data serializes");
        bcd_sys::fs::atomic_write(path, &bytes, 0o600)?;
        Ok(())
    }

    /// Reads a credential file, refusing one others can read.
    pub fn read(path: &Path) -> anyhow::Result<GatewayCredential> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .with_context(|| format!("cannot read the gateway credential {shown}"))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "the gateway credential {shown} is readable by others (mode {mode:o}): \
                 chmod 600 {shown}"
            );
        }
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read the gateway credential {shown}"))?;
        let c: GatewayCredential = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{shown} is not a gateway credential: write one with better-compute gateways add"
            )
        })?;
        Ok(c)
    }

    pub fn ca(&self) -> anyhow::Result<CertificateDer<'static>> {
        CertificateDer::from_pem_slice(self.ca_pem.as_bytes())
            .map_err(|_| anyhow::anyhow!("the gateway credential's CA is not a PEM certificate"))
    }
}

/// A key made in memory and the chain the port certified it with.
#[derive(Debug)]
pub struct Certified {
    pub chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
    pub not_after_ms: i64,
    pub issued_ms: i64,
}

impl Certified {
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// When to ask again: at 60% of the certificate's life.
    pub fn renew_in(&self, now_ms: i64) -> Duration {
        let life = (self.not_after_ms - self.issued_ms).max(0);
        let at = self.issued_ms + life * 6 / 10;
        Duration::from_millis((at - now_ms).max(0) as u64)
    }
}

/// Why a gateway is not certified.
#[derive(Debug, thiserror::Error)]
pub enum CertifyError {
    /// The port answered no: trying again cannot help.
    #[error("the gateway services refused to certify this gateway: {0}")]
    Refused(String),
    /// The port could not be reached or failed: worth trying again.
    #[error("cannot certify this gateway yet")]
    Unreachable(#[source] anyhow::Error),
}

/// Makes a key in memory and has the port certify it for `names`.
pub async fn certify(
    cred: &GatewayCredential,
    names: &[String],
) -> Result<Certified, CertifyError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CertifyError::Refused(format!("cannot make a key: {e}")))?;
    let csr = CertificateParams::default()
        .serialize_request(&key)
        .map_err(|e| CertifyError::Refused(format!("cannot make a certificate request: {e}")))?;
    let ca = cred
        .ca()
        .map_err(|e| CertifyError::Refused(bcd_sys::error::chain(e.as_ref())))?;
    let config = tls::client_config(ServerTrust::Ca(ca), None)
        .map_err(|e| CertifyError::Refused(bcd_sys::error::chain(&e)))?;
    let channel = tls::connect(&cred.upstream, config).await.map_err(|e| {
        CertifyError::Unreachable(anyhow::Error::new(e).context(format!(
            "cannot reach the gateway services at {}",
            cred.upstream
        )))
    })?;
    let r = GatewayServicesClient::new(channel)
        .certify(CertifyRequest {
            name: cred.name.clone(),
            secret: cred.secret.clone(),
            csr_der: csr.der().to_vec(),
            names: names.to_vec(),
        })
        .await
        .map_err(|s| match s.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal => {
                CertifyError::Unreachable(anyhow::anyhow!("{}", s.message()))
            }
            _ => CertifyError::Refused(s.message().to_string()),
        })?
        .into_inner();
    if r.chain_der.is_empty() {
        return Err(CertifyError::Refused(
            "the gateway services returned no certificate".into(),
        ));
    }
    Ok(Certified {
        chain: r.chain_der.into_iter().map(CertificateDer::from).collect(),
        key_der: key.serialize_der(),
        not_after_ms: r.not_after_ms,
        issued_ms: r.server_time_ms,
    })
}

/// A channel to the port authenticated with `certified`.
pub async fn upstream_channel(
    cred: &GatewayCredential,
    certified: &Certified,
) -> anyhow::Result<Channel> {
    let config = tls::client_config(
        ServerTrust::Ca(cred.ca()?),
        Some(ClientIdentity {
            chain: certified.chain.clone(),
            key: certified.key(),
        }),
    )?;
    tls::connect(&cred.upstream, config)
        .await
        .with_context(|| format!("cannot reach the gateway services at {}", cred.upstream))
}

/// The serving certificate handshakes use now; renewed in place.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCert {
    pub fn new(c: &Certified) -> anyhow::Result<Arc<ServingCert>> {
        Ok(Arc::new(ServingCert {
            current: RwLock::new(Arc::new(certified_key(c)?)),
        }))
    }

    pub fn replace(&self, c: &Certified) -> anyhow::Result<()> {
        let next = Arc::new(certified_key(c)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(())
    }
}

fn certified_key(c: &Certified) -> anyhow::Result<CertifiedKey> {
    let key = tls::provider()
        .key_provider
        .load_private_key(c.key())
        .context("cannot load the gateway's serving key")?;
    Ok(CertifiedKey::new(c.chain.clone(), key))
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

/// The gateway's link to the key-holding process, renewed with its
/// certificate.
#[derive(Debug, Clone)]
pub struct UpstreamLink {
    channel: Arc<RwLock<Channel>>,
}

impl UpstreamLink {
    pub fn new(channel: Channel) -> UpstreamLink {
        UpstreamLink {
            channel: Arc::new(RwLock::new(channel)),
        }
    }

    pub fn channel(&self) -> Channel {
        self.channel
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn replace(&self, channel: Channel) {
        *self.channel.write().unwrap_or_else(|e| e.into_inner()) = channel;
    }
}

/// Certifies at start, trying for `patience` while the port cannot be
/// reached (it may be starting too); a refusal ends the start at once.
pub async fn certify_at_start(
    cred: &GatewayCredential,
    names: &[String],
    patience: Duration,
) -> anyhow::Result<Certified> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match certify(cred, names).await {
            Ok(c) => return Ok(c),
            Err(e @ CertifyError::Refused(_)) => return Err(e.into()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.into()),
            Err(e) => {
                warn!(error = %bcd_sys::error::chain(&e), "cannot certify this gateway yet; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Renews the serving certificate at 60% of its life, for as long as the
/// process runs; a failed attempt is retried a minute later.
pub async fn keep_certified(
    cred: GatewayCredential,
    names: Vec<String>,
    mut certified: Certified,
    serving: Arc<ServingCert>,
    upstream: UpstreamLink,
) {
    loop {
        let now = crate::clock::unix_ms();
        tokio::time::sleep(certified.renew_in(now)).await;
        let next = match certify(&cred, &names).await {
            Ok(c) => c,
            Err(e) => {
                let e = anyhow::Error::new(e);
                warn!(error = %bcd_sys::error::chain(e.as_ref()), "cannot renew this gateway's certificate; retrying in 60s");
                tokio::time::sleep(Duration::from_secs(60)).await;
                continue;
            }
        };
        match (serving.replace(&next), upstream_channel(&cred, &next).await) {
            (Ok(()), Ok(channel)) => {
                upstream.replace(channel);
                info!(
                    not_after_ms = next.not_after_ms,
                    "gateway certificate renewed"
                );
                certified = next;
            }
            (Err(e), _) | (_, Err(e)) => {
                warn!(error = %bcd_sys::error::chain(e.as_ref()), "cannot use the renewed gateway certificate; retrying in 60s");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_at_sixty_percent_of_the_life() {
        let c = Certified {
            chain: vec![],
            key_der: vec![],
            not_after_ms: 1_000_000,
            issued_ms: 0,
        };
        assert_eq!(c.renew_in(0), Duration::from_millis(600_000));
        assert_eq!(c.renew_in(599_000), Duration::from_millis(1_000));
        assert_eq!(c.renew_in(900_000), Duration::ZERO, "overdue: at once");
    }

    #[test]
    fn a_credential_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("gw.json");
        let c = GatewayCredential {
            name: "gw-a".into(),
            secret: "s".into(),
            upstream: "https://127.0.0.1:1".into(),
            ca_pem: String::new(),
        };
        c.write(&path).unwrap();
        assert_eq!(GatewayCredential::read(&path).unwrap().name, "gw-a");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = GatewayCredential::read(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        assert!(
            !format!("{c:?}").contains("\"s\""),
            "the secret is not printed"
        );
    }
}
