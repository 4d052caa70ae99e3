//! TPM access through the helper, against swtpm: the pure-Rust backend
//! over `Endpoint::Helper` reaches the same TPM as directly, a command
//! outside the allow-list never leaves, and `bcd doctor` words a node key
//! its TPM no longer derives (TPM2_Clear) with the spec's text; the
//! tss-esapi backend is refused through the helper, and a fresh connection
//! sees another TPM at the endpoint (through each backend built).
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bcd_agent::converge::{DeviceDirs, Nft, SshdDirs};
use bcd_agent::doctor;
use bcd_agent::helper::{AgentHandler, HandlerConfig};
use bcd_tpm::swtpm::Swtpm;
use bcd_tpm::{Endpoint, NodeKeyRecord, ProtocolTpm, Tpm};

fn handler(dir: &Path, tpm: Endpoint) -> AgentHandler {
    AgentHandler::new(HandlerConfig {
        data_dir: dir.join("data"),
        staging: dir.join("staging"),
        private: dir.join("private"),
        devices: DeviceDirs {
            cdi_dir: dir.join("cdi"),
            env_dir: dir.join("env"),
        },
        secrets: dir.join("secrets"),
        sshd: SshdDirs {
            etc_dir: dir.join("etc"),
            sshd: dir.join("no-sshd"),
        },
        nft: Nft {
            nft: dir.join("no-nft"),
        },
        host: bcd_agent::hw::real(dir.join("host")),
        power: Arc::new(bcd_agent::hw::SystemPower),
        system_bus: None,
        reboot: Default::default(),
        unit: "bcd.service".into(),
        tpm,
    })
}

/// Serves `handler` on a socket in `dir` for this process's user.
fn serve(dir: &Path, handler: AgentHandler) -> std::path::PathBuf {
    let socket = dir.join("helper.sock");
    let config = bcd_helper::ServerConfig::new(&socket, rustix::process::getuid().as_raw());
    let server = bcd_helper::Server::bind(config, handler).unwrap();
    tokio::spawn(server.serve());
    socket
}

/// swtpm serves one connection at a time: retries until the helper's
/// connection to it is gone.
fn direct(s: &Swtpm) -> ProtocolTpm {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ProtocolTpm::open(s.endpoint()).and_then(|mut t| t.ak_public().map(|_| t)) {
            Ok(t) => return t,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("swtpm: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpm_commands_reach_the_same_tpm_through_the_helper() {
    let d = tempfile::tempdir().unwrap();
    let s = Swtpm::start(&d.path().join("tpm")).unwrap();
    let socket = serve(d.path(), handler(d.path(), s.endpoint()));
    let record = NodeKeyRecord::from_unique([7; 32]);
    let sock = socket.clone();
    let r = record.clone();
    let (ak, key) = tokio::task::spawn_blocking(move || {
        let mut tpm = ProtocolTpm::open(Endpoint::Helper(sock)).unwrap();
        let ak = tpm.ak_public().unwrap().name();
        let key = tpm.node_key_public(&r).unwrap().spki_der();
        (ak, key)
    })
    .await
    .unwrap();
    let (ak2, key2) = tokio::task::spawn_blocking(move || {
        let mut tpm = direct(&s);
        let ak = tpm.ak_public().unwrap().name();
        (ak, tpm.node_key_public(&record).unwrap().spki_der())
    })
    .await
    .unwrap();
    assert_eq!(ak, ak2);
    assert_eq!(key, key2);
    assert!(key.is_some());

    // TPM2_Clear is not a command bcd sends: refused before it leaves.
    let e = tokio::task::spawn_blocking(move || {
        let mut session =
            bcd_helper::TpmSession::open(&bcd_helper::ClientConfig::new(&socket)).unwrap();
        let clear = [0x80, 0x01, 0, 0, 0, 10, 0, 0, 0x01, 0x26];
        session.transceive(&clear).unwrap_err()
    })
    .await
    .unwrap();
    assert!(e.is_invalid(), "{e}");
    assert!(e.to_string().contains("is not one bcd sends"), "{e}");
}

/// A P-256 public key by its point, as the TPM derives it.
struct P256Point(Vec<u8>);

impl rcgen::PublicKeyData for P256Point {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

/// A data directory whose node key is a TPM record and whose certificate
/// holds the key that record derives now.
fn tpm_identity(dir: &Path, spki: &[u8]) {
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
    std::fs::create_dir_all(dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    // A P-256 SubjectPublicKeyInfo ends with the 65-byte point.
    let public = P256Point(spki[spki.len() - 65..].to_vec());
    assert_eq!(rcgen::PublicKeyData::subject_public_key_info(&public), spki);
    let cert = leaf.signed_by(&public, &issuer).unwrap();
    std::fs::write(dir.join("node.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    std::fs::write(
        dir.join("node.key"),
        format!("{}\n", NodeKeyRecord::from_unique([9; 32]).to_text()),
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    std::fs::write(
        dir.join("identity.json"),
        serde_json::json!({
            "version": 1, "node_id": "nd-tpm", "server": "https://127.0.0.1:1",
            "cert_serial": "01", "cert_not_after_ms": now + 3_600_000,
            "identity_generation": 1, "server_time_mark_ms": 0, "last_epoch": 0,
            "cert_issued_ms": now
        })
        .to_string(),
    )
    .unwrap();
}

fn options(dir: &Path, helper: Option<std::path::PathBuf>) -> doctor::Options {
    doctor::Options {
        data_dir: dir.join("data"),
        devices: DeviceDirs {
            cdi_dir: dir.join("cdi"),
            env_dir: dir.join("env"),
        },
        sshd: SshdDirs {
            etc_dir: dir.join("etc"),
            sshd: dir.join("no-sshd"),
        },
        nft: Nft {
            nft: dir.join("no-nft"),
        },
        host: bcd_agent::hw::real(dir.join("host")),
        helper,
        udev_rules_dir: dir.join("rules"),
        udevd: dir.join("no-udevd"),
        tpm: bcd_tpm::TpmAt::protocol(bcd_tpm::Endpoint::Device(dir.join("no-tpm"))),
        gateway_timeout: Duration::from_secs(1),
        now_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
        boot_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_words_a_cleared_tpm_as_the_spec_does() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Swtpm::start(&d.path().join("tpm")).unwrap();
    let record = NodeKeyRecord::from_unique([9; 32]);
    let spki = {
        let mut tpm = direct(&s);
        tpm.node_key_public(&record).unwrap().spki_der().unwrap()
    };
    tpm_identity(&d.path().join("data"), &spki);
    let socket = serve(d.path(), handler(d.path(), s.endpoint()));

    // The key the TPM derives is the certificate's: the check passes,
    // through the helper.
    let report = doctor::run(&options(d.path(), Some(socket.clone()))).await;
    let c = report.get("identity").unwrap();
    assert_eq!(c.status, doctor::Level::Ok, "{c:?}");
    assert!(c.summary.contains("in the TPM matches"), "{c:?}");

    // TPM2_Clear: the owner seed changes, the record derives another key.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.clear().is_err() {
        assert!(Instant::now() < deadline, "tpm2_clear never got swtpm");
        std::thread::sleep(Duration::from_millis(100));
    }
    let report = doctor::run(&options(d.path(), Some(socket))).await;
    let c = report.get("identity").unwrap();
    assert_eq!(c.status, doctor::Level::Fail, "{c:?}");
    assert_eq!(
        c.summary,
        "the node key does not match the node certificate: the TPM derives another key from node.key (was the TPM cleared?); join again: bcd join --reset --yes, then bcd join"
    );

    // The TPM gone: the spec's text for an unavailable TPM.
    s.stop();
    let report = doctor::run(&options(d.path(), None)).await;
    let c = report.get("identity").unwrap();
    assert_eq!(c.status, doctor::Level::Fail, "{c:?}");
    assert!(
        c.summary
            .starts_with("the certificate's node key is in the TPM, which is unavailable"),
        "{c:?}"
    );
}

/// `bcd doctor` on a node under a helper, with the tss-esapi backend asked
/// for: that backend cannot go through the helper (or is not in this
/// build), and the identity check says to use the pure-Rust one instead of
/// trying another path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_with_the_tss_backend_under_a_helper_says_to_use_protocol() {
    let d = tempfile::tempdir().unwrap();
    let record = NodeKeyRecord::from_unique([7; 32]);
    let s = Swtpm::start(&d.path().join("tpm")).unwrap();
    let spki = {
        let mut tpm = direct(&s);
        tpm.node_key_public(&record).unwrap().spki_der().unwrap()
    };
    tpm_identity(&d.path().join("data"), &spki);
    let socket = serve(d.path(), handler(d.path(), s.endpoint()));
    let mut opts = options(d.path(), Some(socket));
    opts.tpm.backend = bcd_tpm::Backend::Tss;
    let report = doctor::run(&opts).await;
    let c = report.get("identity").unwrap();
    assert_eq!(c.status, doctor::Level::Fail, "{c:?}");
    assert!(c.summary.contains("--tpm-backend protocol"), "{c:?}");
    if cfg!(feature = "tss") {
        assert!(c.summary.contains("through bcd helper"), "{c:?}");
    } else {
        assert!(c.summary.contains("feature `tss`"), "{c:?}");
    }
}

/// A renewal's checks see the TPM as it is now: after another TPM took the
/// endpoint (swtpm started again on fresh state), the open connection's
/// AK is what was loaded at the start, a fresh one's is the new TPM's.
/// Through every backend this build has.
#[test]
fn a_fresh_connection_sees_another_tpm_at_the_endpoint() {
    for backend in bcd_tpm::Backend::built() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("tpm");
        let mut s = Swtpm::start(&dir).unwrap();
        let at = bcd_tpm::TpmAt {
            backend,
            endpoint: s.endpoint(),
        };
        let key =
            bcd_agent::tpm_key::TpmKey::open(at, NodeKeyRecord::from_unique([3; 32])).unwrap();
        assert_eq!(key.backend(), backend.library());
        let first = key.with_tpm(|t| t.ak_public()).unwrap().name();
        s.stop();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::remove_file(&path).unwrap();
            }
        }
        s.restart().unwrap();
        let now = key.with_fresh_tpm(|t| t.ak_public()).unwrap().name();
        assert_ne!(now, first, "{backend}: another TPM, another AK");
        // The fresh connection stays: the next call is on it.
        assert_eq!(key.with_tpm(|t| t.ak_public()).unwrap().name(), now);
    }
}
