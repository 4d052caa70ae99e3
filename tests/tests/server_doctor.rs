//! `better-compute doctor` against control planes made for real: a healthy
//! one (exit 0, `--json` parsed), one whose CA key was deleted, one whose
//! serving certificate ran out, a store that is not there and one that
//! cannot be reached (failures with clean text: no address, credentials
//! or driver words), and a data directory it must leave as it found it.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use bc_tests::{bin, setup_dirs, stderr, wait_for};
use rustls_pki_types::pem::PemObject;

fn doctor(dir: &Path, store: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(bin("better-compute"));
    if let Some(s) = store {
        c.env("BC_STORE", s);
    } else {
        c.env_remove("BC_STORE");
    }
    c.arg("--data-dir")
        .arg(dir)
        .arg("doctor")
        .args(args)
        .output()
        .expect("run better-compute doctor")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        )
    })
}

fn check<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {report}"))
}

#[test]
fn a_healthy_control_plane_is_all_ok() {
    let (_d, server) = setup_dirs();
    // The controllers' leases are taken within their TTL (1.5 s here).
    let out = wait_for(Duration::from_secs(20), "doctor all ok", || {
        let out = doctor(&server.dir, None, &["--json"]);
        (out.status.code() == Some(0)).then_some(out)
    });
    let report = json(&out);
    assert_eq!(report["status"], "ok", "{report}");
    for name in [
        "ca",
        "serving-cert",
        "store",
        "gateways",
        "controllers",
        "clock",
        "releases",
        "images",
    ] {
        assert_eq!(check(&report, name)["status"], "ok", "{name}: {report}");
    }
    assert!(
        check(&report, "store")["summary"]
            .as_str()
            .unwrap()
            .contains("every migration applied"),
        "{report}"
    );
    let gateways = check(&report, "gateways")["summary"].as_str().unwrap();
    assert!(gateways.starts_with("1 live: gw-"), "{gateways}");
    let controllers = check(&report, "controllers")["summary"].as_str().unwrap();
    assert!(controllers.contains("liveness by gw-"), "{controllers}");
    let text = doctor(&server.dir, None, &[]);
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("ok    ca "), "{text}");
    assert!(text.ends_with("8 checks: 8 ok, 0 warn, 0 fail\n"), "{text}");
}

#[test]
fn a_deleted_ca_key_fails_with_what_to_do() {
    let (_d, mut server) = setup_dirs();
    server.proc.stop();
    std::fs::remove_file(server.dir.join("ca.key")).unwrap();
    let out = doctor(&server.dir, None, &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report = json(&out);
    let ca = check(&report, "ca");
    assert_eq!(ca["status"], "fail");
    assert!(
        ca["summary"]
            .as_str()
            .unwrap()
            .starts_with("ca.key is missing from"),
        "{ca}"
    );
    assert!(
        ca["next"].as_str().unwrap().contains("restore ca.key"),
        "{ca}"
    );
    // A stopped gateway gave its lease back: nothing serves.
    assert_eq!(check(&report, "gateways")["status"], "warn", "{report}");
    let text = String::from_utf8(doctor(&server.dir, None, &[]).stdout).unwrap();
    assert!(
        text.contains("fail  ca           ca.key is missing"),
        "{text}"
    );
}

#[test]
fn an_expired_serving_certificate_fails() {
    let (_d, mut server) = setup_dirs();
    server.proc.stop();
    // A serving certificate from this CA that ran out a day ago.
    let dir = &server.dir;
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(dir.join("ca.key")).unwrap()).unwrap();
    let ca_der = rustls_pki_types::CertificateDer::from_pem_slice(
        &std::fs::read(dir.join("ca.crt")).unwrap(),
    )
    .unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_der(&ca_der, &ca_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params =
        rcgen::CertificateParams::new(vec!["gateway.better-compute.internal".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("gateway.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("gateway.key"), key.serialize_pem()).unwrap();

    let out = doctor(dir, None, &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report = json(&out);
    let serving = check(&report, "serving-cert");
    assert_eq!(serving["status"], "fail", "{serving}");
    let summary = serving["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("the serving certificate is expired at"),
        "{summary}"
    );
    assert!(
        serving["next"]
            .as_str()
            .unwrap()
            .contains("restart better-compute serve"),
        "{serving}"
    );
    assert_eq!(check(&report, "ca")["status"], "ok", "{report}");
}

#[test]
fn an_unreachable_store_fails_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("server");
    let server = bc_tests::Server::start(&dir, bc_tests::FAST).unwrap();
    let url = "postgres://fleet:hunter2@127.0.0.1:9/fleetdb?application_name=probe";
    for args in [&["--json"][..], &[][..]] {
        let out = doctor(&server.dir, Some(url), args);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        for leak in [
            "hunter2",
            "127.0.0.1:9",
            "postgres://",
            "fleetdb",
            "fleet:",
            "refused",
            "tokio",
            "db error",
            "SELECT",
            "panicked",
        ] {
            assert!(!all.contains(leak), "{leak:?} in:\n{all}");
        }
        if args == ["--json"] {
            let report = json(&out);
            let store = check(&report, "store");
            assert_eq!(store["status"], "fail", "{report}");
            let summary = store["summary"].as_str().unwrap();
            assert!(
                summary.starts_with("the PostgreSQL store does not answer")
                    || summary.starts_with("the PostgreSQL store cannot be opened"),
                "{summary}"
            );
            assert!(
                store["next"]
                    .as_str()
                    .unwrap()
                    .contains("check that the database runs"),
                "{store}"
            );
            // What depends on the store is named as not checked.
            assert_eq!(check(&report, "controllers")["status"], "warn");
            // The certificates are still checked.
            assert_eq!(check(&report, "ca")["status"], "ok");
        }
    }
}

#[test]
fn a_missing_store_fails_and_nothing_is_written() {
    let d = tempfile::tempdir().unwrap();
    let out = doctor(d.path(), None, &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report = json(&out);
    let store = check(&report, "store");
    assert_eq!(store["status"], "fail");
    assert!(
        store["summary"]
            .as_str()
            .unwrap()
            .starts_with("there is no store: the SQLite store"),
        "{store}"
    );
    assert_eq!(check(&report, "ca")["status"], "fail");
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        0,
        "doctor wrote into the data directory"
    );
}

/// On PostgreSQL: doctor reads the store (and this host's clock against
/// the database's), `/readyz` follows the database going away and coming
/// back, and while it is away doctor fails the store without naming it.
#[test]
fn on_postgres_doctor_and_readiness_follow_the_database() {
    use bc_store::postgres::cluster::{ClusterOptions, TempCluster};
    let mut cluster = TempCluster::start(ClusterOptions {
        durable: false,
        ..Default::default()
    })
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = rt.block_on(cluster.create_database("doctor")).unwrap();
    let secret = cluster.dir().display().to_string();
    let d = tempfile::tempdir().unwrap();
    let server =
        bc_tests::Server::start_postgres(&d.path().join("server"), &url, bc_tests::FAST).unwrap();
    let http = server.http.expect("the http listener");
    let readyz = |code: u16| {
        move || {
            let mut s = std::net::TcpStream::connect(http).ok()?;
            use std::io::{Read, Write};
            s.write_all(b"GET /readyz HTTP/1.1\r\nHost: bc\r\nConnection: close\r\n\r\n")
                .ok()?;
            let mut r = String::new();
            s.read_to_string(&mut r).ok()?;
            let (head, body) = r.split_once("\r\n\r\n")?;
            head.starts_with(&format!("HTTP/1.1 {code} "))
                .then(|| body.to_string())
        }
    };
    wait_for(Duration::from_secs(20), "ready", readyz(200));
    let out = wait_for(Duration::from_secs(20), "doctor all ok", || {
        let out = doctor(&server.dir, Some(&url), &["--json"]);
        (out.status.code() == Some(0)).then_some(out)
    });
    let report = json(&out);
    let store = check(&report, "store")["summary"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        store.starts_with("the PostgreSQL store answers; schema "),
        "{store}"
    );
    let clock = check(&report, "clock")["summary"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        clock.starts_with("this host's clock is ") && clock.ends_with(" s off the store's"),
        "{clock}"
    );

    cluster.stop().unwrap();
    // The probe sees the store gone at once; the gateway fences within
    // half its lease TTL.
    let not_ready = readyz(503);
    let why = wait_for(Duration::from_secs(20), "not ready, fenced", || {
        not_ready().filter(|b| b.contains("gateway lease: not held (fenced)"))
    });
    assert_eq!(
        why,
        "not ready\nstore: unreachable\ngateway lease: not held (fenced)\n"
    );
    let out = doctor(&server.dir, Some(&url), &[]);
    assert_eq!(out.status.code(), Some(1));
    let all = format!(
        "{why}{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    assert!(
        all.contains("fail  store        the PostgreSQL store"),
        "{all}"
    );
    for leak in [
        secret.as_str(),
        "postgresql://",
        "doctor?",
        "user=",
        "socket",
        "SELECT",
        "db error",
    ] {
        assert!(!all.contains(leak), "{leak:?} in:\n{all}");
    }

    cluster.start_again().unwrap();
    wait_for(Duration::from_secs(30), "ready again", readyz(200));
}

/// Releases are checked with the key `serve` recorded (or one given): a
/// registered release verifies; without any key doctor says so; a binary
/// changed in the store fails.
#[test]
fn releases_are_verified_with_the_recorded_keys() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("release.key");
    let out = Command::new(bin("better-compute"))
        .args(["releases", "keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let public = std::fs::read_to_string(d.path().join("release.key.pub")).unwrap();
    let mut server = bc_tests::Server::start(
        &d.path().join("server"),
        &["--release-pubkey", public.trim()],
    )
    .unwrap();
    let manifest = d.path().join("m.json");
    let k = key.to_str().unwrap();
    let m = manifest.to_str().unwrap();
    for args in [
        &[
            "releases",
            "sign",
            "--key",
            k,
            "--binary",
            "/bin/true",
            "--version",
            "0.2.0",
            "--sequence",
            "2",
            "--out",
            m,
        ][..],
        &[
            "releases",
            "register",
            "--manifest",
            m,
            "--binary",
            "/bin/true",
        ][..],
    ] {
        let out = server.cli(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    let report = json(&doctor(&server.dir, None, &["--json"]));
    let releases = check(&report, "releases");
    assert_eq!(releases["status"], "ok", "{report}");
    assert_eq!(
        releases["summary"],
        "1 releases verify and match their binaries"
    );
    server.proc.stop();

    // No key recorded and none given: not checked, and said so.
    let keys = std::fs::read(server.dir.join("keys.json")).unwrap();
    std::fs::remove_file(server.dir.join("keys.json")).unwrap();
    let report = json(&doctor(&server.dir, None, &["--json"]));
    let releases = check(&report, "releases");
    assert_eq!(releases["status"], "warn", "{report}");
    assert!(
        releases["next"]
            .as_str()
            .unwrap()
            .contains("--release-pubkey"),
        "{releases}"
    );
    // The key on the command line does as well as the recorded one.
    let out = doctor(
        &server.dir,
        None,
        &["--json", "--release-pubkey", public.trim()],
    );
    assert_eq!(check(&json(&out), "releases")["status"], "ok");
    std::fs::write(server.dir.join("keys.json"), keys).unwrap();

    // The binary edited in the store.
    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    db.execute(
        "UPDATE releases SET binary = X'7f454c46' WHERE sequence = 2",
        [],
    )
    .unwrap();
    drop(db);
    let out = doctor(&server.dir, None, &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report = json(&out);
    let releases = check(&report, "releases");
    assert_eq!(releases["status"], "fail", "{report}");
    let summary = releases["summary"].as_str().unwrap();
    assert!(summary.starts_with("release 2: "), "{summary}");
}
