//! Machines enrolled by their TPM's EK join with no token (software TPMs:
//! swtpm, installed by scripts/test). An operator enrols one EK by its
//! hash (what a refused join prints) or its certificate, or an EK CA; the
//! machine joins with `bcd join --attestor tpm --ca-pin PIN`, and a
//! diskless machine that lost everything on disk joins again as the same
//! node at every boot, spending no token.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use bc_tests::{Node, Server, setup_dirs, stderr};
use bcd_tpm::swtpm::{self, Swtpm};

fn swtpm(dir: &Path) -> Swtpm {
    Swtpm::start(dir).unwrap_or_else(|e| panic!("{e} (scripts/test installs swtpm)"))
}

/// A TPM as a vendor ships it: an RSA EK with its certificate, signed by
/// an EK CA (`dir/ca/issuercert.pem`).
fn manufactured(dir: &Path) -> Swtpm {
    swtpm::manufacture(dir).unwrap_or_else(|e| panic!("{e} (scripts/test installs swtpm)"));
    swtpm(dir)
}

/// The fleet CA's pin, as a token carries it.
fn pin(server: &Server) -> String {
    let token = server.token(1);
    token.split('.').nth(3).unwrap().to_string()
}

fn join(node: &Node, server: &Server, tpm: &Swtpm, extra: &[&str]) -> Output {
    node.bcd(
        &[
            &["join", "--server", &server.url(), "--attestor", "tpm"][..],
            &["--tpm", &format!("swtpm:{}", tpm.addr())],
            extra,
        ]
        .concat(),
    )
    .output()
    .expect("run bcd join")
}

fn joined(out: &Output) -> String {
    assert!(out.status.success(), "join failed: {}", stderr(out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A refused join's EK hash, and that the refusal says what to do.
fn not_enrolled(out: &Output) -> String {
    assert!(!out.status.success(), "joined though not enrolled");
    let err = stderr(out);
    let hash = err
        .split("EK SHA-256 ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("the refusal names no EK: {err}"))
        .to_string();
    assert_eq!(hash.len(), 64, "{err}");
    assert!(
        err.contains(&format!(
            "better-compute machines enroll --ek-sha256 {hash}"
        )),
        "{err}"
    );
    hash
}

fn enrol(server: &Server, args: &[&str]) -> serde_json::Value {
    let out = server.cli(&[&["machines", "enroll", "--json"][..], args].concat());
    assert!(out.status.success(), "machines enroll: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("json")
}

fn cli_ok(server: &Server, args: &[&str]) -> String {
    let out = server.cli(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn an_enrolled_tpm_joins_with_no_token_and_every_boot_is_the_same_node() {
    let (d, server) = setup_dirs();
    let tpm = swtpm(&d.path().join("tpm1"));
    let mut node = Node::new(&d.path().join("node1"), 1);
    let token = server.token(1);
    let pin = pin(&server);
    let tokenless = ["--ca-pin", pin.as_str(), "--ramdisk"];

    // Not enrolled: refused with the hash to enrol, nothing kept.
    let hash = not_enrolled(&join(&node, &server, &tpm, &tokenless));
    assert!(!node.dir.join("identity.json").exists());
    // A pin that is no pin is refused before anything is sent.
    let out = join(&node, &server, &tpm, &["--ca-pin", "abc"]);
    assert!(stderr(&out).contains("--ca-pin takes the fleet CA's pin"));

    let r = enrol(&server, &["--ek-sha256", &hash, "--description", "rack 3"]);
    assert_eq!(r["machine"]["id"], format!("ek:{hash}"));
    assert_eq!(r["ca_pin"], pin.as_str());
    // Enrolled twice: refused, says where to look.
    let again = server.cli(&["machines", "enroll", "--ek-sha256", &hash]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("already enrolled"),
        "{}",
        stderr(&again)
    );

    let out = joined(&join(&node, &server, &tpm, &tokenless));
    assert!(out.contains("joined as node"), "{out}");
    let id = node.id();
    assert_eq!(node.identity()["identity_generation"], 1);
    node.env = vec![("BCD_TPM".into(), format!("swtpm:{}", tpm.addr()))];
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    node.proc().stop();

    // Every boot of a diskless machine: nothing on disk, no token, the
    // same node with a fresh ramdisk certificate (2 h).
    for generation in 2..=3 {
        std::fs::remove_dir_all(&node.dir).unwrap();
        let out = joined(&join(&node, &server, &tpm, &tokenless));
        assert!(out.contains(&format!("re-enrolled as node {id}")), "{out}");
        let identity = node.identity();
        assert_eq!(identity["identity_generation"], generation);
        let life = identity["cert_not_after_ms"].as_i64().unwrap()
            - identity["server_time_mark_ms"].as_i64().unwrap();
        let two_hours = Duration::from_secs(2 * 3600).as_millis() as i64;
        assert!((life - two_hours).abs() < 120_000, "{life} ms");
        node.start();
        server.wait_node(&id, "connected", |n| n.state == "connected");
        node.proc().stop();
    }
    let listed = cli_ok(&server, &["machines", "list"]);
    assert!(
        listed.contains(&format!("ek:{hash}")) && listed.contains(&id),
        "{listed}"
    );

    // No token was spent: the one-use token still joins another TPM.
    let tpm2 = swtpm(&d.path().join("tpm2"));
    let other = Node::new(&d.path().join("node2"), 2);
    let out = joined(&join(&other, &server, &tpm2, &["--token", &token]));
    assert!(out.contains("joined as node"), "{out}");
    assert_ne!(other.id(), id);

    // Deleting the node frees the EK; with the enrolment removed, the
    // machine is a stranger again.
    cli_ok(&server, &["machines", "remove", &format!("ek:{hash}")]);
    cli_ok(&server, &["nodes", "delete", &id, "--yes"]);
    std::fs::remove_dir_all(&node.dir).unwrap();
    assert_eq!(not_enrolled(&join(&node, &server, &tpm, &tokenless)), hash);
}

#[test]
fn an_enrolled_ek_ca_admits_the_tpms_it_certified() {
    let (d, server) = setup_dirs();
    let pin = pin(&server);
    let tokenless = ["--ca-pin", pin.as_str()];
    let vendor = d.path().join("tpm-vendor");
    let tpm = manufactured(&vendor);
    let node = Node::new(&d.path().join("node1"), 1);

    not_enrolled(&join(&node, &server, &tpm, &tokenless));
    let ca = vendor.join("ca/issuercert.pem");
    let r = enrol(&server, &["--ek-ca", ca.to_str().unwrap()]);
    let ca_id = r["machine"]["id"].as_str().unwrap().to_string();
    assert!(ca_id.starts_with("ek-ca:"), "{r}");
    let out = joined(&join(&node, &server, &tpm, &tokenless));
    assert!(out.contains("joined as node"), "{out}");

    // A TPM with no EK certificate, or one another CA signed, is not
    // admitted by the CA.
    let plain = swtpm(&d.path().join("tpm-plain"));
    let stranger = Node::new(&d.path().join("node2"), 2);
    not_enrolled(&join(&stranger, &server, &plain, &tokenless));
    let elsewhere_dir = d.path().join("tpm-elsewhere");
    let elsewhere = manufactured(&elsewhere_dir);
    let third = Node::new(&d.path().join("node3"), 3);
    let hash = not_enrolled(&join(&third, &server, &elsewhere, &tokenless));

    // Enrolled by its EK certificate instead: the same EK hash as the
    // refusal printed, and it joins.
    let der = {
        use bcd_tpm::Tpm;
        let mut t = bcd_tpm::ProtocolTpm::open(elsewhere.endpoint()).unwrap();
        t.ek_certificate(bcd_tpm::EkKind::Rsa2048)
            .unwrap()
            .expect("a manufactured TPM has an EK certificate")
    };
    let file = d.path().join("ek.der");
    std::fs::write(&file, der).unwrap();
    let r = enrol(&server, &["--ek-cert", file.to_str().unwrap()]);
    assert_eq!(r["machine"]["id"], format!("ek:{hash}"), "{r}");
    assert!(
        r["machine"]["subject"].as_str().is_some(),
        "the certificate's subject is kept: {r}"
    );
    let out = joined(&join(&third, &server, &elsewhere, &tokenless));
    assert!(out.contains("joined as node"), "{out}");

    // Removing the CA admits no new machine, but its bound node stays.
    cli_ok(&server, &["machines", "remove", &ca_id]);
    std::fs::remove_dir_all(&node.dir).unwrap();
    let out = joined(&join(&node, &server, &tpm, &tokenless));
    assert!(out.contains("re-enrolled as node"), "{out}");
}

/// swtpm's local CA is two deep, as vendors' are: a root signs the
/// intermediate that signs EK certificates. The root alone admits nothing;
/// with the intermediate enrolled under it, the TPM joins.
#[test]
fn an_ek_root_admits_through_the_intermediates_enrolled_with_it() {
    let (d, server) = setup_dirs();
    let pin = pin(&server);
    let tokenless = ["--ca-pin", pin.as_str()];
    let vendor = d.path().join("tpm-vendor");
    let tpm = manufactured(&vendor);
    let node = Node::new(&d.path().join("node1"), 1);
    let root = vendor.join("ca/swtpm-localca-rootca-cert.pem");
    let intermediate = vendor.join("ca/issuercert.pem");

    let r = enrol(&server, &["--ek-ca", root.to_str().unwrap()]);
    let id = r["machine"]["id"].as_str().unwrap().to_string();
    not_enrolled(&join(&node, &server, &tpm, &tokenless));
    cli_ok(&server, &["machines", "remove", &id]);

    // Intermediates come with the CA they lead to.
    let out = server.cli(&[
        "machines",
        "enroll",
        "--ek-sha256",
        &"0".repeat(64),
        "--ek-intermediates",
        intermediate.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--ek-ca"), "{}", stderr(&out));

    let r = enrol(
        &server,
        &[
            "--ek-ca",
            root.to_str().unwrap(),
            "--ek-intermediates",
            intermediate.to_str().unwrap(),
        ],
    );
    assert_eq!(r["machine"]["id"], id, "the root names the enrolment: {r}");
    assert_eq!(
        r["machine"]["intermediates"],
        serde_json::json!(["CN=swtpm-localca"]),
        "{r}"
    );
    let listed = cli_ok(&server, &["machines", "list", "--json"]);
    assert!(listed.contains("CN=swtpm-localca"), "{listed}");
    let out = joined(&join(&node, &server, &tpm, &tokenless));
    assert!(out.contains("joined as node"), "{out}");
}

/// A TPM that holds the intermediate in the TCG chain index needs only the
/// root enrolled: the node sends what its TPM holds, and the server follows
/// it to the enrolled root (a chain to another root admits nothing).
#[test]
fn a_tpm_holding_its_ek_chain_joins_under_the_root_alone() {
    use rustls_pki_types::pem::PemObject;
    let (d, server) = setup_dirs();
    let pin = pin(&server);
    let tokenless = ["--ca-pin", pin.as_str()];
    let vendor = d.path().join("tpm-vendor");
    let tpm = manufactured(&vendor);
    let node = Node::new(&d.path().join("node1"), 1);
    let root = vendor.join("ca/swtpm-localca-rootca-cert.pem");
    let intermediate =
        rustls_pki_types::CertificateDer::from_pem_file(vendor.join("ca/issuercert.pem")).unwrap();

    // Another vendor's root with the chain in the TPM: nothing.
    let other = d.path().join("tpm-other");
    drop(manufactured(&other));
    enrol(
        &server,
        &[
            "--ek-ca",
            other
                .join("ca/swtpm-localca-rootca-cert.pem")
                .to_str()
                .unwrap(),
        ],
    );
    not_enrolled(&join(&node, &server, &tpm, &tokenless));
    enrol(&server, &["--ek-ca", root.to_str().unwrap()]);
    not_enrolled(&join(&node, &server, &tpm, &tokenless));

    tpm.define_nv(bcd_tpm::EK_CHAIN_FIRST_INDEX, &intermediate)
        .unwrap();
    let out = joined(&join(&node, &server, &tpm, &tokenless));
    assert!(out.contains("joined as node"), "{out}");
}

/// Copies a stopped TPM's state: a clone of the machine's identity.
fn copy_state(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn machines_with_a_copied_tpm_state_are_quarantined_and_an_operator_rejoins_the_real_one() {
    let (d, server) = setup_dirs();
    let pin = pin(&server);
    let tokenless = ["--ca-pin", pin.as_str(), "--ramdisk"];
    let (real_dir, clone_dir) = (d.path().join("tpm-real"), d.path().join("tpm-clone"));
    let mut tpm = swtpm(&real_dir);
    let mut real = Node::new(&d.path().join("real"), 1);
    let clone_node = Node::new(&d.path().join("clone"), 2);
    let hash = not_enrolled(&join(&real, &server, &tpm, &tokenless));
    tpm.stop();
    copy_state(&real_dir, &clone_dir);
    tpm.restart().unwrap();
    let clone = swtpm(&clone_dir);
    enrol(&server, &["--ek-sha256", &hash]);

    // The real machine joins and connects; the clone, with the same TPM
    // state, takes the node from it at its join.
    joined(&join(&real, &server, &tpm, &tokenless));
    let id = real.id();
    real.env = vec![("BCD_TPM".into(), format!("swtpm:{}", tpm.addr()))];
    real.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let out = joined(&join(&clone_node, &server, &clone, &tokenless));
    assert!(out.contains(&format!("re-enrolled as node {id}")), "{out}");
    let stopped = real.proc().wait(Duration::from_secs(30));
    assert!(stopped.is_some(), "the real machine's daemon is refused");
    let events = |server: &Server| {
        let s = server.store();
        format!(
            "{:?}",
            s.block(s.store.fleet_events(&bc_store::NodeId::from(&id), 50))
                .unwrap()
        )
    };
    let seen = events(&server);
    assert!(seen.contains("security.node.duplicate-session"), "{seen}");
    assert!(
        seen.contains("re-attested the node's TPM while boot"),
        "{seen}"
    );

    // Each joins again in turn: the fourth return to a machine seen
    // before quarantines the node, and neither gets it back.
    let machines = [(&real, &tpm), (&clone_node, &clone)];
    for (i, (node, t)) in machines.iter().cycle().take(4).enumerate() {
        std::fs::remove_dir_all(&node.dir).unwrap();
        let out = join(node, &server, t, &tokenless);
        if i < 3 {
            joined(&out);
        } else {
            let err = stderr(&out);
            assert!(!out.status.success(), "a fourth return is quarantined");
            assert!(err.contains(&format!("node {id} is quarantined")), "{err}");
            assert!(err.contains("--attestor tpm --token TOKEN"), "{err}");
        }
    }
    let seen = events(&server);
    assert!(seen.contains("security.node.quarantined"), "{seen}");
    std::fs::remove_dir_all(&real.dir).unwrap();
    let again = join(&real, &server, &tpm, &tokenless);
    assert!(
        stderr(&again).contains("is quarantined"),
        "{}",
        stderr(&again)
    );

    // An operator joins the real machine with a token: the same node.
    let token = server.token(1);
    let out = joined(&join(&real, &server, &tpm, &["--token", &token]));
    assert!(out.contains(&format!("re-enrolled as node {id}")), "{out}");
    real.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    real.proc().stop();
}

/// Whoever can write the store rebinds a node to the EK of a TPM of its
/// own (`nodes.ek_sha256`): that TPM's join with no token reclaims
/// nothing, since no certificate the fleet CA issued the node names its
/// attestation key. The refusal says so, the machine keeps nothing, and
/// the forgery is among the node's events.
#[test]
fn a_node_rebound_to_another_tpm_in_the_store_is_not_reclaimed_by_it() {
    let (d, server) = setup_dirs();
    let victim_tpm = swtpm(&d.path().join("tpm1"));
    let victim = Node::new(&d.path().join("victim"), 1);
    let token = server.token(1);
    joined(&join(&victim, &server, &victim_tpm, &["--token", &token]));
    let id = victim.id();
    let pin = pin(&server);
    let tokenless = ["--ca-pin", pin.as_str(), "--ramdisk"];
    let attacker_tpm = swtpm(&d.path().join("tpm2"));
    let attacker = Node::new(&d.path().join("attacker"), 2);
    let hash = not_enrolled(&join(&attacker, &server, &attacker_tpm, &tokenless));

    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute(
        "UPDATE nodes SET ek_sha256 = ?1 WHERE id = ?2",
        [&hash, &id],
    )
    .unwrap();
    let out = join(&attacker, &server, &attacker_tpm, &tokenless);
    assert!(!out.status.success(), "the rebinding reclaimed node {id}");
    let err = stderr(&out);
    assert!(
        err.contains(&format!("cannot re-enrol node {id}"))
            && err.contains("names this TPM's attestation key"),
        "{err}"
    );
    assert!(!attacker.dir.join("identity.json").exists());
    let events = server.spec(&id)["events"].to_string();
    assert!(events.contains("security.ek-binding.forged"), "{events}");
}
