//! Signed release manifests.
//!
//! A release of bcd is a binary and a manifest naming its version, a
//! sequence number that only grows, the target triple, its size and
//! SHA-256. The manifest is signed with an ed25519 release key whose public
//! half the node carries; the signature covers the manifest's exact bytes,
//! which travel base64-encoded inside the signed file, so no JSON
//! canonicalization is involved. The server and the node share this code:
//! the server refuses to register what does not verify, the node refuses to
//! install it, and both check the binary against the manifest.
#![forbid(unsafe_code)]

pub mod assemble;

use base64::Engine;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: String,
    pub sequence: u64,
    pub target: String,
    pub size: u64,
    pub sha256: String,
    /// Rotates the release key: a node that confirms this release trusts
    /// this key (hex ed25519 public key) from then on, instead of the one
    /// that signed it. Only a release signed with the current key can name
    /// the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_key: Option<String>,
}

/// The file `releases sign` writes and `releases register` uploads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedManifest {
    /// Base64 of the manifest's JSON bytes, as signed.
    pub manifest: String,
    pub key_id: String,
    /// Base64 ed25519 signature over the manifest's bytes.
    pub signature: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    #[error("the signed manifest is malformed: {0}")]
    Malformed(String),
    #[error("the manifest is signed by key {0}, which is not a release key of this fleet")]
    UnknownKey(String),
    #[error("the manifest's signature does not verify (tampered or forged)")]
    BadSignature,
    #[error("the binary is {actual} bytes; the manifest says {expected}")]
    Size { expected: u64, actual: u64 },
    #[error(
        "the binary's SHA-256 is {actual}; the manifest says {expected} (corrupt or truncated download)"
    )]
    Hash { expected: String, actual: String },
    #[error("the binary is for {actual}, not {expected}")]
    Target { expected: String, actual: String },
}

/// `key_id` of a release public key: 16 hex digits of its SHA-256.
pub fn key_id(public_key: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, public_key))[..16].to_string()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// The manifest for `binary`.
pub fn manifest_for(binary: &[u8], version: &str, sequence: u64, target: &str) -> Manifest {
    Manifest {
        version: version.to_string(),
        sequence,
        target: target.to_string(),
        size: binary.len() as u64,
        sha256: sha256_hex(binary),
        next_key: None,
    }
}

/// Checks a `next_key`: 64 hex digits, an ed25519 public key.
pub fn parse_public_key(hex_key: &str) -> Result<Vec<u8>, ReleaseError> {
    hex::decode(hex_key.trim())
        .ok()
        .filter(|k| k.len() == 32)
        .ok_or_else(|| {
            ReleaseError::Malformed(format!(
                "the next release key {hex_key:?} is not 64 hex digits (an ed25519 public key)"
            ))
        })
}

pub fn sign(manifest: &Manifest, key: &Ed25519KeyPair) -> SignedManifest {
    SignedManifest::seal(manifest, key)
}

impl SignedManifest {
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("serializes");
        v.push(b'\n');
        v
    }

    pub fn parse(bytes: &[u8]) -> Result<SignedManifest, ReleaseError> {
        serde_json::from_slice(bytes).map_err(|e| ReleaseError::Malformed(e.to_string()))
    }

    /// Signs any JSON document this way (release manifests, netboot image
    /// manifests): its exact bytes travel base64-encoded beside the
    /// signature.
    pub fn seal<T: Serialize>(doc: &T, key: &Ed25519KeyPair) -> SignedManifest {
        let bytes = serde_json::to_vec(doc).expect("a manifest serializes");
        SignedManifest {
            signature: B64.encode(key.sign(&bytes).as_ref()),
            key_id: key_id(key.public_key().as_ref()),
            manifest: B64.encode(bytes),
        }
    }

    /// The signed bytes, as they were signed.
    pub fn manifest_bytes(&self) -> Result<Vec<u8>, ReleaseError> {
        B64.decode(&self.manifest)
            .map_err(|_| ReleaseError::Malformed("manifest is not base64".into()))
    }

    /// Verifies against `keys` and decodes the document.
    pub fn open<T: serde::de::DeserializeOwned>(
        &self,
        keys: &[Vec<u8>],
    ) -> Result<T, ReleaseError> {
        let bytes = self.verified_bytes(keys)?;
        serde_json::from_slice(&bytes).map_err(|e| ReleaseError::Malformed(e.to_string()))
    }

    /// Verifies against `keys` and returns the signed bytes, not yet
    /// decoded (one copy of the check for every kind of document).
    pub fn verified_bytes(&self, keys: &[Vec<u8>]) -> Result<Vec<u8>, ReleaseError> {
        let key = keys
            .iter()
            .find(|k| key_id(k) == self.key_id)
            .ok_or_else(|| ReleaseError::UnknownKey(self.key_id.clone()))?;
        let bytes = self.manifest_bytes()?;
        let sig = B64
            .decode(&self.signature)
            .map_err(|_| ReleaseError::Malformed("signature is not base64".into()))?;
        UnparsedPublicKey::new(&ED25519, key)
            .verify(&bytes, &sig)
            .map_err(|_| ReleaseError::BadSignature)?;
        Ok(bytes)
    }

    /// Verifies against the release public keys and returns the manifest.
    pub fn verify(&self, keys: &[Vec<u8>]) -> Result<Manifest, ReleaseError> {
        self.open(keys)
    }
}

/// The target triple an ELF binary was built for, as far as its header
/// tells (class, byte order, machine).
pub fn elf_target(binary: &[u8]) -> Option<&'static str> {
    if binary.len() < 20 || &binary[..4] != b"\x7fELF" {
        return None;
    }
    let machine = u16::from_le_bytes([binary[18], binary[19]]);
    match (binary[4], binary[5], machine) {
        (2, 1, 62) => Some("x86_64"),
        (2, 1, 183) => Some("aarch64"),
        _ => None,
    }
}

impl Manifest {
    /// Checks a downloaded binary against this manifest before anything
    /// is switched.
    pub fn check(&self, binary: &[u8]) -> Result<(), ReleaseError> {
        if binary.len() as u64 != self.size {
            return Err(ReleaseError::Size {
                expected: self.size,
                actual: binary.len() as u64,
            });
        }
        let actual = sha256_hex(binary);
        if actual != self.sha256 {
            return Err(ReleaseError::Hash {
                expected: self.sha256.clone(),
                actual,
            });
        }
        let arch = self.target.split('-').next().unwrap_or("");
        match elf_target(binary) {
            Some(a) if a == arch => Ok(()),
            other => Err(ReleaseError::Target {
                expected: self.target.clone(),
                actual: other.unwrap_or("not an ELF executable").to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ring::rand::SystemRandom;

    #[test]
    fn a_next_key_is_signed_with_the_manifest_and_absent_otherwise() {
        let m = manifest_for(b"\x7fELF", "1", 1, "x86_64-unknown-linux-musl");
        let json = String::from_utf8(serde_json::to_vec(&m).unwrap()).unwrap();
        assert!(!json.contains("next_key"), "{json}");
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let next = hex::encode([7u8; 32]);
        let rotating = Manifest {
            next_key: Some(next.clone()),
            ..m
        };
        let signed = sign(&rotating, &key);
        let back = signed
            .verify(&[key.public_key().as_ref().to_vec()])
            .unwrap();
        assert_eq!(back.next_key.as_deref(), Some(next.as_str()));
        assert_eq!(parse_public_key(&next).unwrap(), vec![7u8; 32]);
        assert!(parse_public_key("abc").is_err());
        assert!(parse_public_key(&hex::encode([1u8; 31])).is_err());
    }

    fn key() -> Ed25519KeyPair {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()
    }

    fn elf(len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len.max(64)];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&62u16.to_le_bytes());
        b
    }

    #[test]
    fn sign_verify_and_check() {
        let k = key();
        let keys = vec![k.public_key().as_ref().to_vec()];
        let bin = elf(4096);
        let m = manifest_for(&bin, "0.2.0", 7, "x86_64-unknown-linux-musl");
        let signed = sign(&m, &k);
        let parsed = SignedManifest::parse(&signed.to_json()).unwrap();
        assert_eq!(parsed.verify(&keys).unwrap(), m);
        m.check(&bin).unwrap();
        assert!(matches!(
            m.check(&bin[..100]),
            Err(ReleaseError::Size { .. })
        ));
        let mut other = bin.clone();
        other[100] ^= 1;
        assert!(matches!(m.check(&other), Err(ReleaseError::Hash { .. })));
        let mut arm = bin.clone();
        arm[18..20].copy_from_slice(&183u16.to_le_bytes());
        let arm_m = manifest_for(&arm, "0.2.0", 7, "x86_64-unknown-linux-musl");
        assert!(matches!(
            arm_m.check(&arm),
            Err(ReleaseError::Target { .. })
        ));
    }

    #[test]
    fn forged_and_tampered_manifests_are_refused() {
        let (k, other) = (key(), key());
        let keys = vec![k.public_key().as_ref().to_vec()];
        let m = manifest_for(&elf(64), "0.2.0", 7, "x86_64-unknown-linux-musl");
        assert!(matches!(
            sign(&m, &other).verify(&keys),
            Err(ReleaseError::UnknownKey(_))
        ));
        let mut forged = sign(&m, &other);
        forged.key_id = key_id(k.public_key().as_ref());
        assert_eq!(forged.verify(&keys), Err(ReleaseError::BadSignature));
        let mut tampered = sign(&m, &k);
        let mut m2 = m.clone();
        m2.sequence = 8;
        tampered.manifest = B64.encode(serde_json::to_vec(&m2).unwrap());
        assert_eq!(tampered.verify(&keys), Err(ReleaseError::BadSignature));
        assert!(SignedManifest::parse(b"not json").is_err());
    }

    proptest! {
        /// Signed manifests come from the server and from operators' files:
        /// arbitrary bytes parse or fail cleanly and never verify.
        #[test]
        fn arbitrary_input_never_verifies(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let k = key();
            let keys = vec![k.public_key().as_ref().to_vec()];
            if let Ok(s) = SignedManifest::parse(&bytes) {
                prop_assert!(s.verify(&keys).is_err());
            }
            let _ = elf_target(&bytes);
        }
    }
}
