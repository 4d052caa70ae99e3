//! The organising rule holds: in the server and in its store, each module
//! names only modules below it (no import cycles among the top-level
//! modules, nor among the children of any folder module), and the store
//! knows nothing of the wire or of certificates.

use std::path::{Path, PathBuf};

use bc_tests::module_graph::{assert_acyclic, top_level};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

#[test]
fn the_server_modules_form_no_cycle() {
    assert_acyclic(&workspace().join("server/src"));
}

#[test]
fn the_store_modules_form_no_cycle() {
    assert_acyclic(&workspace().join("server/store/src"));
}

/// The layers point one way: the API does not reach into the gateway, the
/// controllers or the CLI; nothing but the CLI and the simulator starts a
/// server.
#[test]
fn the_server_layers_point_down() {
    let g = top_level(&workspace().join("server/src")).unwrap();
    let names = |m: &str| g.edges.get(m).cloned().unwrap_or_default();
    for m in ["gateway", "controllers", "cli", "serve", "sim"] {
        assert!(!names("api").contains(m), "api names {m}");
    }
    for m in ["api", "gateway", "controllers", "boot", "pki", "check"] {
        assert!(!names(m).contains("serve"), "{m} names serve");
        assert!(!names(m).contains("cli"), "{m} names cli");
    }
}

/// The store's dependencies: no tonic, no protobuf, no certificates, no
/// HTTP. A backend is SQL plus the shared decisions.
#[test]
fn the_store_knows_nothing_of_the_wire() {
    let manifest = std::fs::read_to_string(workspace().join("server/store/Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .expect("a [dependencies] table");
    for banned in [
        "tonic",
        "prost",
        "bcd-proto",
        "rcgen",
        "rustls",
        "hyper",
        "ring",
        "x509",
    ] {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(banned)),
            "bc-store depends on {banned}"
        );
    }
}
