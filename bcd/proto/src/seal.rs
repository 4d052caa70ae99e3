//! Join tokens sealed to the join service: HPKE's sender (RFC 9180, base
//! mode) on ring.
//!
//! A join may pass through a gateway, which must not read the token it
//! relays or spend it on a key of its own. The node seals the token's
//! credential (`<id>.<secret>`) to the join service's X25519 public key,
//! which it learned from the token string (`bct2`, beside the CA pin), with
//! the SHA-256 of its CSR as the associated data: the join service opens it
//! only together with that CSR, so a gateway that copies the sealed bytes
//! into a request for another key gets nothing opened.
//!
//! The suite is DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM
//! (RFC 9180 ids 0x0020, 0x0001, 0x0001), in a single shot: the sealed
//! bytes are the encapsulated key (32 bytes) followed by the AEAD's
//! ciphertext and tag. The join service opens them with the `hpke` crate,
//! a separate implementation (the interop test seals here and opens
//! there). The agent does only the sender's part, on the one crypto
//! provider it already carries: ring's X25519 keys are ephemeral, which is
//! all a sender needs.

use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::agreement::{EphemeralPrivateKey, UnparsedPublicKey, X25519, agree_ephemeral};
use ring::hkdf::{HKDF_SHA256, KeyType, Prk};
use ring::hmac;
use ring::rand::SystemRandom;

/// The HPKE `info` of a sealed join token: a token sealed for anything
/// else opens as nothing here. The `v1` is this format's version.
pub const INFO: &[u8] = b"better-compute join token v1";

/// Length of the encapsulated key that starts the sealed bytes.
pub const ENC_LEN: usize = 32;

/// Length of the AEAD tag that ends them.
pub const TAG_LEN: usize = 16;

const KEM_SUITE: &[u8] = b"KEM\x00\x20";
const HPKE_SUITE: &[u8] = b"HPKE\x00\x20\x00\x01\x00\x01";
const MODE_BASE: u8 = 0;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the join service's seal key is not a valid X25519 public key")]
    BadKey,
    #[error("no randomness for the seal")]
    Rng,
}

/// The associated data a token is sealed under: the SHA-256 of the CSR
/// it travels with.
pub fn aad(csr_der: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, csr_der);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Seals `plaintext` to `recipient` (the join service's X25519 public
/// key) under `aad`: `enc || ciphertext || tag`.
pub fn seal(recipient: &[u8; 32], plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>, SealError> {
    let rng = SystemRandom::new();
    let ephemeral = EphemeralPrivateKey::generate(&X25519, &rng).map_err(|_| SealError::Rng)?;
    let enc = ephemeral.compute_public_key().map_err(|_| SealError::Rng)?;
    let enc: [u8; ENC_LEN] = enc.as_ref().try_into().map_err(|_| SealError::Rng)?;
    let shared = agree_ephemeral(
        ephemeral,
        &UnparsedPublicKey::new(&X25519, recipient),
        |dh| {
            let mut kem_context = Vec::with_capacity(2 * ENC_LEN);
            kem_context.extend_from_slice(&enc);
            kem_context.extend_from_slice(recipient);
            let eae_prk = labeled_extract(KEM_SUITE, &[], b"eae_prk", dh);
            labeled_expand::<32>(&eae_prk, KEM_SUITE, b"shared_secret", &kem_context)
        },
    )
    .map_err(|_| SealError::BadKey)?;
    let (key, nonce) = key_schedule(&shared);
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key).map_err(|_| SealError::Rng)?);
    let mut out = Vec::with_capacity(ENC_LEN + plaintext.len() + TAG_LEN);
    out.extend_from_slice(&enc);
    let mut body = plaintext.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad),
        &mut body,
    )
    .map_err(|_| SealError::Rng)?;
    out.extend_from_slice(&body);
    Ok(out)
}

/// RFC 9180 KeySchedule, base mode with [`INFO`]: the AEAD key and the
/// base nonce (the first and only message takes sequence number 0).
fn key_schedule(shared_secret: &[u8; 32]) -> ([u8; 16], [u8; 12]) {
    let psk_id_hash = labeled_extract(HPKE_SUITE, &[], b"psk_id_hash", &[]);
    let info_hash = labeled_extract(HPKE_SUITE, &[], b"info_hash", INFO);
    let mut context = vec![MODE_BASE];
    context.extend_from_slice(&psk_id_hash);
    context.extend_from_slice(&info_hash);
    let secret = labeled_extract(HPKE_SUITE, shared_secret, b"secret", &[]);
    (
        labeled_expand::<16>(&secret, HPKE_SUITE, b"key", &context),
        labeled_expand::<12>(&secret, HPKE_SUITE, b"base_nonce", &context),
    )
}

/// `LabeledExtract(salt, label, ikm)`: HKDF-Extract is HMAC-SHA256
/// keyed by the salt (an empty salt is HMAC's all-zero key, as RFC 5869
/// says), and its output is used both as bytes and as a PRK.
fn labeled_extract(suite: &[u8], salt: &[u8], label: &[u8], ikm: &[u8]) -> [u8; 32] {
    let mut labeled = Vec::with_capacity(7 + suite.len() + label.len() + ikm.len());
    labeled.extend_from_slice(b"HPKE-v1");
    labeled.extend_from_slice(suite);
    labeled.extend_from_slice(label);
    labeled.extend_from_slice(ikm);
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, salt), &labeled);
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

/// `LabeledExpand(prk, label, info, N)`.
fn labeled_expand<const N: usize>(
    prk: &[u8; 32],
    suite: &[u8],
    label: &[u8],
    info: &[u8],
) -> [u8; N] {
    struct Len(usize);
    impl KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let length = (N as u16).to_be_bytes();
    let parts: [&[u8]; 5] = [&length, b"HPKE-v1", suite, label, info];
    let mut out = [0u8; N];
    Prk::new_less_safe(HKDF_SHA256, prk)
        .expand(&parts, Len(N))
        .and_then(|okm| okm.fill(&mut out))
        .expect("HKDF-SHA256 expands to at most 255 blocks, and these are under one");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpke::aead::AesGcm128;
    use hpke::kdf::HkdfSha256;
    use hpke::kem::X25519HkdfSha256;
    use hpke::{Deserializable, Kem, OpModeR, Serializable};
    use proptest::prelude::*;

    type Keys = (
        <X25519HkdfSha256 as Kem>::PrivateKey,
        <X25519HkdfSha256 as Kem>::PublicKey,
    );

    fn keys(ikm: &[u8]) -> Keys {
        X25519HkdfSha256::derive_keypair(ikm)
    }

    /// Opens as the join service does, with the `hpke` crate.
    fn open(
        sk: &<X25519HkdfSha256 as Kem>::PrivateKey,
        sealed: &[u8],
        aad: &[u8],
    ) -> Option<Vec<u8>> {
        let enc =
            <X25519HkdfSha256 as Kem>::EncappedKey::from_bytes(sealed.get(..ENC_LEN)?).ok()?;
        hpke::single_shot_open::<AesGcm128, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            sk,
            &enc,
            INFO,
            &sealed[ENC_LEN..],
            aad,
        )
        .ok()
    }

    fn public(k: &<X25519HkdfSha256 as Kem>::PublicKey) -> [u8; 32] {
        k.to_bytes().as_slice().try_into().unwrap()
    }

    #[test]
    fn what_this_seals_the_hpke_crate_opens_and_only_under_its_csr() {
        let (sk, pk) = keys(b"join service key material, 32 b!");
        let a = aad(b"csr one");
        let sealed = seal(&public(&pk), b"0123456789abcdef.secret", &a).unwrap();
        assert_eq!(sealed.len(), ENC_LEN + 23 + TAG_LEN);
        assert_eq!(open(&sk, &sealed, &a).unwrap(), b"0123456789abcdef.secret");
        // Another CSR, another recipient, a flipped bit: nothing opens.
        assert_eq!(open(&sk, &sealed, &aad(b"csr two")), None);
        let (other, _) = keys(b"another service's key material!!");
        assert_eq!(open(&other, &sealed, &a), None);
        for i in [0, ENC_LEN, sealed.len() - 1] {
            let mut bent = sealed.clone();
            bent[i] ^= 1;
            assert_eq!(open(&sk, &bent, &a), None, "bit flipped at {i}");
        }
        // A fresh ephemeral key each time.
        assert_ne!(
            seal(&public(&pk), b"x", &a).unwrap()[..ENC_LEN],
            sealed[..ENC_LEN]
        );
    }

    #[test]
    fn a_key_of_low_order_is_refused() {
        assert_eq!(seal(&[0u8; 32], b"x", b""), Err(SealError::BadKey));
    }

    proptest! {
        #[test]
        fn any_plaintext_round_trips(ikm in proptest::collection::vec(any::<u8>(), 32..64),
                                      plain in proptest::collection::vec(any::<u8>(), 0..200),
                                      csr in proptest::collection::vec(any::<u8>(), 0..64)) {
            let (sk, pk) = keys(&ikm);
            let sealed = seal(&public(&pk), &plain, &aad(&csr)).unwrap();
            prop_assert_eq!(open(&sk, &sealed, &aad(&csr)), Some(plain));
        }
    }
}
