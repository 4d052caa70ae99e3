//! `better-compute secrets`: values the secret broker hands to the nodes
//! whose signed spec names them (`nodes assign --secret`), encrypted to
//! each node's one-time key so no gateway reads one.

use std::path::PathBuf;

use bcd_proto::v1::{DeleteSecretRequest, ListSecretsRequest, PutSecretRequest, SecretInfo};
use clap::{Args, Subcommand};

use super::Target;
use super::output::{self, out};
use crate::client::status;

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Put a new secret (version 1). Its value is read from a file or an
    /// environment variable, never from the command line.
    #[command(
        after_help = "Examples:\n  better-compute secrets put hf-token --from-file token.txt\n  better-compute secrets put db-pw --from-env DB_PASSWORD\n  better-compute secrets put db-pw --from-file - < db-pw.txt"
    )]
    Put {
        /// The secret's name (what allocations name with --secret NAME=FILE).
        name: String,
        #[command(flatten)]
        value: Value,
    },
    /// Give a secret a new value (its next version): every node whose spec
    /// names it gets a spec naming the new version, and fetches it.
    #[command(
        after_help = "Examples:\n  better-compute secrets rotate hf-token --from-file new-token.txt\n  better-compute secrets rotate db-pw --from-env DB_PASSWORD"
    )]
    Rotate {
        /// The secret's name; its next version replaces the current one.
        name: String,
        #[command(flatten)]
        value: Value,
    },
    /// The secrets, their newest versions and the nodes holding them
    /// (never a value).
    #[command(
        after_help = "Examples:\n  better-compute secrets list\n  better-compute secrets list --json"
    )]
    List {
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Delete a secret no allocation holds; every version's value is
    /// wiped.
    #[command(after_help = "Examples:\n  better-compute secrets delete hf-token")]
    Delete {
        /// The secret's name.
        name: String,
    },
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Value {
    /// Read the value from this file ("-": standard input).
    #[arg(long)]
    from_file: Option<PathBuf>,
    /// Read the value from this environment variable.
    #[arg(long)]
    from_env: Option<String>,
}

impl Value {
    fn read(&self) -> anyhow::Result<Vec<u8>> {
        use anyhow::Context;
        let value = match (&self.from_file, &self.from_env) {
            (Some(path), _) if path.as_os_str() == "-" => {
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)
                    .context("cannot read the value from standard input")?;
                v
            }
            (Some(path), _) => std::fs::read(path)
                .with_context(|| format!("cannot read the value from {}", path.display()))?,
            (None, Some(var)) => std::env::var_os(var)
                .ok_or_else(|| {
                    anyhow::anyhow!("the environment variable {var} is not set: export it first")
                })?
                .into_encoded_bytes(),
            (None, None) => anyhow::bail!("give the value with --from-file FILE or --from-env VAR"),
        };
        Ok(value)
    }
}

fn print(s: &SecretInfo) -> anyhow::Result<()> {
    out!(
        "{:<32} {:>7} {:<26} {:<16} {}",
        s.name,
        s.version,
        output::time(s.created_at_ms),
        s.created_by,
        if s.nodes.is_empty() {
            "-".to_string()
        } else {
            s.nodes.join(",")
        }
    );
    Ok(())
}

pub async fn run(cmd: SecretsCommand, target: &Target) -> anyhow::Result<()> {
    match cmd {
        SecretsCommand::Put { name, value } => put(target, name, value, false).await,
        SecretsCommand::Rotate { name, value } => put(target, name, value, true).await,
        SecretsCommand::List { json } => {
            let mut c = target.connect().await?;
            let r = c
                .list_secrets(ListSecretsRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r.secrets);
            }
            out!(
                "{:<32} {:>7} {:<26} {:<16} NODES",
                "NAME",
                "VERSION",
                "CREATED",
                "BY"
            );
            r.secrets.iter().try_for_each(print)
        }
        SecretsCommand::Delete { name } => {
            let mut c = target.connect().await?;
            c.delete_secret(DeleteSecretRequest { name: name.clone() })
                .await
                .map_err(status)?;
            out!("secret {name} deleted");
            Ok(())
        }
    }
}

async fn put(target: &Target, name: String, value: Value, rotate: bool) -> anyhow::Result<()> {
    let value = value.read()?;
    let mut c = target.connect().await?;
    let s = c
        .put_secret(PutSecretRequest {
            name,
            value,
            rotate,
        })
        .await
        .map_err(status)?
        .into_inner();
    if rotate {
        out!(
            "secret {} is at version {}; specs signed again: {}",
            s.name,
            s.version,
            if s.nodes.is_empty() {
                "none".to_string()
            } else {
                s.nodes.join(", ")
            }
        );
    } else {
        out!("secret {} put (version {})", s.name, s.version);
    }
    Ok(())
}
