//! The secret broker: a value put by an operator reaches the allocation
//! whose signed spec names it, as a file in the node's memory-backed run
//! directory, through a gateway that holds no key and sees ciphertext
//! only; a rotation reaches it too, an unassignment removes it, and while
//! the broker is unreachable the node says `unavailable`, retries, and
//! keeps what it has. A gateway that swaps a request's one-time key, asks
//! for what the spec does not name, replays an old request, or answers
//! the node with a delivery of its own making, gets nothing.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::Duration;

use bc_tests::gateways::{
    add_gateway, database_role, gateway_port, runtime, sign, start_gateway_on,
};
use bc_tests::hostile::Hostile;
use bc_tests::{FAST, Node, Server, section, stderr, wait_for};
use bcd_proto::secret::{self, Delivery, OneTimeKey, Request};
use bcd_proto::v1::{self, node_message::Msg as N};
use better_compute::gateway::credential::GatewayCredential;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

const WAIT: Duration = Duration::from_secs(30);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Runs the CLI; a failure fails the test.
fn ok(server: &Server, args: &[&str]) -> String {
    let o = server.cli(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

/// A memory-backed run directory for a node.
fn memory_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").expect("a directory on /dev/shm (tmpfs)")
}

/// Puts `value` as secret `name` (or its next version) from a file.
fn put(server: &Server, dir: &Path, verb: &str, name: &str, value: &str) -> String {
    let file = dir.join(format!("{name}.{verb}.value"));
    std::fs::write(&file, value).unwrap();
    ok(
        server,
        &["secrets", verb, name, "--from-file", file.to_str().unwrap()],
    )
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Every file under `dir`, as bytes.
fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(all_bytes(&p));
        } else if let Ok(b) = std::fs::read(&p) {
            out.extend(b);
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn a_secret_reaches_its_allocation_through_a_keyless_gateway_on_postgresql() {
    let url = bc_tests::postgres_database("secrets");
    let mut f = bc_tests::fleet_on(Some(&url), &[]);
    let cred = f.d.path().join("gw-edge.json");
    let printed = add_gateway(&f.server, "gw-edge", &cred);
    let gw_url = database_role(&url, &printed);
    let gw_dir = f.d.path().join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();
    let gw = start_gateway_on(&gw_url, &gw_dir, &cred, "gw-edge-1");

    let run = memory_dir();
    let mut node = Node::new(&f.d.path().join("n1"), 3);
    node.run_dir = Some(run.path().to_path_buf());
    let out = node.join(&gw.url(), &f.server.token(1));
    assert!(out.status.success(), "join: {}", stderr(&out));
    let id = node.id();
    node.start();
    f.server
        .wait_node(&id, "connected through the gateway", |n| {
            n.state == "connected" && n.gateway == "gw-edge-1"
        });

    let first = "hf_first-0123456789abcdef";
    assert!(put(&f.server, f.d.path(), "put", "hf-token", first).contains("version 1"));
    let spec = ok(
        &f.server,
        &[
            "nodes",
            "assign",
            &id,
            "job-1",
            "--gpus",
            "0",
            "--secret",
            "hf-token=token",
        ],
    );
    assert!(
        spec.contains("secret     hf-token v1 -> job-1/token"),
        "{spec}"
    );
    let file = run.path().join("secrets/job-1/token");
    wait_for(WAIT, "the secret written", || {
        (read(&file).as_deref() == Some(first)).then_some(())
    });
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o400
    );
    wait_for(WAIT, "the secrets section ready", || {
        (section(&f.server.spec(&id), "secrets")["status"] == "READY").then_some(())
    });
    let events = ok(&f.server, &["events", "--node", &id]);
    assert!(
        events.contains("secret.delivered") && events.contains("hf-token v1 to allocation job-1"),
        "{events}"
    );
    let listed = ok(&f.server, &["secrets", "list"]);
    assert!(
        listed.contains("hf-token") && listed.contains(&id),
        "{listed}"
    );
    assert!(!listed.contains(first), "a list shows no value: {listed}");

    // A new version reaches the node; the spec is signed again for it. The
    // ticket keys rotated just before: the delivery is signed with the
    // newest key the node's spec names.
    assert!(ok(&f.server, &["ticket-keys", "rotate"]).contains("specs signed again: 1"));
    let second = "hf_second-fedcba9876543210";
    let rotated = put(&f.server, f.d.path(), "rotate", "hf-token", second);
    assert!(
        rotated.contains("version 2") && rotated.contains(&id),
        "{rotated}"
    );
    wait_for(WAIT, "the rotated secret written", || {
        (read(&file).as_deref() == Some(second)).then_some(())
    });

    // The key holder goes away: the node, started again (it fetches what
    // it holds anew), is answered `unavailable` through the gateway, says
    // so in its state report, and keeps the value it has.
    f.server.proc.stop();
    node.proc().stop();
    node.start();
    let store = bc_tests::StoreAccess::open(&bc_store::Location::Postgres(url.clone()));
    let message = wait_for(
        Duration::from_secs(60),
        "the secrets section waiting",
        || {
            let view = store
                .block(store.store.spec_view(&bc_store::NodeId::from(&id)))
                .unwrap()?;
            view.sections
                .into_iter()
                .find(|s| s.section == "secrets" && s.message.contains("unavailable"))
                .map(|s| s.message)
        },
    );
    assert!(message.contains("hf-token v2"), "{message}");
    assert_eq!(
        read(&file).as_deref(),
        Some(second),
        "a delivered value stays"
    );
    f.server.start_again().unwrap();
    wait_for(
        Duration::from_secs(90),
        "the secrets section ready again",
        || (section(&f.server.spec(&id), "secrets")["status"] == "READY").then_some(()),
    );

    // Nothing but the node's file holds the value: not the store (the
    // sealed column), not a log, not the node's journal.
    let rt = runtime();
    let sealed: Vec<Vec<u8>> = rt.block_on(async {
        let config = bc_store::postgres::config(&url).unwrap();
        let (c, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        c.query("SELECT sealed FROM secrets", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    });
    assert_eq!(sealed.len(), 2);
    for (what, bytes) in [
        ("the store", sealed.concat()),
        ("the gateway's log", gw.proc.log().into_bytes()),
        ("the key holder's log", f.server.proc.log().into_bytes()),
        ("the node's log", node.proc().log().into_bytes()),
        ("the node's data directory", all_bytes(&node.dir)),
    ] {
        for v in [first, second] {
            assert!(!contains(&bytes, v), "{what} holds a secret's value");
        }
    }

    // A held secret is not deleted; unassigned, it leaves the node.
    let o = f.server.cli(&["secrets", "delete", "hf-token"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!("held by allocations on {id}")),
        "{}",
        stderr(&o)
    );
    ok(&f.server, &["nodes", "unassign", &id, "job-1"]);
    wait_for(WAIT, "the secret removed", || {
        (!run.path().join("secrets/job-1").exists()).then_some(())
    });
    assert!(ok(&f.server, &["secrets", "delete", "hf-token"]).contains("deleted"));
    assert!(!ok(&f.server, &["secrets", "list"]).contains("hf-token"));
}

/// What a node sends the broker for `name` at `version` (signed with
/// `key_pem`, the node's key or another), with `otk`'s public half.
fn request(
    node: &str,
    name: &str,
    version: u64,
    otk: &[u8],
    time_ms: i64,
    key_pem: &str,
) -> v1::SecretRequest {
    let statement = secret::request_statement(&Request {
        node,
        allocation: "job",
        name,
        version,
        one_time_key: otk,
        time_ms,
    });
    v1::SecretRequest {
        node_id: node.into(),
        allocation_id: "job".into(),
        name: name.into(),
        version,
        one_time_key: otk.to_vec(),
        time_ms,
        signature: sign(key_pem, &statement),
    }
}

#[test]
fn a_gateway_can_neither_swap_forge_replay_nor_read_a_secret() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let cred_path = d.path().join("gw-a.json");
    add_gateway(&server, "gw-a", &cred_path);
    let run = memory_dir();
    let mut node = Node::new(&d.path().join("n"), 5);
    node.run_dir = Some(run.path().to_path_buf());
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let value = "db-password-3f9a1c";
    put(&server, d.path(), "put", "db", value);
    ok(
        &server,
        &[
            "nodes", "assign", &id, "job", "--gpus", "0", "--secret", "db",
        ],
    );
    let file = run.path().join("secrets/job/db");
    wait_for(WAIT, "the secret written", || {
        (read(&file).as_deref() == Some(value)).then_some(())
    });
    // The ticket keys the node's spec pins, which sign deliveries.
    let keys = {
        use ring::signature::KeyPair;
        let pkcs8 = std::fs::read(server.dir.join("ticket.key")).unwrap();
        let k = ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8).unwrap();
        bcd_proto::ticket::Jwks::of(&[k.public_key().as_ref().to_vec()])
    };

    // A gateway with its certificate, on the key holder's port, relaying a
    // request the node signed (the test signs as the node).
    let rt = runtime();
    let cred = GatewayCredential::read(&cred_path).unwrap();
    let (_, port) = gateway_port(&rt, &cred);
    let cert = CertificateDer::from_pem_file(node.dir.join("node.crt"))
        .unwrap()
        .to_vec();
    let node_key = std::fs::read_to_string(node.dir.join("node.key")).unwrap();
    let fetch = |r: v1::SecretRequest| {
        rt.block_on(port.clone().fetch_secret(v1::ForwardedSecret {
            node_cert_der: cert.clone(),
            request: Some(r),
        }))
    };
    let otk = OneTimeKey::new().unwrap();
    let honest = request(&id, "db", 1, &otk.public(), now_ms(), &node_key);
    let delivery = fetch(honest.clone()).unwrap().into_inner();
    // What the gateway relays is ciphertext for a key it does not hold.
    use base64::Engine;
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(delivery.jws.split('.').nth(1).unwrap())
        .unwrap();
    assert!(!contains(&payload, value) && !delivery.jws.contains(value));
    let jwe = secret::verify_delivery(&delivery.jws, &keys, &Request::from(&honest)).unwrap();
    assert_eq!(
        OneTimeKey::new().unwrap().open(&jwe).unwrap_err(),
        secret::SecretError::Decrypt,
        "another key (the gateway's) opens nothing"
    );
    assert_eq!(otk.open(&jwe).unwrap(), value.as_bytes());

    // The gateway's own one-time key in the node's request: the signature
    // no longer holds, and it is on the record.
    let gateway_key = OneTimeKey::new().unwrap();
    let mut swapped = request(
        &id,
        "db",
        1,
        &OneTimeKey::new().unwrap().public(),
        now_ms(),
        &node_key,
    );
    swapped.one_time_key = gateway_key.public().to_vec();
    let e = fetch(swapped).unwrap_err();
    assert!(e.message().contains("not signed by the node key"), "{e:?}");
    let events = ok(&server, &["events", "--node", &id]);
    assert!(
        events.contains("security.secret-request.forged"),
        "{events}"
    );
    // A request signed by a key of the gateway's own.
    let own = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap()
        .serialize_pem();
    let e = fetch(request(&id, "db", 1, &gateway_key.public(), now_ms(), &own)).unwrap_err();
    assert!(e.message().contains("not signed by the node key"), "{e:?}");
    // What the spec does not name, even signed by the node.
    put(&server, d.path(), "put", "other", "not-for-this-node");
    let e = fetch(request(&id, "other", 1, &otk_public(), now_ms(), &node_key)).unwrap_err();
    assert!(
        e.message()
            .contains("gives allocation job no secret other v1"),
        "{e:?}"
    );
    // A request the gateway kept for later.
    let e = fetch(request(
        &id,
        "db",
        1,
        &otk_public(),
        now_ms() - 120_000,
        &node_key,
    ))
    .unwrap_err();
    assert!(e.message().contains("good for 60 s"), "{e:?}");
    // Dated as far as an i64 goes, either way: refused, not overflowed.
    for time in [i64::MIN, i64::MAX] {
        let e = fetch(request(&id, "db", 1, &otk_public(), time, &node_key)).unwrap_err();
        assert!(e.message().contains("good for 60 s"), "{e:?}");
    }

    // A node (or a gateway replaying what it signed) asking again and
    // again: the broker stops after the node's burst, says when to come
    // back, and records no more deliveries.
    let delivered = |server: &Server| {
        ok(server, &["events", "--node", &id])
            .matches("secret.delivered")
            .count()
    };
    let before = delivered(&server);
    let mut granted = 0;
    let e = loop {
        match fetch(request(&id, "db", 1, &otk_public(), now_ms(), &node_key)) {
            Ok(_) => granted += 1,
            Err(e) => break e,
        }
        assert!(granted <= 32, "the broker never says no");
    };
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("asked for 32 secrets in a row")
            && e.message().contains("the node asks again in"),
        "{e:?}"
    );
    assert!(
        granted > 0 && granted < 32,
        "{granted}: earlier requests counted"
    );
    assert_eq!(delivered(&server), before + granted);

    // Now the gateway answers the node itself. The node, started again,
    // asks for its secret: a delivery signed with the gateway's own key,
    // and the broker's genuine delivery of an earlier request, are both
    // refused and recorded; the value the node has stays.
    node.proc().stop();
    let mut server = server;
    server.proc.stop();
    let h = Hostile::start(&server.dir, server.addr).expect("hostile gateway");
    node.start();
    let s = h.next_session(Duration::from_secs(30));
    s.welcome(s.hello.last_epoch + 1, now_ms(), &[]);
    let asked = h.next_secret(WAIT).expect("the node asks for its secret");
    let forger = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[7; 32]).unwrap();
    let forged = secret::sign_delivery(
        &forger,
        &Delivery {
            iss: bcd_proto::ticket::ISSUER.into(),
            node: id.clone(),
            allocation: "job".into(),
            name: "db".into(),
            version: 1,
            req: secret::request_digest(&secret::request_statement(&Request::from(&asked.request))),
            iat: now_ms() / 1000,
            jwe: secret::seal(b"made-up-by-the-gateway", &asked.request.one_time_key).unwrap(),
        },
    );
    asked.answer(forged);
    let refused = |s: &bc_tests::hostile::HostileSession| {
        s.recv_until(WAIT, "security.secret.refused", |m| match m {
            N::Events(b) => b
                .events
                .iter()
                .find(|e| e.kind == "security.secret.refused")
                .cloned(),
            _ => None,
        })
    };
    let e = refused(&s);
    assert!(
        String::from_utf8_lossy(&e.body).contains("not among the node's ticket keys"),
        "{}",
        String::from_utf8_lossy(&e.body)
    );
    let again = h
        .next_secret(WAIT)
        .expect("the node asks again after a refused delivery");
    again.answer(delivery.jws.clone());
    // Within the minute the node records no second event of the kind; its
    // signed state report says why the section waits.
    let message = s.recv_until(WAIT, "the replayed delivery refused", |m| match m {
        N::StateReport(signed) => {
            let r: v1::StateReport = bc_tests::hostile::fact(signed);
            r.sections
                .into_iter()
                .find(|s| {
                    s.section == v1::StateSection::Secrets as i32
                        && s.message.contains("answers another request")
                })
                .map(|s| s.message)
        }
        _ => None,
    });
    assert!(message.contains("db v1"), "{message}");
    assert_eq!(read(&file).as_deref(), Some(value), "the value stays");
    let third = h.next_secret(WAIT).expect("the node keeps asking");
    third.fail(tonic::Status::unavailable(
        "the join service is unreachable",
    ));
}

fn otk_public() -> [u8; 32] {
    OneTimeKey::new().unwrap().public()
}
