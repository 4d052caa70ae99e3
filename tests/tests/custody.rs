//! Key custody: a gateway process started from a directory with no private
//! key serves a fleet (join, commands, specs, renewal, an upgrade) through
//! the key-holding process's GatewayServices port, and a gateway that turns
//! against the fleet can mint nothing through that port.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use bc_tests::gateways::{
    add_gateway, gateway_port, runtime, sign, start_gateway, start_gateway_on,
};
use bc_tests::{FAST, Node, Server, section, static_bcd, stderr, wait_for};
use bcd_proto::tls::{self, ClientIdentity, ServerTrust};
use bcd_proto::v1::{
    CertifyRequest, ForwardedRenew, JoinRequest, RenewRequest,
    gateway_services_client::GatewayServicesClient,
};
use better_compute::gateway::credential::{self, GatewayCredential};
use rcgen::{CertificateParams, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn assert_keyless(dir: &Path) {
    let all = files(dir);
    assert!(!all.is_empty());
    for f in all {
        let bytes = std::fs::read(&f).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains("PRIVATE KEY"),
            "{} holds a private key",
            f.display()
        );
        assert_ne!(
            f.extension().and_then(|e| e.to_str()),
            Some("key"),
            "{}",
            f.display()
        );
    }
}

#[test]
fn a_gateway_from_a_keyless_directory_serves_join_commands_specs_renewal_and_an_upgrade() {
    let f = bc_tests::fleet_with(&["--node-cert-ttl", "20s"]);
    let cred = f.d.path().join("gw-edge.json");
    let printed = add_gateway(&f.server, "gw-edge", &cred);
    assert!(
        !printed.contains("CREATE ROLE"),
        "no database role on SQLite"
    );
    let store = format!("sqlite:{}", f.server.dir.join("store.db").display());
    a_keyless_gateway_serves_everything(&f, &cred, &store);
}

/// The same on PostgreSQL, the gateway connecting as the database role
/// `gateways add` printed the SQL for: a gateway's grants only, and
/// everything a node needs still works through it.
#[test]
fn a_gateway_on_postgresql_serves_everything_under_a_gateways_grants_only() {
    let url = bc_tests::postgres_database("custody");
    let f = bc_tests::fleet_on(Some(&url), &["--node-cert-ttl", "20s"]);
    let cred = f.d.path().join("gw-edge.json");
    let printed = add_gateway(&f.server, "gw-edge", &cred);
    let gw_url = bc_tests::gateways::database_role(&url, &printed);
    a_keyless_gateway_serves_everything(&f, &cred, &gw_url);
}

fn a_keyless_gateway_serves_everything(f: &bc_tests::Fleet, cred: &Path, store: &str) {
    let gw_dir = f.d.path().join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(cred).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let gw = start_gateway_on(store, &gw_dir, cred, "gw-edge-1");

    // Join through the gateway: the token's pin is the fleet CA's, and the
    // gateway's certificate chains to it.
    let mut node = Node::new(&f.d.path().join("n1"), 0);
    node.host_root = Some(PathBuf::from("/"));
    node.binary = Some(static_bcd());
    let out = node.join(&gw.url(), &f.server.token(1));
    assert!(
        out.status.success(),
        "join through the gateway: {}",
        stderr(&out)
    );
    let id = node.id();
    let first = node.identity();
    node.supervise(
        &["--restart-delay", "200ms", "--grace", "1s"],
        &["--confirm-within", "4s"],
    );
    f.server
        .wait_node(&id, "connected through the gateway", |n| {
            n.state == "connected" && n.gateway == "gw-edge-1"
        });

    // A signed command, relayed verbatim from the store.
    let cmd = f
        .server
        .run_command(&id, "exec.run", &["/bin/echo", "custody"]);
    let c = f.server.wait_command(&cmd);
    assert_eq!(c.state, "succeeded", "{c:?}");

    // A tunnel through the gateway: the key holder asks it over the
    // gateway services port, the gateway relays it sealed, the node
    // checks the key holder's ticket.
    let o = f.server.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo through $(hostname >/dev/null && echo the gateway); exit 3",
    ]);
    assert_eq!(stdout(&o), "through the gateway\n", "{}", stderr(&o));
    assert_eq!(o.status.code(), Some(3));

    // A signed spec: access for a user.
    let access = f.d.path().join("access.json");
    std::fs::write(
        &access,
        serde_json::json!({"users": [{"name": "alice", "authorized_keys": [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"
        ]}]})
        .to_string(),
    )
    .unwrap();
    let o = f
        .server
        .cli(&["nodes", "access", &id, "--file", access.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    wait_for(Duration::from_secs(30), "access applied", || {
        let v = f.server.spec(&id);
        (section(&v, "access")["status"] == "READY"
            && v["applied_generation"] == v["desired_generation"])
            .then_some(())
    });

    // Renewal through the gateway, proven by the node's current key.
    wait_for(Duration::from_secs(40), "a renewed certificate", || {
        (node.identity()["cert_serial"] != first["cert_serial"]).then_some(())
    });
    assert!(
        f.server.proc.log().contains("certificate renewed"),
        "the key-holding process issued it"
    );

    // An upgrade: the release comes from the store through the gateway.
    f.release(&f.bcd_release("0.2.0"), "0.2.0", 2);
    let up = f.server.run_command(&id, "daemon.upgrade", &["2"]);
    let c = wait_for(Duration::from_secs(90), "the upgrade to finish", || {
        Some(f.server.command(&up)).filter(|c| c.is_terminal())
    });
    assert_eq!(c.state, "succeeded", "{c:?}\n{}", node.proc().log());
    assert!(c.output.contains("confirmed"), "{}", c.output);

    // Nothing the gateway did was refused by the database.
    assert!(
        !gw.proc.log().contains("permission denied"),
        "{}",
        gw.proc.log()
    );
    // The gateway held no key at any point: nothing in its directory.
    assert_keyless(&gw_dir);
    assert!(
        gw.proc
            .log()
            .contains("serving as a gateway holding no key"),
        "{}",
        gw.proc.log()
    );
    node.proc().kill();
}

/// The message of a refusal; a granted call fails the test.
fn refused<T>(r: Result<tonic::Response<T>, tonic::Status>) -> String {
    match r {
        Ok(_) => panic!("a forged call was granted"),
        Err(s) => s.message().to_string(),
    }
}

fn csr(key: &KeyPair) -> Vec<u8> {
    CertificateParams::default()
        .serialize_request(key)
        .unwrap()
        .der()
        .to_vec()
}

/// The server's SQLite store, opened as whoever can write the file: with
/// the functions its audit triggers call (the store's clock and chains).
fn store_db(server: &Server) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.create_scalar_function(
        "compute_now",
        0,
        rusqlite::functions::FunctionFlags::SQLITE_UTF8,
        |_| Ok(now_ms()),
    )
    .unwrap();
    bc_store::sqlite::audit_functions(&db).unwrap();
    db
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A renewal of `node`'s certificate to `key`, its proof of possession
/// made by `key` itself (a gateway's own key, not the node's).
fn self_proved(node: &str, now: i64, key: &KeyPair) -> RenewRequest {
    let csr_der = csr(key);
    let statement = bcd_proto::renew::statement(node, now, &csr_der);
    RenewRequest {
        proof: sign(&key.serialize_pem(), &statement),
        csr_der,
        proof_time_ms: now,
        node_id: node.to_string(),
        ..Default::default()
    }
}

#[test]
fn a_gateway_can_mint_nothing_and_a_revoked_one_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let cred_path = d.path().join("gw-a.json");
    add_gateway(&server, "gw-a", &cred_path);
    let gw = start_gateway(&server, &d.path().join("gateway"), &cred_path, "gw-a-1");
    let mut node = Node::new(&d.path().join("n"), 7);
    let out = node.join(&gw.url(), &server.token(1));
    assert!(
        out.status.success(),
        "{}\n{}",
        stderr(&out),
        server.proc.log()
    );
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected through the gateway", |n| {
        n.state == "connected" && n.gateway == "gw-a-1"
    });
    let before = node.identity()["cert_serial"].clone();
    let node_cert = CertificateDer::from_pem_file(node.dir.join("node.crt")).unwrap();
    let node_key = std::fs::read_to_string(node.dir.join("node.key")).unwrap();

    // What a compromised gateway holds: its credential and a certificate
    // for a key of its own.
    let cred = GatewayCredential::read(&cred_path).unwrap();
    let rt = runtime();
    let (certified, mut port) = gateway_port(&rt, &cred);
    let attacker = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let now = now_ms();
    let forward = |request: RenewRequest| ForwardedRenew {
        node_cert_der: node_cert.to_vec(),
        request: Some(request),
    };

    // A renewal of the node's certificate for the gateway's key, with no
    // proof (what a node older than the proof sends): refused.
    let m = refused(rt.block_on(port.renew(forward(RenewRequest {
        csr_der: csr(&attacker),
        ..Default::default()
    }))));
    assert!(m.contains("needs a proof of possession"), "{m}");
    // A proof signed by the gateway's own key: refused.
    let attacker_csr = csr(&attacker);
    let m = refused(rt.block_on(port.renew(forward(self_proved(&id, now, &attacker)))));
    assert!(m.contains("not made by the current node key"), "{m}");
    // A real proof of the node's, replayed ten minutes later: refused.
    let old = now - 600_000;
    let statement = bcd_proto::renew::statement(&id, old, &attacker_csr);
    let m = refused(rt.block_on(port.renew(forward(RenewRequest {
        csr_der: attacker_csr.clone(),
        proof: sign(&node_key, &statement),
        proof_time_ms: old,
        node_id: id.clone(),
        ..Default::default()
    }))));
    assert!(m.contains("away from the server's time"), "{m}");
    // A real proof for one key moved to another: refused.
    let other = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let statement = bcd_proto::renew::statement(&id, now, &csr(&other));
    let m = refused(rt.block_on(port.renew(forward(RenewRequest {
        csr_der: attacker_csr,
        proof: sign(&node_key, &statement),
        proof_time_ms: now,
        node_id: id.clone(),
        ..Default::default()
    }))));
    assert!(m.contains("not made by the current node key"), "{m}");
    assert!(
        !server.proc.log().contains("certificate renewed"),
        "no certificate was issued"
    );
    assert_eq!(node.identity()["cert_serial"], before);

    // The port takes only a gateway's certificate.
    let ca = cred.ca().unwrap();
    let anonymous = rt
        .block_on(tls::connect(
            &cred.upstream,
            tls::client_config(ServerTrust::Ca(ca.clone()), None).unwrap(),
        ))
        .unwrap();
    let m = refused(
        rt.block_on(GatewayServicesClient::new(anonymous.clone()).join(JoinRequest::default())),
    );
    assert!(m.contains("need a gateway's certificate"), "{m}");
    let as_node = rt
        .block_on(tls::connect(
            &cred.upstream,
            tls::client_config(
                ServerTrust::Ca(ca.clone()),
                Some(ClientIdentity {
                    chain: vec![node_cert.clone()],
                    key: rustls_pki_types::PrivateKeyDer::from_pem_slice(node_key.as_bytes())
                        .unwrap(),
                }),
            )
            .unwrap(),
        ))
        .unwrap();
    let m = refused(rt.block_on(GatewayServicesClient::new(as_node).join(JoinRequest::default())));
    assert!(m.contains("names no gateway"), "{m}");
    // A wrong secret certifies nothing.
    let m = refused(rt.block_on(
        GatewayServicesClient::new(anonymous).certify(CertifyRequest {
            name: "gw-a".into(),
            secret: "bcg1.guess".into(),
            csr_der: csr(&attacker),
            names: vec![],
        }),
    ));
    assert!(m.contains("not known to this server"), "{m}");

    // A join relayed with keys of the gateway's own in the response: the
    // node checks the fleet CA's signature and saves nothing.
    let relay = TamperingRelay::start(&rt, &certified, port.clone());
    let victim = Node::new(&d.path().join("victim"), 8);
    let out = victim.join(&relay, &server.token(1));
    assert!(!out.status.success(), "a tampered join response was taken");
    assert!(
        stderr(&out).contains("not signed by the fleet CA the token pins"),
        "{}",
        stderr(&out)
    );
    assert!(!victim.dir.join("identity.json").exists());

    // Revoked: the certificate it holds stops working at the port, and a
    // gateway started with the credential does not start.
    let o = server.cli(&["gateways", "revoke", "gw-a"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = refused(rt.block_on(port.join(JoinRequest::default())));
    assert!(m.contains("revoked or replaced"), "{m}");
    let mut again = FAST.to_vec();
    let store = format!("sqlite:{}", server.dir.join("store.db").display());
    again.extend([
        "--role",
        "gateway",
        "--credential",
        cred_path.to_str().unwrap(),
        "--store",
        &store,
    ]);
    let e = Server::start(&d.path().join("gateway2"), &again).unwrap_err();
    assert!(
        format!("{e:#}").contains("refused to certify this gateway"),
        "{e:#}"
    );
    let listed = server.cli(&["gateways", "list"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains("gw-a"), "{text}");
    node.proc().kill();
}

/// A compromised gateway's Join service: it relays joins to the port and
/// puts a worker key of its own into every response.
#[derive(Debug, Clone)]
struct TamperingRelay {
    port: GatewayServicesClient<tonic::transport::Channel>,
}

impl TamperingRelay {
    /// Serves on an ephemeral loopback port with the gateway's certified
    /// serving key; returns its URL.
    fn start(
        rt: &tokio::runtime::Runtime,
        certified: &credential::Certified,
        port: GatewayServicesClient<tonic::transport::Channel>,
    ) -> String {
        let config = tls::server_config(
            certified.chain.clone(),
            certified.key(),
            certified.chain.last().unwrap().clone(),
        )
        .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = rt.block_on(async {
            tls::incoming(
                listener,
                config,
                std::sync::Arc::new(tls::AdmitAll),
                tls::ConnectionCaps {
                    total: 16,
                    per_address: 16,
                    balancers: Vec::new(),
                },
            )
        });
        rt.spawn(
            tonic::transport::Server::builder()
                .add_service(bcd_proto::v1::join_server::JoinServer::new(
                    TamperingRelay { port },
                ))
                .serve_with_incoming(incoming),
        );
        format!("https://{addr}")
    }
}

#[tonic::async_trait]
impl bcd_proto::v1::join_server::Join for TamperingRelay {
    async fn join(
        &self,
        request: tonic::Request<JoinRequest>,
    ) -> Result<tonic::Response<bcd_proto::v1::JoinResponse>, tonic::Status> {
        let mut r = self
            .port
            .clone()
            .join(request.into_inner())
            .await?
            .into_inner();
        r.worker_keys = vec![vec![0x66; 32]];
        Ok(tonic::Response::new(r))
    }

    async fn begin_attestation(
        &self,
        request: tonic::Request<bcd_proto::v1::AttestationRequest>,
    ) -> Result<tonic::Response<bcd_proto::v1::AttestationChallenge>, tonic::Status> {
        self.port
            .clone()
            .begin_attestation(request.into_inner())
            .await
    }

    async fn renew(
        &self,
        _: tonic::Request<RenewRequest>,
    ) -> Result<tonic::Response<bcd_proto::v1::RenewResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not relayed"))
    }

    async fn fetch_secret(
        &self,
        _: tonic::Request<bcd_proto::v1::SecretRequest>,
    ) -> Result<tonic::Response<bcd_proto::v1::SecretDelivery>, tonic::Status> {
        Err(tonic::Status::unimplemented("not relayed"))
    }

    async fn fetch_release(
        &self,
        _: tonic::Request<bcd_proto::v1::FetchReleaseRequest>,
    ) -> Result<tonic::Response<bcd_proto::v1::FetchReleaseResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not relayed"))
    }

    type FetchReleaseChunksStream =
        tokio_stream::wrappers::ReceiverStream<Result<bcd_proto::v1::ReleaseChunk, tonic::Status>>;

    async fn fetch_release_chunks(
        &self,
        _: tonic::Request<bcd_proto::v1::FetchReleaseRequest>,
    ) -> Result<tonic::Response<Self::FetchReleaseChunksStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not relayed"))
    }

    type FetchImageStream =
        tokio_stream::wrappers::ReceiverStream<Result<bcd_proto::v1::ImageChunk, tonic::Status>>;

    async fn fetch_image(
        &self,
        _: tonic::Request<bcd_proto::v1::FetchImageRequest>,
    ) -> Result<tonic::Response<Self::FetchImageStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not relayed"))
    }
}

/// What a gateway with write access to the store plants: a self-signed
/// certificate naming the victim, for a key of the gateway's, inserted
/// into `node_certs` beside the victim's real one (same identity
/// generation and times). The fleet CA never issued it, so it backs
/// neither a relayed renewal nor a re-enrolment proof, and the relayed
/// renewal is recorded against the node.
#[test]
fn a_certificate_planted_in_the_store_backs_no_renewal_and_no_re_enrolment() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let cred_path = d.path().join("gw-a.json");
    add_gateway(&server, "gw-a", &cred_path);
    let mut node = Node::new(&d.path().join("n"), 9);
    assert!(node.join(&server.url(), &server.token(2)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let before = node.identity()["cert_serial"].clone();

    let attacker = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        format!("urn:bc:node:{id}").try_into().unwrap(),
    )];
    let planted = params.self_signed(&attacker).unwrap().der().to_vec();
    let db = store_db(&server);
    let (generation, not_before, not_after): (i64, i64, i64) = db
        .query_row(
            "SELECT identity_generation, not_before, not_after FROM node_certs
             WHERE node_id = ?1 AND revoked_at IS NULL",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    db.execute(
        "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before,
             not_after, der)
         VALUES ('00aa00aa00aa00aa00aa00aa00aa00aa', ?1, ?2, ?3, ?4, ?5, ?6)",
        rusqlite::params![
            id,
            bcd_proto::fingerprint(&planted),
            generation,
            not_before,
            not_after,
            planted
        ],
    )
    .unwrap();

    let cred = GatewayCredential::read(&cred_path).unwrap();
    let rt = runtime();
    let (_, mut port) = gateway_port(&rt, &cred);
    let now = now_ms();

    // A renewal of the planted certificate, its proof made by the key it
    // names: refused, nothing issued, the forgery recorded.
    let m = refused(rt.block_on(port.renew(ForwardedRenew {
        node_cert_der: planted.clone(),
        request: Some(self_proved(&id, now, &attacker)),
    })));
    assert!(m.contains("not issued by this fleet's CA"), "{m}");
    assert!(!server.proc.log().contains("certificate renewed"));
    let events = server.spec(&id)["events"].to_string();
    assert!(
        events.contains("security.certificate.forged") && events.contains("gateway gw-a"),
        "{events}"
    );
    // The fleet's event list shows it, by kind and by node.
    let listed = server.cli(&["events", "--kind", "security.*"]);
    let text = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(
        text.lines()
            .any(|l| l.contains("security.certificate.forged") && l.contains(&id)),
        "{text}"
    );
    let other = server.cli(&["events", "--node", "nd-nobody", "--json"]);
    assert!(other.status.success() && other.stdout.is_empty());
    let json = server.cli(&["events", "--node", &id, "--json"]);
    let first: serde_json::Value = serde_json::from_slice(
        String::from_utf8_lossy(&json.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(first["node_id"], id.as_str());
    // And the node, whole: its identity, session and the same event.
    let shown = server.cli(&["nodes", "show", &id]);
    let text = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(shown.status.success(), "{}", stderr(&shown));
    for want in [
        format!("node        {id}"),
        "state       connected".to_string(),
        "certificate expires".to_string(),
        "security.certificate.forged".to_string(),
    ] {
        assert!(text.contains(&want), "{want} in {text}");
    }
    assert!(
        text.contains("tpm ek      - (joined with a token"),
        "{text}"
    );
    let shown = server.cli(&["nodes", "show", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(v["node"]["node_id"], id.as_str());
    // Its GPUs, from the inventory its fake hardware reported, in both.
    let gpus = v["gpus"].as_array().expect("gpus").clone();
    assert!(!gpus.is_empty(), "{v}");
    assert!(
        text.contains(&format!("gpus        {} (reported", gpus.len())),
        "{text}"
    );
    for g in &gpus {
        let pci = g["pci_address"].as_str().unwrap();
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(pci)),
            "{pci} in {text}"
        );
    }
    assert!(v["events"].as_array().is_some_and(|e| !e.is_empty()), "{v}");
    let missing = server.cli(&["nodes", "show", "nd-nobody"]);
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("there is no node nd-nobody"));

    // A join that claims the victim's identity by the planted key: refused,
    // the token unspent, the node still its own.
    let token = server.token(1);
    let parts: Vec<&str> = token.split('.').collect();
    let (token_id, secret) = (parts[1], parts[2]);
    let joiner = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let joiner_csr = csr(&joiner);
    let statement = bcd_proto::reenrol::statement(&id, token_id, &joiner_csr);
    let seal_key = bcd_proto::token::JoinToken::parse(&token)
        .unwrap()
        .seal_key
        .unwrap();
    let sealed_token = bcd_proto::seal::seal(
        &seal_key,
        format!("{token_id}.{secret}").as_bytes(),
        &bcd_proto::seal::aad(&joiner_csr),
    )
    .unwrap();
    let m = refused(rt.block_on(port.join(JoinRequest {
        sealed_token,
        csr_der: joiner_csr,
        hostname: "attacker".into(),
        previous: Some(bcd_proto::v1::PreviousIdentity {
            node_id: id.clone(),
            signature: sign(&attacker.serialize_pem(), &statement),
        }),
        ..Default::default()
    })));
    assert!(
        m.contains(&format!("cannot re-enrol node {id}"))
            && m.contains("not signed by the key of its current certificate"),
        "{m}"
    );
    assert_eq!(node.identity()["cert_serial"], before);
    let listed = server.cli(&["tokens", "list"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains(token_id),
        "the refused join spent the token"
    );
    server.wait_node(&id, "still connected as itself", |n| n.state == "connected");
    node.proc().kill();
}

/// What a gateway with write access to the store adds for itself: a
/// gateway credential and a join token, each with a secret of its own and
/// that secret's SHA-256 in the row. The key holder digests secrets under
/// a key derived from the fleet CA, so neither row admits anything: the
/// credential certifies no serving key, and the token joins no node.
#[test]
fn a_credential_or_token_planted_in_the_store_admits_nothing() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let cred_path = d.path().join("gw-a.json");
    add_gateway(&server, "gw-a", &cred_path);
    let db = store_db(&server);
    let secret = "bcg1.0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    db.execute(
        "INSERT INTO gateway_credentials (name, secret_sha256, created_at)
         VALUES ('evil', ?1, 0)",
        [bcd_proto::fingerprint(secret.as_bytes())],
    )
    .unwrap();
    let (token_id, token_secret) = ("0123456789abcdef", "0123456789abcdef0123456789abcdef");
    db.execute(
        "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total,
             uses_left)
         VALUES (?1, ?2, 0, 9000000000000, 100, 100)",
        [token_id, &bcd_proto::fingerprint(token_secret.as_bytes())],
    )
    .unwrap();

    // Certify with the planted credential's name and secret.
    let cred = GatewayCredential::read(&cred_path).unwrap();
    let rt = runtime();
    let ca = cred.ca().unwrap();
    let anonymous = rt
        .block_on(tls::connect(
            &cred.upstream,
            tls::client_config(ServerTrust::Ca(ca), None).unwrap(),
        ))
        .unwrap();
    let attacker = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let certify = |name: &str| {
        refused(
            rt.block_on(
                GatewayServicesClient::new(anonymous.clone()).certify(CertifyRequest {
                    name: name.into(),
                    secret: secret.into(),
                    csr_der: csr(&attacker),
                    names: vec![],
                }),
            ),
        )
    };
    // Its SHA-256 is what a credential row held before digests were keyed:
    // refused, saying to add the gateway again.
    let m = certify("evil");
    assert!(m.contains("no longer certifies"), "{m}");
    // Any other digest the attacker can compute without the CA's key.
    db.execute(
        "INSERT INTO gateway_credentials (name, secret_sha256, created_at)
         VALUES ('evil2', ?1, 0)",
        [bcd_proto::fingerprint(
            bcd_proto::fingerprint(secret.as_bytes()).as_bytes(),
        )],
    )
    .unwrap();
    let m = certify("evil2");
    assert!(m.contains("not known to this server"), "{m}");
    // The real credential still certifies.
    assert!(rt.block_on(credential::certify(&cred, &[])).is_ok());

    // A node joining with the planted token.
    let victim = Node::new(&d.path().join("n"), 10);
    let real = server.token(1);
    let (pin, seal) = (
        real.split('.').nth(3).unwrap(),
        real.split('.').nth(4).unwrap(),
    );
    let out = victim.join(
        &server.url(),
        &format!("bct2.{token_id}.{token_secret}.{pin}.{seal}"),
    );
    assert!(!out.status.success(), "a planted token joined a node");
    assert!(
        stderr(&out).contains("not known to this server"),
        "{}",
        stderr(&out)
    );
    assert!(!victim.dir.join("identity.json").exists());
    assert!(server.nodes().is_empty());
}

/// What a gateway with write access to the store makes of results: a real
/// result's output rewritten under its signature (once the file's owner
/// drops the trigger that keeps a finished ending), and a success written
/// where no node reported one. The key holder judges each from the bytes
/// the node signed: both are shown FORGED (in `commands show`, `list` and
/// `--json`), the untouched one as signed by the node.
#[test]
fn a_result_rewritten_or_made_up_in_the_store_is_reported_forged() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 9);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let honest = server.run_command(&id, "exec.run", &["/bin/echo", "honest"]);
    let rewritten = server.run_command(&id, "exec.run", &["/bin/echo", "real"]);
    for c in [&honest, &rewritten] {
        let c = server.wait_command(c);
        assert_eq!(
            (c.state.as_str(), c.evidence.as_str()),
            ("succeeded", "node-signed")
        );
    }
    // A command the node never ran: it is away.
    node.proc().kill();
    let made_up = server.run_command(&id, "exec.run", &["/bin/false"]);

    let db = store_db(&server);
    // A finished command's ending is written once: the database refuses
    // the rewrite. Whoever owns the file can drop the trigger; the reader
    // still tells the rewrite from the node's result.
    let rewrite = "UPDATE commands SET output = CAST('forged' AS BLOB) WHERE id = ?1";
    let refused = db.execute(rewrite, [&rewritten]).unwrap_err().to_string();
    assert!(refused.contains("written once"), "{refused}");
    db.execute_batch("DROP TRIGGER ending_written_once")
        .unwrap();
    db.execute(rewrite, [&rewritten]).unwrap();
    db.execute(
        "UPDATE commands SET state = 'succeeded', exit_code = 0, output = CAST('ok' AS BLOB),
             result_at = created_at WHERE id = ?1",
        [&made_up],
    )
    .unwrap();

    let c = server.command(&honest);
    assert_eq!(
        (c.evidence.as_str(), c.output.trim()),
        ("node-signed", "honest")
    );
    let shown = server.cli(&["commands", "show", &honest]);
    assert!(
        stdout(&shown).contains("signed by the node"),
        "{}",
        stdout(&shown)
    );
    for (cmd, why) in [
        (&rewritten, "the row says succeeded () but node"),
        (&made_up, "no node signed it"),
    ] {
        let c = server.command(cmd);
        assert_eq!(c.evidence, "forged", "{c:?}");
        assert!(c.evidence_detail.contains(why), "{c:?}");
        let shown = stdout(&server.cli(&["commands", "show", cmd]));
        assert!(shown.contains("FORGED"), "{shown}");
        assert!(
            !shown.contains("output"),
            "nothing of it shown as the node's: {shown}"
        );
    }
    let list = stdout(&server.cli(&["commands", "list", "--node", &id]));
    assert_eq!(list.matches("FORGED").count(), 2, "{list}");

    // check names both, and only them.
    let out = server.cli(&["check"]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("RS results signed"), "{text}");
    for cmd in [&rewritten, &made_up] {
        assert!(
            text.contains(&format!("command {cmd} of node {id}: forged")),
            "{text}"
        );
    }
    assert!(!text.contains(&format!("command {honest}")), "{text}");
}

/// A node's release floor rises only from an upgrade result its node
/// signed, as the key holder verifies it: a success made up in the store
/// (what a gateway with its access could write) is judged once, raises no
/// floor, and so stops none of the node's upgrades.
#[test]
fn an_upgrade_made_up_in_the_store_raises_no_release_floor() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let node = Node::new(&d.path().join("n"), 12);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    // The node is away: the command waits, and the store's row is made
    // into a confirmed upgrade to a release far ahead.
    let cmd = server.run_command(&id, "exec.run", &["/bin/true"]);
    let db = store_db(&server);
    db.execute(
        "UPDATE commands SET kind = 'daemon.upgrade', summary = 'release 77',
             state = 'succeeded', exit_code = 0, result_at = created_at WHERE id = ?1",
        [&cmd],
    )
    .unwrap();
    bc_tests::wait_for(
        Duration::from_secs(20),
        "the key holder judging the made-up upgrade",
        || {
            db.query_row(
                "SELECT floor_judged FROM commands WHERE id = ?1",
                [&cmd],
                |r| r.get::<_, i64>(0),
            )
            .ok()
            .filter(|j| *j == 1)
        },
    );
    let floor: i64 = db
        .query_row(
            "SELECT release_floor FROM nodes WHERE id = ?1",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(floor, 0, "a floor raised from a result no node signed");
    let c = server.command(&cmd);
    assert_eq!(c.evidence, "forged", "{c:?}");
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A join token is sealed to the join service, under the CSR it comes
/// with: a gateway that relays it reads nothing it could spend, and the
/// sealed bytes moved to a request for a key of its own open as nothing.
/// A bct1 token (its secret in the clear) is refused through a gateway,
/// saying what to do, and still joins through the key holder's own
/// listener. Nothing refused spends the token.
#[test]
fn a_relayed_join_token_is_sealed_and_a_plain_one_is_refused_through_a_gateway() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let cred_path = d.path().join("gw-a.json");
    add_gateway(&server, "gw-a", &cred_path);
    let cred = GatewayCredential::read(&cred_path).unwrap();
    let rt = runtime();
    let (_, mut port) = gateway_port(&rt, &cred);

    let printed = server.token(2);
    assert!(printed.starts_with("bct2."), "{printed}");
    let token = bcd_proto::token::JoinToken::parse(&printed).unwrap();
    let seal_key = token.seal_key.unwrap();
    let node_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let node_csr = csr(&node_key);
    let sealed_token = bcd_proto::seal::seal(
        &seal_key,
        token.credential().as_bytes(),
        &bcd_proto::seal::aad(&node_csr),
    )
    .unwrap();
    assert!(
        !sealed_token
            .windows(token.secret.len())
            .any(|w| w == token.secret.as_bytes()),
        "the secret travels in the clear"
    );
    // Uses left, from `tokens list` ("ID LEFT/TOTAL ...").
    let unspent = |server: &Server| {
        let listed = server.cli(&["tokens", "list"]);
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .find(|l| l.starts_with(&token.id))
            .and_then(|l| {
                l.split_whitespace()
                    .nth(1)?
                    .split('/')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
    };
    assert_eq!(unspent(&server), Some(2));

    // The gateway moves the sealed token to a CSR of its own.
    let gateway_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let m = refused(rt.block_on(port.join(JoinRequest {
        sealed_token: sealed_token.clone(),
        csr_der: csr(&gateway_key),
        hostname: "gateway-owned".into(),
        ..Default::default()
    })));
    assert!(m.contains("does not open"), "{m}");
    // The plain credential, relayed: refused, with what to do.
    let m = refused(rt.block_on(port.join(JoinRequest {
        token: token.credential(),
        csr_der: node_csr.clone(),
        hostname: "plain".into(),
        ..Default::default()
    })));
    assert!(
        m.contains("bct1 join token") && m.contains("tokens create"),
        "{m}"
    );
    assert_eq!(unspent(&server), Some(2), "a refused join spent the token");

    // The node's own request, relayed as it is: joins.
    let joined = rt
        .block_on(port.join(JoinRequest {
            sealed_token,
            csr_der: node_csr,
            hostname: "sealed".into(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    assert!(!joined.node_id.is_empty());
    assert_eq!(unspent(&server), Some(1));

    // The same token written the old way joins through the key holder's
    // own listener.
    let old = format!("bct1.{}.{}.{}", token.id, token.secret, token.ca_pin);
    let node = Node::new(&d.path().join("n"), 9);
    let out = node.join(&server.url(), &old);
    assert!(out.status.success(), "{}", stderr(&out));
    // Spent: no use left (a spent token leaves the list).
    assert_eq!(unspent(&server).unwrap_or(0), 0);
}

/// What a gateway with write access to the store makes of the clone watch:
/// sightings of a node's certificate from machines that do not exist,
/// back and forth between boots, with no proof, with a proof signed by a
/// key of its own, with the node's real proof moved to another boot, and
/// the real one replayed; then the node's next Hello. The key holder
/// believes only proofs it verifies: every forged sighting is dropped
/// with a `security.hello.forged` event, the node is not quarantined and
/// keeps its session.
#[test]
fn fabricated_sightings_quarantine_nobody() {
    use prost::Message;
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 9);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let db = store_db(&server);
    // The node's own proved sighting, as its gateway recorded it.
    let (serial, boot, seq, proof, signature) = wait_for(
        Duration::from_secs(20),
        "the node's proved sighting",
        || {
            db.query_row(
                "SELECT s.serial, s.boot_id, s.seq, s.proof, s.proof_signature
                 FROM cert_sightings s JOIN node_certs c ON c.serial = s.serial
                 WHERE c.node_id = ?1 AND s.proof IS NOT NULL",
                [&id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Vec<u8>>(3)?,
                        r.get::<_, Vec<u8>>(4)?,
                    ))
                },
            )
            .ok()
        },
    );
    let attacker = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let forge = |boot: &str, seq: i64| {
        let p = bcd_proto::v1::HelloProof {
            domain: bcd_proto::hello::DOMAIN.into(),
            node_id: id.clone(),
            cert_serial: serial.clone(),
            boot_id: boot.into(),
            seq: seq as u64,
            ..Default::default()
        }
        .encode_to_vec();
        let sig = sign(
            &attacker.serialize_pem(),
            &bcd_proto::hello::signed_message(&p),
        );
        (p, sig)
    };
    let insert = |boot: &str, seq: i64, proof: Option<&[u8]>, sig: Option<&[u8]>| {
        db.execute(
            "INSERT INTO cert_sightings (serial, boot_id, at, seq, proof, proof_signature)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            rusqlite::params![serial, boot, now_ms(), seq, proof, sig],
        )
        .unwrap();
    };
    let mut planted = 0;
    for (i, b) in ["clone", &boot, "clone", &boot, "clone", &boot]
        .iter()
        .enumerate()
    {
        let at = seq + 1 + i as i64;
        // No proof at all; a proof of the attacker's key.
        insert(b, at, None, None);
        let (p, s) = forge(b, at);
        insert(b, at, Some(&p), Some(&s));
        planted += 2;
    }
    // The node's real proof, under another boot than it signed, and as is.
    insert("clone", seq, Some(&proof), Some(&signature));
    planted += 1;
    for _ in 0..3 {
        insert(&boot, seq, Some(&proof), Some(&signature));
    }
    // The node's next Hello reads the certificate's sightings.
    node.proc().kill();
    node.start();
    let events_of = |kind: &str| -> Vec<String> {
        let out = server.cli(&["events", "--node", &id, "--kind", kind, "--limit", "100"]);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(kind))
            .map(String::from)
            .collect()
    };
    let events = wait_for(Duration::from_secs(30), "every forgery recorded", || {
        let events = events_of("security.hello.forged");
        (events.len() >= planted).then_some(events)
    });
    assert_eq!(events.len(), planted, "{events:?}");
    for why in [
        "it carries no proof",
        "its signature is not by the certificate's key",
        "the row says",
    ] {
        assert!(events.iter().any(|e| e.contains(why)), "{why}: {events:?}");
    }
    // The pass that dropped the last forgery judged the certificate's
    // sightings first: a quarantine would be in by now.
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let n = server.node(&id).unwrap();
    assert_eq!(n.state, "connected", "{n:?}");
    let quarantined = events_of("security.node.quarantined");
    assert!(quarantined.is_empty(), "{quarantined:?}");
    let revoked: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM node_certs WHERE node_id = ?1 AND revoked_at IS NOT NULL",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(revoked, 0);
    // What is left are the node's own proofs, verified.
    let left: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM cert_sightings WHERE serial = ?1 AND proof IS NULL",
            [&serial],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
}

/// A sighting a gateway plants at an id far above the sequence's stalls
/// nothing: the watch reads what it has not read, whatever its id, so two
/// machines on one copied identity are still quarantined. (A watch that
/// read after the highest id it saw read nothing after that row; the
/// ids PostgreSQL's sequence hands out come below it. SQLite's come
/// above the highest, so this is PostgreSQL's.)
#[test]
fn a_sighting_planted_at_a_high_id_stalls_no_quarantine() {
    let url = bc_tests::postgres_database("planted");
    let f = bc_tests::fleet_on(Some(&url), &[]);
    let mut real = Node::new(&f.d.path().join("real"), 93);
    assert!(
        real.join(&f.server.url(), &f.server.token(1))
            .status
            .success()
    );
    let id = real.id();
    let copy_dir = f.d.path().join("copy");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(f.d.path().join("real"))
        .arg(&copy_dir)
        .status()
        .unwrap();
    assert!(status.success());
    let rt = runtime();
    let owner = rt.block_on(async {
        let config = bc_store::postgres::config(&url).unwrap();
        let (c, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        c
    });
    rt.block_on(owner.execute(
        "INSERT INTO cert_sightings (id, serial, boot_id, at, seq)
         SELECT 9000000000000000000, serial, 'planted', $2, 1 FROM node_certs WHERE node_id = $1",
        &[&id, &now_ms()],
    ))
    .unwrap();
    // The watch reads it, and drops it as the forgery it is.
    bc_tests::wait_for(Duration::from_secs(20), "the planted row dropped", || {
        let left: i64 = rt
            .block_on(owner.query_one(
                "SELECT COUNT(*) FROM cert_sightings WHERE boot_id = 'planted'",
                &[],
            ))
            .unwrap()
            .get(0);
        (left == 0).then_some(())
    });
    let mut copy = Node::new(&copy_dir, 94);
    real.start();
    f.server
        .wait_node(&id, "connected", |n| n.state == "connected");
    copy.start();
    bc_tests::wait_for(Duration::from_secs(60), "the quarantine", || {
        let out = f.server.cli(&[
            "events",
            "--node",
            &id,
            "--kind",
            "security.node.quarantined",
        ]);
        String::from_utf8_lossy(&out.stdout)
            .contains("security.node.quarantined")
            .then_some(())
    });
}

/// What a gateway with write access to the store makes of the endings a
/// Hello writes: a reboot command marked `succeeded` (`rebooted`) with the
/// proof of a real earlier reboot copied in, and a command failed
/// `journal-lost` with no proof. The node's signed Hello says which
/// commands it started and that it came back from another boot or
/// journal; neither row has that, so both read FORGED, and the real
/// reboot stays believed.
#[test]
fn a_hello_ending_written_in_the_store_is_reported_forged() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 9);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    let before = server.wait_node(&id, "connected", |n| n.state == "connected");
    let real = server.wait_command(&server.run_command(&id, "node.reboot", &[]));
    assert_eq!(
        (real.state.as_str(), real.reason.as_str()),
        ("succeeded", "rebooted")
    );
    server.wait_node(&id, "back from the reboot", |n| {
        n.state == "connected" && n.boot_id != before.boot_id
    });
    // Commands the node never gets: it is away.
    node.proc().kill();
    let reboot = server.run_command(&id, "node.reboot", &[]);
    let job = server.run_command(&id, "exec.run", &["/bin/true"]);

    let db = store_db(&server);
    let kept: (Option<Vec<u8>>, Option<Vec<u8>>) = db
        .query_row(
            "SELECT result_payload, result_signature FROM commands WHERE id = ?1",
            [&real.command_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    if kept.0.is_some() {
        // The real reboot ended by the node's Hello: its proof, copied.
        db.execute(
            "UPDATE commands SET state = 'succeeded', reason = 'rebooted', result_at = created_at,
                 result_payload = ?2, result_signature = ?3 WHERE id = ?1",
            rusqlite::params![reboot, kept.0, kept.1],
        )
        .unwrap();
    } else {
        db.execute(
            "UPDATE commands SET state = 'succeeded', reason = 'rebooted', result_at = created_at
             WHERE id = ?1",
            [&reboot],
        )
        .unwrap();
    }
    db.execute(
        "UPDATE commands SET state = 'failed', reason = 'journal-lost', result_at = created_at
         WHERE id = ?1",
        [&job],
    )
    .unwrap();

    let c = server.command(&real.command_id);
    assert!(
        matches!(c.evidence.as_str(), "decided" | "node-signed"),
        "{c:?}"
    );
    // The Hello of the real reboot kept its proof: copied, it shows the
    // node never started the later command.
    let copied = kept
        .0
        .as_deref()
        .is_some_and(|p| bcd_proto::hello::decode(p).is_ok());
    assert!(copied, "the real reboot keeps its Hello's proof: {real:?}");
    for (cmd, why) in [
        (&reboot, "says it started no command above sequence"),
        (&job, "no Hello its node signed shows a lost journal"),
    ] {
        let c = server.command(cmd);
        assert_eq!(c.evidence, "forged", "{c:?}");
        assert!(c.evidence_detail.contains(why), "{c:?}");
        let shown = stdout(&server.cli(&["commands", "show", cmd]));
        assert!(shown.contains("FORGED"), "{shown}");
    }
    let out = server.cli(&["check"]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    for cmd in [&reboot, &job] {
        assert!(
            text.contains(&format!("command {cmd} of node {id}: forged")),
            "{text}"
        );
    }
    assert!(
        !text.contains(&format!("command {}", real.command_id)),
        "{text}"
    );
}

/// Whether the node's log says it left a gateway for `why`, at least
/// `times` times.
fn left_for(node: &mut Node, why: &str, times: usize) -> bool {
    node.proc()
        .log()
        .lines()
        .filter(|l| l.contains("leaving the gateway") && l.contains(why))
        .count()
        >= times
}

/// A revoked gateway still holds its 30-day serving certificate and its
/// key. Nodes are handed the key holder's signed, short-lived list of
/// revoked gateway certificates by every gateway: a node on the revoked
/// one leaves it as soon as the list names it (its own gateway hands it
/// on, or another did earlier), and a gateway that withholds newer lists
/// is left once the node's list runs out. The list is kept across a
/// restart, so a restarted node refuses the revoked gateway too.
#[test]
fn a_revoked_gateway_is_left_and_one_that_withholds_the_list_is_left_when_it_runs_out() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--gateway-revocations-life", "4s"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let (cred_a, cred_b, cred_c) = (
        d.path().join("gw-a.json"),
        d.path().join("gw-b.json"),
        d.path().join("gw-c.json"),
    );
    add_gateway(&server, "gw-a", &cred_a);
    add_gateway(&server, "gw-b", &cred_b);
    add_gateway(&server, "gw-c", &cred_c);
    let a = start_gateway(&server, &d.path().join("a"), &cred_a, "gw-a-1");
    let b = start_gateway(&server, &d.path().join("b"), &cred_b, "gw-b-1");
    let front = bc_tests::Front::new();
    front.set("a", Some(a.addr));
    let mut node = Node::new(&d.path().join("n"), 41);
    let out = node.join(&front.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "the node on gw-a", |n| {
        n.state == "connected" && n.gateway == "gw-a-1"
    });
    wait_for(Duration::from_secs(10), "a list kept", || {
        node.dir.join("gateway-revocations").exists().then_some(())
    });

    // gw-a is revoked while the node is on it, gw-a still in the balancer.
    front.set("b", Some(b.addr));
    let revoked_at = std::time::Instant::now();
    let o = server.cli(&["gateways", "revoke", "gw-a"]);
    assert!(o.status.success(), "{}", stderr(&o));
    wait_for(Duration::from_secs(10), "the node to leave gw-a", || {
        left_for(
            &mut node,
            "revoked this gateway's certificate (gateway gw-a)",
            1,
        )
        .then_some(())
    });
    println!(
        "the node left the revoked gateway {} ms after the revocation",
        revoked_at.elapsed().as_millis()
    );
    let on_b = server.wait_node(&id, "the node on gw-b", |n| {
        n.state == "connected" && n.gateway == "gw-b-1"
    });
    // Redials that reach gw-a are left before a Hello: the node stays on
    // gw-b though the balancer still sends every other dial to gw-a.
    std::thread::sleep(Duration::from_secs(2));
    let still = server.node(&id).unwrap();
    assert_eq!(
        (still.gateway.as_str(), still.epoch),
        ("gw-b-1", on_b.epoch),
        "the node went back to the revoked gateway"
    );

    // gw-c turns: it serves nodes with its certificate and hands them no
    // list. The node moves to it, then gw-c is revoked.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (certified, _port) = gateway_port(&rt, &GatewayCredential::read(&cred_c).unwrap());
    let ca = certified.chain.last().unwrap().clone();
    let h = bc_tests::hostile::Hostile::serving(
        certified.chain.clone(),
        certified.key(),
        ca,
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    front.set("a", None);
    front.set("b", None);
    front.set("c", Some(h.addr));
    front.reset_all();
    let s = h.next_session(Duration::from_secs(15));
    assert_eq!(s.hello.node_id, id);
    let epoch = s.hello.last_epoch + 1;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // A Welcome four minutes in the past (within the rewind a node
    // takes) does not keep the node's list fresh: it runs out on its own
    // signed time.
    s.welcome(epoch, now - 240_000, &[]);
    let welcomed = std::time::Instant::now();
    let o = server.cli(&["gateways", "revoke", "gw-c"]);
    assert!(o.status.success(), "{}", stderr(&o));
    front.set("b", Some(b.addr));
    assert!(
        s.closed_within(Duration::from_secs(15)),
        "the node stayed on a gateway that withheld the list past its life"
    );
    println!(
        "the node left the withholding gateway {} ms after its Welcome (list life 4 s)",
        welcomed.elapsed().as_millis()
    );
    assert!(left_for(
        &mut node,
        "handed no gateway revocation list newer",
        1
    ));
    server.wait_node(&id, "the node back on gw-b", |n| {
        n.state == "connected" && n.gateway == "gw-b-1"
    });
    // gw-b handed the list naming gw-c: no more sessions there.
    front.set("b", None);
    front.reset_all();
    assert!(
        h.try_next_session(Duration::from_secs(3)).is_none(),
        "the node opened a session on a revoked gateway"
    );
    wait_for(Duration::from_secs(10), "the node to refuse gw-c", || {
        left_for(&mut node, "(gateway gw-c)", 1).then_some(())
    });

    // A restart keeps the list: the revoked gateways stay refused.
    node.proc().kill();
    node.start();
    wait_for(
        Duration::from_secs(10),
        "the restarted node to refuse gw-c",
        || left_for(&mut node, "(gateway gw-c)", 1).then_some(()),
    );
    assert!(
        h.try_next_session(Duration::from_secs(2)).is_none(),
        "a restarted node opened a session on a revoked gateway"
    );
    node.proc().kill();
}
