//! Tunnels: a command run on the node, or a TCP port on its loopback,
//! reached by an operator through the gateway holding the session.
//!
//! A gateway only relays. The session's `TunnelOpen` carries the key
//! holder's exec ticket; the node opens a tunnel only when the ticket
//! verifies under the ticket keys of the spec it enforces (a JWKS a worker
//! signed), names this node and the tunnel asked for, is within its minute
//! on server time, and its `jti` was never spent here (the journal keeps
//! spent ones past their expiry plus the mark's rewind slack, across
//! restarts). Anything else is refused, recorded as
//! `security.tunnel.refused` and answered `TunnelRefused`. The node then
//! opens the `Tunnel` stream on the session's connection, sends its
//! `TunnelAccept` (an ephemeral X25519 key signed by its node key) and
//! runs exactly what the ticket allows, sealing every record to the CLI's
//! key (`bcd_proto::tunnel`): the gateway can neither read nor inject a
//! byte. Every tunnel ends with a `tunnel.ended` event (who, what, the
//! ticket, bytes each way, exit).

use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bcd_proto::ticket::{self, Allows, Claims, Expect, Jwks};
use bcd_proto::tunnel::{self, Ephemeral, Opener, Sealer, Side};
use bcd_proto::v1::{self, TunnelFrame, TunnelRecord, tunnel_record::Body};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::Shared;
use crate::events::{self, TunnelRefused};
use crate::journal::EventClass;

/// Tunnels one node holds open at once.
pub const MAX_TUNNELS: usize = 8;

/// How long a tunnel may stay open: a shell an operator left is closed
/// after [`Limits::idle`] with no byte either way, and any tunnel at the
/// end of [`Limits::lifetime`], whatever moves (the ticket that opened it
/// was good for a minute; this bounds what one ticket buys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub idle: Duration,
    pub lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            idle: Duration::from_secs(30 * 60),
            lifetime: Duration::from_secs(12 * 3600),
        }
    }
}

impl Limits {
    /// Ends when a limit is reached, with the words the CLI prints:
    /// `idle` restarts with each call (each byte moved), `deadline` is the
    /// tunnel's own.
    async fn reached(self, deadline: tokio::time::Instant) -> String {
        tokio::select! {
            _ = tokio::time::sleep(self.idle) => format!(
                "closed after {} idle: run the command again",
                humantime::format_duration(self.idle)
            ),
            _ = tokio::time::sleep_until(deadline) => format!(
                "closed at the end of its {} lifetime: run the command again",
                humantime::format_duration(self.lifetime)
            ),
        }
    }
}

/// How long the CLI has to send its first record.
const FIRST_RECORD: Duration = Duration::from_secs(30);

/// How long a tunnel that ended waits for the other side to close.
const LINGER: Duration = Duration::from_secs(5);

/// The most one record carries from the node.
const CHUNK: usize = 32 * 1024;

const TUNNEL_PATH: &str = "/bcd.v1.Gateway/Tunnel";

/// The tunnels of one daemon: how many are open, and where their ends
/// are reported (the session loop journals them). Apart from `limits`,
/// which the daemon sets before it runs the agent, this module alone reads
/// or changes it.
#[derive(Debug)]
pub struct Tunnels {
    /// How many tunnels are open now.
    open: Arc<AtomicUsize>,
    /// Where a tunnel's task reports its end.
    ended: mpsc::UnboundedSender<Ended>,
    /// Where the loop reads the ends, until it takes it.
    ends: Option<mpsc::UnboundedReceiver<Ended>>,
    /// How long a tunnel may stay open.
    pub limits: Limits,
}

impl Tunnels {
    /// No tunnel open, under the default limits.
    pub fn new() -> Tunnels {
        let (ended, ends) = mpsc::unbounded_channel();
        Tunnels {
            open: Arc::new(AtomicUsize::new(0)),
            ended,
            ends: Some(ends),
            limits: Limits::default(),
        }
    }

    /// Where tunnels' ends arrive, for the loop to read (once).
    pub(super) fn take_ends(&mut self) -> Option<mpsc::UnboundedReceiver<Ended>> {
        self.ends.take()
    }
}

impl Default for Tunnels {
    fn default() -> Tunnels {
        Tunnels::new()
    }
}

/// How a tunnel ended, for its `tunnel.ended` event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Ended {
    pub sid: String,
    pub jti: String,
    /// The operator the ticket names.
    pub operator: String,
    /// The command, or `port:N`.
    pub what: Vec<String>,
    pub user: String,
    /// Record bytes from the CLI and to it.
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub exit_code: Option<i32>,
    pub signal: i32,
    pub error: String,
    pub seconds: u64,
}

impl events::Body for Ended {
    fn kind(&self) -> &'static str {
        "tunnel.ended"
    }
    fn class(&self) -> EventClass {
        EventClass::Transition
    }
}

/// Whom a command runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    /// Set when the daemon runs as root and the user is another.
    pub ids: Option<(u32, u32)>,
    pub home: String,
    pub shell: String,
}

/// Finds `user` in `passwd` (the text of `/etc/passwd`) for a daemon
/// whose effective uid is `euid`. As root, any user there; unprivileged
/// (under `bcd helper`), only the daemon's own user: a ticket cannot make
/// an unprivileged daemon run anything as root or as someone else.
pub fn run_as(user: &str, passwd: &str, euid: u32) -> Result<RunAs, String> {
    let entry = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 7 && f[0] == user).then(|| {
            (
                f[2].parse::<u32>().ok(),
                f[3].parse::<u32>().ok(),
                f[5].to_string(),
                f[6].to_string(),
            )
        })
    });
    let Some((Some(uid), Some(gid), home, shell)) = entry else {
        return Err(format!(
            "the ticket runs as user {user:?}, who does not exist on this node"
        ));
    };
    if euid != 0 && uid != euid {
        return Err(format!(
            "this node's daemon runs unprivileged (uid {euid}): a tunnel runs as its own user \
             only, not as {user:?} (uid {uid}): open it with --user naming that user"
        ));
    }
    Ok(RunAs {
        name: user.to_string(),
        ids: (uid != euid).then_some((uid, gid)),
        home,
        shell,
    })
}

/// A ticket the node admitted, ready to run.
struct Admitted {
    claims: Claims,
    allows: Allows,
    run_as: Option<RunAs>,
    sealer: Sealer,
    opener: Opener,
    accept: v1::TunnelAccept,
}

impl Tunnels {
    /// A `TunnelOpen` from the gateway: the tunnel opens on the session's
    /// connection, or the refusal to send back. The ticket verifies under
    /// the ticket keys of `spec`, the spec the node enforces.
    pub(super) fn on_open(
        &mut self,
        shared: &mut Shared,
        spec: Option<&v1::NodeSpec>,
        open: v1::TunnelOpen,
        conn: &super::conn::Conn,
        server_now: Option<i64>,
    ) -> Option<v1::TunnelRefused> {
        let Some(c) = conn else { return None };
        let admitted = match self.admit(shared, spec, &open, server_now) {
            Ok(a) => a,
            Err(reason) => {
                shared.refused_frame(TunnelRefused {
                    sid: open.sid.clone(),
                    why: reason.clone(),
                });
                return Some(v1::TunnelRefused {
                    sid: open.sid,
                    reason,
                });
            }
        };
        let open_now = self.open.clone();
        open_now.fetch_add(1, Ordering::SeqCst);
        info!(
            sid = %open.sid,
            operator = %admitted.claims.sub,
            jti = %admitted.claims.jti,
            what = ?admitted.allows,
            "tunnel opened"
        );
        let ended = self.ended.clone();
        let (h2, closed) = (c.conn.clone(), c.closed.clone());
        let limits = self.limits;
        tokio::spawn(async move {
            let started = bcd_sys::clock::mono();
            let mut end = run(h2, closed, admitted, limits).await;
            end.seconds = started.elapsed().as_secs();
            open_now.fetch_sub(1, Ordering::SeqCst);
            let _ = ended.send(end);
        });
        None
    }

    /// Checks the ticket and makes the tunnel's keys.
    fn admit(
        &self,
        shared: &mut Shared,
        spec: Option<&v1::NodeSpec>,
        open: &v1::TunnelOpen,
        server_now: Option<i64>,
    ) -> Result<Admitted, String> {
        let now_ms = server_now.ok_or("the node has no server time yet")?;
        let keys =
            Jwks::parse(spec.map_or("", |s| s.ticket_jwks.as_str())).map_err(|e| e.to_string())?;
        let expect = Expect {
            node: &shared.identity.file.node_id,
            sid: &open.sid,
            now_ms,
        };
        let claims = ticket::verify(&open.ticket, &keys, expect).map_err(|e| e.to_string())?;
        let allows = claims.allows().map_err(|e| e.to_string())?;
        if self.open.load(Ordering::SeqCst) >= MAX_TUNNELS {
            return Err(format!(
                "the node has {MAX_TUNNELS} tunnels open, as many as it keeps: close one first"
            ));
        }
        let run_as = match &allows {
            Allows::Exec { user, .. } => {
                let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
                Some(run_as(user, &passwd, rustix::process::geteuid().as_raw())?)
            }
            Allows::Port(_) => None,
        };
        match shared
            .journal
            .spend_ticket(&claims.jti, claims.keep_jti_until_ms(), now_ms)
        {
            Ok(true) => {}
            Ok(false) => return Err(ticket::TicketError::Replayed(claims.jti).to_string()),
            Err(None) => {
                return Err(format!(
                    "the node keeps {} spent tickets, as many as it may: wait a minute",
                    crate::journal::MAX_SPENT_TICKETS
                ));
            }
            Err(Some(e)) => return Err(format!("the journal cannot record the ticket: {e}")),
        }
        let client = claims.client_public().map_err(|e| e.to_string())?;
        let ticket_sha256 = tunnel::ticket_sha256(&open.ticket);
        let own = Ephemeral::new().map_err(|e| e.to_string())?;
        let node_public = own.public();
        let signature = shared
            .sign(&tunnel::accept_message(
                &open.sid,
                &ticket_sha256,
                &node_public,
            ))
            .ok_or("the node key did not sign the tunnel's key")?;
        let (sealer, opener) = own
            .agree(Side::Node, &client, &open.sid, &ticket_sha256)
            .map_err(|e| e.to_string())?;
        Ok(Admitted {
            accept: v1::TunnelAccept {
                sid: open.sid.clone(),
                ticket_sha256: ticket_sha256.to_vec(),
                node_public: node_public.to_vec(),
                cert_der: shared.identity.cert.to_vec(),
                signature,
            },
            claims,
            allows,
            run_as,
            sealer,
            opener,
        })
    }
}

/// The node's end of one tunnel: the stream, the two keys, the counts.
struct Link {
    tx: mpsc::Sender<TunnelFrame>,
    rx: tonic::Streaming<TunnelFrame>,
    sealer: Sealer,
    opener: Opener,
    bytes_in: u64,
    bytes_out: u64,
    limits: Limits,
    /// When the tunnel's lifetime ends.
    deadline: tokio::time::Instant,
}

impl Link {
    /// Ends when the tunnel sat idle too long or lived out its lifetime.
    fn limit(&self) -> impl Future<Output = String> + use<> {
        self.limits.reached(self.deadline)
    }

    async fn send(&mut self, body: Body) -> Result<(), String> {
        let plain = TunnelRecord { body: Some(body) }.encode_to_vec();
        let data = self.sealer.seal(&plain).map_err(|e| e.to_string())?;
        self.bytes_out += data.len() as u64;
        self.tx
            .send(TunnelFrame {
                sid: String::new(),
                data,
            })
            .await
            .map_err(|_| "the tunnel's stream closed".to_string())
    }

    /// The next record from the CLI; None when the stream ended.
    async fn recv(&mut self) -> Result<Option<Body>, String> {
        match self.rx.message().await {
            Ok(Some(f)) => {
                self.bytes_in += f.data.len() as u64;
                let plain = self.opener.open(&f.data).map_err(|e| e.to_string())?;
                let record = TunnelRecord::decode(plain.as_slice())
                    .map_err(|_| "a sealed record is not a TunnelRecord".to_string())?;
                record
                    .body
                    .map(Some)
                    .ok_or_else(|| "an empty record".to_string())
            }
            Ok(None) => Ok(None),
            Err(s) => Err(format!("the tunnel's stream failed: {}", s.message())),
        }
    }
}

/// Opens the stream, sends the accept and runs what the ticket allows.
async fn run(
    h2: bcd_proto::tls::Conn,
    mut closed: watch::Receiver<()>,
    a: Admitted,
    limits: Limits,
) -> Ended {
    let deadline = tokio::time::Instant::now() + limits.lifetime;
    let what = match &a.allows {
        Allows::Exec { argv, .. } => argv.clone(),
        Allows::Port(p) => vec![format!("port:{p}")],
    };
    let mut end = Ended {
        sid: a.claims.sid.clone(),
        jti: a.claims.jti.clone(),
        operator: a.claims.sub.clone(),
        what,
        user: a
            .run_as
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_default(),
        bytes_in: 0,
        bytes_out: 0,
        exit_code: None,
        signal: 0,
        error: String::new(),
        seconds: 0,
    };
    let (tx, rx) = mpsc::channel::<TunnelFrame>(16);
    let first = TunnelFrame {
        sid: a.claims.sid.clone(),
        data: a.accept.encode_to_vec(),
    };
    let _ = tx.send(first).await;
    let mut grpc = tonic::client::Grpc::new(h2);
    let opened = async {
        grpc.ready().await.map_err(|e| e.to_string())?;
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        request
            .extensions_mut()
            .insert(tonic::GrpcMethod::new("bcd.v1.Gateway", "Tunnel"));
        grpc.streaming(
            request,
            tonic::codegen::http::uri::PathAndQuery::from_static(TUNNEL_PATH),
            tonic_prost::ProstCodec::<TunnelFrame, TunnelFrame>::default(),
        )
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| s.message().to_string())
    };
    let rx = match opened.await {
        Ok(rx) => rx,
        Err(e) => {
            end.error = format!("the gateway did not take the tunnel: {e}");
            warn!(sid = %end.sid, error = %end.error, "tunnel not opened");
            return end;
        }
    };
    let mut link = Link {
        tx,
        rx,
        sealer: a.sealer,
        opener: a.opener,
        bytes_in: 0,
        bytes_out: 0,
        limits,
        deadline,
    };
    let outcome = tokio::select! {
        r = serve(&mut link, &a.allows, a.run_as.as_ref()) => r,
        _ = closed.changed() => Err("the session ended".to_string()),
    };
    match outcome {
        Ok(exit) => {
            end.exit_code = Some(exit.code);
            end.signal = exit.signal;
            end.error = exit.error.clone();
            let _ = link.send(Body::Exit(exit)).await;
        }
        Err(e) => end.error = e,
    }
    end.bytes_in = link.bytes_in;
    end.bytes_out = link.bytes_out;
    // The node's side ends; what it sent is delivered before the stream
    // goes (dropping the answer first would reset the stream and lose it):
    // wait, a little, for the other side to close.
    let Link { tx, mut rx, .. } = link;
    drop(tx);
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(Some(_)) = rx.message().await {}
    })
    .await;
    info!(sid = %end.sid, exit = ?end.exit_code, error = %end.error, "tunnel closed");
    end
}

/// Waits for the CLI's first record, then runs the command or reaches the
/// port; the exit to send. `Err`: the tunnel broke.
async fn serve(
    link: &mut Link,
    allows: &Allows,
    run_as: Option<&RunAs>,
) -> Result<v1::TunnelExit, String> {
    let first = match tokio::time::timeout(FIRST_RECORD, link.recv()).await {
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None)) => return Err("the CLI went before it began".into()),
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err("the CLI sent nothing".into()),
    };
    let size = match first {
        Body::Resize(s) => Some(s),
        _ => None,
    };
    match (allows, run_as) {
        (
            Allows::Exec {
                argv, tty: true, ..
            },
            Some(who),
        ) => exec_tty(link, argv, who, size).await,
        (Allows::Exec { argv, .. }, Some(who)) => exec(link, argv, who).await,
        (Allows::Port(port), _) => forward(link, *port).await,
        (Allows::Exec { .. }, None) => Err("no user to run as".into()),
    }
}

fn failed(error: String) -> v1::TunnelExit {
    v1::TunnelExit {
        code: -1,
        signal: 0,
        error,
    }
}

/// Runs `argv` as `who`, its input from the CLI and its output to it.
async fn exec(link: &mut Link, argv: &[String], who: &RunAs) -> Result<v1::TunnelExit, String> {
    let mut cmd = command(&argv[0], &argv[1..], who);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ok(failed(format!("{} did not start: {e}", argv[0]))),
    };
    drop(cmd);
    exec_piped(link, &mut child).await
}

/// `program args` as `who`, in their home, with a clean environment;
/// killed if the tunnel drops it.
fn command(program: &str, args: &[String], who: &RunAs) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", &who.home)
        .env("USER", &who.name)
        .env("LOGNAME", &who.name)
        .env("SHELL", &who.shell)
        .current_dir(if std::path::Path::new(&who.home).is_dir() {
            who.home.as_str()
        } else {
            "/"
        })
        .kill_on_drop(true);
    if let Some((uid, gid)) = who.ids {
        // std drops the supplementary groups when it sets the uid.
        cmd.uid(uid).gid(gid);
    }
    cmd
}

/// Signals the process group `group` leads.
fn signal_group(group: Option<rustix::process::Pid>, sig: i32) {
    if let (Some(g), Some(s)) = (group, rustix::process::Signal::from_named_raw(sig)) {
        let _ = rustix::process::kill_process_group(g, s);
    }
}

/// A command with pipes: input from the CLI, output and errors to it.
async fn exec_piped(
    link: &mut Link,
    child: &mut tokio::process::Child,
) -> Result<v1::TunnelExit, String> {
    let group = child
        .id()
        .and_then(|p| rustix::process::Pid::from_raw(p as i32));
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (mut out_buf, mut err_buf) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let signal_group = |sig: i32| signal_group(group, sig);
    let status = loop {
        let limit = link.limit();
        tokio::select! {
            r = link.recv() => match r {
                Ok(Some(Body::Stdin(bytes))) => {
                    if let Some(i) = stdin.as_mut()
                        && i.write_all(&bytes).await.is_err()
                    {
                        stdin = None;
                    }
                }
                Ok(Some(Body::StdinClosed(_))) => stdin = None,
                Ok(Some(Body::Signal(sig))) => signal_group(sig),
                Ok(Some(_)) => {}
                gone => {
                    // The CLI went: the command goes with it.
                    hang_up(child, group).await;
                    return Err(gone.err().unwrap_or_else(|| "the CLI closed the tunnel".into()));
                }
            },
            n = read_some(&mut stdout, &mut out_buf) => match n {
                Some(n) => link.send(Body::Stdout(out_buf[..n].to_vec())).await?,
                None => stdout = None,
            },
            n = read_some(&mut stderr, &mut err_buf) => match n {
                Some(n) => link.send(Body::Stderr(err_buf[..n].to_vec())).await?,
                None => stderr = None,
            },
            s = child.wait(), if stdout.is_none() && stderr.is_none() => {
                break s.map_err(|e| e.to_string())?;
            }
            why = limit => {
                hang_up(child, group).await;
                return Ok(failed(why));
            }
        }
    };
    Ok(exited(status))
}

fn exited(status: std::process::ExitStatus) -> v1::TunnelExit {
    use std::os::unix::process::ExitStatusExt;
    v1::TunnelExit {
        code: status.code().unwrap_or(-1),
        signal: status.signal().unwrap_or(0),
        error: String::new(),
    }
}

/// The pseudo-terminal a command runs under: its master, and the path
/// of its slave.
fn open_pty(
    size: Option<v1::TerminalSize>,
) -> std::io::Result<(std::os::fd::OwnedFd, std::fs::File)> {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(std::ffi::OsStr::from_bytes(name.as_bytes()))?;
    if let Some(s) = size {
        resize(&master, &s);
    }
    Ok((master, slave))
}

fn resize(master: &impl std::os::fd::AsFd, s: &v1::TerminalSize) {
    let size = rustix::termios::Winsize {
        ws_row: s.rows.clamp(1, u32::from(u16::MAX)) as u16,
        ws_col: s.cols.clamp(1, u32::from(u16::MAX)) as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let _ = rustix::termios::tcsetwinsize(master, size);
}

/// The trampoline a terminal's command starts through (`bcd tty-exec --
/// ARGV`, run as the ticket's user with the terminal as its standard
/// input, output and error): a session of its own with the terminal as
/// its controlling terminal, so Ctrl-C at the operator's keyboard reaches
/// the foreground job; then it becomes the command. Returns only on
/// failure.
pub fn tty_exec(argv: &[String]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = argv.split_first() else {
        return std::io::Error::other("tty-exec needs a command");
    };
    if let Err(e) = rustix::process::setsid() {
        return e.into();
    }
    if let Err(e) = rustix::process::ioctl_tiocsctty(std::io::stdin()) {
        return e.into();
    }
    std::process::Command::new(program).args(args).exec()
}

/// A command under a terminal: its input and output through the
/// terminal's master; resizes and signals from the CLI.
async fn exec_tty(
    link: &mut Link,
    argv: &[String],
    who: &RunAs,
    size: Option<v1::TerminalSize>,
) -> Result<v1::TunnelExit, String> {
    let (master, slave) = match open_pty(size) {
        Ok(p) => p,
        Err(e) => return Ok(failed(format!("no terminal for the command: {e}"))),
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return Ok(failed(format!("bcd cannot find itself: {e}"))),
    };
    let mut trampoline = vec!["tty-exec".to_string(), "--".to_string()];
    trampoline.extend(argv.iter().cloned());
    let mut cmd = command(&exe.to_string_lossy(), &trampoline, who);
    let (Ok(i), Ok(o)) = (slave.try_clone(), slave.try_clone()) else {
        return Ok(failed("no terminal for the command".into()));
    };
    cmd.stdin(Stdio::from(i))
        .stdout(Stdio::from(o))
        .stderr(Stdio::from(slave))
        .env("TERM", "xterm-256color");
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ok(failed(format!("{} did not start: {e}", argv[0]))),
    };
    // The parent's copies of the terminal go, so its end reads as the end.
    drop(cmd);
    // The command leads its own session: its process group is its pid.
    let group = child
        .id()
        .and_then(|p| rustix::process::Pid::from_raw(p as i32));
    let resize_fd = match master.try_clone() {
        Ok(f) => f,
        Err(e) => return Ok(failed(format!("no terminal for the command: {e}"))),
    };
    let master = std::fs::File::from(master);
    let mut writer = match master.try_clone() {
        Ok(w) => tokio::fs::File::from_std(w),
        Err(e) => return Ok(failed(format!("no terminal for the command: {e}"))),
    };
    let mut reader = Some(tokio::fs::File::from_std(master));
    let mut buf = vec![0u8; CHUNK];
    let status = loop {
        let limit = link.limit();
        tokio::select! {
            r = link.recv() => match r {
                Ok(Some(Body::Stdin(bytes))) => {
                    let _ = writer.write_all(&bytes).await;
                    let _ = writer.flush().await;
                }
                Ok(Some(Body::Resize(s))) => resize(&resize_fd, &s),
                Ok(Some(Body::Signal(sig))) => signal_group(group, sig),
                Ok(Some(_)) => {}
                gone => {
                    hang_up(&mut child, group).await;
                    return Err(gone.err().unwrap_or_else(|| "the CLI closed the tunnel".into()));
                }
            },
            // A terminal whose last slave closed reads as an error (EIO):
            // the end of the output.
            n = read_some(&mut reader, &mut buf) => match n {
                Some(n) => link.send(Body::Stdout(buf[..n].to_vec())).await?,
                None => reader = None,
            },
            s = child.wait(), if reader.is_none() => break s.map_err(|e| e.to_string())?,
            why = limit => {
                hang_up(&mut child, group).await;
                return Ok(failed(why));
            }
        }
    };
    Ok(exited(status))
}

/// Ends a command whose tunnel went: SIGHUP to its process group, as a
/// terminal's hang-up, then SIGKILL to the whole group (a child that
/// ignores SIGHUP, as one started under nohup does, goes too), and reaps
/// the command.
async fn hang_up(child: &mut tokio::process::Child, group: Option<rustix::process::Pid>) {
    signal_group(group, libc_sighup());
    signal_group(group, rustix::process::Signal::KILL.as_raw());
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// SIGHUP: what a terminal's hang-up sends.
fn libc_sighup() -> i32 {
    rustix::process::Signal::HUP.as_raw()
}

/// Reads what is there; None at the end (or with nothing to read from,
/// forever pending, so `select!` moves on).
async fn read_some<R: AsyncRead + Unpin>(r: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    match r {
        Some(r) => match r.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

/// Joins the tunnel to a TCP port on the node's loopback.
async fn forward(link: &mut Link, port: u16) -> Result<v1::TunnelExit, String> {
    let socket = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
        Ok(s) => s,
        Err(e) => return Ok(failed(format!("127.0.0.1:{port} on the node: {e}"))),
    };
    let (read, mut write) = socket.into_split();
    let mut read = Some(read);
    let mut buf = vec![0u8; CHUNK];
    let mut writing = true;
    loop {
        let limit = link.limit();
        tokio::select! {
            r = link.recv() => match r? {
                Some(Body::Stdin(bytes)) if writing => {
                    if write.write_all(&bytes).await.is_err() {
                        writing = false;
                    }
                }
                Some(Body::StdinClosed(_)) => {
                    let _ = write.shutdown().await;
                    writing = false;
                }
                Some(_) => {}
                None => return Err("the CLI closed the tunnel".into()),
            },
            n = read_some(&mut read, &mut buf) => match n {
                Some(n) => link.send(Body::Stdout(buf[..n].to_vec())).await?,
                None => {
                    return Ok(v1::TunnelExit { code: 0, signal: 0, error: String::new() });
                }
            },
            why = limit => return Ok(failed(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
                          bcd:x:998:997::/var/lib/bcd:/usr/sbin/nologin\n\
                          ops:x:1000:1000:Ops,,,:/home/ops:/bin/bash\n";

    #[test]
    fn root_runs_anyone_listed_and_an_unprivileged_daemon_only_itself() {
        let ops = run_as("ops", PASSWD, 0).unwrap();
        assert_eq!(ops.ids, Some((1000, 1000)));
        assert_eq!(
            (ops.home.as_str(), ops.shell.as_str()),
            ("/home/ops", "/bin/bash")
        );
        assert_eq!(run_as("root", PASSWD, 0).unwrap().ids, None);
        assert!(
            run_as("nobody", PASSWD, 0)
                .unwrap_err()
                .contains("does not exist")
        );
        assert_eq!(run_as("bcd", PASSWD, 998).unwrap().ids, None);
        for other in ["root", "ops"] {
            let e = run_as(other, PASSWD, 998).unwrap_err();
            assert!(e.contains("runs unprivileged"), "{e}");
        }
        // A malformed line names nobody.
        assert!(run_as("x", "x:x:notanumber:0::/:/bin/sh\n", 0).is_err());
    }
}
