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
