//! What a redialing fleet meets. The first-redial window: the gateway
//! sizes it from the fleet and its gateways' capacity, hands it out in
//! every Welcome, and keeps live sessions current through their heartbeat
//! acknowledgements, so a node that connected while the fleet was small
//! still spreads its redial over what the fleet has grown to. And the
//! Hello queue: past `--max-pending-hellos` a Hello waits its turn rather
//! than being turned away after its node paid for the TLS handshake.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use bc_store::Store;
use bc_tests::{Node, Server};
use bcd_proto::v1::{self, node_message, server_message};

#[test]
fn welcomes_and_heartbeat_acks_carry_the_window_sized_for_the_fleet() {
    let d = tempfile::tempdir().unwrap();
    // One gateway taking one Hello a second: its full buckets admit one
    // known node at once (`known_burst`), so the second connected node is
    // spread over a 1 s window; one node alone redials within the 50 ms
    // floor (from the rate alone it would be 1 s, then 2 s). The Hellos
    // are over a second apart, so the gateway measures one a second and
    // the window stays what its configuration says.
    let server = Server::start(
        &d.path().join("server"),
        &["--heartbeat-interval", "1s", "--hello-capacity", "1"],
    )
    .unwrap();
    let node = Node::new(&d.path().join("n"), 7);
    let other = Node::new(&d.path().join("o"), 8);
    for n in [&node, &other] {
        assert!(n.join(&server.url(), &server.token(1)).status.success());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut stream) = node.raw_session(&server.url()).await;
        tx.send(node.hello()).await.unwrap();
        match stream.message().await.unwrap().unwrap().msg {
            Some(server_message::Msg::Welcome(w)) => assert_eq!(w.first_retry_ms, 50),
            m => panic!("expected a Welcome, got {m:?}"),
        };
        // Alone, the node stays within the floor through the gateway's
        // next sizing (every 5 s): one known node is within the burst.
        let alone = Instant::now();
        let mut seq = 0;
        while alone.elapsed() < Duration::from_millis(6_000) {
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
            assert_eq!(ack.first_retry_ms, 50, "one node alone: {ack:?}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let (other_tx, mut other_stream) = other.raw_session(&server.url()).await;
        other_tx.send(other.hello()).await.unwrap();
        match other_stream.message().await.unwrap().unwrap().msg {
            Some(server_message::Msg::Welcome(w)) => assert!(
                w.first_retry_ms == 50 || w.first_retry_ms == 1_000,
                "a Welcome's window is the sized one: {}",
                w.first_retry_ms
            ),
            m => panic!("expected a Welcome, got {m:?}"),
        };
        // The gateway sizes the window again within 5 s of the node
        // connecting; the session's acks carry it from then on.
        let deadline = Instant::now() + Duration::from_secs(20);
        let acked = loop {
            assert!(
                Instant::now() < deadline,
                "no heartbeat ack carried the 1 s window within 20 s"
            );
            seq += 1;
            // Both nodes stay connected: each heartbeats and is acked.
            for t in [&tx, &other_tx] {
                t.send(v1::NodeMessage {
                    msg: Some(node_message::Msg::Heartbeat(v1::Heartbeat { seq })),
                })
                .await
                .unwrap();
            }
            while !matches!(
                other_stream.message().await.unwrap().unwrap().msg,
                Some(server_message::Msg::HeartbeatAck(_))
            ) {}
            let ack = loop {
                match stream.message().await.unwrap().unwrap().msg {
                    Some(server_message::Msg::HeartbeatAck(a)) => break a,
                    _ => continue,
                }
            };
            assert!(
                ack.first_retry_ms == 50 || ack.first_retry_ms == 1_000,
                "{ack:?}"
            );
            if ack.first_retry_ms == 1_000 {
                break ack;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(acked.seq, seq);
        // A second session (it supersedes the first, so the node counts
        // as connected throughout) starts with it.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let (tx2, mut stream) = node.raw_session(&server.url()).await;
        tx2.send(node.hello()).await.unwrap();
        match stream.message().await.unwrap().unwrap().msg {
            Some(server_message::Msg::Welcome(w)) => assert_eq!(w.first_retry_ms, 1_000),
            m => panic!("expected a Welcome, got {m:?}"),
        }
        drop((tx, other_tx));
    });
}

/// Opens a session for `node` and sends its Hello; the first answer, and
/// when it came.
async fn hello_answer(
    node: &Node,
    url: &str,
) -> (Result<server_message::Msg, tonic::Status>, Instant) {
    let (tx, mut stream) = node.raw_session(url).await;
    tx.send(node.hello()).await.unwrap();
    let answer = match stream.message().await {
        Ok(Some(m)) => Ok(m.msg.expect("a message")),
        Ok(None) => panic!("the session ended with no answer"),
        Err(status) => Err(status),
    };
    // Kept open until the answer is read: a closed stream would end the
    // session before the test sees it.
    drop(tx);
    (answer, Instant::now())
}

#[test]
fn a_hello_past_the_bound_waits_its_turn_and_is_turned_away_busy_after_the_wait() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("server");
    let server = Server::start(&dir, &["--max-pending-hellos", "1"]).unwrap();
    let (a, b) = (
        Node::new(&d.path().join("a"), 1),
        Node::new(&d.path().join("b"), 2),
    );
    for n in [&a, &b] {
        assert!(n.join(&server.url(), &server.token(1)).status.success());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    rt.block_on(async {
        let store = Store::open(
            &bc_store::Location::Sqlite(dir.join("store.db")),
            std::sync::Arc::new(bc_store::SystemClock),
        )
        .await
        .unwrap();
        let stall = |d: Duration| {
            let store = store.clone();
            tokio::spawn(async move { store.stall(d).await })
        };
        // The store stalls (another process holds its write lock) for
        // 1.5 s: one Hello holds the one permit through it, the other
        // waits its turn and is welcomed after it.
        let stalled = stall(Duration::from_millis(1500));
        let start = Instant::now();
        let ((a_answer, a_at), (b_answer, b_at)) =
            tokio::join!(hello_answer(&a, &url), hello_answer(&b, &url));
        stalled.await.unwrap().unwrap();
        for answer in [&a_answer, &b_answer] {
            assert!(
                matches!(answer, Ok(server_message::Msg::Welcome(_))),
                "a Hello that waited its turn is welcomed: {answer:?}"
            );
        }
        assert!(
            a_at.min(b_at) - start >= Duration::from_millis(1000),
            "the store stall held both Hellos back (else this checks nothing): {:?}",
            a_at.min(b_at) - start
        );
        // Stalled past the queue's 5 s: the Hello waiting for the permit
        // is turned away busy (its node backs off and redials); the one
        // holding it is welcomed when the store comes back.
        let stalled = stall(Duration::from_secs(7));
        let ((a_answer, _), (b_answer, _)) =
            tokio::join!(hello_answer(&a, &url), hello_answer(&b, &url));
        stalled.await.unwrap().unwrap();
        let answers = [a_answer, b_answer];
        let welcomed = answers
            .iter()
            .filter(|a| matches!(a, Ok(server_message::Msg::Welcome(_))))
            .count();
        let busy: Vec<&tonic::Status> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
        assert_eq!(welcomed, 1, "{answers:?}");
        assert_eq!(busy.len(), 1, "{answers:?}");
        assert_eq!(busy[0].code(), tonic::Code::ResourceExhausted, "{busy:?}");
        assert!(
            busy[0]
                .message()
                .contains("too many Hellos in flight; retry"),
            "{busy:?}"
        );
    });
    assert_eq!(
        server.counter("hello_refusals_total{reason=\"too-many-hellos\"}"),
        1.0
    );
}
