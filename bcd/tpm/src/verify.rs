//! The server's side of attestation, in software (no TPM): MakeCredential
//! against an EK public key and an AK name, and the verification of a
//! TPM2_Certify statement signed by the AK. TPM 2.0 Part 1, "Credential
//! Protection" (KDFa, KDFe, the STORAGE and INTEGRITY keys, AES-128-CFB, the
//! outer HMAC); RSA EKs by OAEP (SHA-256, label "IDENTITY"), ECC EKs by an
//! ephemeral ECDH and KDFe.

use ring::rand::{SecureRandom, SystemRandom};
use ring::{agreement, hmac, signature};

use crate::attest::{CertifyInfo, EcdsaSignature};
use crate::public::{Name, PublicArea, PublicKey, alg, attr, digest_len};
use crate::wire::{Malformed, Put};

/// Why a credential cannot be made or a statement does not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("the public area does not parse")]
    Malformed(#[from] Malformed),
    #[error("{0}")]
    Unsupported(String),
    #[error("the AK's signature over the attestation does not verify")]
    BadSignature,
    #[error("the attestation certifies {actual}, not the expected key {expected}")]
    WrongName { expected: Name, actual: Name },
    #[error("the attestation's qualifying data is not the expected nonce")]
    WrongQualifyingData,
    #[error("no randomness from the system")]
    Random,
}

/// A credential for TPM2_ActivateCredential: the TPM2_ID_OBJECT and
/// TPM2B_ENCRYPTED_SECRET bytes, size prefixes included, as the node passes
/// them on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub blob: Vec<u8>,
    pub secret: Vec<u8>,
}

/// KDFa (SP 800-108 counter mode with HMAC), SHA-256; `label` without its
/// terminating zero, which this adds.
pub fn kdfa_sha256(
    key: &[u8],
    label: &str,
    context_u: &[u8],
    context_v: &[u8],
    bits: u32,
) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let want = bits.div_ceil(8) as usize;
    let mut out = Vec::with_capacity(want + 32);
    let mut counter: u32 = 1;
    while out.len() < want {
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(&counter.to_be_bytes());
        ctx.update(label.as_bytes());
        ctx.update(&[0]);
        ctx.update(context_u);
        ctx.update(context_v);
        ctx.update(&bits.to_be_bytes());
        out.extend_from_slice(ctx.sign().as_ref());
        counter += 1;
    }
    out.truncate(want);
    out
}

/// KDFe (SP 800-56A concatenation KDF), SHA-256; `label` without its
/// terminating zero, which this adds.
pub fn kdfe_sha256(z: &[u8], label: &str, party_u: &[u8], party_v: &[u8], bits: u32) -> Vec<u8> {
    let want = bits.div_ceil(8) as usize;
    let mut out = Vec::with_capacity(want + 32);
    let mut counter: u32 = 1;
    while out.len() < want {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(&counter.to_be_bytes());
        ctx.update(z);
        ctx.update(label.as_bytes());
        ctx.update(&[0]);
        ctx.update(party_u);
        ctx.update(party_v);
        out.extend_from_slice(ctx.finish().as_ref());
        counter += 1;
    }
    out.truncate(want);
    out
}

/// Checks that an EK public area is one this module can make credentials
/// for: a restricted decryption key with SHA-256 names and AES-128-CFB
/// protection (the TCG default EK templates, RSA 2048 or ECC P-256).
fn check_ek(ek: &PublicArea) -> Result<(), VerifyError> {
    let want = attr::RESTRICTED | attr::DECRYPT | attr::FIXED_TPM | attr::FIXED_PARENT;
    if ek.attributes & want != want || ek.attributes & attr::SIGN != 0 {
        return Err(VerifyError::Unsupported(format!(
            "the EK's attributes {:#010x} are not a restricted decryption key's",
            ek.attributes
        )));
    }
    if ek.name_alg != alg::SHA256 {
        return Err(VerifyError::Unsupported(format!(
            "the EK's name algorithm {:#06x} is not SHA-256",
            ek.name_alg
        )));
    }
    match ek.symmetric {
        Some(s) if s.algorithm == alg::AES && s.key_bits == 128 && s.mode == alg::CFB => Ok(()),
        other => Err(VerifyError::Unsupported(format!(
            "the EK's symmetric protection {other:?} is not AES-128-CFB"
        ))),
    }
}

/// Checks that an AK public area is a restricted ECDSA P-256 signing key
/// that cannot leave its TPM (what the node claims when it sends its AK).
pub fn check_ak(ak: &PublicArea) -> Result<(), VerifyError> {
    let want = attr::RESTRICTED
        | attr::SIGN
        | attr::FIXED_TPM
        | attr::FIXED_PARENT
        | attr::SENSITIVE_DATA_ORIGIN;
    if ak.attributes & want != want || ak.attributes & attr::DECRYPT != 0 {
        return Err(VerifyError::Unsupported(format!(
            "the AK's attributes {:#010x} are not a restricted TPM-bound signing key's",
            ak.attributes
        )));
    }
    if !ak.is_p256_ecdsa_signing() || ak.name_alg != alg::SHA256 {
        return Err(VerifyError::Unsupported(
            "the AK is not an ECDSA P-256 / SHA-256 key".to_owned(),
        ));
    }
    Ok(())
}

/// Checks that a certified node key is a TPM-bound ECDSA P-256 signing key.
pub fn check_node_key(key: &PublicArea) -> Result<(), VerifyError> {
    let want = attr::SIGN | attr::FIXED_TPM | attr::FIXED_PARENT | attr::SENSITIVE_DATA_ORIGIN;
    if key.attributes & want != want {
        return Err(VerifyError::Unsupported(format!(
            "the node key's attributes {:#010x} are not a TPM-bound signing key's",
            key.attributes
        )));
    }
    if !key.is_p256_ecdsa_signing() {
        return Err(VerifyError::Unsupported(
            "the node key is not an ECDSA P-256 / SHA-256 key".to_owned(),
        ));
    }
    Ok(())
}

/// Adapts ring's system random source to the `rsa` crate's RNG trait.
struct RingRng<'a>(&'a dyn SecureRandom);

impl rsa::rand_core::RngCore for RingRng<'_> {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        // The system source does not fail on Linux once booted; a failure
        // here would make every key and nonce of the process unsafe.
        self.0.fill(dest).expect("the system random source failed");
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rsa::rand_core::Error> {
        self.0
            .fill(dest)
            .map_err(|_| rsa::rand_core::Error::new("the system random source failed"))
    }
}

impl rsa::rand_core::CryptoRng for RingRng<'_> {}

/// Makes a credential that only the TPM holding `ek`'s private key can
/// activate, and only for the object named `ak_name` (TPM2_MakeCredential
/// in software). `secret` is at most 32 bytes.
pub fn make_credential(
    ek: &PublicArea,
    ak_name: &Name,
    secret: &[u8],
) -> Result<Credential, VerifyError> {
    make_credential_with(&SystemRandom::new(), ek, ak_name, secret)
}

/// [`make_credential`] with a chosen random source.
pub fn make_credential_with(
    rng: &dyn SecureRandom,
    ek: &PublicArea,
    ak_name: &Name,
    secret: &[u8],
) -> Result<Credential, VerifyError> {
    check_ek(ek)?;
    let digest = digest_len(ek.name_alg).unwrap_or(32);
    if secret.len() > digest {
        return Err(VerifyError::Unsupported(format!(
            "a credential of {} bytes is over the EK's limit of {digest}",
            secret.len()
        )));
    }
    let (seed, encrypted) = match &ek.key {
        PublicKey::Rsa {
            exponent, modulus, ..
        } => {
            let mut seed = vec![0u8; digest];
            rng.fill(&mut seed).map_err(|_| VerifyError::Random)?;
            let e = if *exponent == 0 { 65537 } else { *exponent };
            let key =
                rsa::RsaPublicKey::new(rsa::BigUint::from_bytes_be(modulus), rsa::BigUint::from(e))
                    .map_err(|e| VerifyError::Unsupported(format!("the EK's RSA key: {e}")))?;
            let padding = rsa::Oaep::new_with_label::<sha2::Sha256, _>("IDENTITY\0");
            let encrypted = key
                .encrypt(&mut RingRng(rng), padding, &seed)
                .map_err(|e| VerifyError::Unsupported(format!("RSA-OAEP: {e}")))?;
            (seed, encrypted)
        }
        PublicKey::Ecc { .. } => {
            let ek_point = ek.p256_point().ok_or_else(|| {
                VerifyError::Unsupported("the EK's curve is not NIST P-256".to_owned())
            })?;
            let ephemeral = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, rng)
                .map_err(|_| VerifyError::Random)?;
            let ephemeral_public = ephemeral
                .compute_public_key()
                .map_err(|_| VerifyError::Random)?;
            let point = ephemeral_public.as_ref();
            let (ex, ey) = (&point[1..33], &point[33..65]);
            let peer = agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, ek_point);
            let mut ek_x = [0u8; 32];
            ek_x.copy_from_slice(&ek_point[1..33]);
            let seed = agreement::agree_ephemeral(ephemeral, &peer, |z| {
                kdfe_sha256(z, "IDENTITY", ex, &ek_x, 8 * digest as u32)
            })
            .map_err(|_| VerifyError::Unsupported("the EK's point is not on P-256".to_owned()))?;
            let mut encrypted = Vec::with_capacity(68);
            encrypted.put_tpm2b(ex);
            encrypted.put_tpm2b(ey);
            (seed, encrypted)
        }
    };

    let sym_key = kdfa_sha256(&seed, "STORAGE", ak_name.as_bytes(), &[], 128);
    let hmac_key = kdfa_sha256(&seed, "INTEGRITY", &[], &[], 8 * digest as u32);

    let mut enc_identity = Vec::with_capacity(secret.len() + 2);
    enc_identity.put_tpm2b(secret);
    {
        use aes::cipher::{AsyncStreamCipher, KeyIvInit};
        let key: [u8; 16] = sym_key[..16].try_into().unwrap_or([0; 16]);
        cfb_mode::Encryptor::<aes::Aes128>::new(&key.into(), &[0u8; 16].into())
            .encrypt(&mut enc_identity);
    }

    let key = hmac::Key::new(hmac::HMAC_SHA256, &hmac_key);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(&enc_identity);
    ctx.update(ak_name.as_bytes());
    let outer = ctx.sign();

    let mut id_object = Vec::with_capacity(2 + outer.as_ref().len() + enc_identity.len());
    id_object.put_tpm2b(outer.as_ref());
    id_object.extend_from_slice(&enc_identity);

    let mut blob = Vec::with_capacity(id_object.len() + 2);
    blob.put_tpm2b(&id_object);
    let mut secret_out = Vec::with_capacity(encrypted.len() + 2);
    secret_out.put_tpm2b(&encrypted);
    Ok(Credential {
        blob,
        secret: secret_out,
    })
}

/// Verifies a TPM2_Certify statement: `signature` (TPMT_SIGNATURE) is the
/// AK's over `attest` (TPMS_ATTEST), which certifies the object named
/// `expected_name` with `expected_qualifying_data` (the server's nonce).
pub fn verify_certify(
    ak: &PublicArea,
    attest: &[u8],
    signature_bytes: &[u8],
    expected_name: &Name,
    expected_qualifying_data: &[u8],
) -> Result<CertifyInfo, VerifyError> {
    check_ak(ak)?;
    let point = ak
        .p256_point()
        .ok_or_else(|| VerifyError::Unsupported("the AK is not a P-256 key".to_owned()))?;
    let sig = EcdsaSignature::from_tpmt(signature_bytes)?;
    signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
        .verify(attest, &sig.to_fixed())
        .map_err(|_| VerifyError::BadSignature)?;
    let info = CertifyInfo::parse(attest)?;
    if info.extra_data != expected_qualifying_data {
        return Err(VerifyError::WrongQualifyingData);
    }
    if &info.name != expected_name {
        return Err(VerifyError::WrongName {
            expected: expected_name.clone(),
            actual: info.name,
        });
    }
    Ok(info)
}

/// Verifies an ECDSA P-256 / SHA-256 signature (DER, as TLS and X.509 carry
/// it) by a TPM key over `message`.
pub fn verify_signature(key: &PublicArea, message: &[u8], der_signature: &[u8]) -> bool {
    key.p256_point().is_some_and(|point| {
        signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, point)
            .verify(message, der_signature)
            .is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::public::{EkKind, ak_template};
    use proptest::prelude::*;

    proptest! {
        // An EK public area comes from the peer: whatever key it holds,
        // making a credential for it returns an error or a credential.
        #[test]
        fn credentials_for_arbitrary_eks_never_panic(
            rsa in any::<bool>(),
            key in proptest::collection::vec(any::<u8>(), 0..300),
            secret in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut t = if rsa { EkKind::Rsa2048.template() } else { EkKind::EccP256.template() };
            if rsa {
                t.truncate(t.len() - 258);
                t.put_tpm2b(&key);
            } else {
                t.truncate(t.len() - 68);
                let (x, y) = key.split_at(key.len() / 2);
                t.put_tpm2b(&x[..x.len().min(128)]);
                t.put_tpm2b(&y[..y.len().min(128)]);
            }
            let ek = PublicArea::from_tpmt(&t).unwrap();
            let name = ek.name();
            if let Ok(c) = make_credential(&ek, &name, &secret) {
                prop_assert!(secret.len() <= 32);
                prop_assert_eq!(c.blob.len(), 2 + 2 + 32 + 2 + secret.len());
            }
        }
    }

    // Computed with Python's hmac and hashlib from the formulas of TPM 2.0
    // Part 1, 11.4.10 (an implementation independent of this one).
    #[test]
    fn kdfa_vector() {
        let out = kdfa_sha256(&[0x11; 32], "STORAGE", b"\x00\x0bname", b"", 128);
        assert_eq!(hex::encode(out), KDFA_STORAGE_128);
        let out = kdfa_sha256(&[0x11; 32], "INTEGRITY", b"", b"", 256);
        assert_eq!(hex::encode(out), KDFA_INTEGRITY_256);
        // More than one HMAC block, cut to 65 bytes.
        let out = kdfa_sha256(b"k", "L", b"u", b"v", 520);
        assert_eq!(hex::encode(out), KDFA_LONG_520);
    }

    #[test]
    fn kdfe_vector() {
        let out = kdfe_sha256(&[0x22; 32], "IDENTITY", &[0x33; 32], &[0x44; 32], 256);
        assert_eq!(hex::encode(out), KDFE_IDENTITY_256);
    }

    const KDFA_STORAGE_128: &str = "4ea1d643299284a6856019c8c8492cd8";
    const KDFA_INTEGRITY_256: &str =
        "94789f5bdf2e06996955def207b39ac5450e89e24dd1474bd9efc38901e2fd81";
    const KDFE_IDENTITY_256: &str =
        "f59da144d928b82a7aceb16c1dbc3c5b0588ef575d1baefaade7131ba5f2c6a5";
    const KDFA_LONG_520: &str = "7e6644f79783091b1c84c9ace92af323df309ac6bc40730cfbf19339f011bb08\
        f1398b11c9146fc3335c019c00da1f55254252ecd1bc9c0b75a7c51096c49be4dd";

    #[test]
    fn credentials_refuse_what_a_tpm_would() {
        let ak = PublicArea::from_tpmt(&ak_template()).unwrap();
        let ek_template = PublicArea::from_tpmt(&EkKind::EccP256.template()).unwrap();
        // The template's zero point is not on the curve.
        assert!(make_credential(&ek_template, &ak.name(), b"s").is_err());
        // An AK is not an EK.
        let err = make_credential(&ak, &ak.name(), b"s").unwrap_err();
        assert!(err.to_string().contains("restricted decryption"), "{err}");
        // A restricted decryption key is not an AK.
        assert!(check_ak(&ek_template).is_err());
        assert!(check_ak(&ak).is_ok());
    }
}
