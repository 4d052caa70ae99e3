//! What one source address gets on the gateway's listener: its own share of
//! the handshake bucket, so a flood from it leaves the rest to everyone
//! else; and behind a layer-4 balancer that sends PROXY protocol v2 (a real
//! HAProxy with `send-proxy-v2`), the client's address in the header is the
//! one counted, capped and rated, never the balancer's.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bc_tests::{FAST, Node, Server, stderr, wait_for};
use rustls_pki_types::pem::PemObject;

/// A TCP connection to `to` from the loopback address `from`.
async fn dial(from: [u8; 4], to: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A TLS client with no certificate that trusts the server's CA.
fn stranger(server: &Server) -> tokio_rustls::TlsConnector {
    let ca = std::fs::read(server.dir.join("ca.crt")).unwrap();
    let ca = rustls_pki_types::CertificateDer::from_pem_slice(&ca).unwrap();
    let config = bcd_proto::tls::client_config(bcd_proto::tls::ServerTrust::Ca(ca), None).unwrap();
    tokio_rustls::TlsConnector::from(config)
}

/// A TLS connection from `from` to `to`, once its handshake completes.
async fn connect(
    tls: &tokio_rustls::TlsConnector,
    from: [u8; 4],
    to: SocketAddr,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let name = rustls_pki_types::ServerName::try_from(bcd_proto::GATEWAY_NAME).unwrap();
    let tcp = dial(from, to).await.ok()?;
    match tokio::time::timeout(Duration::from_secs(10), tls.connect(name, tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        _ => None,
    }
}

/// Whether a TLS handshake from `from` to `to` completes.
async fn handshake(tls: &tokio_rustls::TlsConnector, from: [u8; 4], to: SocketAddr) -> bool {
    connect(tls, from, to).await.is_some()
}

#[test]
fn one_address_over_its_handshake_rate_leaves_the_bucket_to_the_others() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend([
        "--handshake-rate",
        "1000",
        "--handshake-rate-per-address",
        "3",
    ]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let tls = stranger(&server);
    let rt = runtime();
    // 127.0.0.2 handshakes back to back until it is refused: after its
    // burst of three, at three a second, whatever the shared bucket holds.
    let (mut completed, mut refused) = (0, false);
    for _ in 0..500 {
        if rt.block_on(handshake(&tls, [127, 0, 0, 2], server.addr)) {
            completed += 1;
        } else {
            refused = true;
            break;
        }
    }
    assert!(
        refused,
        "500 handshakes in a row from one address all completed: no per-address rate"
    );
    assert!(completed >= 3, "the address's burst: {completed}");
    assert!(server.counter("handshakes_total{outcome=\"address_rate\"}") >= 1.0);
    // Another address gets in at once: the flood took only its share.
    assert!(
        rt.block_on(handshake(&tls, [127, 0, 0, 3], server.addr)),
        "a handshake from another address was refused"
    );
    println!("127.0.0.2: {completed} handshakes, then refused; 127.0.0.3 got in at once");
}

/// HAProxy in front of `backend`, reached on 127.0.0.1, sending a PROXY
/// v2 header from `source` ahead of each connection.
struct Haproxy {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Haproxy {
    fn start(dir: &Path, backend: SocketAddr, source: [u8; 4]) -> Haproxy {
        let binary = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("haproxy is not installed: apt-get install haproxy (scripts/test does)");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let source = std::net::Ipv4Addr::from(source);
        let config = dir.join("haproxy.cfg");
        std::fs::write(
            &config,
            format!(
                "global\n  maxconn 256\n\
                 defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n\
                 frontend nodes\n  bind {addr}\n  default_backend gateways\n\
                 backend gateways\n  server gw {backend} send-proxy-v2 source {source}\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
        let child = std::process::Command::new(binary)
            .args(["-db", "-f"])
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        wait_for(Duration::from_secs(20), "haproxy listening", || {
            std::net::TcpStream::connect(addr).ok()
        });
        Haproxy { child, addr }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn behind_haproxy_the_client_address_is_what_counts() {
    let d = tempfile::tempdir().unwrap();
    let balancer = [127, 0, 0, 9];
    let mut args = FAST.to_vec();
    args.extend([
        "--proxy-protocol-from",
        "127.0.0.9",
        "--max-connections-per-address",
        "2",
    ]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let haproxy = Haproxy::start(d.path(), server.addr, balancer);
    let through = format!("https://{}", haproxy.addr);

    // A node joins and connects through the balancer: the gateway reads
    // the header before the TLS handshake.
    let mut node = Node::new(&d.path().join("n"), 91);
    let out = node.join(&through, &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");

    let tls = stranger(&server);
    let rt = runtime();
    // 127.0.0.2 holds its two connections through the balancer, each
    // counted by the gateway once its handshake is done.
    let held: Vec<_> = (0..2)
        .map(|_| {
            rt.block_on(connect(&tls, [127, 0, 0, 2], haproxy.addr))
                .expect("127.0.0.2's first two connections get in")
        })
        .collect();
    // A third from 127.0.0.2 is over its address's cap: the balancer's
    // own address, with three connections on it, would have been over
    // long before.
    let over_before = server.counter("connections_over_address_cap_total");
    assert!(
        !rt.block_on(handshake(&tls, [127, 0, 0, 2], haproxy.addr)),
        "a third connection from 127.0.0.2 was served"
    );
    assert_eq!(
        server.counter("connections_over_address_cap_total"),
        over_before + 1.0
    );
    // Other clients of the balancer still get in.
    assert!(
        rt.block_on(handshake(&tls, [127, 0, 0, 3], haproxy.addr)),
        "a client from 127.0.0.3 through the balancer was refused"
    );
    // The balancer's address must send the header: plain TLS from it is
    // refused, while plain TLS from any other address is served.
    assert!(
        !rt.block_on(handshake(&tls, balancer, server.addr)),
        "a connection from the balancer's address without a PROXY header was served"
    );
    assert!(rt.block_on(handshake(&tls, [127, 0, 0, 4], server.addr)));
    drop(held);
    println!("through HAProxy: the node connected; 127.0.0.2 capped at 2; 127.0.0.3 served");
}
