//! What a package ships beside `better-compute`: the bash completion
//! script, loaded and asked by a real bash as a terminal would, and the
//! manual pages, rendered by man.

use std::process::Command;

use bc_tests::{bin, stderr};

/// What bash completes for the words typed so far (the last one being
/// completed; the first names the program), with the script the program's
/// `completions bash` prints.
fn complete(words: &[&str]) -> Vec<String> {
    complete_with(&bin("better-compute"), words)
}

fn complete_with(program: &std::path::Path, words: &[&str]) -> Vec<String> {
    let script = Command::new(program)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(script.status.success(), "{}", stderr(&script));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("better-compute.bash");
    std::fs::write(&file, &script.stdout).unwrap();
    let line = words.join(" ");
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'
         func=$(complete -p {} | sed -E 's/.*-F ([^ ]+) .*/\\1/')
         COMP_WORDS=({})
         COMP_CWORD={}
         COMP_LINE='{line}'
         COMP_POINT={}
         \"$func\" {} '{}' '{}'
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        file.display(),
        words[0],
        quoted.join(" "),
        words.len() - 1,
        line.len(),
        words[0],
        words[words.len() - 1],
        words[words.len().saturating_sub(2)],
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn bash_completes_commands_subcommands_and_flags() {
    let top = complete(&["better-compute", "no"]);
    assert_eq!(top, vec!["nodes"], "{top:?}");
    let mut nodes = complete(&["better-compute", "nodes", "a"]);
    nodes.sort();
    assert_eq!(nodes, vec!["access", "assign"], "{nodes:?}");
    let flags = complete(&["better-compute", "nodes", "assign", "--se"]);
    assert!(
        flags.contains(&"--secret".to_string()) && flags.contains(&"--server".to_string()),
        "{flags:?}"
    );
    // Every shell clap knows gets a script.
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(bin("better-compute"))
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("better-compute"),
            "{shell}"
        );
    }
    let out = Command::new(bin("better-compute"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("possible values"), "{}", stderr(&out));
}

#[test]
fn a_manual_page_for_every_command_renders() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin("better-compute"))
        .args(["man", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let listed = String::from_utf8_lossy(&out.stdout).lines().count();
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    assert_eq!(listed, pages.len());
    for want in [
        "better-compute.1",
        "better-compute-nodes.1",
        "better-compute-nodes-assign.1",
        "better-compute-secrets-put.1",
        "better-compute-exec.1",
        "better-compute-man.1",
    ] {
        assert!(pages.contains(&want.to_string()), "{want} in {pages:?}");
    }
    assert!(
        !pages.iter().any(|p| p.ends_with("-help.1")),
        "help gets no page: {pages:?}"
    );
    for page in &pages {
        let shown = Command::new("man")
            .arg("-l")
            .arg(dir.path().join(page))
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "0")
            .output()
            .unwrap();
        assert!(shown.status.success(), "{page}: {}", stderr(&shown));
        // Bold and underline come as overstrikes (X BACKSPACE X): read
        // the text as a terminal shows it.
        let mut text = String::new();
        for c in String::from_utf8_lossy(&shown.stdout).chars() {
            if c == '\u{8}' {
                text.pop();
            } else {
                text.push(c);
            }
        }
        let name = page.trim_end_matches(".1");
        assert!(
            text.contains("NAME") && text.contains(name),
            "{page}: {text}"
        );
    }
}

/// The command tree as `--help` shows it, each path's help read once.
#[derive(Debug, Default)]
struct Helps(std::collections::HashMap<Vec<String>, String>);

impl Helps {
    /// `better-compute PATH... --help`.
    fn of(&mut self, path: &[String]) -> &str {
        self.0.entry(path.to_vec()).or_insert_with(|| {
            let out = Command::new(bin("better-compute"))
                .args(path)
                .arg("--help")
                .output()
                .unwrap();
            assert!(out.status.success(), "{path:?} --help: {}", stderr(&out));
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    }

    /// The subcommands a path's help lists (its "Commands:"), help aside.
    fn children(&mut self, path: &[String]) -> Vec<String> {
        let help = self.of(path);
        let Some((_, listed)) = help.split_once("\nCommands:\n") else {
            return Vec::new();
        };
        listed
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| *name != "help")
            .map(String::from)
            .collect()
    }

    /// Every flag a path's help lists as an option (`-o`, `--output`), not
    /// the ones its prose mentions.
    fn flags(&mut self, path: &[String]) -> Vec<String> {
        let mut flags = Vec::new();
        for line in self.of(path).lines() {
            let spec = line.trim_start();
            let indent = line.len() - spec.len();
            if (indent == 2 || indent == 6) && spec.starts_with('-') {
                for word in spec.split([' ', ',', '=']) {
                    if word.starts_with('-') && word.len() > 1 {
                        flags.push(word.to_string());
                    }
                }
            }
        }
        flags
    }
}

/// The lines under "Examples:" in a help text, a line ending in `\`
/// joined with the next; None without the section.
fn examples_in(help: &str) -> Option<Vec<String>> {
    let (_, section) = help.split_once("\nExamples:\n")?;
    let mut examples: Vec<String> = Vec::new();
    let mut continued = false;
    for line in section.lines().take_while(|l| !l.trim().is_empty()) {
        let text = line.trim();
        let (text, more) = match text.strip_suffix('\\') {
            Some(t) => (t.trim_end(), true),
            None => (text, false),
        };
        match examples.last_mut() {
            Some(last) if continued => {
                last.push(' ');
                last.push_str(text);
            }
            _ => examples.push(text.to_string()),
        }
        continued = more;
    }
    Some(examples)
}

/// A command line's words as a shell splits them, quotes removed; each
/// with whether it was quoted (a quoted `|` is no pipe).
fn shell_words(line: &str) -> Vec<(String, bool)> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut open, mut in_quote) = (false, false, None);
    for c in line.chars() {
        match (in_quote, c) {
            (Some(q), c) if c == q => in_quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                in_quote = Some(c);
                quoted = true;
                open = true;
            }
            (None, c) if c.is_whitespace() => {
                if open {
                    words.push((std::mem::take(&mut word), quoted));
                }
                (quoted, open) = (false, false);
            }
            (None, c) => {
                word.push(c);
                open = true;
            }
        }
    }
    if open {
        words.push((word, quoted));
    }
    words
}

/// Every leaf command's help shows examples, and every example names a
/// command that exists and only flags that command takes: its words until
/// `--` or a pipe or redirection walk the tree from the root, and each
/// `-x`/`--flag` among them must be one its help lists.
#[test]
fn every_command_has_examples_that_name_real_commands_and_flags() {
    let mut helps = Helps::default();
    let mut leaves = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let children = helps.children(&path);
        if children.is_empty() {
            leaves.push(path);
            continue;
        }
        for child in children {
            let mut sub = path.clone();
            sub.push(child);
            todo.push(sub);
        }
    }
    leaves.sort();
    assert!(
        leaves.len() > 50 && leaves.contains(&vec!["nodes".into(), "assign".into()]),
        "the walk found too few commands: {leaves:?}"
    );
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    for leaf in &leaves {
        let shown = leaf.join(" ");
        let examples: Vec<String> = examples_in(helps.of(leaf))
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.starts_with("better-compute "))
            .collect();
        if examples.is_empty() {
            missing.push(shown.clone());
        }
        for example in examples {
            let mut path: Vec<String> = Vec::new();
            let mut used = Vec::new();
            for (word, quoted) in shell_words(&example).into_iter().skip(1) {
                if !quoted && ["--", "|", "||", "&&", ";", ">", ">>", "<", "2>"].contains(&&*word) {
                    break;
                }
                if !quoted && word.starts_with('-') && word.len() > 1 {
                    let flag = word.split('=').next().unwrap_or(&word).to_string();
                    used.push(flag);
                } else if helps.children(&path).contains(&word) {
                    path.push(word);
                }
            }
            if !helps.children(&path).is_empty() {
                wrong.push(format!(
                    "{shown}: `{example}` names no command below `{}`",
                    path.join(" ")
                ));
                continue;
            }
            let known = helps.flags(&path);
            for flag in used.iter().filter(|f| !known.contains(f)) {
                wrong.push(format!(
                    "{shown}: `{example}`: {} takes no {flag}",
                    path.join(" ")
                ));
            }
        }
    }
    assert!(
        missing.is_empty() && wrong.is_empty(),
        "commands whose help shows no examples (after_help = \"Examples:\\n  better-compute ...\"):\n{}\n\
         examples that do not parse:\n{}",
        missing.join("\n"),
        wrong.join("\n")
    );
}

#[test]
fn bash_completes_the_static_bcd_too() {
    let bcd = bc_tests::static_bcd();
    let mut top = complete_with(&bcd, &["bcd", "do"]);
    top.sort();
    assert_eq!(top, vec!["doctor"], "{top:?}");
    let flags = complete_with(&bcd, &["bcd", "node", "--tunnel-l"]);
    assert_eq!(flags, vec!["--tunnel-lifetime"], "{flags:?}");
    // Bash only, said so by clap with the values it takes.
    let out = Command::new(&bcd)
        .args(["completions", "zsh"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("possible values: bash"),
        "{}",
        stderr(&out)
    );
}
