//! Exec tickets: what lets a tunnel open on a node.
//!
//! A ticket is a JWT (RFC 7519) in compact JWS form (RFC 7515) signed with
//! EdDSA over Ed25519 (RFC 8037) by a ticket key of the key holder. The
//! node holds the ticket keys as a JWKS (RFC 7517) in its worker-signed
//! spec, so a gateway that relays a ticket can neither make one nor widen
//! one. A ticket lives at most a minute, names the operator (`sub`), the
//! node, the tunnel (`sid`), a unique `jti`, exactly what it allows (the
//! command's argv, or a port on the node's loopback), the user to run as,
//! and the CLI's ephemeral X25519 key (`epk`) the tunnel is sealed to.
//!
//! [`verify`] is the node's check of everything but the `jti` (the node
//! keeps the jti set in its journal). Keys are named by their RFC 7638
//! thumbprint, so a JWKS and a ticket made by any JOSE library agree.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

/// The one signature algorithm a ticket may name.
pub const ALG: &str = "EdDSA";

/// Who issues tickets (`iss`).
pub const ISSUER: &str = "better-compute";

/// The longest a ticket may live (`exp - iat`, seconds).
pub const MAX_LIFE_S: i64 = 60;

/// How far past the node's server time a ticket's `iat` may be (seconds):
/// the key holder's clock and the node's mark differ by this much at most.
pub const FUTURE_SLACK_S: i64 = 60;

/// How long the node remembers a used `jti` past its `exp`: the server
/// time mark may go back by up to five minutes (a restart from an older
/// mark), and a ticket must not verify again then.
pub const JTI_KEPT_PAST_EXP_MS: i64 = 5 * 60_000;

/// The longest compact ticket a node reads.
pub const MAX_TICKET_LEN: usize = 8 * 1024;

/// The longest `jti`, `sid` or `sub`.
const MAX_ID_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error(
        "the ticket is not a compact JWS (three base64url parts of at most {MAX_TICKET_LEN} bytes)"
    )]
    Malformed,
    #[error("the ticket's header does not parse: {0}")]
    Header(String),
    #[error("the ticket is signed with alg {0:?}; only EdDSA is accepted")]
    Alg(String),
    #[error(
        "the node's signed spec carries no ticket keys yet: wait for the node to take its spec (better-compute nodes spec NODE) and open the tunnel again"
    )]
    NoKeys,
    #[error(
        "the ticket's key {0:?} is not among the node's ticket keys: the node has not taken the spec naming it yet, or the key was retired"
    )]
    UnknownKey(String),
    #[error("the ticket's signature does not verify under key {0:?}")]
    Signature(String),
    #[error("the ticket's claims do not parse: {0}")]
    Claims(String),
    #[error("the ticket was issued by {0:?}, not better-compute")]
    Issuer(String),
    #[error("the ticket is for node {ticket:?}, not this node ({this:?})")]
    OtherNode { ticket: String, this: String },
    #[error("the ticket is for tunnel {ticket:?}, not the tunnel asked for ({asked:?})")]
    OtherTunnel { ticket: String, asked: String },
    #[error(
        "the ticket expired at {exp} s; the node's server time is {now_ms} ms: ask for a new one"
    )]
    Expired { exp: i64, now_ms: i64 },
    #[error("the ticket is issued at {iat} s, ahead of the node's server time {now_ms} ms")]
    Future { iat: i64, now_ms: i64 },
    #[error("the ticket lives {0} s; a ticket lives {MAX_LIFE_S} s at most")]
    TooLong(i64),
    #[error("the ticket allows {0}")]
    Allows(&'static str),
    #[error("the ticket's epk is not a base64url X25519 public key")]
    ClientKey,
    #[error("the ticket's jti {0:?} was used already: a ticket opens one tunnel")]
    Replayed(String),
}

/// One public key of a JWKS. Only Ed25519 keys (`kty` OKP, `crv`
/// Ed25519) verify tickets; others are kept and ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    pub kty: String,
    #[serde(default)]
    pub crv: String,
    #[serde(default)]
    pub x: String,
    #[serde(default)]
    pub kid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub alg: String,
    #[serde(default, rename = "use", skip_serializing_if = "String::is_empty")]
    pub use_: String,
}

impl Jwk {
    /// The JWK of an Ed25519 public key, named by its thumbprint.
    pub fn ed25519(public: &[u8]) -> Jwk {
        Jwk {
            kty: "OKP".into(),
            crv: "Ed25519".into(),
            x: B64.encode(public),
            kid: thumbprint(public),
            alg: ALG.into(),
            use_: "sig".into(),
        }
    }

    /// The raw Ed25519 public key, when this is one.
    fn ed25519_public(&self) -> Option<Vec<u8>> {
        if self.kty != "OKP" || self.crv != "Ed25519" {
            return None;
        }
        B64.decode(&self.x).ok().filter(|k| k.len() == 32)
    }
}

/// A JWK Set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

impl Jwks {
    /// The set of these Ed25519 public keys, in order.
    pub fn of(publics: &[Vec<u8>]) -> Jwks {
        Jwks {
            keys: publics.iter().map(|k| Jwk::ed25519(k)).collect(),
        }
    }

    /// A JWKS as JSON; empty text is the empty set.
    pub fn parse(json: &str) -> Result<Jwks, TicketError> {
        if json.is_empty() {
            return Ok(Jwks::default());
        }
        serde_json::from_str(json).map_err(|e| TicketError::Header(format!("ticket keys: {e}")))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether a key with this id is in the set.
    pub fn contains(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid == kid)
    }
}

/// RFC 7638's thumbprint of an Ed25519 key: base64url SHA-256 of its
/// required members in lexicographic order.
pub fn thumbprint(public: &[u8]) -> String {
    let canonical = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        B64.encode(public)
    );
    B64.encode(ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes()).as_ref())
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    typ: String,
}

/// What a ticket says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    /// The operator who asked.
    pub sub: String,
    pub node: String,
    /// The tunnel.
    pub sid: String,
    pub jti: String,
    /// Issued at, seconds since the epoch.
    pub iat: i64,
    /// Expires at, seconds since the epoch.
    pub exp: i64,
    /// Exec: the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<Vec<String>>,
    /// Port-forward: the port on the node's loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Exec under a terminal.
    #[serde(default)]
    pub tty: bool,
    /// Whom the command runs as.
    #[serde(default)]
    pub user: String,
    /// The CLI's ephemeral X25519 public key, base64url.
    pub epk: String,
}

/// What a ticket lets the tunnel do: exactly one thing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allows {
    Exec {
        argv: Vec<String>,
        tty: bool,
        user: String,
    },
    Port(u16),
}

impl Claims {
    /// What the ticket allows; an empty command, a port of 0, both or
    /// neither is refused.
    pub fn allows(&self) -> Result<Allows, TicketError> {
        match (&self.exec, self.port) {
            (Some(argv), None) if argv.first().is_some_and(|a| !a.is_empty()) => {
                if self.user.is_empty() {
                    return Err(TicketError::Allows("a command but names no user"));
                }
                Ok(Allows::Exec {
                    argv: argv.clone(),
                    tty: self.tty,
                    user: self.user.clone(),
                })
            }
            (Some(_), None) => Err(TicketError::Allows("an empty command")),
            (None, Some(p)) if p > 0 => Ok(Allows::Port(p)),
            (None, Some(_)) => Err(TicketError::Allows("port 0")),
            (Some(_), Some(_)) => Err(TicketError::Allows("both a command and a port")),
            (None, None) => Err(TicketError::Allows("neither a command nor a port")),
        }
    }

    /// The CLI's X25519 public key.
    pub fn client_public(&self) -> Result<[u8; 32], TicketError> {
        B64.decode(&self.epk)
            .ok()
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
            .ok_or(TicketError::ClientKey)
    }

    /// Until when the node keeps the `jti` (ms since the epoch).
    pub fn keep_jti_until_ms(&self) -> i64 {
        self.exp
            .saturating_mul(1000)
            .saturating_add(JTI_KEPT_PAST_EXP_MS)
    }
}

/// The compact ticket `key` signs for `claims`.
pub fn sign(key: &Ed25519KeyPair, claims: &Claims) -> String {
    sign_jws(key, "JWT", &serde_json::to_vec(claims).unwrap_or_default())
}

/// A compact JWS (EdDSA, `kid` the key's thumbprint) of `payload` with
/// header `typ`.
pub(crate) fn sign_jws(key: &Ed25519KeyPair, typ: &str, payload: &[u8]) -> String {
    let header = Header {
        alg: ALG.into(),
        kid: thumbprint(key.public_key().as_ref()),
        typ: typ.into(),
    };
    let encode = |v: &[u8]| B64.encode(v);
    let signing_input = format!(
        "{}.{}",
        encode(&serde_json::to_vec(&header).unwrap_or_default()),
        encode(payload)
    );
    let signature = key.sign(signing_input.as_bytes());
    format!("{signing_input}.{}", encode(signature.as_ref()))
}

/// Opens a compact JWS of at most `max_len` bytes signed (EdDSA) by a key
/// of `keys`: its `typ` header and payload.
pub(crate) fn open_jws(
    compact: &str,
    keys: &Jwks,
    max_len: usize,
) -> Result<(String, Vec<u8>), TicketError> {
    if compact.len() > max_len {
        return Err(TicketError::Malformed);
    }
    let mut parts = compact.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TicketError::Malformed);
    };
    let decode = |p: &str| B64.decode(p).map_err(|_| TicketError::Malformed);
    let (header, payload, signature) = (decode(h)?, decode(c)?, decode(s)?);
    let header: Header =
        serde_json::from_slice(&header).map_err(|e| TicketError::Header(e.to_string()))?;
    if header.alg != ALG {
        return Err(TicketError::Alg(header.alg));
    }
    if keys.keys.is_empty() {
        return Err(TicketError::NoKeys);
    }
    let public = keys
        .keys
        .iter()
        .filter(|k| !header.kid.is_empty() && k.kid == header.kid)
        .find_map(Jwk::ed25519_public)
        .ok_or_else(|| TicketError::UnknownKey(header.kid.clone()))?;
    let signing_input = &compact[..h.len() + 1 + c.len()];
    UnparsedPublicKey::new(&ED25519, &public)
        .verify(signing_input.as_bytes(), &signature)
        .map_err(|_| TicketError::Signature(header.kid.clone()))?;
    Ok((header.typ, payload))
}

/// What the node expects of a ticket.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    pub node: &'a str,
    pub sid: &'a str,
    /// The node's server time (ms since the epoch).
    pub now_ms: i64,
}

/// Verifies `ticket` against `keys` and what the node expects: the
/// header names EdDSA and a key in the set, the signature verifies, the
/// issuer, node and tunnel match, it lives a minute at most, is not
/// issued ahead of the node's time and has not expired, and it allows
/// exactly one thing. The `jti` is the caller's to check.
pub fn verify(ticket: &str, keys: &Jwks, expect: Expect<'_>) -> Result<Claims, TicketError> {
    let (typ, claims) = open_jws(ticket, keys, MAX_TICKET_LEN)?;
    // Another kind of token the same keys sign (a secret delivery) is
    // never a ticket.
    if !typ.is_empty() && !typ.eq_ignore_ascii_case("JWT") {
        return Err(TicketError::Header(format!(
            "typ {typ:?} is not a ticket's (JWT)"
        )));
    }
    let claims: Claims =
        serde_json::from_slice(&claims).map_err(|e| TicketError::Claims(e.to_string()))?;
    if claims.iss != ISSUER {
        return Err(TicketError::Issuer(claims.iss));
    }
    if [&claims.sid, &claims.jti, &claims.sub]
        .iter()
        .any(|v| v.is_empty() || v.len() > MAX_ID_LEN)
    {
        return Err(TicketError::Claims(format!(
            "sid, jti and sub are 1 to {MAX_ID_LEN} bytes"
        )));
    }
    if claims.node != expect.node {
        return Err(TicketError::OtherNode {
            ticket: claims.node,
            this: expect.node.to_string(),
        });
    }
    if claims.sid != expect.sid {
        return Err(TicketError::OtherTunnel {
            ticket: claims.sid,
            asked: expect.sid.to_string(),
        });
    }
    let life = claims.exp.saturating_sub(claims.iat);
    if !(0..=MAX_LIFE_S).contains(&life) {
        return Err(TicketError::TooLong(life));
    }
    if claims.exp.saturating_mul(1000) <= expect.now_ms {
        return Err(TicketError::Expired {
            exp: claims.exp,
            now_ms: expect.now_ms,
        });
    }
    if claims
        .iat
        .saturating_sub(FUTURE_SLACK_S)
        .saturating_mul(1000)
        > expect.now_ms
    {
        return Err(TicketError::Future {
            iat: claims.iat,
            now_ms: expect.now_ms,
        });
    }
    claims.allows()?;
    claims.client_public()?;
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(seed: u8) -> Ed25519KeyPair {
        Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
    }

    fn keys(k: &Ed25519KeyPair) -> Jwks {
        Jwks::of(&[k.public_key().as_ref().to_vec()])
    }

    const NOW_MS: i64 = 1_800_000_000_000;

    fn claims() -> Claims {
        Claims {
            iss: ISSUER.into(),
            sub: "alice".into(),
            node: "nd-1".into(),
            sid: "tn-1".into(),
            jti: "j-1".into(),
            iat: NOW_MS / 1000,
            exp: NOW_MS / 1000 + 30,
            exec: Some(vec!["nvidia-smi".into()]),
            port: None,
            tty: false,
            user: "root".into(),
            epk: B64.encode([7u8; 32]),
        }
    }

    fn expect() -> Expect<'static> {
        Expect {
            node: "nd-1",
            sid: "tn-1",
            now_ms: NOW_MS,
        }
    }

    #[test]
    fn a_ticket_verifies_under_its_key_and_says_what_it_allows() {
        let k = key(1);
        let got = verify(&sign(&k, &claims()), &keys(&k), expect()).unwrap();
        assert_eq!(got, claims());
        assert_eq!(
            got.allows().unwrap(),
            Allows::Exec {
                argv: vec!["nvidia-smi".into()],
                tty: false,
                user: "root".into()
            }
        );
        assert_eq!(got.client_public().unwrap(), [7u8; 32]);
        assert_eq!(
            got.keep_jti_until_ms(),
            (NOW_MS / 1000 + 30) * 1000 + 300_000
        );
    }

    #[test]
    fn two_keys_overlap_and_a_retired_one_verifies_nothing() {
        let (old, new) = (key(1), key(2));
        let both = Jwks::of(&[
            old.public_key().as_ref().to_vec(),
            new.public_key().as_ref().to_vec(),
        ]);
        for k in [&old, &new] {
            verify(&sign(k, &claims()), &both, expect()).unwrap();
        }
        assert!(matches!(
            verify(&sign(&old, &claims()), &keys(&new), expect()),
            Err(TicketError::UnknownKey(_))
        ));
    }

    /// Replaces the ticket's header, keeping claims and signature.
    fn with_header(ticket: &str, header: &str) -> String {
        let rest = ticket.split_once('.').unwrap().1;
        format!("{}.{rest}", B64.encode(header))
    }

    #[test]
    fn every_wrong_ticket_is_refused_saying_why() {
        let k = key(1);
        let good = sign(&k, &claims());
        let kid = thumbprint(k.public_key().as_ref());
        let signed = |f: &dyn Fn(&mut Claims)| {
            let mut c = claims();
            f(&mut c);
            verify(&sign(&k, &c), &keys(&k), expect())
        };
        let cases: Vec<(Result<Claims, TicketError>, &str)> = vec![
            (
                verify(
                    &with_header(&good, r#"{"alg":"none"}"#),
                    &keys(&k),
                    expect(),
                ),
                "only EdDSA",
            ),
            (
                verify(
                    &format!(
                        "{}.",
                        with_header(&good, r#"{"alg":"none"}"#)
                            .rsplit_once('.')
                            .unwrap()
                            .0
                    ),
                    &keys(&k),
                    expect(),
                ),
                "only EdDSA",
            ),
            (
                verify(
                    &with_header(&good, &format!(r#"{{"alg":"ES256","kid":"{kid}"}}"#)),
                    &keys(&k),
                    expect(),
                ),
                "only EdDSA",
            ),
            (
                verify(
                    &with_header(&good, r#"{"alg":"EdDSA","kid":"other"}"#),
                    &keys(&k),
                    expect(),
                ),
                "not among the node's ticket keys",
            ),
            (
                verify(&good, &Jwks::default(), expect()),
                "carries no ticket keys",
            ),
            (
                verify(&sign(&key(9), &claims()), &keys(&k), expect()),
                "not among",
            ),
            (signed(&|c| c.iss = "mallory".into()), "issued by"),
            (signed(&|c| c.node = "nd-2".into()), "for node"),
            (signed(&|c| c.sid = "tn-2".into()), "for tunnel"),
            (
                signed(&|c| {
                    c.iat -= 60;
                    c.exp = NOW_MS / 1000
                }),
                "expired",
            ),
            (
                signed(&|c| {
                    c.iat += 120;
                    c.exp = c.iat + 30
                }),
                "ahead of the node's server time",
            ),
            (signed(&|c| c.exp = c.iat + 3600), "lives 3600 s"),
            (signed(&|c| c.exp = c.iat - 1), "lives -1 s"),
            (signed(&|c| c.exec = Some(vec![])), "an empty command"),
            (signed(&|c| c.port = Some(22)), "both a command and a port"),
            (signed(&|c| c.exec = None), "neither"),
            (
                signed(&|c| {
                    c.exec = None;
                    c.port = Some(0)
                }),
                "port 0",
            ),
            (signed(&|c| c.user = String::new()), "names no user"),
            (signed(&|c| c.epk = "short".into()), "epk"),
            (signed(&|c| c.jti = String::new()), "sid, jti and sub"),
            (verify("a.b", &keys(&k), expect()), "compact JWS"),
            (verify("a.b.c.d", &keys(&k), expect()), "compact JWS"),
        ];
        for (i, (got, says)) in cases.into_iter().enumerate() {
            let e = got.expect_err(&format!("case {i} verified"));
            assert!(e.to_string().contains(says), "case {i}: {e}");
        }
        // A signature over other claims does not verify.
        let mut parts: Vec<String> = good.split('.').map(String::from).collect();
        let mut c = claims();
        c.exec = Some(vec!["rm".into(), "-rf".into(), "/".into()]);
        parts[1] = B64.encode(serde_json::to_vec(&c).unwrap());
        assert!(matches!(
            verify(&parts.join("."), &keys(&k), expect()),
            Err(TicketError::Signature(_))
        ));
        // A port ticket allows the port.
        let mut c = claims();
        c.exec = None;
        c.port = Some(8888);
        assert_eq!(
            verify(&sign(&k, &c), &keys(&k), expect())
                .unwrap()
                .allows()
                .unwrap(),
            Allows::Port(8888)
        );
    }

    #[test]
    fn the_thumbprint_is_rfc_7638s() {
        // RFC 8037 appendix A.3: the thumbprint of its Ed25519 example key.
        let x = B64
            .decode("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
            .unwrap();
        assert_eq!(
            thumbprint(&x),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
    }

    #[test]
    fn a_jwks_reads_back_and_ignores_keys_of_other_kinds() {
        let k = key(3);
        let set = keys(&k);
        assert_eq!(Jwks::parse(&set.to_json()).unwrap(), set);
        assert_eq!(Jwks::parse("").unwrap(), Jwks::default());
        assert!(Jwks::parse("{").is_err());
        let mut odd = set.clone();
        odd.keys[0].crv = "P-256".into();
        assert!(matches!(
            verify(&sign(&k, &claims()), &odd, expect()),
            Err(TicketError::UnknownKey(_))
        ));
    }

    proptest! {
        /// Whatever bytes arrive as a ticket, verifying returns, and only
        /// the ticket the key signed verifies.
        #[test]
        fn no_ticket_bytes_panic_and_no_flipped_bit_verifies(
            junk in ".{0,400}",
            bit in 0usize..4096,
        ) {
            let k = key(1);
            let _ = verify(&junk, &keys(&k), expect());
            let mut t = sign(&k, &claims()).into_bytes();
            let i = bit % (t.len() * 8);
            t[i / 8] ^= 1 << (i % 8);
            if let Ok(s) = String::from_utf8(t) {
                // base64url's last character may carry unused bits.
                if let Ok(c) = verify(&s, &keys(&k), expect()) {
                    prop_assert_eq!(c, claims());
                }
            }
        }
    }
}
