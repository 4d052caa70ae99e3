//! The first-redial window: the gateway sizes it from the fleet and its
//! gateways' capacity, hands it out in every Welcome, and keeps live
//! sessions current through their heartbeat acknowledgements, so a node
//! that connected while the fleet was small still spreads its redial over
//! what the fleet has grown to.

use std::time::{Duration, Instant};

use bc_tests::{Node, Server};
use bcd_proto::v1::{self, node_message, server_message};

#[test]
fn welcomes_and_heartbeat_acks_carry_the_window_sized_for_the_fleet() {
    let d = tempfile::tempdir().unwrap();
    // One gateway taking 4 Hellos a second: one connected node makes a
    // 250 ms window; none connected, the 50 ms floor.
    let server = Server::start(
        &d.path().join("server"),
        &["--heartbeat-interval", "300ms", "--hello-capacity", "4"],
    )
    .unwrap();
    let node = Node::new(&d.path().join("n"), 7);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut stream) = node.raw_session(&server.url()).await;
        tx.send(node.hello()).await.unwrap();
        let first = match stream.message().await.unwrap().unwrap().msg {
            Some(server_message::Msg::Welcome(w)) => w.first_retry_ms,
            m => panic!("expected a Welcome, got {m:?}"),
        };
        assert!(
            first == 50 || first == 250,
            "a Welcome's window is the sized one, not the starting second: {first}"
        );
        // The gateway sizes the window again within 5 s of the node
        // connecting; the session's acks carry it from then on.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seq = 0;
        let acked = loop {
            assert!(
                Instant::now() < deadline,
                "no heartbeat ack carried the 250 ms window within 20 s"
            );
            seq += 1;
            tx.send(v1::NodeMessage {
                msg: Some(node_message::Msg::Heartbeat(v1::Heartbeat { seq })),
            })
            .await
            .unwrap();
            let ack = loop {
                match stream.message().await.unwrap().unwrap().msg {
                    Some(server_message::Msg::HeartbeatAck(a)) => break a,
                    _ => continue,
                }
            };
            assert!(
                ack.first_retry_ms == 50 || ack.first_retry_ms == 250,
                "{ack:?}"
            );
            if ack.first_retry_ms == 250 {
                break ack;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(acked.seq, seq);
        // A second session (it supersedes the first, so the node counts
        // as connected throughout) starts with it.
        let (tx2, mut stream) = node.raw_session(&server.url()).await;
        tx2.send(node.hello()).await.unwrap();
        match stream.message().await.unwrap().unwrap().msg {
            Some(server_message::Msg::Welcome(w)) => assert_eq!(w.first_retry_ms, 250),
            m => panic!("expected a Welcome, got {m:?}"),
        }
        drop(tx);
    });
}
