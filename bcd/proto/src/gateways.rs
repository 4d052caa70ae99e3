//! The key holder's signed, short-lived list of revoked gateway
//! certificates (`GatewayRevocations` in a worker-signed envelope): every
//! gateway hands its nodes the newest it has, and a node leaves a gateway
//! the list names (see `bcd_core::gateways`).

use ring::signature::Ed25519KeyPair;

use crate::sign::{PurposeError, Purposed, VerifyError};
use crate::v1::GatewayRevocations;

/// What `GatewayRevocations.purpose` always says: no other payload a
/// worker key signs opens as a list.
pub const PURPOSE: &str = <GatewayRevocations as Purposed>::PURPOSE;

/// Why a list a gateway handed was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    #[error(transparent)]
    Envelope(#[from] VerifyError),
    #[error("the signed payload is not a gateway revocation list")]
    NotAList,
}

/// Signs `list` (its purpose set here) with a worker key.
pub fn seal(key: &Ed25519KeyPair, list: GatewayRevocations) -> Vec<u8> {
    crate::sign::seal_as(key, list)
}

/// Opens a list: it verifies against the worker `keys`, decodes and says
/// it is a list.
pub fn open(envelope: &[u8], keys: &[Vec<u8>]) -> Result<GatewayRevocations, ListError> {
    crate::sign::open_as(envelope, keys).map_err(|e| match e {
        PurposeError::Envelope(v) => ListError::Envelope(v),
        PurposeError::Other => ListError::NotAList,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{self, RevokedGatewayCert};
    use proptest::prelude::*;
    use prost::Message;
    use ring::signature::KeyPair;

    fn key(seed: u8) -> Ed25519KeyPair {
        Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
    }

    fn list() -> GatewayRevocations {
        GatewayRevocations {
            purpose: String::new(),
            issued_ms: 1_000,
            not_after_ms: 601_000,
            certs: vec![RevokedGatewayCert {
                name: "gw-a".into(),
                sha256: "ab".repeat(32),
                not_after_ms: 9_000_000,
            }],
        }
    }

    #[test]
    fn a_list_opens_only_signed_by_a_worker_key_and_as_a_list() {
        let k = key(1);
        let keys = vec![k.public_key().as_ref().to_vec()];
        let opened = open(&seal(&k, list()), &keys).unwrap();
        assert_eq!(opened.purpose, PURPOSE);
        assert_eq!((opened.issued_ms, opened.certs.len()), (1_000, 1));
        assert!(matches!(
            open(&seal(&key(2), list()), &keys),
            Err(ListError::Envelope(VerifyError::UnknownKey(_)))
        ));
        // A statement about a node, signed by the same key, is no list.
        let statement = crate::sign::seal_statement(
            &k,
            &v1::NodeStatement {
                node_id: "nd-1".into(),
                kind: v1::NodeStatementKind::Revoked as i32,
                ..Default::default()
            },
        );
        assert_eq!(open(&statement, &keys), Err(ListError::NotAList));
        // Nor is a list's payload signed without its purpose.
        let bare = crate::sign::seal(&k, list().encode_to_vec());
        assert_eq!(open(&bare, &keys), Err(ListError::NotAList));
    }

    proptest! {
        /// Lists come through gateways: any bytes fail cleanly, and any
        /// flipped bit of a signed list is caught.
        #[test]
        fn arbitrary_bytes_and_flipped_bits_never_open(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
            bit in any::<usize>(),
        ) {
            let k = key(1);
            let keys = vec![k.public_key().as_ref().to_vec()];
            prop_assert!(open(&bytes, &keys).is_err());
            let mut sealed = seal(&k, list());
            let i = bit % (sealed.len() * 8);
            sealed[i / 8] ^= 1 << (i % 8);
            prop_assert!(open(&sealed, &keys).is_err());
        }
    }
}
