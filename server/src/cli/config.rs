//! `serve --config FILE` and the environment: every flag of `serve` (the
//! global ones included) can come from a TOML file or a `BC_*` variable.
//!
//! The file's keys are the flags' long names without the dashes
//! (`listen = "0.0.0.0:7443"`, `handshake-rate = 500`, `x509pop = true`,
//! `san = ["gw.example", "10.0.0.2"]`). What decides, strongest first: the
//! command line, the variable, the file, the default. A key that is no flag
//! of `serve` is an error that names it and the file, so a typo never
//! passes silently; so is a value of the wrong shape.
//!
//! The file's values become flags: after a first parse, every key whose
//! flag neither the command line nor its variable set is appended as
//! `--key=value` (each element of an array as a flag of its own, a `true`
//! switch as the bare flag) and the command line is parsed again, so a
//! value from the file is checked by the same parser as one typed.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, bail};
use clap::parser::ValueSource;

/// The variable naming the config file when `--config` is not given.
pub const CONFIG_VAR: &str = "BC_CONFIG";

/// The variable a flag reads: `BC_` and its long name in upper snake case
/// (`--handshake-rate`: `BC_HANDSHAKE_RATE`).
pub fn env_name(long: &str) -> String {
    format!("BC_{}", long.replace('-', "_").to_ascii_uppercase())
}

/// `cmd` with a variable for every flag of `serve` that has none yet.
pub fn with_env(cmd: clap::Command) -> clap::Command {
    cmd.mut_subcommand("serve", |serve| {
        serve.mut_args(|a| match a.get_long() {
            Some(long) if a.get_env().is_none() && long != "help" && !a.is_hide_set() => {
                let name = env_name(long);
                a.env(name)
            }
            _ => a,
        })
    })
}

/// The serve flags `matches` holds and where each value came from, by
/// long name; `None` for a flag the command does not have.
fn source(cmd: &clap::Command, matches: &clap::ArgMatches, long: &str) -> Option<Source> {
    let arg = cmd.get_arguments().find(|a| a.get_long() == Some(long))?;
    let id = arg.get_id().as_str();
    let switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
    let given = matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    Some(Source { switch, given })
}

struct Source {
    /// A flag without a value (`--x509pop`).
    switch: bool,
    /// Set on the command line or by its variable: the file yields.
    given: bool,
}

/// The flags the file at `path` adds to a `serve` command line: `serve`
/// is the subcommand as clap built it (variables included) and `matches`
/// its first parse.
pub fn flags_from_file(
    serve: &clap::Command,
    matches: &clap::ArgMatches,
    path: &Path,
) -> anyhow::Result<Vec<OsString>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    flags_from_toml(serve, matches, &text)
        .with_context(|| format!("config file {}", path.display()))
}

/// [`flags_from_file`] on the file's text.
pub fn flags_from_toml(
    serve: &clap::Command,
    matches: &clap::ArgMatches,
    text: &str,
) -> anyhow::Result<Vec<OsString>> {
    let table: toml::Table = text.parse().context("not TOML")?;
    let mut out = Vec::new();
    for (key, value) in &table {
        if key == "config" {
            bail!("`config` cannot name another file");
        }
        let Some(src) = source(serve, matches, key) else {
            bail!(
                "`{key}` is no flag of `better-compute serve`: the keys are its flags' long \
                 names without the dashes (see `better-compute serve --help`)"
            );
        };
        if src.given {
            continue;
        }
        let values: Vec<&toml::Value> = match value {
            toml::Value::Array(items) => items.iter().collect(),
            one => vec![one],
        };
        for v in values {
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) if src.switch => {
                    if *b {
                        out.push(OsString::from(format!("--{key}")));
                    }
                    continue;
                }
                toml::Value::Boolean(b) => b.to_string(),
                other => bail!(
                    "`{key}` takes a string, a number or a list of them, not {}",
                    other.type_str()
                ),
            };
            if src.switch {
                bail!("`{key}` is a switch: write `{key} = true` or `{key} = false`");
            }
            out.push(OsString::from(format!("--{key}={text}")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> clap::Command {
        with_env(
            clap::Command::new("better-compute")
                .arg(clap::Arg::new("data_dir").long("data-dir").global(true))
                .subcommand(
                    clap::Command::new("serve")
                        .arg(clap::Arg::new("config").long("config"))
                        .arg(
                            clap::Arg::new("listen")
                                .long("listen")
                                .default_value("127.0.0.1:7443"),
                        )
                        .arg(
                            clap::Arg::new("handshake_rate")
                                .long("handshake-rate")
                                .value_parser(clap::value_parser!(u32))
                                .default_value("200"),
                        )
                        .arg(
                            clap::Arg::new("x509pop")
                                .long("x509pop")
                                .action(clap::ArgAction::SetTrue),
                        )
                        .arg(
                            clap::Arg::new("sans")
                                .long("san")
                                .action(clap::ArgAction::Append),
                        ),
                ),
        )
    }

    fn flags(argv: &[&str], toml: &str) -> anyhow::Result<Vec<String>> {
        let mut cmd = command();
        let m = cmd.try_get_matches_from_mut(argv).unwrap();
        let serve = cmd.find_subcommand("serve").unwrap().clone();
        let sm = m.subcommand_matches("serve").unwrap();
        flags_from_toml(&serve, sm, toml)
            .map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect())
    }

    #[test]
    fn a_file_fills_what_the_command_line_left_to_the_default() {
        let got = flags(
            &["bc", "serve", "--listen", "0.0.0.0:1"],
            "listen = \"0.0.0.0:2\"\nhandshake-rate = 500\nx509pop = true\nsan = [\"a\", \"b\"]\n",
        )
        .unwrap();
        assert_eq!(
            got,
            ["--handshake-rate=500", "--san=a", "--san=b", "--x509pop"],
            "the command line's --listen wins"
        );
        assert!(
            flags(&["bc", "serve"], "x509pop = false\n")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn unknown_keys_and_wrong_shapes_are_errors_that_name_them() {
        let e = flags(&["bc", "serve"], "handshake_rate = 5\n").unwrap_err();
        assert!(
            format!("{e:#}").contains("`handshake_rate` is no flag"),
            "{e:#}"
        );
        let e = flags(&["bc", "serve"], "x509pop = \"yes\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("is a switch"), "{e:#}");
        let e = flags(&["bc", "serve"], "[listen]\nport = 1\n").unwrap_err();
        assert!(format!("{e:#}").contains("not table"), "{e:#}");
        let e = flags(&["bc", "serve"], "listen = \n").unwrap_err();
        assert!(format!("{e:#}").contains("not TOML"), "{e:#}");
        let e = flags(&["bc", "serve"], "config = \"/x\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("another file"), "{e:#}");
    }

    #[test]
    fn every_flag_has_a_variable_named_after_it() {
        assert_eq!(env_name("handshake-rate"), "BC_HANDSHAKE_RATE");
        let cmd = command();
        let serve = cmd.find_subcommand("serve").unwrap();
        for a in serve.get_arguments().filter(|a| a.get_long().is_some()) {
            let long = a.get_long().unwrap();
            if long == "help" || a.is_global_set() {
                continue;
            }
            assert_eq!(
                a.get_env().and_then(|e| e.to_str()),
                Some(env_name(long).as_str()),
                "--{long}"
            );
        }
    }
}
