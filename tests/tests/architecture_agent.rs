//! The agent's architecture, checked: no import cycle among the modules of
//! the node daemon's crates, at the top level or among the children of any
//! folder module; and the release crates do not know the fakes.

use std::path::{Path, PathBuf};

use bc_tests::module_graph;

fn src(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

#[test]
fn the_agent_crates_have_no_module_cycles() {
    // `bcd/bin` is one file (the argument parsing), so it has no graph.
    for krate in ["bcd/agent", "bcd/core", "bcd/sys", "bcd/fakehw"] {
        module_graph::assert_acyclic(&src(krate));
    }
    // The binary is thin: one file, nothing to form a cycle.
    let bin: Vec<_> = std::fs::read_dir(src("bcd/bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(bin, ["main.rs"], "bcd/bin/src holds main.rs only");
    // The agent's folders were all seen.
    let folders = module_graph::folders(&src("bcd/agent")).unwrap();
    for f in ["converge", "hw", "journal", "node"] {
        assert!(folders.iter().any(|x| x == f), "{f} is a folder module");
    }
    let node = module_graph::children(&src("bcd/agent"), "node").unwrap();
    assert_eq!(
        node.edges.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "commands", "conn", "observe", "outbox", "renewal", "results", "secrets", "session",
            "state", "trust", "tunnel", "uevents", "update"
        ],
        "the daemon's responsibilities, one module each"
    );
}

/// The agent, its core and the shared helpers do not depend on the fake
/// hardware crate: fakes come in only through the binary's `fakehw`
/// feature.
#[test]
fn the_agent_does_not_know_the_fakes() {
    for krate in ["bcd/agent", "bcd/core", "bcd/sys"] {
        let manifest = std::fs::read_to_string(src(krate).join("../Cargo.toml")).unwrap();
        assert!(
            !manifest.contains("bcd-fakehw"),
            "{krate} depends on bcd-fakehw"
        );
    }
    let bin = std::fs::read_to_string(src("bcd/bin").join("../Cargo.toml")).unwrap();
    assert!(
        bin.contains("bcd-fakehw = { workspace = true, optional = true }"),
        "the binary takes bcd-fakehw only as an optional dependency"
    );
    // Without the feature the dependency is absent, so code that names
    // bcd_fakehw outside a `fakehw` cfg does not compile.
}
