//! Event bodies, pinned: one representative body of each kind encoded and
//! compared with `testdata/events/<kind>.json`, and each file read back
//! into the same body. The files are what nodes have journaled and sent
//! since these kinds began (JSON objects, keys sorted); an existing file
//! is never edited to make this pass: a body gains optional fields only.
//! New kinds get their file with `BCD_WRITE_GOLDEN=1`.

use std::path::PathBuf;

use bcd_proto::events::{self, Body, Detail, Refused};

fn check<B: Body + PartialEq + std::fmt::Debug>(name: &str, body: &B) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/events")
        .join(format!("{name}.json"));
    let bytes = events::encode(body);
    if std::env::var_os("BCD_WRITE_GOLDEN").is_some() && !p.exists() {
        let mut file = bytes.clone();
        file.push(b'\n');
        std::fs::write(&p, file).unwrap();
    }
    let golden = std::fs::read(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (new kinds: BCD_WRITE_GOLDEN=1)", p.display()));
    let golden = golden.strip_suffix(b"\n").unwrap_or(&golden);
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        String::from_utf8_lossy(golden),
        "the body of {} changed: add optional fields only",
        B::KIND
    );
    assert_eq!(
        &events::decode::<B>(golden).unwrap(),
        body,
        "{name} reads back"
    );
}

fn refused<D: Detail + PartialEq + std::fmt::Debug>(name: &str, detail: D) {
    check(
        name,
        &Refused {
            detail,
            held_back: 2,
        },
    );
}

#[test]
fn every_kind_of_body_is_pinned() {
    check(
        "command.accepted",
        &events::CommandAccepted {
            command_id: "cmd-1".into(),
            seq: 7,
            kind: "exec.run".into(),
        },
    );
    check(
        "command.running",
        &events::CommandRunning {
            command_id: "cmd-1".into(),
            boot_id: "boot-1".into(),
        },
    );
    check(
        "command.finished",
        &events::CommandFinished {
            command_id: "cmd-1".into(),
            outcome: "succeeded".into(),
            reason: String::new(),
        },
    );
    check(
        "node.load",
        &events::NodeLoad {
            load1: 0.5,
            load5: 1.25,
            load15: 2.0,
        },
    );
    check(
        "spec.refused",
        &events::SpecRefused {
            generation: 4,
            reason: "not signed by a worker key".into(),
        },
    );
    check(
        "tunnel.ended",
        &events::TunnelEnded {
            sid: "t-1".into(),
            jti: "j-1".into(),
            operator: "admin".into(),
            what: vec!["bash".into(), "-l".into()],
            user: "root".into(),
            bytes_in: 10,
            bytes_out: 2048,
            exit_code: Some(0),
            signal: 0,
            error: String::new(),
            seconds: 12,
        },
    );
    check(
        "security.release.running",
        &events::ReleaseRunning {
            command_id: "cmd-9".into(),
            release_sequence: 3,
        },
    );
    check(
        "security.gateway.revoked",
        &events::GatewayLeft {
            gateway_sha256: "ab".repeat(32),
            why: "the signed gateway revocation list names it".into(),
        },
    );
    refused(
        "security.command.refused",
        events::CommandRefused {
            command_id: "cmd-2".into(),
            seq: 8,
            reason: "replayed".into(),
        },
    );
    refused(
        "security.receipt.refused",
        events::ReceiptRefused {
            command_id: None,
            why: "not signed by a worker key".into(),
        },
    );
    refused(
        "security.receipt.refused.command",
        events::ReceiptRefused {
            command_id: Some("cmd-3".into()),
            why: "another node".into(),
        },
    );
    refused(
        "security.secret.refused",
        events::SecretRefused {
            allocation: "alloc-1".into(),
            secret: "db".into(),
            version: 2,
            why: "does not open".into(),
        },
    );
    refused(
        "security.welcome.refused",
        events::WelcomeRefused("stale epoch 3 (last 5)".into()),
    );
    refused(
        "security.clock.ahead",
        events::ClockAhead {
            said_ms: 1_790_000_100_000,
            limit_ms: 1_790_000_000_000,
            why: "ahead".into(),
        },
    );
    refused(
        "security.refusal.unconfirmed",
        events::RefusalUnconfirmed {
            code: "Unauthenticated".into(),
            message: "node deleted".into(),
            why: "no key confirmed it".into(),
        },
    );
    refused(
        "security.revocation.unconfirmed",
        events::RevocationUnconfirmed {
            reason: "revoked".into(),
            why: "no key signed it".into(),
        },
    );
    refused(
        "security.drain.clamped",
        events::DrainClamped {
            asked_ms: 86_400_000,
            clamped_ms: 60_000,
        },
    );
    refused(
        "security.gateway_revocations.refused",
        events::GatewayRevocationsRefused {
            why: "expired".into(),
        },
    );
    refused(
        "security.tunnel.refused",
        events::TunnelRefused {
            sid: "t-2".into(),
            why: "the ticket is for another node".into(),
        },
    );
}

/// A refused frame's detail cut short is a string in the same place: a
/// reader of a detail type still reads the envelope.
#[test]
fn a_detail_cut_short_is_a_string() {
    let cut: Refused<serde_json::Value> = serde_json::from_slice(
        br#"{"detail":"{\"sid\":\"t-2\",... (9000 bytes in all)","held_back":0}"#,
    )
    .unwrap();
    assert!(cut.detail.is_string());
}
