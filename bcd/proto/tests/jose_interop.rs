//! Exec tickets and secret deliveries against an independent JOSE
//! implementation: Python's jwcrypto (Debian's python3-jwcrypto) makes
//! keys and tickets our verifier must accept or refuse, verifies the
//! tickets we sign under the JWKS we publish, encrypts to a node's
//! one-time key a JWE the node must open, and opens the JWE the broker
//! makes for a key jwcrypto holds, after verifying the broker's signature
//! around it.
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::process::{Command, Stdio};

use bcd_proto::secret::{self, Delivery, OneTimeKey, Request};
use bcd_proto::ticket::{self, Claims, Expect, Jwks, TicketError};
use ring::signature::{Ed25519KeyPair, KeyPair};

const PYTHON: &str = "/usr/bin/python3";

/// Runs `script` under Debian's Python with `input` on stdin; its stdout.
fn python(script: &str, input: &str) -> String {
    let mut child = Command::new(PYTHON)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/test installs python3-jwcrypto)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn claims(now: i64) -> Claims {
    Claims {
        iss: ticket::ISSUER.into(),
        sub: "alice".into(),
        node: "nd-1".into(),
        sid: "tn-1".into(),
        jti: "jti-1".into(),
        iat: now,
        exp: now + 30,
        exec: Some(vec!["nvidia-smi".into(), "-L".into()]),
        port: None,
        tty: false,
        user: "root".into(),
        epk: "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc".into(),
    }
}

/// jwcrypto makes an Ed25519 key and signs, with the claims on stdin: a
/// good ticket, one with `alg: none`, one naming a kid not in the set,
/// one signed by a key not in the set; then the public JWKS.
const MAKE: &str = r#"
import json, sys
from jwcrypto import jwk, jwt, jws
from jwcrypto.common import base64url_encode
claims = sys.stdin.read()
key = jwk.JWK.generate(kty='OKP', crv='Ed25519')
kid = key.thumbprint()
other = jwk.JWK.generate(kty='OKP', crv='Ed25519')
def signed(k, header):
    t = jwt.JWT(header=header, claims=claims)
    t.make_signed_token(k)
    return t.serialize()
good = signed(key, {'alg': 'EdDSA', 'kid': kid, 'typ': 'JWT'})
none = base64url_encode(json.dumps({'alg': 'none'})) + '.' + base64url_encode(claims) + '.'
wrong_kid = signed(key, {'alg': 'EdDSA', 'kid': 'not-' + kid})
foreign = signed(other, {'alg': 'EdDSA', 'kid': kid})
pub = json.loads(key.export_public())
pub['kid'] = kid
print(json.dumps({'good': good, 'none': none, 'wrong_kid': wrong_kid,
                  'foreign': foreign, 'jwks': {'keys': [pub]}}))
"#;

#[test]
#[ignore = "needs python3-jwcrypto (scripts/test installs it)"]
fn tickets_jwcrypto_signs_are_accepted_and_its_forgeries_refused() {
    let now = now_s();
    let c = claims(now);
    let out: serde_json::Value =
        serde_json::from_str(&python(MAKE, &serde_json::to_string(&c).unwrap())).unwrap();
    let keys = Jwks::parse(&out["jwks"].to_string()).unwrap();
    let expect = Expect {
        node: "nd-1",
        sid: "tn-1",
        now_ms: now * 1000,
    };
    let t = |name: &str| out[name].as_str().unwrap().to_string();
    assert_eq!(ticket::verify(&t("good"), &keys, expect).unwrap(), c);
    assert!(matches!(
        ticket::verify(&t("none"), &keys, expect),
        Err(TicketError::Alg(a)) if a == "none"
    ));
    assert!(matches!(
        ticket::verify(&t("wrong_kid"), &keys, expect),
        Err(TicketError::UnknownKey(_))
    ));
    assert!(matches!(
        ticket::verify(&t("foreign"), &keys, expect),
        Err(TicketError::Signature(_))
    ));
    // Another node's, another tunnel's, an expired one.
    let other = Expect {
        node: "nd-2",
        ..expect
    };
    assert!(matches!(
        ticket::verify(&t("good"), &keys, other),
        Err(TicketError::OtherNode { .. })
    ));
    let other = Expect {
        sid: "tn-2",
        ..expect
    };
    assert!(matches!(
        ticket::verify(&t("good"), &keys, other),
        Err(TicketError::OtherTunnel { .. })
    ));
    let later = Expect {
        now_ms: (now + 31) * 1000,
        ..expect
    };
    assert!(matches!(
        ticket::verify(&t("good"), &keys, later),
        Err(TicketError::Expired { .. })
    ));
}

/// jwcrypto verifies, under the JWKS we publish, a ticket we signed, and
/// prints its claims.
const CHECK: &str = r#"
import json, sys
from jwcrypto import jwk, jwt
given = json.loads(sys.stdin.read())
keys = jwk.JWKSet.from_json(json.dumps(given['jwks']))
t = jwt.JWT(jwt=given['ticket'], key=keys, algs=['EdDSA'])
print(t.claims)
"#;

#[test]
#[ignore = "needs python3-jwcrypto (scripts/test installs it)"]
fn jwcrypto_verifies_the_tickets_we_sign_under_the_jwks_we_publish() {
    let key = Ed25519KeyPair::from_seed_unchecked(&[5; 32]).unwrap();
    let c = claims(now_s());
    let input = serde_json::json!({
        "jwks": serde_json::from_str::<serde_json::Value>(
            &Jwks::of(&[key.public_key().as_ref().to_vec()]).to_json()
        ).unwrap(),
        "ticket": ticket::sign(&key, &c),
    });
    let claims: Claims = serde_json::from_str(python(CHECK, &input.to_string()).trim()).unwrap();
    assert_eq!(claims, c);
}

/// jwcrypto encrypts the value on stdin's second line to the X25519 JWK on
/// its first: ECDH-ES, A256GCM, compact.
const ENCRYPT: &str = r#"
import json, sys
from jwcrypto import jwk, jwe
lines = sys.stdin.read().split('\n')
key = jwk.JWK(**json.loads(lines[0]))
t = jwe.JWE(lines[1].encode(), json.dumps({'alg': 'ECDH-ES', 'enc': 'A256GCM'}))
t.add_recipient(key)
print(t.serialize(compact=True))
"#;

#[test]
#[ignore = "needs python3-jwcrypto (scripts/test installs it)"]
fn a_jwe_jwcrypto_encrypts_to_a_one_time_key_opens_with_it() {
    let otk = OneTimeKey::new().unwrap();
    let jwe = python(ENCRYPT, &format!("{}\nvalue from jwcrypto", otk.jwk()));
    assert_eq!(otk.open(jwe.trim()).unwrap(), b"value from jwcrypto");
    // Made for another key, it does not open.
    let other = OneTimeKey::new().unwrap();
    let jwe = python(ENCRYPT, &format!("{}\nv", OneTimeKey::new().unwrap().jwk()));
    assert_eq!(
        other.open(jwe.trim()).unwrap_err(),
        secret::SecretError::Decrypt
    );
}

/// jwcrypto makes an X25519 key and prints it whole (private part too).
const NEW_X25519: &str = r#"
from jwcrypto import jwk
print(jwk.JWK.generate(kty='OKP', crv='X25519').export())
"#;

/// jwcrypto verifies a delivery under the JWKS, then opens its JWE with
/// the private key; prints the claims' version and the value.
const OPEN_DELIVERY: &str = r#"
import json, sys
from jwcrypto import jwk, jwt, jwe
i = json.loads(sys.stdin.read())
keys = jwk.JWKSet.from_json(json.dumps(i['jwks']))
t = jwt.JWT(jwt=i['delivery'], key=keys, algs=['EdDSA'], check_claims=False)
assert json.loads(t.header)['typ'] == 'bc-secret+jwt'
claims = json.loads(t.claims)
e = jwe.JWE()
e.deserialize(claims['jwe'], key=jwk.JWK(**i['key']))
print(claims['version'], e.payload.decode())
"#;

#[test]
#[ignore = "needs python3-jwcrypto (scripts/test installs it)"]
fn jwcrypto_verifies_a_delivery_and_opens_the_jwe_the_broker_made() {
    use base64::Engine;
    let key: serde_json::Value = serde_json::from_str(python(NEW_X25519, "").trim()).unwrap();
    let public = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(key["x"].as_str().unwrap())
        .unwrap();
    let broker = Ed25519KeyPair::from_seed_unchecked(&[6; 32]).unwrap();
    let r = Request {
        node: "nd-1",
        allocation: "job-7",
        name: "hf-token",
        version: 3,
        one_time_key: &public,
        time_ms: now_s() * 1000,
    };
    let d = Delivery {
        iss: ticket::ISSUER.into(),
        node: r.node.into(),
        allocation: r.allocation.into(),
        name: r.name.into(),
        version: r.version,
        req: secret::request_digest(&secret::request_statement(&r)),
        iat: now_s(),
        jwe: secret::seal(b"value from the broker", &public).unwrap(),
    };
    let input = serde_json::json!({
        "jwks": serde_json::from_str::<serde_json::Value>(
            &Jwks::of(&[broker.public_key().as_ref().to_vec()]).to_json()
        ).unwrap(),
        "delivery": secret::sign_delivery(&broker, &d),
        "key": key,
    });
    assert_eq!(
        python(OPEN_DELIVERY, &input.to_string()).trim(),
        "3 value from the broker"
    );
}
