//! The web console (`serve --console-listen`), from outside: who it lets
//! in (a token from `operators login`, a client certificate; never a token
//! another key signed, nor a revoked operator's), and what a real browser
//! (headless Chromium) sees: pages that load with no error, the node list
//! the CLI prints, a node's GPUs, an event arriving live. Screenshots of
//! each page are saved under the test's target directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bc_tests::chromium::Browser;
use bc_tests::{FAST, Node, Server, stderr};
use serde_json::Value;

fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `curl` against the console: the status, the headers and the body.
fn curl(console: &str, path: &str, extra: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "-i", "--max-time", "10"])
        .args(extra)
        .arg(format!("https://{console}{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no answer from {path}: {}", stderr(&out)));
    (status, text)
}

fn login(server: &Server, operator: Option<&Path>) -> Value {
    let mut args = Vec::new();
    if let Some(o) = operator {
        args.extend(["--operator", o.to_str().unwrap()]);
    }
    args.extend(["operators", "login", "--ttl", "10m", "-o", "json"]);
    let out = server.cli(&args);
    assert!(out.status.success(), "operators login: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn cookie(token: &Value) -> String {
    format!("bc_console={}", token["token"].as_str().unwrap())
}

#[test]
fn the_console_admits_tokens_and_certificates_of_live_operators_only() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--console-listen", "127.0.0.1:0"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let console = server.console.expect("console on ADDR").to_string();

    let admin = login(&server, None);
    assert_eq!(admin["console_url"], format!("https://{console}/"));
    let out = server.cli(&["operators", "login", "--ttl", "13h"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("at most 12h"), "{}", stderr(&out));

    // No credential: the sign-in page.
    let (code, text) = curl(&console, "/nodes", &[]);
    assert_eq!(code, 303, "{text}");
    assert!(text.to_lowercase().contains("location: /login"), "{text}");
    let (code, _) = curl(&console, "/events/stream", &[]);
    assert_eq!(code, 401);

    // The token in a cookie opens every page; the form sets that cookie.
    let (code, text) = curl(&console, "/", &["-b", &cookie(&admin)]);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("admin (admin)"), "{text}");
    assert!(text.contains("content-security-policy: default-src 'none'"));
    let form = format!("token={}", admin["token"].as_str().unwrap());
    let (code, text) = curl(&console, "/login", &["--data-urlencode", &form]);
    assert_eq!(code, 303, "{text}");
    assert!(text.contains("HttpOnly; Secure; SameSite=Strict"), "{text}");
    // A form posted from another site is not acted on.
    let (code, _) = curl(
        &console,
        "/login",
        &[
            "--data-urlencode",
            &form,
            "-H",
            "Origin: https://evil.example",
        ],
    );
    assert_eq!(code, 403);
    // Read-only: nothing but reading.
    let (code, _) = curl(&console, "/nodes", &["-X", "DELETE", "-b", &cookie(&admin)]);
    assert_eq!(code, 405);

    // A token of the same shape, signed by a key that is not this fleet's.
    let other = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[9; 32]).unwrap();
    let fp = admin_cert_sha256(&server);
    let (forged, _) = better_compute::pki::console::mint(
        &other,
        "admin",
        bc_store::tokens::OperatorRole::Admin,
        &fp,
        now_ms(),
        600_000,
        [1; 16],
    )
    .unwrap();
    let (code, text) = curl(&console, "/", &["-b", &format!("bc_console={forged}")]);
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("not signed by this fleet"), "{text}");
    // The same token with a byte of its body changed: its signature no
    // longer holds.
    let real = admin["token"].as_str().unwrap();
    let at = "bcc1.".len() + 10;
    let swap = if &real[at..=at] == "A" { "B" } else { "A" };
    let edited = format!("{}{swap}{}", &real[..at], &real[at + 1..]);
    let (code, _) = curl(&console, "/", &["-b", &format!("bc_console={edited}")]);
    assert_eq!(code, 403);

    // A browser with the operator's certificate needs no token.
    let cred: Value =
        serde_json::from_slice(&std::fs::read(server.dir.join("operator.json")).unwrap()).unwrap();
    let cert = d.path().join("cert.pem");
    let key = d.path().join("key.pem");
    std::fs::write(&cert, cred["cert_pem"].as_str().unwrap()).unwrap();
    std::fs::write(&key, cred["key_pem"].as_str().unwrap()).unwrap();
    let (code, text) = curl(
        &console,
        "/",
        &[
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("admin (admin)"), "{text}");

    // A read-only operator's token opens it as read-only, until revoked.
    let viewer = d.path().join("viewer.json");
    let out = server.cli(&[
        "operators",
        "add",
        "viewer",
        "--role",
        "read-only",
        "--out",
        viewer.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let token = login(&server, Some(&viewer));
    let (code, text) = curl(&console, "/", &["-b", &cookie(&token)]);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("viewer (read-only)"), "{text}");
    let out = server.cli(&["operators", "revoke", "viewer"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (code, text) = curl(&console, "/", &["-b", &cookie(&token)]);
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("operator viewer was revoked"), "{text}");

    // Off: login says how to turn it on.
    let d2 = tempfile::tempdir().unwrap();
    let plain = Server::start(&d2.path().join("server"), FAST).unwrap();
    let out = plain.cli(&["operators", "login"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--console-listen ADDR"),
        "{}",
        stderr(&out)
    );
}

fn now_ms() -> i64 {
    better_compute::clock::unix_ms()
}

fn admin_cert_sha256(server: &Server) -> String {
    let out = server.cli(&["operators", "list", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["operators"][0]["cert_sha256"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_browser_signs_in_and_sees_the_nodes_the_cli_lists_and_events_live() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--console-listen", "127.0.0.1:0"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let console = server.console.expect("console on ADDR");
    let mut nodes = Vec::new();
    for seed in [71, 72] {
        let mut node = Node::new(&d.path().join(format!("node{seed}")), seed);
        let out = node.join(&server.url(), &server.token(1));
        assert!(out.status.success(), "{}", stderr(&out));
        node.start();
        server.wait_node(&node.id(), "connected", |n| n.state == "connected");
        nodes.push(node);
    }
    let first = nodes[0].id();
    let out = server.cli(&["nodes", "label", &first, "pool=a", "rack=r1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = server.cli(&["nodes", "cordon", &nodes[1].id(), "--reason", "fan"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let token = login(&server, None);
    let shots = screenshots();

    let mut b = Browser::start(&d.path().join("chromium.log")).unwrap();
    b.open(&format!("https://{console}/")).unwrap();
    assert_eq!(b.eval("location.pathname").unwrap(), "/login");
    b.screenshot(&shots.join("login.png")).unwrap();
    b.eval(&format!(
        "document.getElementById('token').value = {}; \
         document.querySelector('form.login').submit(); true",
        token["token"]
    ))
    .unwrap();
    b.wait_until(
        Duration::from_secs(20),
        "location.pathname === '/' && document.readyState === 'complete' && \
         !!document.querySelector('.tiles')",
    )
    .unwrap();
    let tiles = b
        .eval("document.querySelector('.tiles').textContent")
        .unwrap();
    assert!(tiles.as_str().unwrap().contains("2nodes"), "{tiles}");
    b.screenshot(&shots.join("fleet.png")).unwrap();

    // The node list is what `nodes list --json` says.
    b.open(&format!("https://{console}/nodes")).unwrap();
    let rows = b
        .eval(
            "[...document.querySelectorAll('#nodes-rows tr')].map(r => \
             [r.dataset.node, r.dataset.state, r.cells[1].textContent, r.cells[2].textContent, \
              r.cells[7].textContent])",
        )
        .unwrap();
    let mut seen: Vec<(String, String, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_string(),
                r[1].as_str().unwrap().to_string(),
                r[2].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let mut listed: Vec<(String, String, String)> = server
        .nodes()
        .into_iter()
        .map(|n| (n.node_id, n.state, n.hostname))
        .collect();
    listed.sort();
    assert_eq!(seen, listed);
    let text = rows.to_string();
    assert!(text.contains("connected,cordoned"), "{text}");
    assert!(text.contains("pool=a,rack=r1"), "{text}");
    // A label selector filters as the CLI's does.
    b.open(&format!("https://{console}/nodes?l=pool%3Da"))
        .unwrap();
    let ids = b
        .eval("[...document.querySelectorAll('#nodes-rows tr')].map(r => r.dataset.node)")
        .unwrap();
    assert_eq!(ids, serde_json::json!([first]));
    b.screenshot(&shots.join("nodes.png")).unwrap();

    // A node's page lists the GPUs `nodes show` does.
    b.open(&format!("https://{console}/nodes/{first}")).unwrap();
    let gpus = b
        .eval("[...document.querySelectorAll('#gpus-rows tr')].map(r => r.dataset.gpu)")
        .unwrap();
    let out = server.cli(&["nodes", "show", &first, "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let want: Vec<Value> = shown["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci_address"].clone())
        .collect();
    assert!(!want.is_empty(), "a fakehw node reports GPUs: {shown}");
    assert_eq!(gpus, Value::Array(want));
    b.screenshot(&shots.join("node.png")).unwrap();

    // An event arrives on the open page without a reload.
    b.open(&format!("https://{console}/events")).unwrap();
    b.wait_until(
        Duration::from_secs(20),
        "document.getElementById('live').textContent === 'live'",
    )
    .unwrap();
    b.eval("window.stayed = true").unwrap();
    let out = server.cli(&["exec", &first, "--", "true"]);
    assert!(out.status.success(), "exec: {}", stderr(&out));
    b.wait_until(
        Duration::from_secs(20),
        "[...document.querySelectorAll('#events-rows tr.new')].some(r => \
         r.cells[1].textContent === 'tunnel.opened')",
    )
    .unwrap();
    assert_eq!(
        b.eval("window.stayed").unwrap(),
        true,
        "the page was not reloaded"
    );
    b.screenshot(&shots.join("events.png")).unwrap();

    // Commands and rollouts render too.
    for page in ["commands", "rollouts"] {
        b.open(&format!("https://{console}/{page}")).unwrap();
        assert_eq!(
            b.eval(&format!("!!document.getElementById('{page}')"))
                .unwrap(),
            true
        );
    }
    let errors = b.errors();
    assert!(errors.is_empty(), "the pages logged errors: {errors:#?}");
    // That check sees what a page throws: one provoked now is caught.
    b.eval("setTimeout(() => { throw new Error('provoked') }, 0); true")
        .unwrap();
    bc_tests::wait_for(Duration::from_secs(10), "the provoked error", || {
        b.eval("true").unwrap();
        (!b.errors().is_empty()).then_some(())
    });
    assert!(format!("{:?}", b.errors()).contains("provoked"));
    eprintln!("screenshots in {}", shots.display());
}
