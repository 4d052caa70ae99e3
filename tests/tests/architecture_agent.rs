//! The agent's architecture, checked: no import cycle among the modules of
//! the node daemon's crates, at the top level or among the children of any
//! folder module; the node's parts each own their state, the `Agent` only
//! tying them together; and the release crates do not know the fakes.

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

/// A node module's code as one line: whole-line comments dropped, every
/// run of whitespace one space, none around a `.` (so `self\n    .x` reads
/// `self.x`).
fn node_code(file: &str) -> String {
    let text = std::fs::read_to_string(src("bcd/agent").join("node").join(file)).unwrap();
    let code = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join(" ");
    code.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" .", ".")
        .replace(". ", ".")
}

/// The types each `impl` in `code` is for: the identifiers between `impl`
/// and its `{` (a trait's, the type's, and any in their paths and
/// generics), so `impl Agent`, `impl super::Agent`, `impl<T> X for Agent`
/// all name `Agent`.
fn impl_heads(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("impl") {
        let before = code[..i].chars().next_back();
        let after = code[i + 4..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if word(before) || word(after) {
            continue;
        }
        let head = &code[i + 4..];
        let head = &head[..head.find(['{', ';']).unwrap_or(head.len())];
        // `impl Trait` in argument or return position has no block of its
        // own: its head runs on into a signature or body; such a head
        // names no type of the node's.
        out.push(
            head.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
        );
    }
    out
}

/// The node's files (`bcd/agent/src/node/*.rs`).
fn node_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(src("bcd/agent").join("node"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".rs"))
        .collect();
    files.sort();
    files
}

/// Each part of the node owns its state: `impl Agent` is written only
/// where the parts are tied together (`run` in `mod.rs`, the loop
/// in `session.rs`); a part's state type is implemented only in its own
/// module; and no other module reaches an `Agent` field that holds a part.
#[test]
fn the_node_parts_own_their_state() {
    /// Where `impl Agent` may be written.
    const TIES: [&str; 2] = ["mod.rs", "session.rs"];
    /// Each part's module and the types holding the state it owns.
    const OWNERS: [(&str, &[&str]); 7] = [
        ("commands.rs", &["Commands"]),
        ("outbox.rs", &["Outbox"]),
        ("renewal.rs", &["Renewals"]),
        ("secrets.rs", &["Secrets"]),
        ("state.rs", &["Desired"]),
        ("trust.rs", &["Trust"]),
        ("tunnel.rs", &["Tunnels"]),
    ];
    /// The `Agent` fields that hold the shared context and the parts.
    const PARTS: [&str; 10] = [
        "shared", "link", "desired", "commands", "trust", "tunnels", "secrets", "outbox",
        "renewals", "update",
    ];
    let files = node_files();
    for f in ["mod.rs", "session.rs", "trust.rs", "state.rs"] {
        assert!(files.iter().any(|x| x == f), "node/{f} is read");
    }
    let mut agent_impls = Vec::new();
    for file in &files {
        let code = node_code(file);
        for head in impl_heads(&code) {
            if head.iter().any(|t| t == "Agent") {
                agent_impls.push(file.clone());
            }
            for (owner, types) in OWNERS {
                assert!(
                    file == owner || !head.iter().any(|t| types.contains(&t.as_str())),
                    "node/{file} implements {types:?}, the state node/{owner} owns: a part's \
                     methods are written in its own module"
                );
            }
        }
        if !TIES.contains(&file.as_str()) {
            for part in PARTS {
                let reach = format!("self.{part}");
                let found = code.match_indices(&reach).any(|(i, _)| {
                    !code[i + reach.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                });
                assert!(
                    !found,
                    "node/{file} reaches `{reach}`, a part the Agent holds: a part takes what \
                     it needs of another as a parameter"
                );
            }
        }
    }
    agent_impls.dedup();
    for file in &agent_impls {
        assert!(
            TIES.contains(&file.as_str()),
            "node/{file} has an `impl Agent`: only {TIES:?} tie the parts together; put the \
             method on the state its module owns and pass the rest as parameters"
        );
    }
    assert_eq!(
        agent_impls, TIES,
        "the Agent is run from mod.rs and its loop is in session.rs"
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
