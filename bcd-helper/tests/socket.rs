//! The helper's server and client over a real unix socket: every request
//! kind end to end, peers of other uids (threads that drop to them, so the
//! kernel records them in SO_PEERCRED), handshakes of other versions both
//! ways, frames that are not requests, limits, timeouts, a restarted
//! helper, and TPM commands relayed to a real swtpm.
//!
//! Run as root (as the suite does): dropping to other uids needs it.
#![allow(clippy::disallowed_methods)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bcd_helper::frame::{self, FrameError};
use bcd_helper::server::version_refusal;
use bcd_helper::validate::Slot;
use bcd_helper::{
    Client, ClientConfig, ClientError, ErrorKind, Handler, HelperError, PROTOCOL_VERSION, Peer,
    Reply, Request, Server, ServerConfig, TpmSession, wire,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the test handler saw and how it answers: real code standing where
/// the agent's handler will, recording instead of acting.
#[derive(Debug, Default)]
struct State {
    seen: Mutex<Vec<(Peer, Request)>>,
    swtpm: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, Default)]
struct Recorder(Arc<State>);

struct Conn {
    peer: Peer,
    tpm: Option<tokio::net::TcpStream>,
}

impl Recorder {
    fn seen(&self) -> Vec<(Peer, Request)> {
        self.0.seen.lock().unwrap().clone()
    }

    async fn relay(&self, conn: &mut Conn, command: &[u8]) -> Result<Vec<u8>, HelperError> {
        let Some(addr) = self.0.swtpm else {
            return Err(HelperError::unavailable("no TPM on this machine"));
        };
        if conn.tpm.is_none() {
            conn.tpm = Some(
                tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| HelperError::unavailable(format!("swtpm: {e}")))?,
            );
        }
        let tpm = conn.tpm.as_mut().expect("connected above");
        let io = |e: std::io::Error| HelperError::failed(format!("swtpm: {e}"));
        tpm.write_all(command).await.map_err(io)?;
        let mut header = [0u8; 10];
        tpm.read_exact(&mut header).await.map_err(io)?;
        let size = u32::from_be_bytes([header[2], header[3], header[4], header[5]]) as usize;
        let mut response = header.to_vec();
        response.resize(size.max(10), 0);
        tpm.read_exact(&mut response[10..]).await.map_err(io)?;
        Ok(response)
    }
}

impl Handler for Recorder {
    type Conn = Conn;

    fn open(&self, peer: &Peer) -> Conn {
        Conn {
            peer: *peer,
            tpm: None,
        }
    }

    async fn handle(&self, conn: &mut Conn, request: Request) -> Result<Reply, HelperError> {
        self.0
            .seen
            .lock()
            .unwrap()
            .push((conn.peer, request.clone()));
        Ok(match request {
            Request::Reboot { reason } if reason == "slow" => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Reply::Done
            }
            Request::Reboot { reason } if reason == "wrong shape" => {
                Reply::Written { changed: false }
            }
            Request::ApplyFirewall(rules) if rules.len() == 2 => {
                return Err(HelperError::failed(
                    "nft refused the table: Error: Could not process rule",
                ));
            }
            Request::Reboot { .. }
            | Request::ResetGpu(_)
            | Request::Kexec(_)
            | Request::RestartDaemon => Reply::Done,
            Request::RollBack => Reply::RolledBack {
                swapped: true,
                message: "swapped back from release 8 to release 7".into(),
            },
            Request::Tpm(command) => Reply::Tpm(self.relay(conn, command.bytes()).await?),
            Request::RemoveEnvFile(_) => Reply::Written { changed: false },
            _ => Reply::Written { changed: true },
        })
    }
}

/// A helper serving in a runtime of its own: dropping it is the helper
/// process dying (every connection closes).
struct Helper {
    rt: Option<tokio::runtime::Runtime>,
    handler: Recorder,
}

impl Helper {
    fn start(config: ServerConfig, handler: Recorder) -> Helper {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = rt
            .block_on(async { Server::bind(config, handler.clone()) })
            .unwrap();
        rt.spawn(server.serve());
        Helper {
            rt: Some(rt),
            handler,
        }
    }

    fn stop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A temporary directory other uids can traverse.
fn dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    d
}

fn me() -> u32 {
    rustix::process::getuid().as_raw()
}

fn config(socket: &Path) -> ServerConfig {
    let mut c = ServerConfig::new(socket, me());
    c.sysfs_root = socket.parent().unwrap().join("sys");
    c
}

fn client(socket: &Path) -> Client {
    Client::new(ClientConfig::new(socket))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `f` on a thread whose credentials are `uid` and `gid` (Linux keeps
/// credentials per thread; glibc's setuid would change every thread).
fn as_user<T: Send + 'static>(uid: u32, gid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
        let gid = rustix::process::Gid::from_raw(gid);
        let uid = rustix::process::Uid::from_raw(uid);
        set_thread_groups(&[]).expect("setgroups: run the tests as root");
        set_thread_res_gid(gid, gid, gid).expect("setresgid: run the tests as root");
        set_thread_res_uid(uid, uid, uid).expect("setresuid: run the tests as root");
        f()
    })
    .join()
    .unwrap()
}

fn env_file(id: &str) -> wire::WriteEnvFile {
    wire::WriteEnvFile {
        allocation_id: id.into(),
        devices: vec!["GPU-00000000-0000-0000-0000-000000000000".into()],
        env: [("JOB".to_string(), id.to_string())].into(),
    }
}

const ED25519: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

fn nvidia_gpu(sysfs: &Path, address: &str) {
    let d = sysfs.join("bus/pci/devices").join(address);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(d.join("class"), "0x030200\n").unwrap();
}

#[test]
fn every_request_kind_reaches_the_handler_validated() {
    let d = dir();
    let socket = d.path().join("helper.sock");
    nvidia_gpu(&d.path().join("sys"), "0000:3b:00.0");
    let helper = Helper::start(config(&socket), Recorder::default());
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660);
    let c = client(&socket);
    rt().block_on(async {
        let info = c.server_info().await.unwrap();
        assert_eq!(info.version, PROTOCOL_VERSION);
        assert!(info.software.starts_with("bcd-helper "), "{}", info.software);
        let cdi = br#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}]}}]}"#;
        assert!(c.write_cdi_spec(cdi.to_vec()).await.unwrap());
        assert!(c.write_env_file(env_file("job-a")).await.unwrap());
        assert!(!c.remove_env_file("job-a").await.unwrap());
        assert!(
            c.write_sshd(wire::WriteSshd {
                users: vec![wire::SshUser {
                    name: "alice".into(),
                    authorized_keys: vec![ED25519.into()],
                    principals: vec!["alice".into()],
                }],
                trusted_user_ca_keys: vec![],
            })
            .await
            .unwrap()
        );
        let rule = wire::FirewallRule {
            protocol: wire::Protocol::Tcp as i32,
            port: 22,
            source: "10.0.0.0/8".into(),
            action: wire::Action::Accept as i32,
        };
        assert!(c.apply_firewall(vec![rule.clone()]).await.unwrap());
        assert!(c.delete_firewall().await.unwrap());
        c.reset_gpu("0000:3b:00.0").await.unwrap();
        c.reboot("node.reboot cmd-7").await.unwrap();
        c.kexec(wire::Kexec {
            kernel: "vmlinuz".into(),
            kernel_sha256: vec![1; 32],
            initrd: String::new(),
            initrd_sha256: vec![],
            cmdline: "console=ttyS0".into(),
        })
        .await
        .unwrap();
        assert!(c.install_slot(Slot::B, "bcd-9", [9; 32]).await.unwrap());
        assert!(c.switch_slot(Slot::B, [9; 32]).await.unwrap());
        assert_eq!(
            c.roll_back().await.unwrap(),
            (true, "swapped back from release 8 to release 7".to_string())
        );
        c.restart_daemon().await.unwrap();
        // A handler's failure reaches the caller with its kind and text.
        let e = c.apply_firewall(vec![rule.clone(), rule]).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "helper: apply-firewall: nft refused the table: Error: Could not process rule"
        );
        assert!(!e.is_invalid());
    });
    let seen = helper.handler.seen();
    let kinds: Vec<&str> = seen.iter().map(|(_, r)| r.kind().name()).collect();
    assert_eq!(
        kinds,
        [
            "write-cdi-spec",
            "write-env-file",
            "remove-env-file",
            "write-sshd",
            "apply-firewall",
            "delete-firewall",
            "reset-gpu",
            "reboot",
            "kexec",
            "install-slot",
            "switch-slot",
            "roll-back",
            "restart-daemon",
            "apply-firewall",
        ]
    );
    assert!(seen.iter().all(|(p, _)| p.uid == me()));
    assert!(seen.iter().all(|(p, _)| p.pid == std::process::id() as i32));
    let Request::WriteEnvFile(f) = &seen[1].1 else {
        panic!("{:?}", seen[1])
    };
    assert!(
        f.render()
            .contains("CDI_DEVICES=nvidia.com/gpu=GPU-00000000")
    );
    let Request::SwitchSlot { slot, sha256 } = &seen[10].1 else {
        panic!("{:?}", seen[10])
    };
    assert_eq!((*slot, sha256.0), (Slot::B, [9; 32]));
}

#[test]
fn invalid_requests_never_reach_the_handler() {
    let d = dir();
    let socket = d.path().join("helper.sock");
    let helper = Helper::start(config(&socket), Recorder::default());
    let c = client(&socket);
    rt().block_on(async {
        // The client refuses them before they leave...
        let e = c
            .write_env_file(wire::WriteEnvFile {
                env: [("LD_PRELOAD".to_string(), "/tmp/x.so".to_string())].into(),
                ..env_file("job-a")
            })
            .await
            .unwrap_err();
        assert!(e.is_invalid());
        assert!(
            e.to_string().starts_with("helper: allocation job-a: LD_PRELOAD is reserved"),
            "{e}"
        );
        // ...and the helper refuses them when a client does not.
        let mut s = handshake(&socket, PROTOCOL_VERSION).await;
        let cases: Vec<(wire::request::Kind, &str)> = vec![
            (
                wire::request::Kind::RemoveEnvFile(wire::RemoveEnvFile {
                    allocation_id: "../../etc/passwd".into(),
                }),
                "allocation id",
            ),
            (
                wire::request::Kind::WriteCdiSpec(wire::WriteCdiSpec {
                    json: br#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"hooks":[{"hookName":"createRuntime","path":"/tmp/x"}]}}]}"#.to_vec(),
                }),
                "hooks are refused",
            ),
            (
                wire::request::Kind::ResetGpu(wire::ResetGpu {
                    pci_address: "0000:3b:00.0".into(),
                }),
                "no PCI device 0000:3b:00.0",
            ),
            (
                wire::request::Kind::TpmCommand(wire::TpmCommand {
                    command: vec![0x80, 0x01, 0, 0, 0, 10, 0, 0, 0x01, 0x26],
                }),
                "is not one bcd sends",
            ),
            (
                wire::request::Kind::SwitchSlot(wire::SwitchSlot {
                    slot: 0,
                    sha256: vec![0; 32],
                }),
                "must be a or b",
            ),
        ];
        for (kind, want) in cases {
            let failure = exchange(&mut s, &wire::Request { kind: Some(kind) }).await;
            assert_eq!(failure.kind, wire::ErrorKind::Invalid as i32);
            assert!(failure.message.contains(want), "{want}: {}", failure.message);
        }
        // An empty request, as a newer client might send.
        let failure = exchange(&mut s, &wire::Request { kind: None }).await;
        assert!(failure.message.contains("restart bcd and bcd-helper"));
        // The connection still serves.
        assert!(c.write_env_file(env_file("job-b")).await.unwrap());
    });
    let seen = helper.handler.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
}

/// A raw connection after a successful handshake.
async fn handshake(socket: &Path, version: u32) -> tokio::net::UnixStream {
    let (s, reply) = hello(socket, version).await;
    assert_eq!(reply.refused, "");
    s
}

async fn hello(socket: &Path, version: u32) -> (tokio::net::UnixStream, wire::HelloReply) {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    let f = frame::encode(&wire::Hello {
        version,
        software: "test".into(),
    })
    .unwrap();
    frame::write(&mut s, &f).await.unwrap();
    let body = frame::read(&mut s, frame::MAX_HELLO, Duration::from_secs(5))
        .await
        .unwrap();
    let reply = frame::decode::<wire::HelloReply>("HelloReply", &body).unwrap();
    (s, reply)
}

async fn read_failure(s: &mut tokio::net::UnixStream) -> wire::Failure {
    let body = frame::read(s, frame::MAX_FRAME, Duration::from_secs(5))
        .await
        .unwrap();
    match frame::decode::<wire::Response>("Response", &body)
        .unwrap()
        .result
    {
        Some(wire::response::Result::Failure(f)) => f,
        other => panic!("not a failure: {other:?}"),
    }
}

async fn exchange(s: &mut tokio::net::UnixStream, r: &wire::Request) -> wire::Failure {
    frame::write(s, &frame::encode(r).unwrap()).await.unwrap();
    read_failure(s).await
}

#[test]
fn frames_that_are_not_requests_are_refused_without_harm() {
    let d = dir();
    let socket = d.path().join("helper.sock");
    let helper = Helper::start(config(&socket), Recorder::default());
    let c = client(&socket);
    rt().block_on(async {
        // Not protobuf: refused, and the connection goes on.
        let mut s = handshake(&socket, PROTOCOL_VERSION).await;
        let garbage = [0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff];
        s.write_all(&garbage).await.unwrap();
        let failure = read_failure(&mut s).await;
        assert_eq!(failure.kind, wire::ErrorKind::Invalid as i32);
        assert!(
            failure.message.starts_with("not a helper request"),
            "{}",
            failure.message
        );
        s.write_all(&[0, 0, 0, 0]).await.unwrap();
        assert!(
            read_failure(&mut s)
                .await
                .message
                .contains("an empty request")
        );
        // Over the limit: refused before the body is read, then closed.
        s.write_all(&((frame::MAX_FRAME + 1) as u32).to_be_bytes())
            .await
            .unwrap();
        let failure = read_failure(&mut s).await;
        assert_eq!(
            failure.message,
            format!(
                "a frame of {} bytes is over the limit of {} bytes: the connection closes",
                frame::MAX_FRAME + 1,
                frame::MAX_FRAME
            )
        );
        assert!(matches!(
            frame::read(&mut s, frame::MAX_FRAME, Duration::from_secs(5)).await,
            Err(FrameError::Closed)
        ));
        // A frame cut short, then the connection ends.
        let mut s = handshake(&socket, PROTOCOL_VERSION).await;
        s.write_all(&[0, 0, 1, 0, 1, 2, 3]).await.unwrap();
        drop(s);
        // A handshake that is not one.
        let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let body = frame::read(&mut s, frame::MAX_HELLO, Duration::from_secs(5)).await;
        // "GET " read as a length is far over the handshake's limit.
        let reply = frame::decode::<wire::HelloReply>("HelloReply", &body.unwrap()).unwrap();
        assert!(
            reply.refused.starts_with("not a bcd-helper handshake"),
            "{}",
            reply.refused
        );
        // A Hello far over its limit.
        let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
        s.write_all(&[0, 1, 0, 0]).await.unwrap();
        let body = frame::read(&mut s, frame::MAX_HELLO, Duration::from_secs(5))
            .await
            .unwrap();
        let reply = frame::decode::<wire::HelloReply>("HelloReply", &body).unwrap();
        assert!(
            reply.refused.contains("over the limit"),
            "{}",
            reply.refused
        );
        // The helper still serves.
        assert!(c.write_env_file(env_file("job-a")).await.unwrap());
    });
    assert_eq!(helper.handler.seen().len(), 1);
}

#[test]
fn another_protocol_version_is_refused_both_ways() {
    let d = dir();
    let socket = d.path().join("helper.sock");
    let _helper = Helper::start(config(&socket), Recorder::default());
    rt().block_on(async {
        // A client of another version: the helper refuses it and closes.
        let (mut s, reply) = hello(&socket, PROTOCOL_VERSION + 1).await;
        assert_eq!(reply.version, PROTOCOL_VERSION);
        assert_eq!(reply.refused, version_refusal(PROTOCOL_VERSION + 1));
        assert_eq!(
            reply.refused,
            format!(
                "bcd-helper speaks protocol version {PROTOCOL_VERSION}, this client speaks {}: restart bcd and bcd-helper after replacing the binary",
                PROTOCOL_VERSION + 1
            )
        );
        assert!(matches!(
            frame::read(&mut s, frame::MAX_FRAME, Duration::from_secs(5)).await,
            Err(FrameError::Closed)
        ));
        // The same client sees that text as a helper: error.
        let e = ClientError::Refused(reply.refused.clone());
        assert!(e.to_string().starts_with("helper: bcd-helper refused the connection: bcd-helper speaks protocol version"));
    });

    // A helper of another version: the client refuses it.
    let other = d.path().join("other.sock");
    // Worker threads serve it while the blocking TPM session waits.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(async { tokio::net::UnixListener::bind(&other).unwrap() });
    rt.spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let body = frame::read(&mut s, frame::MAX_HELLO, Duration::from_secs(5))
                    .await
                    .unwrap();
                let hello = frame::decode::<wire::Hello>("Hello", &body).unwrap();
                assert_eq!(hello.version, PROTOCOL_VERSION);
                let reply = wire::HelloReply {
                    version: PROTOCOL_VERSION + 1,
                    software: "bcd-helper 9.0.0".into(),
                    refused: String::new(),
                };
                frame::write(&mut s, &frame::encode(&reply).unwrap())
                    .await
                    .unwrap();
                // It would serve; the client must not ask.
                let next = frame::read(&mut s, frame::MAX_FRAME, Duration::from_secs(5)).await;
                assert!(matches!(next, Err(FrameError::Closed)), "{next:?}");
            });
        }
    });
    let want = format!(
        "helper: bcd-helper speaks protocol version {}, this bcd speaks {PROTOCOL_VERSION}: restart bcd and bcd-helper after replacing the binary",
        PROTOCOL_VERSION + 1
    );
    let c = client(&other);
    let e = rt.block_on(c.reboot("x")).unwrap_err();
    assert_eq!(e.to_string(), want);
    let e = rt.block_on(c.server_info()).unwrap_err();
    assert_eq!(e.to_string(), want);
    let e = TpmSession::open(&ClientConfig::new(&other)).unwrap_err();
    assert_eq!(e.to_string(), want);
}

#[test]
fn peers_of_other_uids_are_refused() {
    const BCD: u32 = 4242;
    let d = dir();
    let socket = d.path().join("helper.sock");
    let mut cfg = config(&socket);
    cfg.uid = BCD;
    cfg.socket_gid = Some(BCD);
    let helper = Helper::start(cfg, Recorder::default());
    let meta = std::fs::metadata(&socket).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.gid(), meta.mode() & 0o777), (BCD, 0o660));

    let call = |socket: PathBuf| move || rt().block_on(client(&socket).reboot("test"));
    // The configured user.
    as_user(BCD, BCD, call(socket.clone())).unwrap();
    // Another uid in the socket's group gets through the file mode, and
    // the helper refuses it.
    let e = as_user(BCD + 1, BCD, call(socket.clone())).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "helper: bcd-helper refused the connection: bcd-helper serves uid {BCD}, not uid {}: run bcd node as the helper's user, or configure the helper for this one",
            BCD + 1
        )
    );
    // Outside the group, the socket's mode keeps it out.
    let e = as_user(BCD + 2, BCD + 2, call(socket.clone())).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "helper: cannot reach bcd-helper at {}: Permission denied",
            socket.display()
        )),
        "{e}"
    );
    // Root is not served unless configured; the TPM path refuses alike.
    let e = rt().block_on(client(&socket).reboot("test")).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("bcd-helper serves uid {BCD}, not uid 0")),
        "{e}"
    );
    let e = TpmSession::open(&ClientConfig::new(&socket)).unwrap_err();
    assert!(matches!(e, ClientError::Refused(_)), "{e}");
    let seen = helper.handler.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0.uid, BCD);
    assert_eq!(seen[0].0.gid, BCD);

    let root_too = d.path().join("root.sock");
    let mut cfg = config(&root_too);
    cfg.uid = BCD;
    cfg.allow_root = true;
    let _helper = Helper::start(cfg, Recorder::default());
    rt().block_on(client(&root_too).reboot("test")).unwrap();
}

#[test]
fn a_helper_that_is_down_fails_at_once() {
    let d = dir();
    let socket = d.path().join("helper.sock");
    let c = client(&socket);
    let started = Instant::now();
    let e = rt()
        .block_on(c.write_env_file(env_file("job-a")))
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        e.to_string().starts_with(&format!(
            "helper: cannot reach bcd-helper at {}: No such file or directory",
            socket.display()
        )),
        "{e}"
    );
    assert!(
        e.to_string().ends_with("is bcd-helper.service running?"),
        "{e}"
    );
    assert!(!e.is_invalid());
    // A socket nobody answers on: bounded by the connect timeout.
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut cfg = ClientConfig::new(&socket);
    cfg.connect_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let e = rt()
        .block_on(Client::new(cfg.clone()).reboot("x"))
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "helper: bcd-helper at {} did not answer the handshake within 300ms",
            socket.display()
        )
    );
    let e = TpmSession::open(&cfg).unwrap_err();
    assert!(matches!(e, ClientError::HandshakeTimeout { .. }), "{e}");
}

#[test]
fn the_client_reconnects_between_requests_after_a_restart_or_an_idle_close() {
    let d = dir();
    let socket = d.path().join("helper.sock");
    let mut cfg = config(&socket);
    let mut helper = Helper::start(cfg.clone(), Recorder::default());
    let c = client(&socket);
    let rt = rt();
    rt.block_on(c.reboot("first")).unwrap();
    helper.stop();
    let e = rt.block_on(c.reboot("while down")).unwrap_err();
    assert!(e.to_string().starts_with("helper: cannot reach"), "{e}");
    let helper = Helper::start(cfg.clone(), Recorder::default());
    rt.block_on(c.reboot("after the restart")).unwrap();
    assert_eq!(helper.handler.seen().len(), 1);
    drop(helper);

    // The helper closes idle connections; the next request reconnects.
    cfg.idle_timeout = Some(Duration::from_millis(100));
    let helper = Helper::start(cfg, Recorder::default());
    let c = client(&socket);
    rt.block_on(async {
        c.reboot("one").await.unwrap();
        // Wait until the helper closed this connection.
        let deadline = Instant::now() + Duration::from_secs(5);
        while helper_connections(&socket) > 0 {
            assert!(Instant::now() < deadline, "the idle connection stayed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        c.reboot("two").await.unwrap();
    });
    assert_eq!(helper.handler.seen().len(), 2);
}

/// Connected unix sockets whose peer is this socket path (from
/// /proc/net/unix: the server side of each connection carries the path).
fn helper_connections(socket: &Path) -> usize {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let path = socket.to_string_lossy();
    table
        .lines()
        .filter(|l| l.ends_with(path.as_ref()))
        .filter(|l| l.split_whitespace().nth(5) == Some("03"))
        .count()
}

#[test]
fn a_slow_handler_times_out_and_a_wrong_reply_is_refused() {
    let d = dir();
    let socket = d.path().join("helper.sock");
    let mut cfg = config(&socket);
    cfg.request_timeout = Duration::from_millis(200);
    let _helper = Helper::start(cfg, Recorder::default());
    let c = client(&socket);
    rt().block_on(async {
        let e = c.reboot("slow").await.unwrap_err();
        assert!(matches!(
            &e,
            ClientError::Helper {
                error: HelperError {
                    kind: ErrorKind::Timeout,
                    ..
                },
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "helper: reboot: bcd-helper gave up on reboot after 0 s; it may have been carried out in part"
        );
        let e = c.reboot("wrong shape").await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "helper: reboot: bcd-helper answered reboot with a Written reply"
        );
        // The connection goes on.
        c.reboot("fine").await.unwrap();
    });
}

#[test]
fn connections_over_the_cap_are_refused() {
    let d = dir();
    let socket = d.path().join("helper.sock");
    let mut cfg = config(&socket);
    cfg.max_connections = 1;
    let _helper = Helper::start(cfg, Recorder::default());
    let rt = rt();
    let first = client(&socket);
    rt.block_on(first.server_info()).unwrap();
    let second = client(&socket);
    let e = rt.block_on(second.server_info()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "helper: bcd-helper refused the connection: bcd-helper serves 1 connections already: stop the other clients or raise its connection limit"
    );
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match rt.block_on(second.server_info()) {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "still refused: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn peers_that_are_refused_take_no_connection_slot() {
    const BCD: u32 = 4242;
    let d = dir();
    let socket = d.path().join("helper.sock");
    let mut cfg = config(&socket);
    cfg.uid = BCD;
    cfg.socket_gid = Some(BCD);
    cfg.max_connections = 1;
    let _helper = Helper::start(cfg, Recorder::default());
    // Another user in the socket's group connects and says nothing,
    // holding its connection through the handshake timeout.
    let (held, release) = std::sync::mpsc::channel::<()>();
    let (connected, wait) = std::sync::mpsc::channel::<()>();
    let path = socket.clone();
    let squatter = std::thread::spawn(move || {
        as_user(BCD + 1, BCD, move || {
            let s = std::os::unix::net::UnixStream::connect(&path).unwrap();
            connected.send(()).unwrap();
            let _ = release.recv();
            drop(s);
        })
    });
    wait.recv().unwrap();
    // The one slot is still the daemon's.
    as_user(BCD, BCD, {
        let socket = socket.clone();
        move || rt().block_on(client(&socket).reboot("still served"))
    })
    .unwrap();
    held.send(()).unwrap();
    squatter.join().unwrap();
}

fn create_primary(template: &[u8]) -> Vec<u8> {
    use tpm2_protocol::TpmUnmarshal;
    use tpm2_protocol::basic::TpmHandle;
    use tpm2_protocol::data::{Tpm2bPublic, TpmSt, TpmsAuthCommand, TpmtPublic};
    use tpm2_protocol::frame::{TpmCreatePrimaryCommand, tpm_marshal_command};
    let (inner, _) = TpmtPublic::unmarshal(template).unwrap();
    let cmd = TpmCreatePrimaryCommand {
        handles: [TpmHandle::new(0x4000_000B)],
        in_sensitive: Default::default(),
        in_public: Tpm2bPublic { inner },
        outside_info: Default::default(),
        creation_pcr: Default::default(),
    };
    let password = TpmsAuthCommand {
        session_handle: TpmHandle::new(0x4000_0009),
        nonce: Default::default(),
        session_attributes: Default::default(),
        hmac: Default::default(),
    };
    marshal(|w| tpm_marshal_command(&cmd, TpmSt::Sessions, &[password], w))
}

fn marshal(
    f: impl FnOnce(&mut tpm2_protocol::TpmWriter<'_>) -> Result<(), tpm2_protocol::TpmError>,
) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    let len = {
        let mut w = tpm2_protocol::TpmWriter::new(&mut buf);
        f(&mut w).unwrap();
        w.len()
    };
    buf.truncate(len);
    buf
}

fn handle_command(which: &str, handle: u32) -> Vec<u8> {
    use tpm2_protocol::basic::TpmHandle;
    use tpm2_protocol::data::TpmSt;
    use tpm2_protocol::frame::{TpmFlushContextCommand, TpmReadPublicCommand, tpm_marshal_command};
    match which {
        "read" => marshal(|w| {
            tpm_marshal_command(
                &TpmReadPublicCommand {
                    handles: [TpmHandle::new(handle)],
                },
                TpmSt::NoSessions,
                &[],
                w,
            )
        }),
        _ => marshal(|w| {
            tpm_marshal_command(
                &TpmFlushContextCommand {
                    handles: [],
                    flush_handle: TpmHandle::new(handle),
                },
                TpmSt::NoSessions,
                &[],
                w,
            )
        }),
    }
}

fn rc(response: &[u8]) -> u32 {
    u32::from_be_bytes([response[6], response[7], response[8], response[9]])
}

#[test]
fn tpm_commands_reach_a_real_tpm_through_a_session() {
    let d = dir();
    let mut swtpm = bcd_tpm::swtpm::Swtpm::start(&d.path().join("tpm")).unwrap_or_else(|e| {
        panic!(
            "{e} (swtpm is missing? apt-get install swtpm swtpm-tools; scripts/test installs them)"
        )
    });
    let socket = d.path().join("helper.sock");
    let handler = Recorder(Arc::new(State {
        seen: Mutex::default(),
        swtpm: Some(swtpm.addr()),
    }));
    let helper = Helper::start(config(&socket), handler);
    let cfg = ClientConfig::new(&socket);
    let mut session = TpmSession::open(&cfg).unwrap();
    assert_eq!(session.server_info().version, PROTOCOL_VERSION);
    // An AK-shaped primary under the endorsement hierarchy; its handle is
    // good for the next commands of the session.
    let created = session
        .transceive(&create_primary(&bcd_tpm::public::ak_template()))
        .unwrap();
    assert_eq!(rc(&created), 0, "TPM2_CreatePrimary: {created:02x?}");
    let handle = u32::from_be_bytes([created[10], created[11], created[12], created[13]]);
    assert_eq!(handle >> 24, 0x80, "a transient handle: {handle:#x}");
    let public = session.transceive(&handle_command("read", handle)).unwrap();
    assert_eq!(rc(&public), 0);
    let flushed = session
        .transceive(&handle_command("flush", handle))
        .unwrap();
    assert_eq!(rc(&flushed), 0);
    // The TPM's own refusal comes back as its response, not as an error.
    let gone = session.transceive(&handle_command("read", handle)).unwrap();
    assert_ne!(rc(&gone), 0);
    // A command the attestor never sends does not reach the TPM.
    let clear = [0x80, 0x01, 0, 0, 0, 10, 0, 0, 0x01, 0x26];
    let e = session.transceive(&clear).unwrap_err();
    assert!(e.is_invalid());
    assert_eq!(
        e.to_string(),
        "helper: TPM command code 0x00000126 is not one bcd sends"
    );
    assert_eq!(helper.handler.seen().len(), 4);
    // The helper goes away: the session ends for good.
    drop(helper);
    let e = session
        .transceive(&handle_command("read", handle))
        .unwrap_err();
    assert!(matches!(e, ClientError::Broken { .. }), "{e}");
    let e = session
        .transceive(&handle_command("read", handle))
        .unwrap_err();
    assert!(
        e.to_string().starts_with("helper: the TPM session ended"),
        "{e}"
    );
    swtpm.stop();
}
