//! The join response, signed by the fleet CA.
//!
//! A join may pass through a gateway, and a gateway holds no key: it must
//! not be able to hand a joining node worker or release keys of its own
//! (every later command and release would then be its to sign), another
//! CA, or floors below what the store knows. The join service signs
//! [`statement`] (every field the node keeps, bound to the SHA-256 of the
//! node's CSR so a response cannot be replayed to another join) with the
//! fleet CA's key (ECDSA P-256, ASN.1 DER), and the node checks it against
//! the CA certificate it pinned from its token before it saves anything
//! ([`verify`]).

use crate::v1;

/// What every join-response statement starts with, so a signature by the
/// CA key over one stands for nothing else the CA signs (a certificate's
/// to-be-signed part is a DER SEQUENCE, never these bytes).
pub const DOMAIN: &[u8] = b"better-compute join response v1\0";

fn field(m: &mut Vec<u8>, bytes: &[u8]) {
    m.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    m.extend_from_slice(bytes);
}

/// The message the fleet CA signs for a join response to the request
/// whose CSR is `csr_der`: [`DOMAIN`], the CSR's SHA-256, then each field
/// the node keeps, lengths (8 bytes, big-endian) before variable ones,
/// lists with their count first.
pub fn statement(r: &v1::JoinResponse, csr_der: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(512 + r.cert_der.len() + r.ca_der.len());
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, csr_der).as_ref());
    for bytes in [
        r.node_id.as_bytes(),
        &r.cert_der,
        &r.ca_der,
        r.cert_serial.as_bytes(),
    ] {
        field(&mut m, bytes);
    }
    for n in [r.not_after_ms, r.server_time_ms] {
        m.extend_from_slice(&n.to_be_bytes());
    }
    m.extend_from_slice(&r.identity_generation.to_be_bytes());
    for keys in [&r.worker_keys, &r.release_keys] {
        m.extend_from_slice(&(keys.len() as u64).to_be_bytes());
        for k in keys {
            field(&mut m, k);
        }
    }
    let floors = r.floors.unwrap_or_default();
    m.push(u8::from(r.floors.is_some()));
    m.extend_from_slice(&floors.command_seq.to_be_bytes());
    m.extend_from_slice(&floors.spec_generation.to_be_bytes());
    m
}

/// What every image-keys statement starts with.
pub const IMAGE_KEYS_DOMAIN: &[u8] = b"better-compute join image keys v1\0";

/// The message the fleet CA signs for the image keys of a join response to
/// the request whose CSR is `csr_der`: [`IMAGE_KEYS_DOMAIN`], the CSR's
/// SHA-256, the key count (8 bytes, big-endian), then each key with its
/// length first. Apart from [`statement`], so a node that predates image
/// keys still verifies the rest of the response.
pub fn image_keys_statement(r: &v1::JoinResponse, csr_der: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(128 + 40 * r.image_keys.len());
    m.extend_from_slice(IMAGE_KEYS_DOMAIN);
    m.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, csr_der).as_ref());
    m.extend_from_slice(&(r.image_keys.len() as u64).to_be_bytes());
    for k in &r.image_keys {
        field(&mut m, k);
    }
    m
}

/// The image keys a join response hands the node: none without
/// `image_keys_signature` (a control plane that predates them, or one with
/// no image key); refused when the signature is not the fleet CA's over
/// [`image_keys_statement`].
pub fn verified_image_keys(
    r: &v1::JoinResponse,
    csr_der: &[u8],
    pinned_ca: &[u8],
) -> Result<Vec<Vec<u8>>, Unsigned> {
    if r.image_keys_signature.is_empty() {
        if r.image_keys.is_empty() {
            return Ok(vec![]);
        }
        return Err(Unsigned::Forged);
    }
    check(
        &r.image_keys_signature,
        &image_keys_statement(r, csr_der),
        pinned_ca,
    )?;
    Ok(r.image_keys.clone())
}

/// What every renewal-response statement starts with.
pub const RENEWAL_DOMAIN: &[u8] = b"better-compute renew response v1\0";

/// The message the fleet CA signs for a renewal response to the request
/// whose CSR is `csr_der`: [`RENEWAL_DOMAIN`], the CSR's SHA-256, the
/// certificate and serial (lengths first), then the two times.
pub fn renewal_statement(r: &v1::RenewResponse, csr_der: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(128 + r.cert_der.len());
    m.extend_from_slice(RENEWAL_DOMAIN);
    m.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, csr_der).as_ref());
    field(&mut m, &r.cert_der);
    field(&mut m, r.cert_serial.as_bytes());
    for n in [r.not_after_ms, r.server_time_ms] {
        m.extend_from_slice(&n.to_be_bytes());
    }
    m
}

/// Checks a renewal response against the node's fleet CA (DER).
pub fn verify_renewal(r: &v1::RenewResponse, csr_der: &[u8], ca: &[u8]) -> Result<(), Unsigned> {
    check(&r.signature, &renewal_statement(r, csr_der), ca)
}

/// Why a join response is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsigned {
    #[error(
        "the response carries no signature of the fleet CA (the control plane is older than \
         this bcd, or something between them removed it): nothing was saved; upgrade the \
         control plane, or reach it directly"
    )]
    Missing,
    #[error(
        "the response is not signed by the fleet CA the token pins (a gateway between this \
         node and the control plane altered it): nothing was saved; go through another \
         gateway, and tell the operator"
    )]
    Forged,
}

/// Checks a join response against the CA certificate `pinned_ca` (DER)
/// that the node's token pins.
pub fn verify(r: &v1::JoinResponse, csr_der: &[u8], pinned_ca: &[u8]) -> Result<(), Unsigned> {
    check(&r.signature, &statement(r, csr_der), pinned_ca)
}

fn check(signature: &[u8], statement: &[u8], ca: &[u8]) -> Result<(), Unsigned> {
    if signature.is_empty() {
        return Err(Unsigned::Missing);
    }
    let der = rustls_pki_types::CertificateDer::from(ca);
    let ca = webpki::EndEntityCert::try_from(&der).map_err(|_| Unsigned::Forged)?;
    ca.verify_signature(webpki::ring::ECDSA_P256_SHA256, statement, signature)
        .map_err(|_| Unsigned::Forged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response() -> v1::JoinResponse {
        v1::JoinResponse {
            node_id: "nd-1".into(),
            cert_der: vec![1, 2],
            ca_der: vec![3],
            cert_serial: "ab".into(),
            not_after_ms: 5,
            server_time_ms: 4,
            worker_keys: vec![vec![7; 32]],
            identity_generation: 1,
            release_keys: vec![vec![8; 32]],
            floors: Some(v1::ReplayFloors {
                command_seq: 2,
                spec_generation: 3,
            }),
            signature: vec![],
            image_keys: vec![vec![9; 32]],
            image_keys_signature: vec![],
        }
    }

    #[test]
    fn the_image_keys_statement_covers_the_keys_and_the_join() {
        let base = image_keys_statement(&response(), b"csr");
        assert!(base.starts_with(IMAGE_KEYS_DOMAIN));
        assert_ne!(base, image_keys_statement(&response(), b"another csr"));
        let changes: Vec<Change> = vec![
            Box::new(|r| r.image_keys.clear()),
            Box::new(|r| r.image_keys[0][0] ^= 1),
            Box::new(|r| r.image_keys.push(vec![9; 32])),
            // Two keys made one.
            Box::new(|r| {
                r.image_keys = vec![vec![9; 16], vec![9; 16]];
            }),
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut r = response();
            change(&mut r);
            assert_ne!(image_keys_statement(&r, b"csr"), base, "change {i}");
        }
        // The image keys are not in the main statement: a node that
        // predates them verifies a response that carries them.
        let mut more = response();
        more.image_keys.push(vec![1; 32]);
        assert_eq!(statement(&more, b"csr"), statement(&response(), b"csr"));
        // Unsigned keys are refused; no keys and no signature is none.
        assert_eq!(
            verified_image_keys(&response(), b"csr", b"ca"),
            Err(Unsigned::Forged)
        );
        let mut none = response();
        none.image_keys.clear();
        assert_eq!(verified_image_keys(&none, b"csr", b"ca"), Ok(vec![]));
        let mut garbage = response();
        garbage.image_keys_signature = vec![1, 2, 3];
        assert_eq!(
            verified_image_keys(&garbage, b"csr", b"ca"),
            Err(Unsigned::Forged)
        );
    }

    type Change = Box<dyn Fn(&mut v1::JoinResponse)>;

    #[test]
    fn every_field_the_node_keeps_is_in_the_statement() {
        let base = statement(&response(), b"csr");
        assert!(base.starts_with(DOMAIN));
        assert_ne!(base, statement(&response(), b"another csr"));
        let changes: Vec<Change> = vec![
            Box::new(|r| r.node_id.push('x')),
            Box::new(|r| r.cert_der.push(0)),
            Box::new(|r| r.ca_der.push(0)),
            Box::new(|r| r.cert_serial.push('0')),
            Box::new(|r| r.not_after_ms += 1),
            Box::new(|r| r.server_time_ms += 1),
            Box::new(|r| r.identity_generation += 1),
            Box::new(|r| r.worker_keys.push(vec![9; 32])),
            Box::new(|r| r.worker_keys[0][0] ^= 1),
            Box::new(|r| r.release_keys.clear()),
            Box::new(|r| r.floors = None),
            Box::new(|r| r.floors.as_mut().unwrap().command_seq = 0),
            Box::new(|r| r.floors.as_mut().unwrap().spec_generation = 0),
            // A key moved from one list to the other.
            Box::new(|r| {
                let k = r.worker_keys.pop().unwrap();
                r.release_keys.push(k);
            }),
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut r = response();
            change(&mut r);
            assert_ne!(statement(&r, b"csr"), base, "change {i}");
        }
        let mut signed = response();
        signed.signature = vec![1, 2, 3];
        assert_eq!(
            statement(&signed, b"csr"),
            base,
            "the signature itself is not signed"
        );
    }

    #[test]
    fn the_renewal_statement_covers_its_times() {
        let r = v1::RenewResponse {
            cert_der: vec![1],
            cert_serial: "ab".into(),
            not_after_ms: 10,
            server_time_ms: 5,
            signature: vec![],
        };
        let base = renewal_statement(&r, b"csr");
        assert!(base.starts_with(RENEWAL_DOMAIN));
        for changed in [
            v1::RenewResponse {
                not_after_ms: 11,
                ..r.clone()
            },
            v1::RenewResponse {
                server_time_ms: 6,
                ..r.clone()
            },
            v1::RenewResponse {
                cert_der: vec![2],
                ..r.clone()
            },
        ] {
            assert_ne!(renewal_statement(&changed, b"csr"), base);
        }
        assert_ne!(renewal_statement(&r, b"other"), base);
        assert_eq!(verify_renewal(&r, b"csr", b"x"), Err(Unsigned::Missing));
    }

    #[test]
    fn a_missing_or_garbage_signature_is_refused() {
        assert_eq!(
            verify(&response(), b"csr", b"not a cert"),
            Err(Unsigned::Missing)
        );
        let mut r = response();
        r.signature = vec![0x30, 0x06, 2, 1, 1, 2, 1, 1];
        assert_eq!(verify(&r, b"csr", b"not a cert"), Err(Unsigned::Forged));
    }
}
