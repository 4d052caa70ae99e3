//! Signed releases on the server: keygen, offline signing, registration that
//! refuses what does not verify or match, and nodes learning the release key.

use bc_tests::{Node, Server, stderr};

fn run(server: &Server, args: &[&str]) -> std::process::Output {
    server.cli(args)
}

#[test]
fn releases_are_signed_offline_and_registered_only_when_they_verify() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("release.key");
    // keygen needs no server.
    let out = std::process::Command::new(bc_tests::bin("better-compute"))
        .args(["releases", "keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let public = std::fs::read_to_string(d.path().join("release.key.pub")).unwrap();
    assert_eq!(public.trim().len(), 64);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let server = Server::start(
        &d.path().join("server"),
        &["--release-pubkey", public.trim()],
    )
    .unwrap();
    let binary = bc_tests::static_bcd();
    let manifest = d.path().join("bcd-0.2.0.json");
    let sign = |seq: &str, out: &std::path::Path| {
        run(
            &server,
            &[
                "releases",
                "sign",
                "--key",
                key.to_str().unwrap(),
                "--binary",
                binary.to_str().unwrap(),
                "--version",
                "0.2.0",
                "--sequence",
                seq,
                "--out",
                out.to_str().unwrap(),
            ],
        )
    };
    let out = sign("2", &manifest);
    assert!(out.status.success(), "{}", stderr(&out));
    let register = |m: &std::path::Path, b: &std::path::Path| {
        run(
            &server,
            &[
                "releases",
                "register",
                "--manifest",
                m.to_str().unwrap(),
                "--binary",
                b.to_str().unwrap(),
            ],
        )
    };
    let out = register(&manifest, &binary);
    assert!(out.status.success(), "{}", stderr(&out));
    // The same sequence again.
    let out = register(&manifest, &binary);
    assert!(
        stderr(&out).contains("already registered"),
        "{}",
        stderr(&out)
    );
    // A binary that does not match its manifest.
    let truncated = d.path().join("truncated");
    let bytes = std::fs::read(&binary).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let m3 = d.path().join("m3.json");
    assert!(sign("3", &m3).status.success());
    let out = register(&m3, &truncated);
    assert!(stderr(&out).contains("manifest says"), "{}", stderr(&out));
    // Signed with a key the server does not know.
    let other = d.path().join("other.key");
    std::process::Command::new(bc_tests::bin("better-compute"))
        .args(["releases", "keygen", "--out"])
        .arg(&other)
        .output()
        .unwrap();
    let m4 = d.path().join("m4.json");
    let out = run(
        &server,
        &[
            "releases",
            "sign",
            "--key",
            other.to_str().unwrap(),
            "--binary",
            binary.to_str().unwrap(),
            "--version",
            "0.3.0",
            "--sequence",
            "4",
            "--out",
            m4.to_str().unwrap(),
        ],
    );
    assert!(out.status.success());
    let out = register(&m4, &binary);
    assert!(
        stderr(&out).contains("not a release key of this fleet"),
        "{}",
        stderr(&out)
    );
    // A tampered manifest.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&m3).unwrap()).unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut inner: serde_json::Value =
        serde_json::from_slice(&b64.decode(v["manifest"].as_str().unwrap()).unwrap()).unwrap();
    inner["sequence"] = serde_json::json!(99);
    v["manifest"] = serde_json::json!(b64.encode(serde_json::to_vec(&inner).unwrap()));
    std::fs::write(&m3, v.to_string()).unwrap();
    let out = register(&m3, &binary);
    assert!(stderr(&out).contains("does not verify"), "{}", stderr(&out));

    let out = run(&server, &["releases", "list", "--json"]);
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["sequence"], 2);

    // Nodes learn the release key at join.
    let node = Node::new(&d.path().join("n"), 71);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    assert_eq!(
        node.identity()["release_keys"],
        serde_json::json!([public.trim()])
    );
}
