//! What one peer can hold on the gateway's listener: a connection cap
//! (handshakes included) closes the surplus at once, and the slots come
//! back when the holders go; a node then connects as ever. One source
//! address holds at most its own cap while nodes from other addresses get
//! in. Large release downloads hold the server's memory to a few chunks
//! each, never the binary.
#![allow(clippy::disallowed_methods)]

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
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
    // Four silent connections hold every slot, and one more is closed at
    // once, before any handshake. The listener takes connections in the
    // order they arrive, so the fifth is the one over the cap; but the
    // join's own connection keeps its slot until the gateway sees it close,
    // and while it does a held one is closed and the fifth gets in: then
    // all five go and the four are tried again.
    let held = bc_tests::wait_for(
        Duration::from_secs(30),
        "four held connections, and a fifth closed at once",
        || {
            let held: Vec<TcpStream> = (0..4)
                .map(|_| TcpStream::connect(server.addr).unwrap())
                .collect();
            let mut surplus = TcpStream::connect(server.addr).unwrap();
            surplus
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let mut buf = [0u8; 16];
            match surplus.read(&mut buf) {
                // Closed (or reset) by the gateway.
                Ok(0) => Some(held),
                Err(e)
                    if e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::TimedOut =>
                {
                    Some(held)
                }
                Ok(n) => panic!("the gateway sent {n} bytes before any handshake"),
                // Still open after 2 s: it holds a slot.
                Err(_) => None,
            }
        },
    );
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

/// A thief with a copy of the node's key that signs no Hello proof is
/// refused once the key holder saw the node prove its Hellos from a
/// confirmed release, and the node goes on connecting.
#[test]
fn a_copy_of_the_key_that_signs_no_proof_is_refused_once_the_node_proved_its_hellos() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 93);
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The clone watch verifies the node's first proof within a pass or
    // two; until then an unproved Hello still connects (it records nothing
    // the fleet believes).
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        assert!(
            Instant::now() < deadline,
            "an unproved Hello with the node's key still connects after 30 s"
        );
        let answer = rt.block_on(async {
            let (tx, mut stream) = node.raw_session(&server.url()).await;
            tx.send(node.unproved_hello()).await.unwrap();
            let answer = stream.message().await;
            drop(tx);
            answer
        });
        match answer {
            Err(status) => break status,
            Ok(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let why = bcd_proto::refusal::of(&refused).expect("a typed refusal");
    assert_eq!(
        why.reason,
        bcd_proto::v1::RefusalReason::HelloUnproved as i32,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("bcd join --reset --yes"),
        "{refused:?}"
    );
    // The node itself proves its Hellos: it is back, and a proved Hello
    // with its key is welcomed.
    server.wait_node(&id, "connected", |n| n.state == "connected");
    node.proc().stop();
    let welcomed = rt.block_on(async {
        let (tx, mut stream) = node.raw_session(&server.url()).await;
        tx.send(node.hello()).await.unwrap();
        let m = stream.message().await;
        drop(tx);
        m
    });
    assert!(
        matches!(
            welcomed,
            Ok(Some(bcd_proto::v1::ServerMessage {
                msg: Some(bcd_proto::v1::server_message::Msg::Welcome(_))
            }))
        ),
        "{welcomed:?}"
    );
}

/// Whether the server closes `conn` without a word within a second or
/// two (a connection it admitted waits for its TLS handshake for 10 s).
fn closed_at_once(conn: &mut TcpStream) -> bool {
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let n = conn.read(&mut buf);
    let fast = start.elapsed() < Duration::from_secs(2);
    match n {
        Ok(0) => fast,
        Err(e)
            if e.kind() != std::io::ErrorKind::WouldBlock
                && e.kind() != std::io::ErrorKind::TimedOut =>
        {
            fast
        }
        _ => false,
    }
}

/// A TCP connection to `to` from the loopback address `from`.
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from((from, 0)))
            .expect("bind a loopback address (127.0.0.0/8 is all local on Linux)");
        socket.connect(to).await.unwrap()
    });
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

#[test]
fn one_address_holds_at_most_its_cap_and_nodes_from_others_still_connect() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--max-connections-per-address", "4"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let token = server.token(1);
    let mut node = Node::new(&d.path().join("n"), 83);
    // 127.0.0.2 takes its four, silently; each waits for its handshake.
    let flooder = [127, 0, 0, 2];
    let held: Vec<TcpStream> = (0..4).map(|_| connect_from(flooder, server.addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut surplus: Vec<TcpStream> = (0..3).map(|_| connect_from(flooder, server.addr)).collect();
    for conn in &mut surplus {
        assert!(closed_at_once(conn), "the surplus is closed as it arrives");
    }
    assert!(server.counter("connections_over_address_cap_total") >= 3.0);
    // A node from 127.0.0.1 joins and connects while they are held.
    let start = Instant::now();
    let out = node.join(&server.url(), &token);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    println!(
        "4 held from 127.0.0.2, 3 more closed at once; a node from 127.0.0.1 joined and connected in {} ms",
        start.elapsed().as_millis()
    );
    drop(held);
}

/// The peak resident memory of process `pid` since the last reset, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

#[test]
fn concurrent_large_release_downloads_hold_chunks_not_the_binary() {
    const SIZE: usize = 64 << 20;
    const DOWNLOADS: usize = 8;
    let f = bc_tests::fleet();
    // A 64 MiB release: bcd, padded with bytes that do not repeat.
    let mut binary = std::fs::read(bc_tests::bin("bcd")).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while binary.len() < SIZE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        binary.extend_from_slice(&x.to_le_bytes());
    }
    binary.truncate(SIZE);
    let path = f.d.path().join("bcd-big");
    std::fs::write(&path, &binary).unwrap();
    f.release(&path, "9.0.0", 2);
    let sha = release::sha256_hex(&binary);
    drop(binary);
    let node = Node::new(&f.d.path().join("n"), 84);
    let out = node.join(&f.server.url(), &f.server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let identity = bcd_agent::identity::Identity::load(&node.dir).unwrap();

    // From here on, the peak counts only the downloads (registering the
    // release held it whole, as an upload does).
    let pid = f.server.proc.pid();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
    let before = peak_rss_kib(pid);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let results = rt.block_on(async {
        let tasks: Vec<_> = (0..DOWNLOADS)
            .map(|_| {
                let identity = identity.clone();
                tokio::spawn(async move { download(&identity, 2).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let took = started.elapsed();
    for (bytes, digest) in &results {
        assert_eq!(*bytes, SIZE as u64);
        assert_eq!(digest, &sha);
    }
    let peak = peak_rss_kib(pid);
    let bound = (DOWNLOADS * SIZE / 4 / 1024) as u64;
    println!(
        "{DOWNLOADS} concurrent downloads of a {} MiB release in {:.1} s: server peak RSS {} MiB \
         (at the start {} MiB; {} MiB if each held the binary; bound {} MiB)",
        SIZE >> 20,
        took.as_secs_f64(),
        peak / 1024,
        before / 1024,
        (DOWNLOADS * SIZE) >> 20,
        bound / 1024
    );
    assert!(
        peak < bound,
        "peak RSS {peak} KiB during the downloads, bound {bound} KiB"
    );

    // The deprecated whole-release call refuses a binary this large and
    // says what to do.
    let refused = rt.block_on(async {
        let mut client = join_client(&identity).await;
        client
            .fetch_release(bcd_proto::v1::FetchReleaseRequest {
                sequence: 2,
                offset: 0,
            })
            .await
            .unwrap_err()
    });
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("two steps"),
        "{}",
        refused.message()
    );
}

async fn join_client(
    identity: &bcd_agent::identity::Identity,
) -> bcd_proto::v1::join_client::JoinClient<tonic::transport::Channel> {
    let config = bcd_proto::tls::client_config(
        bcd_proto::tls::ServerTrust::Ca(identity.ca.clone()),
        Some(bcd_proto::tls::ClientIdentity {
            chain: vec![identity.cert.clone()],
            key: identity.private_key(),
        }),
    )
    .unwrap();
    let channel = bcd_proto::tls::connect(&identity.file.server, config)
        .await
        .unwrap();
    bcd_proto::v1::join_client::JoinClient::new(channel)
}

/// Streams release `sequence` as a node does, keeping only a running
/// hash: the bytes and their SHA-256.
async fn download(identity: &bcd_agent::identity::Identity, sequence: u64) -> (u64, String) {
    let mut stream = join_client(identity)
        .await
        .fetch_release_chunks(bcd_proto::v1::FetchReleaseRequest {
            sequence,
            offset: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().expect("the manifest");
    assert!(!first.signed_manifest.is_empty() && first.data.is_empty());
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let mut at = 0u64;
    while let Some(chunk) = stream.message().await.unwrap() {
        assert!(chunk.signed_manifest.is_empty());
        assert_eq!(chunk.offset, at);
        assert!(chunk.data.len() <= 256 << 10);
        at += chunk.data.len() as u64;
        hash.update(&chunk.data);
    }
    (at, hex_digest(hash.finish().as_ref()))
}

fn hex_digest(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
