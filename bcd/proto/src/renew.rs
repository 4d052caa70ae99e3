//! Renewal's proof of possession: a node proves it holds the key of its
//! current certificate to a join service that does not see its TLS
//! session (a gateway relays the renewal, and a gateway holds no key and
//! must not be able to mint certificates).
//!
//! The proof (`RenewRequest.proof`) is an ECDSA P-256 signature with the
//! current node key over [`statement`]: a domain-separated message binding
//! the node id, the time of the proof (the node's estimate of server time)
//! and the SHA-256 of the request's CSR, so it cannot be replayed for
//! another key or another node, nor later than [`TOLERANCE_MS`]. Both ends
//! build the statement here; [`proof`] bounds and validates the fields the
//! network delivers before anything else looks at them.

use crate::reenrol::{signature_shape, valid_node_id};
use crate::v1;

/// What every renewal statement starts with, so a signature over one can
/// never stand for any other message a node key signs.
pub const DOMAIN: &[u8] = b"better-compute renew v1\0";

/// How far a proof's time may be from the join service's clock, either
/// way.
pub const TOLERANCE_MS: i64 = 60_000;

/// The message the current node key signs: [`DOMAIN`], the node id with
/// its length (4 bytes, big-endian) first, the proof's time (8 bytes,
/// big-endian, milliseconds since the epoch), then the 32-byte SHA-256 of
/// the CSR.
pub fn statement(node_id: &str, time_ms: i64, csr_der: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + 4 + node_id.len() + 8 + 32);
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(&(node_id.len() as u32).to_be_bytes());
    m.extend_from_slice(node_id.as_bytes());
    m.extend_from_slice(&time_ms.to_be_bytes());
    m.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, csr_der).as_ref());
    m
}

/// A proof whose fields are well-formed (not yet verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    pub node_id: String,
    pub time_ms: i64,
    pub signature: Vec<u8>,
    /// What the signature must cover.
    pub statement: Vec<u8>,
}

/// Why a renewal's proof is refused before it is verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the renewal's proof of possession is malformed ({0}); this bcd cannot renew through a \
     gateway: upgrade it, or let it renew against the control plane itself"
)]
pub struct BadProof(pub &'static str);

/// The proof a renewal carries: `None` when it carries none (a node older
/// than the proof), else its validated fields.
pub fn proof(r: &v1::RenewRequest) -> Result<Option<Proof>, BadProof> {
    if r.proof.is_empty() && r.node_id.is_empty() && r.proof_time_ms == 0 {
        return Ok(None);
    }
    if !valid_node_id(&r.node_id) {
        return Err(BadProof("the node id"));
    }
    signature_shape(&r.proof).map_err(BadProof)?;
    if r.proof_time_ms <= 0 {
        return Err(BadProof("the time"));
    }
    Ok(Some(Proof {
        node_id: r.node_id.clone(),
        time_ms: r.proof_time_ms,
        signature: r.proof.clone(),
        statement: statement(&r.node_id, r.proof_time_ms, &r.csr_der),
    }))
}

/// The largest certificate a renewal may carry in its body (x509pop).
pub const MAX_CERT: usize = 16 << 10;

/// How long after its end an expired certificate may still be renewed by
/// proving its key (x509pop), where the control plane allows it.
pub const X509POP_WINDOW_MS: i64 = 7 * 24 * 3_600_000;

/// The certificate an x509pop renewal carries in its body, when it carries
/// one: only with a proof, and bounded.
pub fn expired_cert(r: &v1::RenewRequest) -> Result<Option<&[u8]>, BadProof> {
    if r.expired_cert_der.is_empty() {
        return Ok(None);
    }
    if r.expired_cert_der.len() > MAX_CERT {
        return Err(BadProof("the certificate is too large"));
    }
    if r.proof.is_empty() {
        return Err(BadProof(
            "a certificate sent in the request needs the proof",
        ));
    }
    Ok(Some(&r.expired_cert_der))
}

/// Whether a proof made at `time_ms` is fresh at `now_ms`.
pub fn fresh(time_ms: i64, now_ms: i64) -> bool {
    time_ms.abs_diff(now_ms) <= TOLERANCE_MS as u64
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

    #[test]
    fn the_statement_binds_node_time_and_csr() {
        let base = statement("nd-1", 5, b"csr");
        assert!(base.starts_with(DOMAIN));
        assert_ne!(base, statement("nd-2", 5, b"csr"));
        assert_ne!(base, statement("nd-1", 6, b"csr"));
        assert_ne!(base, statement("nd-1", 5, b"csr2"));
        assert_ne!(
            base,
            crate::reenrol::statement("nd-1", "x", b"csr"),
            "a renewal proof never stands for a re-enrolment proof"
        );
    }

    #[test]
    fn a_real_proof_verifies_only_for_its_statement() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let k = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let m = statement("nd-0123", 1_800_000_000_000, b"csr");
        let req = v1::RenewRequest {
            csr_der: b"csr".to_vec(),
            proof: k.sign(&rng, &m).unwrap().as_ref().to_vec(),
            proof_time_ms: 1_800_000_000_000,
            node_id: "nd-0123".into(),
            expired_cert_der: vec![],
            next_key: None,
        };
        let p = proof(&req).unwrap().unwrap();
        assert_eq!(p.statement, m);
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, k.public_key().as_ref());
        assert!(public.verify(&p.statement, &p.signature).is_ok());
        let moved = v1::RenewRequest {
            csr_der: b"another key".to_vec(),
            ..req
        };
        let p = proof(&moved).unwrap().unwrap();
        assert!(public.verify(&p.statement, &p.signature).is_err());
    }

    #[test]
    fn no_proof_is_none_and_a_partial_one_is_refused() {
        let none = v1::RenewRequest {
            csr_der: b"csr".to_vec(),
            ..Default::default()
        };
        assert_eq!(proof(&none), Ok(None));
        let partial = v1::RenewRequest {
            node_id: "nd-1".into(),
            ..none
        };
        assert!(
            proof(&partial)
                .unwrap_err()
                .to_string()
                .contains("upgrade it")
        );
    }

    #[test]
    fn a_certificate_in_the_request_needs_the_proof_and_is_bounded() {
        let plain = v1::RenewRequest {
            csr_der: b"csr".to_vec(),
            ..Default::default()
        };
        assert_eq!(expired_cert(&plain), Ok(None));
        let unproven = v1::RenewRequest {
            expired_cert_der: b"cert".to_vec(),
            ..plain.clone()
        };
        assert!(expired_cert(&unproven).is_err());
        let proven = v1::RenewRequest {
            proof: vec![0x30; 70],
            ..unproven
        };
        assert_eq!(expired_cert(&proven), Ok(Some(&b"cert"[..])));
        let huge = v1::RenewRequest {
            expired_cert_der: vec![0; MAX_CERT + 1],
            ..proven
        };
        assert!(expired_cert(&huge).is_err());
    }

    #[test]
    fn freshness_is_a_minute_either_way() {
        assert!(fresh(1_000_000, 1_060_000));
        assert!(fresh(1_060_000, 1_000_000));
        assert!(!fresh(1_000_000, 1_060_001));
        assert!(!fresh(i64::MIN, i64::MAX));
    }

    proptest! {
        /// Whatever a peer sends decodes to a renewal whose proof is
        /// either absent, refused, or bounded.
        #[test]
        fn any_bytes_decode_to_a_bounded_proof_or_a_refusal(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some(p)) = v1::RenewRequest::decode(bytes.as_slice()).as_ref().map(proof).unwrap_or(Ok(None)) {
                prop_assert!(p.signature.len() <= crate::reenrol::MAX_SIGNATURE);
                prop_assert!(p.node_id.len() <= crate::reenrol::MAX_NODE_ID);
                prop_assert!(p.time_ms > 0);
            }
            if let Ok(r) = v1::RenewRequest::decode(bytes.as_slice())
                && let Ok(Some(cert)) = expired_cert(&r)
            {
                prop_assert!(cert.len() <= MAX_CERT && !r.proof.is_empty());
            }
        }
    }
}
