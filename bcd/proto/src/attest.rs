//! A join by TPM attestation, in two round trips that may land on
//! different join services (a gateway relays each to whichever process
//! holds the fleet CA, and none keeps state between them).
//!
//! 1. `BeginAttestation`: the node sends its EK and AK public areas. The
//!    server builds a [`Ticket`] (when, a nonce, the EK's SHA-256, the AK's
//!    name), computes the ticket's [`secret`] (an HMAC under a key only the
//!    fleet CA's holders derive) and answers a TPM2_MakeCredential of that
//!    secret for the EK and the AK's name, with the ticket.
//! 2. `Join` with `JoinRequest.tpm`: the node's TPM activated the
//!    credential (only the TPM holding that EK can, and only for that AK),
//!    so the secret it returns proves the AK is in that TPM; the server
//!    recomputes the secret from the ticket, so a ticket nobody activated,
//!    or one edited, is refused. TPM2_Certify by the AK over
//!    [`qualifying_data`] (the ticket and the CSR) proves the node key is in
//!    the same TPM and binds it to this join. A ticket is good for
//!    [`TICKET_LIFE_MS`] of server time.
//!
//! Both ends build the bytes here; [`Ticket::decode`] bounds what a peer
//! hands back before anything looks at it.

use ring::hmac;

use crate::v1;

/// The version of `AttestationRequest`, `AttestationChallenge`,
/// `TpmAttestation` and of the ticket's encoding this code speaks.
pub const VERSION: u32 = 1;

/// How long a ticket is good for, either way of the server's clock.
pub const TICKET_LIFE_MS: i64 = 60_000;

/// The URI subject alternative name prefix of a certificate whose key an
/// AK certified: `urn:bc:tpm-ak:` and the hex of the AK's TPM name.
pub const AK_URN: &str = "urn:bc:tpm-ak:";

/// The largest TPM name (a SHA-512 name: 2 + 64 bytes).
const MAX_NAME: usize = 66;

/// What a secret's HMAC covers first.
const SECRET_DOMAIN: &[u8] = b"better-compute tpm challenge secret v1\0";
/// What the qualifying data's hash covers first.
const CERTIFY_DOMAIN: &[u8] = b"better-compute tpm certify v1\0";
/// What a renewal's qualifying data's hash covers first.
const RENEW_CERTIFY_DOMAIN: &[u8] = b"better-compute tpm renew certify v1\0";

/// A challenge as the server issued it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The server's time of issue, unix ms.
    pub issued_ms: i64,
    pub nonce: [u8; 16],
    /// SHA-256 of the EK's TPMT_PUBLIC.
    pub ek_sha256: [u8; 32],
    /// The AK's TPM name (name algorithm, then digest).
    pub ak_name: Vec<u8>,
}

/// Why a ticket a peer sent is refused before it is checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the attestation ticket is malformed ({0}): begin the attestation again (bcd join --attestor \
     tpm does)"
)]
pub struct BadTicket(pub &'static str);

impl Ticket {
    /// The encoding: the version (1 byte, [`VERSION`]), the time (8 bytes,
    /// big-endian), the nonce (16), the EK's SHA-256 (32), the AK name's
    /// length (1 byte) and the name.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(58 + self.ak_name.len());
        out.push(VERSION as u8);
        out.extend_from_slice(&self.issued_ms.to_be_bytes());
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.ek_sha256);
        out.push(self.ak_name.len() as u8);
        out.extend_from_slice(&self.ak_name);
        out
    }

    /// Reads what [`Ticket::encode`] wrote, from a peer.
    pub fn decode(bytes: &[u8]) -> Result<Ticket, BadTicket> {
        let (&version, rest) = bytes.split_first().ok_or(BadTicket("it is empty"))?;
        if u32::from(version) != VERSION {
            return Err(BadTicket("an unknown version"));
        }
        if rest.len() < 8 + 16 + 32 + 1 {
            return Err(BadTicket("it is cut short"));
        }
        let (time, rest) = rest.split_at(8);
        let (nonce, rest) = rest.split_at(16);
        let (ek, rest) = rest.split_at(32);
        let (&len, name) = rest.split_first().ok_or(BadTicket("it is cut short"))?;
        if usize::from(len) != name.len() {
            return Err(BadTicket("the AK name's length is not what follows"));
        }
        if name.len() < 2 || name.len() > MAX_NAME {
            return Err(BadTicket("the AK name is not a TPM name"));
        }
        Ok(Ticket {
            issued_ms: i64::from_be_bytes(time.try_into().expect("8 bytes")),
            nonce: nonce.try_into().expect("16 bytes"),
            ek_sha256: ek.try_into().expect("32 bytes"),
            ak_name: name.to_vec(),
        })
    }

    /// Whether the ticket is still good at the server's `now_ms`.
    pub fn fresh(&self, now_ms: i64) -> bool {
        (now_ms.saturating_sub(self.issued_ms)).abs() <= TICKET_LIFE_MS
    }
}

/// The secret the credential carries for the ticket whose encoding is
/// `ticket`: HMAC-SHA256 under the fleet's challenge key.
pub fn secret(key: &hmac::Key, ticket: &[u8]) -> [u8; 32] {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(SECRET_DOMAIN);
    ctx.update(ticket);
    let tag = ctx.sign();
    tag.as_ref().try_into().expect("HMAC-SHA256 is 32 bytes")
}

/// Whether `activated` is the ticket's secret (ring's constant-time
/// HMAC verification).
pub fn secret_matches(key: &hmac::Key, ticket: &[u8], activated: &[u8]) -> bool {
    let message = [SECRET_DOMAIN, ticket].concat();
    hmac::verify(key, &message, activated).is_ok()
}

/// What TPM2_Certify of the node key qualifies its statement with: the
/// SHA-256 of a domain, the ticket (length first) and the CSR's SHA-256.
pub fn qualifying_data(ticket: &[u8], csr_der: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(CERTIFY_DOMAIN);
    ctx.update(&(ticket.len() as u32).to_be_bytes());
    ctx.update(ticket);
    ctx.update(ring::digest::digest(&ring::digest::SHA256, csr_der).as_ref());
    ctx.finish()
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

/// What TPM2_Certify of a renewal's next key qualifies its statement with:
/// the SHA-256 of a domain and the renewal's proof statement
/// (`crate::renew::statement`: the node, the time, the CSR), so the
/// certification is as fresh as the proof and bound to the same CSR.
pub fn renewal_qualifying_data(renew_statement: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(RENEW_CERTIFY_DOMAIN);
    ctx.update(renew_statement);
    ctx.finish()
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

/// The URI a certificate carries for an AK whose TPM name is `ak_name`.
pub fn ak_urn(ak_name: &[u8]) -> String {
    format!("{AK_URN}{}", hex::encode(ak_name))
}

/// Checks the version of an attested join's fields before anything else
/// reads them.
pub fn check_version(t: &v1::TpmAttestation) -> Result<(), BadTicket> {
    if t.version != VERSION {
        return Err(BadTicket(
            "the attestation is of another version than this server's",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ticket() -> Ticket {
        Ticket {
            issued_ms: 1_790_000_000_000,
            nonce: [3; 16],
            ek_sha256: [4; 32],
            ak_name: [&[0x00, 0x0b][..], &[5; 32]].concat(),
        }
    }

    #[test]
    fn tickets_round_trip_and_expire() {
        let t = ticket();
        let bytes = t.encode();
        assert_eq!(bytes.len(), 1 + 8 + 16 + 32 + 1 + 34);
        assert_eq!(Ticket::decode(&bytes).unwrap(), t);
        assert!(t.fresh(t.issued_ms + TICKET_LIFE_MS));
        assert!(!t.fresh(t.issued_ms + TICKET_LIFE_MS + 1));
        assert!(!t.fresh(t.issued_ms - TICKET_LIFE_MS - 1));
        let mut v2 = bytes.clone();
        v2[0] = 2;
        assert_eq!(Ticket::decode(&v2), Err(BadTicket("an unknown version")));
    }

    #[test]
    fn the_secret_is_the_keyed_mac_of_the_ticket() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"fleet");
        let other = hmac::Key::new(hmac::HMAC_SHA256, b"another fleet");
        let bytes = ticket().encode();
        let s = secret(&key, &bytes);
        assert!(secret_matches(&key, &bytes, &s));
        assert!(!secret_matches(&other, &bytes, &s));
        let mut edited = bytes.clone();
        edited[10] ^= 1;
        assert!(!secret_matches(&key, &edited, &s));
        assert!(!secret_matches(&key, &bytes, &s[..31]));
        assert_ne!(
            qualifying_data(&bytes, b"csr"),
            qualifying_data(&bytes, b"another csr")
        );
        assert_eq!(ak_urn(&[0, 0x0b, 0xab]), "urn:bc:tpm-ak:000bab".to_string());
    }

    proptest! {
        /// A ticket comes back from the peer: any bytes decode or fail
        /// cleanly, and what decodes encodes to the same bytes.
        #[test]
        fn ticket_decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(t) = Ticket::decode(&bytes) {
                prop_assert_eq!(t.encode(), bytes);
            }
        }

        #[test]
        fn tickets_cut_short_are_refused(
            name in proptest::collection::vec(any::<u8>(), 2..=66),
            cut in any::<prop::sample::Index>(),
        ) {
            let t = Ticket { ak_name: name, ..ticket() };
            let bytes = t.encode();
            prop_assert_eq!(Ticket::decode(&bytes).unwrap(), t);
            let len = cut.index(bytes.len());
            prop_assert!(Ticket::decode(&bytes[..len]).is_err());
        }
    }
}
