//! `better-compute ticket-keys`: the keys that sign exec tickets and the
//! secret broker's deliveries, whose JWKS every node's signed spec pins.

use bcd_proto::v1::RotateTicketKeysRequest;
use clap::Subcommand;

use super::Target;
use super::output::out;
use crate::client::status;

#[derive(Debug, Subcommand)]
pub enum TicketKeysCommand {
    /// Make a new ticket key. The current one stays beside it until the
    /// next rotation (every spec names both, and each node is signed for
    /// with the newest key its spec names); the one before is dropped.
    /// Every node's spec is signed again.
    #[command(after_help = "Examples:\n  better-compute ticket-keys rotate")]
    Rotate,
}

pub async fn run(cmd: TicketKeysCommand, target: &Target) -> anyhow::Result<()> {
    match cmd {
        TicketKeysCommand::Rotate => {
            let mut c = target.connect().await?;
            let r = c
                .rotate_ticket_keys(RotateTicketKeysRequest {})
                .await
                .map_err(status)?
                .into_inner();
            out!(
                "ticket key {} is current; {} stays until the next rotation",
                r.kid,
                r.previous_kid
            );
            if !r.retired_kid.is_empty() {
                out!("ticket key {} is retired", r.retired_kid);
            }
            out!("specs signed again: {}", r.nodes.len());
        }
    }
    Ok(())
}
