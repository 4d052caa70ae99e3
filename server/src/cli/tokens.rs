//! `better-compute tokens`.

use std::time::Duration;

use bcd_proto::token::JoinToken;
use bcd_proto::v1::{CreateTokenRequest, ListTokensRequest, RevokeTokenRequest};
use clap::Subcommand;

use super::output::{self, out};
use super::{Target, dur};

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create a join token and print it.
    #[command(
        after_help = "Examples:\n  better-compute tokens create --ttl 1h\n  better-compute tokens create --ttl 7d --uses 100 --pool rack-3 --description 'rack 3 install'\n  better-compute tokens create --count 40 --pool rack-3 > rack-3.tokens   # one per machine"
    )]
    Create {
        /// How many tokens to create, one per line (a one-use token for
        /// each machine of a rack: no two joins wait on one token's row).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_COUNT as i64))]
        count: u32,
        /// How long the token may be used (a duration: 1h, 30m, 7d).
        #[arg(long, default_value = "24h", value_parser = dur)]
        ttl: Duration,
        /// How many nodes may join with it.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// What the token is for, shown in tokens list.
        #[arg(long, default_value = "")]
        description: String,
        /// The pool the nodes that join with it belong to (images assign
        /// --pool boots them alike); none by default.
        #[arg(long)]
        pool: Option<String>,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Join tokens, newest first (never their secrets): the ones a node
    /// can still join with, or every one with --all (at most 1,000).
    #[command(
        after_help = "Examples:\n  better-compute tokens list\n  better-compute tokens list --all --json"
    )]
    List {
        /// Expired, used up and revoked tokens too.
        #[arg(long)]
        all: bool,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Revoke a join token (its id from `tokens list`, or the whole token):
    /// it expires now and no node joins with it again. The nodes that
    /// joined with it keep their identities (`nodes delete` removes one).
    #[command(after_help = "Examples:\n  better-compute tokens revoke 3f9a0c1d2e4b5a6f")]
    Revoke {
        /// The token, or its id (tokens list shows them).
        #[arg(value_name = "TOKEN_ID")]
        token: String,
    },
}

/// The most tokens one `tokens create --count` makes.
const MAX_COUNT: u32 = 100_000;

pub async fn run(cmd: TokensCommand, target: &Target) -> anyhow::Result<()> {
    let (count, ttl, uses, description, pool, json) = match cmd {
        TokensCommand::Create {
            count,
            ttl,
            uses,
            description,
            pool,
            json,
        } => (count, ttl, uses, description, pool, json),
        TokensCommand::List { all, json } => return list(all, json, target).await,
        TokensCommand::Revoke { token } => return revoke(&token, target).await,
    };
    let mut c = target.connect().await?;
    let json = crate::cli::output::json_wanted(json);
    for made in 0..count {
        let r = c
            .create_token(CreateTokenRequest {
                ttl_ms: ttl.as_millis() as u64,
                uses,
                description: description.clone(),
                pool: pool.clone().unwrap_or_default(),
            })
            .await
            .map_err(|e| {
                let e = crate::client::status(e);
                if made == 0 {
                    e
                } else {
                    e.context(format!(
                        "{made} of {count} tokens were created and printed; they stay valid \
                         (tokens revoke removes one)"
                    ))
                }
            })?
            .into_inner();
        if json {
            output::json_line(&r)?;
            continue;
        }
        out!("{}", r.token);
        if count == 1 {
            eprintln!(
                "token {} for {} node(s){}, expires {}",
                r.token_id,
                r.uses,
                output::around(" in pool ", &r.pool, ""),
                output::time(r.expires_at_ms)
            );
        } else if made + 1 == count {
            eprintln!(
                "{count} tokens for {} node(s) each{}, expire {}",
                r.uses,
                output::around(" in pool ", &r.pool, ""),
                output::time(r.expires_at_ms)
            );
        }
    }
    Ok(())
}

async fn list(all: bool, json: bool, target: &Target) -> anyhow::Result<()> {
    let mut c = target.connect().await?;
    let r = c
        .list_tokens(ListTokensRequest { all })
        .await
        .map_err(crate::client::status)?
        .into_inner();
    if crate::cli::output::json_wanted(json) {
        return output::json(&r.tokens);
    }
    out!(
        "{:<16} {:<9} {:<26} {:<16} {:<17} DESCRIPTION",
        "ID",
        "USES LEFT",
        "EXPIRES",
        "POOL",
        "MINTED FOR"
    );
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    for t in r.tokens {
        out!(
            "{:<16} {:<9} {:<26} {:<16} {:<17} {}",
            t.token_id,
            format!("{}/{}", t.uses_left, t.uses_total),
            output::time(t.expires_at_ms),
            dash(&t.pool),
            dash(&t.minted_for_mac),
            t.description
        );
    }
    Ok(())
}

/// A token's id: the argument itself, or the id inside a whole token
/// (`bct2.ID.SECRET.PIN.KEY`, or an older `bct1` one), so a leaked token can be revoked as found.
fn token_id(arg: &str) -> String {
    JoinToken::parse(arg.trim()).map_or_else(|_| arg.trim().to_string(), |t| t.id)
}

async fn revoke(token: &str, target: &Target) -> anyhow::Result<()> {
    let mut c = target.connect().await?;
    let t = c
        .revoke_token(RevokeTokenRequest {
            token_id: token_id(token),
        })
        .await
        .map_err(crate::client::status)?
        .into_inner();
    out!(
        "token {} revoked: it expired {}; {} of {} uses were left",
        t.token_id,
        output::time(t.expires_at_ms),
        t.uses_left,
        t.uses_total
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_whole_token_is_revoked_by_its_id() {
        let t = bcd_proto::token::JoinToken {
            id: "0123456789abcdef".into(),
            secret: "5".repeat(32),
            ca_pin: "a".repeat(64),
            seal_key: Some([7; 32]),
        };
        assert_eq!(super::token_id(&format!(" {t}\n")), "0123456789abcdef");
        assert_eq!(super::token_id("0123456789abcdef"), "0123456789abcdef");
        assert_eq!(super::token_id("not.a.token"), "not.a.token");
    }
}
