//! Tunnels: `better-compute exec` through the gateway holding the node's
//! session, sealed end to end, under the key holder's exec tickets; and a
//! gateway with the serving key that tries to open one of its own.
#![allow(clippy::disallowed_methods)]

use bc_store::NodeId;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use bc_tests::hostile::Hostile;
use bc_tests::{bin, setup_connected};
use bcd_proto::ticket::{self, Claims};
use bcd_proto::v1::{self, node_message::Msg as N, server_message::Msg as S};
use prost::Message;

const REDIAL: Duration = Duration::from_secs(30);
const ANSWER: Duration = Duration::from_secs(15);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `better-compute` with this server's operator credential and API.
fn cli(server: &bc_tests::Server) -> Command {
    let mut c = Command::new(bin("better-compute"));
    c.arg("--data-dir")
        .arg(&server.dir)
        .arg("--server")
        .arg(server.api_url());
    c
}

/// `better-compute exec NODE -- ARGV` with `input` on its stdin.
fn exec(
    server: &bc_tests::Server,
    node: &str,
    argv: &[&str],
    input: &[u8],
) -> std::process::Output {
    let mut c = cli(server)
        .args(["exec", node, "--"])
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run better-compute exec");
    c.stdin.take().unwrap().write_all(input).unwrap();
    c.wait_with_output().unwrap()
}

#[test]
fn exec_streams_input_output_and_the_exit_code_through_the_gateway() {
    let (_d, server, _node, id) = setup_connected(71);
    let out = exec(
        &server,
        &id,
        &[
            "sh",
            "-c",
            "echo out; echo err >&2; read x; echo got $x; exit 7",
        ],
        b"hello\n",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "out\ngot hello\n",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"));
    assert_eq!(out.status.code(), Some(7));
    // A command that cannot start says so; the CLI exits 255.
    let out = exec(&server, &id, &["/nonexistent/program"], b"");
    assert_eq!(out.status.code(), Some(255));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("did not start"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A user the node does not have is refused by the node.
    let out = cli(&server)
        .args(["exec", &id, "--user", "no-such-user", "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused the tunnel"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each tunnel is on the record: who opened what, and how it ended.
    let events = server.cli(&["events", "--node", &id]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("tunnel.opened"), "{events}");
    let store = server.store();
    let ended: Vec<serde_json::Value> = bc_tests::wait_for(ANSWER, "tunnel.ended events", || {
        let ended: Vec<serde_json::Value> = store
            .block(store.store.node_events(&NodeId::from(&id)))
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "tunnel.ended")
            .map(|e| serde_json::from_slice(&e.body).unwrap())
            .collect();
        (ended.len() >= 2).then_some(ended)
    });
    assert_eq!(ended[0]["exit_code"], 7);
    assert_eq!(ended[0]["user"], "root");
    assert_eq!(ended[0]["operator"], "admin");
    assert!(ended[0]["bytes_in"].as_u64().unwrap() > 0);
}

/// A ticket as the key holder signs it, with the key in its data
/// directory: what a gateway could capture in transit.
fn ticket_for(server: &bc_tests::Server, node: &str, sid: &str, argv: &[&str]) -> String {
    let pkcs8 = std::fs::read(server.dir.join("ticket.key")).expect("ticket.key");
    let key = ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8).unwrap();
    ticket::sign(&key, &claims(node, sid, argv))
}

fn claims(node: &str, sid: &str, argv: &[&str]) -> Claims {
    let now = now_ms() / 1000;
    Claims {
        iss: ticket::ISSUER.into(),
        sub: "admin".into(),
        node: node.into(),
        sid: sid.into(),
        jti: format!("jti-{sid}"),
        iat: now,
        exp: now + 30,
        exec: Some(argv.iter().map(|a| a.to_string()).collect()),
        port: None,
        tty: false,
        user: "root".into(),
        epk: "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc".into(),
    }
}

#[test]
fn a_gateway_opens_no_tunnel_of_its_own_replays_none_and_injects_nothing() {
    let (d, mut server, mut node, id) = setup_connected(72);
    // An honest tunnel first: the node takes the spec naming the ticket key.
    let out = exec(&server, &id, &["true"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let marker = d.path().join("ran");
    let touch = ["touch", marker.to_str().unwrap()];
    node.proc().stop();
    server.proc.stop();
    let h = Hostile::start(&server.dir, server.addr).expect("hostile gateway");
    node.start();
    let s = h.next_session(REDIAL);
    s.welcome(s.hello.last_epoch + 1, now_ms(), &[]);
    let open = |sid: &str, ticket: String| {
        s.send(S::TunnelOpen(v1::TunnelOpen {
            sid: sid.into(),
            ticket,
        }));
    };
    let refused = |sid: &str| -> String {
        s.recv_until(ANSWER, "the node's refusal", |m| match m {
            N::TunnelRefused(r) if r.sid == sid => Some(r.reason.clone()),
            _ => None,
        })
    };
    // No ticket; one the gateway signed itself; a real one for another
    // tunnel.
    open("tn-a", String::new());
    assert!(refused("tn-a").contains("not a compact JWS"));
    let forged = ticket::sign(
        &bc_tests::foreign_worker_key(),
        &claims(&id, "tn-b", &touch),
    );
    open("tn-b", forged);
    assert!(refused("tn-b").contains("not among the node's ticket keys"));
    open("tn-x", ticket_for(&server, &id, "tn-c", &touch));
    assert!(refused("tn-x").contains("for tunnel \"tn-c\""));
    // A real ticket opens its tunnel; bytes the gateway makes up end it
    // before anything runs.
    let real = ticket_for(&server, &id, "tn-d", &touch);
    open("tn-d", real.clone());
    let t = h.next_tunnel(ANSWER).expect("the node opens the tunnel");
    assert_eq!(t.first.sid, "tn-d");
    let accept = v1::TunnelAccept::decode(t.first.data.as_slice()).unwrap();
    assert_eq!(
        accept.ticket_sha256,
        bcd_proto::tunnel::ticket_sha256(&real)
    );
    t.send(
        v1::TunnelRecord {
            body: Some(v1::tunnel_record::Body::Start(true)),
        }
        .encode_to_vec(),
    );
    assert!(
        t.closed_within(ANSWER),
        "a record that does not open ends the tunnel"
    );
    assert!(!marker.exists(), "nothing ran on the gateway's bytes");
    // The same ticket again: spent.
    open("tn-d", real);
    assert!(refused("tn-d").contains("was used already"));
    assert!(!marker.exists());
}

#[test]
fn port_forward_reaches_a_port_on_the_nodes_loopback() {
    use std::io::{BufRead, BufReader, Read};
    let (_d, server, _node, id) = setup_connected(73);
    // A small server on the node's loopback (the node runs on this host):
    // it answers each connection with what it read, upper-cased.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let remote = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let mut c = c.unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            c.write_all(&got.to_ascii_uppercase()).unwrap();
        }
    });
    let mut pf = cli(&server)
        .args(["port-forward", &id, &format!("0:{remote}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run better-compute port-forward");
    let mut line = String::new();
    BufReader::new(pf.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let local: std::net::SocketAddr = line
        .split_whitespace()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("forwarding ADDR: {line:?}"));
    for round in 0..2 {
        let mut c = std::net::TcpStream::connect(local).unwrap();
        c.write_all(format!("ping {round}").as_bytes()).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, format!("PING {round}"));
    }
    let _ = pf.kill();
    let _ = pf.wait();
}

#[test]
fn exec_under_a_terminal_gives_the_command_a_controlling_terminal_and_ctrl_c() {
    use std::io::Read;
    let (_d, server, _node, id) = setup_connected(74);
    let mut c = cli(&server)
        .args(["exec", "-t", &id, "--", "sh", "-c"])
        .arg(
            "test -t 0 && test -t 1 && echo terminal; \
             trap 'echo interrupted; exit 9' INT; echo ready; \
             while true; do sleep 0.1; done",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run better-compute exec -t");
    let mut stdout = c.stdout.take().unwrap();
    // Whatever happens, the CLI does not outlive the test's patience.
    let pid = c.id();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(30));
        let _ = Command::new("kill").arg(pid.to_string()).status();
    });
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("ready") {
        let n = stdout.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the command ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    // Ctrl-C as a terminal sends it: the byte, which the node's terminal
    // turns into SIGINT for the foreground job.
    c.stdin.as_mut().unwrap().write_all(b"\x03").unwrap();
    stdout.read_to_end(&mut seen).unwrap();
    let status = c.wait().unwrap();
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.contains("terminal"), "{seen}");
    assert!(seen.contains("interrupted"), "{seen}");
    assert_eq!(status.code(), Some(9), "{seen}");
}

/// Starts a long command through a tunnel (as `operator`, a credential
/// file, or the server's own), once it printed that it started, runs
/// `close` and returns the CLI's stderr once it ended (it must fail).
fn closed_by(
    server: &bc_tests::Server,
    node: &str,
    operator: Option<&std::path::Path>,
    what: &str,
    close: impl FnOnce(),
) -> String {
    use std::io::{BufRead, BufReader, Read};
    let mut c = cli(server);
    if let Some(cred) = operator {
        c.arg("--operator").arg(cred);
    }
    let mut c = c
        .args(["exec", node, "--", "sh", "-c", "echo started; sleep 60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run better-compute exec");
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    let at = std::time::Instant::now();
    close();
    let status = bc_tests::wait_for(REDIAL, "the CLI to end", || c.try_wait().unwrap());
    println!("the tunnel closed {:?} after {what}", at.elapsed());
    let mut err = String::new();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "{err}");
    err
}

#[test]
fn a_revocation_closes_the_nodes_tunnels() {
    let (_d, server, _node, id) = setup_connected(75);
    let err = closed_by(&server, &id, None, "the node was deleted", || {
        ok(&server, &["nodes", "delete", &id, "--yes"])
    });
    assert!(err.contains("run the command again"), "{err}");
}

#[test]
fn revoking_the_operator_closes_its_tunnels() {
    let (d, server, _node, id) = setup_connected(76);
    let cred = d.path().join("ops.json");
    let o = server.cli(&[
        "operators",
        "add",
        "ops",
        "--role",
        "admin",
        "--out",
        cred.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", bc_tests::stderr(&o));
    let err = closed_by(
        &server,
        &id,
        Some(&cred),
        "the operator was revoked",
        || ok(&server, &["operators", "revoke", "ops"]),
    );
    assert!(err.contains("operator ops was revoked"), "{err}");
}

/// Runs the CLI; a failure fails the test.
fn ok(server: &bc_tests::Server, args: &[&str]) {
    let o = server.cli(args);
    assert!(o.status.success(), "{args:?}: {}", bc_tests::stderr(&o));
}

#[test]
fn a_gateway_killed_mid_tunnel_ends_it_on_the_cli() {
    use bc_tests::gateways::{add_gateway, start_gateway};
    let d = tempfile::tempdir().unwrap();
    let server = bc_tests::Server::start(&d.path().join("server"), bc_tests::FAST).unwrap();
    let cred = d.path().join("gw-edge.json");
    add_gateway(&server, "gw-edge", &cred);
    let mut gw = start_gateway(&server, &d.path().join("gateway"), &cred, "gw-edge-1");
    let mut node = bc_tests::Node::new(&d.path().join("n"), 77);
    let o = node.join(&gw.url(), &server.token(1));
    assert!(o.status.success(), "{}", bc_tests::stderr(&o));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected through the gateway", |n| {
        n.state == "connected" && n.gateway == "gw-edge-1"
    });
    let err = closed_by(&server, &id, None, "the gateway was killed", || {
        gw.proc.kill()
    });
    assert!(
        err.contains("gateway") && err.contains("run the command again"),
        "{err}"
    );
}

#[test]
fn a_gateway_drained_for_a_stop_ends_its_tunnels_on_the_cli() {
    use bc_tests::gateways::{add_gateway, start_gateway};
    let d = tempfile::tempdir().unwrap();
    let server = bc_tests::Server::start(&d.path().join("server"), bc_tests::FAST).unwrap();
    let cred = d.path().join("gw-edge.json");
    add_gateway(&server, "gw-edge", &cred);
    let mut gw = start_gateway(&server, &d.path().join("gateway"), &cred, "gw-edge-2");
    let mut node = bc_tests::Node::new(&d.path().join("n"), 80);
    let o = node.join(&gw.url(), &server.token(1));
    assert!(o.status.success(), "{}", bc_tests::stderr(&o));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected through the gateway", |n| {
        n.state == "connected" && n.gateway == "gw-edge-2"
    });
    // SIGTERM: the gateway drains its sessions before it stops, and the
    // tunnels on them end with the sessions.
    let err = closed_by(&server, &id, None, "the gateway was stopped", || {
        let status = gw.proc.stop();
        assert!(status.success(), "the gateway stops in order: {status:?}");
    });
    assert!(err.contains("run the command again"), "{err}");
}

#[test]
fn tunnels_go_on_through_ticket_key_rotations() {
    let (_d, server, _node, id) = setup_connected(78);
    let echo = |word: &str| {
        let out = exec(&server, &id, &["echo", word], b"");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{word}\n"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    echo("before");
    let store = server.store();
    let worker = {
        use ring::signature::KeyPair;
        let pkcs8 = std::fs::read(server.dir.join("worker.key")).unwrap();
        let k = ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8).unwrap();
        vec![k.public_key().as_ref().to_vec()]
    };
    let kids = || -> Vec<String> {
        let (_, signed) = store
            .block(store.store.signed_spec(&NodeId::from(&id)))
            .unwrap()
            .unwrap();
        let payload = bcd_proto::sign::open(&signed, &worker).unwrap();
        let spec = v1::NodeSpec::decode(payload.as_slice()).unwrap();
        ticket::Jwks::parse(&spec.ticket_jwks)
            .unwrap()
            .keys
            .into_iter()
            .map(|k| k.kid)
            .collect()
    };
    let first = kids();
    assert_eq!(first.len(), 1);
    let o = server.cli(&["ticket-keys", "rotate"]);
    assert!(o.status.success(), "{}", bc_tests::stderr(&o));
    let printed = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        printed.contains(&format!("{} stays", first[0])),
        "{printed}"
    );
    let both = kids();
    assert_eq!(both.len(), 2);
    assert_eq!(
        both[1], first[0],
        "the previous key stays beside the new one"
    );
    echo("after one rotation");
    let o = server.cli(&["ticket-keys", "rotate"]);
    let printed = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        printed.contains(&format!("ticket key {} is retired", first[0])),
        "{printed}"
    );
    assert!(!kids().contains(&first[0]));
    echo("after two");
}

#[test]
fn a_tunnel_closes_when_idle_and_at_the_end_of_its_lifetime_with_its_whole_process_group() {
    let (_d, server, mut node) = bc_tests::setup(79);
    node.env.push(("BCD_TUNNEL_IDLE".into(), "2s".into()));
    node.env.push(("BCD_TUNNEL_LIFETIME".into(), "5s".into()));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");

    // Output every 300 ms keeps it from being idle; the lifetime ends it,
    // and the shell's own child (a sleep in the background) goes with it.
    let pid_file = node.dir.join("background.pid");
    let at = std::time::Instant::now();
    let script = format!(
        "sleep 300 & echo $! > {}; while :; do echo tick; sleep 0.3; done",
        pid_file.display()
    );
    let out = exec(&server, &id, &["sh", "-c", &script], b"");
    let took = at.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert!(
        err.contains("closed at the end of its 5s lifetime: run the command again"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).matches("tick").count() > 5);
    assert!(took >= Duration::from_secs(5), "{took:?}");
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let proc = std::path::PathBuf::from(format!("/proc/{}", pid.trim()));
    bc_tests::wait_for(ANSWER, "the background sleep to be gone", || {
        (!proc.exists()).then_some(())
    });

    // Nothing moves: closed after the idle time, well before the lifetime.
    let at = std::time::Instant::now();
    let out = exec(&server, &id, &["sleep", "60"], b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("closed after 2s idle: run the command again"),
        "{err}"
    );
    assert!(at.elapsed() < Duration::from_secs(5), "{:?}", at.elapsed());
}
