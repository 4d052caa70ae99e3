//! Console tokens: what `operators login` mints so a browser, which rarely
//! holds a client certificate, can open the read-only web console.
//!
//! A token is `bcc1.` followed by two base64url parts: a
//! [`v1::ConsoleToken`] and the worker key's Ed25519 signature over
//! [`CONTEXT`] and those bytes. It names the operator, the role and the
//! certificate that minted it, and when it ends. The console opens it with
//! the worker public key ([`open`]), so a row a gateway can write never
//! makes one; then it checks the certificate in the store as the operator
//! API does, so revoking the operator ends its tokens too.
//!
//! Time is a parameter here: [`mint`] and [`open`] take `now_ms`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bc_store::tokens::OperatorRole;
use bcd_proto::v1;
use prost::Message as _;
use ring::signature::{ED25519, Ed25519KeyPair, UnparsedPublicKey};

/// What every token starts with: the format and its version.
pub const PREFIX: &str = "bcc1.";
/// What the signature covers before the token's bytes.
pub const CONTEXT: &[u8] = b"better-compute console token v1\0";
/// The token format this server writes; it reads this and version 1.
pub const VERSION: u32 = 2;
/// A token's life when the caller names none.
pub const DEFAULT_TTL_MS: u64 = 60 * 60 * 1000;
/// The longest life a token may have.
pub const MAX_TTL_MS: u64 = 12 * 60 * 60 * 1000;
/// The longest token text read (a few hundred bytes are written).
pub const MAX_TOKEN: usize = 2048;

/// Who a token signs in, once it opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub operator: String,
    pub role: OperatorRole,
    pub cert_sha256: String,
    pub expires_ms: i64,
}

/// A token for `operator` (role `role`, certificate `cert_sha256`) that
/// opens the console from `now_ms` for `ttl_ms` (0: an hour; more than
/// [`MAX_TTL_MS`] is refused), with its end.
pub fn mint(
    key: &Ed25519KeyPair,
    operator: &str,
    role: OperatorRole,
    cert_sha256: &str,
    now_ms: i64,
    ttl_ms: u64,
    nonce: [u8; 16],
) -> Result<(String, i64), String> {
    let ttl_ms = match ttl_ms {
        0 => DEFAULT_TTL_MS,
        t if t > MAX_TTL_MS => {
            return Err(format!(
                "a console token lives at most 12h; ask for less (--ttl 12h), not {} s",
                t / 1000
            ));
        }
        t => t,
    };
    let expires_ms = now_ms.saturating_add(i64::try_from(ttl_ms).unwrap_or(i64::MAX));
    let body = v1::ConsoleToken {
        version: VERSION,
        operator: operator.to_string(),
        role_name: String::new(),
        role: super::operator::wire_role(role) as i32,
        cert_sha256: cert_sha256.to_string(),
        issued_ms: now_ms,
        expires_ms,
        nonce: nonce.to_vec(),
    }
    .encode_to_vec();
    let signature = key.sign(&signed(&body));
    let token = format!(
        "{PREFIX}{}.{}",
        URL_SAFE_NO_PAD.encode(&body),
        URL_SAFE_NO_PAD.encode(signature.as_ref())
    );
    Ok((token, expires_ms))
}

fn signed(body: &[u8]) -> Vec<u8> {
    [CONTEXT, body].concat()
}

/// Why a token does not open the console; each says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not a token of this format at all (a typo, a truncated paste).
    Malformed,
    /// No worker key of this fleet signed it.
    Forged,
    Expired,
    /// A format version this server does not read.
    Version,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::Malformed => {
                "that is not a console token (one starts with bcc1.): copy the whole token \
                 that better-compute operators login printed"
            }
            Refused::Forged => {
                "that token was not signed by this fleet's control plane: mint one with \
                 better-compute operators login against this server"
            }
            Refused::Expired => {
                "that token has expired: mint another with better-compute operators login"
            }
            Refused::Version => {
                "that token is of a format this server does not read: mint one with this \
                 server's better-compute operators login"
            }
        })
    }
}

/// Opens `token` with the worker public keys `keys` at `now_ms`.
pub fn open(keys: &[Vec<u8>], token: &str, now_ms: i64) -> Result<Opened, Refused> {
    let token = token.trim();
    if token.len() > MAX_TOKEN {
        return Err(Refused::Malformed);
    }
    let rest = token.strip_prefix(PREFIX).ok_or(Refused::Malformed)?;
    let (body, signature) = rest.split_once('.').ok_or(Refused::Malformed)?;
    let body = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| Refused::Malformed)?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| Refused::Malformed)?;
    let message = signed(&body);
    if !keys.iter().any(|k| {
        UnparsedPublicKey::new(&ED25519, k)
            .verify(&message, &signature)
            .is_ok()
    }) {
        return Err(Refused::Forged);
    }
    let t = v1::ConsoleToken::decode(body.as_slice()).map_err(|_| Refused::Malformed)?;
    let role = match t.version {
        // Minted before roles were an enum: by name, read until it ends.
        1 => OperatorRole::parse(&t.role_name),
        VERSION => super::operator::role(t.role),
        _ => return Err(Refused::Version),
    }
    .ok_or(Refused::Malformed)?;
    if now_ms >= t.expires_ms || t.issued_ms > now_ms.saturating_add(5 * 60 * 1000) {
        return Err(Refused::Expired);
    }
    Ok(Opened {
        operator: t.operator,
        role,
        cert_sha256: t.cert_sha256,
        expires_ms: t.expires_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(seed: u8) -> Ed25519KeyPair {
        Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
    }

    fn public(k: &Ed25519KeyPair) -> Vec<Vec<u8>> {
        use ring::signature::KeyPair as _;
        vec![k.public_key().as_ref().to_vec()]
    }

    const NOW: i64 = 1_790_000_000_000;

    fn minted(ttl_ms: u64) -> String {
        mint(
            &key(1),
            "alice",
            OperatorRole::ReadOnly,
            "ab",
            NOW,
            ttl_ms,
            [3; 16],
        )
        .unwrap()
        .0
    }

    #[test]
    fn a_token_opens_until_it_ends_and_only_with_its_key() {
        let t = minted(0);
        let o = open(&public(&key(1)), &t, NOW + 1).unwrap();
        assert_eq!(
            o,
            Opened {
                operator: "alice".into(),
                role: OperatorRole::ReadOnly,
                cert_sha256: "ab".into(),
                expires_ms: NOW + DEFAULT_TTL_MS as i64,
            }
        );
        assert_eq!(
            open(&public(&key(1)), &t, NOW + DEFAULT_TTL_MS as i64),
            Err(Refused::Expired)
        );
        assert_eq!(open(&public(&key(2)), &t, NOW), Err(Refused::Forged));
        // Issued in the future (a clock far off, or a forged time): refused.
        assert_eq!(
            open(&public(&key(1)), &t, NOW - 10 * 60 * 1000),
            Err(Refused::Expired)
        );
        assert!(
            mint(
                &key(1),
                "a",
                OperatorRole::Admin,
                "",
                NOW,
                MAX_TTL_MS + 1,
                [0; 16]
            )
            .unwrap_err()
            .contains("at most 12h")
        );
    }

    /// A token of `body`, signed as [`mint`] signs one.
    fn signed_token(body: &v1::ConsoleToken) -> String {
        let body = body.encode_to_vec();
        let sig = key(1).sign(&signed(&body));
        format!(
            "{PREFIX}{}.{}",
            URL_SAFE_NO_PAD.encode(&body),
            URL_SAFE_NO_PAD.encode(sig.as_ref())
        )
    }

    /// A token minted before roles were an enum (version 1, the role by
    /// name) still opens with its role until it ends; a role name or a
    /// version this server does not know opens nothing.
    #[test]
    fn a_version_1_token_opens_with_the_role_it_names() {
        let v1_token = |role_name: &str, version: u32| v1::ConsoleToken {
            version,
            operator: "alice".into(),
            role_name: role_name.into(),
            role: 0,
            cert_sha256: "ab".into(),
            issued_ms: NOW,
            expires_ms: NOW + 1000,
            nonce: vec![3; 16],
        };
        let o = open(&public(&key(1)), &signed_token(&v1_token("admin", 1)), NOW).unwrap();
        assert_eq!(o.role, OperatorRole::Admin);
        let o = open(
            &public(&key(1)),
            &signed_token(&v1_token("read-only", 1)),
            NOW,
        )
        .unwrap();
        assert_eq!(o.role, OperatorRole::ReadOnly);
        assert_eq!(
            open(&public(&key(1)), &signed_token(&v1_token("root", 1)), NOW),
            Err(Refused::Malformed)
        );
        // Version 2 reads the enum only: a name there grants nothing.
        assert_eq!(
            open(&public(&key(1)), &signed_token(&v1_token("admin", 2)), NOW),
            Err(Refused::Malformed)
        );
        assert_eq!(
            open(&public(&key(1)), &signed_token(&v1_token("admin", 3)), NOW),
            Err(Refused::Version)
        );
    }

    /// A token edited anywhere, its role raised included, no longer opens.
    #[test]
    fn an_edited_token_is_forged() {
        let t = minted(0);
        let rest = t.strip_prefix(PREFIX).unwrap();
        let (body, sig) = rest.split_once('.').unwrap();
        let mut decoded =
            v1::ConsoleToken::decode(URL_SAFE_NO_PAD.decode(body).unwrap().as_slice()).unwrap();
        decoded.role = v1::OperatorRole::Admin as i32;
        decoded.expires_ms += 1;
        let edited = format!(
            "{PREFIX}{}.{sig}",
            URL_SAFE_NO_PAD.encode(decoded.encode_to_vec())
        );
        assert_eq!(open(&public(&key(1)), &edited, NOW), Err(Refused::Forged));
        // Signed without the context: the signature is over other bytes.
        let bare = key(1).sign(URL_SAFE_NO_PAD.decode(body).unwrap().as_slice());
        let no_context = format!("{PREFIX}{body}.{}", URL_SAFE_NO_PAD.encode(bare.as_ref()));
        assert_eq!(
            open(&public(&key(1)), &no_context, NOW),
            Err(Refused::Forged)
        );
        assert_eq!(
            open(&public(&key(1)), "bcc2.x.y", NOW),
            Err(Refused::Malformed)
        );
    }

    proptest! {
        /// Any text a browser posts is read or refused, never a panic; a
        /// token cut short or with a byte changed never opens.
        #[test]
        fn any_text_is_refused_or_read(text in ".{0,300}", cut in 0usize..200, at in 0usize..200, byte in any::<u8>()) {
            let _ = open(&public(&key(1)), &text, NOW);
            let t = minted(0);
            let short = &t[..cut.min(t.len() - 1)];
            prop_assert!(open(&public(&key(1)), short, NOW).is_err());
            let mut bytes = t.clone().into_bytes();
            let i = (PREFIX.len() + at) % bytes.len();
            if bytes[i] != byte && byte.is_ascii_graphic() {
                bytes[i] = byte;
                let changed = String::from_utf8(bytes).unwrap();
                prop_assert!(open(&public(&key(1)), &changed, NOW).is_err(), "{changed}");
            }
        }
    }
}
