//! What only the SQLite backend has: its schema, pinned by a golden file;
//! the upgrade from the previous schema version, from a store written by
//! that version's code; the refusal of a store from a newer binary; a
//! database failure in the middle of judging a binding; and a write that
//! panics inside a group commit.
//!
//! After a deliberate schema change (a new migration), regenerate the
//! golden file with `BC_UPDATE_GOLDEN=1 cargo test -p bc-store --test
//! sqlite_backend` and commit it with the migration, together with a
//! fixture of the version it replaces.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bc_store::bindings::{BindingInput, BindingOutcome, BindingReport};
use bc_store::nodes::IssuedCert;
use bc_store::sqlite::{MIGRATIONS, SCHEMA_VERSION};
use bc_store::tokens::{JoinInput, NewToken};
use bc_store::{CommandId, ManualClock, NodeId, ReleaseSeq, Store, StoreError};

const GOLDEN: &str = "tests/golden/schema.sql";

/// Every schema object, sorted, as SQLite keeps its definition.
fn schema(path: &Path) -> String {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut q = conn
        .prepare(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name",
        )
        .unwrap();
    let rows = q
        .query_map([], |r| {
            Ok(format!(
                "-- {} {}\n{};\n",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?
            ))
        })
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    format!("-- schema version {version}\n\n{}", rows.join("\n"))
}

async fn open(path: &Path, clock: &ManualClock) -> Result<Store, StoreError> {
    Store::open_sqlite(path, Arc::new(clock.clone())).await
}

/// A store an earlier version wrote (`fixture`, its SQL dump), opened with
/// this code: migrated to this version, and then exactly a fresh store's
/// schema. Its clock starts a second after the fixtures were written.
async fn upgraded(fixture: &str) -> (tempfile::TempDir, ManualClock, Store) {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("store.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(fixture)
        .unwrap();
    let clock = ManualClock::new(V10_NOW + 1_000);
    let s = open(&path, &clock).await.unwrap();
    assert_eq!(s.schema_version().await.unwrap(), SCHEMA_VERSION);
    let fresh = d.path().join("fresh.db");
    open(&fresh, &clock).await.unwrap();
    assert_eq!(schema(&path), schema(&fresh));
    (d, clock, s)
}

#[tokio::test]
async fn the_schema_is_pinned_by_its_golden_file() {
    assert_eq!(SCHEMA_VERSION as usize, MIGRATIONS.len());
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("store.db");
    let s = open(&path, &ManualClock::new(0)).await.unwrap();
    assert_eq!(s.schema_version().await.unwrap(), SCHEMA_VERSION);
    let got = schema(&path);
    if std::env::var_os("BC_UPDATE_GOLDEN").is_some() {
        std::fs::write(GOLDEN, &got).unwrap();
    }
    let want = std::fs::read_to_string(GOLDEN).unwrap_or_default();
    assert!(
        got == want,
        "the store schema changed: if that is intended, add a migration (never edit one \
         that shipped), regenerate {GOLDEN} with BC_UPDATE_GOLDEN=1 and commit both\n\
         --- got ---\n{got}"
    );
    assert!(
        !got.contains("unixepoch"),
        "every stored time comes from compute_now()"
    );
}

/// The store the previous schema version wrote (see the fixture's header).
const V10: &str = include_str!("fixtures/schema-v10.sql");
/// When the fixture was written, on its store's clock.
const V10_NOW: i64 = 1_796_047_939_392;
const NODE: &str = "nd-d7e9042f69d6";

#[tokio::test]
async fn a_store_from_the_previous_version_opens_migrates_and_reads_back() {
    let (_d, clock, s) = upgraded(V10).await;

    // The bearer-token operator keeps its name and is revoked: no token
    // is accepted after migration 0016.
    let ops = s.list_operators().await.unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(
        (ops[0].id.as_str(), ops[0].cert_sha256.as_deref()),
        ("admin", None)
    );
    assert!(ops[0].revoked_at.is_some());
    let nodes = s.list_nodes().await.unwrap().nodes;
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(
        (
            n.node_id.as_str(),
            n.hostname.as_str(),
            n.state.as_str(),
            n.epoch
        ),
        (NODE, "gpu-a-01", "disconnected", 1)
    );
    assert_eq!((n.agent_version.as_str(), n.release_floor), ("0.1.0", 1));
    assert_eq!(n.cert_not_after_ms, 1_796_134_339_376);
    let cert = s.check_cert(&"f1".repeat(32)).await.unwrap();
    assert_eq!(
        (cert.node_id.as_str(), cert.serial.as_str()),
        (NODE, "0123456789abcdef0123456789abcdef")
    );
    let session = s.session(&NodeId::from(NODE)).await.unwrap().unwrap();
    assert_eq!((session.epoch, session.gateway_id.as_str()), (1, "gw-1"));
    let inv = s
        .inventory(
            &NodeId::from(NODE),
            bcd_core::report::InventorySection::Gpus,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(inv.sha256, "9a");
    assert!(String::from_utf8_lossy(&inv.body).contains("0000:17:00.0"));

    let commands = s
        .list_commands(Some(&NodeId::from(NODE)), 10)
        .await
        .unwrap();
    let states: Vec<(u64, &str, &str)> = commands
        .iter()
        .map(|c| (c.seq, c.kind.text(), c.state.text()))
        .collect();
    assert_eq!(
        states,
        [
            (3, "daemon.upgrade", "pending"),
            (2, "node.reboot", "pending"),
            (1, "exec.run", "succeeded"),
        ]
    );
    let done = s
        .get_command(&CommandId::from("cmd-07e170d3e2eb9bcd"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (done.output.as_slice(), done.exit_code),
        (&b"ok\n"[..], Some(0))
    );
    // It finished before results kept their node's signature: migration
    // 0026 listed it, and the commands still pending are not listed.
    assert!(done.legacy && done.signed_result.is_none());
    assert!(commands.iter().filter(|c| c.legacy).count() == 1);

    let spec = s.spec_view(&NodeId::from(NODE)).await.unwrap().unwrap();
    assert_eq!((spec.desired_generation, spec.applied_generation), (1, 1));
    assert_eq!(spec.assignments[0].allocation_id, "job-a");
    assert_eq!(
        spec.assignments[0].env.get("A").map(String::as_str),
        Some("1")
    );
    assert_eq!(spec.access.users[0].name, "ops");
    assert_eq!(spec.sections[0].status, "OBSERVED");
    assert_eq!(
        s.signed_spec(&NodeId::from(NODE)).await.unwrap(),
        Some((1, b"signed-spec".to_vec()))
    );
    let bindings = s.bindings(&NodeId::from(NODE)).await.unwrap();
    assert_eq!(
        (
            bindings[0].allocation_id.as_str(),
            bindings[0].state.as_str()
        ),
        ("job-a", "active")
    );
    assert_eq!(bindings[0].gpus, vec!["GPU-0".to_string()]);
    assert_eq!(
        s.fleet_events(&NodeId::from(NODE), 10).await.unwrap(),
        vec!["reservation.binding-rejected: allocation job-b: unsigned report".to_string()]
    );
    let events = s.node_events(&NodeId::from(NODE)).await.unwrap();
    assert_eq!(
        (events[0].kind.as_str(), events[0].event_id),
        ("command.accepted", 1)
    );

    let releases = s.list_releases().await.unwrap();
    assert_eq!(
        (releases[0].sequence, releases[0].version.as_str()),
        (ReleaseSeq::new(2), "0.2.0")
    );
    assert_eq!(
        s.release(ReleaseSeq::new(2)).await.unwrap().unwrap().binary,
        b"\x7fELF"
    );
    let image = "c".repeat(64);
    let images = s.list_images().await.unwrap();
    assert_eq!(
        (images[0].image_id.as_str(), images[0].name.as_str()),
        (image.as_str(), "bcd-node")
    );
    assert_eq!(images[0].assigned_to, vec!["default".to_string()]);
    let assigned = s.image_for_mac("52:54:00:12:34:56").await.unwrap().unwrap();
    assert_eq!(
        (assigned.image_id.as_str(), assigned.append.as_str()),
        (image.as_str(), "bcd.state=state")
    );
    assert_eq!(
        s.image_artifact(&images[0].kernel_sha256)
            .await
            .unwrap()
            .as_deref(),
        Some(&b"kernel"[..])
    );
    assert_eq!(s.boots(None, 10).await.unwrap()[0].outcome, "script");
    let rollout = s.rollout("ro-188cf3d9e009").await.unwrap().unwrap();
    assert_eq!(
        (rollout.sequence, rollout.waves.clone()),
        (ReleaseSeq::new(2), vec![50, 100])
    );
    assert_eq!(
        rollout.nodes[0].command_id.as_deref(),
        Some("cmd-d7332f5887e9fe8d")
    );
    assert_eq!(
        rollout.nodes[0].status,
        bc_store::rollouts::NodeStatus::Upgrading
    );
    let snap = s.audit_snapshot().await.unwrap();
    assert_eq!(snap.audit.len(), 8, "the history is kept");
    // ... and sealed into the audit chain, in the order it was written.
    assert_eq!(
        bc_store::audit::verify_chain(&snap.audit, &snap.heads),
        Vec::<String>::new()
    );
    // The single chain of migration 0013 (chain 0), closed since 0019.
    assert_eq!((snap.heads[0].chain, snap.heads[0].seq), (0, 8));
    assert!(snap.audit.iter().all(|r| r.chain == 0));

    // The upgraded store works, and its triggers use the store's clock.
    let t = s
        .renew_lease("gateway:gw-2", "gw-2", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(t, Some(V10_NOW + 1_000));
    let h = bc_store::sessions::HelloInput {
        node_id: NODE.into(),
        cert_fingerprint: "f1".repeat(32),
        cert_serial: "0123456789abcdef0123456789abcdef".into(),
        gateway_id: "gw-2".into(),
        incarnation_id: "inc-2".into(),
        boot_id: "boot-2".into(),
        journal_id: "journal-1".into(),
        agent_version: "0.2.0".into(),
        last_epoch: 1,
        inventory_hashes: vec![("gpus".into(), "9a".into())],
        journal_running: vec![],
        journal_done: vec![],
        daemon_exits: 0,
        proof: None,
    };
    clock.advance(Duration::from_millis(5));
    let out = s.hello(&h).await.unwrap();
    assert_eq!(out.epoch, 2);
    assert!(out.inventory_wanted.is_empty());
    let snap = s.audit_snapshot().await.unwrap();
    let route = snap.audit.iter().rev().find(|a| a.kind == "route").unwrap();
    assert_eq!((route.epoch, route.at), (2, V10_NOW + 1_005));
    assert!(bc_store::audit::verify_chain(&snap.audit, &snap.heads).is_empty());
    // Later records go into the chains after it; chain 0 takes no more.
    assert_eq!(snap.heads[0].seq, 8);
    assert!(snap.heads[1..].iter().map(|h| h.seq).sum::<i64>() > 0);
    assert_eq!(route.chain, bc_store::audit::chain_of(NODE, ""));
}

/// The store the version before this one wrote (see the fixture's header).
const V11: &str = include_str!("fixtures/schema-v11.sql");

#[tokio::test]
async fn a_store_from_version_11_migrates_and_its_specs_are_signed_again() {
    let (_d, _, s) = upgraded(V11).await;
    // A spec signed before specs expired has no expiry: it is due at once.
    assert_eq!(
        s.specs_expiring(bc_store::specs::RESIGN_WITHIN)
            .await
            .unwrap(),
        vec![NODE.to_string()]
    );
    let (generation, body) = s
        .update_spec(
            &NodeId::from(NODE),
            Box::new(|_| Ok(())),
            // What the fixture's worker signed: generation 1 of this body.
            Box::new(|signed| {
                assert_eq!(signed, b"signed-spec");
                Ok(bc_store::specs::OpenedSpec {
                    generation: 1,
                    body: bc_store::specs::SpecBody {
                        assignments: vec![bc_store::specs::Assignment {
                            allocation_id: "job-a".into(),
                            gpus: vec!["0".into()],
                            env: [("A".to_string(), "1".to_string())].into(),
                            secrets: Vec::new(),
                        }],
                        access: Default::default(),
                        intent: Default::default(),
                    },
                })
            }),
            Box::new(|_, _| b"resigned".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(
        (generation, body.assignments.len()),
        (2, 1),
        "the same body, a new generation"
    );
    assert!(
        s.specs_expiring(bc_store::specs::RESIGN_WITHIN)
            .await
            .unwrap()
            .is_empty()
    );
    // The state report it held still reads, and a report of any session
    // applies over it (it predates report epochs).
    assert_eq!(
        s.spec_view(&NodeId::from(NODE))
            .await
            .unwrap()
            .unwrap()
            .applied_generation,
        1
    );
    // The certificate revoked by a deletion from then has no statement.
    assert!(s.check_cert(&"f1".repeat(32)).await.is_ok());
    assert!(
        s.delete_node(&NodeId::from(NODE), Box::new(|_| b"st".to_vec()))
            .await
            .unwrap()
    );
    assert_eq!(
        s.check_cert(&"f1".repeat(32)).await.unwrap_err().refusal(),
        Some(&bc_store::Refusal::DeletedNode(
            NODE.into(),
            Some(b"st".to_vec())
        ))
    );
}

#[tokio::test]
async fn a_store_from_a_newer_binary_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("store.db");
    let clock = ManualClock::new(0);
    drop(open(&path, &clock).await.unwrap());
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    match open(&path, &clock).await {
        Err(e @ StoreError::TooNew { .. }) => {
            assert!(e.to_string().contains("run a newer better-compute"), "{e}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A database failure while a binding is judged is a store error: the
/// binding stays as it was and nothing is recorded against the node.
#[tokio::test]
async fn a_store_failure_while_judging_a_binding_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("store.db");
    let s = open(&path, &ManualClock::new(1_000)).await.unwrap();
    let node = bc_store::fixtures::enroll(&s, 0).await.unwrap();
    fn verify(cert: &[u8], _message: &[u8], signature: &[u8]) -> bool {
        cert == signature
    }
    let report = |nonce: &str, signature: &[u8]| BindingInput {
        session_node: node.clone(),
        report: Some(BindingReport {
            node_id: node.clone(),
            allocation_id: "job-a".into(),
            gpu_uuids: vec!["GPU-1".into()],
            spec_generation: 1,
            nonce: nonce.into(),
        }),
        payload: nonce.as_bytes().to_vec(),
        signature: signature.to_vec(),
    };
    assert_eq!(
        s.record_binding(&report("n1", &bc_store::fixtures::cert(0).der), verify)
            .await
            .unwrap(),
        BindingOutcome::Accepted
    );
    // The certificates cannot be read: the store fails mid-judgement.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("ALTER TABLE node_certs RENAME TO node_certs_away")
        .unwrap();
    let err = s
        .record_binding(&report("n2", b"forged"), verify)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
    assert_eq!(s.bindings(&node).await.unwrap()[0].state, "active");
    assert!(s.fleet_events(&node, 10).await.unwrap().is_empty());
    // Once the store works, the same forged report is judged as one.
    raw.execute_batch("ALTER TABLE node_certs_away RENAME TO node_certs")
        .unwrap();
    assert!(matches!(
        s.record_binding(&report("n2", b"forged"), verify)
            .await
            .unwrap(),
        BindingOutcome::MarkedLost(_)
    ));
}

/// Writes share commits; one that panics (a sealer, say) is undone alone
/// and the writer goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_panics_changes_nothing_and_the_others_commit() {
    let d = tempfile::tempdir().unwrap();
    let s = open(&d.path().join("store.db"), &ManualClock::new(1_000))
        .await
        .unwrap();
    let token = |id: &str| NewToken {
        id: id.into(),
        secret_sha256: "h".into(),
        ttl: Duration::from_secs(60),
        uses: 1,
        description: String::new(),
        pool: None,
    };
    let join = |id: &str| JoinInput {
        token_id: id.into(),
        secret_sha256: "h".into(),
        hostname: "h".into(),
        ramdisk: false,
        macs: Vec::new(),
    };
    for id in ["a", "b", "c"] {
        s.create_token(&token(id)).await.unwrap();
    }
    let cert = |n: &str| IssuedCert {
        der: vec![],
        serial: n.into(),
        fingerprint: n.into(),
        not_before_ms: 0,
        not_after_ms: i64::MAX / 2,
    };
    let (ca, cc) = (cert("a"), cert("c"));
    let (ja, jb, jc) = (join("a"), join("b"), join("c"));
    let (a, b, c) = tokio::join!(
        s.join(&ja, Box::new(move |_, _| Ok(ca))),
        s.join(
            &jb,
            Box::new(|_, _| panic!("the certificate builder fails hard"))
        ),
        s.join(&jc, Box::new(move |_, _| Ok(cc))),
    );
    assert!(a.is_ok() && c.is_ok());
    assert!(b.is_err(), "the panicking write fails");
    assert_eq!(s.list_nodes().await.unwrap().nodes.len(), 2);
    // Its token was not spent: the join it tried changed nothing.
    let cb = cert("b");
    s.join(&jb, Box::new(move |_, _| Ok(cb)))
        .await
        .expect("the token is still there");
}

/// The store version 12 wrote (see the fixture's header).
const V12: &str = include_str!("fixtures/schema-v12.sql");

#[tokio::test]
async fn a_store_from_version_12_migrates_with_no_backup_sets_and_records_one() {
    let (_d, _, s) = upgraded(V12).await;
    let nodes = s.list_nodes().await.unwrap().nodes;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].node_id, NODE);
    assert!(s.backups().await.unwrap().is_empty());
    let b = s
        .begin_backup(&bc_store::backups::NewBackup {
            id: "bk-1".into(),
            location: "/b/bk-1".into(),
            host: "h".into(),
            process: "1:1".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        (b.state.as_str(), b.created_at),
        ("CREATING", V10_NOW + 1_000)
    );
    // The upgraded store dumps and takes its own dump back.
    let dump = s.dump().await.unwrap();
    assert_eq!(dump.schema_version, SCHEMA_VERSION);
    s.restore(dump).await.unwrap();
    assert_eq!(s.list_nodes().await.unwrap().nodes.len(), 1);
}

/// A command a Hello ended before a Hello's endings kept its proof (after
/// migration 0026 listed the results from before signed results, before
/// 0029): 0029 lists it with the legacy results, so it reads as the row it
/// was, not as forged; a pending command is not listed, and the list takes
/// no row after it.
#[tokio::test]
async fn a_hello_ending_from_before_hello_proofs_reads_as_legacy() {
    let (d, _clock, s) = upgraded(V12).await;
    let path = d.path().join("store.db");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.create_scalar_function(
        "compute_now",
        0,
        rusqlite::functions::FunctionFlags::SQLITE_UTF8,
        |_| Ok(V10_NOW),
    )
    .unwrap();
    bc_store::sqlite::audit_functions(&c).unwrap();
    // What a Hello of that version wrote: the pending reboot, rebooted.
    c.execute(
        "UPDATE commands SET state = 'succeeded', reason = 'rebooted', result_at = created_at
         WHERE id = 'cmd-0f8691a0b2177a5d'",
        [],
    )
    .unwrap();
    let listed = |s: &Store| {
        let s = s.clone();
        async move {
            s.get_command(&CommandId::from("cmd-0f8691a0b2177a5d"))
                .await
                .unwrap()
                .unwrap()
                .legacy
        }
    };
    assert!(
        !listed(&s).await,
        "0026 listed only what had finished by then"
    );
    // Migration 0029, as it runs on a store at version 28.
    c.execute_batch(MIGRATIONS[28]).unwrap();
    assert!(listed(&s).await);
    let commands = s
        .list_commands(Some(&NodeId::from(NODE)), 10)
        .await
        .unwrap();
    assert_eq!(commands.iter().filter(|c| c.legacy).count(), 2);
    assert!(
        !commands
            .iter()
            .any(|c| c.state.text() == "pending" && c.legacy)
    );
    let e = c
        .execute(
            "INSERT INTO legacy_results (command_id) VALUES ('cmd-d7332f5887e9fe8d')",
            [],
        )
        .unwrap_err();
    assert!(e.to_string().contains("written once"), "{e}");
}
