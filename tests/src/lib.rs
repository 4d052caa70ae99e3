//! Harness for whole-system tests: real `better-compute` and `bcd`
//! processes on loopback, each in its own temporary directory, stopped when
//! dropped.
//!
//! The binaries come from the workspace's target directory; build them first
//! with `cargo build --workspace --all-features` (`scripts/test` does).
//! Conditions are awaited by polling with a deadline, never by sleeping a
//! guessed time.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Deserialize;

pub mod chromium;
pub mod fence;
pub mod gateways;
pub mod hostile;
pub mod hosttree;
pub mod module_graph;
pub mod netboot;

/// A workspace binary, next to the test executable's directory.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // Tests run from target/<profile>/deps, binaries from target/<profile>.
    let dir = exe.parent().expect("executable directory");
    let dir = if dir.ends_with("deps") {
        dir.parent().expect("target directory")
    } else {
        dir
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build --workspace --all-features`",
        path.display()
    );
    path
}

/// The static musl `bcd`, built by `scripts/build-static`.
pub fn static_bcd() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let target = exe
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "target"))
        .expect("target directory")
        .to_path_buf();
    let path = target.join("x86_64-unknown-linux-musl/release/bcd");
    assert!(
        path.exists(),
        "{} is missing: build it with scripts/build-static (scripts/test does)",
        path.display()
    );
    path
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed on drop.
#[derive(Debug)]
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid()).expect("pid");
        let _ = rustix::process::kill_process(pid, sig);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for the exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.signal(rustix::process::Signal::TERM);
        self.wait(Duration::from_secs(15))
            .expect("process exits after SIGTERM")
    }

    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `better-compute serve`.
#[derive(Debug)]
pub struct Server {
    pub dir: PathBuf,
    /// The node listener (gateway, join).
    pub addr: SocketAddr,
    /// The operator API's listener.
    /// The operator API (`None` for a gateway-only process, which serves
    /// none).
    pub api: Option<SocketAddr>,
    /// The boot endpoint, when started with --boot-listen.
    pub boot: Option<SocketAddr>,
    /// `/healthz`, `/readyz` and `/metrics` (an ephemeral loopback port
    /// unless the args say `--http-listen`).
    pub http: Option<SocketAddr>,
    /// The web console (`--console-listen`), when it was asked for.
    pub console: Option<SocketAddr>,
    pub args: Vec<String>,
    /// A PostgreSQL store's address (`None`: SQLite in `dir`).
    pub store_url: Option<String>,
    pub proc: Proc,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NodeView {
    pub node_id: String,
    pub hostname: String,
    pub state: String,
    pub epoch: u64,
    #[serde(rename = "gateway_id")]
    pub gateway: String,
    pub cert_not_after_ms: i64,
    pub last_seen_age_ms: i64,
    pub boot_id: String,
    pub journal_id: String,
    pub incarnation_id: String,
    pub conditions: Vec<String>,
    pub taints: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct NodesJson {
    nodes: Vec<NodeView>,
}

impl Server {
    /// Starts a server in `dir` on an ephemeral loopback port. `args` are
    /// extra `serve` flags (timings for tests).
    pub fn start(dir: &Path, args: &[&str]) -> anyhow::Result<Server> {
        Self::start_on(
            dir,
            ("127.0.0.1:0", "127.0.0.1:0"),
            args.iter().map(|s| s.to_string()).collect(),
            None,
        )
    }

    /// Starts a server on the PostgreSQL store at `url` (several servers
    /// may share it, and a data directory for their CA and keys).
    pub fn start_postgres(dir: &Path, url: &str, args: &[&str]) -> anyhow::Result<Server> {
        Self::start_on(
            dir,
            ("127.0.0.1:0", "127.0.0.1:0"),
            args.iter().map(|s| s.to_string()).collect(),
            Some(url.to_string()),
        )
    }

    fn start_on(
        dir: &Path,
        (listen, api_listen): (&str, &str),
        args: Vec<String>,
        store_url: Option<String>,
    ) -> anyhow::Result<Server> {
        std::fs::create_dir_all(dir)?;
        let log = dir.join(format!("serve-{}.log", unique()));
        let mut command = Command::new(bin("better-compute"));
        if let Some(url) = &store_url {
            command.env("BC_STORE", url);
        }
        command
            .arg("--data-dir")
            .arg(dir)
            .arg("serve")
            .arg("--listen")
            .arg(listen);
        if !args.iter().any(|a| a == "--http-listen") {
            command.args(["--http-listen", "127.0.0.1:0"]);
        }
        let gateway_only = args
            .windows(2)
            .any(|w| w[0] == "--role" && w[1] == "gateway");
        if !gateway_only && !args.iter().any(|a| a == "--api-listen") {
            command.args(["--api-listen", api_listen]);
        }
        let mut child = command
            .args(&args)
            .env("BC_LOG", "info,better_compute=debug")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("cannot start better-compute serve")?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut proc = Proc { child, log };
        // `boot endpoint on ADDR` comes first when the boot endpoint is on;
        // `api on ADDR` before `listening on ADDR`.
        let mut boot = None;
        let mut http = None;
        let mut api = None;
        let mut console = None;
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                proc.kill();
                bail!("server did not start:\n{}", proc.log());
            };
            if let Some(a) = line.strip_prefix("boot endpoint on ") {
                boot = Some(a.trim().parse::<SocketAddr>()?);
            }
            if let Some(a) = line.strip_prefix("http on ") {
                http = Some(a.trim().parse::<SocketAddr>()?);
            }
            if let Some(a) = line.strip_prefix("console on ") {
                console = Some(a.trim().parse::<SocketAddr>()?);
            }
            if let Some(a) = line.strip_prefix("api on ") {
                api = Some(a.trim().parse::<SocketAddr>()?);
            }
            if let Some(rest) = line.strip_prefix("listening on ") {
                break rest.split_whitespace().next().unwrap_or_default().parse()?;
            }
        };
        if api.is_none() && !gateway_only {
            proc.kill();
            bail!("server printed no `api on ADDR`:\n{}", proc.log());
        }
        Ok(Server {
            dir: dir.to_path_buf(),
            addr,
            api,
            boot,
            http,
            console,
            args,
            store_url,
            proc,
        })
    }

    /// A figure the server exposes at /metrics, by the end of its name
    /// (labels included).
    pub fn counter(&self, name: &str) -> f64 {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.http.expect("the metrics listener"))
            .expect("connect to the metrics listener");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bc\r\nConnection: close\r\n\r\n")
            .expect("ask for /metrics");
        let mut body = String::new();
        s.read_to_string(&mut body).expect("read /metrics");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (metric, value) = l.rsplit_once(' ')?;
                metric.ends_with(name).then(|| value.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{body}"))
    }

    /// The node listener, for `bcd join --server`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The operator API, for `better-compute --server`.
    pub fn api_url(&self) -> String {
        let api = self
            .api
            .expect("a gateway-only process serves no operator API");
        format!("https://{api}")
    }

    /// Stops the server (SIGTERM) and starts it again on the same port.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.proc.stop();
        self.start_again()
    }

    /// Kills the server (SIGKILL: no orderly writes) and starts it again.
    pub fn crash_restart(&mut self) -> anyhow::Result<()> {
        self.proc.kill();
        self.start_again()
    }

    /// Starts the server again on its address after it stopped.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::start_on(
                &self.dir,
                (
                    &self.addr.to_string(),
                    &self.api.map(|a| a.to_string()).unwrap_or_default(),
                ),
                self.args.clone(),
                self.store_url.clone(),
            ) {
                Ok(s) => {
                    let Server { proc, http, .. } = s;
                    self.proc = proc;
                    self.http = http;
                    return Ok(());
                }
                // The port may linger briefly after the old process.
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs an operator command against this server (`check` reads the
    /// server's store).
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_command(args).output().expect("run better-compute")
    }

    /// `better-compute ARGS` against this server, not started yet.
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin("better-compute"));
        if let Some(url) = &self.store_url {
            c.env("BC_STORE", url);
        }
        c.arg("--data-dir")
            .arg(&self.dir)
            .arg("--server")
            .arg(self.api_url())
            .args(args);
        c
    }

    pub fn token(&self, uses: u32) -> String {
        let out = self.cli(&["tokens", "create", "--uses", &uses.to_string()]);
        assert!(out.status.success(), "tokens create: {}", stderr(&out));
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    }

    pub fn nodes(&self) -> Vec<NodeView> {
        let out = self.cli(&["nodes", "list", "--json"]);
        assert!(out.status.success(), "nodes list: {}", stderr(&out));
        let parsed: NodesJson = serde_json::from_slice(&out.stdout).expect("nodes list json");
        parsed.nodes
    }

    pub fn node(&self, id: &str) -> Option<NodeView> {
        self.nodes().into_iter().find(|n| n.node_id == id)
    }

    /// Waits until `id` is in `state` and `pred` holds.
    /// The server's store, opened beside the server as another of its
    /// processes would: for what the API does not show, and for planting
    /// what a compromised control plane could write.
    pub fn store(&self) -> StoreAccess {
        StoreAccess::open(&match &self.store_url {
            Some(url) => bc_store::Location::Postgres(url.clone()),
            None => bc_store::Location::Sqlite(self.dir.join("store.db")),
        })
    }

    pub fn wait_node(
        &self,
        id: &str,
        what: &str,
        mut pred: impl FnMut(&NodeView) -> bool,
    ) -> NodeView {
        wait_for(Duration::from_secs(30), what, || {
            self.node(id).filter(|n| pred(n))
        })
    }
}

/// A handle on a server's store for a synchronous test: its methods are
/// async, [`StoreAccess::block`] runs one.
#[derive(Debug)]
pub struct StoreAccess {
    rt: tokio::runtime::Runtime,
    pub store: bc_store::Store,
}

impl StoreAccess {
    pub fn open(location: &bc_store::Location) -> StoreAccess {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let store = rt
            .block_on(bc_store::Store::open(
                location,
                std::sync::Arc::new(bc_store::SystemClock),
            ))
            .expect("open the store");
        StoreAccess { rt, store }
    }

    /// Runs one store call to its end.
    pub fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

/// A node's data directory, and its `bcd node` process while it runs.
#[derive(Debug)]
pub struct Node {
    pub dir: PathBuf,
    pub seed: u64,
    pub proc: Option<Proc>,
    /// The nft program the node uses; none by default, so tests never
    /// touch the host's firewall.
    pub nft: Option<PathBuf>,
    /// Read real hardware under this root (a tree of golden files) instead
    /// of using fake hardware.
    pub host_root: Option<PathBuf>,
    /// The bcd to run (the debug build by default).
    pub binary: Option<PathBuf>,
    /// Extra environment for `bcd node`.
    pub env: Vec<(String, String)>,
    /// Extra arguments for `bcd node` (after its own).
    pub args: Vec<String>,
    /// `bcd node --run-dir` (`<dir>/run` unless set).
    pub run_dir: Option<PathBuf>,
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl Node {
    pub fn new(dir: &Path, seed: u64) -> Node {
        Node {
            dir: dir.to_path_buf(),
            seed,
            proc: None,
            nft: None,
            host_root: None,
            binary: None,
            env: Vec::new(),
            args: Vec::new(),
            run_dir: None,
        }
    }

    pub fn bcd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.binary.clone().unwrap_or_else(|| bin("bcd")));
        c.args(args);
        for a in self.common_args() {
            c.arg(a);
        }
        c.env("BCD_LOG", "info,bcd_agent=debug");
        c
    }

    fn common_args(&self) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = vec!["--data-dir".into(), self.dir.clone().into()];
        match &self.host_root {
            Some(root) => a.extend(["--host-root".into(), root.clone().into()]),
            None => a.extend(["--fake-hw".into(), self.seed.to_string().into()]),
        }
        a
    }

    /// `bcd node`'s arguments after `node`: the data directory, hardware,
    /// and the node's own cdi/run/etc directories.
    fn node_args(&self) -> Vec<std::ffi::OsString> {
        let mut a = self.common_args();
        a.extend([
            "--cdi-dir".into(),
            self.dir.join("cdi").into(),
            "--run-dir".into(),
            self.run_dir
                .clone()
                .unwrap_or_else(|| self.dir.join("run"))
                .into(),
            "--converge-every".into(),
            "300ms".into(),
            "--etc-dir".into(),
            self.dir.join("etc").into(),
            "--nft".into(),
            self.nft
                .clone()
                .unwrap_or_else(|| self.dir.join("no-nft"))
                .into(),
        ]);
        a
    }

    /// Runs `bcd supervise ... -- node ...` with `supervise` flags before
    /// the `--` and `node` flags after the node's own.
    pub fn supervise(&mut self, supervise: &[&str], node: &[&str]) -> &mut Proc {
        let log = self.dir.with_extension(format!("{}.log", unique()));
        let mut c = Command::new(self.binary.clone().unwrap_or_else(|| bin("bcd")));
        c.arg("supervise")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(supervise)
            .arg("--")
            .arg("node")
            .args(self.node_args())
            .args(node)
            .env("BCD_LOG", "info,bcd_agent=debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        let child = c.spawn().expect("start bcd supervise");
        self.proc = Some(Proc { child, log });
        self.proc.as_mut().expect("just set")
    }

    pub fn join(&self, server: &str, token: &str) -> Output {
        self.bcd(&["join", "--server", server, "--token", token])
            .output()
            .expect("run bcd join")
    }

    pub fn id(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(
            &std::fs::read(self.dir.join("identity.json")).expect("identity.json"),
        )
        .expect("identity json");
        v["node_id"].as_str().expect("node_id").to_string()
    }

    pub fn identity(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.dir.join("identity.json")).expect("read"))
            .expect("identity json")
    }

    pub fn start(&mut self) -> &mut Proc {
        let log = self.dir.with_extension(format!("{}.log", unique()));
        let child = Command::new(self.binary.clone().unwrap_or_else(|| bin("bcd")))
            .arg("node")
            .args(self.node_args())
            .args(&self.args)
            .env("BCD_LOG", "info,bcd_agent=debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start bcd node");
        self.proc = Some(Proc { child, log });
        self.proc.as_mut().expect("just set")
    }

    pub fn proc(&mut self) -> &mut Proc {
        self.proc.as_mut().expect("bcd node is running")
    }

    /// Opens a session to `url` with this node's certificate and key, as
    /// the gateway sees a node: the test writes what the node sends
    /// (starting with its Hello) and reads what the gateway answers.
    pub async fn raw_session(
        &self,
        url: &str,
    ) -> (
        tokio::sync::mpsc::Sender<bcd_proto::v1::NodeMessage>,
        tonic::Streaming<bcd_proto::v1::ServerMessage>,
    ) {
        use rustls_pki_types::pem::PemObject;
        let pem = |name: &str| self.dir.join(name);
        let cert =
            rustls_pki_types::CertificateDer::from_pem_file(pem("node.crt")).expect("node.crt");
        let ca = rustls_pki_types::CertificateDer::from_pem_file(pem("ca.crt")).expect("ca.crt");
        let key = rustls_pki_types::PrivateKeyDer::from_pem_file(pem("node.key")).expect("key");
        let config = bcd_proto::tls::client_config(
            bcd_proto::tls::ServerTrust::Ca(ca),
            Some(bcd_proto::tls::ClientIdentity {
                chain: vec![cert],
                key,
            }),
        )
        .expect("client configuration");
        let channel = bcd_proto::tls::connect(url, config)
            .await
            .expect("connect to the gateway");
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let stream = bcd_proto::v1::gateway_client::GatewayClient::new(channel)
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("open the session")
            .into_inner();
        (tx, stream)
    }

    /// The Hello this node's identity makes, with nothing else reported,
    /// proved as a confirmed release proves it: signed with the node's key
    /// under a count above any it signed (the key holder refuses a node's
    /// unproved Hellos once it saw it prove one).
    pub fn hello(&self) -> bcd_proto::v1::NodeMessage {
        use prost::Message;
        use std::sync::atomic::{AtomicU64, Ordering};
        static LATER: AtomicU64 = AtomicU64::new(1);
        let mut m = self.unproved_hello();
        let Some(bcd_proto::v1::node_message::Msg::Hello(h)) = &mut m.msg else {
            unreachable!("built as a Hello");
        };
        let seq = self.identity()["hello_seq"].as_u64().unwrap_or(0)
            + LATER.fetch_add(1, Ordering::Relaxed);
        let mut proof = bcd_proto::hello::proof(h, seq);
        proof.release_confirmed = true;
        let payload = proof.encode_to_vec();
        let key_pem = std::fs::read_to_string(self.dir.join("node.key")).expect("node.key");
        let key = rcgen::KeyPair::from_pem(&key_pem).expect("the node's key");
        let signature = rcgen::SigningKey::sign(&key, &bcd_proto::hello::signed_message(&payload))
            .expect("sign");
        h.proof = Some(bcd_proto::v1::NodeSigned { payload, signature });
        m
    }

    /// [`Node::hello`] with no proof: what a release from before Hello
    /// proofs sends, or another machine with a copy of the key that signs
    /// nothing.
    pub fn unproved_hello(&self) -> bcd_proto::v1::NodeMessage {
        let identity = self.identity();
        bcd_proto::v1::NodeMessage {
            msg: Some(bcd_proto::v1::node_message::Msg::Hello(
                bcd_proto::v1::Hello {
                    node_id: self.id(),
                    cert_serial: identity["cert_serial"].as_str().expect("serial").into(),
                    last_epoch: identity["last_epoch"].as_u64().expect("epoch"),
                    ..Default::default()
                },
            )),
        }
    }
}

/// Resident memory of a process, in KiB, from /proc.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CPU time (user and system) a process has used so far, in seconds.
pub fn cpu_secs(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: state is the
    // first, utime the 12th, stime the 13th.
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let ticks: u64 = rest.next()?.parse::<u64>().ok()? + rest.next()?.parse::<u64>().ok()?;
    Some(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
}

/// A command as `commands show --json` prints it.
#[derive(Debug, Clone, Deserialize)]
pub struct CommandView {
    pub command_id: String,
    pub node_id: String,
    pub seq: u64,
    pub kind: String,
    pub summary: String,
    pub state: String,
    pub reason: String,
    pub exit_code: i32,
    pub has_exit_code: bool,
    pub output: String,
    pub epoch: u64,
    /// What the result rests on, as the key holder judged it.
    #[serde(default)]
    pub evidence: String,
    #[serde(default)]
    pub evidence_detail: String,
}

impl CommandView {
    /// The exit code, if the command reported one.
    pub fn exit(&self) -> Option<i32> {
        self.has_exit_code.then_some(self.exit_code)
    }

    pub fn is_terminal(&self) -> bool {
        matches!(
            self.state.as_str(),
            "succeeded" | "failed" | "expired" | "rejected"
        )
    }
}

impl Server {
    /// Submits a command; returns its id.
    pub fn run_command(&self, node: &str, kind: &str, args: &[&str]) -> String {
        let mut a = vec!["commands", "run", node, kind];
        if !args.is_empty() {
            a.push("--");
            a.extend_from_slice(args);
        }
        let out = self.cli(&a);
        assert!(out.status.success(), "commands run: {}", stderr(&out));
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    }

    /// Runs `sh -c 'echo x >> MARKER; sleep 30'` on `node` and returns its
    /// id once it started (the marker exists) and the server saw it
    /// acknowledged: a command in flight, for tests that cut it short.
    pub fn run_long_command(&self, node: &str, marker: &Path) -> String {
        let cmd = self.run_command(
            node,
            "exec.run",
            &[
                "/bin/sh",
                "-c",
                &format!("echo x >> {}; sleep 30", marker.display()),
            ],
        );
        wait_for(Duration::from_secs(20), "the command to start", || {
            marker.exists().then_some(())
        });
        wait_for(
            Duration::from_secs(20),
            "the server to see it acknowledged",
            || (self.command(&cmd).state != "dispatched").then_some(()),
        );
        cmd
    }

    pub fn command(&self, id: &str) -> CommandView {
        let out = self.cli(&["commands", "show", id, "--json"]);
        assert!(out.status.success(), "commands show: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("command json")
    }

    pub fn commands(&self, node: &str) -> Vec<CommandView> {
        let out = self.cli(&[
            "commands", "list", "--node", node, "--limit", "10000", "--json",
        ]);
        assert!(out.status.success(), "commands list: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("commands json")
    }

    /// Waits until the command is terminal.
    pub fn wait_command(&self, id: &str) -> CommandView {
        wait_for(
            Duration::from_secs(60),
            &format!("command {id} to finish"),
            || Some(self.command(id)).filter(|c| c.is_terminal()),
        )
    }
}

/// A fresh network namespace, deleted when dropped, and an `nft` wrapper
/// that runs in it: firewall tests never touch the host's tables.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
    pub nft: PathBuf,
    _dir: tempfile::TempDir,
}

impl Netns {
    pub fn new() -> Netns {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "bcst-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .expect("ip (iproute2) is missing: apt-get install iproute2");
        assert!(
            out.status.success(),
            "ip netns add (needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let nft = dir.path().join("nft");
        std::fs::write(
            &nft,
            format!("#!/bin/sh\nexec ip netns exec {name} nft \"$@\"\n"),
        )
        .expect("write the nft wrapper");
        std::fs::set_permissions(&nft, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Netns {
            name,
            nft,
            _dir: dir,
        }
    }

    /// Runs nft in the namespace; None if it fails.
    pub fn nft(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(&self.nft).args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }
}

impl Default for Netns {
    fn default() -> Self {
        Netns::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Server timings that make the system tests quick: heartbeats every
/// 300 ms, short leases.
pub const FAST: &[&str] = &[
    "--heartbeat-interval",
    "300ms",
    "--gateway-lease-ttl",
    "2s",
    "--node-lease-ttl",
    "1s",
    "--gateway-loss-grace",
    "2s",
    "--drain-within",
    "1s",
    "--controller-lease-ttl",
    "1500ms",
];

/// A server with [`FAST`] timings and one joined (not started) fakehw node
/// seeded with `seed`.
pub fn setup(seed: u64) -> (tempfile::TempDir, Server, Node) {
    let d = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&d.path().join("server"), FAST).expect("server");
    let node = Node::new(&d.path().join(format!("node{seed}")), seed);
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "join failed: {}", stderr(&out));
    (d, server, node)
}

impl Server {
    /// `nodes spec NODE --json`.
    pub fn spec(&self, node: &str) -> serde_json::Value {
        let out = self.cli(&["nodes", "spec", node, "--json"]);
        assert!(out.status.success(), "nodes spec: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("spec json")
    }
}

/// A section of `nodes spec --json` by name.
pub fn section<'a>(spec: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    static NULL: serde_json::Value = serde_json::Value::Null;
    spec["sections"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["section"] == name))
        .unwrap_or(&NULL)
}

/// An ed25519 key that is not a worker key of any fleet: what a forger has.
pub fn foreign_worker_key() -> ring::signature::Ed25519KeyPair {
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .expect("generate a key");
    ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("parse the key")
}

/// A temporary directory with a server ([`FAST`] timings) in it.
pub fn setup_dirs() -> (tempfile::TempDir, Server) {
    let d = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&d.path().join("server"), FAST).expect("server");
    (d, server)
}

/// [`setup`], with the node running and connected; also returns its id.
pub fn setup_connected(seed: u64) -> (tempfile::TempDir, Server, Node, String) {
    let (d, server, mut node) = setup(seed);
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    (d, server, node, id)
}

impl Server {
    /// Assigns GPUs to an allocation on a node and waits until the node
    /// reports `generation` applied.
    pub fn assign_and_wait(&self, node: &str, allocation: &str, gpus: &str, generation: u64) {
        let out = self.cli(&["nodes", "assign", node, allocation, "--gpus", gpus]);
        assert!(out.status.success(), "nodes assign: {}", stderr(&out));
        wait_for(
            Duration::from_secs(20),
            &format!("generation {generation} applied"),
            || (self.spec(node)["applied_generation"] == generation).then_some(()),
        );
    }

    /// Runs `sh -c "echo start >> FILE; REST"` on a node and waits until it
    /// has started (the file exists); returns the command id.
    pub fn start_marked_command(&self, node: &str, file: &Path, rest: &str) -> String {
        let script = format!("echo start >> {}; {rest}", file.display());
        let cmd = self.run_command(node, "exec.run", &["/bin/sh", "-c", &script]);
        wait_for(Duration::from_secs(20), "the command to start", || {
            file.exists().then_some(())
        });
        cmd
    }
}

/// A server that accepts releases signed with its own key, for
/// self-update tests and benchmarks.
#[derive(Debug)]
pub struct Fleet {
    pub d: tempfile::TempDir,
    pub server: Server,
    pub key: PathBuf,
}

/// A [`FAST`] server with a release key.
pub fn fleet() -> Fleet {
    fleet_with(&[])
}

/// A [`FAST`] server with a release key and the `serve` flags `extra`.
pub fn fleet_with(extra: &[&str]) -> Fleet {
    fleet_on(None, extra)
}

/// [`fleet_with`] on the PostgreSQL store at `store` (SQLite in its data
/// directory with `None`).
pub fn fleet_on(store: Option<&str>, extra: &[&str]) -> Fleet {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("release.key");
    let out = Command::new(bin("better-compute"))
        .args(["releases", "keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let public = std::fs::read_to_string(d.path().join("release.key.pub")).unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--release-pubkey", public.trim()]);
    args.extend(extra);
    let dir = d.path().join("server");
    let server = match store {
        Some(url) => Server::start_postgres(&dir, url, &args),
        None => Server::start(&dir, &args),
    }
    .unwrap();
    Fleet { d, server, key }
}

impl Fleet {
    /// Signs and registers `binary` as release `sequence`.
    pub fn release(&self, binary: &Path, version: &str, sequence: u64) {
        self.release_with(binary, version, sequence, &self.key, None);
    }

    /// Signs `binary` with `key` (naming `next_key`'s public half as the
    /// next release key, if given) and registers it.
    pub fn release_with(
        &self,
        binary: &Path,
        version: &str,
        sequence: u64,
        key: &Path,
        next_key: Option<&Path>,
    ) {
        let manifest = self.sign_with(binary, version, sequence, key, next_key);
        let out = self.server.cli(&[
            "releases",
            "register",
            "--manifest",
            manifest.to_str().unwrap(),
            "--binary",
            binary.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }

    /// Signs `binary` as release `sequence` with the fleet's release key;
    /// returns the signed manifest's path.
    pub fn sign(&self, binary: &Path, version: &str, sequence: u64) -> PathBuf {
        self.sign_with(binary, version, sequence, &self.key, None)
    }

    fn sign_with(
        &self,
        binary: &Path,
        version: &str,
        sequence: u64,
        key: &Path,
        next_key: Option<&Path>,
    ) -> PathBuf {
        let manifest = self.d.path().join(format!("release-{sequence}.json"));
        let seq = sequence.to_string();
        let mut args = vec![
            "releases",
            "sign",
            "--key",
            key.to_str().unwrap(),
            "--binary",
            binary.to_str().unwrap(),
            "--version",
            version,
            "--sequence",
            &seq,
            "--out",
            manifest.to_str().unwrap(),
        ];
        if let Some(next) = next_key {
            args.extend(["--next-key", next.to_str().unwrap()]);
        }
        let out = self.server.cli(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        manifest
    }

    /// The fleet's release public key.
    pub fn public_key(&self) -> Vec<u8> {
        let text = std::fs::read_to_string(self.d.path().join("release.key.pub")).unwrap();
        release::parse_public_key(&text).unwrap()
    }

    /// The static bcd with a trailer: a different release of the same
    /// code, which reports the installed version of itself.
    pub fn bcd_release(&self, tag: &str) -> PathBuf {
        let mut bytes = std::fs::read(static_bcd()).unwrap();
        bytes.extend_from_slice(format!("\nrelease {tag}\n").as_bytes());
        let path = self.d.path().join(format!("bcd-{tag}"));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// A C program built here.
    pub fn c_program(&self, name: &str, source: &str) -> PathBuf {
        let src = self.d.path().join(format!("{name}.c"));
        std::fs::write(&src, source).unwrap();
        let out_path = self.d.path().join(name);
        let out = Command::new("gcc")
            .arg("-O1")
            .arg("-o")
            .arg(&out_path)
            .arg(&src)
            .output()
            .expect("gcc is missing: apt-get install gcc (scripts/test does)");
        assert!(out.status.success(), "gcc: {}", stderr(&out));
        out_path
    }

    /// A joined node running the static bcd on this machine, not started.
    pub fn node(&self, name: &str) -> Node {
        self.node_with(name, static_bcd())
    }

    /// A joined node running `binary` on this machine, not started.
    pub fn node_with(&self, name: &str, binary: PathBuf) -> Node {
        let mut node = Node::new(&self.d.path().join(name), 0);
        node.host_root = Some(PathBuf::from("/"));
        node.binary = Some(binary);
        let out = node.join(&self.server.url(), &self.server.token(1));
        assert!(out.status.success(), "join: {}", stderr(&out));
        node
    }
}

/// A fresh PostgreSQL database for a system test (see
/// `bc_store::postgres::cluster::test_database`); returns its address.
pub fn postgres_database(prefix: &str) -> String {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(bc_store::postgres::cluster::test_database(prefix))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A balancer in front of gateways, as an L4 load balancer with health
/// checks would be: the test moves backends in and out and cuts links.
#[derive(Debug)]
pub struct Front {
    rt: tokio::runtime::Runtime,
    pub balancer: std::sync::Arc<bc_sim::proxy::Balancer>,
}

impl Front {
    pub fn new() -> Front {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the balancer");
        let balancer = rt
            .block_on(bc_sim::proxy::Balancer::start())
            .expect("the balancer listens");
        Front { rt, balancer }
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.balancer.addr)
    }

    pub fn set(&self, name: &str, addr: Option<SocketAddr>) {
        let _g = self.rt.enter();
        self.balancer.set_backend(name, addr);
    }

    /// Resets every link through the balancer; returns how many.
    pub fn reset_all(&self) -> usize {
        let _g = self.rt.enter();
        self.balancer.cut(usize::MAX, true, |_| 0)
    }
}

impl Default for Front {
    fn default() -> Self {
        Front::new()
    }
}
