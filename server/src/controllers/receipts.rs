//! Receipts for node-signed results.
//!
//! A node keeps a finished command's result until the key holder says the
//! store holds it as the node signed it: a gateway's `ResultAck` is
//! unsigned, and one that acknowledged a result it never stored would
//! otherwise make the node forget it (and a later replay of the command
//! end it as a replay, not as it ran). Every pass, the key holder judges
//! each newly stored result that carries a signature
//! ([`crate::evidence::judge`], against the certificates the fleet CA
//! issued the node) and keeps beside it a worker-signed `ResultReceipt`
//! naming the node, the command, its sequence and the SHA-256 of the
//! signed bytes (none for an ending the control plane decided and
//! believes: a Hello's proof of a reboot or a lost journal), or an empty
//! one where it gives none (a result no node signed). Likewise a node's
//! security events, which a gateway stores where it cannot delete them
//! ([`tick_events`]), and the results a node signed for commands the store
//! does not know (restored from a set taken before them:
//! [`tick_unknown`]). The node's gateway hands receipts on for the results
//! it stored in the session (`gateway::session`), and the
//! node settles the result only on one that verifies and names what it
//! signed (`bcd_agent` node `results`).

use std::collections::HashMap;
use std::sync::Arc;

use bc_store::{NodeId, Store, TxError};
use bcd_proto::v1::{EventReceipt, ResultReceipt};
use tracing::{debug, warn};

use crate::evidence::{Evidence, judge};

/// Results judged in one pass at most.
const BATCH: u32 = 500;

/// One pass over nodes' security events: each newly stored one gets a
/// receipt naming it and its body's SHA-256 (the node compares them with
/// what it journaled, so a row a gateway planted under the event's id
/// settles nothing). Returns how many.
pub async fn tick_events(
    store: &Store,
    key: &Arc<ring::signature::Ed25519KeyPair>,
) -> Result<usize, TxError> {
    let events = store.security_events_unreceipted(BATCH).await?;
    for e in &events {
        let receipt = bcd_proto::receipts::seal_event(
            key,
            EventReceipt {
                purpose: String::new(),
                node_id: e.node_id.to_string(),
                journal_id: e.journal_id.clone(),
                event_id: e.event_id,
                kind: e.kind.clone(),
                body_sha256: bcd_proto::fingerprint(&e.body),
            },
        );
        store.put_event_receipt(e, &receipt).await?;
    }
    Ok(events.len())
}

/// One pass; returns how many results it judged.
pub async fn tick(
    store: &Store,
    key: &Arc<ring::signature::Ed25519KeyPair>,
    ca_der: &[u8],
) -> Result<usize, TxError> {
    let ids = store.results_unreceipted(BATCH).await?;
    let mut certs: HashMap<NodeId, Vec<Vec<u8>>> = HashMap::new();
    for id in &ids {
        let Some(row) = store.get_command(id).await? else {
            continue;
        };
        if !certs.contains_key(&row.node_id) {
            let held = store.node_certificates(&row.node_id).await?;
            certs.insert(row.node_id.clone(), held);
        }
        let evidence = judge(&row, &certs[&row.node_id], ca_der);
        // The node's own signed bytes, named by their SHA-256; an ending
        // the control plane decided and believes (a Hello's proof of a
        // reboot or a lost journal) with none: either way the store holds
        // the command's final ending, and the node may forget its result.
        let sha = match (&evidence, &row.signed_result) {
            (Evidence::NodeSigned, Some(signed)) => Some(bcd_proto::fingerprint(&signed.payload)),
            (Evidence::Decided(_) | Evidence::Legacy, _) => Some(String::new()),
            (Evidence::Forged(why), _) => {
                warn!(cmd = %row.id, node = %row.node_id, %why, "a result in the store was not signed by its node: no receipt");
                None
            }
            _ => None,
        };
        let receipt = sha.map_or_else(Vec::new, |result_sha256| {
            bcd_proto::receipts::seal(
                key,
                ResultReceipt {
                    purpose: String::new(),
                    node_id: row.node_id.to_string(),
                    command_id: row.id.to_string(),
                    seq: row.seq,
                    result_sha256,
                },
            )
        });
        store.put_result_receipt(id, &receipt).await?;
    }
    if !ids.is_empty() {
        debug!(judged = ids.len(), "results judged for receipts");
    }
    Ok(ids.len())
}

/// One pass over results nodes signed for commands the store does not
/// know (`bc_store::commands::UnknownResult`): each that its node signed
/// under a certificate the fleet CA issued it, for a command still unknown,
/// gets a receipt naming the node, the command, its sequence and the
/// signed bytes' SHA-256, so the node forgets it; any other gets an empty
/// one (judged, no receipt). Returns how many.
pub async fn tick_unknown(
    store: &Store,
    key: &Arc<ring::signature::Ed25519KeyPair>,
    ca_der: &[u8],
) -> Result<usize, TxError> {
    let results = store.unknown_results_unreceipted(BATCH).await?;
    let mut certs: HashMap<NodeId, Vec<Vec<u8>>> = HashMap::new();
    for r in &results {
        if !certs.contains_key(&r.node_id) {
            let held = store.node_certificates(&r.node_id).await?;
            certs.insert(r.node_id.clone(), held);
        }
        let receipt = match judge_unknown(r, &certs[&r.node_id], ca_der) {
            Ok(seq) if store.get_command(&r.command_id).await?.is_none() => {
                bcd_proto::receipts::seal(
                    key,
                    ResultReceipt {
                        purpose: String::new(),
                        node_id: r.node_id.to_string(),
                        command_id: r.command_id.to_string(),
                        seq,
                        result_sha256: bcd_proto::fingerprint(&r.payload),
                    },
                )
            }
            Ok(_) => {
                debug!(cmd = %r.command_id, "a result kept as unknown names a command the store knows now");
                Vec::new()
            }
            Err(why) => {
                warn!(cmd = %r.command_id, node = %r.node_id, %why, "an unknown result its node did not sign: no receipt");
                Vec::new()
            }
        };
        store.put_unknown_result_receipt(r, &receipt).await?;
    }
    Ok(results.len())
}

/// The sequence of an unknown result its node signed under a certificate
/// the fleet CA issued it, naming it and the command; or why not.
fn judge_unknown(
    r: &bc_store::commands::UnknownResult,
    certs: &[Vec<u8>],
    ca_der: &[u8],
) -> Result<u64, String> {
    let signed = certs.iter().any(|der| {
        crate::certs::issued_by(der, ca_der)
            && crate::certs::named(der, "urn:bc:node:").is_some_and(|(node, _)| node == r.node_id)
            && crate::certs::verify_node_signature(der, &r.payload, &r.signature)
    });
    if !signed {
        return Err(format!(
            "its signature verifies under no certificate the fleet CA issued node {}",
            r.node_id
        ));
    }
    let result = <bcd_proto::v1::CommandResult as prost::Message>::decode(r.payload.as_slice())
        .map_err(|_| "the signed result does not decode".to_string())?;
    if result.node_id != r.node_id || result.command_id != r.command_id {
        return Err(format!(
            "node {} signed a result of node {} for command {}",
            r.node_id, result.node_id, result.command_id
        ));
    }
    Ok(result.seq)
}
