//! The module graph of a crate, read from its sources, and a check that it
//! has no cycle.
//!
//! Nodes are the crate's top-level modules (`mod x;` in `lib.rs` or
//! `main.rs`); module `a` depends on `b` when a file of `a` names
//! `crate::b` (also inside `crate::{...}` groups). Each folder module
//! (`m/mod.rs`) gets a graph of its own among its children: child `c`
//! depends on sibling `d` when a file of `c` names `super::d` or
//! `crate::m::d`. Comment lines are skipped (doc links are not
//! dependencies), and so is `super::*`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A graph of modules: each name with the names it depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    /// `crate` or the folder module's path (`crate::node`).
    pub scope: String,
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    /// A cycle, as the modules along it (first repeated at the end), if
    /// there is one.
    pub fn cycle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        fn visit(
            g: &Graph,
            n: &str,
            marks: &mut BTreeMap<String, Mark>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            marks.insert(n.to_string(), Mark::Open);
            path.push(n.to_string());
            for m in g.edges.get(n).into_iter().flatten() {
                match marks.get(m).copied().unwrap_or(Mark::New) {
                    Mark::Open => {
                        let start = path.iter().position(|p| p == m).expect("on the path");
                        let mut cycle = path[start..].to_vec();
                        cycle.push(m.clone());
                        return Some(cycle);
                    }
                    Mark::New => {
                        if let Some(c) = visit(g, m, marks, path) {
                            return Some(c);
                        }
                    }
                    Mark::Done => {}
                }
            }
            path.pop();
            marks.insert(n.to_string(), Mark::Done);
            None
        }
        let mut marks = BTreeMap::new();
        for n in self.edges.keys() {
            if marks.get(n).copied().unwrap_or(Mark::New) == Mark::New
                && let Some(c) = visit(self, n, &mut marks, &mut Vec::new())
            {
                return Some(c);
            }
        }
        None
    }
}

/// The graphs of the crate whose sources are under `src`: the top level
/// first, then one per folder module, at every depth.
pub fn crate_graphs(src: &Path) -> std::io::Result<Vec<Graph>> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.exists())
        .ok_or_else(|| {
            std::io::Error::other(format!("no lib.rs or main.rs in {}", src.display()))
        })?;
    let mut graphs = Vec::new();
    folder_graphs(&root, src, "crate", &mut graphs)?;
    Ok(graphs)
}

/// The graph among the modules `file` declares (their files under `dir`),
/// then the same for each that is a folder.
fn folder_graphs(
    file: &Path,
    dir: &Path,
    scope: &str,
    out: &mut Vec<Graph>,
) -> std::io::Result<()> {
    let children = declared_modules(&std::fs::read_to_string(file)?);
    let mut graph = Graph {
        scope: scope.to_string(),
        edges: BTreeMap::new(),
    };
    let mut folders = Vec::new();
    for child in &children {
        let (files, folder) = module_files(dir, child)?;
        let mut deps = BTreeSet::new();
        for f in &files {
            let text = std::fs::read_to_string(f)?;
            for name in referenced(&text, scope) {
                if name != *child && children.contains(&name) {
                    deps.insert(name);
                }
            }
        }
        graph.edges.insert(child.clone(), deps);
        if let Some(mod_rs) = folder {
            folders.push((child.clone(), mod_rs));
        }
    }
    out.push(graph);
    for (child, mod_rs) in folders {
        folder_graphs(
            &mod_rs,
            &dir.join(&child),
            &format!("{scope}::{child}"),
            out,
        )?;
    }
    Ok(())
}

/// `mod x;` and `pub mod x;` declarations (not inline `mod x { ... }`).
fn declared_modules(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter_map(|l| {
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

/// A module's files (`x.rs`, or `x/mod.rs` with everything under `x/`),
/// and its `mod.rs` when it is a folder.
fn module_files(dir: &Path, name: &str) -> std::io::Result<(Vec<PathBuf>, Option<PathBuf>)> {
    let single = dir.join(format!("{name}.rs"));
    let folder = dir.join(name);
    let mut files = Vec::new();
    if single.exists() {
        files.push(single.clone());
    }
    if folder.is_dir() {
        collect_rs(&folder, &mut files)?;
    }
    let mod_rs = if folder.join("mod.rs").exists() {
        Some(folder.join("mod.rs"))
    } else if single.exists() && folder.is_dir() {
        Some(single)
    } else {
        None
    };
    Ok((files, mod_rs))
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            collect_rs(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// The sibling names a file refers to: `crate::x` at the top level; for a
/// folder module's children, `super::x` and `<scope>::x`.
fn referenced(text: &str, scope: &str) -> BTreeSet<String> {
    let prefixes: Vec<String> = if scope == "crate" {
        vec!["crate::".into()]
    } else {
        vec!["super::".into(), format!("{scope}::")]
    };
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = code.split(" //").next().unwrap_or(code);
        for prefix in &prefixes {
            for (i, _) in code.match_indices(prefix.as_str()) {
                // `super::super::x` and `self::super` are not siblings.
                let before = &code[..i];
                let after = &code[i + prefix.len()..];
                if before.ends_with("::")
                    || before.ends_with(|c: char| c.is_alphanumeric() || c == '_')
                {
                    continue;
                }
                if let Some(group) = after.strip_prefix('{') {
                    out.extend(group_heads(group));
                } else {
                    let name: String = after
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != "super" {
                        out.insert(name);
                    }
                }
            }
        }
    }
    out
}

/// The first name of each item of a `{a, b::c, d::{e}}` group (up to its
/// closing brace).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    let mut name = String::new();
    for c in group.chars() {
        let in_name = c.is_alphanumeric() || c == '_';
        if item_start && in_name {
            name.push(c);
            continue;
        }
        if !name.is_empty() {
            // The first name of the item ended.
            heads.push(std::mem::take(&mut name));
            item_start = false;
        }
        match c {
            '{' => {
                depth += 1;
                item_start = false;
            }
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            _ => {}
        }
    }
    if !name.is_empty() {
        heads.push(name);
    }
    heads.retain(|h| h != "self" && h != "super");
    heads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_groups_are_read() {
        let text = "use crate::{a, b::{c, d}, e::f as g};\n// crate::commented\nlet x = crate::h::run();\nuse super::*;\n";
        let got = referenced(text, "crate");
        assert_eq!(got.into_iter().collect::<Vec<_>>(), ["a", "b", "e", "h"]);
        let got = referenced(
            "use super::{conn::send, Agent};\nsuper::super::x();\ncrate::node::state::f();\n",
            "crate::node",
        );
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            ["Agent", "conn", "state"]
        );
    }

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = d.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    #[test]
    fn finds_a_cycle_at_the_top_and_among_a_folders_children() {
        let d = tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\nmod c;\n"),
            ("a.rs", "use crate::b::B;\n"),
            ("b.rs", "use crate::c;\n"),
            ("c/mod.rs", "mod x;\nmod y;\n"),
            ("c/x.rs", "use super::y::Y;\n"),
            ("c/y.rs", "fn f() { crate::c::x::g() }\n"),
        ]);
        let graphs = crate_graphs(d.path()).unwrap();
        assert_eq!(graphs[0].scope, "crate");
        assert_eq!(graphs[0].cycle(), None);
        assert_eq!(graphs[1].scope, "crate::c");
        assert_eq!(
            graphs[1].cycle(),
            Some(vec!["x".to_string(), "y".into(), "x".into()])
        );
        // Close the loop at the top level too.
        std::fs::write(d.path().join("c/y.rs"), "use crate::a;\n").unwrap();
        let graphs = crate_graphs(d.path()).unwrap();
        let cycle = graphs[0].cycle().expect("a → b → c → a");
        assert_eq!(cycle.first(), cycle.last());
        assert_eq!(cycle.len(), 4);
        assert_eq!(graphs[1].cycle(), None);
    }
}
