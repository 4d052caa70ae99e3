//! Who gets what from the boot endpoint: assignments by node and by pool,
//! join tokens minted per boot for allowed MAC addresses only, and the MAC
//! addresses nodes report.
//!
//! The images are small signed stand-ins (no kernel boots here): the
//! endpoint serves their scripts as it serves any image's.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bc_tests::netboot::http_get;
use bc_tests::{FAST, Node, Server, bin, stderr};

/// The MAC address of the fake machine of seed `seed`.
fn fake_mac(seed: u32) -> String {
    let b = seed.to_be_bytes();
    format!("02:bc:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
}

/// A signed image named `name` (a few bytes of kernel and initrd) written
/// where `images register` reads it; returns its id.
fn small_image(key: &Path, dir: &Path, name: &str) -> String {
    let kernel = format!("kernel of {name}").into_bytes();
    let initrd = format!("initrd of {name}").into_bytes();
    let manifest = image::Manifest {
        format: image::FORMAT,
        name: name.into(),
        kernel_version: "6.1.0-test".into(),
        bcd_version: "bcd test".into(),
        cmdline: "console=ttyS0 bcd.server=https://127.0.0.1:1".into(),
        kernel: image::Part::of(image::KERNEL_FILE, &kernel),
        initrd: image::Part::of(image::INITRD_FILE, &initrd),
        modules: Vec::new(),
    };
    let key = image::read_key(&std::fs::read(key).unwrap()).unwrap();
    let signed = image::sign(&manifest, &key);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(image::KERNEL_FILE), &kernel).unwrap();
    std::fs::write(dir.join(image::INITRD_FILE), &initrd).unwrap();
    std::fs::write(dir.join(image::MANIFEST_FILE), signed.to_json()).unwrap();
    signed.id().unwrap().0
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", stderr(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// The script `mac` gets: its status and body.
fn script(boot: std::net::SocketAddr, mac: &str) -> (u16, String) {
    let (status, _, body) = http_get(boot, &format!("/boot/ipxe?mac={mac}"), &[]);
    (status, String::from_utf8(body).unwrap())
}

/// The join token a script carries.
fn token_in(script: &str) -> Option<String> {
    script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("bcd.token="))
        .map(str::to_string)
}

fn node_json(server: &Server, id: &str) -> serde_json::Value {
    let out = ok(server.cli(&["nodes", "list", "--json"]), "nodes list");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("node {id} is not listed: {out}"))
}

#[test]
fn minted_tokens_reach_allowed_macs_only_and_a_nodes_own_assignment_wins() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("image.key");
    let public = ok(
        Command::new(bin("better-compute"))
            .args(["images", "keygen", "--out"])
            .arg(&key)
            .output()
            .unwrap(),
        "images keygen",
    );
    let mut args = FAST.to_vec();
    args.extend([
        "--boot-listen",
        "127.0.0.1:0",
        "--image-pubkey",
        public.trim(),
    ]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let boot = server.boot.expect("the boot endpoint is on");
    let pooled = small_image(&key, &d.path().join("pooled"), "pooled");
    let own = small_image(&key, &d.path().join("own"), "own");
    for name in ["pooled", "own"] {
        let dir = d.path().join(name);
        ok(
            server.cli(&["images", "register", dir.to_str().unwrap()]),
            "images register",
        );
    }

    // Pool gpu boots `pooled` with a token minted per boot; every other
    // machine boots it too, with a token that lives 2 seconds.
    let out = ok(
        server.cli(&[
            "images",
            "assign",
            "pooled",
            "--pool",
            "gpu",
            "--join-token-ttl",
            "15m",
        ]),
        "images assign --pool",
    );
    assert!(
        out.contains("pool:gpu boots image") && out.contains("minted"),
        "{out}"
    );
    ok(
        server.cli(&[
            "images",
            "assign",
            "pooled",
            "--default",
            "--join-token-ttl",
            "2s",
        ]),
        "images assign --default",
    );
    let listed = ok(server.cli(&["images", "list"]), "images list");
    assert!(listed.contains("default,pool:gpu"), "{listed}");

    // A MAC off the allow-list is refused, and the refusal is recorded.
    let stranger = "52:54:00:00:00:99";
    let (status, body) = script(boot, stranger);
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("not on the boot allow-list") && body.contains("images allow-mac"),
        "{body}"
    );
    assert_eq!(token_in(&body), None);
    let boots = ok(
        server.cli(&["images", "boots", "--mac", stranger]),
        "images boots",
    );
    assert!(
        boots.contains("refused: ") && boots.contains("not on the boot allow-list"),
        "{boots}"
    );

    // An allowed MAC in pool gpu gets the pool's image and a fresh token
    // per request; the one before is replaced, not kept.
    let mac = fake_mac(42);
    let out = ok(
        server.cli(&["images", "allow-mac", &mac, "--pool", "gpu"]),
        "images allow-mac",
    );
    assert!(out.contains("into pool gpu"), "{out}");
    let allowed = ok(
        server.cli(&["images", "allowed-macs"]),
        "images allowed-macs",
    );
    assert!(
        allowed.contains(&mac) && allowed.contains("gpu"),
        "{allowed}"
    );
    let (status, first) = script(boot, &mac);
    assert_eq!(status, 200, "{first}");
    assert!(first.contains(&pooled), "{first}");
    // The MAC as a firmware escapes it (iPXE's `uristring`), in either
    // case, is the same machine; an escape that is no UTF-8 is no MAC.
    for escaped in [mac.replace(':', "%3A"), mac.replace(':', "%3a")] {
        let (status, body) = script(boot, &escaped);
        assert_eq!(status, 200, "{escaped}: {body}");
        assert!(
            body.contains(&pooled) && token_in(&body).is_some(),
            "{body}"
        );
    }
    let (status, body) = script(boot, &format!("{}%FF", mac.replace(':', "%3A")));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("pass the booting MAC address"), "{body}");
    let replaced = token_in(&first).expect("a minted token");
    let (_, second) = script(boot, &mac);
    let token = token_in(&second).expect("a minted token");
    assert_ne!(token, replaced);

    let node_dir = d.path().join("n42");
    let node = Node::new(&node_dir, 42);
    let out = node.join(&server.url(), &replaced);
    assert!(!out.status.success(), "a replaced token joins nothing");
    assert!(stderr(&out).contains("not known"), "{}", stderr(&out));
    let out = node.join(&server.url(), &token);
    assert!(out.status.success(), "join: {}", stderr(&out));
    let id = node.id();
    let other = Node::new(&d.path().join("n44"), 44);
    let out = other.join(&server.url(), &token);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("already used"), "{}", stderr(&out));

    // The node reported its MAC and sits in the token's pool.
    let listed = node_json(&server, &id);
    assert_eq!(listed["pool"], "gpu", "{listed}");
    assert_eq!(listed["macs"], serde_json::json!([mac]), "{listed}");
    let table = ok(server.cli(&["nodes", "list"]), "nodes list");
    assert!(table.contains("POOL") && table.contains(&mac), "{table}");

    // Its own assignment wins over its pool's, and hands out no token.
    ok(
        server.cli(&["images", "assign", "own", "--node", &id]),
        "images assign --node",
    );
    let (status, body) = script(boot, &mac);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&own) && !body.contains(&pooled), "{body}");
    assert_eq!(token_in(&body), None);
    let listed = ok(server.cli(&["images", "list"]), "images list");
    assert!(listed.contains(&format!("node:{id}")), "{listed}");

    // Off the allow-list, the node's MAC gets its pool's image no token.
    ok(
        server.cli(&["images", "unassign", "--node", &id]),
        "images unassign",
    );
    ok(
        server.cli(&["images", "disallow-mac", &mac]),
        "disallow-mac",
    );
    let (status, body) = script(boot, &mac);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("pool:gpu"), "{body}");

    // A minted token runs out after its TTL.
    let late = fake_mac(43);
    ok(server.cli(&["images", "allow-mac", &late]), "allow-mac");
    let (status, body) = script(boot, &late);
    assert_eq!(status, 200, "{body}");
    let short = token_in(&body).expect("a minted token");
    // The operator sees it, minted for that MAC, with its short life.
    let tokens: Vec<serde_json::Value> = serde_json::from_str(&ok(
        server.cli(&["tokens", "list", "--json"]),
        "tokens list",
    ))
    .unwrap();
    let minted = tokens
        .iter()
        .find(|t| t["minted_for_mac"] == late)
        .unwrap_or_else(|| panic!("no token minted for {late}: {tokens:?}"));
    assert_eq!(minted["uses_left"], 1);
    assert!(
        minted["expires_at_ms"].as_i64().unwrap() - minted["created_at_ms"].as_i64().unwrap()
            <= 2_000,
        "{minted}"
    );
    std::thread::sleep(Duration::from_millis(2500));
    let out = Node::new(&d.path().join("n43"), 43).join(&server.url(), &short);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("expired"), "{}", stderr(&out));

    // A literal token in an assignment works, with a warning.
    let out = server.cli(&[
        "images",
        "assign",
        "own",
        "--mac",
        "52:54:00:00:00:01",
        "--append",
        "bcd.token=bct1.literal",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("anyone on the boot network")
            && stderr(&out).contains("--join-token-ttl"),
        "{}",
        stderr(&out)
    );
    let (_, body) = script(boot, "52:54:00:00:00:01");
    assert_eq!(token_in(&body).as_deref(), Some("bct1.literal"));
}

#[test]
fn a_node_that_reports_another_network_card_is_found_by_it() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let dir = d.path().join("n");
    let node = Node::new(&dir, 42);
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "join: {}", stderr(&out));
    let id = node.id();
    assert_eq!(
        node_json(&server, &id)["macs"],
        serde_json::json!([fake_mac(42)])
    );
    // The same node (its identity, its data directory) on a machine whose
    // network card is another: its signed host inventory names the new
    // MAC, and the boot endpoint finds the node by it.
    let mut moved = Node::new(&dir, 46);
    moved.start();
    bc_tests::wait_for(Duration::from_secs(30), "the node's new MAC", || {
        (node_json(&server, &id)["macs"] == serde_json::json!([fake_mac(46)])).then_some(())
    });
}
