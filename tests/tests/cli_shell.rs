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
