//! Joins by TPM attestation against software TPMs (swtpm, installed by
//! scripts/test): `bcd join --attestor tpm` proves the EK and AK, the node
//! key lives in the TPM and the certificate names the AK; the session's TLS
//! handshakes sign there and commands run; the same TPM joining again
//! reclaims its node, another TPM is another node, and a cleared TPM stops
//! `bcd node` with the spec's text.
//!
//! The scenarios of join, reclaim, another TPM, a cleared TPM, an
//! unreachable TPM, renewal and another AK at renewal run through both of
//! `bcd`'s TPM backends (`--tpm-backend protocol|tss`: the tests' `bcd` is
//! built with `--all-features`, so it has the tss-esapi one): modules
//! `protocol` and `tss`. x509pop, the keyless gateway and the refused file
//! key run through the default backend only: nothing in them differs by
//! backend but the TPM calls the other scenarios already cover.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::Duration;

use bc_tests::{Node, Server, setup_dirs, stderr, wait_for};
use bcd_tpm::Backend;
use bcd_tpm::swtpm::Swtpm;

/// The scenarios that run through each backend: `protocol::NAME` and
/// `tss::NAME` call `NAME(backend)`.
macro_rules! through_both_backends {
    ($($name:ident),* $(,)?) => {
        mod protocol {
            $(
                #[test]
                fn $name() {
                    super::$name(bcd_tpm::Backend::Protocol)
                }
            )*
        }
        mod tss {
            $(
                #[test]
                fn $name() {
                    super::needs_tss_bcd();
                    super::$name(bcd_tpm::Backend::Tss)
                }
            )*
        }
    };
}

through_both_backends!(
    a_tpm_node_joins_connects_runs_commands_and_its_tpm_reclaims_it,
    an_unreachable_tpm_fails_the_join_and_the_start_with_what_to_check,
    a_tpm_node_renews_with_a_next_key_its_ak_certified,
    another_ak_at_renewal_stops_the_attempts_and_doctor_says_why,
);

/// The tests' `bcd` has the tss-esapi backend (built with
/// `--all-features`), or the tss runs fail saying how to build it.
fn needs_tss_bcd() {
    let out = std::process::Command::new(bc_tests::bin("bcd"))
        .arg("version")
        .output()
        .expect("run bcd version");
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.contains("TPM backends: protocol, tss"),
        "the tests' bcd lacks the tss-esapi backend ({version}): cargo build --workspace \
         --all-features first"
    );
}

/// The spec's text for a TPM cleared under the node ("TPM cleared or
/// unavailable").
const CLEARED: &str = "the node key does not match the node certificate: the TPM derives another key from node.key (was the TPM cleared?); join again: bcd join --reset --yes, then bcd join";
/// The spec's text for another TPM under the node's identity.
const OTHER_AK: &str = "this TPM's attestation key is not the one the certificate names (another TPM, or its endorsement seed changed): the certificate cannot be renewed here; join again: bcd join --reset --yes, then bcd join";

fn swtpm(dir: &Path) -> Swtpm {
    Swtpm::start(dir).unwrap_or_else(|e| panic!("{e} (scripts/test installs swtpm)"))
}

fn tpm_arg(s: &Swtpm) -> String {
    format!("swtpm:{}", s.addr())
}

fn join_tpm(node: &Node, server: &Server, token: &str, tpm: &Swtpm, extra: &[&str]) -> String {
    join_through(Backend::Protocol, node, server, token, tpm, extra)
}

/// `bcd join --attestor tpm` through `backend`.
fn join_through(
    backend: Backend,
    node: &Node,
    server: &Server,
    token: &str,
    tpm: &Swtpm,
    extra: &[&str],
) -> String {
    let out = node
        .bcd(
            &[
                &["join", "--server", &server.url(), "--token", token][..],
                &["--attestor", "tpm", "--tpm", &tpm_arg(tpm)],
                &["--tpm-backend", backend.as_str()],
                extra,
            ]
            .concat(),
        )
        .output()
        .expect("run bcd join");
    assert!(out.status.success(), "join failed: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The URIs of the node's certificate.
fn cert_uris(node: &Node) -> Vec<String> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_file(node.dir.join("node.crt")).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let san = cert
        .subject_alternative_name()
        .unwrap()
        .expect("the certificate has subject alternative names");
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect()
}

fn ak_urn(tpm: &Swtpm) -> String {
    use bcd_tpm::Tpm;
    let mut t = bcd_tpm::ProtocolTpm::open(tpm.endpoint()).unwrap();
    bcd_proto::attest::ak_urn(t.ak_public().unwrap().name().as_bytes())
}

/// The started `bcd node` stops, failing, and its log says `text`.
fn stops_saying(node: &mut Node, text: &str) {
    let status = node
        .proc()
        .wait(Duration::from_secs(30))
        .expect("bcd node stops");
    assert!(!status.success());
    let log = node.proc().log();
    assert!(log.contains(text), "{log}");
}

fn start_tpm(node: &mut Node, tpm: &Swtpm) {
    start_through(Backend::Protocol, node, tpm);
}

/// `bcd node` on `tpm` through `backend` (BCD_TPM, BCD_TPM_BACKEND).
fn start_through(backend: Backend, node: &mut Node, tpm: &Swtpm) {
    node.env = vec![
        ("BCD_TPM".into(), tpm_arg(tpm)),
        ("BCD_TPM_BACKEND".into(), backend.as_str().into()),
    ];
    node.start();
}

/// `bcd doctor`'s identity check on `tpm` through `backend`: its status
/// and summary.
fn doctor_identity(backend: Backend, node: &Node, tpm: &str) -> (String, String) {
    let out = node
        .bcd(&[
            "doctor",
            "--json",
            "--tpm",
            tpm,
            "--tpm-backend",
            backend.as_str(),
        ])
        .output()
        .expect("run bcd doctor");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", stderr(&out)));
    let checks = report["checks"].as_array().expect("checks");
    let c = checks
        .iter()
        .find(|c| c["check"] == "identity")
        .unwrap_or_else(|| panic!("no identity check in {report}"));
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["summary"].as_str().unwrap_or_default().to_string(),
    )
}

fn a_tpm_node_joins_connects_runs_commands_and_its_tpm_reclaims_it(backend: Backend) {
    let join_tpm = |node: &Node, server: &Server, token: &str, tpm: &Swtpm, extra: &[&str]| {
        join_through(backend, node, server, token, tpm, extra)
    };
    let start_tpm = |node: &mut Node, tpm: &Swtpm| start_through(backend, node, tpm);
    let (d, server) = setup_dirs();
    let mut tpm = swtpm(&d.path().join("tpm1"));
    let expected_ak = ak_urn(&tpm);
    let mut node = Node::new(&d.path().join("node1"), 1);
    let token = server.token(3);
    let out = join_tpm(&node, &server, &token, &tpm, &[]);
    assert!(out.contains("joined as node"), "{out}");
    let id = node.id();

    // The key is the TPM's: node.key is the record, not a key.
    let key = std::fs::read_to_string(node.dir.join("node.key")).unwrap();
    assert!(key.starts_with("bcd-tpm-key v1 "), "{key}");
    assert!(!key.contains("PRIVATE KEY"));
    let uris = cert_uris(&node);
    assert!(uris.contains(&format!("urn:bc:node:{id}")), "{uris:?}");
    assert!(uris.contains(&expected_ak), "{uris:?} names {expected_ak}");

    // Every handshake signs in the TPM: the session connects, commands run.
    start_tpm(&mut node, &tpm);
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let c = server.wait_command(&server.run_command(&id, "exec.run", &["/bin/echo", "tpm"]));
    assert_eq!(c.state, "succeeded", "{c:?}");
    assert!(c.output.contains("tpm"), "{}", c.output);
    // The operator sees the node bound to its endorsement key.
    let ek = |id: &str| -> String {
        let shown = server.cli(&["nodes", "show", id]);
        assert!(shown.status.success(), "{}", stderr(&shown));
        let text = String::from_utf8_lossy(&shown.stdout).to_string();
        let line = text
            .lines()
            .find(|l| l.starts_with("tpm ek"))
            .unwrap_or_else(|| panic!("no tpm ek line in {text}"))
            .to_string();
        assert!(line.ends_with("(bound by attestation)"), "{line}");
        line.split_whitespace().nth(2).unwrap().to_string()
    };
    let bound = ek(&id);
    assert_eq!(bound.len(), 64, "{bound}");
    node.proc().stop();

    // The same TPM joining again reclaims its node: same id, next
    // generation, the old certificate out.
    let out = node
        .bcd(&["join", "--reset", "--yes"])
        .output()
        .expect("bcd join --reset");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = join_tpm(&node, &server, &token, &tpm, &[]);
    assert!(out.contains("re-enrolled as node"), "{out}");
    assert_eq!(node.id(), id, "the EK's node");
    assert_eq!(node.identity()["identity_generation"], 2);
    start_tpm(&mut node, &tpm);
    server.wait_node(&id, "connected again", |n| n.state == "connected");
    node.proc().stop();

    // Another TPM is another node.
    let tpm2 = swtpm(&d.path().join("tpm2"));
    let other = Node::new(&d.path().join("node2"), 2);
    join_tpm(&other, &server, &token, &tpm2, &[]);
    assert_ne!(other.id(), id, "another TPM, another node");
    assert_eq!(ek(&id), bound, "reclaimed under the same endorsement key");
    assert_ne!(
        ek(&other.id()),
        bound,
        "another TPM, another endorsement key"
    );

    // The node's identity under the other TPM: another AK.
    let mut node_on_tpm2 = Node::new(&node.dir, 1);
    start_tpm(&mut node_on_tpm2, &tpm2);
    stops_saying(&mut node_on_tpm2, OTHER_AK);

    // TPM2_Clear: the owner seed changes, the record derives another key.
    tpm.clear().expect("tpm2_clear");
    tpm.restart().unwrap();
    start_tpm(&mut node, &tpm);
    stops_saying(&mut node, CLEARED);
}

fn an_unreachable_tpm_fails_the_join_and_the_start_with_what_to_check(backend: Backend) {
    let (d, server) = setup_dirs();
    let node = Node::new(&d.path().join("node"), 3);
    let out = node
        .bcd(&[
            "join",
            "--server",
            &server.url(),
            "--token",
            &server.token(1),
            "--attestor",
            "tpm",
            "--tpm",
            "/nonexistent/tpmrm0",
            "--tpm-backend",
            backend.as_str(),
        ])
        .output()
        .expect("run bcd join");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("the TPM at /nonexistent/tpmrm0 cannot be reached") && err.contains("--tpm"),
        "{err}"
    );
    assert!(!node.dir.join("identity.json").exists(), "nothing joined");

    // A joined node whose TPM is gone does not start.
    let tpm = swtpm(&d.path().join("tpm"));
    join_through(backend, &node, &server, &server.token(1), &tpm, &[]);
    drop(tpm);
    let mut node = node;
    node.env = vec![
        ("BCD_TPM".into(), "/nonexistent/tpmrm0".into()),
        ("BCD_TPM_BACKEND".into(), backend.as_str().into()),
    ];
    node.start();
    stops_saying(
        &mut node,
        "the certificate's node key is in the TPM, which is unavailable",
    );
}

/// A certificate that names the AK renews only with a next key in that
/// TPM, certified by the AK: node.key stays a TPM record (another one),
/// the renewed certificate names the AK, and the node comes back under it
/// once the first certificate runs out.
fn a_tpm_node_renews_with_a_next_key_its_ak_certified(backend: Backend) {
    let d = tempfile::tempdir().unwrap();
    let mut args = bc_tests::FAST.to_vec();
    args.extend(["--node-cert-ttl", "8s"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let tpm = swtpm(&d.path().join("tpm"));
    let expected_ak = ak_urn(&tpm);
    let mut node = Node::new(&d.path().join("node"), 4);
    join_through(backend, &node, &server, &server.token(1), &tpm, &[]);
    let id = node.id();
    let first = node.identity();
    let first_key = std::fs::read_to_string(node.dir.join("node.key")).unwrap();
    start_through(backend, &mut node, &tpm);
    server.wait_node(&id, "connected", |n| n.state == "connected");
    wait_for(Duration::from_secs(30), "the renewal in bcd's log", || {
        node.proc()
            .log()
            .contains("certificate renewed")
            .then_some(())
    });
    let renewed = node.identity();
    assert_ne!(renewed["cert_serial"], first["cert_serial"]);
    let key = std::fs::read_to_string(node.dir.join("node.key")).unwrap();
    assert!(
        key.starts_with("bcd-tpm-key v1 "),
        "never a file key: {key}"
    );
    assert_ne!(key, first_key, "a next key");
    let uris = cert_uris(&node);
    assert!(uris.contains(&expected_ak), "{uris:?}");
    assert!(uris.contains(&format!("urn:bc:node:{id}")), "{uris:?}");
    // The first certificate runs out: the session under the renewed one,
    // whose handshake the next key signs in the TPM.
    server.wait_node(&id, "a session under the renewed certificate", |n| {
        n.state == "connected" && n.epoch >= 2
    });
    let c = server.wait_command(&server.run_command(&id, "exec.run", &["/bin/true"]));
    assert_eq!(c.state, "succeeded", "{c:?}");
}

/// The TPM under a running node derives another AK (here another TPM on
/// the same socket: swtpm started again on fresh state): the renewal fails
/// before any request with the spec's text, once, and is not tried again
/// (retrying cannot help); the session keeps its current certificate, and
/// `bcd doctor` fails the identity check with the same text. Then the
/// spec's recovery, followed as written: the old node cordoned and
/// deleted, `bcd join --reset --yes`, and the machine joins as a new node.
fn another_ak_at_renewal_stops_the_attempts_and_doctor_says_why(backend: Backend) {
    let d = tempfile::tempdir().unwrap();
    let mut args = bc_tests::FAST.to_vec();
    // Renewal at about 60% of the life: the swap below happens well before.
    args.extend(["--node-cert-ttl", "20s"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let tpm_dir = d.path().join("tpm");
    let mut tpm = swtpm(&tpm_dir);
    let mut node = Node::new(&d.path().join("node"), 8);
    join_through(backend, &node, &server, &server.token(1), &tpm, &[]);
    let id = node.id();
    start_through(backend, &mut node, &tpm);
    server.wait_node(&id, "connected", |n| n.state == "connected");

    // Another TPM behind the same socket: swtpm stopped, its state gone,
    // started again (new endorsement and owner seeds).
    tpm.stop();
    for entry in std::fs::read_dir(&tpm_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::remove_file(&path).unwrap();
        }
    }
    tpm.restart().unwrap();

    let log = wait_for(Duration::from_secs(40), "the renewal to fail", || {
        let log = node.proc().log();
        log.contains("renewal failed").then_some(log)
    });
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("renewal failed"))
        .collect();
    assert_eq!(failed.len(), 1, "{log}");
    assert!(failed[0].contains(OTHER_AK), "{log}");
    assert!(failed[0].contains("retrying cannot help"), "{log}");
    assert!(!failed[0].contains("retry_in"), "no retry scheduled: {log}");
    assert!(!log.contains("certificate renewed"), "{log}");
    // The session it had still serves.
    assert_eq!(
        server.node(&id).map(|n| n.state).as_deref(),
        Some("connected")
    );
    node.proc().stop();

    // doctor (the node stopped: swtpm serves one connection) says what
    // to do, in the spec's words.
    let (status, summary) = doctor_identity(backend, &node, &tpm_arg(&tpm));
    assert_eq!(status, "fail", "{summary}");
    assert_eq!(summary, OTHER_AK);

    // The spec's recovery, step by step: a machine whose EK changed joins
    // as a new node once the old node is cordoned and deleted, its
    // identity and journal moved aside by `bcd join --reset --yes`.
    let out = server.cli(&["nodes", "cordon", &id, "--reason", "TPM replaced"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = server.cli(&["-o", "wide", "nodes", "list"]);
    let wide = String::from_utf8_lossy(&out.stdout).to_string();
    let row = wide.lines().find(|l| l.starts_with(&id)).unwrap();
    assert!(
        row.contains(",cordoned") && row.contains("(TPM replaced)"),
        "{wide}"
    );
    let out = server.cli(&["nodes", "delete", &id, "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = node
        .bcd(&["join", "--reset", "--yes"])
        .output()
        .expect("bcd join --reset");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = join_through(backend, &node, &server, &server.token(1), &tpm, &[]);
    assert!(out.contains("joined as node"), "{out}");
    let new = node.id();
    assert_ne!(new, id, "another EK, another node");
    start_through(backend, &mut node, &tpm);
    server.wait_node(&new, "the new node connected", |n| n.state == "connected");
}

/// x509pop for a TPM-held certificate: back after its certificate ran
/// out, the node renews by a proof made in the TPM, to a next key its AK
/// certified, and connects as the same node.
#[test]
fn a_tpm_node_back_after_its_certificate_ran_out_renews_by_x509pop() {
    let d = tempfile::tempdir().unwrap();
    let mut args = bc_tests::FAST.to_vec();
    args.extend(["--node-cert-ttl", "3s", "--x509pop"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let tpm = swtpm(&d.path().join("tpm"));
    // Read before bcd node holds swtpm's one connection.
    let expected_ak = ak_urn(&tpm);
    let mut node = Node::new(&d.path().join("node"), 7);
    join_tpm(&node, &server, &server.token(1), &tpm, &[]);
    let id = node.id();
    let first = node.identity();
    let not_after = first["cert_not_after_ms"].as_i64().unwrap();
    wait_for(
        Duration::from_secs(10),
        "the certificate to run out",
        || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            (now > not_after + 500).then_some(())
        },
    );
    start_tpm(&mut node, &tpm);
    server.wait_node(&id, "connected again", |n| n.state == "connected");
    let renewed = node.identity();
    assert_ne!(renewed["cert_serial"], first["cert_serial"]);
    assert_eq!(renewed["identity_generation"], first["identity_generation"]);
    let key = std::fs::read_to_string(node.dir.join("node.key")).unwrap();
    assert!(
        key.starts_with("bcd-tpm-key v1 "),
        "never a file key: {key}"
    );
    let uris = cert_uris(&node);
    assert!(uris.contains(&expected_ak), "{uris:?}");
    assert!(
        node.proc().log().contains("renewing it by proving its key"),
        "{}",
        node.proc().log()
    );
}

/// Both round trips through a gateway process that holds no key, from a
/// TPM manufactured with an EK certificate: the gateway relays
/// BeginAttestation and the join to the key-holding process's
/// GatewayServices port, which answers each without state of the other;
/// the node then keeps its session through that gateway.
#[test]
fn a_keyless_gateway_relays_an_attested_join() {
    let (d, server) = setup_dirs();
    let cred = d.path().join("gw-tpm.json");
    let o = server.cli(&[
        "gateways",
        "add",
        "gw-tpm",
        "--upstream",
        &server.url(),
        "--out",
        cred.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "gateways add: {}", stderr(&o));
    let store = format!("sqlite:{}", server.dir.join("store.db").display());
    let mut args = bc_tests::FAST.to_vec();
    args.extend([
        "--role",
        "gateway",
        "--credential",
        cred.to_str().unwrap(),
        "--store",
        &store,
        "--gateway-id",
        "gw-tpm-1",
    ]);
    let gw = Server::start(&d.path().join("gateway"), &args).unwrap();
    // A manufactured TPM (swtpm_setup): the node sends the EK certificate
    // from NV, and the server checks it holds the EK.
    let tpm_dir = d.path().join("tpm");
    bcd_tpm::swtpm::manufacture(&tpm_dir).expect("swtpm_setup");
    let tpm = swtpm(&tpm_dir);
    let mut node = Node::new(&d.path().join("node"), 5);
    let out = node
        .bcd(&[
            "join",
            "--server",
            &gw.url(),
            "--token",
            &server.token(1),
            "--attestor",
            "tpm",
            "--tpm",
            &tpm_arg(&tpm),
        ])
        .output()
        .expect("run bcd join");
    assert!(
        out.status.success(),
        "join through the gateway: {}",
        stderr(&out)
    );
    let id = node.id();
    assert!(cert_uris(&node).contains(&ak_urn(&tpm)));
    start_tpm(&mut node, &tpm);
    server.wait_node(&id, "connected through the gateway", |n| {
        n.state == "connected" && n.gateway == "gw-tpm-1"
    });
}

/// The join service renews a certificate that names an AK only to a next
/// key that AK certified: a renewal to a file key, properly proven by the
/// current key in the TPM, is refused and issues nothing.
#[test]
fn a_renewal_to_a_file_key_is_refused_for_a_tpm_certificate() {
    use bcd_proto::tls::{self, ClientSigner, ServerTrust};
    use rustls_pki_types::pem::PemObject;
    let (d, server) = setup_dirs();
    let tpm = swtpm(&d.path().join("tpm"));
    let node = Node::new(&d.path().join("node"), 6);
    join_tpm(&node, &server, &server.token(1), &tpm, &[]);
    let id = node.id();
    let record = bcd_tpm::NodeKeyRecord::parse_text(
        &std::fs::read_to_string(node.dir.join("node.key")).unwrap(),
    )
    .unwrap();
    let cert = rustls_pki_types::CertificateDer::from_pem_file(node.dir.join("node.crt")).unwrap();
    let ca = rustls_pki_types::CertificateDer::from_pem_file(node.dir.join("ca.crt")).unwrap();
    let key = std::sync::Arc::new(
        bcd_agent::tpm_key::TpmKey::for_certificate(
            bcd_tpm::TpmAt::protocol(tpm.endpoint()),
            record,
            &cert,
        )
        .unwrap(),
    );
    let file_key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(&file_key)
        .unwrap()
        .der()
        .to_vec();
    let now = node.identity()["cert_issued_ms"].as_i64().unwrap();
    let statement = bcd_proto::renew::statement(&id, now, &csr);
    let proof = key.sign(&statement).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let refused = rt.block_on(async {
        let config = tls::client_config_signed(
            ServerTrust::Ca(ca),
            ClientSigner {
                chain: vec![cert],
                key: key.rustls_key(),
            },
        )
        .unwrap();
        let channel = tls::connect(&server.url(), config).await.unwrap();
        bcd_proto::v1::join_client::JoinClient::new(channel)
            .renew(bcd_proto::v1::RenewRequest {
                csr_der: csr,
                proof,
                proof_time_ms: now,
                node_id: id.clone(),
                expired_cert_der: vec![],
                next_key: None,
            })
            .await
            .unwrap_err()
    });
    assert!(
        refused.message().contains("renew:key-attestation-missing"),
        "{}",
        refused.message()
    );
    assert!(!server.proc.log().contains("certificate renewed"));
    // The node proved its key: the refusal is published, with its reason.
    let events = server.spec(&id)["events"].to_string();
    assert!(
        events.contains("security.renew.refused: renew:key-attestation-missing"),
        "{events}"
    );
}

/// `--tpm` is checked as the command line is read: an swtpm address that
/// is no address stops `bcd node`, `join`, `doctor` and `helper` with a
/// usage error (exit 2) naming the flag and what it takes, before anything
/// is opened or written.
#[test]
fn a_tpm_flag_that_names_no_tpm_is_refused_before_anything_starts() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    for args in [
        vec!["node", "--tpm", "swtpm:localhost"],
        vec!["join", "--server", "https://127.0.0.1:1", "--tpm", "swtpm:"],
        vec!["doctor", "--tpm", ""],
        vec!["helper", "--tpm", "swtpm:127.0.0.1"],
    ] {
        let out = std::process::Command::new(bc_tests::bin("bcd"))
            .args(&args)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .expect("run bcd");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("--tpm") && err.contains("swtpm:"),
            "{args:?}: {err}"
        );
        assert!(!data.exists(), "{args:?}: the data directory was touched");
    }
}
