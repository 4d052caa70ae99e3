//! What the worker key signs: commands and NodeSpecs.
//!
//! The store decides a command's id, sequence and deadline, and a spec's
//! generation, inside the transaction that stores it; the sealers here turn
//! those decisions into the signed bytes it keeps ([`command_sealer`],
//! [`spec_sealer`]). Nodes verify the signature and the payload; the gateway
//! relays the stored bytes verbatim and can forge nothing.

use std::sync::Arc;

use bc_store::commands::{CommandRow, CommandSeal, NewCommand, SealCommand};
use bc_store::specs::{Access, AccessUser, Assignment, Firewall, FirewallRule, SealSpec, SpecBody};
use bc_store::{Store, TxError};
use bcd_proto::v1::{self, CommandPayload, DevicesSpec, GpuAssignment, NodeSpec, command_payload};
use prost::Message;
use ring::signature::Ed25519KeyPair;

pub fn assignment(a: &Assignment) -> GpuAssignment {
    GpuAssignment {
        allocation_id: a.allocation_id.clone(),
        gpus: a.gpus.clone(),
        env: a.env.clone().into_iter().collect(),
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
                    protocol: r.protocol.clone(),
                    port: r.port,
                    source: r.source.clone(),
                    action: r.action.clone(),
                })
                .collect(),
        }),
    }
}

/// The store's form of an access section an operator sent.
pub fn access_from_wire(a: v1::AccessSpec) -> Access {
    Access {
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
        firewall: a.firewall.map(|f| Firewall {
            rules: f
                .rules
                .into_iter()
                .map(|r| FirewallRule {
                    protocol: r.protocol,
                    port: r.port,
                    source: r.source,
                    action: r.action,
                })
                .collect(),
        }),
    }
}

/// The spec a worker signs for `node` at `generation`.
pub fn spec_payload(node: &str, generation: u64, issued_at_ms: i64, body: &SpecBody) -> NodeSpec {
    NodeSpec {
        node_id: node.to_string(),
        generation,
        issued_at_ms,
        devices: Some(DevicesSpec {
            assignments: body.assignments.iter().map(assignment).collect(),
        }),
        access: Some(access(&body.access)),
    }
}

/// Seals `node`'s next spec with `key`.
pub fn spec_sealer(key: Arc<Ed25519KeyPair>, node: &str) -> SealSpec {
    let node = node.to_string();
    Box::new(move |generation, now, body| {
        bcd_proto::sign::seal(
            &key,
            spec_payload(&node, generation, now, body).encode_to_vec(),
        )
    })
}

/// The payload a worker signs for a command.
pub fn command_payload(c: &CommandSeal, args: command_payload::Args) -> CommandPayload {
    CommandPayload {
        command_id: c.id.clone(),
        node_id: c.node_id.clone(),
        seq: c.seq,
        kind: c.kind.name().to_string(),
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
                p.kind.as_str(),
                p.issued_at_ms,
                p.not_after_ms,
                p.min_generation
            ),
            ("exec.run", 10, 20, 2)
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
        assert_eq!(access_from_wire(access(&a)), a);
    }
}
