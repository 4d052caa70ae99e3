//! The wire, pinned: representative messages encoded and compared with the
//! bytes in `testdata/` (hex, one file per message), and the files decoded
//! back into the same messages.
//!
//! A failure here means an encoding changed. That is allowed only as the
//! proto's header says: a new field under a new number, a removed one
//! `reserved`. An existing golden file is never edited to make this pass;
//! a new message gets its file with `BCD_WRITE_GOLDEN=1` (which writes only
//! files that do not exist yet).

use std::path::PathBuf;

use bcd_proto::v1::{self, node_message, server_message};
use prost::Message;

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(format!("{name}.hex"))
}

fn check<M: Message + Default + PartialEq + std::fmt::Debug>(name: &str, m: &M) {
    let hex = hex::encode(m.encode_to_vec());
    let p = path(name);
    if std::env::var_os("BCD_WRITE_GOLDEN").is_some() && !p.exists() {
        std::fs::write(&p, format!("{hex}\n")).unwrap();
    }
    let golden = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (new messages: BCD_WRITE_GOLDEN=1)", p.display()));
    let golden = golden.trim();
    assert_eq!(
        hex, golden,
        "the encoding of {name} changed: a changed field is a new field number, the old one reserved"
    );
    let decoded = M::decode(hex::decode(golden).unwrap().as_slice()).unwrap();
    assert_eq!(&decoded, m, "{name} does not decode back to itself");
}

/// A message of an earlier encoding, from its golden file (never
/// rewritten): what a peer or a store of that release sent must still
/// decode. Fields since removed (their numbers `reserved`) read as absent.
fn earlier<M: Message + Default>(name: &str) -> M {
    let p = path(name);
    let golden = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    M::decode(hex::decode(golden.trim()).unwrap().as_slice())
        .unwrap_or_else(|e| panic!("{name} no longer decodes: {e}"))
}

fn worker_key() -> ring::signature::Ed25519KeyPair {
    // ed25519 signatures are deterministic: a fixed seed pins the envelope.
    ring::signature::Ed25519KeyPair::from_seed_unchecked(&[7; 32]).unwrap()
}

#[test]
fn session_messages() {
    let hello = v1::NodeMessage {
        msg: Some(node_message::Msg::Hello(v1::Hello {
            node_id: "nd-0f3a9c".into(),
            cert_serial: "5a17c0de".into(),
            incarnation_id: "inc-1".into(),
            boot_id: "boot-1".into(),
            journal_id: "j-1".into(),
            inventory_hashes: vec![v1::InventoryHash {
                section: v1::InventoryKind::Gpus as i32,
                sha256: "ab".repeat(32),
            }],
            agent_version: "0.1.0".into(),
            last_epoch: 7,
            release_floor: 3,
            server_time_mark_ms: 1_790_000_123_456,
            journal_running: vec!["cmd-1".into()],
            journal_done: vec!["cmd-0".into()],
            applied_generation: 4,
            // Added later: unset, they leave the earlier encoding as it was.
            daemon_exits: 0,
            proof: None,
        })),
    };
    check("hello_inventory_kind", &hello);
    // Before sections were an enum (field 1, "gpus"): the hash reads with
    // its section not given, which a gateway skips.
    let before: v1::NodeMessage = earlier("hello");
    let mut expect = hello.clone();
    if let Some(node_message::Msg::Hello(h)) = &mut expect.msg {
        h.inventory_hashes[0].section = 0;
    }
    assert_eq!(before, expect);
    check(
        "hello_daemon_exits",
        &v1::NodeMessage {
            msg: Some(node_message::Msg::Hello(v1::Hello {
                node_id: "nd-0f3a9c".into(),
                cert_serial: "5a17c0de".into(),
                incarnation_id: "inc-2".into(),
                boot_id: "boot-1".into(),
                journal_id: "j-1".into(),
                agent_version: "0.1.0".into(),
                last_epoch: 8,
                applied_generation: 4,
                daemon_exits: 3,
                ..Default::default()
            })),
        },
    );
    let proof = v1::HelloProof {
        domain: bcd_proto::hello::DOMAIN.into(),
        node_id: "nd-0f3a9c".into(),
        cert_serial: "5a17c0de".into(),
        incarnation_id: "inc-2".into(),
        boot_id: "boot-1".into(),
        journal_id: "j-1".into(),
        seq: 41,
        server_time_mark_ms: 1_790_000_100_000,
        // Added later: unset, they leave the earlier encoding as it was.
        previous_boot_id: String::new(),
        previous_journal_id: String::new(),
        command_floor: 0,
        release_confirmed: false,
    };
    check("hello_proof", &proof);
    check(
        "hello_proof_confirmed",
        &v1::HelloProof {
            previous_boot_id: "boot-0".into(),
            previous_journal_id: "j-0".into(),
            command_floor: 17,
            release_confirmed: true,
            ..proof.clone()
        },
    );
    check(
        "hello_proof_after",
        &v1::HelloProof {
            previous_boot_id: "boot-0".into(),
            previous_journal_id: "j-0".into(),
            command_floor: 17,
            ..proof.clone()
        },
    );
    check(
        "hello_proved",
        &v1::NodeMessage {
            msg: Some(node_message::Msg::Hello(v1::Hello {
                node_id: "nd-0f3a9c".into(),
                cert_serial: "5a17c0de".into(),
                incarnation_id: "inc-2".into(),
                boot_id: "boot-1".into(),
                journal_id: "j-1".into(),
                agent_version: "0.1.0".into(),
                last_epoch: 8,
                server_time_mark_ms: 1_790_000_100_000,
                proof: Some(v1::NodeSigned {
                    payload: proof.encode_to_vec(),
                    // ECDSA signatures are not deterministic: a stand-in.
                    signature: vec![0x30, 0x44],
                }),
                ..Default::default()
            })),
        },
    );
    check(
        "welcome_hello_seq",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::Welcome(v1::Welcome {
                epoch: 9,
                server_time_ms: 1_790_000_200_000,
                gateway_id: "gw-1".into(),
                heartbeat_interval_ms: 10_000,
                first_retry_ms: 2_000,
                hello_seq_seen: 41,
                ..Default::default()
            })),
        },
    );
    let welcome = v1::ServerMessage {
        msg: Some(server_message::Msg::Welcome(v1::Welcome {
            epoch: 8,
            server_time_ms: 1_790_000_200_000,
            gateway_id: "gw-1".into(),
            heartbeat_interval_ms: 10_000,
            inventory_wanted: vec![v1::InventoryKind::Tpm as i32],
            // Added later: unset, they leave the earlier encoding as it was.
            first_retry_ms: 0,
            hello_seq_seen: 0,
        })),
    };
    check("welcome_inventory_kind", &welcome);
    // Before sections were an enum (field 5, "tpm"): none is asked for.
    let before: v1::ServerMessage = earlier("welcome");
    let mut expect = welcome.clone();
    if let Some(server_message::Msg::Welcome(w)) = &mut expect.msg {
        w.inventory_wanted.clear();
    }
    assert_eq!(before, expect);
    check(
        "heartbeat_ack",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::HeartbeatAck(v1::HeartbeatAck {
                seq: 12,
                server_time_ms: 1_790_000_210_000,
                // Added later: unset, it leaves the earlier encoding as it was.
                first_retry_ms: 0,
            })),
        },
    );
    check(
        "heartbeat_ack_first_retry",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::HeartbeatAck(v1::HeartbeatAck {
                seq: 13,
                server_time_ms: 1_790_000_220_000,
                first_retry_ms: 1_667,
            })),
        },
    );
    check(
        "command_ack",
        &v1::NodeMessage {
            msg: Some(node_message::Msg::CommandAck(v1::CommandAck {
                command_id: "cmd-1".into(),
                seq: 5,
                state: v1::AckState::Running as i32,
            })),
        },
    );
    check(
        "drain",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::Drain(v1::Drain {
                reconnect_within_ms: 60_000,
                reason: "the gateway is shutting down".into(),
            })),
        },
    );
    let list = v1::GatewayRevocations {
        purpose: bcd_proto::gateways::PURPOSE.into(),
        issued_ms: 1_790_000_000_000,
        not_after_ms: 1_790_000_600_000,
        certs: vec![v1::RevokedGatewayCert {
            name: "gw-a".into(),
            sha256: "5e".repeat(32),
            not_after_ms: 1_792_592_000_000,
        }],
    };
    check("gateway_revocations", &list);
    check(
        "operator_revocation",
        &v1::OperatorRevocation {
            purpose: "better-compute operator revocation v1".into(),
            name: "alice".into(),
            cert_sha256: "7a".repeat(32),
            revoked_at_ms: 1_790_000_000_000,
        },
    );
    check(
        "result_receipt_sent",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::ResultReceipt(
                bcd_proto::receipts::seal(
                    &worker_key(),
                    v1::ResultReceipt {
                        purpose: String::new(),
                        node_id: "nd-0f3a9c".into(),
                        command_id: "cmd-1".into(),
                        seq: 5,
                        result_sha256: "3c".repeat(32),
                    },
                ),
            )),
        },
    );
    check(
        "event_receipt_sent",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::EventReceipt(
                bcd_proto::receipts::seal_event(
                    &worker_key(),
                    v1::EventReceipt {
                        purpose: String::new(),
                        node_id: "nd-0f3a9c".into(),
                        journal_id: "j-1".into(),
                        event_id: 12,
                        kind: "security.spec.refused".into(),
                        body_sha256: "4d".repeat(32),
                    },
                ),
            )),
        },
    );
    check(
        "gateway_revocations_sent",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::GatewayRevocations(
                bcd_proto::gateways::seal(&worker_key(), list),
            )),
        },
    );
}

#[test]
fn signed_intent_and_facts() {
    let key = worker_key();
    let payload = v1::CommandPayload {
        command_id: "cmd-1".into(),
        node_id: "nd-0f3a9c".into(),
        seq: 5,
        kind: v1::CommandKind::ExecRun as i32,
        not_after_ms: 1_790_003_600_000,
        min_generation: 2,
        issued_at_ms: 1_790_000_000_000,
        args: Some(v1::command_payload::Args::Exec(v1::ExecArgs {
            program: "/bin/true".into(),
            args: vec!["-x".into()],
            timeout_ms: 600_000,
            max_output: 65_536,
        })),
    };
    check("command_payload", &payload);
    check(
        "command_dispatch",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::Command(v1::CommandDispatch {
                command_id: "cmd-1".into(),
                seq: 5,
                signed: bcd_proto::sign::seal(&key, payload.encode_to_vec()),
                epoch: 8,
            })),
        },
    );
    let spec = v1::NodeSpec {
        node_id: "nd-0f3a9c".into(),
        generation: 4,
        issued_at_ms: 1_790_000_000_000,
        not_after_ms: 1_790_086_400_000,
        devices: Some(v1::DevicesSpec {
            assignments: vec![v1::GpuAssignment {
                allocation_id: "job-1".into(),
                gpus: vec!["0".into()],
                env: [("JOB".to_string(), "1".to_string())].into(),
                secrets: vec![],
            }],
        }),
        access: Some(v1::AccessSpec {
            users: vec![v1::AccessUser {
                name: "ops".into(),
                authorized_keys: vec!["ssh-ed25519 AAAA ops".into()],
                principals: vec![],
            }],
            trusted_user_ca_keys: vec![],
            firewall: Some(v1::FirewallSpec {
                rules: vec![v1::FirewallRule {
                    protocol: v1::FirewallProtocol::Tcp as i32,
                    port: 22,
                    source: "10.0.0.0/8".into(),
                    action: v1::FirewallAction::Accept as i32,
                }],
            }),
        }),
        // Added later: unset, they leave the earlier encoding as it was.
        ticket_jwks: String::new(),
        intent: None,
    };
    check("node_spec", &spec);
    check(
        "node_spec_ticket_keys",
        &v1::NodeSpec {
            ticket_jwks: bcd_proto::ticket::Jwks::of(&[{
                use ring::signature::KeyPair;
                key.public_key().as_ref().to_vec()
            }])
            .to_json(),
            ..spec.clone()
        },
    );
    let mut with_secrets = spec.clone();
    if let Some(d) = &mut with_secrets.devices {
        d.assignments[0].secrets = vec![v1::SecretRef {
            name: "hf-token".into(),
            version: 3,
            file: "token".into(),
        }];
    }
    check("node_spec_secrets", &with_secrets);
    check(
        "node_spec_intent",
        &v1::NodeSpec {
            intent: Some(v1::NodeIntent {
                labels: [("pool", "a"), ("gpu", "h200"), ("rack", "r1")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
                cordoned: true,
                cordon_reason: "fan 3 failing".into(),
                cordoned_at_ms: 1_790_000_100_000,
            }),
            ..spec.clone()
        },
    );
    check(
        "label_node",
        &v1::LabelNodeRequest {
            node_id: "nd-0f3a9c".into(),
            set: [("pool".to_string(), "a".to_string())].into(),
            remove: vec!["rack".into()],
        },
    );
    check(
        "image_upload_kernel",
        &v1::ImageUpload {
            part: Some(v1::image_upload::Part::Kernel(b"MZ".to_vec())),
        },
    );
    check(
        "console_token",
        &v1::ConsoleToken {
            version: 1,
            operator: "alice".into(),
            // Version 1: the role by name (field 3), kept for such tokens.
            role_name: "read-only".into(),
            role: 0,
            cert_sha256: "5e".repeat(32),
            issued_ms: 1_790_000_000_000,
            expires_ms: 1_790_003_600_000,
            nonce: vec![7; 16],
        },
    );
    check(
        "console_token_v2",
        &v1::ConsoleToken {
            version: 2,
            operator: "alice".into(),
            role_name: String::new(),
            role: v1::OperatorRole::ReadOnly as i32,
            cert_sha256: "5e".repeat(32),
            issued_ms: 1_790_000_000_000,
            expires_ms: 1_790_003_600_000,
            nonce: vec![7; 16],
        },
    );
    check(
        "add_operator_request",
        &v1::AddOperatorRequest {
            name: "alice".into(),
            role: v1::OperatorRole::Admin as i32,
            csr_der: vec![0x30, 0x82, 0x01],
        },
    );
    check(
        "operator_info",
        &v1::OperatorInfo {
            name: "alice".into(),
            role: v1::OperatorRole::Admin as i32,
            cert_sha256: "5e".repeat(32),
            cert_serial: "01ab".into(),
            created_at_ms: 1_790_000_000_000,
            not_after_ms: 1_821_536_000_000,
            revoked_at_ms: 0,
        },
    );
    check(
        "mint_console_token",
        &v1::MintConsoleTokenResponse {
            token: "bcc1.AAAA.BBBB".into(),
            expires_ms: 1_790_003_600_000,
            console_url: "https://127.0.0.1:9466/".into(),
        },
    );
    check(
        "drain_gateway",
        &v1::DrainGatewayRequest {
            gateway_id: "gw-a-1".into(),
            undo: false,
            within_ms: 30_000,
        },
    );
    check(
        "tunnel_open_request_drain",
        &v1::TunnelOpenRequest {
            drain: Some(v1::GatewayDrain {
                drain: true,
                within_ms: 30_000,
            }),
            ..Default::default()
        },
    );
    check(
        "cordon_node",
        &v1::CordonNodeRequest {
            node_id: "nd-0f3a9c".into(),
            cordon: true,
            reason: "fan 3 failing".into(),
        },
    );
    check(
        "list_nodes_request_filtered",
        &v1::ListNodesRequest {
            label_selector: "pool=a,gpu!=h100".into(),
            state: v1::NodeState::Connected as i32,
            pool: "lab".into(),
            limit: 100,
            after: "nd-0f3a9c".into(),
            node_id: "nd-1b2c3d".into(),
        },
    );
    let result = v1::CommandResult {
        command_id: "cmd-1".into(),
        seq: 5,
        outcome: v1::Outcome::Succeeded as i32,
        reason: String::new(),
        exit_code: 0,
        has_exit_code: true,
        output: b"ok\n".to_vec(),
        output_truncated: false,
        boot_id: "boot-1".into(),
        node_id: "nd-0f3a9c".into(),
    };
    check("command_result", &result);
    // ECDSA signatures are randomized: a fixed stand-in pins the framing.
    check(
        "signed_result",
        &v1::NodeMessage {
            msg: Some(node_message::Msg::CommandResult(v1::NodeSigned {
                payload: result.encode_to_vec(),
                signature: vec![0x30, 0x44, 0x02, 0x20],
            })),
        },
    );
    let report = v1::StateReport {
        applied_generation: 4,
        sections: vec![v1::SectionStatus {
            section: v1::StateSection::Devices as i32,
            status: v1::SectionState::Ready as i32,
            message: String::new(),
            age_ms: 1_500,
        }],
        node_id: "nd-0f3a9c".into(),
        epoch: 8,
    };
    check("state_report_section_kind", &report);
    // Before sections were an enum (field 1, "devices"): the section reads
    // as not given, which a gateway leaves out of what it stores.
    let before: v1::StateReport = earlier("state_report");
    assert_eq!(
        before,
        v1::StateReport {
            sections: vec![v1::SectionStatus {
                section: 0,
                ..report.sections[0].clone()
            }],
            ..report
        }
    );
    let inventory = v1::Inventory {
        section: v1::InventoryKind::Gpus as i32,
        sha256: "cd".repeat(32),
        body: b"{\"gpus\":[]}".to_vec(),
        node_id: "nd-0f3a9c".into(),
        epoch: 8,
    };
    check("inventory_kind", &inventory);
    // Before sections were an enum (field 1, "gpus"): the section reads
    // as not given, which a gateway turns away.
    let before: v1::Inventory = earlier("inventory");
    assert_eq!(
        before,
        v1::Inventory {
            section: 0,
            ..inventory
        }
    );
}

fn join_response(signature: Vec<u8>) -> v1::JoinResponse {
    v1::JoinResponse {
        node_id: "nd-0f3a9c".into(),
        cert_der: vec![0x30, 0x82],
        ca_der: vec![0x30, 0x81],
        cert_serial: "5a17c0de".into(),
        not_after_ms: 1_790_086_400_000,
        server_time_ms: 1_790_000_000_000,
        worker_keys: vec![vec![0x11; 32]],
        identity_generation: 1,
        release_keys: vec![vec![0x22; 32]],
        floors: Some(v1::ReplayFloors {
            command_seq: 5,
            spec_generation: 4,
        }),
        signature,
        image_keys: vec![],
        image_keys_signature: vec![],
    }
}

#[test]
fn refusals_statements_and_join() {
    let key = worker_key();
    let statement = v1::NodeStatement {
        node_id: "nd-0f3a9c".into(),
        kind: v1::NodeStatementKind::Deleted as i32,
        serials: vec!["5a17c0de".into()],
        reason: "node-deleted".into(),
        issued_at_ms: 1_790_000_300_000,
    };
    check("node_statement", &statement);
    check(
        "refusal",
        &v1::Refusal {
            reason: v1::RefusalReason::NodeDeleted as i32,
            message:
                "node nd-0f3a9c was deleted: join again: bcd join --reset --yes, then bcd join"
                    .into(),
            statement: bcd_proto::sign::seal_statement(&key, &statement),
        },
    );
    check(
        "revocation_notice",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::Revocation(v1::RevocationNotice {
                reason: "node-deleted".into(),
                serials: vec!["5a17c0de".into()],
                statement: bcd_proto::sign::seal_statement(&key, &statement),
            })),
        },
    );
    let previous = v1::JoinRequest {
        token: "tok1.secret".into(),
        csr_der: vec![0x30, 0x82, 0x01],
        hostname: "gpu-7".into(),
        inventory_hashes: vec![v1::InventoryHash {
            section: v1::InventoryKind::Gpus as i32,
            sha256: "ab".repeat(32),
        }],
        ramdisk: false,
        previous: Some(v1::PreviousIdentity {
            node_id: "nd-0f3a9c".into(),
            signature: [&[0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01][..], &[0x02]].concat(),
        }),
        tpm: None,
        boot_id: String::new(),
        macs: vec![],
        sealed_token: vec![],
    };
    check("join_request_previous_inventory_kind", &previous);
    // Before sections were an enum (field 1, "gpus").
    let before: v1::JoinRequest = earlier("join_request_previous");
    let mut expect = previous.clone();
    expect.inventory_hashes[0].section = 0;
    assert_eq!(before, expect);
    // An earlier server's response carries no signature; a signed one
    // adds field 11.
    check("join_response", &join_response(vec![]));
    check(
        "join_response_signed",
        &join_response([&[0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01][..], &[0x02]].concat()),
    );
}

/// The two round trips of a join by TPM attestation.
#[test]
fn tpm_attestation() {
    let ticket = bcd_proto::attest::Ticket {
        issued_ms: 1_790_000_000_000,
        nonce: [0x5a; 16],
        ek_sha256: [0xe4; 32],
        ak_name: [&[0x00, 0x0b][..], &[0xa4; 32]].concat(),
    }
    .encode();
    check(
        "attestation_request",
        &v1::AttestationRequest {
            version: 1,
            ek_public: vec![0x00, 0x23, 0x00, 0x0b],
            ek_certificate: vec![0x30, 0x82, 0x05],
            ak_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x05],
        },
    );
    check(
        "attestation_challenge",
        &v1::AttestationChallenge {
            version: 1,
            credential_blob: vec![0x00, 0x44, 0x00, 0x20],
            encrypted_secret: vec![0x00, 0x44, 0x00, 0x20, 0x01],
            ticket: ticket.clone(),
        },
    );
    check(
        "join_request_tpm",
        &v1::JoinRequest {
            token: "tok1.secret".into(),
            csr_der: vec![0x30, 0x82, 0x01],
            hostname: "gpu-7".into(),
            inventory_hashes: vec![],
            ramdisk: true,
            previous: None,
            tpm: Some(v1::TpmAttestation {
                version: 1,
                ticket,
                activated_secret: vec![0x77; 32],
                ak_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x05],
                node_key_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x04],
                certify_attest: vec![0xff, 0x54, 0x43, 0x47, 0x80, 0x17],
                certify_signature: vec![0x00, 0x18, 0x00, 0x0b],
                ek_certificate: vec![],
                // Added later: empty, it leaves the earlier encoding as it was.
                ek_chain: vec![],
            }),
            boot_id: String::new(),
            macs: vec![],
            sealed_token: vec![],
        },
    );
    // A machine enrolled by its EK joins with no token; its EK certificate
    // travels again for an enrolled EK CA (field 8).
    check(
        "join_request_tpm_enrolled",
        &v1::JoinRequest {
            token: String::new(),
            csr_der: vec![0x30, 0x82, 0x01],
            hostname: "gpu-7".into(),
            inventory_hashes: vec![],
            ramdisk: true,
            previous: None,
            tpm: Some(v1::TpmAttestation {
                version: 1,
                ticket: vec![0x01, 0x02],
                activated_secret: vec![0x77; 32],
                ak_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x05],
                node_key_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x04],
                certify_attest: vec![0xff, 0x54, 0x43, 0x47, 0x80, 0x17],
                certify_signature: vec![0x00, 0x18, 0x00, 0x0b],
                ek_certificate: vec![0x30, 0x82, 0x05],
                ek_chain: vec![],
            }),
            boot_id: String::new(),
            macs: vec![],
            sealed_token: vec![],
        },
    );
    // With the chain certificates its TPM holds (field 9).
    check(
        "join_request_tpm_ek_chain",
        &v1::JoinRequest {
            token: String::new(),
            csr_der: vec![0x30, 0x82, 0x01],
            hostname: "gpu-7".into(),
            inventory_hashes: vec![],
            ramdisk: true,
            previous: None,
            tpm: Some(v1::TpmAttestation {
                version: 1,
                ticket: vec![0x01, 0x02],
                activated_secret: vec![0x77; 32],
                ak_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x05],
                node_key_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x04],
                certify_attest: vec![0xff, 0x54, 0x43, 0x47, 0x80, 0x17],
                certify_signature: vec![0x00, 0x18, 0x00, 0x0b],
                ek_certificate: vec![0x30, 0x82, 0x05],
                ek_chain: vec![vec![0x30, 0x82, 0x04], vec![0x30, 0x82, 0x03]],
            }),
            boot_id: String::new(),
            macs: vec![],
            sealed_token: vec![],
        },
    );
    // Its boot id (field 8): a sighting for the clone watch.
    check(
        "join_request_tpm_reattest",
        &v1::JoinRequest {
            token: String::new(),
            csr_der: vec![0x30, 0x82, 0x01],
            hostname: "gpu-7".into(),
            inventory_hashes: vec![],
            ramdisk: true,
            previous: None,
            tpm: None,
            boot_id: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
            macs: vec![],
            sealed_token: vec![],
        },
    );
}

/// Machines enrolled by their EK (the operator API).
#[test]
fn machine_enrolment() {
    check(
        "enroll_machine_request",
        &v1::EnrollMachineRequest {
            ek_sha256: "e4".repeat(32),
            ek_certificate_der: vec![],
            ek_ca_der: vec![0x30, 0x82, 0x04],
            description: "rack 3".into(),
            ek_intermediates_der: vec![],
        },
    );
    let machine = v1::MachineInfo {
        id: format!("ek:{}", "e4".repeat(32)),
        kind: v1::MachineKind::Ek as i32,
        ek_sha256: "e4".repeat(32),
        subject: "CN=EK".into(),
        description: "rack 3".into(),
        created_at_ms: 1_790_000_000_000,
        node_id: "nd-0f3a9c".into(),
        intermediates: vec![],
    };
    check(
        "enroll_machine_response_kind",
        &v1::EnrollMachineResponse {
            machine: Some(machine.clone()),
            ca_pin: "ab".repeat(32),
        },
    );
    // Before the kind was an enum (field 2, "ek"): the rest still reads,
    // the kind as not given.
    let before: v1::EnrollMachineResponse = earlier("enroll_machine_response");
    assert_eq!(
        before,
        v1::EnrollMachineResponse {
            machine: Some(v1::MachineInfo { kind: 0, ..machine }),
            ca_pin: "ab".repeat(32),
        }
    );
    // An EK CA with the intermediates between it and the EK certificates.
    check(
        "enroll_machine_request_intermediates",
        &v1::EnrollMachineRequest {
            ek_sha256: String::new(),
            ek_certificate_der: vec![],
            ek_ca_der: vec![0x30, 0x82, 0x04],
            description: "vendor root".into(),
            ek_intermediates_der: vec![vec![0x30, 0x82, 0x03], vec![0x30, 0x82, 0x02]],
        },
    );
    let machine = v1::MachineInfo {
        id: format!("ek-ca:{}", "c1".repeat(32)),
        kind: v1::MachineKind::EkCa as i32,
        ek_sha256: String::new(),
        subject: "CN=vendor root".into(),
        description: "vendor root".into(),
        created_at_ms: 1_790_000_000_000,
        node_id: String::new(),
        intermediates: vec!["CN=vendor EK CA 1".into()],
    };
    check("machine_info_kind", &machine);
    let before: v1::MachineInfo = earlier("machine_info_intermediates");
    assert_eq!(before, v1::MachineInfo { kind: 0, ..machine });
}

/// What a node sends to renew, and what a gateway relays to the join
/// service's port.
#[test]
fn renewal_and_gateway_services() {
    let request = v1::RenewRequest {
        csr_der: vec![0x30, 0x82, 0x01],
        proof: [&[0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01][..], &[0x02]].concat(),
        proof_time_ms: 1_790_000_000_000,
        node_id: "nd-0f3a9c".into(),
        expired_cert_der: vec![],
        next_key: None,
    };
    check("renew_request", &request);
    // x509pop: the expired certificate travels in the request (field 5).
    check(
        "renew_request_expired",
        &v1::RenewRequest {
            expired_cert_der: vec![0x30, 0x82, 0x03],
            ..request.clone()
        },
    );
    check(
        "renew_request_tpm",
        &v1::RenewRequest {
            next_key: Some(v1::KeyCertification {
                version: 1,
                ak_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x05],
                key_public: vec![0x00, 0x23, 0x00, 0x0b, 0x00, 0x04],
                certify_attest: vec![0xff, 0x54, 0x43, 0x47, 0x80, 0x17],
                certify_signature: vec![0x00, 0x18, 0x00, 0x0b],
            }),
            ..request.clone()
        },
    );
    check(
        "forwarded_renew",
        &v1::ForwardedRenew {
            node_cert_der: vec![0x30, 0x82, 0x02],
            request: Some(request),
        },
    );
    check(
        "renew_response_signed",
        &v1::RenewResponse {
            cert_der: vec![0x30, 0x82, 0x04],
            cert_serial: "5a17c0df".into(),
            not_after_ms: 1_790_086_400_000,
            server_time_ms: 1_790_000_000_000,
            signature: [&[0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01][..], &[0x03]].concat(),
        },
    );
    check(
        "certify_request",
        &v1::CertifyRequest {
            name: "gw-edge".into(),
            secret: "bcg1.0123".into(),
            csr_der: vec![0x30, 0x82, 0x03],
            names: vec!["gw.example".into(), "10.0.0.7".into()],
        },
    );
    check(
        "certify_response",
        &v1::CertifyResponse {
            chain_der: vec![vec![0x30, 0x82], vec![0x30, 0x81]],
            not_after_ms: 1_792_592_000_000,
            server_time_ms: 1_790_000_000_000,
        },
    );
}

#[test]
fn streamed_release_download() {
    check(
        "fetch_release_request_offset",
        &v1::FetchReleaseRequest {
            sequence: 7,
            offset: 262_144,
        },
    );
    check(
        "release_chunk_manifest",
        &v1::ReleaseChunk {
            signed_manifest: b"{\"manifest\":\"e30=\"}".to_vec(),
            offset: 0,
            data: vec![],
        },
    );
    check(
        "release_chunk_data",
        &v1::ReleaseChunk {
            signed_manifest: vec![],
            offset: 262_144,
            data: b"\x7fELF\x02\x01".to_vec(),
        },
    );
}

#[test]
fn image_download_and_kexec_by_image() {
    check(
        "fetch_image_request",
        &v1::FetchImageRequest {
            image_id: "ab".repeat(32),
        },
    );
    check(
        "image_chunk_manifest",
        &v1::ImageChunk {
            signed_manifest: b"{\"manifest\":\"e30=\"}".to_vec(),
            part: v1::ImagePart::Unspecified as i32,
            offset: 0,
            data: vec![],
        },
    );
    check(
        "image_chunk_initrd",
        &v1::ImageChunk {
            signed_manifest: vec![],
            part: v1::ImagePart::Initrd as i32,
            offset: 262_144,
            data: b"\x1f\x8b\x08".to_vec(),
        },
    );
    check(
        "kexec_args_image",
        &v1::KexecArgs {
            kernel: String::new(),
            initrd: String::new(),
            cmdline: "bcd.log=debug".into(),
            image_id: "cd".repeat(32),
        },
    );
    check(
        "join_response_image_keys",
        &v1::JoinResponse {
            image_keys: vec![vec![0x33; 32]],
            image_keys_signature: [&[0x30, 0x06, 0x02, 0x01, 0x03, 0x02, 0x01][..], &[0x04]]
                .concat(),
            ..join_response([&[0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01][..], &[0x02]].concat())
        },
    );
}

#[test]
fn operator_messages() {
    check(
        "list_tokens_response",
        &v1::ListTokensResponse {
            tokens: vec![
                v1::TokenInfo {
                    token_id: "0123456789abcdef".into(),
                    created_at_ms: 1_790_000_000_000,
                    expires_at_ms: 1_790_086_400_000,
                    uses_total: 3,
                    uses_left: 2,
                    description: "rack A".into(),
                    pool: "rack-a".into(),
                    minted_for_mac: String::new(),
                },
                v1::TokenInfo {
                    token_id: "fedcba9876543210".into(),
                    created_at_ms: 1_790_000_100_000,
                    expires_at_ms: 1_790_000_400_000,
                    uses_total: 1,
                    uses_left: 1,
                    pool: "rack-a".into(),
                    minted_for_mac: "52:54:00:12:34:56".into(),
                    ..Default::default()
                },
            ],
        },
    );
    check(
        "revoke_token_request",
        &v1::RevokeTokenRequest {
            token_id: "0123456789abcdef".into(),
        },
    );
    check(
        "command_info",
        &v1::CommandInfo {
            command_id: "cmd-1".into(),
            node_id: "nd-0f3a9c".into(),
            seq: 5,
            kind: v1::CommandKind::GpuReset as i32,
            summary: "0".into(),
            state: v1::CommandState::Succeeded as i32,
            created_at_ms: 1_790_000_000_000,
            not_after_ms: 1_790_003_600_000,
            result_at_ms: 1_790_000_000_050,
            epoch: 8,
            ..Default::default()
        },
    );
    check(
        "node_info",
        &v1::NodeInfo {
            node_id: "nd-0f3a9c".into(),
            state: v1::NodeState::Connected as i32,
            epoch: 8,
            ..Default::default()
        },
    );
    check(
        "change_rollout",
        &v1::ChangeRolloutRequest {
            id: "ro-1".into(),
            action: v1::RolloutAction::Abort as i32,
            rollback: true,
        },
    );
    check(
        "assign_image",
        &v1::AssignImageRequest {
            image: "netboot".into(),
            target: Some(v1::ImageTarget {
                target: Some(v1::image_target::Target::Mac("52:54:00:12:34:56".into())),
            }),
            append: "bcd.state=STATE".into(),
            join_token_ttl_ms: 0,
        },
    );
    // Assignments by node and by pool, with tokens the boot endpoint mints
    // (fields 3 and 4 of the target, 5 of the request).
    check(
        "assign_image_pool_minted",
        &v1::AssignImageRequest {
            image: "netboot".into(),
            target: Some(v1::ImageTarget {
                target: Some(v1::image_target::Target::Pool("gpu".into())),
            }),
            append: String::new(),
            join_token_ttl_ms: 900_000,
        },
    );
    check(
        "image_target_node",
        &v1::ImageTarget {
            target: Some(v1::image_target::Target::Node("nd-0f3a9c".into())),
        },
    );
    check(
        "set_boot_mac",
        &v1::SetBootMacRequest {
            mac: "52:54:00:12:34:56".into(),
            allowed: true,
            pool: "gpu".into(),
        },
    );
    check(
        "list_boot_macs",
        &v1::ListBootMacsResponse {
            macs: vec![v1::BootMac {
                mac: "52:54:00:12:34:56".into(),
                pool: "gpu".into(),
                added_at_ms: 1_790_000_123_456,
            }],
        },
    );
    check(
        "create_token_pool",
        &v1::CreateTokenRequest {
            ttl_ms: 3_600_000,
            uses: 5,
            description: "rack 2".into(),
            pool: "gpu".into(),
        },
    );
    check(
        "node_info_pool_macs",
        &v1::NodeInfo {
            node_id: "nd-0f3a9c".into(),
            state: v1::NodeState::Connected as i32,
            pool: "gpu".into(),
            macs: vec!["52:54:00:12:34:56".into()],
            ..Default::default()
        },
    );
    // The machine's MAC addresses (field 9).
    check(
        "join_request_macs",
        &v1::JoinRequest {
            token: "tok1.secret".into(),
            csr_der: vec![0x30, 0x82, 0x01],
            hostname: "gpu-7".into(),
            inventory_hashes: vec![],
            ramdisk: true,
            previous: None,
            tpm: None,
            boot_id: String::new(),
            macs: vec!["52:54:00:12:34:56".into(), "02:bc:00:00:00:2a".into()],
            sealed_token: vec![],
        },
    );
    // A bct2 token, sealed to the join service (field 10; the plain token
    // field stays empty): the encapsulated key, then ciphertext and tag.
    check(
        "join_request_sealed",
        &v1::JoinRequest {
            token: String::new(),
            csr_der: vec![0x30, 0x82, 0x01],
            hostname: "gpu-7".into(),
            inventory_hashes: vec![],
            ramdisk: false,
            previous: None,
            tpm: None,
            boot_id: String::new(),
            macs: vec![],
            sealed_token: [[0xe1; 32].as_slice(), &[0x5e; 49], &[0x7a; 16]].concat(),
        },
    );
}

#[test]
fn tunnel_messages() {
    check(
        "tunnel_open",
        &v1::ServerMessage {
            msg: Some(server_message::Msg::TunnelOpen(v1::TunnelOpen {
                sid: "tn-1".into(),
                ticket: "eyJhbGciOiJFZERTQSJ9.e30.c2ln".into(),
            })),
        },
    );
    check(
        "tunnel_refused",
        &v1::NodeMessage {
            msg: Some(node_message::Msg::TunnelRefused(v1::TunnelRefused {
                sid: "tn-1".into(),
                reason: "the ticket expired".into(),
            })),
        },
    );
    check(
        "tunnel_accept",
        &v1::TunnelAccept {
            sid: "tn-1".into(),
            ticket_sha256: vec![0xab; 32],
            node_public: vec![0x07; 32],
            cert_der: vec![0x30, 0x82, 0x01, 0x00],
            signature: vec![0x30, 0x45],
        },
    );
    check(
        "tunnel_frame",
        &v1::TunnelFrame {
            sid: "tn-1".into(),
            data: vec![1, 2, 3],
        },
    );
    for (name, body) in [
        (
            "tunnel_record_stdin",
            v1::tunnel_record::Body::Stdin(b"ls\n".to_vec()),
        ),
        (
            "tunnel_record_stdin_closed",
            v1::tunnel_record::Body::StdinClosed(true),
        ),
        (
            "tunnel_record_stdout",
            v1::tunnel_record::Body::Stdout(b"out".to_vec()),
        ),
        (
            "tunnel_record_stderr",
            v1::tunnel_record::Body::Stderr(b"err".to_vec()),
        ),
        (
            "tunnel_record_exit",
            v1::tunnel_record::Body::Exit(v1::TunnelExit {
                code: -1,
                signal: 9,
                error: String::new(),
            }),
        ),
        (
            "tunnel_record_resize",
            v1::tunnel_record::Body::Resize(v1::TerminalSize {
                rows: 50,
                cols: 132,
            }),
        ),
        ("tunnel_record_signal", v1::tunnel_record::Body::Signal(2)),
        ("tunnel_record_start", v1::tunnel_record::Body::Start(true)),
    ] {
        check(name, &v1::TunnelRecord { body: Some(body) });
    }
    check(
        "tunnel_request",
        &v1::TunnelClientFrame {
            msg: Some(v1::tunnel_client_frame::Msg::Request(v1::TunnelRequest {
                node_id: "nd-0f3a9c".into(),
                argv: vec!["nvidia-smi".into(), "-L".into()],
                port: 0,
                tty: true,
                user: "ops".into(),
                client_public: vec![0x07; 32],
            })),
        },
    );
    let secret_request = v1::SecretRequest {
        node_id: "nd-0f3a9c".into(),
        allocation_id: "job-1".into(),
        name: "hf-token".into(),
        version: 3,
        one_time_key: vec![0x09; 32],
        time_ms: 1_790_000_000_000,
        signature: vec![0x30, 0x44, 0x02, 0x20],
    };
    check("secret_request", &secret_request);
    check(
        "forwarded_secret",
        &v1::ForwardedSecret {
            node_cert_der: vec![0x30, 0x82],
            request: Some(secret_request),
        },
    );
    check(
        "secret_delivery",
        &v1::SecretDelivery {
            jws: "eyJhbGciOiJFZERTQSJ9.e30.c2ln".into(),
        },
    );
    check(
        "tunnel_granted",
        &v1::TunnelServerFrame {
            msg: Some(v1::tunnel_server_frame::Msg::Granted(v1::TunnelGranted {
                sid: "tn-1".into(),
                ticket: "eyJhbGciOiJFZERTQSJ9.e30.c2ln".into(),
                fleet_ca_der: vec![0x30, 0x82],
            })),
        },
    );
}
