//! Nodes enrolled without a certificate authority, for the store's own
//! tests and the benchmarks that drive a store directly: a one-use token
//! made and spent by a join whose "certificate" is a few plain bytes, and
//! the Hello such a node sends.

use std::time::Duration;

use crate::nodes::IssuedCert;
use crate::sessions::HelloInput;
use crate::tokens::{JoinInput, NewToken};
use crate::{NodeId, Store, TokenId, TxError};

/// What [`enroll`] records as node `i`'s certificate: `der` is
/// `cert-<i>`, the serial `s<i>`, the fingerprint `f<i>`.
pub fn cert(i: usize) -> IssuedCert {
    IssuedCert {
        der: format!("cert-{i}").into_bytes(),
        serial: format!("s{i}"),
        fingerprint: format!("f{i}"),
        not_before_ms: 0,
        not_after_ms: i64::MAX / 2,
    }
}

/// Makes a one-use token `fixture-<i>` and joins node `i` with it (its
/// certificate [`cert`]`(i)`); the new node's id.
pub async fn enroll(store: &Store, i: usize) -> Result<NodeId, TxError> {
    let token_id = TokenId::from(format!("fixture-{i}"));
    store
        .create_token(&NewToken {
            id: token_id.clone(),
            secret_sha256: "h".into(),
            ttl: Duration::from_secs(3600),
            uses: 1,
            description: String::new(),
            pool: None,
        })
        .await?;
    let issued = cert(i);
    let joined = store
        .join(
            &JoinInput {
                token_id,
                secret_sha256: "h".into(),
                hostname: format!("host-{i}"),
                ramdisk: false,
                macs: Vec::new(),
            },
            Box::new(move |_, _| Ok(issued)),
        )
        .await?;
    Ok(joined.node_id)
}

/// A Hello from node `i` that [`enroll`] made (`node_id`) through
/// `gateway`: its certificate's fingerprint and serial, boot `boot`, a
/// journal that ran nothing, no inventory, no proof.
pub fn hello(node_id: &str, i: usize, gateway: &str) -> HelloInput {
    HelloInput {
        node_id: node_id.into(),
        cert_fingerprint: format!("f{i}"),
        cert_serial: format!("s{i}"),
        gateway_id: gateway.into(),
        incarnation_id: "inc".into(),
        boot_id: "boot".into(),
        journal_id: "j".into(),
        agent_version: "0".into(),
        last_epoch: 0,
        inventory_hashes: Vec::new(),
        journal_running: Vec::new(),
        journal_done: Vec::new(),
        daemon_exits: 0,
        proof: None,
    }
}
