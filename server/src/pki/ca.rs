//! The fleet CA and the certificates it issues.
//!
//! Created on first start in the data directory (`ca.key` mode 0600,
//! `ca.crt`), with a gateway serving certificate (`gateway.key`,
//! `gateway.crt`) for the fixed name every node verifies
//! (`bcd_proto::GATEWAY_NAME`) plus the operator's extra names. Node
//! certificates are issued from a PKCS#10 request whose signature proves
//! possession of the node key; what the request asks for beyond its key is
//! ignored: the CA decides names, lifetime and usages.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a usable PEM file: restore it from a backup")]
    Pem { path: PathBuf },
    #[error("{path} is not a 32-byte key: restore it from a backup")]
    RawKey { path: PathBuf },
    #[error("certificate")]
    Rcgen(#[from] rcgen::Error),
    #[error(transparent)]
    Write(#[from] bcd_sys::fs::FsError),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("the certificate request is not valid (bad encoding or signature)")]
    Invalid,
}

pub struct Ca {
    pub cert: CertificateDer<'static>,
    key: KeyPair,
    pub serving_chain: Vec<CertificateDer<'static>>,
    serving_key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

/// A certificate issued to a node.
#[derive(Debug)]
pub struct NodeCert {
    pub der: CertificateDer<'static>,
    pub serial: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
}

pub(super) fn read(path: &Path) -> Result<Vec<u8>, CaError> {
    std::fs::read(path).map_err(|source| CaError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn offset(ms: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn random_serial() -> (SerialNumber, String) {
    // 16 random bytes with the top bit clear: a positive DER integer.
    let mut b: [u8; 16] = rand::random();
    b[0] &= 0x7f;
    b[0] |= 0x01;
    (SerialNumber::from_slice(&b), hex::encode(b))
}

/// A self-signed CA kept as `key_file` (mode 0600) and `cert_file` in
/// `dir`, created on first start.
pub(super) fn load_or_create_root(
    dir: &Path,
    (key_file, cert_file): (&str, &str),
    common_name: &str,
    now_ms: i64,
) -> Result<(CertificateDer<'static>, KeyPair), CaError> {
    let (key_path, cert_path) = (dir.join(key_file), dir.join(cert_file));
    if !cert_path.exists() {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = offset(now_ms - 3_600_000);
        params.not_after = offset(now_ms + 20 * 365 * 86_400_000);
        params.serial_number = Some(random_serial().0);
        let cert = params.self_signed(&key)?;
        bcd_sys::fs::atomic_write(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        bcd_sys::fs::atomic_write(&cert_path, cert.pem().as_bytes(), 0o644)?;
    }
    let key_pem = String::from_utf8(read(&key_path)?).map_err(|_| CaError::Pem {
        path: key_path.clone(),
    })?;
    let key = KeyPair::from_pem(&key_pem).map_err(|_| CaError::Pem { path: key_path })?;
    let cert = CertificateDer::from_pem_slice(&read(&cert_path)?)
        .map_err(|_| CaError::Pem { path: cert_path })?;
    Ok((cert, key))
}

/// A serving certificate for `names` issued by `(ca_cert, ca_key)`, kept as
/// `BASE.key` (mode 0600), `BASE.crt` and `BASE.names` in `dir`; issued
/// again when the names change. Returns the chain (leaf, CA) and the key
/// (PEM).
pub(super) fn load_or_create_serving(
    dir: &Path,
    base: &str,
    names: &[String],
    common_name: &str,
    (ca_cert, ca_key): (&CertificateDer<'static>, &KeyPair),
    now_ms: i64,
) -> Result<(Vec<CertificateDer<'static>>, String), CaError> {
    let key_path = dir.join(format!("{base}.key"));
    let cert_path = dir.join(format!("{base}.crt"));
    let names_path = dir.join(format!("{base}.names"));
    let wanted = names.join("\n");
    let current = std::fs::read_to_string(&names_path).unwrap_or_default();
    if !cert_path.exists() || current != wanted {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(names.to_vec())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = offset(now_ms - 3_600_000);
        params.not_after = offset(now_ms + 30 * 86_400_000);
        params.serial_number = Some(random_serial().0);
        let issuer = Issuer::from_ca_cert_der(ca_cert, ca_key)?;
        let cert = params.signed_by(&key, &issuer)?;
        bcd_sys::fs::atomic_write(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        bcd_sys::fs::atomic_write(&cert_path, cert.pem().as_bytes(), 0o644)?;
        bcd_sys::fs::atomic_write(&names_path, wanted.as_bytes(), 0o644)?;
    }
    let key_pem = String::from_utf8(read(&key_path)?).map_err(|_| CaError::Pem {
        path: key_path.clone(),
    })?;
    let leaf = CertificateDer::from_pem_slice(&read(&cert_path)?)
        .map_err(|_| CaError::Pem { path: cert_path })?;
    // The chain carries the CA so a joining node can match it to the pin
    // in its token.
    Ok((vec![leaf, ca_cert.clone()], key_pem))
}

/// A client certificate for `subject` (common name and one URI SAN) to the
/// key of `csr_der`, issued by `(ca_cert, ca_key)`.
pub(super) fn issue_client_cert(
    csr_der: &[u8],
    (common_name, uri): (&str, String),
    (ca_cert, ca_key): (&CertificateDer<'static>, &KeyPair),
    now_ms: i64,
    ttl: Duration,
    extra_uris: &[String],
) -> Result<NodeCert, IssueError> {
    let csr =
        CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(csr_der))
            .map_err(|_| IssueError::Csr(CsrError::Invalid))?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    let bad_uri = |_| IssueError::Ca(CaError::Rcgen(rcgen::Error::CouldNotParseCertificate));
    params.subject_alt_names = vec![SanType::URI(uri.try_into().map_err(bad_uri)?)];
    for extra in extra_uris {
        params
            .subject_alt_names
            .push(SanType::URI(extra.clone().try_into().map_err(bad_uri)?));
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    // A little back-dating absorbs small clock differences of verifiers.
    let not_before_ms = now_ms - 300_000;
    let not_after_ms = now_ms + ttl.as_millis() as i64;
    params.not_before = offset(not_before_ms);
    params.not_after = offset(not_after_ms);
    let (serial, serial_hex) = random_serial();
    params.serial_number = Some(serial);
    let issuer = Issuer::from_ca_cert_der(ca_cert, ca_key).map_err(CaError::from)?;
    let cert = params
        .signed_by(&csr.public_key, &issuer)
        .map_err(CaError::from)?;
    Ok(NodeCert {
        der: cert.der().clone(),
        serial: serial_hex,
        not_before_ms,
        not_after_ms,
    })
}

impl Ca {
    /// Loads the CA from `dir`, creating it and a serving certificate on
    /// first start. `sans` are extra names for the serving certificate.
    pub fn load_or_create(dir: &Path, sans: &[String], now_ms: i64) -> Result<Ca, CaError> {
        let (cert, key) =
            load_or_create_root(dir, ("ca.key", "ca.crt"), "better-compute fleet CA", now_ms)?;
        let mut names = vec![bcd_proto::GATEWAY_NAME.to_string()];
        names.extend(sans.iter().cloned());
        let (serving_chain, serving_key_pem) = load_or_create_serving(
            dir,
            "gateway",
            &names,
            "better-compute gateway",
            (&cert, &key),
            now_ms,
        )?;
        Ok(Ca {
            cert,
            key,
            serving_chain,
            serving_key_pem,
        })
    }

    pub fn serving_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.serving_key_pem.as_bytes())
            .expect("the serving key parsed when it was loaded")
    }

    /// Signs a statement with the CA key (ECDSA P-256, ASN.1 DER): only
    /// domain-separated statements nodes check against the pinned CA (a
    /// join response: `bcd_proto::joined`).
    pub fn sign(&self, statement: &[u8]) -> Result<Vec<u8>, CaError> {
        Ok(rcgen::SigningKey::sign(&self.key, statement)?)
    }

    /// SHA-256 of the CA certificate: the pin in join tokens.
    pub fn fingerprint(&self) -> String {
        bcd_proto::fingerprint(&self.cert)
    }

    /// Issues a client certificate for `node_id` to the key of `csr_der`;
    /// for a key an AK certified (`ak_name`), the certificate names the AK
    /// as well (`bcd_proto::attest::ak_urn`).
    pub fn issue_node_cert(
        &self,
        csr_der: &[u8],
        node_id: &str,
        ak_name: Option<&[u8]>,
        now_ms: i64,
        ttl: Duration,
    ) -> Result<NodeCert, IssueError> {
        let ak: Vec<String> = ak_name.map(bcd_proto::attest::ak_urn).into_iter().collect();
        issue_client_cert(
            csr_der,
            (node_id, format!("urn:bc:node:{node_id}")),
            (&self.cert, &self.key),
            now_ms,
            ttl,
            &ak,
        )
    }

    /// The key of the stateless TPM attestation challenges
    /// (`bcd_proto::attest::secret`): derived from the fleet CA's private
    /// key, so every process that holds the CA computes the same one and
    /// no other process (a gateway) can.
    pub fn challenge_key(&self) -> ring::hmac::Key {
        let salt = ring::hkdf::Salt::new(
            ring::hkdf::HKDF_SHA256,
            b"better-compute tpm challenge key v1",
        );
        salt.extract(&self.key.serialize_der())
            .expand(&[b"hmac-sha256"], ring::hmac::HMAC_SHA256)
            .expect("a 32-byte key is within HKDF's limit")
            .into()
    }
}

/// Keyed digests of the secrets the store keeps only a digest of (join
/// tokens, gateway credentials): HMAC-SHA256 under a key derived from the
/// fleet CA's private key ([`Ca::secret_digest`]). Only a process that
/// holds the CA makes a digest that matches, so a row whoever can write the
/// store inserts with a secret of its own (a token, a gateway credential)
/// admits nothing.
#[derive(Clone)]
pub struct SecretDigest(ring::hmac::Key);

impl SecretDigest {
    /// The digest of `secret`, hex, as the store keeps it.
    pub fn of(&self, secret: &str) -> String {
        hex::encode(ring::hmac::sign(&self.0, secret.as_bytes()))
    }
}

impl std::fmt::Debug for SecretDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretDigest")
    }
}

impl Ca {
    /// The join service's seal key (`bct2` tokens): derived from the fleet
    /// CA's private key, so every process that holds the CA opens the same
    /// tokens and no other process (a gateway) can.
    pub fn token_seal_key(&self) -> crate::pki::token_seal::TokenSealKey {
        let salt = ring::hkdf::Salt::new(
            ring::hkdf::HKDF_SHA256,
            b"better-compute join token seal key v1",
        );
        struct Len;
        impl ring::hkdf::KeyType for Len {
            fn len(&self) -> usize {
                32
            }
        }
        let mut ikm = [0u8; 32];
        salt.extract(&self.key.serialize_der())
            .expand(&[b"x25519"], Len)
            .and_then(|okm| okm.fill(&mut ikm))
            .expect("32 bytes are within HKDF's limit");
        crate::pki::token_seal::TokenSealKey::derive(&ikm)
    }

    /// The key of the store's secret digests: derived from the fleet CA's
    /// private key, so every process that holds the CA (a restored backup
    /// included) computes the same one and no other process can.
    pub fn secret_digest(&self) -> SecretDigest {
        let salt = ring::hkdf::Salt::new(
            ring::hkdf::HKDF_SHA256,
            b"better-compute secret digest key v1",
        );
        SecretDigest(
            salt.extract(&self.key.serialize_der())
                .expand(&[b"hmac-sha256"], ring::hmac::HMAC_SHA256)
                .expect("a 32-byte key is within HKDF's limit")
                .into(),
        )
    }
}

/// A serving certificate issued to a gateway process that holds no key
/// of ours: its chain (leaf, then the fleet CA) and when it runs out.
#[derive(Debug)]
pub struct GatewayCert {
    pub chain: Vec<CertificateDer<'static>>,
    pub not_after_ms: i64,
}

/// How long a gateway's serving certificate lasts.
pub const GATEWAY_CERT_TTL: Duration = Duration::from_secs(30 * 86_400);

/// How far a gateway certificate's not-before is back-dated.
pub const GATEWAY_BACKDATE_MS: i64 = 300_000;

impl Ca {
    /// Issues a serving certificate, also good as a client certificate
    /// towards the GatewayServices port, to the key of `csr_der` for the
    /// gateway `name`: the name every node checks
    /// ([`bcd_proto::GATEWAY_NAME`]), the extra `names`, and
    /// `urn:bc:gateway:NAME`.
    pub fn issue_gateway_cert(
        &self,
        csr_der: &[u8],
        name: &str,
        names: &[String],
        now_ms: i64,
    ) -> Result<GatewayCert, IssueError> {
        let csr =
            CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(csr_der))
                .map_err(|_| IssueError::Csr(CsrError::Invalid))?;
        let mut all = vec![bcd_proto::GATEWAY_NAME.to_string()];
        all.extend(names.iter().cloned());
        let mut params = CertificateParams::new(all).map_err(CaError::from)?;
        params.subject_alt_names.push(SanType::URI(
            format!("{GATEWAY_URI}{name}")
                .try_into()
                .map_err(CaError::from)?,
        ));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("better-compute gateway {name}"));
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let not_after_ms = now_ms + GATEWAY_CERT_TTL.as_millis() as i64;
        params.not_before = offset(now_ms - GATEWAY_BACKDATE_MS);
        params.not_after = offset(not_after_ms);
        params.serial_number = Some(random_serial().0);
        let issuer = Issuer::from_ca_cert_der(&self.cert, &self.key).map_err(CaError::from)?;
        let cert = params
            .signed_by(&csr.public_key, &issuer)
            .map_err(CaError::from)?;
        Ok(GatewayCert {
            chain: vec![cert.der().clone(), self.cert.clone()],
            not_after_ms,
        })
    }
}

/// The URI a gateway certificate names its gateway by.
pub const GATEWAY_URI: &str = "urn:bc:gateway:";

#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error(transparent)]
    Ca(#[from] CaError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_a_node_cert_that_chains_to_the_ca() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(d.path(), &["127.0.0.1".into()], 1_800_000_000_000).unwrap();
        let again = Ca::load_or_create(d.path(), &["127.0.0.1".into()], 1_800_000_000_000).unwrap();
        assert_eq!(ca.fingerprint(), again.fingerprint(), "the CA persists");
        assert_eq!(
            ca.serving_chain, again.serving_chain,
            "the serving cert persists"
        );

        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let csr = CertificateParams::default()
            .serialize_request(&key)
            .unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
        let cert = ca
            .issue_node_cert(csr.der(), "nd-1", None, now, Duration::from_secs(86_400))
            .unwrap();
        assert_eq!(cert.not_after_ms - now, 86_400_000);
        assert_eq!(cert.serial.len(), 32);

        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert.clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            bcd_proto::tls::provider(),
        )
        .build()
        .unwrap();
        verifier
            .verify_client_cert(&cert.der, &[], rustls_pki_types::UnixTime::now())
            .expect("the node cert verifies against the CA");
    }

    #[test]
    fn garbage_and_tampered_requests_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(d.path(), &[], 1_800_000_000_000).unwrap();
        assert!(matches!(
            ca.issue_node_cert(b"not a csr", "nd-1", None, 0, Duration::from_secs(1)),
            Err(IssueError::Csr(CsrError::Invalid))
        ));
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let csr = CertificateParams::default()
            .serialize_request(&key)
            .unwrap();
        let mut bytes = csr.der().to_vec();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x55;
        assert!(
            ca.issue_node_cert(&bytes, "nd-1", None, 0, Duration::from_secs(1))
                .is_err()
        );
    }

    #[test]
    fn ca_key_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        Ca::load_or_create(d.path(), &[], 1_800_000_000_000).unwrap();
        for f in ["ca.key", "gateway.key"] {
            let mode = std::fs::metadata(d.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
    }
}
