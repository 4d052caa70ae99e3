//! `serve` as a service: its settings from a config file under `BC_*`
//! variables and flags, the systemd notifications of `Type=notify`, and the
//! units we ship, verified and held to their exposure scores.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bc_tests::{Proc, bin, stderr};

/// A `serve` started with `args` and `env`, and the gateway id it
/// printed on `listening on ADDR as gateway ID`.
fn serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Proc, String) {
    let log = dir.join(format!("serve-{}.log", rand_suffix()));
    // systemd names the process a watchdog is for (WATCHDOG_PID); a shell
    // that execs the server gives it its own pid.
    let mut c = Command::new("sh");
    c.args(["-c", "WATCHDOG_PID=$$ exec \"$0\" \"$@\""])
        .arg(bin("better-compute"));
    c.arg("--data-dir").arg(dir).arg("serve").args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c
        .env("BC_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut proc = Proc { child, log };
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("listening on ") {
            let id = rest.rsplit(' ').next().unwrap().to_string();
            return (proc, id);
        }
    }
    proc.kill();
    panic!("serve did not start:\n{}", proc.log());
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

const CONFIG: &str = r#"
# Every key is a flag of `serve`, by its long name.
listen = "127.0.0.1:0"
api-listen = "127.0.0.1:0"
http-listen = "127.0.0.1:0"
gateway-id = "gw-from-file"
handshake-rate = 300
san = ["gw.example", "10.9.8.7"]
x509pop = true
"#;

/// The file sets what nothing else does; a `BC_*` variable beats the file
/// and a flag beats both; `BC_CONFIG` names the file as `--config` does.
#[test]
fn serve_takes_its_settings_from_a_file_under_variables_and_flags() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("serve.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let f = file.to_str().unwrap();

    let (mut p, id) = serve(d.path(), &["--config", f], &[]);
    assert_eq!(id, "gw-from-file");
    p.stop();
    let (mut p, id) = serve(d.path(), &[], &[("BC_CONFIG", f)]);
    assert_eq!(id, "gw-from-file", "BC_CONFIG names the file");
    p.stop();
    let (mut p, id) = serve(
        d.path(),
        &["--config", f],
        &[("BC_GATEWAY_ID", "gw-from-env")],
    );
    assert_eq!(id, "gw-from-env", "the variable beats the file");
    p.stop();
    let (mut p, id) = serve(
        d.path(),
        &["--config", f, "--gateway-id", "gw-from-flag"],
        &[("BC_GATEWAY_ID", "gw-from-env")],
    );
    assert_eq!(id, "gw-from-flag", "the flag beats both");
    p.stop();

    // serve --help names each flag's variable.
    let out = Command::new(bin("better-compute"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for var in [
        "BC_CONFIG",
        "BC_HANDSHAKE_RATE",
        "BC_NODE_LEASE_TTL",
        "BC_X509POP",
    ] {
        assert!(help.contains(&format!("[env: {var}")), "{var} in:\n{help}");
    }
}

/// A key that is no flag, or a value of the wrong shape, stops `serve`
/// before it touches anything, with the key and the file named.
#[test]
fn serve_refuses_a_config_file_it_cannot_follow_and_starts_nothing() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    for (text, says) in [
        (
            "listne = \"127.0.0.1:0\"\n",
            "`listne` is no flag of `better-compute serve`",
        ),
        ("x509pop = \"yes\"\n", "`x509pop` is a switch"),
        ("handshake-rate = \"fast\"\n", "--handshake-rate"),
        ("listen = [\n", "not TOML"),
    ] {
        let file = d.path().join("serve.toml");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(bin("better-compute"))
            .arg("--data-dir")
            .arg(&data)
            .args(["serve", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{text}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(says), "{text}: {err}");
        if !says.starts_with("--") {
            assert!(err.contains(file.to_str().unwrap()), "{text}: {err}");
        }
        assert!(!data.exists(), "{text}: the data directory was created");
    }
    let out = Command::new(bin("better-compute"))
        .arg("--data-dir")
        .arg(&data)
        .args(["serve", "--config"])
        .arg(d.path().join("missing.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot read the config file"));
}

/// Under `Type=notify`: READY=1 only once every listener is up, WATCHDOG=1
/// at half of `WATCHDOG_USEC`, STOPPING=1 at SIGTERM.
#[test]
fn serve_tells_systemd_it_is_ready_alive_and_stopping() {
    let d = tempfile::tempdir().unwrap();
    let socket_path = d.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let (mut p, _) = serve(
        d.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let mut buf = [0u8; 512];
    let mut next = || {
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).trim().to_string()
    };
    // `listening on` is printed just before READY=1: it is the first.
    assert_eq!(next(), "READY=1");
    // Pings keep coming (their interval is `systemd::watchdog_every`'s).
    assert_eq!(next(), "WATCHDOG=1");
    assert_eq!(next(), "WATCHDOG=1");
    p.signal(rustix::process::Signal::TERM);
    let stopping = (0..50).map(|_| next()).find(|m| m != "WATCHDOG=1");
    assert_eq!(stopping.as_deref(), Some("STOPPING=1"));
    assert!(p.wait(Duration::from_secs(15)).unwrap().success());
}

fn units() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `better-compute.service` verifies with the built binary in its place,
/// its `serve` line parses, and every unit we ship stays at or under the
/// exposure `systemd-analyze security` gave it when it was hardened.
#[test]
fn the_units_verify_and_keep_their_exposure() {
    let d = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(units().join("server/systemd/better-compute.service"))
        .unwrap()
        .replace(
            "/usr/bin/better-compute",
            bin("better-compute").to_str().unwrap(),
        );
    let unit = d.path().join("better-compute.service");
    std::fs::write(&unit, &text).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "./better-compute.service"])
        .current_dir(d.path())
        .output()
        .expect("systemd-analyze is missing: apt-get install systemd (scripts/test does)");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "no warnings either");
    // The example config is what the unit reads: it parses as serve's.
    let example = units().join("server/systemd/serve.toml");
    let out = Command::new(bin("better-compute"))
        .arg("--data-dir")
        .arg(d.path().join("data"))
        .args(["serve", "--config"])
        .arg(&example)
        .arg("--no-such-flag-here")
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("unexpected argument '--no-such-flag-here'"),
        "{}",
        stderr(&out)
    );

    // Exposure ceilings, out of 10 (lower is safer): the root units run
    // what an operator's exec tunnel runs, so they stay open by design.
    for (path, ceiling) in [
        ("server/systemd/better-compute.service", "1.6"),
        ("bcd/bin/systemd/unprivileged/bcd.service", "3.5"),
        ("bcd/bin/systemd/bcd-rollback.service", "6.8"),
        ("bcd/bin/systemd/bcd-watchdog.service", "6.8"),
        ("bcd/bin/systemd/bcd.service", "9.3"),
        ("bcd/bin/systemd/unprivileged/bcd-helper.service", "9.3"),
    ] {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(format!(
                "--threshold={}",
                (ceiling.parse::<f64>().unwrap() * 10.0) as u32
            ))
            .arg(units().join(path))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let score = text
            .lines()
            .find_map(|l| l.split("Overall exposure level for ").nth(1))
            .unwrap_or("none");
        println!("{path}: {score}");
        assert!(out.status.success(), "{path} is above {ceiling}: {score}");
    }
}
