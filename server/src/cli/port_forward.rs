//! `better-compute port-forward NODE [LOCAL:]REMOTE`: a TCP port on the
//! node's loopback, reached from a port on this machine's loopback. Each
//! connection accepted locally is its own tunnel, under its own ticket,
//! sealed end to end like `exec`.

use std::net::SocketAddr;

use bcd_proto::v1::{self, tunnel_record::Body};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

use super::Target;
use super::exec::Tunnel;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  better-compute port-forward nd-0f3a9c1b2c3d 8888\n  better-compute port-forward nd-0f3a9c1b2c3d 0:8888\n  better-compute port-forward nd-0f3a9c1b2c3d 9090:8888 --address 0.0.0.0"
)]
pub struct PortForwardArgs {
    /// The node whose port to reach.
    node: String,
    /// REMOTE (the same port here), or LOCAL:REMOTE; LOCAL 0 picks a free
    /// port, printed.
    ports: String,
    /// Where to listen on this machine.
    #[arg(long, default_value = "127.0.0.1")]
    address: std::net::IpAddr,
}

/// `[LOCAL:]REMOTE`, each a port; LOCAL may be 0, REMOTE may not.
pub fn parse_ports(s: &str) -> Result<(u16, u16), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("{p:?} is not a port (0 to 65535): give REMOTE or LOCAL:REMOTE"))
    };
    let (local, remote) = match s.split_once(':') {
        Some((l, r)) => (port(l)?, port(r)?),
        None => (port(s)?, port(s)?),
    };
    if remote == 0 {
        return Err("the node's port cannot be 0: give REMOTE or LOCAL:REMOTE".into());
    }
    Ok((local, remote))
}

pub async fn run(args: PortForwardArgs, target: &Target) -> anyhow::Result<()> {
    let (local, remote) = parse_ports(&args.ports).map_err(anyhow::Error::msg)?;
    let listener = TcpListener::bind(SocketAddr::new(args.address, local))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}:{local}: {e}", args.address))?;
    println!(
        "forwarding {} to {}:127.0.0.1:{remote} (Ctrl-C stops)",
        listener.local_addr()?,
        args.node
    );
    loop {
        tokio::select! {
            a = listener.accept() => {
                let (socket, peer) = a?;
                let (target, node) = (target.clone(), args.node.clone());
                tokio::spawn(async move {
                    if let Err(e) = forward(&target, &node, remote, socket).await {
                        warn!(%peer, error = %e, "the forwarded connection ended");
                        eprintln!("{peer}: {}", bcd_sys::error::chain(e.as_ref()));
                    }
                });
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// One local connection through its own tunnel.
async fn forward(target: &Target, node: &str, port: u16, socket: TcpStream) -> anyhow::Result<()> {
    let mut t = Tunnel::open(
        target,
        v1::TunnelRequest {
            node_id: node.to_string(),
            argv: Vec::new(),
            port: u32::from(port),
            tty: false,
            user: String::new(),
            client_public: Vec::new(),
        },
        Body::Start(true),
    )
    .await?;
    let (mut read, mut write) = socket.into_split();
    let mut reading = true;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        tokio::select! {
            n = read.read(&mut buf), if reading => match n {
                Ok(0) | Err(_) => {
                    reading = false;
                    t.send(Body::StdinClosed(true)).await?;
                }
                Ok(n) => t.send(Body::Stdin(buf[..n].to_vec())).await?,
            },
            body = t.recv() => match body? {
                Body::Stdout(b) => write.write_all(&b).await?,
                Body::Exit(e) if e.error.is_empty() => return Ok(()),
                Body::Exit(e) => anyhow::bail!("{}", e.error),
                _ => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_read_as_remote_or_local_and_remote() {
        assert_eq!(parse_ports("8888"), Ok((8888, 8888)));
        assert_eq!(parse_ports("0:8888"), Ok((0, 8888)));
        assert_eq!(parse_ports("9000:22"), Ok((9000, 22)));
        for bad in ["", "x", "1:", ":2", "70000", "1:0", "0"] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
    }
}
