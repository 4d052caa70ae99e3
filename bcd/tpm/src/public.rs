//! TPM public areas (TPMT_PUBLIC): the key templates this crate asks TPMs
//! for, the parser for public areas that come from a TPM or a peer, object
//! names, and the SubjectPublicKeyInfo (DER) a certificate carries for the
//! same key.

use std::fmt;

use crate::wire::{Malformed, Put, Reader, hex, tpm2b};

/// TPM_ALG_ID values this crate reads or writes.
pub mod alg {
    pub const RSA: u16 = 0x0001;
    pub const SHA1: u16 = 0x0004;
    pub const AES: u16 = 0x0006;
    pub const KEYEDHASH: u16 = 0x0008;
    pub const SHA256: u16 = 0x000B;
    pub const SHA384: u16 = 0x000C;
    pub const SHA512: u16 = 0x000D;
    pub const NULL: u16 = 0x0010;
    pub const SM4: u16 = 0x0013;
    pub const RSASSA: u16 = 0x0014;
    pub const RSAES: u16 = 0x0015;
    pub const RSAPSS: u16 = 0x0016;
    pub const OAEP: u16 = 0x0017;
    pub const ECDSA: u16 = 0x0018;
    pub const ECDH: u16 = 0x0019;
    pub const ECDAA: u16 = 0x001A;
    pub const SM2: u16 = 0x001B;
    pub const ECSCHNORR: u16 = 0x001C;
    pub const MGF1: u16 = 0x0007;
    pub const KDF1_SP800_56A: u16 = 0x0020;
    pub const KDF2: u16 = 0x0021;
    pub const KDF1_SP800_108: u16 = 0x0022;
    pub const ECC: u16 = 0x0023;
    pub const SYMCIPHER: u16 = 0x0025;
    pub const CAMELLIA: u16 = 0x0026;
    pub const CFB: u16 = 0x0043;
    /// TPM_ECC_NIST_P256 (a TPM_ECC_CURVE, not an algorithm).
    pub const CURVE_NIST_P256: u16 = 0x0003;
}

/// TPMA_OBJECT bits.
pub mod attr {
    pub const FIXED_TPM: u32 = 1 << 1;
    pub const ST_CLEAR: u32 = 1 << 2;
    pub const FIXED_PARENT: u32 = 1 << 4;
    pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
    pub const USER_WITH_AUTH: u32 = 1 << 6;
    pub const ADMIN_WITH_POLICY: u32 = 1 << 7;
    pub const NO_DA: u32 = 1 << 10;
    pub const RESTRICTED: u32 = 1 << 16;
    pub const DECRYPT: u32 = 1 << 17;
    pub const SIGN: u32 = 1 << 18;
}

/// The TCG EK policy: PolicySecret(TPM_RH_ENDORSEMENT), SHA-256.
pub const EK_POLICY_SHA256: [u8; 32] = [
    0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xb3, 0xf8, 0x1a, 0x90, 0xcc, 0x8d, 0x46, 0xa5, 0xd7, 0x24,
    0xfd, 0x52, 0xd7, 0x6e, 0x06, 0x52, 0x0b, 0x64, 0xf2, 0xa1, 0xda, 0x1b, 0x33, 0x14, 0x69, 0xaa,
];

const MAX_DIGEST: usize = 64;
const MAX_RSA_BYTES: usize = 512;
const MAX_ECC_BYTES: usize = 128;

/// Which endorsement key: the TCG EK Credential Profile's default templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EkKind {
    /// RSA 2048 (template L-1), certificate at NV index 0x01c00002.
    Rsa2048,
    /// ECC NIST P-256 (template L-2), certificate at NV index 0x01c0000a.
    EccP256,
}

impl EkKind {
    /// The TCG-reserved persistent handle where platforms keep this EK.
    pub fn persistent_handle(self) -> u32 {
        match self {
            EkKind::Rsa2048 => 0x8101_0001,
            EkKind::EccP256 => 0x8101_0002,
        }
    }

    /// The NV index of this EK's certificate.
    pub fn certificate_index(self) -> u32 {
        match self {
            EkKind::Rsa2048 => 0x01c0_0002,
            EkKind::EccP256 => 0x01c0_000a,
        }
    }

    /// The default EK template (TPMT_PUBLIC bytes).
    pub fn template(self) -> Vec<u8> {
        let attributes = attr::FIXED_TPM
            | attr::FIXED_PARENT
            | attr::SENSITIVE_DATA_ORIGIN
            | attr::ADMIN_WITH_POLICY
            | attr::RESTRICTED
            | attr::DECRYPT;
        let mut t = Vec::with_capacity(400);
        match self {
            EkKind::Rsa2048 => {
                t.put_u16(alg::RSA);
                t.put_u16(alg::SHA256);
                t.put_u32(attributes);
                t.put_tpm2b(&EK_POLICY_SHA256);
                t.put_u16(alg::AES);
                t.put_u16(128);
                t.put_u16(alg::CFB);
                t.put_u16(alg::NULL);
                t.put_u16(2048);
                t.put_u32(0);
                t.put_tpm2b(&[0u8; 256]);
            }
            EkKind::EccP256 => {
                t.put_u16(alg::ECC);
                t.put_u16(alg::SHA256);
                t.put_u32(attributes);
                t.put_tpm2b(&EK_POLICY_SHA256);
                t.put_u16(alg::AES);
                t.put_u16(128);
                t.put_u16(alg::CFB);
                t.put_u16(alg::NULL);
                t.put_u16(alg::CURVE_NIST_P256);
                t.put_u16(alg::NULL);
                t.put_tpm2b(&[0u8; 32]);
                t.put_tpm2b(&[0u8; 32]);
            }
        }
        t
    }
}

impl fmt::Display for EkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EkKind::Rsa2048 => "RSA 2048 EK",
            EkKind::EccP256 => "ECC P-256 EK",
        })
    }
}

/// Attributes of the attestation key: a restricted signing key that never
/// leaves the TPM.
pub const AK_ATTRIBUTES: u32 = attr::FIXED_TPM
    | attr::FIXED_PARENT
    | attr::SENSITIVE_DATA_ORIGIN
    | attr::USER_WITH_AUTH
    | attr::NO_DA
    | attr::RESTRICTED
    | attr::SIGN;

/// Attributes of a node key: an unrestricted signing key (it signs TLS
/// handshakes and CSRs) that never leaves the TPM.
pub const NODE_KEY_ATTRIBUTES: u32 = attr::FIXED_TPM
    | attr::FIXED_PARENT
    | attr::SENSITIVE_DATA_ORIGIN
    | attr::USER_WITH_AUTH
    | attr::NO_DA
    | attr::SIGN;

/// An ECDSA P-256 / SHA-256 signing key template with `unique.x` set.
fn p256_signing_template(attributes: u32, unique_x: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(64);
    t.put_u16(alg::ECC);
    t.put_u16(alg::SHA256);
    t.put_u32(attributes);
    t.put_tpm2b(&[]);
    t.put_u16(alg::NULL);
    t.put_u16(alg::ECDSA);
    t.put_u16(alg::SHA256);
    t.put_u16(alg::CURVE_NIST_P256);
    t.put_u16(alg::NULL);
    t.put_tpm2b(unique_x);
    t.put_tpm2b(&[]);
    t
}

/// The attestation key template: a primary of the endorsement hierarchy, so
/// one TPM always derives the same AK and TPM2_Clear does not change it.
pub fn ak_template() -> Vec<u8> {
    p256_signing_template(AK_ATTRIBUTES, &[])
}

/// The template of the node key a record derives: a primary of the owner
/// hierarchy whose `unique` is the record's value, so the same record gives
/// the same key until the owner seed changes (TPM2_Clear).
pub fn node_key_template(record: &NodeKeyRecord) -> Vec<u8> {
    p256_signing_template(NODE_KEY_ATTRIBUTES, &record.unique)
}

/// What the agent stores (in `node.key`) to derive its TPM-held node key
/// again: the template's `unique` value. It is not a secret: the key is
/// usable only inside the TPM whose owner seed derived it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NodeKeyRecord {
    unique: [u8; 32],
}

const RECORD_PREFIX: &str = "bcd-tpm-key v1 owner-p256 ";

impl NodeKeyRecord {
    /// A record with the given `unique` value.
    pub fn from_unique(unique: [u8; 32]) -> Self {
        NodeKeyRecord { unique }
    }

    /// A fresh record from the system's random source.
    pub fn generate() -> Result<Self, ring::error::Unspecified> {
        use ring::rand::SecureRandom;
        let mut unique = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut unique)?;
        Ok(NodeKeyRecord { unique })
    }

    /// The template's `unique` value.
    pub fn unique(&self) -> &[u8; 32] {
        &self.unique
    }

    /// One line of text, as `node.key` holds it.
    pub fn to_text(&self) -> String {
        format!("{RECORD_PREFIX}{}\n", hex(&self.unique))
    }

    /// Reads what [`NodeKeyRecord::to_text`] wrote.
    pub fn parse_text(text: &str) -> Result<Self, Malformed> {
        let bad = |reason: &str| Malformed {
            what: "node key record",
            offset: 0,
            reason: reason.to_owned(),
        };
        let value = text
            .trim()
            .strip_prefix(RECORD_PREFIX)
            .ok_or_else(|| bad("not a TPM node key record (bcd-tpm-key v1)"))?;
        if value.len() != 64 || !value.is_ascii() {
            return Err(bad("the value is not 32 bytes of hex"));
        }
        let mut unique = [0u8; 32];
        for (i, out) in unique.iter_mut().enumerate() {
            *out = u8::from_str_radix(&value[2 * i..2 * i + 2], 16)
                .map_err(|_| bad("the value is not hex"))?;
        }
        Ok(NodeKeyRecord { unique })
    }
}

impl fmt::Debug for NodeKeyRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeKeyRecord({})", hex(&self.unique))
    }
}

/// A TPM object name: the name algorithm, then the digest of the public
/// area under that algorithm.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Name(Vec<u8>);

impl Name {
    /// A name from its bytes (as TPM2B_NAME carries them, without the size).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Name(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Lower-case hex, as `urn:bc:tpm-ak:` names an AK.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Name({})", self.to_hex())
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// TPMT_SYM_DEF_OBJECT, when not TPM_ALG_NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymDef {
    pub algorithm: u16,
    pub key_bits: u16,
    pub mode: u16,
}

/// An asymmetric or KDF scheme: algorithm and, where it has one, its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    pub algorithm: u16,
    pub hash: Option<u16>,
    /// ECDAA's commit count.
    pub count: Option<u16>,
}

/// The key a public area holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicKey {
    Rsa {
        key_bits: u16,
        /// 0 means the default, 65537.
        exponent: u32,
        modulus: Vec<u8>,
    },
    Ecc {
        curve: u16,
        kdf: Scheme,
        x: Vec<u8>,
        y: Vec<u8>,
    },
}

/// A parsed TPMT_PUBLIC, with the exact bytes it was parsed from (the name
/// is computed over them).
#[derive(Clone, PartialEq, Eq)]
pub struct PublicArea {
    bytes: Vec<u8>,
    pub object_type: u16,
    pub name_alg: u16,
    pub attributes: u32,
    pub auth_policy: Vec<u8>,
    pub symmetric: Option<SymDef>,
    pub scheme: Scheme,
    pub key: PublicKey,
}

impl fmt::Debug for PublicArea {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicArea")
            .field("object_type", &format_args!("{:#06x}", self.object_type))
            .field("name_alg", &format_args!("{:#06x}", self.name_alg))
            .field("attributes", &format_args!("{:#010x}", self.attributes))
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

fn read_sym(r: &mut Reader<'_>) -> Result<Option<SymDef>, Malformed> {
    let algorithm = r.u16()?;
    match algorithm {
        alg::NULL => Ok(None),
        alg::AES | alg::SM4 | alg::CAMELLIA => Ok(Some(SymDef {
            algorithm,
            key_bits: r.u16()?,
            mode: r.u16()?,
        })),
        other => Err(r.error(format!("unknown symmetric algorithm {other:#06x}"))),
    }
}

fn read_scheme(r: &mut Reader<'_>) -> Result<Scheme, Malformed> {
    let algorithm = r.u16()?;
    match algorithm {
        alg::NULL | alg::RSAES => Ok(Scheme {
            algorithm,
            hash: None,
            count: None,
        }),
        alg::RSASSA
        | alg::RSAPSS
        | alg::OAEP
        | alg::ECDSA
        | alg::ECDH
        | alg::SM2
        | alg::ECSCHNORR
        | alg::MGF1
        | alg::KDF1_SP800_56A
        | alg::KDF2
        | alg::KDF1_SP800_108 => Ok(Scheme {
            algorithm,
            hash: Some(r.u16()?),
            count: None,
        }),
        alg::ECDAA => Ok(Scheme {
            algorithm,
            hash: Some(r.u16()?),
            count: Some(r.u16()?),
        }),
        other => Err(r.error(format!("unknown scheme {other:#06x}"))),
    }
}

fn put_scheme(out: &mut Vec<u8>, s: &Scheme) {
    out.put_u16(s.algorithm);
    if let Some(h) = s.hash {
        out.put_u16(h);
    }
    if let Some(c) = s.count {
        out.put_u16(c);
    }
}

/// The digest size of a hash algorithm, if this crate knows it.
pub fn digest_len(hash_alg: u16) -> Option<usize> {
    match hash_alg {
        alg::SHA1 => Some(20),
        alg::SHA256 => Some(32),
        alg::SHA384 => Some(48),
        alg::SHA512 => Some(64),
        _ => None,
    }
}

pub(crate) fn ring_digest(hash_alg: u16) -> Option<&'static ring::digest::Algorithm> {
    match hash_alg {
        alg::SHA1 => Some(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY),
        alg::SHA256 => Some(&ring::digest::SHA256),
        alg::SHA384 => Some(&ring::digest::SHA384),
        alg::SHA512 => Some(&ring::digest::SHA512),
        _ => None,
    }
}

impl PublicArea {
    /// Parses a TPM2B_PUBLIC (16-bit size, then a TPMT_PUBLIC).
    pub fn from_tpm2b(bytes: &[u8]) -> Result<Self, Malformed> {
        let mut r = Reader::new("TPM2B_PUBLIC", bytes);
        let inner = r.tpm2b(u16::MAX as usize)?;
        r.finish()?;
        Self::from_tpmt(inner)
    }

    /// Parses a TPMT_PUBLIC that must span all of `bytes`.
    pub fn from_tpmt(bytes: &[u8]) -> Result<Self, Malformed> {
        let mut r = Reader::new("TPMT_PUBLIC", bytes);
        let object_type = r.u16()?;
        let name_alg = r.u16()?;
        if name_alg != alg::NULL && digest_len(name_alg).is_none() {
            return Err(r.error(format!("unknown name algorithm {name_alg:#06x}")));
        }
        let attributes = r.u32()?;
        let auth_policy = r.tpm2b(MAX_DIGEST)?.to_vec();
        let (symmetric, scheme, key) = match object_type {
            alg::RSA => {
                let symmetric = read_sym(&mut r)?;
                let scheme = read_scheme(&mut r)?;
                let key_bits = r.u16()?;
                let exponent = r.u32()?;
                let modulus = r.tpm2b(MAX_RSA_BYTES)?.to_vec();
                (
                    symmetric,
                    scheme,
                    PublicKey::Rsa {
                        key_bits,
                        exponent,
                        modulus,
                    },
                )
            }
            alg::ECC => {
                let symmetric = read_sym(&mut r)?;
                let scheme = read_scheme(&mut r)?;
                let curve = r.u16()?;
                let kdf = read_scheme(&mut r)?;
                let x = r.tpm2b(MAX_ECC_BYTES)?.to_vec();
                let y = r.tpm2b(MAX_ECC_BYTES)?.to_vec();
                (symmetric, scheme, PublicKey::Ecc { curve, kdf, x, y })
            }
            alg::KEYEDHASH | alg::SYMCIPHER => {
                return Err(r.error("a symmetric object, not an asymmetric key"));
            }
            other => return Err(r.error(format!("unknown object type {other:#06x}"))),
        };
        r.finish()?;
        Ok(PublicArea {
            bytes: bytes.to_vec(),
            object_type,
            name_alg,
            attributes,
            auth_policy,
            symmetric,
            scheme,
            key,
        })
    }

    /// The TPMT_PUBLIC bytes.
    pub fn tpmt_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The TPM2B_PUBLIC bytes (what travels to the server).
    pub fn to_tpm2b(&self) -> Vec<u8> {
        tpm2b(&self.bytes)
    }

    /// The object's name: nameAlg, then H_nameAlg(TPMT_PUBLIC).
    pub fn name(&self) -> Name {
        let mut out = self.name_alg.to_be_bytes().to_vec();
        if let Some(d) = ring_digest(self.name_alg) {
            out.extend_from_slice(ring::digest::digest(d, &self.bytes).as_ref());
        }
        Name(out)
    }

    /// Everything but the key itself: what the template fixes.
    fn template_bytes(&self) -> Vec<u8> {
        let mut t = Vec::with_capacity(64);
        t.put_u16(self.object_type);
        t.put_u16(self.name_alg);
        t.put_u32(self.attributes);
        t.put_tpm2b(&self.auth_policy);
        match self.symmetric {
            None => t.put_u16(alg::NULL),
            Some(s) => {
                t.put_u16(s.algorithm);
                t.put_u16(s.key_bits);
                t.put_u16(s.mode);
            }
        }
        put_scheme(&mut t, &self.scheme);
        match &self.key {
            PublicKey::Rsa {
                key_bits, exponent, ..
            } => {
                t.put_u16(*key_bits);
                t.put_u32(*exponent);
            }
            PublicKey::Ecc { curve, kdf, .. } => {
                t.put_u16(*curve);
                put_scheme(&mut t, kdf);
            }
        }
        t
    }

    /// Whether this public area was made from the same template as `other`
    /// (type, name algorithm, attributes, policy and parameters), whatever
    /// its key.
    pub fn same_template(&self, other: &PublicArea) -> bool {
        self.template_bytes() == other.template_bytes()
    }

    /// The uncompressed point (0x04 || X || Y) of a P-256 key.
    pub fn p256_point(&self) -> Option<[u8; 65]> {
        match &self.key {
            PublicKey::Ecc { curve, x, y, .. }
                if *curve == alg::CURVE_NIST_P256 && x.len() <= 32 && y.len() <= 32 =>
            {
                let mut p = [0u8; 65];
                p[0] = 4;
                p[33 - x.len()..33].copy_from_slice(x);
                p[65 - y.len()..65].copy_from_slice(y);
                Some(p)
            }
            _ => None,
        }
    }

    /// Whether this is an ECDSA P-256 / SHA-256 signing key.
    pub fn is_p256_ecdsa_signing(&self) -> bool {
        self.object_type == alg::ECC
            && self.attributes & attr::SIGN != 0
            && self.scheme.algorithm == alg::ECDSA
            && self.scheme.hash == Some(alg::SHA256)
            && self.p256_point().is_some()
    }

    /// The DER SubjectPublicKeyInfo of the key (RSA or P-256), as an X.509
    /// certificate or a PKCS#10 request carries it.
    pub fn spki_der(&self) -> Option<Vec<u8>> {
        match &self.key {
            PublicKey::Ecc { .. } => {
                let point = self.p256_point()?;
                // SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING }
                let mut der = vec![
                    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
                    0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
                ];
                der.extend_from_slice(&point);
                Some(der)
            }
            PublicKey::Rsa {
                exponent, modulus, ..
            } => {
                let e = if *exponent == 0 { 65537 } else { *exponent };
                let mut key = der_integer(modulus);
                key.extend(der_integer(&e.to_be_bytes()));
                let key = der_tlv(0x30, &key);
                let mut bits = vec![0u8];
                bits.extend(key);
                // rsaEncryption, NULL parameters
                let mut spki = vec![
                    0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
                    0x05, 0x00,
                ];
                spki.extend(der_tlv(0x03, &bits));
                Some(der_tlv(0x30, &spki))
            }
        }
    }

    /// Whether `spki_der` (a DER SubjectPublicKeyInfo) holds this key.
    pub fn matches_spki(&self, spki_der: &[u8]) -> bool {
        self.spki_der().is_some_and(|mine| mine == spki_der)
    }
}

fn der_len(len: usize) -> Vec<u8> {
    if len < 0x80 {
        vec![len as u8]
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let mut out = vec![0x80 | (bytes.len() - skip) as u8];
        out.extend_from_slice(&bytes[skip..]);
        out
    }
}

fn der_tlv(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend(der_len(value.len()));
    out.extend_from_slice(value);
    out
}

/// A DER INTEGER of a big-endian unsigned value.
fn der_integer(unsigned: &[u8]) -> Vec<u8> {
    let trimmed: &[u8] = match unsigned.iter().position(|b| *b != 0) {
        Some(i) => &unsigned[i..],
        None => &[0],
    };
    let mut v = Vec::with_capacity(trimmed.len() + 1);
    if trimmed[0] & 0x80 != 0 {
        v.push(0);
    }
    v.extend_from_slice(trimmed);
    der_tlv(0x02, &v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn templates_parse_and_name() {
        for t in [
            EkKind::Rsa2048.template(),
            EkKind::EccP256.template(),
            ak_template(),
            node_key_template(&NodeKeyRecord::from_unique([7; 32])),
        ] {
            let p = PublicArea::from_tpmt(&t).unwrap();
            assert_eq!(p.tpmt_bytes(), &t[..]);
            assert_eq!(p.template_bytes(), t[..p.template_bytes().len()]);
            let name = p.name();
            assert_eq!(&name.as_bytes()[..2], &[0x00, 0x0b]);
            assert_eq!(name.as_bytes().len(), 34);
            let again = PublicArea::from_tpm2b(&p.to_tpm2b()).unwrap();
            assert_eq!(again, p);
        }
        let ek = PublicArea::from_tpmt(&EkKind::Rsa2048.template()).unwrap();
        assert_eq!(ek.attributes, 0x0003_00b2, "the TCG EK attributes");
        let ak = PublicArea::from_tpmt(&ak_template()).unwrap();
        assert!(ak.is_p256_ecdsa_signing() || ak.p256_point().is_some());
    }

    #[test]
    fn the_rsa_ek_template_is_the_tcg_one() {
        // TPM2B_PUBLIC prefix of the RSA EK that `tpm2_createek -G rsa`
        // writes (the same template, so the same bytes up to the modulus).
        let expected_prefix = "013a0001000b000300b20020837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa00060080004300100800000000000100";
        let t = tpm2b(&EkKind::Rsa2048.template());
        assert_eq!(hex(&t[..expected_prefix.len() / 2]), expected_prefix);
    }

    #[test]
    fn same_template_ignores_the_key_only() {
        let a = PublicArea::from_tpmt(&node_key_template(&NodeKeyRecord::from_unique([1; 32])))
            .unwrap();
        let b = PublicArea::from_tpmt(&node_key_template(&NodeKeyRecord::from_unique([2; 32])))
            .unwrap();
        let ak = PublicArea::from_tpmt(&ak_template()).unwrap();
        assert!(a.same_template(&b));
        assert_ne!(a.name(), b.name());
        assert!(!a.same_template(&ak), "the AK is restricted");
    }

    #[test]
    fn records_round_trip_as_text() {
        let r = NodeKeyRecord::generate().unwrap();
        let text = r.to_text();
        assert!(text.starts_with("bcd-tpm-key v1 owner-p256 "));
        assert_eq!(NodeKeyRecord::parse_text(&text).unwrap(), r);
        assert!(NodeKeyRecord::parse_text("-----BEGIN EC PRIVATE KEY-----").is_err());
        assert!(NodeKeyRecord::parse_text("bcd-tpm-key v1 owner-p256 zz").is_err());
        let bad_hex = format!("bcd-tpm-key v1 owner-p256 {}", "g".repeat(64));
        assert!(NodeKeyRecord::parse_text(&bad_hex).is_err());
        let not_ascii = format!("bcd-tpm-key v1 owner-p256 {}", "é".repeat(32));
        assert!(NodeKeyRecord::parse_text(&not_ascii).is_err());
    }

    #[test]
    fn der_integers() {
        assert_eq!(der_integer(&[0, 0, 1]), [2, 1, 1]);
        assert_eq!(der_integer(&[0x80]), [2, 2, 0, 0x80]);
        assert_eq!(der_integer(&[0, 0]), [2, 1, 0]);
        assert_eq!(der_len(0x1234), [0x82, 0x12, 0x34]);
    }

    const NULL_SCHEME: Scheme = Scheme {
        algorithm: alg::NULL,
        hash: None,
        count: None,
    };

    fn ecc_public(x: Vec<u8>, y: Vec<u8>, attributes: u32, policy: Vec<u8>) -> Vec<u8> {
        let mut t = Vec::new();
        t.put_u16(alg::ECC);
        t.put_u16(alg::SHA256);
        t.put_u32(attributes);
        t.put_tpm2b(&policy);
        t.put_u16(alg::NULL);
        t.put_u16(alg::ECDSA);
        t.put_u16(alg::SHA256);
        t.put_u16(alg::CURVE_NIST_P256);
        t.put_u16(alg::NULL);
        t.put_tpm2b(&x);
        t.put_tpm2b(&y);
        t
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = PublicArea::from_tpmt(&bytes);
            let _ = PublicArea::from_tpm2b(&bytes);
        }

        #[test]
        fn record_text_never_panics(value in "\\PC{0,70}") {
            let _ = NodeKeyRecord::parse_text(&format!("{RECORD_PREFIX}{value}"));
        }

        #[test]
        fn mutated_templates_never_panic(
            which in 0usize..4,
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut t = [
                EkKind::Rsa2048.template(),
                EkKind::EccP256.template(),
                ak_template(),
                node_key_template(&NodeKeyRecord::from_unique([3; 32])),
            ][which].clone();
            let i = at.index(t.len());
            t[i] = byte;
            let len = cut.index(t.len() + 1);
            if let Ok(p) = PublicArea::from_tpmt(&t[..len]) {
                let _ = p.name();
                let _ = p.spki_der();
                prop_assert_eq!(p.tpmt_bytes(), &t[..len]);
            }
        }

        #[test]
        fn ecc_publics_round_trip(
            x in proptest::collection::vec(any::<u8>(), 0..=32),
            y in proptest::collection::vec(any::<u8>(), 0..=32),
            attributes in any::<u32>(),
            policy in proptest::collection::vec(any::<u8>(), 0..=64),
        ) {
            let t = ecc_public(x.clone(), y.clone(), attributes, policy.clone());
            let p = PublicArea::from_tpmt(&t).unwrap();
            prop_assert_eq!(p.attributes, attributes);
            prop_assert_eq!(&p.auth_policy, &policy);
            prop_assert_eq!(p.key.clone(), PublicKey::Ecc { curve: alg::CURVE_NIST_P256, kdf: NULL_SCHEME, x: x.clone(), y: y.clone() });
            let point = p.p256_point().unwrap();
            prop_assert_eq!(&point[33 - x.len()..33], &x[..]);
            prop_assert_eq!(&point[65 - y.len()..], &y[..]);
            prop_assert_eq!(PublicArea::from_tpm2b(&p.to_tpm2b()).unwrap(), p);
        }
    }
}
