//! Secrets: how the broker hands a node a value no gateway can read, swap
//! or make up.
//!
//! The node asks for a secret its signed spec names with a one-time X25519
//! key, and signs the request with its node key ([`request_statement`]): a
//! gateway that relays it cannot put a key of its own in its place. The
//! broker encrypts the value to that key as a compact JWE (RFC 7516):
//! `alg` ECDH-ES, direct key agreement (RFC 7518 §4.6) over X25519 (RFC
//! 8037), `enc` A256GCM ([`seal`], [`OneTimeKey::open`]). ECDH-ES alone
//! says nothing of who sent it, so the broker signs a JWT around it
//! ([`sign_delivery`]: EdDSA with a ticket key the node's spec pins, `typ`
//! [`TYP`]) naming the node, the allocation, the secret, its version and
//! the request's SHA-256; the node checks all of it ([`verify_delivery`])
//! before it opens the JWE, and the one-time key is gone after one use.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::agreement::{EphemeralPrivateKey, UnparsedPublicKey, X25519, agree_ephemeral};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::Ed25519KeyPair;
use serde::{Deserialize, Serialize};

use crate::ticket::{self, Jwks, TicketError};

/// The `typ` of a delivery's JWS.
pub const TYP: &str = "bc-secret+jwt";

/// The largest value a secret holds.
pub const MAX_VALUE: usize = 64 * 1024;

/// The longest delivery a node reads: the value, encrypted, base64url
/// twice, and the claims around it.
pub const MAX_DELIVERY_LEN: usize = 4 * MAX_VALUE;

/// How far a request's time may be from the broker's (ms): a request is
/// good for this long, so one a gateway kept cannot be spent later.
pub const REQUEST_SLACK_MS: i64 = 60_000;

/// The label a request's statement starts with.
pub const LABEL: &[u8] = b"better-compute secret request v1";

const ALG: &str = "ECDH-ES";
const ENC: &str = "A256GCM";
const TAG_LEN: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("the delivery's signature: {0}")]
    Signed(#[from] TicketError),
    #[error("the delivery is a {0:?} token, not a secret delivery ({TYP})")]
    Typ(String),
    #[error("the delivery's claims do not parse: {0}")]
    Claims(String),
    #[error("the delivery is for {what} {got:?}, not {want:?}")]
    Other {
        what: &'static str,
        got: String,
        want: String,
    },
    #[error("the delivery answers another request: it was replayed or swapped by a gateway")]
    OtherRequest,
    #[error("the JWE is not a compact JWE (five base64url parts)")]
    Malformed,
    #[error("the JWE's header: {0}")]
    Header(String),
    #[error(
        "the JWE does not decrypt under the one-time key: it was changed or made for another key"
    )]
    Decrypt,
    #[error("the secret's value is {0} bytes; a secret holds {MAX_VALUE} at most")]
    TooLarge(usize),
    #[error("the one-time key is not an X25519 public key")]
    Key,
    #[error("the system's random number generator failed")]
    Rng,
}

/// A secret's name, or the file it is written to: 1 to 64 letters,
/// digits, '.', '_' or '-', not starting with '.' (a safe file name on
/// the node).
pub fn check_name(what: &str, s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {s:?} is not 1 to 64 letters, digits, '.', '_' or '-' not starting with '.'"
        ))
    }
}

/// What a node asks for.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub node: &'a str,
    pub allocation: &'a str,
    pub name: &'a str,
    pub version: u64,
    pub one_time_key: &'a [u8],
    pub time_ms: i64,
}

impl<'a> From<&'a crate::v1::SecretRequest> for Request<'a> {
    /// What a request on the wire asks.
    fn from(r: &'a crate::v1::SecretRequest) -> Request<'a> {
        Request {
            node: &r.node_id,
            allocation: &r.allocation_id,
            name: &r.name,
            version: r.version,
            one_time_key: &r.one_time_key,
            time_ms: r.time_ms,
        }
    }
}

/// What the node signs for a request: the label, then each field
/// length-prefixed (4 bytes, big-endian).
pub fn request_statement(r: &Request<'_>) -> Vec<u8> {
    let mut out = LABEL.to_vec();
    for p in [
        r.node.as_bytes(),
        r.allocation.as_bytes(),
        r.name.as_bytes(),
        &r.version.to_be_bytes(),
        r.one_time_key,
        &r.time_ms.to_be_bytes(),
    ] {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// The request's SHA-256, as a delivery names it (base64url).
pub fn request_digest(statement: &[u8]) -> String {
    B64.encode(ring::digest::digest(&ring::digest::SHA256, statement).as_ref())
}

/// The node's one-time key: one request, one JWE, then gone.
#[derive(Debug)]
pub struct OneTimeKey {
    private: EphemeralPrivateKey,
    public: [u8; 32],
}

impl OneTimeKey {
    pub fn new() -> Result<OneTimeKey, SecretError> {
        let private = EphemeralPrivateKey::generate(&X25519, &SystemRandom::new())
            .map_err(|_| SecretError::Rng)?;
        let public = private
            .compute_public_key()
            .map_err(|_| SecretError::Rng)?
            .as_ref()
            .try_into()
            .map_err(|_| SecretError::Rng)?;
        Ok(OneTimeKey { private, public })
    }

    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    /// The public key as a JWK (OKP, X25519).
    pub fn jwk(&self) -> String {
        serde_json::json!({"kty": "OKP", "crv": "X25519", "x": B64.encode(self.public)}).to_string()
    }

    /// The value of a compact JWE made to this key.
    pub fn open(self, jwe: &str) -> Result<Vec<u8>, SecretError> {
        let mut parts = jwe.split('.');
        let (Some(h), Some(k), Some(iv), Some(ct), Some(tag), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(SecretError::Malformed);
        };
        let decode = |p: &str| B64.decode(p).map_err(|_| SecretError::Malformed);
        let header: JweHeader =
            serde_json::from_slice(&decode(h)?).map_err(|e| SecretError::Header(e.to_string()))?;
        if header.alg != ALG || header.enc != ENC {
            return Err(SecretError::Header(format!(
                "alg {:?} and enc {:?}; only {ALG} with {ENC} is accepted",
                header.alg, header.enc
            )));
        }
        if !k.is_empty() {
            return Err(SecretError::Header(
                "direct key agreement carries no encrypted key".into(),
            ));
        }
        let epk = header.epk.public()?;
        let apu = decode(&header.apu)?;
        let apv = decode(&header.apv)?;
        let iv: [u8; NONCE_LEN] = decode(iv)?.try_into().map_err(|_| SecretError::Malformed)?;
        let mut sealed = decode(ct)?;
        let tag = decode(tag)?;
        if tag.len() != TAG_LEN || sealed.len() > MAX_VALUE {
            return Err(SecretError::Malformed);
        }
        sealed.extend_from_slice(&tag);
        let cek = agree_ephemeral(self.private, &UnparsedPublicKey::new(&X25519, epk), |z| {
            concat_kdf(z, ENC, &apu, &apv, 256)
        })
        .map_err(|_| SecretError::Decrypt)?;
        let key = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &cek).map_err(|_| SecretError::Decrypt)?,
        );
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(iv),
                Aad::from(h.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| SecretError::Decrypt)?;
        Ok(plain.to_vec())
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Epk {
    kty: String,
    crv: String,
    x: String,
}

impl Epk {
    fn public(&self) -> Result<[u8; 32], SecretError> {
        if self.kty != "OKP" || self.crv != "X25519" {
            return Err(SecretError::Header(format!(
                "epk is {} {}, not OKP X25519",
                self.kty, self.crv
            )));
        }
        B64.decode(&self.x)
            .ok()
            .and_then(|x| x.try_into().ok())
            .ok_or(SecretError::Key)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct JweHeader {
    alg: String,
    enc: String,
    epk: Epk,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    apu: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    apv: String,
}

/// RFC 7518 §4.6.2: the Concat KDF (NIST SP 800-56A) over SHA-256 for a
/// key of `bits` (at most 256: one round).
fn concat_kdf(z: &[u8], alg: &str, apu: &[u8], apv: &[u8], bits: u32) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(&1u32.to_be_bytes());
    ctx.update(z);
    for field in [alg.as_bytes(), apu, apv] {
        ctx.update(&(field.len() as u32).to_be_bytes());
        ctx.update(field);
    }
    ctx.update(&bits.to_be_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// `value` as a compact JWE to the X25519 public key `recipient`.
pub fn seal(value: &[u8], recipient: &[u8]) -> Result<String, SecretError> {
    if value.len() > MAX_VALUE {
        return Err(SecretError::TooLarge(value.len()));
    }
    if recipient.len() != 32 {
        return Err(SecretError::Key);
    }
    let rng = SystemRandom::new();
    let ours = EphemeralPrivateKey::generate(&X25519, &rng).map_err(|_| SecretError::Rng)?;
    let epk = ours.compute_public_key().map_err(|_| SecretError::Rng)?;
    let header = JweHeader {
        alg: ALG.into(),
        enc: ENC.into(),
        epk: Epk {
            kty: "OKP".into(),
            crv: "X25519".into(),
            x: B64.encode(epk.as_ref()),
        },
        apu: String::new(),
        apv: String::new(),
    };
    let h = B64.encode(serde_json::to_vec(&header).map_err(|_| SecretError::Rng)?);
    let cek = agree_ephemeral(ours, &UnparsedPublicKey::new(&X25519, recipient), |z| {
        concat_kdf(z, ENC, &[], &[], 256)
    })
    .map_err(|_| SecretError::Key)?;
    let mut iv = [0u8; NONCE_LEN];
    rng.fill(&mut iv).map_err(|_| SecretError::Rng)?;
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &cek).map_err(|_| SecretError::Rng)?);
    let mut ct = value.to_vec();
    let tag = key
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(iv),
            Aad::from(h.as_bytes()),
            &mut ct,
        )
        .map_err(|_| SecretError::Rng)?;
    Ok(format!(
        "{h}..{}.{}.{}",
        B64.encode(iv),
        B64.encode(&ct),
        B64.encode(tag.as_ref())
    ))
}

/// What a delivery says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub iss: String,
    pub node: String,
    pub allocation: String,
    pub name: String,
    pub version: u64,
    /// The request's SHA-256 ([`request_digest`]).
    pub req: String,
    /// Issued at, seconds since the epoch.
    pub iat: i64,
    /// The value, as a compact JWE to the request's one-time key.
    pub jwe: String,
}

/// The broker's signed delivery.
pub fn sign_delivery(key: &Ed25519KeyPair, d: &Delivery) -> String {
    ticket::sign_jws(key, TYP, &serde_json::to_vec(d).unwrap_or_default())
}

/// Verifies a delivery against the node's ticket keys and the request it
/// answers (`expect`'s fields are what the node asked; `jwe` is unread).
/// Returns the JWE to open with the request's one-time key.
pub fn verify_delivery(
    jws: &str,
    keys: &Jwks,
    expect: &Request<'_>,
) -> Result<String, SecretError> {
    let (typ, payload) = ticket::open_jws(jws, keys, MAX_DELIVERY_LEN)?;
    if typ != TYP {
        return Err(SecretError::Typ(typ));
    }
    let d: Delivery =
        serde_json::from_slice(&payload).map_err(|e| SecretError::Claims(e.to_string()))?;
    let other = |what, got: &str, want: &str| {
        Err(SecretError::Other {
            what,
            got: got.into(),
            want: want.into(),
        })
    };
    if d.iss != ticket::ISSUER {
        return other("issuer", &d.iss, ticket::ISSUER);
    }
    if d.node != expect.node {
        return other("node", &d.node, expect.node);
    }
    if d.allocation != expect.allocation {
        return other("allocation", &d.allocation, expect.allocation);
    }
    if d.name != expect.name || d.version != expect.version {
        return other(
            "secret",
            &format!("{} v{}", d.name, d.version),
            &format!("{} v{}", expect.name, expect.version),
        );
    }
    if d.req != request_digest(&request_statement(expect)) {
        return Err(SecretError::OtherRequest);
    }
    Ok(d.jwe)
}

/// Sealing at rest: a secret's value under the broker's own key
/// (ChaCha20-Poly1305), bound to its name and version so that a row
/// moved to another name or version in the store does not open.
pub mod at_rest {
    use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
    use ring::rand::{SecureRandom, SystemRandom};

    const LABEL: &[u8] = b"better-compute secret at rest v1";

    fn aad(name: &str, version: u64) -> Vec<u8> {
        let mut out = LABEL.to_vec();
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&version.to_be_bytes());
        out
    }

    fn key(bytes: &[u8; 32]) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, bytes).expect("a 32-byte key"))
    }

    /// The nonce, then the sealed value and its tag.
    pub fn seal(key_bytes: &[u8; 32], name: &str, version: u64, value: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        let mut out = value.to_vec();
        key(key_bytes)
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(name, version)),
                &mut out,
            )
            .ok()?;
        let mut sealed = nonce.to_vec();
        sealed.append(&mut out);
        Some(sealed)
    }

    /// The value, or `None` when the bytes were not sealed by this key for
    /// this name and version.
    pub fn open(key_bytes: &[u8; 32], name: &str, version: u64, sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let mut buf = rest.to_vec();
        let plain = key(key_bytes)
            .open_in_place(
                Nonce::try_assume_unique_for_key(nonce).ok()?,
                Aad::from(aad(name, version)),
                &mut buf,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ring::signature::KeyPair;

    fn broker() -> Ed25519KeyPair {
        Ed25519KeyPair::from_seed_unchecked(&[3; 32]).unwrap()
    }

    fn keys(k: &Ed25519KeyPair) -> Jwks {
        Jwks::of(&[k.public_key().as_ref().to_vec()])
    }

    fn request(otk: &[u8]) -> Request<'_> {
        Request {
            node: "nd-1",
            allocation: "job-7",
            name: "hf-token",
            version: 2,
            one_time_key: otk,
            time_ms: 1_800_000_000_000,
        }
    }

    fn delivery(r: &Request<'_>, jwe: String) -> Delivery {
        Delivery {
            iss: ticket::ISSUER.into(),
            node: r.node.into(),
            allocation: r.allocation.into(),
            name: r.name.into(),
            version: r.version,
            req: request_digest(&request_statement(r)),
            iat: r.time_ms / 1000,
            jwe,
        }
    }

    #[test]
    fn the_concat_kdf_gives_rfc_7518_appendix_c() {
        // RFC 7518 Appendix C: ECDH-ES for A128GCM, apu "Alice", apv "Bob".
        let z = [
            158, 86, 217, 29, 129, 113, 53, 211, 114, 131, 66, 131, 191, 132, 38, 156, 251, 49,
            110, 163, 218, 128, 106, 72, 246, 218, 167, 121, 140, 254, 144, 196,
        ];
        let key = concat_kdf(&z, "A128GCM", b"Alice", b"Bob", 128);
        assert_eq!(B64.encode(&key[..16]), "VqqN6vgjbSBcIijNcacQGg");
    }

    #[test]
    fn a_sealed_value_opens_with_the_one_time_key_only() {
        let otk = OneTimeKey::new().unwrap();
        let jwe = seal(b"s3cret", &otk.public()).unwrap();
        assert!(!jwe.contains("s3cret"));
        assert_eq!(otk.open(&jwe).unwrap(), b"s3cret");
        let other = OneTimeKey::new().unwrap();
        assert_eq!(other.open(&jwe).unwrap_err(), SecretError::Decrypt);
    }

    #[test]
    fn a_changed_jwe_does_not_open() {
        let otk = OneTimeKey::new().unwrap();
        let jwe = seal(b"s3cret", &otk.public()).unwrap();
        let parts: Vec<&str> = jwe.split('.').collect();
        // Another header (the AAD), with the same key agreement.
        let header: serde_json::Value =
            serde_json::from_slice(&B64.decode(parts[0]).unwrap()).unwrap();
        let mut h2 = header.clone();
        h2["kid"] = "x".into();
        let forged = format!(
            "{}.{}",
            B64.encode(serde_json::to_vec(&h2).unwrap()),
            parts[1..].join(".")
        );
        assert_eq!(otk.open(&forged).unwrap_err(), SecretError::Decrypt);
        let otk = OneTimeKey::new().unwrap();
        let jwe = seal(b"s3cret", &otk.public()).unwrap();
        let mut ct = B64.decode(jwe.split('.').nth(3).unwrap()).unwrap();
        ct[0] ^= 1;
        let parts: Vec<&str> = jwe.split('.').collect();
        let flipped = format!(
            "{}.{}.{}.{}.{}",
            parts[0],
            parts[1],
            parts[2],
            B64.encode(&ct),
            parts[4]
        );
        assert_eq!(otk.open(&flipped).unwrap_err(), SecretError::Decrypt);
    }

    #[test]
    fn only_ecdh_es_with_a256gcm_and_no_encrypted_key_is_read() {
        let otk = OneTimeKey::new().unwrap();
        let jwe = seal(b"v", &otk.public()).unwrap();
        let parts: Vec<&str> = jwe.split('.').collect();
        let with_key = format!("{}.AAAA.{}.{}.{}", parts[0], parts[2], parts[3], parts[4]);
        assert!(matches!(
            otk.open(&with_key).unwrap_err(),
            SecretError::Header(_)
        ));
        for (alg, enc) in [
            ("ECDH-ES+A256KW", "A256GCM"),
            ("ECDH-ES", "A128GCM"),
            ("dir", "A256GCM"),
        ] {
            let otk = OneTimeKey::new().unwrap();
            let h = serde_json::json!({"alg": alg, "enc": enc, "epk": {"kty": "OKP", "crv": "X25519", "x": B64.encode([9u8; 32])}});
            let jwe = format!(
                "{}..AAAAAAAAAAAAAAAA.AA.AAAAAAAAAAAAAAAAAAAAAA",
                B64.encode(h.to_string())
            );
            assert!(
                matches!(otk.open(&jwe).unwrap_err(), SecretError::Header(_)),
                "{alg} {enc}"
            );
        }
    }

    #[test]
    fn a_delivery_verifies_for_the_request_it_answers_only() {
        let k = broker();
        let otk = OneTimeKey::new().unwrap();
        let public = otk.public();
        let r = request(&public);
        let jwe = seal(b"value", &public).unwrap();
        let jws = sign_delivery(&k, &delivery(&r, jwe.clone()));
        assert_eq!(verify_delivery(&jws, &keys(&k), &r).unwrap(), jwe);
        assert_eq!(otk.open(&jwe).unwrap(), b"value");

        // Another key (a gateway's own), another version, another request.
        let forged = sign_delivery(
            &Ed25519KeyPair::from_seed_unchecked(&[4; 32]).unwrap(),
            &delivery(&r, "x".into()),
        );
        assert!(matches!(
            verify_delivery(&forged, &keys(&k), &r).unwrap_err(),
            SecretError::Signed(TicketError::UnknownKey(_))
        ));
        let older = Request { version: 1, ..r };
        assert!(matches!(
            verify_delivery(&jws, &keys(&k), &older).unwrap_err(),
            SecretError::Other { what: "secret", .. }
        ));
        let later = Request {
            time_ms: r.time_ms + 1,
            ..r
        };
        assert_eq!(
            verify_delivery(&jws, &keys(&k), &later).unwrap_err(),
            SecretError::OtherRequest
        );
        let elsewhere = Request {
            allocation: "job-8",
            ..r
        };
        assert!(matches!(
            verify_delivery(&jws, &keys(&k), &elsewhere).unwrap_err(),
            SecretError::Other {
                what: "allocation",
                ..
            }
        ));
    }

    #[test]
    fn a_ticket_is_no_delivery_and_a_delivery_no_ticket() {
        let k = broker();
        let otk = OneTimeKey::new().unwrap();
        let public = otk.public();
        let r = request(&public);
        let jws = sign_delivery(&k, &delivery(&r, "x".into()));
        let as_ticket = ticket::verify(
            &jws,
            &keys(&k),
            ticket::Expect {
                node: "nd-1",
                sid: "s",
                now_ms: r.time_ms,
            },
        );
        assert!(matches!(as_ticket, Err(TicketError::Header(_))));
        let ticket_jws = ticket::sign_jws(&k, "JWT", b"{}");
        assert_eq!(
            verify_delivery(&ticket_jws, &keys(&k), &r).unwrap_err(),
            SecretError::Typ("JWT".into())
        );
    }

    #[test]
    fn the_request_statement_changes_with_every_field() {
        let key = [1u8; 32];
        let base = request(&key);
        let s = request_statement(&base);
        let other_key = [2u8; 32];
        for changed in [
            Request {
                node: "nd-2",
                ..base
            },
            Request {
                allocation: "job-8",
                ..base
            },
            Request { name: "hf", ..base },
            Request { version: 3, ..base },
            Request {
                one_time_key: &other_key,
                ..base
            },
            Request { time_ms: 1, ..base },
        ] {
            assert_ne!(request_statement(&changed), s);
        }
        // Length prefixes: moving a byte between fields changes it too.
        let a = Request {
            node: "nd-1j",
            allocation: "ob-7",
            ..base
        };
        assert_ne!(request_statement(&a), s);
    }

    #[test]
    fn sealed_at_rest_opens_under_its_name_and_version_only() {
        let key = [5u8; 32];
        let sealed = at_rest::seal(&key, "db", 3, b"pw").unwrap();
        assert_eq!(at_rest::open(&key, "db", 3, &sealed).unwrap(), b"pw");
        assert!(at_rest::open(&key, "db", 2, &sealed).is_none());
        assert!(at_rest::open(&key, "dc", 3, &sealed).is_none());
        assert!(at_rest::open(&[6u8; 32], "db", 3, &sealed).is_none());
        assert!(at_rest::open(&key, "db", 3, &sealed[..5]).is_none());
    }

    #[test]
    fn names_are_safe_file_names() {
        for ok in ["hf-token", "db.password", "A_1", &"x".repeat(64)] {
            assert_eq!(check_name("secret", ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            ".hidden",
            "..",
            "a/b",
            "a b",
            "x\n",
            &"x".repeat(65),
            "é",
        ] {
            assert!(
                check_name("secret", bad)
                    .unwrap_err()
                    .starts_with("secret "),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn too_large_a_value_is_not_sealed() {
        let otk = OneTimeKey::new().unwrap();
        assert_eq!(
            seal(&vec![0; MAX_VALUE + 1], &otk.public()).unwrap_err(),
            SecretError::TooLarge(MAX_VALUE + 1)
        );
    }

    proptest! {
        #[test]
        fn no_bytes_make_the_reader_panic(s in "[A-Za-z0-9_.-]{0,300}") {
            let k = broker();
            let otk = OneTimeKey::new().unwrap();
            let public = otk.public();
            let _ = verify_delivery(&s, &keys(&k), &request(&public));
            let _ = otk.open(&s);
        }

        #[test]
        fn no_flipped_bit_of_a_delivery_verifies(byte in 0usize..400, bit in 0u8..8) {
            let k = broker();
            let otk = OneTimeKey::new().unwrap();
            let public = otk.public();
            let r = request(&public);
            let jws = sign_delivery(&k, &delivery(&r, seal(b"v", &public).unwrap()));
            let mut bytes = jws.clone().into_bytes();
            let i = byte % bytes.len();
            bytes[i] ^= 1 << bit;
            if let Ok(s) = String::from_utf8(bytes) && s != jws {
                prop_assert!(verify_delivery(&s, &keys(&k), &r).is_err());
            }
        }
    }
}
