//! The node's signed Hello facts ([`v1::HelloProof`]): what it signs, how
//! a reader decodes and checks one, and how the node counts them.
//!
//! A node counts its Hellos per certificate and signs each count once
//! (persisted before the proof is signed). A single machine's proofs, put
//! in count order, visit each boot once and never come back to one; a
//! gateway can hold proofs back, replay them in any order and stamp them
//! with any time, and still cannot make them do otherwise. Two machines
//! with one key do: that is the only clone signal the key holder reads.

use prost::Message;

use crate::v1;

/// What [`v1::HelloProof::domain`] says, and what the signed bytes begin
/// with ([`signed_message`]).
pub const DOMAIN: &str = "better-compute hello proof v1";

/// The bytes a node signs for a proof's `payload`: [`DOMAIN`], a zero
/// byte, the payload. Every other fact a node signs is signed as its bare
/// payload, so no signature over a proof verifies for one of those, nor
/// theirs for a proof.
pub fn signed_message(payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + 1 + payload.len());
    m.extend_from_slice(DOMAIN.as_bytes());
    m.push(0);
    m.extend_from_slice(payload);
    m
}

/// How far a Welcome's `hello_seq_seen` may raise the node's count at once.
pub const MAX_RAISE: u64 = 1 << 32;

/// Why a proof is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the proof does not decode")]
    Malformed,
    #[error("the payload is not a Hello proof (domain {0:?})")]
    Domain(String),
    #[error("the proof names {what} {signed:?} and the Hello {said:?}")]
    Differs {
        what: &'static str,
        signed: String,
        said: String,
    },
}

/// What the node's identity said at its last start, and its replay floor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Before {
    pub boot_id: String,
    pub journal_id: String,
    pub command_floor: u64,
}

/// The proof of `hello` (its own facts, count `seq`, what came `before`),
/// unsigned.
pub fn proof_after(hello: &v1::Hello, seq: u64, before: Before) -> v1::HelloProof {
    v1::HelloProof {
        previous_boot_id: before.boot_id,
        previous_journal_id: before.journal_id,
        command_floor: before.command_floor,
        ..proof(hello, seq)
    }
}

/// Why a command ended by a Hello (`rebooted`, `journal-lost`) is
/// believed, or why not: `proof` must show the node took the command
/// (`seq` at or below its floor) and has since come back from another
/// boot (`reboot`) or with another journal.
pub fn proves_ending(proof: &v1::HelloProof, seq: u64, reboot: bool) -> Result<(), String> {
    if proof.command_floor < seq {
        return Err(format!(
            "the node's signed Hello (count {}) says it started no command above sequence {}, \
             and this one is {seq}",
            proof.seq, proof.command_floor
        ));
    }
    let (what, was, is) = if reboot {
        ("boot", &proof.previous_boot_id, &proof.boot_id)
    } else {
        ("journal", &proof.previous_journal_id, &proof.journal_id)
    };
    if was.is_empty() || was == is {
        return Err(format!(
            "the node's signed Hello (count {}) shows no new {what} since its last start",
            proof.seq
        ));
    }
    Ok(())
}

/// The proof of `hello` (its own facts, count `seq`), unsigned.
pub fn proof(hello: &v1::Hello, seq: u64) -> v1::HelloProof {
    v1::HelloProof {
        domain: DOMAIN.to_string(),
        node_id: hello.node_id.clone(),
        cert_serial: hello.cert_serial.clone(),
        incarnation_id: hello.incarnation_id.clone(),
        boot_id: hello.boot_id.clone(),
        journal_id: hello.journal_id.clone(),
        seq,
        server_time_mark_ms: hello.server_time_mark_ms,
        ..Default::default()
    }
}

/// Decodes signed bytes as a Hello proof (the signature is the caller's to
/// check, against the certificate it names).
pub fn decode(payload: &[u8]) -> Result<v1::HelloProof, ProofError> {
    let p = v1::HelloProof::decode(payload).map_err(|_| ProofError::Malformed)?;
    if p.domain != DOMAIN {
        return Err(ProofError::Domain(p.domain));
    }
    Ok(p)
}

/// Whether `proof` says what `hello` says of the facts it covers.
pub fn check_matches(proof: &v1::HelloProof, hello: &v1::Hello) -> Result<(), ProofError> {
    for (what, signed, said) in [
        ("node", &proof.node_id, &hello.node_id),
        ("certificate", &proof.cert_serial, &hello.cert_serial),
        ("incarnation", &proof.incarnation_id, &hello.incarnation_id),
        ("boot", &proof.boot_id, &hello.boot_id),
        ("journal", &proof.journal_id, &hello.journal_id),
    ] {
        if signed != said {
            return Err(ProofError::Differs {
                what,
                signed: signed.clone(),
                said: said.clone(),
            });
        }
    }
    Ok(())
}

/// The node's count after a Welcome said the store holds `seen`: raised
/// to it when it is above (by at most [`MAX_RAISE`], so a gateway cannot
/// run the count out), else unchanged.
pub fn raised(own: u64, seen: u64) -> u64 {
    if seen > own && seen - own <= MAX_RAISE {
        seen
    } else {
        own
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hello() -> v1::Hello {
        v1::Hello {
            node_id: "nd-1".into(),
            cert_serial: "0a".into(),
            incarnation_id: "inc".into(),
            boot_id: "boot".into(),
            journal_id: "j".into(),
            server_time_mark_ms: 5,
            ..Default::default()
        }
    }

    #[test]
    fn a_proof_decodes_and_matches_its_hello_only() {
        let h = hello();
        let p = proof(&h, 7);
        let back = decode(&p.encode_to_vec()).unwrap();
        assert_eq!(back, p);
        check_matches(&back, &h).unwrap();
        let other = v1::Hello {
            boot_id: "other".into(),
            ..h
        };
        assert_eq!(
            check_matches(&back, &other).unwrap_err().to_string(),
            "the proof names boot \"boot\" and the Hello \"other\""
        );
    }

    #[test]
    fn no_other_signed_fact_reads_as_a_proof_nor_a_proof_as_one() {
        use ring::rand::SystemRandom;
        use ring::signature::{
            ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair,
            UnparsedPublicKey,
        };
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let verify = |m: &[u8], sig: &[u8]| {
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, key.public_key().as_ref())
                .verify(m, sig)
                .is_ok()
        };
        // A result whose fields line up with a proof's (a command id that
        // reads as the domain) decodes as one, but the node's signature
        // over it is no signature over a proof.
        let result = v1::CommandResult {
            node_id: "nd-1".into(),
            command_id: DOMAIN.into(),
            ..Default::default()
        }
        .encode_to_vec();
        assert!(decode(&result).is_ok());
        let sig = key.sign(&rng, &result).unwrap();
        assert!(verify(&result, sig.as_ref()));
        assert!(!verify(&signed_message(&result), sig.as_ref()));
        // And a proof's signature verifies over no bare payload.
        let p = proof(&hello(), 1).encode_to_vec();
        let sig = key.sign(&rng, &signed_message(&p)).unwrap();
        assert!(verify(&signed_message(&p), sig.as_ref()));
        assert!(!verify(&p, sig.as_ref()));
        // Where the other facts name their node, a proof names none: as
        // any of them it is about no node (or does not decode).
        let p = proof(&hello(), 1).encode_to_vec();
        let p = p.as_slice();
        let named = [
            v1::Inventory::decode(p).map(|f| f.node_id),
            v1::StateReport::decode(p).map(|f| f.node_id),
            v1::BindingPayload::decode(p).map(|f| f.node_id),
            v1::CommandResult::decode(p).map(|f| f.node_id),
        ];
        for n in named {
            assert!(
                n.as_deref().is_ok_and(|n| n != "nd-1") || n.is_err(),
                "{n:?}"
            );
        }
    }

    #[test]
    fn an_ending_holds_only_for_a_command_the_node_took_and_a_change_since() {
        let before = Before {
            boot_id: "boot-0".into(),
            journal_id: "j-0".into(),
            command_floor: 7,
        };
        let p = proof_after(&hello(), 3, before.clone());
        assert_eq!(proves_ending(&p, 7, true), Ok(()));
        assert_eq!(proves_ending(&p, 5, false), Ok(()));
        // Never started: above the floor.
        assert!(
            proves_ending(&p, 8, true)
                .unwrap_err()
                .contains("above sequence 7")
        );
        // No change, or nothing known before (a new identity).
        for b in [
            Before {
                boot_id: "boot".into(),
                journal_id: "j".into(),
                ..before
            },
            Before {
                command_floor: 7,
                ..Before::default()
            },
        ] {
            let p = proof_after(&hello(), 3, b);
            assert!(
                proves_ending(&p, 7, true)
                    .unwrap_err()
                    .contains("no new boot")
            );
            assert!(
                proves_ending(&p, 7, false)
                    .unwrap_err()
                    .contains("no new journal")
            );
        }
    }

    #[test]
    fn a_welcome_raises_the_count_never_lowers_it_nor_runs_it_out() {
        assert_eq!(raised(5, 9), 9);
        assert_eq!(raised(9, 5), 9);
        assert_eq!(raised(0, MAX_RAISE), MAX_RAISE);
        assert_eq!(raised(0, MAX_RAISE + 1), 0);
        assert_eq!(raised(u64::MAX - 1, u64::MAX), u64::MAX);
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn the_count_only_rises(own: u64, seen: u64) {
            let r = raised(own, seen);
            prop_assert!(r >= own);
            prop_assert!(r - own <= MAX_RAISE);
        }
    }
}
