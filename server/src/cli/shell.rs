//! `completions SHELL` and `man --out DIR`: what a package ships beside
//! the binary, generated from the same definitions the parser uses, so
//! they never drift from it.

use std::path::{Path, PathBuf};

use clap::Command;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  better-compute completions bash > /etc/bash_completion.d/better-compute\n  better-compute completions zsh > ~/.zfunc/_better-compute"
)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell. Bash:
    /// `better-compute completions bash > /etc/bash_completion.d/better-compute`.
    shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  better-compute man --out /usr/share/man/man1\n  better-compute man --out target/man && man -l target/man/better-compute-nodes-list.1"
)]
pub struct ManArgs {
    /// The directory the pages go to (made if missing): better-compute.1,
    /// and one page per command and subcommand (better-compute-nodes-list.1).
    #[arg(long)]
    out: PathBuf,
}

/// Prints the completion script for `shell` to stdout.
pub fn completions(a: CompletionsArgs, mut cmd: Command) -> anyhow::Result<()> {
    let name = cmd.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, name.clone(), &mut script);
    let mut script = String::from_utf8_lossy(&script).into_owned();
    if a.shell == clap_complete::Shell::Bash {
        script = bash_states_agree(&script, &name);
    }
    super::output::emit(&script)
}

/// clap_complete's bash script spells a hyphenated binary's states two
/// ways (clap-rs/clap#6421): the loop that walks the words arrives at
/// `better__compute__subcmd__nodes`, the case arms wait for
/// `better__subcmd__compute__subcmd__nodes`, so nothing past the first
/// word completes. The arms are spelled as the loop spells them.
fn bash_states_agree(script: &str, name: &str) -> String {
    let arms = name.replace('-', "__subcmd__");
    let walked = name.replace('-', "__");
    if arms == walked {
        return script.to_string();
    }
    script.replace(&arms, &walked)
}

/// Writes a page for the command and every visible subcommand under it;
/// the files written.
pub fn man(a: ManArgs, cmd: Command) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(&a.out)
        .map_err(|e| anyhow::anyhow!("cannot make {}: {e}", a.out.display()))?;
    let mut written = Vec::new();
    let mut cmd = cmd;
    cmd.build();
    pages(&cmd, cmd.get_name(), &a.out, &mut written)?;
    let listed: String = written
        .iter()
        .map(|p| format!("{}\n", p.display()))
        .collect();
    super::output::emit(&listed)?;
    Ok(written)
}

fn pages(cmd: &Command, name: &str, out: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    // Each page is named as `man` finds it: better-compute-nodes-list(1).
    let page = cmd.clone().name(name.to_string());
    let path = out.join(format!("{name}.1"));
    let mut bytes = Vec::new();
    clap_mangen::Man::new(page).render(&mut bytes)?;
    std::fs::write(&path, bytes)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        pages(sub, &format!("{name}-{}", sub.get_name()), out, written)?;
    }
    Ok(())
}
