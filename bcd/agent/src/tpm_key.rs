//! A node key that lives in the TPM (`bcd join --attestor tpm`): `node.key`
//! holds the record that derives it (`bcd_tpm::NodeKeyRecord`), and every
//! signature (each TLS handshake, each signed fact, the CSR of the join) is
//! the TPM's over a SHA-256 digest. The private key never leaves the TPM,
//! and nothing here falls back to a file key.
//!
//! The TPM is reached through the backend the operator chose
//! (`bcd_tpm::TpmAt`: the pure-Rust one by default, tss-esapi in glibc
//! builds with the `tss` feature); everything here goes through the
//! `bcd_tpm::Tpm` trait.
//!
//! TPM calls block: they run on the caller's thread where blocking is
//! allowed, or through `tokio::task::block_in_place` on a runtime worker
//! (rustls asks for its signature synchronously, inside the handshake).

use std::sync::{Arc, Mutex};

use bcd_tpm::{NodeKeyRecord, PublicArea, Tpm, TpmAt};
use rustls::SignatureScheme;
use rustls::sign::{Signer, SigningKey};

/// The spec's text for a node key its TPM no longer derives.
pub const TPM_CLEARED: &str = "the node key does not match the node certificate: the TPM derives another key from node.key (was the TPM cleared?); join again: bcd join --reset --yes, then bcd join";
/// The spec's text for a TPM-held key whose TPM cannot be reached.
pub const TPM_UNAVAILABLE: &str = "the certificate's node key is in the TPM, which is unavailable";
/// The spec's text for a TPM whose AK is not the one the certificate names.
pub const TPM_OTHER_AK: &str = "this TPM's attestation key is not the one the certificate names (another TPM, or its endorsement seed changed): the certificate cannot be renewed here; join again: bcd join --reset --yes, then bcd join";

/// The node key in the TPM `at` (the current record's, which a renewal
/// replaces), and an open connection to it through its backend.
pub struct TpmKey {
    at: TpmAt,
    current: Mutex<(NodeKeyRecord, PublicArea)>,
    tpm: Mutex<Option<Box<dyn Tpm>>>,
}

impl std::fmt::Debug for TpmKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmKey")
            .field("tpm", &self.at.to_string())
            .field("record", &self.record())
            .finish_non_exhaustive()
    }
}

/// A certificate request for `key`, in the TPM or not: one instance of
/// rcgen's request writer for every key (the static `bcd` counts bytes).
pub fn csr(
    params: &rcgen::CertificateParams,
    key: &dyn rcgen::SigningKey,
) -> Result<rcgen::CertificateSigningRequest, rcgen::Error> {
    params.serialize_request(&key)
}

/// Runs `f` where blocking is allowed.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl TpmKey {
    /// Opens the TPM `at` and derives the key of `record`.
    pub fn open(at: TpmAt, record: NodeKeyRecord) -> Result<TpmKey, bcd_tpm::Error> {
        let mut tpm = at.open()?;
        let public = tpm.node_key_public(&record)?;
        Self::with(at, record, public, tpm)
    }

    fn with(
        at: TpmAt,
        record: NodeKeyRecord,
        public: PublicArea,
        tpm: Box<dyn Tpm>,
    ) -> Result<TpmKey, bcd_tpm::Error> {
        if public.p256_point().is_none() {
            return Err(bcd_tpm::Error::Invalid(
                "the TPM's node key is not a P-256 key".into(),
            ));
        }
        Ok(TpmKey {
            at,
            current: Mutex::new((record, public)),
            tpm: Mutex::new(Some(tpm)),
        })
    }

    /// Opens the TPM for the identity whose certificate is `cert_der`:
    /// its AK must be the one the certificate names, and `record` must
    /// still derive the certificate's key. Each failure is the spec's text.
    pub fn for_certificate(
        at: TpmAt,
        record: NodeKeyRecord,
        cert_der: &[u8],
    ) -> Result<TpmKey, String> {
        let shown = at.to_string();
        let unavailable = |e: bcd_tpm::Error| {
            if let bcd_tpm::Error::Unsupported(m) = e {
                m
            } else if e.is_unreachable() {
                format!("{TPM_UNAVAILABLE} ({})", bcd_sys::error::chain(&e))
            } else {
                format!(
                    "the TPM at {shown} cannot derive the node key: {}",
                    bcd_sys::error::chain(&e)
                )
            }
        };
        let mut tpm = at.open().map_err(unavailable)?;
        if let Some(expected) = certificate_ak(cert_der) {
            match bcd_tpm::check_ak(tpm.as_mut(), &bcd_tpm::Name::from_bytes(expected)) {
                Ok(_) => {}
                Err(bcd_tpm::Error::AkMismatch { .. }) => return Err(TPM_OTHER_AK.to_string()),
                Err(e) => return Err(unavailable(e)),
            }
        }
        let spki = certificate_spki(cert_der).ok_or_else(|| {
            "the node certificate holds no P-256 key: join again: bcd join --reset --yes, then \
             bcd join"
                .to_string()
        })?;
        let public = match bcd_tpm::check_node_key(tpm.as_mut(), &record, &spki) {
            Ok(p) => p,
            Err(bcd_tpm::Error::NodeKeyMismatch) => return Err(TPM_CLEARED.to_string()),
            Err(e) => return Err(unavailable(e)),
        };
        Self::with(at, record, public, tpm).map_err(unavailable)
    }

    /// The TPM and its backend.
    pub fn at(&self) -> &TpmAt {
        &self.at
    }

    /// The backend's library ("tpm2-protocol", "tss-esapi").
    pub fn backend(&self) -> &'static str {
        self.at.backend.library()
    }

    /// The current key's public area.
    pub fn public(&self) -> PublicArea {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// The current key's record.
    pub fn record(&self) -> NodeKeyRecord {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    /// Makes `record` (whose key is `public`) the current key: after a
    /// renewal installed its certificate.
    pub fn switch(&self, record: NodeKeyRecord, public: PublicArea) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = (record, public);
    }

    /// The key of `record` as rcgen signs a CSR with it, over this
    /// connection.
    pub fn signer(&self, record: NodeKeyRecord, public: &PublicArea) -> Option<RecordSigner<'_>> {
        Some(RecordSigner {
            key: self,
            record,
            point: public.p256_point()?,
        })
    }

    /// Runs `f` on the open TPM, reconnecting once when the connection
    /// broke.
    pub fn with_tpm<T>(
        &self,
        f: impl Fn(&mut dyn Tpm) -> Result<T, bcd_tpm::Error>,
    ) -> Result<T, bcd_tpm::Error> {
        let mut guard = self.tpm.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(self.at.open()?);
        }
        let tpm = guard.as_mut().expect("opened above");
        match f(tpm.as_mut()) {
            Err(e) if e.is_unreachable() => {
                *guard = None;
                let mut fresh = self.at.open()?;
                let out = f(fresh.as_mut());
                *guard = Some(fresh);
                out
            }
            other => other,
        }
    }

    /// Runs `f` on a connection opened now, which then replaces the open
    /// one: nothing a backend loaded earlier answers for the TPM (a
    /// backend keeps the keys it derived, and their public areas, between
    /// calls), so what `f` checks is the TPM as it is now. The renewal's
    /// checks go through here: hours after the start, the TPM may derive
    /// another AK (its endorsement seed changed, or another TPM answers at
    /// the endpoint). The open connection is closed first: swtpm serves one
    /// at a time.
    pub fn with_fresh_tpm<T>(
        &self,
        f: impl Fn(&mut dyn Tpm) -> Result<T, bcd_tpm::Error>,
    ) -> Result<T, bcd_tpm::Error> {
        let mut guard = self.tpm.lock().unwrap_or_else(|p| p.into_inner());
        *guard = None;
        let mut fresh = self.at.open()?;
        let out = f(fresh.as_mut());
        *guard = Some(fresh);
        out
    }

    /// An ECDSA P-256 / SHA-256 signature (ASN.1 DER) over `message` by
    /// the current key.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, bcd_tpm::Error> {
        self.sign_with(&self.record(), message)
    }

    /// [`TpmKey::sign`] by the key of `record`.
    pub fn sign_with(
        &self,
        record: &NodeKeyRecord,
        message: &[u8],
    ) -> Result<Vec<u8>, bcd_tpm::Error> {
        let digest: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, message)
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        let sig = blocking(|| self.with_tpm(|t| t.sign(record, &digest)))?;
        Ok(sig.to_der())
    }

    /// The key as rustls signs a handshake with it.
    pub fn rustls_key(self: &Arc<Self>) -> Arc<dyn SigningKey> {
        Arc::new(RustlsKey(self.clone()))
    }
}

/// The AK name a node certificate names (`urn:bc:tpm-ak:HEX`), if any.
pub fn certificate_ak(cert_der: &[u8]) -> Option<Vec<u8>> {
    let prefix = bcd_proto::attest::AK_URN.as_bytes();
    let at = cert_der.windows(prefix.len()).position(|w| w == prefix)?;
    let len = usize::from(*cert_der.get(at.checked_sub(1)?)?);
    if *cert_der.get(at.checked_sub(2)?)? != 0x86 || len <= prefix.len() || len > 0x7f {
        return None;
    }
    let hex = std::str::from_utf8(cert_der.get(at + prefix.len()..at + len)?).ok()?;
    hex::decode(hex).ok()
}

/// The P-256 SubjectPublicKeyInfo (DER) a certificate holds: the fixed
/// 26-byte prefix of such a key and the 65-byte point after it.
fn certificate_spki(cert_der: &[u8]) -> Option<Vec<u8>> {
    const PREFIX: [u8; 26] = [
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ];
    let at = cert_der.windows(PREFIX.len()).position(|w| w == PREFIX)?;
    cert_der.get(at..at + PREFIX.len() + 65).map(<[u8]>::to_vec)
}

/// A key in the TPM as rcgen signs a certificate request with it.
#[derive(Debug)]
pub struct RecordSigner<'a> {
    key: &'a TpmKey,
    record: NodeKeyRecord,
    point: [u8; 65],
}

impl rcgen::PublicKeyData for RecordSigner<'_> {
    fn der_bytes(&self) -> &[u8] {
        &self.point
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

impl rcgen::SigningKey for RecordSigner<'_> {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        self.key.sign_with(&self.record, msg).map_err(|e| {
            tracing::warn!(error = %bcd_sys::error::chain(&e), "the TPM did not sign");
            rcgen::Error::RemoteKeyError
        })
    }
}

#[derive(Debug)]
struct RustlsKey(Arc<TpmKey>);

impl SigningKey for RustlsKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        offered
            .contains(&SignatureScheme::ECDSA_NISTP256_SHA256)
            .then(|| Box::new(RustlsSigner(self.0.clone())) as Box<dyn Signer>)
    }

    fn algorithm(&self) -> rustls::SignatureAlgorithm {
        rustls::SignatureAlgorithm::ECDSA
    }
}

#[derive(Debug)]
struct RustlsSigner(Arc<TpmKey>);

impl Signer for RustlsSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        self.0.sign(message).map_err(|e| {
            rustls::Error::General(format!(
                "the node key in the TPM did not sign: {}",
                bcd_sys::error::chain(&e)
            ))
        })
    }

    fn scheme(&self) -> SignatureScheme {
        SignatureScheme::ECDSA_NISTP256_SHA256
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_names_its_ak() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![
            rcgen::SanType::URI("urn:bc:node:nd-1".try_into().unwrap()),
            rcgen::SanType::URI(
                bcd_proto::attest::ak_urn(&[0, 0x0b, 0xab, 0xcd])
                    .try_into()
                    .unwrap(),
            ),
        ];
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(certificate_ak(cert.der()), Some(vec![0, 0x0b, 0xab, 0xcd]));
        assert_eq!(
            certificate_spki(cert.der()),
            Some(rcgen::PublicKeyData::subject_public_key_info(&key))
        );
        params.subject_alt_names.truncate(1);
        assert_eq!(
            certificate_ak(params.self_signed(&key).unwrap().der()),
            None
        );
    }
}
