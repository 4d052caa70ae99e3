//! The global `-o json` (and `BC_OUTPUT=json`) prints what each verb's own
//! `--json` does; `-o table` and the default print for people; a format
//! the CLI does not know is refused with the ones it does.

use bc_tests::{setup_connected, stderr};

/// The JSON a command printed, its numbers zeroed (ages and times move
/// between two calls; the shape and the words must not).
fn json_of(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    fn zeroed(v: serde_json::Value) -> serde_json::Value {
        use serde_json::Value::*;
        match v {
            Number(_) => Number(0.into()),
            Array(a) => Array(a.into_iter().map(zeroed).collect()),
            Object(o) => Object(o.into_iter().map(|(k, v)| (k, zeroed(v))).collect()),
            other => other,
        }
    }
    zeroed(v)
}

#[test]
fn the_global_output_format_is_each_verbs_json() {
    let (_d, server, _node, id) = setup_connected(81);
    for verb in [
        &["nodes", "list"][..],
        &["tokens", "list"],
        &["nodes", "spec", &id],
    ] {
        let own: Vec<&str> = verb.iter().copied().chain(["--json"]).collect();
        let global: Vec<&str> = ["-o", "json"]
            .into_iter()
            .chain(verb.iter().copied())
            .collect();
        let after: Vec<&str> = verb.iter().copied().chain(["--output", "json"]).collect();
        let own = json_of(&server.cli(&own));
        assert_eq!(json_of(&server.cli(&global)), own, "{verb:?}");
        assert_eq!(json_of(&server.cli(&after)), own, "{verb:?}");
        let env = server
            .cli_command(verb)
            .env("BC_OUTPUT", "json")
            .output()
            .unwrap();
        assert_eq!(json_of(&env), own, "{verb:?} with BC_OUTPUT=json");
    }
    let table = server.cli(&["-o", "table", "nodes", "list"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("NODE") && text.contains(&id), "{text}");
    // -o wide: the same columns, then more, each row aligned under its
    // header.
    let wide = server.cli(&["-o", "wide", "nodes", "list"]);
    assert!(wide.status.success(), "{}", stderr(&wide));
    let wide = String::from_utf8_lossy(&wide.stdout).to_string();
    let header = wide.lines().next().unwrap();
    for column in [
        "NODE",
        "HOSTNAME",
        "MACS",
        "CONDITIONS",
        "TAINTS",
        "BOOT",
        "TPM EK",
    ] {
        assert!(header.contains(column), "{column} in {header}");
    }
    assert!(
        !text.lines().next().unwrap().contains("CONDITIONS"),
        "{text}"
    );
    let row = wide
        .lines()
        .find(|l| l.starts_with(&id))
        .expect("the node's row");
    let at = |l: &str, from: usize| l[from..].find(|c: char| c != ' ').map(|i| i + from);
    let state = header.find("STATE").unwrap();
    assert_eq!(at(row, state), Some(state), "STATE aligned: {wide}");
    assert!(row[state..].starts_with("connected"), "{wide}");
    let bad = server.cli(&["-o", "yaml", "nodes", "list"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("possible values: table, wide, json"),
        "{}",
        stderr(&bad)
    );
}
