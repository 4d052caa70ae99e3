//! `better-compute audit list|verify|export` on a live server's store: the
//! history of a node's session and command is listed and verified, an
//! export is verified by a program of its own (Python's hashlib, from the
//! format the export documents, not this code), and a record edited in the
//! database behind the store's back breaks both verifications.
#![allow(clippy::disallowed_methods)]

use std::process::{Command, Output};

use bc_tests::{FAST, Node, Server, bin, stderr};

fn audit(server: &Server, args: &[&str]) -> Output {
    Command::new(bin("better-compute"))
        .arg("--data-dir")
        .arg(&server.dir)
        .arg("audit")
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Verifies an export as another tool would: from the documented text,
/// with hashlib. Prints `ok N` or one line per break, and exits 1 on one.
const VERIFY_PY: &str = r#"
import hashlib, json, sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
header = json.loads(lines[0])
assert header["format"] == "bc-audit-export-v1", header["format"]
records = [json.loads(l) for l in lines[1:]]
assert len(records) == header["records"]
def text(s):
    return f"{len(s)}:{s}"
chains, broken = {}, []
for r in records:
    chains.setdefault(r["chain"], []).append(r)
for h in header["heads"]:
    rs = sorted(chains.pop(h["chain"], []), key=lambda r: r["seq"])
    prev, seq = "0" * 64, 0
    for r in rs:
        seq += 1
        if r["seq"] != seq:
            broken.append(f"chain {h['chain']}: record {seq} missing")
        if r["prev_hash"] != prev:
            broken.append(f"chain {h['chain']}: record {r['seq']} does not follow")
        tag = "bc-audit-v1" if r["chain"] == 0 else f"bc-audit-v2\n{r['chain']}"
        canonical = "\n".join([tag, r["prev_hash"], str(r["seq"]), str(r["at"]),
            text(r["node_id"]), text(r["kind"]), str(r["epoch"]), text(r["gateway_id"]),
            str(r["value"]), text(r["detail"])])
        if hashlib.sha256(canonical.encode("utf-8")).hexdigest() != r["hash"]:
            broken.append(f"chain {h['chain']}: record {r['seq']} does not match its hash")
        prev = r["hash"]
    if (h["seq"], h["hash"] if h["seq"] else "") != (seq, prev if seq else ""):
        broken.append(f"chain {h['chain']}: the head is not at the chain's end")
broken += [f"chain {c}: records without a head" for c in chains]
print("\n".join(broken) if broken else f"ok {len(records)}")
sys.exit(1 if broken else 0)
"#;

fn verify_export(path: &std::path::Path) -> Output {
    Command::new("python3")
        .arg("-c")
        .arg(VERIFY_PY)
        .arg(path)
        .output()
        .expect("python3 (scripts/test installs it)")
}

#[test]
fn the_audit_history_is_listed_verified_and_exported_for_another_tool() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 11);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    node.start();
    let id = node.id();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let cmd = server.run_command(&id, "exec.run", &["/bin/true"]);
    assert_eq!(server.wait_command(&cmd).state, "succeeded");

    let out = audit(&server, &["verify"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("every chain intact"),
        "{}",
        stdout(&out)
    );

    // The node's records: its route and its command's result.
    let out = audit(&server, &["list", "--node", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.starts_with("TIME"), "{table}");
    assert!(
        table.contains(" route ") && table.contains(" result "),
        "{table}"
    );
    let out = Command::new(bin("better-compute"))
        .arg("--data-dir")
        .arg(&server.dir)
        .args([
            "-o", "json", "audit", "list", "--node", &id, "--kind", "route",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let routes: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!routes.is_empty());
    for r in &routes {
        assert_eq!(
            (r["node_id"].as_str(), r["kind"].as_str()),
            (Some(id.as_str()), Some("route"))
        );
        assert_eq!(r["hash"].as_str().unwrap().len(), 64);
    }

    // The export, verified by a program of its own.
    let export = d.path().join("audit.jsonl");
    let out = audit(&server, &["export", "--out", export.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let checked = verify_export(&export);
    assert!(
        checked.status.success(),
        "{}{}",
        stdout(&checked),
        stderr(&checked)
    );
    let n: usize = stdout(&checked)
        .trim()
        .strip_prefix("ok ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(n >= 2, "{n} records");

    // A record edited in the database, around the store: both see it.
    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    let edited = db
        .execute(
            "UPDATE audit SET detail = 'forged' WHERE id = \
             (SELECT id FROM audit WHERE node_id = ?1 AND kind = 'result' LIMIT 1)",
            [&id],
        )
        .unwrap();
    assert_eq!(edited, 1);
    let out = audit(&server, &["verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("was edited"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("broken in 1 place:"),
        "{}",
        stderr(&out)
    );
    let out = audit(&server, &["export", "--out", export.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let checked = verify_export(&export);
    assert!(!checked.status.success());
    assert!(
        stdout(&checked).contains("does not match its hash"),
        "{}",
        stdout(&checked)
    );
}

#[test]
fn audit_on_a_directory_without_a_store_says_where_to_point_it() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(bin("better-compute"))
        .arg("--data-dir")
        .arg(d.path())
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("pass --data-dir of the server, or its --store"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        0,
        "nothing created"
    );
}
