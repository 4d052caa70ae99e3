//! `better-compute exec NODE -- CMD...`: a command on a node, its input,
//! output and exit code streamed through the operator API and the gateway
//! holding the node's session, sealed end to end.
//!
//! The CLI makes an ephemeral X25519 key, asks for a tunnel naming it, and
//! gets the key holder's ticket and the fleet CA. The node answers with an
//! ephemeral key of its own signed by its node key: the CLI checks that
//! the certificate is the fleet CA's for that node, that the signature
//! covers this tunnel, this ticket and that key, and only then sends a
//! byte. Neither the API nor the gateway can read or change what follows.

use std::process::ExitCode;

use bcd_proto::tunnel::{self, Ephemeral, Opener, Sealer, Side};
use bcd_proto::v1::{
    self, TunnelAccept, TunnelClientFrame, TunnelRecord, tunnel_client_frame, tunnel_record::Body,
    tunnel_server_frame,
};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::Target;
use crate::client::status;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  better-compute exec nd-0f3a9c1b2c3d -- nvidia-smi -L\n  better-compute exec nd-0f3a9c1b2c3d --user ops -- sh -c 'ps aux | grep python'\n  better-compute exec -t nd-0f3a9c1b2c3d -- bash -l"
)]
pub struct ExecArgs {
    /// The node to run the command on.
    node: String,
    /// The user the command runs as on the node (an unprivileged node
    /// runs it only as its daemon's own user).
    #[arg(long, default_value = "root")]
    user: String,
    /// Run it under a terminal on the node (a shell, top, an editor): this
    /// terminal goes raw and its size follows along; output and errors
    /// come as one stream, Ctrl-C reaches the command's foreground job.
    #[arg(short = 't', long)]
    tty: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Checks the node's accept: for this tunnel and ticket, signed by the
/// key of a certificate the fleet CA issued to `node`, valid now.
pub fn check_accept(
    accept: &TunnelAccept,
    node: &str,
    sid: &str,
    ticket: &str,
    fleet_ca: &[u8],
    now_ms: i64,
) -> Result<(), String> {
    if accept.sid != sid {
        return Err(format!("it names tunnel {:?}, not {sid:?}", accept.sid));
    }
    if accept.ticket_sha256 != tunnel::ticket_sha256(ticket) {
        return Err("it answers another ticket".into());
    }
    if !crate::certs::issued_by(&accept.cert_der, fleet_ca) {
        return Err("its certificate is not the fleet CA's".into());
    }
    match crate::certs::named(&accept.cert_der, "urn:bc:node:") {
        Some((n, not_before)) if n == node && not_before <= now_ms + 60_000 => {}
        Some((n, _)) if n != node => return Err(format!("its certificate is node {n}'s")),
        _ => return Err("its certificate names no node, or is not valid yet".into()),
    }
    if crate::certs::not_after_ms(&accept.cert_der).is_none_or(|t| t < now_ms) {
        return Err("its certificate has expired".into());
    }
    let message = tunnel::accept_message(sid, &accept.ticket_sha256, &accept.node_public);
    if !crate::certs::verify_node_signature(&accept.cert_der, &message, &accept.signature) {
        return Err("its signature does not verify under its certificate".into());
    }
    Ok(())
}

/// An open tunnel, as the CLI holds it: frames to the operator API,
/// sealed records both ways.
pub struct Tunnel {
    tx: mpsc::Sender<TunnelClientFrame>,
    sealer: Sealer,
    opener: Opener,
    inbound: tonic::Streaming<v1::TunnelServerFrame>,
}

impl Tunnel {
    /// Asks for a tunnel to `request.node_id` and checks the node's answer
    /// before anything is sent; then sends `first` (`start`, or the
    /// terminal's size).
    pub async fn open(
        target: &Target,
        mut request: v1::TunnelRequest,
        first: Body,
    ) -> anyhow::Result<Tunnel> {
        let own = Ephemeral::new()?;
        request.client_public = own.public().to_vec();
        let node = request.node_id.clone();
        let (tx, rx) = mpsc::channel::<TunnelClientFrame>(16);
        tx.send(TunnelClientFrame {
            msg: Some(tunnel_client_frame::Msg::Request(request)),
        })
        .await?;
        let mut admin = target.connect().await?;
        let mut inbound = admin
            .tunnel(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(status)?
            .into_inner();
        let granted = match inbound.message().await.map_err(status)? {
            Some(v1::TunnelServerFrame {
                msg: Some(tunnel_server_frame::Msg::Granted(g)),
            }) => g,
            _ => anyhow::bail!("the operator API did not grant the tunnel"),
        };
        let accept = match inbound.message().await.map_err(status)? {
            Some(v1::TunnelServerFrame {
                msg: Some(tunnel_server_frame::Msg::Data(d)),
            }) => TunnelAccept::decode(d.as_slice())
                .map_err(|_| anyhow::anyhow!("the node's answer is not a TunnelAccept"))?,
            _ => anyhow::bail!("the tunnel closed before the node answered"),
        };
        check_accept(
            &accept,
            &node,
            &granted.sid,
            &granted.ticket,
            &granted.fleet_ca_der,
            crate::clock::unix_ms(),
        )
        .map_err(|why| {
            anyhow::anyhow!(
                "the answer relayed as node {node}'s does not verify ({why}): nothing was sent; a \
                 relay may be tampering with the tunnel"
            )
        })?;
        let (sealer, opener) = own.agree(
            Side::Client,
            &accept.node_public,
            &granted.sid,
            &accept.ticket_sha256,
        )?;
        let mut t = Tunnel {
            tx,
            sealer,
            opener,
            inbound,
        };
        t.send(first).await?;
        Ok(t)
    }

    /// Seals and sends one record.
    pub async fn send(&mut self, body: Body) -> anyhow::Result<()> {
        let plain = TunnelRecord { body: Some(body) }.encode_to_vec();
        let frame = TunnelClientFrame {
            msg: Some(tunnel_client_frame::Msg::Data(self.sealer.seal(&plain)?)),
        };
        self.tx
            .send(frame)
            .await
            .map_err(|_| anyhow::anyhow!("the tunnel is closed"))
    }

    /// The next record from the node; an error when the tunnel ended
    /// without the node's exit.
    pub async fn recv(&mut self) -> anyhow::Result<Body> {
        loop {
            let message = self.inbound.message().await.map_err(|s| {
                let m = s.message();
                if m.contains("run the command again") || s.code() == tonic::Code::PermissionDenied
                {
                    anyhow::anyhow!("{m}")
                } else {
                    anyhow::anyhow!("the tunnel broke ({m}): run the command again")
                }
            })?;
            let data = match message {
                Some(v1::TunnelServerFrame {
                    msg: Some(tunnel_server_frame::Msg::Data(d)),
                }) => d,
                Some(_) => continue,
                None => anyhow::bail!(
                    "the tunnel ended before the node closed it (the gateway holding the node's \
                     session went away, or the session ended): run the command again"
                ),
            };
            let plain = self.opener.open(&data)?;
            if let Some(body) = TunnelRecord::decode(plain.as_slice())
                .map_err(|_| anyhow::anyhow!("the node sent a record that is not a TunnelRecord"))?
                .body
            {
                return Ok(body);
            }
        }
    }
}

/// This terminal's size.
fn terminal_size() -> Option<v1::TerminalSize> {
    rustix::termios::tcgetwinsize(std::io::stdout())
        .ok()
        .map(|w| v1::TerminalSize {
            rows: u32::from(w.ws_row),
            cols: u32::from(w.ws_col),
        })
}

/// Puts standard input in raw mode until dropped (then as it was).
struct Raw(Option<rustix::termios::Termios>);

impl Raw {
    fn enter() -> Raw {
        let stdin = std::io::stdin();
        let Ok(was) = rustix::termios::tcgetattr(&stdin) else {
            return Raw(None);
        };
        let mut raw = was.clone();
        raw.make_raw();
        let set = rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw);
        Raw(set.ok().map(|()| was))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(was) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin(),
                rustix::termios::OptionalActions::Now,
                was,
            );
        }
    }
}

pub async fn run(args: ExecArgs, target: &Target) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    let size = args.tty.then(terminal_size).flatten();
    let first = match &size {
        Some(s) => Body::Resize(*s),
        None => Body::Start(true),
    };
    let mut t = Tunnel::open(
        target,
        v1::TunnelRequest {
            node_id: args.node.clone(),
            argv: args.command.clone(),
            port: 0,
            tty: args.tty,
            user: args.user.clone(),
            client_public: Vec::new(),
        },
        first,
    )
    .await?;
    // Raw only once the tunnel is open, so an error before reads plainly.
    let _raw = (args.tty && std::io::stdin().is_terminal()).then(Raw::enter);
    let mut stdin = Some(tokio::io::stdin());
    let mut buf = vec![0u8; 32 * 1024];
    let (mut stdout, mut stderr) = (tokio::io::stdout(), tokio::io::stderr());
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupts = signal(SignalKind::interrupt())?;
    let mut resizes = signal(SignalKind::window_change())?;
    loop {
        tokio::select! {
            n = async { stdin.as_mut().expect("guarded").read(&mut buf).await }, if stdin.is_some() => {
                let body = match n {
                    Ok(0) | Err(_) => {
                        stdin = None;
                        Body::StdinClosed(true)
                    }
                    Ok(n) => Body::Stdin(buf[..n].to_vec()),
                };
                if t.send(body).await.is_err() {
                    stdin = None;
                }
            }
            _ = interrupts.recv() => {
                let _ = t.send(Body::Signal(2)).await;
            }
            _ = resizes.recv(), if args.tty => {
                if let Some(s) = terminal_size() {
                    let _ = t.send(Body::Resize(s)).await;
                }
            }
            body = t.recv() => match body? {
                Body::Stdout(b) => {
                    stdout.write_all(&b).await?;
                    stdout.flush().await?;
                }
                Body::Stderr(b) => {
                    stderr.write_all(&b).await?;
                    stderr.flush().await?;
                }
                Body::Exit(e) => return Ok(exit_code(&e)),
                _ => {}
            },
        }
    }
}

/// The exit code the CLI ends with: the command's; 128 plus the signal
/// that ended it; 255 when it could not run (the reason printed).
pub fn exit_code(e: &v1::TunnelExit) -> ExitCode {
    if !e.error.is_empty() {
        eprintln!("error: {}", e.error);
        return ExitCode::from(255);
    }
    if e.signal > 0 {
        return ExitCode::from((128 + e.signal).clamp(0, 255) as u8);
    }
    ExitCode::from(e.code.clamp(0, 255) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair, PKCS_ECDSA_P256_SHA256};

    const NOW: i64 = 1_800_000_000_000;

    struct Issued {
        ca_der: Vec<u8>,
        cert: Vec<u8>,
        key: KeyPair,
    }

    /// A fleet CA in `dir` and a node certificate it issued to `node`.
    fn issued(dir: &std::path::Path, node: &str) -> Issued {
        std::fs::create_dir_all(dir).unwrap();
        let ca = crate::pki::ca::Ca::load_or_create(dir, &["localhost".into()], NOW).unwrap();
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let csr = CertificateParams::default()
            .serialize_request(&key)
            .unwrap()
            .der()
            .to_vec();
        let cert = ca
            .issue_node_cert(&csr, node, None, NOW, std::time::Duration::from_secs(3600))
            .unwrap();
        Issued {
            ca_der: ca.cert.to_vec(),
            cert: cert.der.to_vec(),
            key,
        }
    }

    /// The accept the node sends for `sid` and `ticket`, signed by `key`.
    fn accept(sid: &str, ticket: &str, cert: &[u8], key: &KeyPair) -> TunnelAccept {
        let ticket_sha256 = tunnel::ticket_sha256(ticket).to_vec();
        let node_public = vec![9u8; 32];
        let message = tunnel::accept_message(sid, &ticket_sha256, &node_public);
        TunnelAccept {
            sid: sid.into(),
            ticket_sha256,
            node_public,
            cert_der: cert.to_vec(),
            signature: rcgen::SigningKey::sign(key, &message).unwrap(),
        }
    }

    #[test]
    fn only_the_nodes_own_accept_for_this_tunnel_and_ticket_passes() {
        let d = tempfile::tempdir().unwrap();
        let fleet = issued(&d.path().join("fleet"), "nd-1");
        let check = |a: &TunnelAccept, node: &str, now: i64| {
            check_accept(a, node, "tn-1", "ticket", &fleet.ca_der, now)
        };
        let good = accept("tn-1", "ticket", &fleet.cert, &fleet.key);
        assert_eq!(check(&good, "nd-1", NOW), Ok(()));

        // A relay's own key in the accept, under the node's certificate.
        let mut swapped = good.clone();
        swapped.node_public = vec![7u8; 32];
        assert!(
            check(&swapped, "nd-1", NOW)
                .unwrap_err()
                .contains("signature")
        );
        // Signed by a key of the relay's, under the node's certificate.
        let relay = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let forged = accept("tn-1", "ticket", &fleet.cert, &relay);
        assert!(
            check(&forged, "nd-1", NOW)
                .unwrap_err()
                .contains("signature")
        );
        // A certificate another CA issued (the relay's own fleet).
        let other = issued(&d.path().join("other"), "nd-1");
        let foreign = accept("tn-1", "ticket", &other.cert, &other.key);
        assert!(
            check(&foreign, "nd-1", NOW)
                .unwrap_err()
                .contains("not the fleet CA's")
        );
        // Another node's accept, another tunnel's, another ticket's.
        assert!(
            check(&good, "nd-2", NOW)
                .unwrap_err()
                .contains("node nd-1's")
        );
        let elsewhere = accept("tn-2", "ticket", &fleet.cert, &fleet.key);
        assert!(
            check(&elsewhere, "nd-1", NOW)
                .unwrap_err()
                .contains("names tunnel")
        );
        let earlier = accept("tn-1", "another ticket", &fleet.cert, &fleet.key);
        assert!(
            check(&earlier, "nd-1", NOW)
                .unwrap_err()
                .contains("another ticket")
        );
        // A certificate that ran out.
        assert!(
            check(&good, "nd-1", NOW + 2 * 3_600_000)
                .unwrap_err()
                .contains("expired")
        );
    }
}
