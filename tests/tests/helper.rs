//! An unprivileged `bcd node` beside a root `bcd helper`, end to end: the
//! daemon runs as a user of the test's own and drives every privileged act
//! through the helper (the CDI spec and env files, the sshd files, table
//! `inet bcd` in a network namespace, a GPU reset on a host tree, reboot
//! and kexec of a machine made of files, a self-update switch); another
//! uid and another protocol version are refused; a stopped helper gives
//! `helper:` errors while the node keeps its session.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bc_tests::hosttree::HostTree;
use bc_tests::{Netns, Proc, fleet, section, static_bcd, stderr, wait_for};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

/// The daemon's user: a uid no one else uses, in a passwd file of the
/// test's own (the helper reads it with --passwd).
fn user() -> (u32, u32) {
    let uid = 40_000 + std::process::id() % 10_000;
    (uid, uid)
}

struct Setup {
    dir: PathBuf,
    /// The run directory: memory-backed (on /dev/shm), so the helper
    /// writes secrets in it.
    run: tempfile::TempDir,
    data: PathBuf,
    socket: PathBuf,
    tree: HostTree,
    ns: Netns,
    passwd: PathBuf,
}

impl Setup {
    fn new(d: &Path) -> Setup {
        // The daemon's user must reach its files through the test's dirs.
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (uid, gid) = user();
        let passwd = d.join("passwd");
        std::fs::write(
            &passwd,
            format!("root:x:0:0::/root:/bin/sh\nbcdtest:x:{uid}:{gid}::/:/bin/false\n"),
        )
        .unwrap();
        let tree = HostTree::new(&d.join("host"), "helper-host");
        tree.gpu("0000:17:00.0", 0);
        tree.gpu("0000:2a:00.0", 1);
        let run = tempfile::tempdir_in("/dev/shm").expect("a directory on /dev/shm (tmpfs)");
        std::fs::set_permissions(run.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Setup {
            dir: d.to_path_buf(),
            run,
            data: d.join("node"),
            socket: d.join("run/helper.sock"),
            tree,
            ns: Netns::new(),
            passwd,
        }
    }

    fn helper(&self) -> Proc {
        let log = self.dir.join(format!("helper-{}.log", std::process::id()));
        let child = Command::new(bc_tests::bin("bcd"))
            .arg("helper")
            .args(["--user", "bcdtest", "--passwd"])
            .arg(&self.passwd)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--private-dir")
            .arg(self.dir.join("private"))
            .arg("--cdi-dir")
            .arg(self.dir.join("cdi"))
            .arg("--run-dir")
            .arg(self.run.path())
            .arg("--etc-dir")
            .arg(self.dir.join("etc"))
            .arg("--nft")
            .arg(&self.ns.nft)
            .arg("--host-root")
            .arg(&self.tree.root)
            .arg("--fake-power")
            .env("BCD_LOG", "info,bcd_agent=debug,bcd_helper=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let p = Proc { child, log };
        wait_for(Duration::from_secs(10), "the helper's socket", || {
            self.socket.exists().then_some(())
        });
        p
    }

    /// `bcd node` (the static release binary) as the daemon's user, with no
    /// other group (util-linux's setpriv drops root's).
    fn node(&self, binary: &Path) -> Proc {
        let (uid, gid) = user();
        let log = self.dir.join(format!("node-{}.log", rand_suffix()));
        let child = Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg("--")
            .arg(binary)
            .arg("node")
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--host-root")
            .arg(&self.tree.root)
            .arg("--helper")
            .arg(&self.socket)
            .arg("--run-dir")
            .arg(self.run.path())
            .args(["--converge-every", "300ms"])
            .env("BCD_LOG", "info,bcd_agent=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Proc { child, log }
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn chown_r(path: &Path, uid: u32, gid: u32) {
    let out = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

fn owner(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .uid()
}

#[test]
fn an_unprivileged_daemon_acts_through_the_helper() {
    let f = fleet();
    let s = Setup::new(f.d.path());
    let (uid, gid) = user();
    // Joined as root, then handed to the daemon's user.
    let out = Command::new(static_bcd())
        .args([
            "join",
            "--server",
            &f.server.url(),
            "--token",
            &f.server.token(1),
        ])
        .arg("--data-dir")
        .arg(&s.data)
        .arg("--host-root")
        .arg(&s.tree.root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    chown_r(&s.data, uid, gid);
    let id: String = serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(s.data.join("identity.json")).unwrap(),
    )
    .unwrap()["node_id"]
        .as_str()
        .unwrap()
        .into();

    let mut helper = s.helper();
    let mut node = s.node(&static_bcd());
    f.server
        .wait_node(&id, "connected", |n| n.state == "connected");

    // The CDI spec and an env file, written by root through the helper.
    f.server.assign_and_wait(&id, "job-a", "0", 1);
    let cdi = s.dir.join("cdi/bcd-nvidia-gpu.json");
    let env = s.run.path().join("env/job-a.env");
    assert_eq!((owner(&cdi), owner(&env)), (0, 0));
    let spec = cdi::Spec::parse(&std::fs::read(&cdi).unwrap()).unwrap();
    assert!(spec.devices.iter().any(|d| d.name == HostTree::uuid(0)));
    assert!(
        std::fs::read_to_string(&env)
            .unwrap()
            .contains(&format!("NVIDIA_VISIBLE_DEVICES={}", HostTree::uuid(0)))
    );

    // A secret for the allocation: the daemon fetches and opens it, the
    // helper writes it (root's, 0400) where the daemon cannot read it.
    let value = s.dir.join("db.value");
    std::fs::write(&value, "s3cret-through-the-helper").unwrap();
    let out = f.server.cli(&[
        "secrets",
        "put",
        "db",
        "--from-file",
        value.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = f.server.cli(&[
        "nodes", "assign", &id, "job-a", "--gpus", "0", "--secret", "db=db.pw",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let secret = s.run.path().join("secrets/job-a/db.pw");
    wait_for(Duration::from_secs(20), "the secret written", || {
        std::fs::read_to_string(&secret)
            .ok()
            .filter(|v| v == "s3cret-through-the-helper")
    });
    assert_eq!(owner(&secret), 0);
    assert_eq!(
        std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777,
        0o400
    );
    assert_eq!(
        std::fs::metadata(s.run.path().join("secrets"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700,
        "the daemon's user cannot list them"
    );
    wait_for(Duration::from_secs(20), "the secrets section ready", || {
        (section(&f.server.spec(&id), "secrets")["status"] == "READY").then_some(())
    });
    // Without the secret in the spec, the helper removes it.
    f.server.assign_and_wait(&id, "job-a", "0", 3);
    assert!(!s.run.path().join("secrets/job-a").exists());

    // sshd's files and the table, in the test's network namespace.
    let access = s.dir.join("access.json");
    std::fs::write(
        &access,
        serde_json::json!({
            "users": [{"name": "alice", "authorized_keys": [KEY], "principals": ["ops"]}],
            "firewall": {"rules": [{"protocol": "tcp", "port": 22, "source": "10.0.0.0/8", "action": "accept"}]}
        })
        .to_string(),
    )
    .unwrap();
    let out = f
        .server
        .cli(&["nodes", "access", &id, "--file", access.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(Duration::from_secs(20), "access READY and applied", || {
        let v = f.server.spec(&id);
        (section(&v, "access")["status"] == "READY"
            && v["applied_generation"] == v["desired_generation"])
            .then_some(())
    });
    let keys = s.dir.join("etc/ssh/bcd/authorized_keys/alice");
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), format!("{KEY}\n"));
    assert_eq!(owner(&keys), 0);
    let table =
        s.ns.nft(&["list", "table", "inet", "bcd"])
            .expect("table inet bcd");
    assert!(
        table.contains("ip saddr 10.0.0.0/8 tcp dport 22 accept"),
        "{table}"
    );

    // A GPU reset, on the host tree's function reset.
    let c = f.server.run_command(&id, "gpu.reset", &["0000:2a:00.0"]);
    let c = f.server.wait_command(&c);
    assert_eq!(c.state, "succeeded", "{c:?}");
    assert_eq!(s.tree.reset_file("0000:2a:00.0"), "1");

    // Reboot and kexec of the machine made of files: the helper's power
    // writes a new boot id, the daemon sees the new boot.
    let before = s.tree.boot_id();
    let c = f.server.run_command(&id, "node.reboot", &[]);
    let c = f.server.wait_command(&c);
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("succeeded", "rebooted"),
        "{c:?}"
    );
    assert_ne!(s.tree.boot_id(), before);
    let kernel = s.dir.join("vmlinuz-test");
    std::fs::write(&kernel, b"not really a kernel").unwrap();
    std::fs::set_permissions(&kernel, std::fs::Permissions::from_mode(0o644)).unwrap();
    let before = s.tree.boot_id();
    let c = f.server.run_command(
        &id,
        "boot.kexec",
        &[
            &format!("kernel={}", kernel.display()),
            "cmdline=console=ttyS0",
        ],
    );
    let c = f.server.wait_command(&c);
    assert_eq!(c.state, "succeeded", "{c:?}");
    assert_ne!(s.tree.boot_id(), before);
    assert_eq!(
        std::fs::read(s.dir.join("private/kexec-kernel")).unwrap(),
        b"not really a kernel",
        "the helper loads its own checked copy"
    );
    f.server.wait_node(&id, "connected after the reboots", |n| {
        n.state == "connected"
    });

    // A self-update: the helper installs the release into a slot (root's)
    // and flips the link; the new release confirms.
    f.release(&f.bcd_release("0.2.0"), "0.2.0", 2);
    let c = f.server.run_command(&id, "daemon.upgrade", &["2"]);
    let c = wait_for(Duration::from_secs(90), "the upgrade to finish", || {
        Some(f.server.command(&c)).filter(|c| c.is_terminal())
    });
    assert_eq!(c.state, "succeeded", "{c:?} {}", node.log());
    let slot_b = s.data.join("slots/b/bcd");
    assert_eq!(owner(&slot_b), 0, "the slot's binary is root's");
    assert_eq!(
        std::fs::read_link(s.data.join("slots/current")).unwrap(),
        Path::new("b")
    );

    // Another uid (in the daemon's group, so it reaches the socket) is
    // refused by the helper.
    let other = Command::new(bc_tests::bin("bcd"))
        .arg("doctor")
        .arg("--data-dir")
        .arg(&s.data)
        .arg("--helper")
        .arg(&s.socket)
        .arg("--json")
        .uid(uid + 1)
        .gid(gid)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&other.stdout).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "helper")
        .unwrap()
        .clone();
    assert_eq!(check["status"], "warn", "{check}");
    assert!(
        check["summary"]
            .as_str()
            .unwrap()
            .contains(&format!("bcd-helper serves uid {uid}, not uid {}", uid + 1)),
        "{check}"
    );

    // A client of another protocol version is refused, with what to do.
    let refused = hello(&s.socket, bcd_helper::PROTOCOL_VERSION + 1, uid, gid);
    assert!(
        refused.contains(&format!(
            "speaks protocol version {}, this client speaks {}: restart bcd and bcd-helper",
            bcd_helper::PROTOCOL_VERSION,
            bcd_helper::PROTOCOL_VERSION + 1
        )),
        "{refused}"
    );

    // The helper stops: the node keeps its session; the devices section
    // says `helper:` and stays PROGRESSING, retried; back once it runs.
    helper.kill();
    // A GPU reset fails as it would without root.
    let c = f.server.run_command(&id, "gpu.reset", &["0000:2a:00.0"]);
    let c = f.server.wait_command(&c);
    assert_eq!(c.state, "failed", "{c:?}");
    assert!(
        c.reason.contains("helper: cannot reach bcd-helper"),
        "{c:?}"
    );
    let out = f
        .server
        .cli(&["nodes", "assign", &id, "job-b", "--gpus", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = wait_for(
        Duration::from_secs(20),
        "devices PROGRESSING with helper:",
        || {
            let v = f.server.spec(&id);
            (section(&v, "devices")["status"] == "PROGRESSING").then_some(v)
        },
    );
    let message = section(&v, "devices")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.starts_with("helper: cannot reach bcd-helper"),
        "{message}"
    );
    assert_eq!(f.server.node(&id).unwrap().state, "connected");
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "the daemon runs on"
    );
    let _helper = s.helper();
    wait_for(Duration::from_secs(20), "devices READY again", || {
        (section(&f.server.spec(&id), "devices")["status"] == "READY").then_some(())
    });
    assert!(s.run.path().join("env/job-b.env").exists());
    node.stop();
}

/// Sends a Hello of `version` as `uid` (from a thread that dropped to
/// it: the kernel records its credentials for SO_PEERCRED at connect);
/// returns the helper's refusal.
fn hello(socket: &Path, version: u32, uid: u32, gid: u32) -> String {
    use bcd_helper::{frame, wire};
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
        let g = rustix::process::Gid::from_raw(gid);
        let u = rustix::process::Uid::from_raw(uid);
        set_thread_groups(&[g]).expect("setgroups: run the tests as root");
        set_thread_res_gid(g, g, g).expect("setresgid: run the tests as root");
        set_thread_res_uid(u, u, u).expect("setresuid: run the tests as root");
        let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        let hello = frame::encode(&wire::Hello {
            version,
            software: "bcd 9.9.9".into(),
        })
        .unwrap();
        frame::write_blocking(&mut stream, &hello).unwrap();
        let body = frame::read_blocking(&mut stream, frame::MAX_HELLO).unwrap();
        let reply: wire::HelloReply = frame::decode("HelloReply", &body).unwrap();
        assert_eq!(reply.version, bcd_helper::PROTOCOL_VERSION);
        reply.refused
    })
    .join()
    .unwrap()
}
