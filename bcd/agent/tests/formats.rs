//! Every format the agent persists, pinned by golden files and read back
//! from every earlier version: `identity.json`, `update.json` with the
//! slots layout, and `journal.db`'s schema.
//!
//! The golden files are what this code writes; when a test here fails
//! because the output changed, the change is a new format version (see the
//! `# Format versions` section of the module concerned) with a golden file
//! of its own, not an edit of an existing one. Fixtures named after a commit were written by the code
//! at that commit.

use std::fs;
use std::path::{Path, PathBuf};

use bcd_agent::identity::{self, ClockBase, Identity, IdentityError, IdentityFile, ReplayFloors};
use bcd_agent::journal::{self, Journal, JournalError};
use bcd_agent::slots::{SlotError, Slots};
use bcd_core::command::Journaled;
use bcd_core::update::{Pending, Slot, UpdateState};

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

fn golden(rel: &str) -> String {
    fs::read_to_string(testdata(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Compares `actual` with the golden file, byte for byte. A new format
/// version adds its golden file with `BCD_WRITE_GOLDEN=1` (which writes
/// only files that do not exist yet).
fn assert_golden(rel: &str, actual: &str) {
    let path = testdata(rel);
    if std::env::var_os("BCD_WRITE_GOLDEN").is_some() && !path.exists() {
        fs::write(&path, actual).unwrap();
    }
    let expected = golden(rel);
    assert!(
        expected == actual,
        "{rel} differs from what the code writes now: a changed format is a new format \
         version with a migration, not an edited golden file.\n--- golden\n{expected}\n--- now\n{actual}"
    );
}

/// A data directory holding a key, a certificate for it and a CA, with
/// `identity.json` copied from a fixture.
fn data_dir_with(fixture: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["node".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    fs::write(d.path().join(identity::KEY), key.serialize_pem()).unwrap();
    fs::write(
        d.path().join(identity::CERT),
        identity::pem("CERTIFICATE", cert.der()),
    )
    .unwrap();
    fs::write(
        d.path().join(identity::CA),
        identity::pem("CERTIFICATE", cert.der()),
    )
    .unwrap();
    fs::copy(testdata(fixture), d.path().join(identity::IDENTITY)).unwrap();
    d
}

fn sample_identity() -> IdentityFile {
    IdentityFile {
        version: identity::IDENTITY_VERSION,
        node_id: "nd-0f3a9c".into(),
        server: "https://gw.example:7443".into(),
        cert_serial: "5a17c0de".into(),
        cert_not_after_ms: 1_790_086_400_000,
        identity_generation: 1,
        server_time_mark_ms: 1_790_000_123_456,
        last_epoch: 7,
        ramdisk: false,
        worker_keys: vec!["11".repeat(32)],
        release_keys: vec!["22".repeat(32)],
        image_keys: vec![],
        cert_issued_ms: 1_790_000_000_000,
        next: None,
        replay_floors: ReplayFloors {
            command_seq: 40,
            spec_generation: 4,
        },
        clock_base: Some(ClockBase {
            boot_id: "0f3a9c1e-2b4d-4f6a-8c0e-1a2b3c4d5e6f".into(),
            boot_ms: 86_400_000,
            server_ms: 1_790_000_063_456,
        }),
        hello_seq: 0,
        last_boot_id: String::new(),
        last_journal_id: String::new(),
    }
}

/// What a version 1 file holds of [`sample_identity`].
fn sample_identity_v1() -> IdentityFile {
    IdentityFile {
        version: 1,
        replay_floors: ReplayFloors::default(),
        clock_base: None,
        ..sample_identity()
    }
}

#[test]
fn identity_is_written_as_the_golden_files() {
    let d = data_dir_with("identity/v1-4e03bc7.json");
    let mut id = Identity::load(d.path()).unwrap();
    id.file = sample_identity();
    id.save_state().unwrap();
    let written = fs::read_to_string(d.path().join(identity::IDENTITY)).unwrap();
    assert_golden("identity/v2.json", &written);
    assert_eq!(Identity::load(d.path()).unwrap().file, sample_identity());
    // An unconfirmed upgrade writes what the release before it reads.
    id.write_version = 1;
    id.save_state().unwrap();
    let written = fs::read_to_string(d.path().join(identity::IDENTITY)).unwrap();
    assert_golden("identity/v1.json", &written);
}

/// The image keys learned at join, in both versions; a file without them
/// (all the golden files above, and every file an earlier release wrote)
/// loads with none.
#[test]
fn image_keys_are_written_only_when_learned_and_read_back() {
    let d = data_dir_with("identity/v1-4e03bc7.json");
    let mut id = Identity::load(d.path()).unwrap();
    assert!(id.file.image_keys.is_empty());
    let with_keys = IdentityFile {
        image_keys: vec!["33".repeat(32)],
        ..sample_identity()
    };
    id.file = with_keys.clone();
    id.save_state().unwrap();
    let written = fs::read_to_string(d.path().join(identity::IDENTITY)).unwrap();
    assert_golden("identity/v2-image-keys.json", &written);
    assert_eq!(Identity::load(d.path()).unwrap().file, with_keys);
    // An unconfirmed upgrade keeps them in what the release before it
    // reads (which ignores them).
    id.write_version = 1;
    id.save_state().unwrap();
    let written = fs::read_to_string(d.path().join(identity::IDENTITY)).unwrap();
    assert_golden("identity/v1-image-keys.json", &written);
    assert_eq!(
        Identity::load(d.path()).unwrap().file.image_keys,
        ["33".repeat(32)]
    );
    let d = data_dir_with("identity/v2.json");
    assert!(Identity::load(d.path()).unwrap().file.image_keys.is_empty());
}

/// The count of the node's signed Hellos and its last confirmed session,
/// in both versions; a file without them (every file an earlier release
/// wrote) loads with 0 and none.
#[test]
fn the_hello_count_is_written_once_counted_and_read_back() {
    let d = data_dir_with("identity/v1-4e03bc7.json");
    let mut id = Identity::load(d.path()).unwrap();
    assert_eq!(id.file.hello_seq, 0);
    let counted = IdentityFile {
        hello_seq: 41,
        ..sample_identity()
    };
    id.file = counted.clone();
    id.save_state().unwrap();
    let written = fs::read_to_string(d.path().join(identity::IDENTITY)).unwrap();
    assert_golden("identity/v2-hello-seq.json", &written);
    assert_eq!(Identity::load(d.path()).unwrap().file, counted);
    // An unconfirmed upgrade keeps it too: a count that went back would
    // sign a count twice.
    id.write_version = 1;
    id.save_state().unwrap();
    let written = fs::read_to_string(d.path().join(identity::IDENTITY)).unwrap();
    assert_golden("identity/v1-hello-seq.json", &written);
    assert_eq!(Identity::load(d.path()).unwrap().file.hello_seq, 41);
    let d = data_dir_with("identity/v2.json");
    assert_eq!(Identity::load(d.path()).unwrap().file.hello_seq, 0);
    // The boot and journal of the last confirmed session, likewise.
    let d = data_dir_with("identity/v1-4e03bc7.json");
    let mut id = Identity::load(d.path()).unwrap();
    let last = IdentityFile {
        hello_seq: 41,
        last_boot_id: "0f3a9c1e-2b4d-4f6a-8c0e-1a2b3c4d5e6f".into(),
        last_journal_id: "j-7".into(),
        ..sample_identity()
    };
    id.file = last.clone();
    id.save_state().unwrap();
    let written = fs::read_to_string(d.path().join(identity::IDENTITY)).unwrap();
    assert_golden("identity/v2-last-session.json", &written);
    assert_eq!(Identity::load(d.path()).unwrap().file, last);
    id.write_version = 1;
    id.save_state().unwrap();
    let written = fs::read_to_string(d.path().join(identity::IDENTITY)).unwrap();
    assert_golden("identity/v1-last-session.json", &written);
    let back = Identity::load(d.path()).unwrap().file;
    assert_eq!(
        (back.last_boot_id.as_str(), back.last_journal_id.as_str()),
        ("0f3a9c1e-2b4d-4f6a-8c0e-1a2b3c4d5e6f", "j-7")
    );
}

#[test]
fn floors_only_rise_and_are_written_when_they_do() {
    let d = data_dir_with("identity/v1-4e03bc7.json");
    let mut id = Identity::load(d.path()).unwrap();
    id.raise_floors(ReplayFloors {
        command_seq: 5,
        spec_generation: 2,
    })
    .unwrap();
    id.raise_floors(ReplayFloors {
        command_seq: 3,
        spec_generation: 7,
    })
    .unwrap();
    let back = Identity::load(d.path()).unwrap();
    assert_eq!(
        back.file.replay_floors,
        ReplayFloors {
            command_seq: 5,
            spec_generation: 7
        }
    );
    let before = fs::metadata(d.path().join(identity::IDENTITY))
        .unwrap()
        .modified()
        .unwrap();
    let mut id = back;
    id.raise_floors(ReplayFloors {
        command_seq: 1,
        spec_generation: 1,
    })
    .unwrap();
    let after = fs::metadata(d.path().join(identity::IDENTITY))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after, "nothing rose, nothing written");
}

#[test]
fn every_earlier_identity_reads_back() {
    // The first shape: no issue time, no release keys.
    let d = data_dir_with("identity/v1-0855ad5.json");
    let id = Identity::load(d.path()).unwrap();
    assert_eq!(id.file.node_id, "nd-0f3a9c");
    assert_eq!(id.file.server, "https://gw.example:7443");
    assert_eq!(id.file.cert_serial, "5a17c0de");
    assert_eq!(id.file.last_epoch, 7);
    assert_eq!(id.file.server_time_mark_ms, 1_790_000_123_456);
    assert_eq!(id.file.worker_keys, ["11".repeat(32)]);
    assert!(id.file.release_keys.is_empty());
    assert_eq!(id.file.cert_issued_ms, 0);
    // Without an issue time the life counts as the longest the CA gives.
    assert_eq!(id.cert_life().issued_ms, 1_790_086_400_000 - 24 * 3_600_000);

    // With the issue time (renewals), a ramdisk node.
    let d = data_dir_with("identity/v1-65dd535.json");
    let id = Identity::load(d.path()).unwrap();
    assert!(id.file.ramdisk);
    assert_eq!(id.cert_life().issued_ms, 1_790_079_200_000);
    assert!(id.file.release_keys.is_empty());

    // The last version 1 shape, and one in the middle of a renewal:
    // loading finishes it.
    let d = data_dir_with("identity/v1-4e03bc7.json");
    let id = Identity::load(d.path()).unwrap();
    assert_eq!(id.file, sample_identity_v1());
    // Version 2: the floors and the clock base.
    let d = data_dir_with("identity/v2.json");
    let id = Identity::load(d.path()).unwrap();
    assert_eq!(id.file, sample_identity());
    let d = data_dir_with("identity/v1-4e03bc7-renewing.json");
    let cert = fs::read(d.path().join(identity::CERT)).unwrap();
    fs::write(d.path().join("node.crt.next"), &cert).unwrap();
    fs::copy(d.path().join(identity::KEY), d.path().join("node.key.next")).unwrap();
    let id = Identity::load(d.path()).unwrap();
    assert_eq!(id.file.cert_serial, "5a17c0df");
    assert_eq!(id.file.cert_not_after_ms, 1_790_172_800_000);
    assert_eq!(id.file.next, None);
    // Saving writes the current version.
    id.save_state().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(d.path().join(identity::IDENTITY)).unwrap()).unwrap();
    assert_eq!(v["version"], identity::IDENTITY_VERSION);
}

#[test]
fn a_newer_identity_is_refused_and_left_alone() {
    let d = data_dir_with("identity/v3-future.json");
    let before = fs::read(d.path().join(identity::IDENTITY)).unwrap();
    let e = Identity::load(d.path()).unwrap_err();
    assert!(
        matches!(
            e,
            IdentityError::Newer {
                version: 3,
                known: 2,
                ..
            }
        ),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("written by a newer bcd") && text.contains("run that release of bcd"),
        "{text}"
    );
    assert_eq!(fs::read(d.path().join(identity::IDENTITY)).unwrap(), before);
}

fn sample_state() -> UpdateState {
    let mut s = UpdateState::new(Slot::A, 10, "0.1.0");
    s.begin("c-upgrade-1", 11, "0.2.0", 5_000, 120_000).unwrap();
    s.pending.as_mut().unwrap().next_key = Some("33".repeat(32));
    s.failed.insert(9);
    s
}

/// `find` as a person reads it: each entry under `slots/`, its type and
/// mode, and where links point.
fn listing(dir: &Path) -> String {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            use std::os::unix::fs::PermissionsExt;
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&p).unwrap();
            if meta.file_type().is_symlink() {
                out.push(format!("{rel} -> {}", fs::read_link(&p).unwrap().display()));
            } else if meta.is_dir() {
                out.push(format!("{rel}/"));
                walk(base, &p, out);
            } else {
                out.push(format!("{rel} {:o}", meta.permissions().mode() & 0o777));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.join("\n") + "\n"
}

#[test]
fn the_slots_are_laid_out_and_written_as_the_golden_files() {
    let d = tempfile::tempdir().unwrap();
    let slots = Slots::new(d.path());
    slots.init(b"bcd 0.1.0", 10, "0.1.0").unwrap();
    slots.write_slot(Slot::B, b"bcd 0.2.0").unwrap();
    let state = sample_state();
    slots.save(&state).unwrap();
    slots.point(Slot::B).unwrap();
    assert_golden("slots/layout-v1.txt", &listing(d.path()));
    assert_golden(
        "slots/update-v1.json",
        &fs::read_to_string(d.path().join("slots/update.json")).unwrap(),
    );
    assert_eq!(slots.load().unwrap(), state);
}

/// Slots written by today's release: the unversioned `update.json`.
fn slots_from(fixture: &str, link: &str) -> (tempfile::TempDir, Slots) {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("slots");
    fs::create_dir_all(dir.join("a")).unwrap();
    fs::create_dir_all(dir.join("b")).unwrap();
    fs::write(dir.join("a/bcd"), b"a").unwrap();
    fs::write(dir.join("b/bcd"), b"b").unwrap();
    std::os::unix::fs::symlink(link, dir.join("current")).unwrap();
    fs::copy(testdata(fixture), dir.join("update.json")).unwrap();
    let slots = Slots::new(d.path());
    (d, slots)
}

#[test]
fn every_earlier_update_state_reads_back_and_is_rewritten_as_the_current_version() {
    let (_d, slots) = slots_from("slots/update-v0-settled.json", "a");
    let s = slots.load().unwrap();
    assert_eq!(s, UpdateState::new(Slot::A, 10, "0.1.0"));

    let (d, slots) = slots_from("slots/update-v0-pending.json", "b");
    let s = slots.load().unwrap();
    assert_eq!(s, sample_state());
    assert_eq!(
        s.pending,
        Some(Pending {
            command_id: "c-upgrade-1".into(),
            from: Slot::A,
            from_sequence: 10,
            to: Slot::B,
            to_sequence: 11,
            to_version: "0.2.0".into(),
            next_key: Some("33".repeat(32)),
            deadline_ms: 125_000,
            starts: 0,
        })
    );
    slots.save(&s).unwrap();
    assert_golden(
        "slots/update-v1.json",
        &fs::read_to_string(d.path().join("slots/update.json")).unwrap(),
    );

    // The oldest shape of version 0: before versions, to_version and the
    // release key rotation were recorded.
    let (d, slots) = slots_from("slots/update-v0-settled.json", "b");
    fs::write(
        d.path().join("slots/update.json"),
        r#"{"sequences":[3,4],"floor":3,"failed":[],"pending":{"command_id":"c","from":"a","from_sequence":3,"to":"b","to_sequence":4,"deadline_ms":9,"starts":1}}"#,
    )
    .unwrap();
    let s = slots.load().unwrap();
    assert_eq!(s.versions, [String::new(), String::new()]);
    let p = s.pending.unwrap();
    assert_eq!((p.to_version.as_str(), p.next_key, p.starts), ("", None, 1));
}

#[test]
fn a_newer_update_state_is_refused() {
    let (d, slots) = slots_from("slots/update-v0-settled.json", "a");
    let mut v: serde_json::Value = serde_json::from_str(&golden("slots/update-v1.json")).unwrap();
    v["version"] = 2.into();
    v["channel"] = "beta".into();
    fs::write(d.path().join("slots/update.json"), v.to_string()).unwrap();
    let e = slots.load().unwrap_err();
    assert!(
        matches!(
            e,
            SlotError::Newer {
                version: 2,
                known: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("written by a newer bcd"), "{e}");
}

#[test]
fn the_journal_schema_is_the_golden_file() {
    let d = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&d.path().join("journal.db")).unwrap();
    let (version, schema) = j.schema().unwrap();
    assert_eq!(version, journal::SCHEMA_VERSION);
    assert_golden(&format!("journal/schema-v{version}.sql"), &schema);
}

#[test]
fn a_journal_from_before_schema_versions_migrates_and_reads_back() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("journal.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&golden("journal/v0-4e03bc7.sql"))
            .unwrap();
        let v: u32 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 0, "the fixture is unversioned");
    }
    let (j, opened) = Journal::open(&path).unwrap();
    assert_eq!(opened, journal::Opened::Existing);
    let (version, schema) = j.schema().unwrap();
    assert_eq!(version, journal::SCHEMA_VERSION);
    assert_golden(&format!("journal/schema-v{version}.sql"), &schema);
    // Everything it held reads back.
    assert_eq!(j.journal_id(), "417b50759c643b84ada2f2b76db59787");
    assert_eq!(j.highest_seq().unwrap(), 4);
    assert_eq!(j.applied_generation().unwrap(), 4);
    assert_eq!(j.spec().unwrap(), Some((5, b"signed-spec-5".to_vec())));
    let open: Vec<(String, Journaled)> = j
        .open_entries()
        .unwrap()
        .into_iter()
        .map(|e| (e.id, e.state))
        .collect();
    assert_eq!(
        open,
        [
            ("c-accepted".to_string(), Journaled::Accepted),
            (
                "c-running".to_string(),
                Journaled::Running {
                    boot_id: "boot-a".into()
                }
            ),
            ("c-done".to_string(), Journaled::Done { acked: false }),
        ]
    );
    let done = j.command("c-done").unwrap().unwrap();
    assert_eq!(done.result.as_deref(), Some(&b"result-3"[..]));
    assert_eq!(done.payload, b"payload-3");
    assert_eq!(
        j.command("c-acked").unwrap().unwrap().state,
        Journaled::Done { acked: true }
    );
    let events: Vec<(u64, String)> = j
        .events_after(0, 10)
        .unwrap()
        .into_iter()
        .map(|e| (e.id, e.kind))
        .collect();
    assert_eq!(
        events,
        [
            (1, "command.accepted".to_string()),
            (2, "node.load".into()),
            (3, "command.finished".into())
        ]
    );
    // It keeps working: ids continue.
    j.accept("c-new", 5, "exec.run", b"p").unwrap();
    assert_eq!(j.highest_seq().unwrap(), 5);
    drop(j);
    // Opening again migrates nothing and keeps it all.
    let (j, _) = Journal::open(&path).unwrap();
    assert_eq!(j.journal_id(), "417b50759c643b84ada2f2b76db59787");
    assert_eq!(j.open_entries().unwrap().len(), 4);
}

#[test]
fn a_journal_from_a_newer_bcd_is_refused_and_not_moved_aside() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("journal.db");
    {
        let (j, _) = Journal::open(&path).unwrap();
        j.accept("c1", 1, "exec.run", b"p").unwrap();
    }
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", journal::SCHEMA_VERSION + 1)
            .unwrap();
    }
    let e = Journal::open(&path).unwrap_err();
    assert!(matches!(e, JournalError::Newer { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("written by a newer bcd") && text.contains("journal-lost"),
        "{text}"
    );
    let names: Vec<String> = fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains("corrupt")),
        "nothing moved aside: {names:?}"
    );
}
