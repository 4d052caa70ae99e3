//! The operator API with a real `better-compute serve`: its own listener,
//! client certificates from the operator CA required, roles checked per
//! call, revocation from the next call; no other certificate and no
//! missing one gets in, and the node listener serves no Admin.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use bc_tests::{Node, Server, stderr};
use bcd_proto::tls::{self, ClientIdentity, ServerTrust};
use bcd_proto::v1::{ListNodesRequest, admin_client::AdminClient};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

const FAST: &[&str] = &["--heartbeat-interval", "1s"];

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Adds operator `name` with `role`, its credential written to `out`.
fn add_operator(server: &Server, name: &str, role: &str, out: &Path) {
    let o = server.cli(&[
        "operators",
        "add",
        name,
        "--role",
        role,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "operators add: {}", stderr(&o));
}

fn as_op(server: &Server, cred: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--operator", cred.to_str().unwrap()];
    all.extend_from_slice(args);
    server.cli(&all)
}

#[test]
fn an_admin_adds_a_read_only_operator_who_reads_is_refused_changes_and_is_revoked() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    assert_ne!(server.api, Some(server.addr), "a listener of its own");
    assert_eq!(mode(&server.dir.join("operator.json")), 0o600);
    assert_eq!(mode(&server.dir.join("operator-ca.key")), 0o600);

    let viewer = d.path().join("viewer.json");
    add_operator(&server, "viewer", "read-only", &viewer);
    assert_eq!(mode(&viewer), 0o600);
    let cred: serde_json::Value = serde_json::from_slice(&std::fs::read(&viewer).unwrap()).unwrap();
    assert_eq!(cred["server"], server.api_url().as_str());
    assert!(cred["key_pem"].as_str().unwrap().contains("PRIVATE KEY"));
    assert!(cred.get("token").is_none(), "no bearer token anywhere");

    // The credential file is not replaced without --force.
    let again = server.cli(&[
        "operators",
        "add",
        "viewer2",
        "--role",
        "admin",
        "--out",
        viewer.to_str().unwrap(),
    ]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
    // A taken name is refused, saying so.
    let taken = server.cli(&[
        "operators",
        "add",
        "viewer",
        "--role",
        "admin",
        "--out",
        d.path().join("other.json").to_str().unwrap(),
    ]);
    assert!(!taken.status.success());
    assert!(
        stderr(&taken).contains("already exists"),
        "{}",
        stderr(&taken)
    );

    // Read-only reads, through the credential file's own server address.
    let out = server_less_cli(&viewer, &["nodes", "list"]);
    assert!(
        out.status.success(),
        "read-only nodes list: {}",
        stderr(&out)
    );
    let out = as_op(&server, &viewer, &["operators", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listing = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        listing.contains("viewer") && listing.contains("read-only"),
        "{listing}"
    );
    assert!(listing.contains("admin"), "{listing}");
    assert!(listing.contains("valid for one year"), "{listing}");

    // ... and is refused a change, told which role it needs.
    let out = as_op(&server, &viewer, &["tokens", "create"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("CreateToken needs the admin role"),
        "{}",
        stderr(&out)
    );
    let out = as_op(&server, &viewer, &["operators", "revoke", "admin"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("needs the admin role"),
        "{}",
        stderr(&out)
    );

    // Revoked: the very next call is refused.
    let out = server.cli(&["operators", "revoke", "viewer"]);
    assert!(out.status.success(), "revoke: {}", stderr(&out));
    let out = as_op(&server, &viewer, &["nodes", "list"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("operator viewer was revoked"),
        "{}",
        stderr(&out)
    );
    let out = server.cli(&["operators", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let viewer_row = v["operators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "viewer")
        .unwrap()
        .clone();
    assert!(viewer_row["revoked_at_ms"].as_i64().unwrap() > 0, "{v}");
    // The admin is untouched.
    assert!(server.cli(&["nodes", "list"]).status.success());
}

/// The CLI with no --server and no --data-dir: everything from the file.
fn server_less_cli(cred: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bc_tests::bin("better-compute"))
        .arg("--data-dir")
        .arg("/nonexistent")
        .arg("--operator")
        .arg(cred)
        .args(args)
        .output()
        .unwrap()
}

/// A ListNodes call at `url` presenting `identity`, trusting `ca` for the
/// server under `name`; the error's text if it fails anywhere.
fn list_nodes(
    url: &str,
    ca: CertificateDer<'static>,
    name: &'static str,
    identity: Option<ClientIdentity>,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let config = tls::client_config(ServerTrust::Ca(ca), identity).unwrap();
        let channel = tls::connect_named(url, config, name)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        AdminClient::new(channel)
            .list_nodes(ListNodesRequest::default())
            .await
            .map(|_| ())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    })
}

fn operator_identity(cred: &Path) -> (CertificateDer<'static>, ClientIdentity) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(cred).unwrap()).unwrap();
    let pem = |k: &str| v[k].as_str().unwrap().as_bytes().to_vec();
    (
        CertificateDer::from_pem_slice(&pem("ca_pem")).unwrap(),
        ClientIdentity {
            chain: vec![CertificateDer::from_pem_slice(&pem("cert_pem")).unwrap()],
            key: PrivateKeyDer::from_pem_slice(&pem("key_pem")).unwrap(),
        },
    )
}

fn node_identity(node: &Node) -> (CertificateDer<'static>, ClientIdentity) {
    (
        CertificateDer::from_pem_file(node.dir.join("ca.crt")).unwrap(),
        ClientIdentity {
            chain: vec![CertificateDer::from_pem_file(node.dir.join("node.crt")).unwrap()],
            key: PrivateKeyDer::from_pem_file(node.dir.join("node.key")).unwrap(),
        },
    )
}

#[test]
fn only_operator_certificates_open_the_api_and_the_node_listener_has_no_admin() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let node = Node::new(&d.path().join("node"), 1);
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "join: {}", stderr(&out));
    let api = server.api_url();
    let (op_ca, _) = operator_identity(&server.dir.join("operator.json"));

    // The operator's own credential works: the control for what follows.
    let (_, admin) = operator_identity(&server.dir.join("operator.json"));
    list_nodes(&api, op_ca.clone(), bcd_proto::API_NAME, Some(admin)).expect("the admin lists");

    // No client certificate: refused.
    let err = list_nodes(&api, op_ca.clone(), bcd_proto::API_NAME, None).unwrap_err();
    assert!(!err.is_empty());
    // A node's certificate (the fleet CA's): refused.
    let (fleet_ca, node_id) = node_identity(&node);
    assert_ne!(fleet_ca, op_ca, "two CAs");
    list_nodes(&api, op_ca.clone(), bcd_proto::API_NAME, Some(node_id)).unwrap_err();
    // A certificate from a CA of someone's own making: refused.
    let rogue_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let rogue_ca = ca_params.self_signed(&rogue_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec!["admin".to_string()]).unwrap();
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let issuer = rcgen::Issuer::from_params(&ca_params, &rogue_key);
    let leaf = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let _ = rogue_ca;
    list_nodes(
        &api,
        op_ca.clone(),
        bcd_proto::API_NAME,
        Some(ClientIdentity {
            chain: vec![leaf.der().clone()],
            key: PrivateKeyDer::from_pem_slice(leaf_key.serialize_pem().as_bytes()).unwrap(),
        }),
    )
    .unwrap_err();
    // The API's serving certificate is not the gateway's: a client that
    // trusts only the fleet CA does not trust the API.
    let (_, admin) = operator_identity(&server.dir.join("operator.json"));
    list_nodes(&api, fleet_ca.clone(), bcd_proto::GATEWAY_NAME, Some(admin)).unwrap_err();

    // Admin on the node listener, with a valid node certificate: no such
    // service there.
    let (_, node_id) = node_identity(&node);
    let err = list_nodes(
        &server.url(),
        fleet_ca,
        bcd_proto::GATEWAY_NAME,
        Some(node_id),
    )
    .unwrap_err();
    assert!(err.starts_with("Unimplemented"), "{err}");
    // ... nor through the CLI pointed at it.
    let out = server.cli(&["--server", &server.url(), "nodes", "list"]);
    assert!(!out.status.success());
}

#[test]
fn a_bearer_token_operator_json_is_replaced_by_a_certificate_credential_at_start() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("server");
    std::fs::create_dir_all(&dir).unwrap();
    let bearer = br#"{"server":"https://127.0.0.1:7443","ca_pem":"","token":"bco1.0123"}"#;
    std::fs::write(dir.join("operator.json"), bearer).unwrap();

    // The CLI refuses such a file and says what to do.
    let elsewhere = d.path().join("old.json");
    std::fs::write(&elsewhere, bearer).unwrap();
    let out = server_less_cli(&elsewhere, &["nodes", "list"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("delete it and restart better-compute serve"),
        "{}",
        stderr(&out)
    );

    let server = Server::start(&dir, FAST).unwrap();
    let cred = server.dir.join("operator.json");
    assert_eq!(mode(&cred), 0o600);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cred).unwrap()).unwrap();
    assert!(v.get("token").is_none(), "{v}");
    assert_eq!(v["name"], "admin");
    let out = server.cli(&["nodes", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_revocation_through_one_server_holds_at_the_next_call_on_another_sharing_the_store() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("server");
    let a = Server::start(&dir, FAST).unwrap();
    let b = Server::start(&dir, FAST).unwrap();
    assert_ne!(a.api, b.api);
    let cred = d.path().join("ops.json");
    let out = a.cli(&[
        "operators",
        "add",
        "ops",
        "--role",
        "admin",
        "--out",
        cred.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_op(&b, &cred, &["tokens", "create"]);
    assert!(
        out.status.success(),
        "an admin on the other server: {}",
        stderr(&out)
    );
    let out = a.cli(&["operators", "revoke", "ops"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_op(&b, &cred, &["nodes", "list"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("operator ops was revoked"),
        "{}",
        stderr(&out)
    );
}

/// Whoever can write the store edits the operators table: a read-only
/// operator's row made admin gains nothing, since the role the operator CA
/// signed into the certificate bounds it. A credential from before roles
/// were signed (its certificate names none) opens nothing, saying what to
/// do, and `serve` replaces such an `operator.json` at start.
#[test]
fn a_role_rewritten_in_the_store_widens_nothing_and_a_roleless_credential_is_replaced() {
    let d = tempfile::tempdir().unwrap();
    let mut server = Server::start(&d.path().join("server"), FAST).unwrap();
    let viewer = d.path().join("viewer.json");
    add_operator(&server, "viewer", "read-only", &viewer);
    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    db.execute(
        "UPDATE operators SET role = 'admin' WHERE id = 'viewer'",
        [],
    )
    .unwrap();
    let out = as_op(&server, &viewer, &["tokens", "create"]);
    assert!(!out.status.success(), "a rewritten row made a viewer admin");
    assert!(
        stderr(&out).contains("needs the admin role"),
        "{}",
        stderr(&out)
    );

    // A role-less certificate from the operator CA, recorded as admin.
    let ca_cert = std::fs::read_to_string(server.dir.join("operator-ca.crt")).unwrap();
    let ca_key = rcgen::KeyPair::from_pem(
        &std::fs::read_to_string(server.dir.join("operator-ca.key")).unwrap(),
    )
    .unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_cert, ca_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        "urn:bc:operator:legacy".to_string().try_into().unwrap(),
    )];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    db.execute(
        "INSERT INTO operators (id, role, cert_sha256, cert_serial, created_at, not_after)
         VALUES ('legacy', 'admin', ?1, 'legacy-serial', 0, 9000000000000)",
        [bcd_proto::fingerprint(cert.der())],
    )
    .unwrap();
    let admin: serde_json::Value =
        serde_json::from_slice(&std::fs::read(server.dir.join("operator.json")).unwrap()).unwrap();
    let legacy = serde_json::json!({
        "server": admin["server"],
        "name": "legacy",
        "ca_pem": admin["ca_pem"],
        "cert_pem": cert.pem(),
        "key_pem": key.serialize_pem(),
    });
    let legacy_path = d.path().join("legacy.json");
    std::fs::write(&legacy_path, serde_json::to_vec(&legacy).unwrap()).unwrap();
    let out = as_op(&server, &legacy_path, &["nodes", "list"]);
    assert!(
        !out.status.success(),
        "a role-less certificate opened the API"
    );
    assert!(
        stderr(&out).contains("before operator certificates named their role")
            && stderr(&out).contains("operators add"),
        "{}",
        stderr(&out)
    );

    // As operator.json, it is replaced at the next start by an admin that works.
    std::fs::write(
        server.dir.join("operator.json"),
        serde_json::to_vec(&legacy).unwrap(),
    )
    .unwrap();
    server.restart().unwrap();
    let now: serde_json::Value =
        serde_json::from_slice(&std::fs::read(server.dir.join("operator.json")).unwrap()).unwrap();
    assert_ne!(now["cert_pem"], legacy["cert_pem"]);
    let out = server.cli(&["tokens", "create"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(server.proc.log().contains("names no role"));
}

/// Whoever can write the store clears an operator's revocation, or deletes
/// the row and adds it back: the key holder that read the signed
/// revocation refuses the certificate all the same, after a restart too.
/// A revocation no worker key signed, or one naming another certificate,
/// put on the admin's row revokes nothing.
#[test]
fn a_revocation_cleared_in_the_store_opens_nothing_and_a_planted_one_revokes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let mut server = Server::start(&d.path().join("server"), FAST).unwrap();
    let bob = d.path().join("bob.json");
    add_operator(&server, "bob", "admin", &bob);
    let out = as_op(&server, &bob, &["nodes", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = server.cli(&["operators", "revoke", "bob"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let statement: Vec<u8> = db
        .query_row(
            "SELECT revocation FROM operators WHERE id = 'bob'",
            [],
            |r| r.get(0),
        )
        .expect("the signed revocation beside the row");
    db.execute(
        "UPDATE operators SET revoked_at = NULL, revocation = NULL WHERE id = 'bob'",
        [],
    )
    .unwrap();
    let refused = |server: &Server| {
        let out = as_op(server, &bob, &["nodes", "list"]);
        assert!(!out.status.success(), "a cleared revocation opened the API");
        assert!(
            stderr(&out).contains("operator bob was revoked"),
            "{}",
            stderr(&out)
        );
    };
    refused(&server);
    // The row deleted and written again as it was before the revocation.
    let row: (String, String, String, i64, i64) = db
        .query_row(
            "SELECT role, cert_sha256, cert_serial, created_at, not_after FROM operators \
             WHERE id = 'bob'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    db.execute("DELETE FROM operators WHERE id = 'bob'", [])
        .unwrap();
    db.execute(
        "INSERT INTO operators (id, role, cert_sha256, cert_serial, created_at, not_after) \
         VALUES ('bob', ?1, ?2, ?3, ?4, ?5)",
        rusqlite::params![row.0, row.1, row.2, row.3, row.4],
    )
    .unwrap();
    refused(&server);
    server.proc.stop();
    server.start_again().expect("the server starts again");
    refused(&server);

    // An operator revoked before revocations were signed (the column
    // alone): revoking it again signs its revocation, at its time.
    let carol = d.path().join("carol.json");
    add_operator(&server, "carol", "read-only", &carol);
    db.execute(
        "UPDATE operators SET revoked_at = 5, revocation = NULL WHERE id = 'carol'",
        [],
    )
    .unwrap();
    let out = server.cli(&["operators", "revoke", "carol"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (at, signed): (i64, Option<Vec<u8>>) = db
        .query_row(
            "SELECT revoked_at, revocation FROM operators WHERE id = 'carol'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(at, 5);
    assert!(signed.is_some(), "the earlier revocation is signed now");

    // Planted on the admin's row: bytes no worker key signed, and bob's
    // own signed revocation.
    for planted in [b"not a revocation".to_vec(), statement] {
        db.execute(
            "UPDATE operators SET revocation = ?1 WHERE role = 'admin' AND id <> 'bob'",
            [&planted],
        )
        .unwrap();
        let out = server.cli(&["nodes", "list"]);
        assert!(
            out.status.success(),
            "a planted revocation locked the admin out: {}",
            stderr(&out)
        );
    }
}
