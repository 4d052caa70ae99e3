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

/// The control plane links no node code: neither the agent nor its fake
/// hardware (nor the bcd binary, nor the D-Bus and nftables crates the
/// node converges with) is among what `better-compute` builds with; the
/// simulator that runs them is `bc-sim`, a crate of its own.
#[test]
fn the_control_plane_links_neither_the_agent_nor_fake_hardware() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = |package: &str| {
        let out = std::process::Command::new(&cargo)
            .current_dir(workspace())
            .args([
                "tree",
                "--offline",
                "-e",
                "normal",
                "--prefix",
                "none",
                "-p",
                package,
            ])
            .output()
            .expect("cargo tree");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let node_code = |tree: &str| -> Vec<String> {
        let mut v: Vec<String> = tree
            .lines()
            .filter_map(|l| l.split(' ').next())
            .filter(|c| ["bcd-agent", "bcd-fakehw", "bcd", "zbus", "nftables"].contains(c))
            .map(String::from)
            .collect();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(node_code(&tree("better-compute")), Vec::<String>::new());
    // What the check looks for is there to find where it is linked.
    assert_eq!(
        node_code(&tree("bc-sim")),
        ["bcd-agent", "bcd-fakehw", "nftables", "zbus"]
    );
}

#[test]
fn the_store_modules_form_no_cycle() {
    assert_acyclic(&workspace().join("server/store/src"));
}

/// The layers point one way: the API does not reach into the gateway, the
/// controllers or the CLI; nothing but the CLI starts a server.
#[test]
fn the_server_layers_point_down() {
    let g = top_level(&workspace().join("server/src")).unwrap();
    let names = |m: &str| g.edges.get(m).cloned().unwrap_or_default();
    for m in ["gateway", "controllers", "cli", "serve"] {
        assert!(!names("api").contains(m), "api names {m}");
    }
    for m in ["api", "gateway", "controllers", "boot", "pki", "check"] {
        assert!(!names(m).contains("serve"), "{m} names serve");
        assert!(!names(m).contains("cli"), "{m} names cli");
    }
}

/// The signer boundary: the gateway's code reaches no key. It names
/// nothing in `pki` (the fleet CA, the worker key, what it signs), nor the
/// join service, its port server or the operator credential in `api`; it
/// reaches the join service only through `gateway::port`.
#[test]
fn the_gateway_reaches_no_key() {
    let dir = workspace().join("server/src/gateway");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        seen += 1;
        for banned in [
            "crate::pki",
            "pki::",
            "api::join",
            "api::gateway_port",
            "api::auth",
            "Ed25519KeyPair",
            "worker_key",
            "ca.key",
            "AdminService",
        ] {
            assert!(!text.contains(banned), "{} names {banned}", path.display());
        }
    }
    assert!(seen >= 8, "the gateway's files were read");
    // Nor the store's key-holder calls: the gateway, and the controllers
    // a gateway-only process runs, hold a GatewayStore.
    let keyless = [
        "server/src/controllers/liveness.rs",
        "server/src/controllers/lease.rs",
    ];
    for path in std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .chain(keyless.iter().map(|p| workspace().join(p)))
    {
        let text = std::fs::read_to_string(&path).unwrap();
        let names_store = text
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .any(|w| w == "Store" || w == "bc_store::Store" || w == "Backend");
        assert!(
            !names_store,
            "{} names the whole store: a gateway holds a GatewayStore",
            path.display()
        );
    }
    let g = top_level(&workspace().join("server/src")).unwrap();
    assert!(
        !g.edges
            .get("gateway")
            .cloned()
            .unwrap_or_default()
            .contains("pki"),
        "gateway names pki"
    );
}

/// The store's dependencies: no tonic, no protobuf, no fleet
/// certificates, no HTTP. A backend is SQL plus the shared decisions. The
/// one exception is the PostgreSQL link's own TLS (rustls, through
/// tokio-postgres-rustls), which lives in `postgres/connect.rs` alone.
#[test]
fn the_store_knows_nothing_of_the_wire() {
    let manifest = std::fs::read_to_string(workspace().join("server/store/Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .expect("a [dependencies] table");
    let database_tls = ["tokio-postgres-rustls", "rustls.", "rustls-pki-types."];
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
            !deps.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with(banned) && !database_tls.iter().any(|t| l.starts_with(t))
            }),
            "bc-store depends on {banned}"
        );
    }
    // Only the database link's module names rustls.
    let src = workspace().join("server/store/src");
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs")
                && path != src.join("postgres/connect.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                let named = text.lines().any(|l| {
                    let l = l.trim_start();
                    !l.starts_with("//")
                        && (l.contains("rustls::") || l.contains("rustls_pki_types"))
                });
                assert!(!named, "{} names rustls", path.display());
            }
        }
    }
}

/// One clock: clippy refuses the host's clock reads (`clippy.toml`), and
/// the only code allowed to make them is each crate's clock module, unit
/// tests (a crate root's `cfg_attr(test, ...)`), integration tests,
/// examples and benchmarks, and the swtpm harness they use.
#[test]
fn the_host_clock_is_read_in_clock_modules_only() {
    let root = workspace();
    let config = std::fs::read_to_string(root.join("clippy.toml")).expect("clippy.toml");
    for method in [
        "std::time::Instant::now",
        "std::time::SystemTime::now",
        "time::OffsetDateTime::now_utc",
    ] {
        assert!(
            config.contains(&format!("path = \"{method}\"")),
            "clippy.toml does not disallow {method}"
        );
    }
    let clock_modules = [
        "bcd/sys/src/clock.rs",
        "server/src/clock.rs",
        "server/store/src/clock.rs",
    ];
    let exempt = |rel: &str| {
        rel.starts_with("tests/")
            || rel
                .split('/')
                .any(|d| d == "tests" || d == "examples" || d == "benches")
            || rel.contains("/src/bin/bench")
            || rel.ends_with("-bench.rs")
            || rel == "bcd/tpm/src/swtpm.rs"
    };
    let mut stack = vec![root.clone()];
    let mut allowed = Vec::new();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "fuzz" {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines().filter(|l| {
                let l = l.trim_start();
                !l.starts_with("//") && l.contains("clippy::disallowed_methods")
            }) {
                let line = line.trim();
                let unit_tests = line == "#![cfg_attr(test, allow(clippy::disallowed_methods))]"
                    && rel.ends_with("src/lib.rs");
                if clock_modules.contains(&rel.as_str()) || unit_tests || exempt(&rel) {
                    allowed.push(rel.clone());
                    continue;
                }
                panic!(
                    "{rel} allows the host's clock outside a clock module ({line}): read it \
                     through the crate's clock module, or take the time as a parameter"
                );
            }
        }
    }
    for module in clock_modules {
        assert!(
            allowed.iter().any(|a| a == module),
            "{module} is a clock module but reads no clock"
        );
    }
}

/// The fleet's ids are types in the store (`bc_store::id`): every
/// argument of the store's operations (`backend.rs`) and of the bodies they
/// run (`sql/`) that names a node, gateway, command, operator, token,
/// image or release, and every public field of the store's rows and inputs
/// that holds one, is its id type, never `str`, `String` or (a release's
/// sequence) `u64`, so one kind of id cannot be passed where another is
/// asked. An argument or field called `id` is one of these unless it names
/// a rollout, a backup or an enrolment (ids of kinds of their own), and a
/// gateway's `name` is its id.
#[test]
fn the_store_names_ids_by_their_types() {
    let src = workspace().join("server/store/src");
    let id_names = [
        "node",
        "node_id",
        "session_node",
        "gateway_id",
        "command_id",
        "command_ids",
        "rollback_id",
        "journal_running",
        "journal_done",
        "image_id",
        "token_id",
        "operator_id",
        "sequence",
    ];
    // Ids of kinds outside the fleet's seven.
    let other_ids = ["rollout", "backup", "enrolment", "machines::", "lease"];
    let untyped = |ty: &str| {
        let ty = ty.trim().trim_end_matches(',');
        ["str", "String", "u64"].iter().any(|t| {
            ty.split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|word| word == *t)
        })
    };
    let textual = |ty: &str| {
        ty.split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|word| word == "str" || word == "String")
    };
    let rule = |name: &str, ty: &str, within: &str| -> bool {
        let within = within.to_ascii_lowercase();
        if id_names.contains(&name) {
            return !untyped(ty);
        }
        if name == "id" || name == "ids" {
            return !textual(ty) || other_ids.iter().any(|k| within.contains(k));
        }
        if name == "name" && within.contains("gateway") {
            return !textual(ty);
        }
        true
    };
    // The operations' and their bodies' parameters, one or more a line;
    // `within` is the operation or function they belong to.
    let mut files = vec![src.join("backend.rs")];
    for e in std::fs::read_dir(src.join("sql")).unwrap() {
        files.push(e.unwrap().path());
    }
    let mut broken = Vec::new();
    let mut judge = |name: &str, ty: &str, within: &str, path: &std::path::Path, line: usize| {
        if !rule(name, ty, within) {
            broken.push(format!(
                "{}:{line}: `{name}: {ty}` in {within} takes or holds an id as text",
                path.display()
            ));
        }
    };
    let mut checked = 0;
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        // A body in `sql/` is named with its domain (`rollouts::get`).
        let domain = match path.parent().and_then(|p| p.file_name()) {
            Some(d) if d == "sql" => {
                format!("{}::", path.file_stem().unwrap().to_string_lossy())
            }
            _ => String::new(),
        };
        let mut within = String::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            // Signatures, not a body's locals.
            if line.starts_with("//") || line.starts_with("let ") {
                continue;
            }
            if let Some(name) = operation(line) {
                within = format!("{domain}{name}");
            }
            for (name, ty) in params(line) {
                if id_names.contains(&name) || name == "id" || name == "ids" || name == "name" {
                    checked += 1;
                }
                judge(name, ty, &within, path, n + 1);
            }
        }
    }
    assert!(checked > 100, "the id parameters were found ({checked})");
    // The public fields of the rows and inputs; `within` is their struct.
    let mut fields = 0;
    for path in bc_tests::module_graph::rust_files(&src).unwrap() {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut within = String::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if let Some(rest) = line
                .strip_prefix("pub struct ")
                .or_else(|| line.strip_prefix("pub enum "))
            {
                within = rest
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap_or("")
                    .to_string();
            }
            let Some(field) = line.strip_prefix("pub ") else {
                continue;
            };
            let Some((name, ty)) = field.split_once(": ") else {
                continue;
            };
            if id_names.contains(&name) || name == "id" || name == "name" {
                fields += 1;
            }
            judge(name, ty, &within, &path, n + 1);
        }
    }
    assert!(fields > 50, "the rows' id fields were found ({fields})");
    assert!(
        broken.is_empty(),
        "ids taken or held as text (use their types from bc_store::id):\n{}",
        broken.join("\n")
    );
}

/// The operation or function a line declares: `read name(`, `write
/// name(`, `snapshot name(`, `recording name(`, `fn name(`.
fn operation(line: &str) -> Option<&str> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| ["read", "write", "snapshot", "recording", "fn"].contains(w))?;
    let next = words.get(at + 1)?;
    let name = next.split(['(', '<']).next()?;
    (!name.is_empty() && next.len() > name.len()).then_some(name)
}

/// `name: type` pairs declared on one line of a signature: each
/// `ident: type` up to the next top-level comma or closing parenthesis.
fn params(line: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while let Some(at) = line[i..].find(": ") {
        let colon = i + at;
        let start = line[..colon]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let name = &line[start..colon];
        let mut depth = 0i32;
        let mut end = colon + 2;
        while end < bytes.len() {
            match bytes[end] {
                b'<' | b'(' | b'[' => depth += 1,
                b'>' if end > 0 && bytes[end - 1] == b'-' => {}
                b'>' | b']' => depth -= 1,
                b')' if depth == 0 => break,
                b')' => depth -= 1,
                b',' if depth == 0 => break,
                _ => {}
            }
            end += 1;
        }
        if !name.is_empty() {
            out.push((name, &line[colon + 2..end]));
        }
        i = end.max(colon + 2);
    }
    out
}

/// Closed sets travel as enums: no string field of the protocol is named
/// for a kind, role, section, state, status or outcome, except the event
/// kinds, an open set (a node of a newer release journals kinds this one
/// does not know, and the server keeps them as sent).
#[test]
fn the_wire_names_closed_sets_by_enums() {
    const OPEN: [&str; 4] = [
        "Event.kind",
        "EventReceipt.kind",
        "ListEventsRequest.kind",
        "FleetEvent.kind",
    ];
    let proto = std::fs::read_to_string(workspace().join("bcd/proto/proto/bcd.proto")).unwrap();
    let closed = |name: &str| {
        ["kind", "role", "section", "state", "status", "outcome"]
            .iter()
            .any(|w| name == *w || name.ends_with(&format!("_{w}")))
    };
    let mut message = String::new();
    let mut strings = 0;
    for (n, line) in proto.lines().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["message", name, "{", ..] => message = name.to_string(),
            ["string", name, "=", ..] | ["repeated", "string", name, "=", ..] => {
                strings += 1;
                let field = format!("{message}.{name}");
                assert!(
                    !closed(name) || OPEN.contains(&field.as_str()),
                    "bcd.proto:{}: {field} is a string named for a closed set: make it an enum, \
                     reserve the string's number and pin the new encoding with a golden file",
                    n + 1
                );
            }
            _ => {}
        }
    }
    assert!(
        strings > 100,
        "the protocol's string fields were read ({strings})"
    );
}
