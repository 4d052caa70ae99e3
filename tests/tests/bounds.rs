//! What one peer can hold on the gateway's listener: a connection cap
//! (handshakes included) closes the surplus at once, and the slots come
//! back when the holders go; a node then connects as ever.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bc_tests::{FAST, Node, Server, stderr};

#[test]
fn the_connection_cap_closes_the_surplus_and_frees_slots_as_holders_go() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--max-connections", "4"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    // The token is created over one connection, closed again.
    let token = server.token(1);
    let mut node = Node::new(&d.path().join("n"), 81);
    let out = node.join(&server.url(), &token);
    assert!(out.status.success(), "{}", stderr(&out));
    // Four silent connections hold every slot.
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // One more is closed at once, before any handshake.
    let mut surplus = TcpStream::connect(server.addr).unwrap();
    surplus
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let n = surplus.read(&mut buf);
    assert!(
        matches!(n, Ok(0)) || n.is_err() && start.elapsed() < Duration::from_secs(4),
        "{n:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(2), "closed at once");
    drop(held);
    // The node connects once the holders are gone.
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
}

/// Two machines with one identity (a node's data directory copied to
/// another machine) take the session from each other until the store
/// quarantines the certificate; both are refused from then on, and the
/// node shows what happened.
#[test]
fn a_cloned_identity_is_quarantined_and_both_machines_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut real = Node::new(&d.path().join("real"), 91);
    let out = real.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = real.id();
    // The copy: the same identity on another (fake) machine, another boot.
    let copy_dir = d.path().join("copy");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(d.path().join("real"))
        .arg(&copy_dir)
        .status()
        .unwrap();
    assert!(status.success());
    let mut copy = Node::new(&copy_dir, 92);
    real.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    copy.start();
    let events = bc_tests::wait_for(Duration::from_secs(60), "the quarantine", || {
        let spec = server.spec(&id);
        let events: Vec<String> = spec["events"]
            .as_array()?
            .iter()
            .filter_map(|e| e.as_str().map(String::from))
            .collect();
        events
            .iter()
            .any(|e| e.starts_with("security.node.quarantined"))
            .then_some(events)
    });
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("security.node.duplicate-session")),
        "{events:?}"
    );
    // Neither machine gets back in.
    std::thread::sleep(Duration::from_secs(3));
    let n = server.node(&id).unwrap();
    assert_ne!(n.state, "connected", "{n:?}");
    for log in [real.proc().log(), copy.proc().log()] {
        assert!(log.contains("duplicate-identity"), "{log}");
    }
}
