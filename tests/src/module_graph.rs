//! The import graph of a crate's modules, read from its source: which
//! top-level modules name which (`crate::x`), and, inside each folder
//! module, which children name which (`super::y`, `crate::folder::y`).
//! The architecture tests assert these graphs have no cycle, so each
//! layer depends only on the ones below it.
//!
//! It reads source text, not the compiler's view: a path in code (or in a
//! trailing comment) counts; whole-line comments, doc comments included,
//! do not. That errs toward finding a dependency, never toward missing
//! one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module name → the modules it names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleGraph {
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

impl ModuleGraph {
    /// A cycle, as the path that closes it (`a → b → a`), if there is one.
    pub fn cycle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Open,
            Done,
        }
        fn visit(
            g: &ModuleGraph,
            n: &str,
            marks: &mut BTreeMap<String, Mark>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            match marks.get(n) {
                Some(Mark::Done) => return None,
                Some(Mark::Open) => {
                    let start = path.iter().position(|p| p == n).expect("on the path");
                    let mut cycle = path[start..].to_vec();
                    cycle.push(n.to_string());
                    return Some(cycle);
                }
                None => {}
            }
            marks.insert(n.to_string(), Mark::Open);
            path.push(n.to_string());
            for m in g.edges.get(n).into_iter().flatten() {
                if let Some(c) = visit(g, m, marks, path) {
                    return Some(c);
                }
            }
            path.pop();
            marks.insert(n.to_string(), Mark::Done);
            None
        }
        let mut marks = BTreeMap::new();
        for n in self.edges.keys() {
            if let Some(c) = visit(self, n, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
        None
    }
}

/// The modules declared directly in `dir` (`x.rs` or `x/mod.rs`), except
/// the crate roots and `mod.rs` itself, each with the files that make it
/// up.
fn modules_in(dir: &Path) -> std::io::Result<BTreeMap<String, Vec<PathBuf>>> {
    let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path
            .file_stem()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        if path.is_dir() {
            out.entry(name).or_default().extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !matches!(name.as_str(), "lib" | "main" | "mod")
        {
            out.entry(name).or_default().push(path);
        }
    }
    Ok(out)
}

/// Every `.rs` file under `dir`, recursively, sorted.
pub fn rust_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// The source without whole-line comments.
fn code(path: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n"))
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first segments of every path that starts with `prefix` (e.g.
/// `crate::`), including each item of a `prefix{a, b::c}` group.
fn named_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices(prefix) {
        // `$crate::` in a macro is the crate too; `my_crate::` is not.
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        out.insert(ident(&group[j..]).to_string());
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest).to_string());
        }
    }
    out.remove("");
    out
}

/// The graph of a crate's top-level modules (`src` is its source folder).
pub fn top_level(src: &Path) -> std::io::Result<ModuleGraph> {
    let modules = modules_in(src)?;
    let mut g = ModuleGraph::default();
    for (name, files) in &modules {
        let mut to = BTreeSet::new();
        for f in files {
            let text = code(f)?;
            to.extend(named_after(&text, "crate::"));
            // A top-level file's `super` is the crate root.
            if f.parent() == Some(src) {
                to.extend(named_after(&text, "super::"));
            }
        }
        to.retain(|m| m != name && modules.contains_key(m));
        g.edges.insert(name.clone(), to);
    }
    Ok(g)
}

/// The graph among the children of the folder module `folder` (a path
/// under `src`, e.g. `api` or `gateway`).
pub fn children(src: &Path, folder: &str) -> std::io::Result<ModuleGraph> {
    let dir = src.join(folder);
    let modules = modules_in(&dir)?;
    let absolute = format!("crate::{}::", folder.replace('/', "::"));
    let mut g = ModuleGraph::default();
    for (name, files) in &modules {
        let mut to = BTreeSet::new();
        for f in files {
            let text = code(f)?;
            to.extend(named_after(&text, &absolute));
            // A child file's `super` is the folder module.
            if f.parent() == Some(dir.as_path()) {
                to.extend(named_after(&text, "super::"));
            }
        }
        to.retain(|m| m != name && modules.contains_key(m));
        g.edges.insert(name.clone(), to);
    }
    Ok(g)
}

/// Every folder module under `src`, as paths relative to it.
pub fn folders(src: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for f in rust_files(src)? {
        if f.file_name().is_some_and(|n| n == "mod.rs")
            && let Some(dir) = f.parent()
            && let Ok(rel) = dir.strip_prefix(src)
        {
            out.push(rel.to_string_lossy().to_string());
        }
    }
    Ok(out)
}

/// Panics, naming the cycle, if the crate at `src` has one among its
/// top-level modules or among the children of any folder module.
pub fn assert_acyclic(src: &Path) {
    let g = top_level(src).expect("read the sources");
    assert!(!g.edges.is_empty(), "no modules under {}", src.display());
    if let Some(c) = g.cycle() {
        panic!(
            "{}: the modules import each other in a cycle: {}",
            src.display(),
            c.join(" → ")
        );
    }
    for folder in folders(src).expect("read the sources") {
        let g = children(src, &folder).expect("read the sources");
        if let Some(c) = g.cycle() {
            panic!(
                "{}/{folder}: its modules import each other in a cycle: {}",
                src.display(),
                c.join(" → ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, file: &str, text: &str) {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn paths_and_groups_name_modules_and_comments_do_not() {
        let text = "use crate::{a, b::c, d::{e, f}};\nlet x = crate::g::h();\n$crate::i::j\nother_crate::k";
        let got: Vec<String> = named_after(text, "crate::").into_iter().collect();
        assert_eq!(got, ["a", "b", "d", "g", "i"]);
    }

    #[test]
    fn cycles_are_found_and_named() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path();
        write(src, "lib.rs", "mod a; mod b; mod c;");
        write(
            src,
            "a.rs",
            "use crate::b::X;\n/// crate::c is only mentioned here",
        );
        write(src, "b/mod.rs", "mod x; mod y;\npub use x::X;");
        write(src, "b/x.rs", "use super::y::Y; use crate::c::Z;");
        write(src, "b/y.rs", "pub struct Y;");
        write(src, "c.rs", "pub struct Z;");
        let g = top_level(src).unwrap();
        assert_eq!(g.edges["a"], BTreeSet::from(["b".to_string()]));
        assert_eq!(g.cycle(), None);
        assert_eq!(folders(src).unwrap(), vec!["b".to_string()]);
        assert_eq!(children(src, "b").unwrap().cycle(), None);
        // c now names a, closing a → b → c → a.
        write(src, "c.rs", "pub struct Z(crate::a::A);");
        assert_eq!(
            top_level(src).unwrap().cycle(),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
        // Siblings in a folder: y names x back.
        write(src, "b/y.rs", "use crate::b::x::X;");
        assert_eq!(
            children(src, "b").unwrap().cycle(),
            Some(vec!["x".into(), "y".into(), "x".into()])
        );
    }
}
