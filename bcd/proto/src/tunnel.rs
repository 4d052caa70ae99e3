//! A tunnel's keys and records, sealed end to end between the operator's
//! CLI and the node, so the operator API and the gateway that relay it can
//! neither read nor change a byte.
//!
//! The CLI makes an ephemeral X25519 key and the key holder's exec ticket
//! names it (`epk`). The node that admits the ticket makes an ephemeral key
//! of its own and signs, with its node key, the tunnel, the ticket's
//! SHA-256 and that key ([`accept_message`]); the CLI checks the signature
//! under the node's certificate and the certificate against the fleet CA.
//! Both derive the same two keys: HKDF-SHA256 over the X25519 secret,
//! salted with the SHA-256 of the transcript (tunnel, ticket, both public
//! keys), one key for each direction. Every record is ChaCha20-Poly1305
//! under its direction's key with the record's sequence number as the
//! nonce, so a record dropped, repeated, reordered or moved to the other
//! direction does not open and ends the tunnel.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::agreement::{EphemeralPrivateKey, UnparsedPublicKey, X25519, agree_ephemeral};
use ring::hkdf::{HKDF_SHA256, Salt};
use ring::rand::SystemRandom;

/// What every accept and key derivation is bound to; `v1` is the format.
pub const LABEL: &[u8] = b"better-compute tunnel v1";

/// The most one record carries (its plaintext).
pub const MAX_RECORD: usize = 64 * 1024;

/// Tag bytes a sealed record adds.
pub const TAG_LEN: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TunnelError {
    #[error("no randomness for the tunnel's key")]
    Rng,
    #[error("the peer's tunnel key is not an X25519 public key")]
    BadKey,
    #[error("a tunnel record did not open: the relay dropped, repeated or changed a record")]
    Record,
    #[error("a tunnel record of {0} bytes is over the limit of {MAX_RECORD}")]
    TooLarge(usize),
    #[error("the tunnel has sent or received as many records as it may")]
    Exhausted,
}

/// SHA-256 of a ticket's compact form.
pub fn ticket_sha256(ticket: &str) -> [u8; 32] {
    digest(&[ticket.as_bytes()])
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Fields, each length-prefixed (4 bytes, big-endian), after the label.
fn framed(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = LABEL.to_vec();
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// What the node signs when it accepts a ticket.
pub fn accept_message(sid: &str, ticket_sha256: &[u8], node_public: &[u8]) -> Vec<u8> {
    framed(&[b"accept", sid.as_bytes(), ticket_sha256, node_public])
}

/// Which end of the tunnel this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Node,
}

/// An ephemeral X25519 key: used for one tunnel, then gone.
#[derive(Debug)]
pub struct Ephemeral {
    private: EphemeralPrivateKey,
    public: [u8; 32],
}

impl Ephemeral {
    pub fn new() -> Result<Ephemeral, TunnelError> {
        let private = EphemeralPrivateKey::generate(&X25519, &SystemRandom::new())
            .map_err(|_| TunnelError::Rng)?;
        let public = private
            .compute_public_key()
            .map_err(|_| TunnelError::Rng)?
            .as_ref()
            .try_into()
            .map_err(|_| TunnelError::Rng)?;
        Ok(Ephemeral { private, public })
    }

    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    /// The tunnel's two directions, agreed with the peer's public key.
    pub fn agree(
        self,
        side: Side,
        peer_public: &[u8],
        sid: &str,
        ticket_sha256: &[u8],
    ) -> Result<(Sealer, Opener), TunnelError> {
        let (client, node) = match side {
            Side::Client => (&self.public[..], peer_public),
            Side::Node => (peer_public, &self.public[..]),
        };
        let transcript = digest(&[&framed(&[
            b"keys",
            sid.as_bytes(),
            ticket_sha256,
            client,
            node,
        ])]);
        let peer = UnparsedPublicKey::new(&X25519, peer_public);
        let (to_node, to_client) = agree_ephemeral(self.private, &peer, |shared| {
            let prk = Salt::new(HKDF_SHA256, &transcript).extract(shared);
            let key = |info: &[u8]| -> Option<LessSafeKey> {
                let mut bytes = [0u8; 32];
                prk.expand(&[info], &CHACHA20_POLY1305)
                    .ok()?
                    .fill(&mut bytes)
                    .ok()?;
                Some(LessSafeKey::new(
                    UnboundKey::new(&CHACHA20_POLY1305, &bytes).ok()?,
                ))
            };
            (key(b"client to node"), key(b"node to client"))
        })
        .map_err(|_| TunnelError::BadKey)?;
        let (Some(to_node), Some(to_client)) = (to_node, to_client) else {
            return Err(TunnelError::BadKey);
        };
        let (send, recv) = match side {
            Side::Client => (to_node, to_client),
            Side::Node => (to_client, to_node),
        };
        Ok((
            Sealer(Direction { key: send, seq: 0 }),
            Opener(Direction { key: recv, seq: 0 }),
        ))
    }
}

struct Direction {
    key: LessSafeKey,
    seq: u64,
}

impl std::fmt::Debug for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direction")
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Direction {
    fn nonce(&mut self) -> Result<Nonce, TunnelError> {
        let seq = self.seq;
        self.seq = seq.checked_add(1).ok_or(TunnelError::Exhausted)?;
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&seq.to_be_bytes());
        Ok(Nonce::assume_unique_for_key(n))
    }
}

/// Seals the records one end sends.
#[derive(Debug)]
pub struct Sealer(Direction);

impl Sealer {
    pub fn seal(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, TunnelError> {
        if plaintext.len() > MAX_RECORD {
            return Err(TunnelError::TooLarge(plaintext.len()));
        }
        let nonce = self.0.nonce()?;
        let mut out = plaintext.to_vec();
        self.0
            .key
            .seal_in_place_append_tag(nonce, Aad::empty(), &mut out)
            .map_err(|_| TunnelError::Record)?;
        Ok(out)
    }
}

/// Opens the records one end receives, in order.
#[derive(Debug)]
pub struct Opener(Direction);

impl Opener {
    pub fn open(&mut self, record: &[u8]) -> Result<Vec<u8>, TunnelError> {
        if record.len() > MAX_RECORD + TAG_LEN {
            return Err(TunnelError::TooLarge(record.len()));
        }
        let nonce = self.0.nonce()?;
        let mut buf = record.to_vec();
        let len = self
            .0
            .key
            .open_in_place(nonce, Aad::empty(), &mut buf)
            .map_err(|_| TunnelError::Record)?
            .len();
        buf.truncate(len);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pair() -> ((Sealer, Opener), (Sealer, Opener)) {
        let (c, n) = (Ephemeral::new().unwrap(), Ephemeral::new().unwrap());
        let (cp, np) = (c.public(), n.public());
        let t = ticket_sha256("a.b.c");
        (
            c.agree(Side::Client, &np, "tn-1", &t).unwrap(),
            n.agree(Side::Node, &cp, "tn-1", &t).unwrap(),
        )
    }

    #[test]
    fn records_open_in_order_each_way_and_nowhere_else() {
        let ((mut cs, mut co), (mut ns, mut no)) = pair();
        let a = cs.seal(b"ls\n").unwrap();
        let b = cs.seal(b"exit\n").unwrap();
        assert_eq!(no.open(&a).unwrap(), b"ls\n");
        assert_eq!(no.open(&b).unwrap(), b"exit\n");
        let r = ns.seal(b"out").unwrap();
        assert_eq!(co.open(&r).unwrap(), b"out");
        // Repeated, reflected or from another tunnel: nothing opens.
        let ((mut cs2, _), (_, mut no2)) = pair();
        let x = cs.seal(b"x").unwrap();
        assert_eq!(no.open(&a), Err(TunnelError::Record));
        assert_eq!(co.open(&x), Err(TunnelError::Record));
        assert_eq!(no2.open(&x), Err(TunnelError::Record));
        let _ = cs2.seal(b"y").unwrap();
    }

    #[test]
    fn keys_bind_the_tunnel_and_the_ticket() {
        for (sid, ticket) in [("tn-2", "a.b.c"), ("tn-1", "a.b.d")] {
            let (c, n) = (Ephemeral::new().unwrap(), Ephemeral::new().unwrap());
            let (cp, np) = (c.public(), n.public());
            let (mut cs, _) = c
                .agree(Side::Client, &np, "tn-1", &ticket_sha256("a.b.c"))
                .unwrap();
            let (_, mut no) = n
                .agree(Side::Node, &cp, sid, &ticket_sha256(ticket))
                .unwrap();
            assert_eq!(no.open(&cs.seal(b"hi").unwrap()), Err(TunnelError::Record));
        }
    }

    #[test]
    fn a_low_order_or_short_peer_key_is_refused() {
        for bad in [&[0u8; 32][..], &[1u8; 5][..]] {
            let e = Ephemeral::new().unwrap();
            assert_eq!(
                e.agree(Side::Node, bad, "tn", &[0; 32]).err(),
                Some(TunnelError::BadKey)
            );
        }
    }

    #[test]
    fn the_accept_message_frames_each_field() {
        assert_ne!(
            accept_message("ab", b"c", b"d"),
            accept_message("a", b"bc", b"d")
        );
    }

    proptest! {
        /// A relay that changes any bit of a record, or sends bytes of its
        /// own, gets nothing opened.
        #[test]
        fn no_changed_or_made_up_record_opens(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            junk in proptest::collection::vec(any::<u8>(), 0..300),
            bit in 0usize..4096,
        ) {
            let ((mut cs, _), (_, mut no)) = pair();
            let mut r = cs.seal(&data).unwrap();
            let i = bit % (r.len() * 8);
            r[i / 8] ^= 1 << (i % 8);
            prop_assert_eq!(no.open(&r), Err(TunnelError::Record));
            let ((_, _), (_, mut no)) = pair();
            prop_assert!(no.open(&junk).is_err());
        }
    }
}
