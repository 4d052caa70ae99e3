//! Attested GPU bindings: the node reports each active binding signed by its
//! node key; what a compromised gateway could send instead (unsigned,
//! foreign-signed, replayed reports) is rejected, and a forged re-report of
//! an active binding marks it lost rather than replacing it.

use std::time::Duration;

use bc_tests::{Node, Server, wait_for};
use bcd_proto::v1::{self, node_message};
use prost::Message;

fn report(
    node: &str,
    alloc: &str,
    nonce: &str,
    sign: impl Fn(&[u8]) -> Vec<u8>,
) -> node_message::Msg {
    let payload = v1::BindingPayload {
        node_id: node.into(),
        allocation_id: alloc.into(),
        gpu_uuids: vec!["GPU-forged".into()],
        spec_generation: 1,
        nonce: nonce.into(),
    }
    .encode_to_vec();
    node_message::Msg::AllocationBound(v1::AllocationBound {
        signature: sign(&payload),
        payload,
    })
}

#[test]
fn only_the_node_key_can_bind_and_forgeries_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let server =
        Server::start(&d.path().join("server"), &["--heartbeat-interval", "300ms"]).unwrap();
    let mut node = Node::new(&d.path().join("n"), 61);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    assert!(
        server
            .cli(&["nodes", "assign", &id, "job-a", "--gpus", "0,1"])
            .status
            .success()
    );
    let v = wait_for(Duration::from_secs(20), "an active binding", || {
        let v = server.spec(&id);
        (v["bindings"][0]["state"] == "active").then_some(v)
    });
    assert_eq!(v["bindings"][0]["allocation_id"], "job-a");
    assert_eq!(v["bindings"][0]["gpu_uuids"].as_array().unwrap().len(), 2);
    node.proc().stop();

    // A gateway's view of the stream: the node's session, forged content.
    let key_pem = std::fs::read_to_string(node.dir.join("node.key")).unwrap();
    let node_key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
    let foreign = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut stream) = node.raw_session(&server.url()).await;
        let send = |m| v1::NodeMessage { msg: Some(m) };
        tx.send(node.hello()).await.unwrap();
        let welcome = stream.message().await.unwrap().unwrap();
        assert!(matches!(
            welcome.msg,
            Some(v1::server_message::Msg::Welcome(_))
        ));
        // Unsigned.
        tx.send(send(report(&id, "job-b", "n0", |_| vec![])))
            .await
            .unwrap();
        // Signed by a key that is not the node's.
        tx.send(send(report(&id, "job-c", "n1", |p| {
            rcgen::SigningKey::sign(&foreign, p).unwrap()
        })))
        .await
        .unwrap();
        // Validly signed, then replayed byte for byte.
        let genuine = report(&id, "job-d", "n2", |p| {
            rcgen::SigningKey::sign(&node_key, p).unwrap()
        });
        tx.send(send(genuine.clone())).await.unwrap();
        tx.send(send(genuine)).await.unwrap();
        // A forged re-report of the active binding.
        tx.send(send(report(&id, "job-a", "n3", |p| {
            rcgen::SigningKey::sign(&foreign, p).unwrap()
        })))
        .await
        .unwrap();
        tx.send(send(node_message::Msg::Heartbeat(v1::Heartbeat { seq: 1 })))
            .await
            .unwrap();
        // The heartbeat's ack comes after the reports were handled in order.
        loop {
            let m = stream.message().await.unwrap().unwrap();
            if matches!(m.msg, Some(v1::server_message::Msg::HeartbeatAck(_))) {
                break;
            }
        }
    });
    let v = server.spec(&id);
    let events: Vec<String> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    let has = |s: &str| events.iter().any(|e| e.contains(s));
    assert!(
        has("reservation.binding-rejected: allocation job-b: unsigned report"),
        "{events:?}"
    );
    assert!(
        has("allocation job-c: signature is not from the node's current certificate"),
        "{events:?}"
    );
    assert!(has("allocation job-d: replayed report"), "{events:?}");
    assert!(
        has("reservation.binding-lost: allocation job-a"),
        "{events:?}"
    );
    let bindings = v["bindings"].as_array().unwrap();
    let state = |a: &str| {
        bindings
            .iter()
            .find(|b| b["allocation_id"] == a)
            .map(|b| b["state"].clone())
    };
    assert_eq!(
        state("job-a"),
        Some(serde_json::json!("lost")),
        "not replaced: {bindings:?}"
    );
    assert_eq!(state("job-b"), None);
    assert_eq!(state("job-c"), None);
    assert_eq!(
        state("job-d"),
        Some(serde_json::json!("active")),
        "the genuine report counted once"
    );
    // The real node comes back and binds job-a again, validly.
    node.start();
    wait_for(Duration::from_secs(20), "job-a active again", || {
        let v = server.spec(&id);
        let b = v["bindings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["allocation_id"] == "job-a")
            .cloned();
        b.filter(|b| b["state"] == "active" && b["gpu_uuids"].as_array().unwrap().len() == 2)
            .map(|_| ())
    });
}
