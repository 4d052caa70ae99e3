//! What the worker key signs: commands, NodeSpecs, and statements about a
//! node (its deletion).
//!
//! The store decides a command's id, sequence and deadline, a spec's
//! generation and expiry, and which certificates a deletion revokes,
//! inside the transaction that stores it; the sealers here turn those
//! decisions into the signed bytes it keeps ([`command_sealer`],
//! [`spec_sealer`], [`statement_sealer`]). Nodes verify the signature and
//! the payload; the gateway relays the stored bytes verbatim and can forge
//! nothing.

use std::sync::Arc;

use bc_store::commands::{CommandRow, CommandSeal, NewCommand, SealCommand};
use bc_store::nodes::{SealStatement, StatementKind, StatementSeal};
use bc_store::specs::{
    Access, AccessUser, Assignment, Cordon, Firewall, FirewallRule, Intent, OpenSpec, OpenedSpec,
    SealSpec, SpecBody, SpecSeal,
};
use bc_store::{NodeId, Store, TxError};
use bcd_proto::typed::{Spelling, parse};
use bcd_proto::v1::{self, CommandPayload, DevicesSpec, GpuAssignment, NodeSpec, command_payload};
use prost::Message;
use ring::signature::Ed25519KeyPair;

pub fn assignment(a: &Assignment) -> GpuAssignment {
    GpuAssignment {
        allocation_id: a.allocation_id.clone(),
        gpus: a.gpus.clone(),
        env: a.env.clone().into_iter().collect(),
        secrets: a
            .secrets
            .iter()
            .map(|r| v1::SecretRef {
                name: r.name.clone(),
                version: r.version,
                file: r.file.clone(),
            })
            .collect(),
    }
}

pub fn access(a: &Access) -> v1::AccessSpec {
    v1::AccessSpec {
        users: a
            .users
            .iter()
            .map(|u| v1::AccessUser {
                name: u.name.clone(),
                authorized_keys: u.authorized_keys.clone(),
                principals: u.principals.clone(),
            })
            .collect(),
        trusted_user_ca_keys: a.trusted_user_ca_keys.clone(),
        firewall: a.firewall.as_ref().map(|f| v1::FirewallSpec {
            rules: f
                .rules
                .iter()
                .map(|r| v1::FirewallRule {
                    protocol: parse::<v1::FirewallProtocol>(&r.protocol)
                        .unwrap_or(v1::FirewallProtocol::Unspecified)
                        as i32,
                    port: r.port,
                    source: r.source.clone(),
                    action: parse::<v1::FirewallAction>(&r.action)
                        .unwrap_or(v1::FirewallAction::Unspecified)
                        as i32,
                })
                .collect(),
        }),
    }
}

/// The store's form of an access section an operator sent; a firewall
/// rule without a protocol or an action it knows is refused.
pub fn access_from_wire(a: v1::AccessSpec) -> Result<Access, String> {
    let named = |r: &v1::FirewallRule| -> Result<(&'static str, &'static str), String> {
        let p = match v1::FirewallProtocol::try_from(r.protocol) {
            Ok(p @ (v1::FirewallProtocol::Tcp | v1::FirewallProtocol::Udp)) => p.spelling(),
            Ok(v1::FirewallProtocol::Unspecified) | Err(_) => {
                return Err(format!(
                    "firewall rule for port {}: the protocol must be tcp or udp",
                    r.port
                ));
            }
        };
        let a = match v1::FirewallAction::try_from(r.action) {
            Ok(a @ (v1::FirewallAction::Accept | v1::FirewallAction::Drop)) => a.spelling(),
            Ok(v1::FirewallAction::Unspecified) | Err(_) => {
                return Err(format!(
                    "firewall rule for port {}: the action must be accept or drop",
                    r.port
                ));
            }
        };
        Ok((p, a))
    };
    let firewall = match a.firewall {
        None => None,
        Some(f) => Some(Firewall {
            rules: f
                .rules
                .into_iter()
                .map(|r| {
                    let (protocol, action) = named(&r)?;
                    Ok(FirewallRule {
                        protocol: protocol.to_string(),
                        port: r.port,
                        source: r.source,
                        action: action.to_string(),
                    })
                })
                .collect::<Result<_, String>>()?,
        }),
    };
    Ok(Access {
        users: a
            .users
            .into_iter()
            .map(|u| AccessUser {
                name: u.name,
                authorized_keys: u.authorized_keys,
                principals: u.principals,
            })
            .collect(),
        trusted_user_ca_keys: a.trusted_user_ca_keys,
        firewall,
    })
}

/// The spec a worker signs for `node`, as the store decided it, with the
/// key holder's exec ticket keys (a JWKS).
pub fn spec_payload(node: &str, seal: &SpecSeal, body: &SpecBody, ticket_jwks: &str) -> NodeSpec {
    NodeSpec {
        ticket_jwks: ticket_jwks.to_string(),
        node_id: node.to_string(),
        generation: seal.generation,
        issued_at_ms: seal.issued_at_ms,
        not_after_ms: seal.not_after_ms,
        devices: Some(DevicesSpec {
            assignments: body.assignments.iter().map(assignment).collect(),
        }),
        access: Some(access(&body.access)),
        intent: intent(&body.intent),
    }
}

/// The wire form of a node's intent; none when it says nothing, so a spec
/// without labels or a cordon encodes as it did before intents existed.
pub fn intent(i: &Intent) -> Option<v1::NodeIntent> {
    if i.labels.is_empty() && i.cordon.is_none() {
        return None;
    }
    Some(v1::NodeIntent {
        labels: i.labels.clone(),
        cordoned: i.cordon.is_some(),
        cordon_reason: i
            .cordon
            .as_ref()
            .map(|c| c.reason.clone())
            .unwrap_or_default(),
        cordoned_at_ms: i.cordon.as_ref().map(|c| c.since_ms).unwrap_or_default(),
    })
}

/// A node's intent as its signed spec states it.
pub fn intent_from_wire(i: Option<v1::NodeIntent>) -> Intent {
    let i = i.unwrap_or_default();
    Intent {
        labels: i.labels,
        cordon: i.cordoned.then_some(Cordon {
            reason: i.cordon_reason,
            since_ms: i.cordoned_at_ms,
        }),
    }
}

/// Seals `node`'s next spec with `key`, naming the ticket keys of
/// `tickets`.
pub fn spec_sealer(
    key: Arc<Ed25519KeyPair>,
    tickets: Arc<super::tickets::TicketKey>,
    node: &str,
) -> SealSpec {
    let node = node.to_string();
    Box::new(move |seal, body| {
        bcd_proto::sign::seal(
            &key,
            spec_payload(&node, seal, body, &tickets.jwks()).encode_to_vec(),
        )
    })
}

/// Opens `node`'s stored spec as the node would: signed by one of
/// `worker_keys` (raw ed25519 public keys), naming `node`, decoding to a
/// body the store can hold. What the spec controller and an operator's
/// edit start from, so a rewritten column or a planted envelope signs
/// nothing.
pub fn spec_opener(worker_keys: Vec<Vec<u8>>, node: &str) -> OpenSpec {
    let node = node.to_string();
    Box::new(move |signed| {
        let payload = bcd_proto::sign::open(signed, &worker_keys).map_err(|e| e.to_string())?;
        let spec = NodeSpec::decode(payload.as_slice())
            .map_err(|_| "the signed payload is not a NodeSpec".to_string())?;
        if spec.node_id != node {
            return Err(format!(
                "it is node {}'s spec, signed for that node",
                spec.node_id
            ));
        }
        let assignments = spec
            .devices
            .unwrap_or_default()
            .assignments
            .into_iter()
            .map(|a| Assignment {
                allocation_id: a.allocation_id,
                gpus: a.gpus,
                env: a.env.into_iter().collect(),
                secrets: a
                    .secrets
                    .into_iter()
                    .map(|r| bc_store::specs::SecretRef {
                        name: r.name,
                        version: r.version,
                        file: r.file,
                    })
                    .collect(),
            })
            .collect();
        let access = access_from_wire(spec.access.unwrap_or_default())?;
        Ok(OpenedSpec {
            generation: spec.generation,
            body: SpecBody {
                assignments,
                access,
                intent: intent_from_wire(spec.intent),
            },
        })
    })
}

/// [`spec_opener`] for the specs `key` signs: what this key holder's own
/// changes start from.
pub fn own_spec_opener(key: &Ed25519KeyPair, node: &str) -> OpenSpec {
    use ring::signature::KeyPair;
    spec_opener(vec![key.public_key().as_ref().to_vec()], node)
}

/// Every live node's intent as its signed spec states it, or why that spec
/// does not open (a node whose spec was never signed has none: no labels,
/// not cordoned). What label selectors and cordons are read from: never a
/// column.
pub async fn intents(
    store: &Store,
    key: &Ed25519KeyPair,
) -> Result<std::collections::HashMap<NodeId, Result<Intent, String>>, bc_store::StoreError> {
    Ok(store
        .signed_specs()
        .await?
        .into_iter()
        .map(|(node, signed)| {
            let opened = own_spec_opener(key, &node)(&signed).map(|o| o.body.intent);
            (node, opened)
        })
        .collect())
}

/// One node's intent, as [`intents`] reads it.
pub async fn node_intent(
    store: &Store,
    key: &Ed25519KeyPair,
    node: &str,
) -> Result<Result<Intent, String>, bc_store::StoreError> {
    Ok(match store.signed_spec(&NodeId::from(node)).await? {
        Some((_, signed)) => own_spec_opener(key, node)(&signed).map(|o| o.body.intent),
        None => Ok(Intent::default()),
    })
}

/// The statement a worker signs about a node.
pub fn statement(s: &StatementSeal) -> v1::NodeStatement {
    v1::NodeStatement {
        node_id: s.node_id.to_string(),
        kind: match s.kind {
            StatementKind::Deleted => v1::NodeStatementKind::Deleted,
            StatementKind::Revoked => v1::NodeStatementKind::Revoked,
        } as i32,
        serials: s.serials.clone(),
        reason: s.reason.clone(),
        issued_at_ms: s.issued_at_ms,
    }
}

/// Seals a statement about a node with `key`.
pub fn statement_sealer(key: Arc<Ed25519KeyPair>) -> SealStatement {
    Box::new(move |s| bcd_proto::sign::seal_statement(&key, &statement(s)))
}

/// The payload a worker signs for a command.
pub fn command_payload(c: &CommandSeal, args: command_payload::Args) -> CommandPayload {
    CommandPayload {
        command_id: c.id.to_string(),
        node_id: c.node_id.to_string(),
        seq: c.seq,
        kind: v1::CommandKind::from(c.kind) as i32,
        not_after_ms: c.not_after_ms,
        min_generation: c.min_generation,
        issued_at_ms: c.issued_at_ms,
        args: Some(args),
    }
}

/// Seals a command with `args` and `key`.
pub fn command_sealer(key: Arc<Ed25519KeyPair>, args: command_payload::Args) -> SealCommand {
    Box::new(move |c| bcd_proto::sign::seal(&key, command_payload(c, args).encode_to_vec()))
}

/// Creates a command sealed with the worker key, in one store transaction.
/// Returns the row and whether it is new (an idempotency key used before
/// returns the first command).
pub async fn create_command(
    store: &Store,
    key: &Arc<Ed25519KeyPair>,
    c: &NewCommand,
    args: command_payload::Args,
) -> Result<(CommandRow, bool), TxError> {
    store
        .create_command(c, command_sealer(key.clone(), args))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_core::command::Kind;

    fn key() -> Arc<Ed25519KeyPair> {
        Arc::new(Ed25519KeyPair::from_seed_unchecked(&[7; 32]).unwrap())
    }

    #[test]
    fn a_sealed_command_carries_what_the_store_decided() {
        let seal = CommandSeal {
            id: "cmd-1".into(),
            node_id: "nd-1".into(),
            seq: 4,
            kind: Kind::ExecRun,
            issued_at_ms: 10,
            not_after_ms: 20,
            min_generation: 2,
        };
        let signed = command_sealer(key(), command_payload::Args::None(v1::NoArgs {}))(&seal);
        use ring::signature::KeyPair;
        let public = key().public_key().as_ref().to_vec();
        let payload = bcd_proto::sign::open(&signed, &[public]).unwrap();
        let p = CommandPayload::decode(payload.as_slice()).unwrap();
        assert_eq!(
            (p.command_id.as_str(), p.node_id.as_str(), p.seq),
            ("cmd-1", "nd-1", 4)
        );
        assert_eq!(
            (
                bcd_proto::typed::kind(p.kind),
                p.issued_at_ms,
                p.not_after_ms,
                p.min_generation
            ),
            (Some(Kind::ExecRun), 10, 20, 2)
        );
    }

    #[test]
    fn access_survives_the_wire_both_ways() {
        let a = Access {
            users: vec![AccessUser {
                name: "ops".into(),
                authorized_keys: vec!["ssh-ed25519 AAAA".into()],
                principals: vec!["p".into()],
            }],
            trusted_user_ca_keys: vec!["ca".into()],
            firewall: Some(Firewall {
                rules: vec![FirewallRule {
                    protocol: "tcp".into(),
                    port: 22,
                    source: "10.0.0.0/8".into(),
                    action: "accept".into(),
                }],
            }),
        };
        assert_eq!(access_from_wire(access(&a)), Ok(a));
        let bad = v1::AccessSpec {
            firewall: Some(v1::FirewallSpec {
                rules: vec![v1::FirewallRule {
                    port: 22,
                    ..Default::default()
                }],
            }),
            ..Default::default()
        };
        assert!(access_from_wire(bad).unwrap_err().contains("tcp or udp"));
    }

    #[test]
    fn a_spec_opens_only_as_its_worker_signed_it_for_its_node() {
        use ring::signature::KeyPair;
        let body = SpecBody {
            assignments: vec![Assignment {
                allocation_id: "job-a".into(),
                gpus: vec!["0".into(), "1".into()],
                env: [("A".to_string(), "1".to_string())].into(),
                secrets: vec![bc_store::specs::SecretRef {
                    name: "hf".into(),
                    version: 2,
                    file: "token".into(),
                }],
            }],
            access: Access {
                users: vec![AccessUser {
                    name: "ops".into(),
                    authorized_keys: vec!["ssh-ed25519 AAAA ops".into()],
                    principals: vec![],
                }],
                ..Access::default()
            },
            intent: Intent {
                labels: [("pool", "a"), ("gpu", "h200")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
                cordon: Some(Cordon {
                    reason: "bad fan".into(),
                    since_ms: 5,
                }),
            },
        };
        let seal = SpecSeal {
            generation: 7,
            issued_at_ms: 1,
            not_after_ms: 2,
        };
        let worker = key();
        let public = vec![worker.public_key().as_ref().to_vec()];
        let tickets = Arc::new(super::super::tickets::TicketKey::new(
            Ed25519KeyPair::from_seed_unchecked(&[9; 32]).unwrap(),
        ));
        let signed = spec_sealer(worker.clone(), tickets.clone(), "nd-1")(&seal, &body);
        let payload = bcd_proto::sign::open(&signed, &public).unwrap();
        assert_eq!(
            NodeSpec::decode(payload.as_slice()).unwrap().ticket_jwks,
            tickets.jwks(),
            "the spec names the ticket keys"
        );
        let opened = spec_opener(public.clone(), "nd-1")(&signed).unwrap();
        assert_eq!(
            opened,
            OpenedSpec {
                generation: 7,
                body: body.clone()
            }
        );
        // Another node's spec, another key's, altered bytes, no envelope.
        let e = spec_opener(public.clone(), "nd-2")(&signed).unwrap_err();
        assert!(e.contains("node nd-1's spec"), "{e}");
        let other = Arc::new(Ed25519KeyPair::from_seed_unchecked(&[8; 32]).unwrap());
        let foreign = spec_sealer(other, tickets, "nd-1")(&seal, &body);
        let e = spec_opener(public.clone(), "nd-1")(&foreign).unwrap_err();
        assert!(e.contains("not signed by a worker key"), "{e}");
        let mut altered = signed.clone();
        let at = altered.len() - 70;
        altered[at] ^= 1;
        assert!(spec_opener(public.clone(), "nd-1")(&altered).is_err());
        assert!(spec_opener(public, "nd-1")(b"{}").is_err());
    }

    #[test]
    fn a_sealed_statement_opens_with_the_worker_key() {
        use ring::signature::KeyPair;
        let seal = StatementSeal {
            node_id: "nd-1".into(),
            kind: StatementKind::Deleted,
            serials: vec!["0a".into()],
            reason: "node-deleted".into(),
            issued_at_ms: 5,
        };
        let signed = statement_sealer(key())(&seal);
        let public = key().public_key().as_ref().to_vec();
        let st = bcd_proto::sign::open_statement(&signed, &[public]).unwrap();
        assert_eq!(st, statement(&seal));
        assert_eq!(st.kind, v1::NodeStatementKind::Deleted as i32);
    }
}
