//! Signed envelopes: worker keys (ed25519) sign commands, specs and
//! statements about nodes (deleted, revoked); nodes verify them against the
//! worker public keys they learned at join. The gateway relays the stored
//! envelope bytes verbatim and can forge nothing.

use prost::Message;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

use crate::v1::{self, SignedEnvelope};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the envelope does not decode")]
    Malformed,
    #[error("no worker key known to this node (joined before worker keys existed?): join again")]
    NoKeys,
    #[error("not signed by a worker key of this fleet (key {0})")]
    UnknownKey(String),
    #[error("the signature does not verify (tampered or forged)")]
    BadSignature,
}

/// `key_id` of a public key: 16 hex digits of its SHA-256.
pub fn key_id(public_key: &[u8]) -> String {
    crate::fingerprint(public_key)[..16].to_string()
}

/// Signs `payload` and returns the encoded envelope.
pub fn seal(key: &Ed25519KeyPair, payload: Vec<u8>) -> Vec<u8> {
    let signature = key.sign(&payload).as_ref().to_vec();
    SignedEnvelope {
        key_id: key_id(key.public_key().as_ref()),
        payload,
        signature,
    }
    .encode_to_vec()
}

/// Verifies an encoded envelope against `keys` (raw ed25519 public keys)
/// and returns its payload.
pub fn open(envelope: &[u8], keys: &[Vec<u8>]) -> Result<Vec<u8>, VerifyError> {
    let env = SignedEnvelope::decode(envelope).map_err(|_| VerifyError::Malformed)?;
    if keys.is_empty() {
        return Err(VerifyError::NoKeys);
    }
    let key = keys
        .iter()
        .find(|k| key_id(k) == env.key_id)
        .ok_or_else(|| VerifyError::UnknownKey(env.key_id.clone()))?;
    UnparsedPublicKey::new(&ED25519, key)
        .verify(&env.payload, &env.signature)
        .map_err(|_| VerifyError::BadSignature)?;
    Ok(env.payload)
}

/// A payload a worker key signs that names what it is for (its `purpose`
/// field), so that no other payload a worker key signs opens as one.
pub trait Purposed: Message + Default {
    /// What the `purpose` field always says.
    const PURPOSE: &'static str;
    fn purpose_mut(&mut self) -> &mut String;
}

/// Why a payload that names its purpose was not opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PurposeError {
    #[error(transparent)]
    Envelope(#[from] VerifyError),
    /// Signed, but another payload (or none that decodes).
    #[error("the signed payload is for something else")]
    Other,
}

/// Signs `payload` (its purpose set here) with a worker key.
pub fn seal_as<M: Purposed>(key: &Ed25519KeyPair, mut payload: M) -> Vec<u8> {
    *payload.purpose_mut() = M::PURPOSE.to_string();
    seal(key, payload.encode_to_vec())
}

/// Opens a payload of `M`: it verifies against the worker `keys`, decodes
/// and names `M`'s purpose. Whose and for what is the caller's to check.
pub fn open_as<M: Purposed>(envelope: &[u8], keys: &[Vec<u8>]) -> Result<M, PurposeError> {
    let payload = open(envelope, keys)?;
    let mut m = M::decode(payload.as_slice()).map_err(|_| PurposeError::Other)?;
    if m.purpose_mut() != M::PURPOSE {
        return Err(PurposeError::Other);
    }
    Ok(m)
}

macro_rules! purposed {
    ($($m:ty => $purpose:expr),* $(,)?) => {$(
        impl Purposed for $m {
            const PURPOSE: &'static str = $purpose;
            fn purpose_mut(&mut self) -> &mut String {
                &mut self.purpose
            }
        }
    )*};
}

purposed! {
    v1::GatewayRevocations => "better-compute gateway revocations v1",
    v1::ResultReceipt => "better-compute result receipt v1",
    v1::EventReceipt => "better-compute event receipt v1",
    v1::OperatorRevocation => "better-compute operator revocation v1",
}

/// Seals a statement about a node.
pub fn seal_statement(key: &Ed25519KeyPair, statement: &v1::NodeStatement) -> Vec<u8> {
    seal(key, statement.encode_to_vec())
}

/// Opens a statement about a node: it verifies against `keys` and decodes.
/// Whether it is about this node is the caller's decision
/// (`bcd_core::Statement::confirms`).
pub fn open_statement(envelope: &[u8], keys: &[Vec<u8>]) -> Result<v1::NodeStatement, VerifyError> {
    let payload = open(envelope, keys)?;
    v1::NodeStatement::decode(payload.as_slice()).map_err(|_| VerifyError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_opens_only_as_what_it_was_signed_for() {
        let k = Ed25519KeyPair::from_seed_unchecked(&[3; 32]).unwrap();
        let keys = vec![k.public_key().as_ref().to_vec()];
        let revocation = v1::OperatorRevocation {
            name: "alice".into(),
            cert_sha256: "ab".repeat(32),
            revoked_at_ms: 5,
            ..Default::default()
        };
        let sealed = seal_as(&k, revocation.clone());
        let opened: v1::OperatorRevocation = open_as(&sealed, &keys).unwrap();
        assert_eq!(opened.purpose, "better-compute operator revocation v1");
        assert_eq!(opened.cert_sha256, revocation.cert_sha256);
        // The same bytes as another purposed payload, or with no purpose.
        assert_eq!(
            open_as::<v1::EventReceipt>(&sealed, &keys).unwrap_err(),
            PurposeError::Other
        );
        let bare = seal(&k, revocation.encode_to_vec());
        assert_eq!(
            open_as::<v1::OperatorRevocation>(&bare, &keys).unwrap_err(),
            PurposeError::Other
        );
        let other = Ed25519KeyPair::from_seed_unchecked(&[4; 32]).unwrap();
        assert!(matches!(
            open_as::<v1::OperatorRevocation>(&seal_as(&other, revocation), &keys),
            Err(PurposeError::Envelope(VerifyError::UnknownKey(_)))
        ));
    }
    use proptest::prelude::*;
    use ring::rand::SystemRandom;

    fn key() -> Ed25519KeyPair {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()
    }

    #[test]
    fn verifies_and_refuses() {
        let (k, other) = (key(), key());
        let keys = vec![k.public_key().as_ref().to_vec()];
        let sealed = seal(&k, b"hello".to_vec());
        assert_eq!(open(&sealed, &keys).unwrap(), b"hello");
        assert_eq!(open(&sealed, &[]), Err(VerifyError::NoKeys));
        let foreign = seal(&other, b"hello".to_vec());
        assert!(matches!(
            open(&foreign, &keys),
            Err(VerifyError::UnknownKey(_))
        ));
        // Another key claiming our key id.
        let mut env = SignedEnvelope::decode(foreign.as_slice()).unwrap();
        env.key_id = key_id(k.public_key().as_ref());
        assert_eq!(
            open(&env.encode_to_vec(), &keys),
            Err(VerifyError::BadSignature)
        );
        let mut env = SignedEnvelope::decode(sealed.as_slice()).unwrap();
        env.payload = b"hellp".to_vec();
        assert_eq!(
            open(&env.encode_to_vec(), &keys),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(open(b"\xff\xff\xff", &keys), Err(VerifyError::Malformed));
    }

    #[test]
    fn statements_open_only_with_a_worker_key() {
        let (k, other) = (key(), key());
        let keys = vec![k.public_key().as_ref().to_vec()];
        let st = v1::NodeStatement {
            node_id: "nd-1".into(),
            kind: v1::NodeStatementKind::Deleted as i32,
            reason: "node-deleted".into(),
            ..Default::default()
        };
        assert_eq!(open_statement(&seal_statement(&k, &st), &keys).unwrap(), st);
        assert!(open_statement(&seal_statement(&other, &st), &keys).is_err());
        assert!(open_statement(b"", &keys).is_err());
    }

    proptest! {
        /// Envelopes come from the network: any bytes decode or fail
        /// cleanly, and a flipped bit never verifies.
        #[test]
        fn arbitrary_bytes_never_verify(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let k = key();
            let keys = vec![k.public_key().as_ref().to_vec()];
            prop_assert!(open(&bytes, &keys).is_err());
        }

        #[test]
        fn any_bit_flip_is_caught(payload in prop::collection::vec(any::<u8>(), 1..256), bit in any::<usize>()) {
            let k = key();
            let keys = vec![k.public_key().as_ref().to_vec()];
            let mut sealed = seal(&k, payload.clone());
            let i = bit % (sealed.len() * 8);
            sealed[i / 8] ^= 1 << (i % 8);
            prop_assert!(open(&sealed, &keys).is_err(), "a flipped bit verified");
        }
    }
}
