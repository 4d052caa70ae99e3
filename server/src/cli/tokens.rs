//! `better-compute tokens`.

use std::time::Duration;

use bcd_proto::v1::CreateTokenRequest;
use clap::Subcommand;

use super::output::{self, out};
use super::{Target, dur};

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create a join token and print it.
    Create {
        #[arg(long, default_value = "24h", value_parser = dur)]
        ttl: Duration,
        /// How many nodes may join with it.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        #[arg(long, default_value = "")]
        description: String,
        /// The pool the nodes that join with it belong to (images assign
        /// --pool boots them alike); none by default.
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(cmd: TokensCommand, target: &Target) -> anyhow::Result<()> {
    let TokensCommand::Create {
        ttl,
        uses,
        description,
        pool,
        json,
    } = cmd;
    let mut c = target.connect().await?;
    let r = c
        .create_token(CreateTokenRequest {
            ttl_ms: ttl.as_millis() as u64,
            uses,
            description,
            pool: pool.unwrap_or_default(),
        })
        .await
        .map_err(crate::client::status)?
        .into_inner();
    if json {
        return output::json_line(&r);
    }
    out!("{}", r.token);
    eprintln!(
        "token {} for {} node(s){}, expires {}",
        r.token_id,
        r.uses,
        output::around(" in pool ", &r.pool, ""),
        output::time(r.expires_at_ms)
    );
    Ok(())
}
