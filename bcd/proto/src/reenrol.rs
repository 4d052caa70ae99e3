//! Re-enrolment: a machine that joined before proves it still holds its
//! node key, and the join gives it back the same node.
//!
//! The proof (`JoinRequest.previous`) is the old node id and an ECDSA P-256
//! signature, made with the key of one of that node's unrevoked
//! certificates, over [`statement`]: a domain-separated message binding the
//! node id, the join token's id and the SHA-256 of the request's CSR (and
//! so its new public key). A proof therefore cannot be replayed for another
//! key, another token or another node. Both ends build the statement here;
//! the server checks the signature against the certificates it keeps.
//!
//! The proof's fields come from the network: [`proof`] bounds and
//! validates them before anything else looks at them.

use crate::v1;

/// What every re-enrolment statement starts with, so a signature over one
/// can never stand for any other message a node key signs.
pub const DOMAIN: &[u8] = b"better-compute re-enrol v1\0";

/// The longest node id a proof may name.
pub const MAX_NODE_ID: usize = 64;

/// The longest signature a proof may carry: an ECDSA P-256 signature in
/// ASN.1 DER is at most 72 bytes.
pub const MAX_SIGNATURE: usize = 72;

/// The shortest such signature (two one-byte integers in a sequence).
pub const MIN_SIGNATURE: usize = 8;

/// The message the old node key signs: [`DOMAIN`], then the node id and
/// the token id, each with its length (4 bytes, big-endian) first, then the
/// 32-byte SHA-256 of the CSR.
pub fn statement(node_id: &str, token_id: &str, csr_der: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + 8 + node_id.len() + token_id.len() + 32);
    m.extend_from_slice(DOMAIN);
    for field in [node_id.as_bytes(), token_id.as_bytes()] {
        m.extend_from_slice(&(field.len() as u32).to_be_bytes());
        m.extend_from_slice(field);
    }
    m.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, csr_der).as_ref());
    m
}

/// A proof whose fields are well-formed (not yet verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    pub node_id: String,
    pub signature: Vec<u8>,
}

/// Why a proof is refused before it is verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the join request's previous identity is malformed ({0}): join as a new node: bcd join \
     --new-node --server https://HOST:PORT --token TOKEN"
)]
pub struct BadProof(pub &'static str);

/// Whether `node_id` has the shape a node id may have: 1 to
/// [`MAX_NODE_ID`] characters of lowercase letters, digits and `-`.
pub fn valid_node_id(node_id: &str) -> bool {
    (1..=MAX_NODE_ID).contains(&node_id.len())
        && node_id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `signature` has the shape of an ECDSA P-256 signature in ASN.1
/// DER (its length, and a SEQUENCE whose length is the rest of the bytes);
/// what is wrong if not.
pub fn signature_shape(signature: &[u8]) -> Result<(), &'static str> {
    if !(MIN_SIGNATURE..=MAX_SIGNATURE).contains(&signature.len()) {
        return Err("the signature's length");
    }
    if signature[0] != 0x30 || usize::from(signature[1]) != signature.len() - 2 {
        return Err("the signature is not an ASN.1 ECDSA signature");
    }
    Ok(())
}

/// Validates the proof a join request carries.
pub fn proof(p: &v1::PreviousIdentity) -> Result<Proof, BadProof> {
    if !valid_node_id(&p.node_id) {
        return Err(BadProof("the node id"));
    }
    signature_shape(&p.signature).map_err(BadProof)?;
    Ok(Proof {
        node_id: p.node_id.clone(),
        signature: p.signature.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;
    use ring::rand::SystemRandom;
    use ring::signature::{
        ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair,
        UnparsedPublicKey,
    };

    fn key() -> EcdsaKeyPair {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap()
    }

    #[test]
    fn the_statement_binds_node_token_and_csr() {
        let base = statement("nd-1", "tok", b"csr");
        assert!(base.starts_with(DOMAIN));
        assert_ne!(base, statement("nd-2", "tok", b"csr"));
        assert_ne!(base, statement("nd-1", "tok2", b"csr"));
        assert_ne!(base, statement("nd-1", "tok", b"csr2"));
        // Lengths keep the fields apart.
        assert_ne!(statement("nd-1a", "b", b"c"), statement("nd-1", "ab", b"c"));
    }

    #[test]
    fn a_real_signature_passes_validation_and_verifies_only_for_its_statement() {
        let k = key();
        let rng = SystemRandom::new();
        let m = statement("nd-0123456789ab", "tok", b"csr");
        let sig = k.sign(&rng, &m).unwrap().as_ref().to_vec();
        let p = proof(&v1::PreviousIdentity {
            node_id: "nd-0123456789ab".into(),
            signature: sig.clone(),
        })
        .unwrap();
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, k.public_key().as_ref());
        assert!(public.verify(&m, &p.signature).is_ok());
        let other = statement("nd-0123456789ab", "tok", b"other csr");
        assert!(public.verify(&other, &p.signature).is_err());
    }

    #[test]
    fn malformed_proofs_are_refused_with_what_to_do() {
        let sig = {
            let mut s = vec![0x30, 68];
            s.extend([1; 68]);
            s
        };
        let refused = |node_id: &str, signature: Vec<u8>| {
            proof(&v1::PreviousIdentity {
                node_id: node_id.into(),
                signature,
            })
            .unwrap_err()
        };
        assert_eq!(refused("", sig.clone()), BadProof("the node id"));
        assert_eq!(refused("ND-1", sig.clone()), BadProof("the node id"));
        assert_eq!(
            refused(&"n".repeat(65), sig.clone()),
            BadProof("the node id")
        );
        assert_eq!(
            refused("nd-1", vec![0x30; 73]),
            BadProof("the signature's length")
        );
        assert_eq!(refused("nd-1", vec![]), BadProof("the signature's length"));
        assert_eq!(
            refused("nd-1", [&[0x31, 68][..], &[1; 68]].concat()),
            BadProof("the signature is not an ASN.1 ECDSA signature")
        );
        assert!(refused("", sig).to_string().contains("bcd join --new-node"));
    }

    proptest! {
        /// A join request comes from anyone who can reach the server: any
        /// bytes decode or fail cleanly, and a proof that passes validation
        /// is within its bounds.
        #[test]
        fn any_join_request_is_validated_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(r) = v1::JoinRequest::decode(bytes.as_slice())
                && let Some(p) = r.previous
                && let Ok(ok) = proof(&p)
            {
                prop_assert!(valid_node_id(&ok.node_id));
                prop_assert!(ok.signature.len() <= MAX_SIGNATURE);
            }
        }

        #[test]
        fn any_proof_fields_are_validated_without_panicking(
            node_id in ".{0,80}",
            signature in prop::collection::vec(any::<u8>(), 0..100),
        ) {
            let p = v1::PreviousIdentity { node_id, signature };
            if let Ok(ok) = proof(&p) {
                prop_assert!((1..=MAX_NODE_ID).contains(&ok.node_id.len()));
                prop_assert!((MIN_SIGNATURE..=MAX_SIGNATURE).contains(&ok.signature.len()));
                // Arbitrary bytes shaped like a signature never verify.
                let k = key();
                let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, k.public_key().as_ref());
                prop_assert!(public.verify(&statement(&ok.node_id, "t", b"c"), &ok.signature).is_err());
            }
        }
    }
}
