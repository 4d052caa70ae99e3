//! Flood benchmark: prints figures, asserts nothing.
//!
//! One gateway (`serve`, the embedded default, with its boot endpoint) on
//! loopback. Hostile peers dial from 127.0.0.2 and up; real nodes dial
//! from 127.0.0.1. Phase by phase the hostile load grows and stays, and
//! each phase prints what it costs a real node (an enrolled node's
//! restart back to connected; a new node's join and connect; a stranger's
//! TLS handshake from an address the gateway has never seen), what the
//! boot endpoint still answers, and the server's resident memory:
//!
//! 1. nothing: the baseline;
//! 2. idle connections that never start TLS, and slowloris connections
//!    that trickle a ClientHello a byte a second, on the gateway port and
//!    on the boot endpoint;
//! 3. a flood of unauthenticated TLS handshakes, as fast as the flooders
//!    go, from `--flood-addresses` addresses (the handshake bucket is
//!    `--handshake-rate`, each address's own `--handshake-rate-per-address`);
//! 4. a stream flood: with an enrolled node's certificate, session streams
//!    that never send a Hello, as many as the connections allow.
//!
//! Every real node here dials from 127.0.0.1, an address the enrolled node
//! has authenticated from, so the handshake bucket's reserve admits the new
//! node too; a newcomer from an address never seen before competes with the
//! flood for the open bucket and backs off until it gets a turn.
//!
//! Build first: `cargo build --profile bench-fast --workspace --all-features`,
//! then run `target/bench-fast/bench-floods`.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bc_tests::{Node, Server, rss_kib};
use clap::Parser;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

#[derive(Debug, Parser)]
struct Args {
    /// Idle TCP connections (no TLS) on the gateway port.
    #[arg(long, default_value_t = 400)]
    idle: usize,
    /// Slowloris connections, a byte a second: this many on the gateway
    /// port and as many on the boot endpoint.
    #[arg(long, default_value_t = 150)]
    slowloris: usize,
    /// Tasks making unauthenticated TLS handshakes back to back.
    #[arg(long, default_value_t = 16)]
    flooders: usize,
    /// Connections opened with a node certificate for the stream flood
    /// (each carries as many silent session streams as the server allows).
    #[arg(long, default_value_t = 8)]
    stream_connections: usize,
    /// The addresses the handshake flood dials from (the flooders share
    /// them).
    #[arg(long, default_value_t = 1)]
    flood_addresses: usize,
    /// `--handshake-rate` of the gateway.
    #[arg(long, default_value_t = 200)]
    handshake_rate: u32,
    /// `--handshake-rate-per-address` of the gateway (set it to
    /// --handshake-rate to see the flood without it).
    #[arg(long, default_value_t = 50)]
    handshake_rate_per_address: u32,
}

/// A loopback address for hostile peer `i` (127.0.0.2 and up, 100 per
/// address so no one address reaches its cap).
fn hostile(i: usize) -> [u8; 4] {
    let n = 2 + i / 100;
    [127, 0, (n >> 8) as u8, n as u8]
}

async fn dial(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

/// How long `f` takes to hold, polling; `None` past `limit`.
fn until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn ms(d: Option<Duration>) -> String {
    match d {
        Some(d) => format!("{} ms", d.as_millis()),
        None => "not within 60 s".to_string(),
    }
}

/// The time from a GET to the boot endpoint's first response byte.
async fn boot_answer(boot: SocketAddr) -> String {
    let start = Instant::now();
    let attempt = async {
        let mut s = TcpStream::connect(boot).await?;
        s.write_all(
            b"GET /boot/ipxe?mac=52:54:00:12:34:56 HTTP/1.1\r\nHost: bc\r\nConnection: close\r\n\r\n",
        )
        .await?;
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).await?;
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(Duration::from_secs(30), attempt).await {
        Ok(Ok(())) => format!("{} ms", start.elapsed().as_millis()),
        Ok(Err(e)) => format!("failed ({e})"),
        Err(_) => "no answer within 30 s".to_string(),
    }
}

/// A stranger's TLS handshake (no client certificate) from an address the
/// gateway has never seen, tried again every 100 ms as a client backing
/// off would: the time to the first one that completes.
async fn stranger_handshake(
    from: [u8; 4],
    gateway: SocketAddr,
    config: Arc<tokio_rustls::rustls::ClientConfig>,
) -> String {
    let start = Instant::now();
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = rustls_pki_types::ServerName::try_from(bcd_proto::GATEWAY_NAME).unwrap();
    let mut tries = 0;
    while start.elapsed() < Duration::from_secs(30) {
        tries += 1;
        if let Ok(tcp) = dial(from, gateway).await
            && let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_secs(5), connector.connect(name.clone(), tcp))
                    .await
        {
            return format!("{} ms ({tries} tries)", start.elapsed().as_millis());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    format!("none within 30 s ({tries} tries)")
}

struct Probe<'a> {
    server: &'a Server,
    tls: Arc<tokio_rustls::rustls::ClientConfig>,
    strangers: u8,
    enrolled: Node,
    enrolled_id: String,
    dir: std::path::PathBuf,
    fresh: u64,
}

impl Probe<'_> {
    /// The enrolled node stops and starts again: the time to connected
    /// with a new epoch.
    fn reconnect(&mut self) -> Option<Duration> {
        let before = self.server.node(&self.enrolled_id).map_or(0, |n| n.epoch);
        self.enrolled.proc().kill();
        self.enrolled.proc = None;
        let start = Instant::now();
        self.enrolled.start();
        let id = self.enrolled_id.clone();
        until(Duration::from_secs(60), || {
            self.server
                .node(&id)
                .is_some_and(|n| n.state == "connected" && n.epoch > before)
        })
        .map(|_| start.elapsed())
    }

    /// A new node joins and connects: the time for both.
    fn newcomer(&mut self) -> Option<Duration> {
        self.fresh += 1;
        let token = self.server.token(1);
        let mut node = Node::new(
            &self.dir.join(format!("new{}", self.fresh)),
            1000 + self.fresh,
        );
        let start = Instant::now();
        let mut joined = false;
        while start.elapsed() < Duration::from_secs(60) {
            if node.join(&self.server.url(), &token).status.success() {
                joined = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if !joined {
            return None;
        }
        let id = node.id();
        node.start();
        let connected = until(Duration::from_secs(60), || {
            self.server
                .node(&id)
                .is_some_and(|n| n.state == "connected")
        });
        connected.map(|_| start.elapsed())
    }

    fn report(&mut self, phase: &str, rt: &tokio::runtime::Runtime) {
        let reconnect = ms(self.reconnect());
        let newcomer = ms(self.newcomer());
        let boot = rt.block_on(boot_answer(self.server.boot.expect("boot endpoint")));
        self.strangers = self.strangers.wrapping_add(1);
        let stranger = rt.block_on(stranger_handshake(
            [127, 0, 9, self.strangers],
            self.server.addr,
            self.tls.clone(),
        ));
        let rss = rss_kib(self.server.proc.pid()).unwrap_or(0);
        println!(
            "{phase:<38} enrolled node back in {reconnect:>10}; new node joined+connected in {newcomer:>10}; a stranger's handshake from a new address in {stranger:>18}; boot endpoint answered in {boot:>8}; server RSS {} MiB",
            rss / 1024
        );
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let d = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rate = args.handshake_rate.to_string();
    let per_address = args.handshake_rate_per_address.to_string();
    let server = Server::start(
        &d.path().join("server"),
        &[
            "--boot-listen",
            "127.0.0.1:0",
            "--handshake-rate",
            &rate,
            "--handshake-rate-per-address",
            &per_address,
        ],
    )?;
    println!(
        "bench-floods: one gateway on loopback, --handshake-rate {}, --handshake-rate-per-address {}, hostile peers from 127.0.0.2 and up, strangers from 127.0.9.1 and up",
        args.handshake_rate, args.handshake_rate_per_address
    );
    let ca = std::fs::read(server.dir.join("ca.crt"))?;
    let ca = rustls_pki_types::CertificateDer::from_pem_slice(&ca)
        .map_err(|e| anyhow::anyhow!("ca.crt: {e}"))?;
    let config = bcd_proto::tls::client_config(bcd_proto::tls::ServerTrust::Ca(ca), None)?;
    let enrolled = Node::new(&d.path().join("enrolled"), 7);
    let out = enrolled.join(&server.url(), &server.token(1));
    anyhow::ensure!(out.status.success(), "join: {}", bc_tests::stderr(&out));
    let enrolled_id = enrolled.id();
    let mut probe = Probe {
        server: &server,
        tls: config.clone(),
        strangers: 0,
        enrolled,
        enrolled_id,
        dir: d.path().to_path_buf(),
        fresh: 0,
    };
    probe.enrolled.start();
    until(Duration::from_secs(60), || {
        server
            .node(&probe.enrolled_id)
            .is_some_and(|n| n.state == "connected")
    });
    probe.report("1. nothing", &rt);

    // 2. Idle and slowloris connections.
    let gateway = server.addr;
    let boot = server.boot.expect("boot endpoint");
    let stop = Arc::new(AtomicBool::new(false));
    let closed = Arc::new(AtomicU64::new(0));
    let held = rt.block_on(async {
        let mut held = Vec::new();
        for i in 0..args.idle {
            if let Ok(s) = dial(hostile(i), gateway).await {
                held.push(s);
            }
        }
        held
    });
    let mut trickles = Vec::new();
    for (k, to) in [(0, gateway), (1, boot)] {
        for i in 0..args.slowloris {
            let stop = stop.clone();
            let closed = closed.clone();
            let from = hostile(args.idle + k * args.slowloris + i);
            trickles.push(rt.spawn(async move {
                let Ok(mut s) = dial(from, to).await else {
                    return;
                };
                // A TLS record header, then a ClientHello that never ends;
                // or a request head that never ends.
                let bytes: &[u8] = if k == 0 {
                    &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]
                } else {
                    b"GET /boot/ipxe?mac=52:54:00:00:00:01 HTTP/1.1\r\nHost: bc\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa"
                };
                for b in bytes.iter().cycle() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if s.write_all(&[*b]).await.is_err() {
                        closed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }));
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    probe.report(
        &format!("2. {} idle + {}x2 slowloris", held.len(), args.slowloris),
        &rt,
    );
    std::thread::sleep(Duration::from_secs(12));
    println!(
        "   slowloris connections the server closed within ~15 s: {} of {}",
        closed.load(Ordering::Relaxed),
        2 * args.slowloris
    );

    // 3. Unauthenticated handshakes, back to back.
    let done = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let flood_stop = Arc::new(AtomicBool::new(false));
    let flood_start = Instant::now();
    let mut flooders = Vec::new();
    for i in 0..args.flooders {
        let (config, done, refused, flood_stop) = (
            config.clone(),
            done.clone(),
            refused.clone(),
            flood_stop.clone(),
        );
        let from =
            hostile(args.idle + 2 * args.slowloris + 100 + (i % args.flood_addresses.max(1)) * 100);
        flooders.push(rt.spawn(async move {
            let connector = tokio_rustls::TlsConnector::from(config);
            let name = rustls_pki_types::ServerName::try_from(bcd_proto::GATEWAY_NAME).unwrap();
            while !flood_stop.load(Ordering::Relaxed) {
                let Ok(tcp) = dial(from, gateway).await else {
                    refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                match tokio::time::timeout(
                    Duration::from_secs(5),
                    connector.connect(name.clone(), tcp),
                )
                .await
                {
                    Ok(Ok(_)) => done.fetch_add(1, Ordering::Relaxed),
                    _ => refused.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(2));
    probe.report(
        &format!(
            "3. + handshake flood from {} address(es)",
            args.flood_addresses.max(1)
        ),
        &rt,
    );
    let secs = flood_start.elapsed().as_secs_f64();
    println!(
        "   flood: {:.0} handshakes/s completed, {:.0}/s closed before or during the handshake",
        done.load(Ordering::Relaxed) as f64 / secs,
        refused.load(Ordering::Relaxed) as f64 / secs
    );
    flood_stop.store(true, Ordering::Relaxed);
    for f in flooders {
        let _ = rt.block_on(f);
    }

    // 4. Silent session streams with an enrolled node's certificate.
    let identity = bcd_agent::identity::Identity::load(&probe.enrolled.dir)?;
    let streams = Arc::new(AtomicU64::new(0));
    let mut holders = Vec::new();
    for _ in 0..args.stream_connections {
        let identity = identity.clone();
        let streams = streams.clone();
        holders.push(rt.spawn(async move {
            let config = bcd_proto::tls::client_config(
                bcd_proto::tls::ServerTrust::Ca(identity.ca.clone()),
                Some(bcd_proto::tls::ClientIdentity {
                    chain: vec![identity.cert.clone()],
                    key: identity.private_key(),
                }),
            )
            .ok()?;
            let channel = bcd_proto::tls::connect(&identity.file.server, config)
                .await
                .ok()?;
            let mut open = Vec::new();
            for _ in 0..64 {
                let mut client = bcd_proto::v1::gateway_client::GatewayClient::new(channel.clone());
                let (tx, rx) = tokio::sync::mpsc::channel::<bcd_proto::v1::NodeMessage>(1);
                let call = tokio::spawn(async move {
                    client
                        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
                        .await
                });
                streams.fetch_add(1, Ordering::Relaxed);
                open.push((tx, call));
            }
            tokio::time::sleep(Duration::from_secs(600)).await;
            Some(open.len())
        }));
    }
    std::thread::sleep(Duration::from_secs(2));
    probe.report(
        &format!(
            "4. + {} silent session streams",
            streams.load(Ordering::Relaxed)
        ),
        &rt,
    );

    for h in holders {
        h.abort();
    }
    stop.store(true, Ordering::Relaxed);
    for t in trickles {
        t.abort();
    }
    drop(held);
    std::thread::sleep(Duration::from_secs(1));
    probe.report("5. after: everything closed", &rt);
    Ok(())
}
