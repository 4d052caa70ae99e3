//! The key holder's receipts, in worker-signed envelopes: for a node's
//! signed command result (`ResultReceipt`: the store holds the result
//! exactly as the node signed it) and for one of its security events
//! (`EventReceipt`: the store keeps it where a gateway cannot delete it).
//! A node forgets either only on a receipt; a gateway's unsigned
//! `ResultAck` or `EventAck` only stops it resending within the session.

use ring::signature::Ed25519KeyPair;

use crate::sign::{PurposeError, Purposed, VerifyError};
use crate::v1::{EventReceipt, ResultReceipt};

/// What `ResultReceipt.purpose` always says.
pub const PURPOSE: &str = <ResultReceipt as Purposed>::PURPOSE;

/// What `EventReceipt.purpose` always says.
pub const EVENT_PURPOSE: &str = <EventReceipt as Purposed>::PURPOSE;

/// Why a receipt a gateway handed was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error(transparent)]
    Envelope(#[from] VerifyError),
    #[error("the signed payload is not a result receipt")]
    NotAReceipt,
}

impl From<PurposeError> for ReceiptError {
    fn from(e: PurposeError) -> ReceiptError {
        match e {
            PurposeError::Envelope(v) => ReceiptError::Envelope(v),
            PurposeError::Other => ReceiptError::NotAReceipt,
        }
    }
}

/// Signs `receipt` (its purpose set here) with a worker key.
pub fn seal(key: &Ed25519KeyPair, receipt: ResultReceipt) -> Vec<u8> {
    crate::sign::seal_as(key, receipt)
}

/// Opens a receipt: it verifies against the worker `keys`, decodes and
/// says it is a receipt. Whose and for what is the caller's to check.
pub fn open(envelope: &[u8], keys: &[Vec<u8>]) -> Result<ResultReceipt, ReceiptError> {
    Ok(crate::sign::open_as(envelope, keys)?)
}

/// Signs an event `receipt` (its purpose set here) with a worker key.
pub fn seal_event(key: &Ed25519KeyPair, receipt: EventReceipt) -> Vec<u8> {
    crate::sign::seal_as(key, receipt)
}

/// Opens an event receipt, as [`open`] a result's.
pub fn open_event(envelope: &[u8], keys: &[Vec<u8>]) -> Result<EventReceipt, ReceiptError> {
    Ok(crate::sign::open_as(envelope, keys)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;
    use ring::signature::KeyPair;

    fn key(seed: u8) -> Ed25519KeyPair {
        Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
    }

    fn receipt() -> ResultReceipt {
        ResultReceipt {
            purpose: String::new(),
            node_id: "nd-1".into(),
            command_id: "cmd-1".into(),
            seq: 7,
            result_sha256: "ab".repeat(32),
        }
    }

    #[test]
    fn a_receipt_opens_only_signed_by_a_worker_key_and_as_a_receipt() {
        let k = key(1);
        let keys = vec![k.public_key().as_ref().to_vec()];
        let r = open(&seal(&k, receipt()), &keys).unwrap();
        assert_eq!((r.node_id.as_str(), r.seq), ("nd-1", 7));
        assert!(matches!(
            open(&seal(&key(2), receipt()), &keys),
            Err(ReceiptError::Envelope(VerifyError::UnknownKey(_)))
        ));
        // A gateway revocation list, signed by the same key, is no receipt.
        let list = crate::gateways::seal(&k, Default::default());
        assert_eq!(open(&list, &keys), Err(ReceiptError::NotAReceipt));
        let bare = crate::sign::seal(&k, receipt().encode_to_vec());
        assert_eq!(open(&bare, &keys), Err(ReceiptError::NotAReceipt));
        // A result's receipt is no event's, and the other way round.
        let event = seal_event(&k, event_receipt());
        assert_eq!(open_event(&event, &keys).unwrap().event_id, 9);
        assert_eq!(open(&event, &keys), Err(ReceiptError::NotAReceipt));
        assert_eq!(
            open_event(&seal(&k, receipt()), &keys),
            Err(ReceiptError::NotAReceipt)
        );
        assert!(open_event(&seal_event(&key(2), event_receipt()), &keys).is_err());
    }

    fn event_receipt() -> EventReceipt {
        EventReceipt {
            purpose: String::new(),
            node_id: "nd-1".into(),
            journal_id: "j-1".into(),
            event_id: 9,
            kind: "security.spec.refused".into(),
            body_sha256: "cd".repeat(32),
        }
    }

    proptest! {
        /// Receipts come through gateways: any bytes fail cleanly, and any
        /// flipped bit of a signed receipt is caught.
        #[test]
        fn arbitrary_bytes_and_flipped_bits_never_open(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
            bit in any::<usize>(),
        ) {
            let k = key(1);
            let keys = vec![k.public_key().as_ref().to_vec()];
            prop_assert!(open(&bytes, &keys).is_err());
            prop_assert!(open_event(&bytes, &keys).is_err());
            let mut event = seal_event(&k, event_receipt());
            let j = bit % (event.len() * 8);
            event[j / 8] ^= 1 << (j % 8);
            prop_assert!(open_event(&event, &keys).is_err());
            let mut sealed = seal(&k, receipt());
            let i = bit % (sealed.len() * 8);
            sealed[i / 8] ^= 1 << (i % 8);
            prop_assert!(open(&sealed, &keys).is_err());
        }
    }
}
