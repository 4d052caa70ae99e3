//! Tunnel benchmark: prints figures, asserts nothing.
//!
//! - Exec round trip: `better-compute exec NODE -- /bin/true` from the CLI
//!   process starting to it exiting with the command's code, as an
//!   operator's script sees it (the CLI's start and its TLS handshake to the
//!   operator API, the ticket, the node's checks and signature, the sealed
//!   records both ways), one at a time through one gateway to one `bcd
//!   node`, on SQLite.
//! - Port-forward throughput: bytes written through `better-compute
//!   port-forward` to a sink on the node's loopback, against the same bytes
//!   written straight to the sink, alternating, in one run.
//! - The crypto ceiling: what sealing and opening alone allow on one core.
//!   A byte through the tunnel is sealed and opened once end to end
//!   (ChaCha20-Poly1305, the tunnel's records) and once on each of its two
//!   TLS hops (CLI to the operator API, gateway to the node: AES-128-GCM),
//!   so one core passes at most 1 / (1/e2e + 2/tls) of it, whatever the
//!   relays do.
//!
//! Build first: `cargo build --profile bench-fast --workspace --all-features`,
//! then run `target/bench-fast/bench-tunnels --execs 200 --mib 256`.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Instant;

use bc_tests::{Node, Server, bin};
use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 200)]
    execs: usize,
    /// MiB written per throughput round.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A sink on loopback: reads each connection to its end, then answers
/// one byte so the writer knows everything arrived.
fn sink() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("sink");
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 * 1024];
                while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
                let _ = c.write_all(b"k");
            });
        }
    });
    addr
}

/// Seconds to write `mib` MiB to `addr` and hear the sink got them all.
fn write_through(addr: SocketAddr, mib: usize) -> f64 {
    let chunk = vec![0x5au8; 1 << 20];
    let t = Instant::now();
    let mut c = TcpStream::connect(addr).expect("connect");
    for _ in 0..mib {
        c.write_all(&chunk).expect("write");
    }
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut ok = [0u8; 1];
    c.read_exact(&mut ok).expect("the sink's answer");
    t.elapsed().as_secs_f64()
}

/// MiB/s of sealing then opening `mib` MiB in 32 KiB records with the
/// tunnel's own keys.
fn tunnel_crypto(mib: usize) -> f64 {
    use bcd_proto::tunnel::{Ephemeral, Side};
    let (client, node) = (Ephemeral::new().unwrap(), Ephemeral::new().unwrap());
    let (cp, np) = (client.public(), node.public());
    let (mut seal, _) = client.agree(Side::Client, &np, "tn", &[0; 32]).unwrap();
    let (_, mut open) = node.agree(Side::Node, &cp, "tn", &[0; 32]).unwrap();
    let record = vec![0x5au8; 32 * 1024];
    let t = Instant::now();
    for _ in 0..mib * 32 {
        let sealed = seal.seal(&record).unwrap();
        std::hint::black_box(open.open(&sealed).unwrap());
    }
    mib as f64 / t.elapsed().as_secs_f64()
}

/// MiB/s of sealing then opening `mib` MiB in 16 KiB records (a TLS
/// record) with AES-128-GCM, the TLS hops' cipher.
fn tls_crypto(mib: usize) -> f64 {
    use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[7; 16]).unwrap());
    let mut record = vec![0x5au8; 16 * 1024];
    let t = Instant::now();
    for i in 0..mib as u64 * 64 {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&i.to_be_bytes());
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                &mut record,
            )
            .unwrap();
        record.extend_from_slice(tag.as_ref());
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                &mut record,
            )
            .unwrap()
            .len();
        record.truncate(plain);
    }
    mib as f64 / t.elapsed().as_secs_f64()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let d = tempfile::tempdir()?;
    let server = Server::start(&d.path().join("server"), &[])?;
    let mut node = Node::new(&d.path().join("node"), 7);
    let out = node.join(&server.url(), &server.token(1));
    anyhow::ensure!(out.status.success(), "join: {}", bc_tests::stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let cli = |args: &[&str]| {
        let mut c = Command::new(bin("better-compute"));
        c.arg("--data-dir")
            .arg(&server.dir)
            .arg("--server")
            .arg(server.api_url())
            .args(args);
        c
    };
    // The first tunnel has the node take the spec naming the ticket key.
    let o = cli(&["exec", &id, "--", "/bin/true"]).output()?;
    anyhow::ensure!(
        o.status.success(),
        "exec: {}\nserver: {}\nnode: {}",
        bc_tests::stderr(&o),
        server.proc.log(),
        node.proc().log()
    );

    let mut rtt = Vec::with_capacity(args.execs);
    for _ in 0..args.execs {
        let t = Instant::now();
        let o = cli(&["exec", &id, "--", "/bin/true"])
            .stdin(Stdio::null())
            .output()?;
        rtt.push(t.elapsed().as_secs_f64() * 1000.0);
        if !o.status.success() {
            // What the processes log after the CLI ended too.
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        let tail = |log: String| -> String {
            let lines: Vec<&str> = log.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        anyhow::ensure!(
            o.status.success(),
            "exec: {}\nserver:\n{}\nnode:\n{}",
            bc_tests::stderr(&o),
            tail(server.proc.log()),
            tail(node.proc().log())
        );
    }
    rtt.sort_by(f64::total_cmp);
    println!(
        "exec round trip (CLI start to exit, /bin/true, {} execs): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        rtt.len(),
        percentile(&rtt, 0.5),
        percentile(&rtt, 0.99),
        rtt.last().copied().unwrap_or(0.0)
    );

    let target = sink();
    let mut pf = cli(&["port-forward", &id, &format!("0:{}", target.port())])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(pf.stdout.take().expect("stdout")).read_line(&mut line)?;
    let local: SocketAddr = line
        .split_whitespace()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("port-forward printed {line:?}"))?;
    println!("port-forward throughput, {} MiB a round:", args.mib);
    for round in 1..=args.rounds {
        let direct = write_through(target, args.mib);
        let tunnel = write_through(local, args.mib);
        let (d_mb, t_mb) = (args.mib as f64 / direct, args.mib as f64 / tunnel);
        println!(
            "  round {round}: direct {d_mb:.0} MiB/s, through the tunnel {t_mb:.0} MiB/s: {:.3}x",
            t_mb / d_mb
        );
    }
    let _ = pf.kill();
    let _ = pf.wait();
    let (e2e, tls) = (tunnel_crypto(args.mib), tls_crypto(args.mib));
    let ceiling = 1.0 / (1.0 / e2e + 2.0 / tls);
    let direct = args.mib as f64 / write_through(target, args.mib);
    println!(
        "crypto ceiling on one core: end to end (ChaCha20-Poly1305) {e2e:.0} MiB/s, a TLS hop \
         (AES-128-GCM) {tls:.0} MiB/s: the tunnel at most {ceiling:.0} MiB/s, {:.3}x of direct \
         ({direct:.0} MiB/s) on one core, {:.3}x on two",
        ceiling / direct,
        2.0 * ceiling / direct
    );
    Ok(())
}
