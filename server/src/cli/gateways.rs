//! `better-compute gateways`: credentials for gateway processes that hold
//! no key (`serve --role gateway`).

use bcd_proto::v1::{
    AddGatewayRequest, DrainGatewayRequest, ListGatewaysRequest, RevokeGatewayRequest,
};
use clap::Subcommand;

use super::Target;
use super::output::{self, out};
use crate::client::status;
use crate::gateway::credential::GatewayCredential;

#[derive(Debug, Subcommand)]
pub enum GatewaysCommand {
    /// Add a gateway and write its credential file (mode 0600): what
    /// `serve --role gateway --credential FILE` starts from. The secret in
    /// it is shown once. On PostgreSQL, also prints the SQL that gives the
    /// gateway a database role of its own, with a gateway's privileges.
    #[command(
        after_help = "Examples:\n  better-compute gateways add edge-1 --upstream https://10.0.0.5:7443 --out edge-1.json\n  better-compute gateways add edge-2 --upstream https://10.0.0.6:7443 --out edge-2.json --force"
    )]
    Add {
        /// The gateway credential's name (its gateways run with --gateway-id of their own).
        name: String,
        /// The process holding the keys, as the gateway reaches it: its
        /// node listener (`serve --listen`), https://HOST:PORT.
        #[arg(long)]
        upstream: String,
        #[command(flatten)]
        file: super::CredentialOut,
    },
    #[command(
        after_help = "Examples:\n  better-compute gateways list\n  better-compute gateways list --json"
    )]
    List {
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Revoke a gateway's credential: it gets no certificate more, and the
    /// join service refuses what it relays.
    #[command(after_help = "Examples:\n  better-compute gateways revoke edge-1")]
    Revoke {
        /// The gateway credential's name (gateways list shows them).
        name: String,
    },
    /// Move a running gateway's sessions off it without stopping it: each
    /// node is told to reconnect at random within the window (the spec's
    /// drain), and the gateway refuses new sessions and answers /readyz
    /// 503 until undrained or restarted. Nodes land on the other gateways
    /// behind the balancer.
    #[command(
        after_help = "Examples:\n  better-compute gateways drain gw-3f2a19c0\n  better-compute gateways drain gw-3f2a19c0 --within 30s\n  better-compute gateways undrain gw-3f2a19c0"
    )]
    Drain {
        /// The running gateway's id (nodes list shows the gateway holding
        /// each node's session).
        id: String,
        /// Spread the reconnects over this long (default: the gateway's
        /// --drain-within, 60 s).
        #[arg(long, value_parser = super::dur)]
        within: Option<std::time::Duration>,
    },
    /// Let a drained gateway take sessions again.
    #[command(after_help = "Examples:\n  better-compute gateways undrain gw-3f2a19c0")]
    Undrain {
        /// The gateway's id.
        id: String,
    },
}

pub async fn run(cmd: GatewaysCommand, target: &Target) -> anyhow::Result<()> {
    let mut c = target.connect().await?;
    match cmd {
        GatewaysCommand::Add {
            name,
            upstream,
            file,
        } => {
            bcd_proto::tls::host_port(&upstream).map_err(|_| {
                anyhow::anyhow!("--upstream takes https://HOST:PORT, not {upstream:?}")
            })?;
            file.check()?;
            let out = file.out;
            let r = c
                .add_gateway(AddGatewayRequest { name: name.clone() })
                .await
                .map_err(status)?
                .into_inner();
            let credential = GatewayCredential {
                name: name.clone(),
                secret: r.secret,
                upstream,
                ca_pem: crate::api::auth::cert_pem(&r.ca_der),
            };
            credential.write(&out)?;
            out!("{}", out.display());
            eprintln!(
                "gateway {name} added; start it with better-compute serve --role gateway \
                 --credential {}",
                out.display()
            );
            if !r.database_role_sql.is_empty() {
                eprintln!(
                    "on PostgreSQL, the gateway connects as a role of its own with a gateway's \
                     privileges only; as a user who may create roles, run:\n{}",
                    r.database_role_sql
                );
            }
        }
        GatewaysCommand::List { json } => {
            let r = c
                .list_gateways(ListGatewaysRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r.gateways);
            }
            out!("{:<24} {:<26} REVOKED", "NAME", "ADDED");
            for g in r.gateways {
                let revoked = if g.revoked_at_ms == 0 {
                    "-".to_string()
                } else {
                    output::time(g.revoked_at_ms)
                };
                out!(
                    "{:<24} {:<26} {}",
                    g.name,
                    output::time(g.created_at_ms),
                    revoked
                );
            }
        }
        GatewaysCommand::Revoke { name } => {
            c.revoke_gateway(RevokeGatewayRequest { name: name.clone() })
                .await
                .map_err(status)?;
            out!("gateway {name} revoked");
        }
        GatewaysCommand::Drain { id, within } => {
            let r = c
                .drain_gateway(DrainGatewayRequest {
                    gateway_id: id.clone(),
                    undo: false,
                    within_ms: within.map_or(0, |w| w.as_millis() as u64),
                })
                .await
                .map_err(status)?
                .into_inner();
            if r.sessions >= 0 {
                out!(
                    "gateway {id} draining: {} sessions told to reconnect elsewhere",
                    r.sessions
                );
            } else {
                out!("gateway {id} draining: its sessions are told to reconnect elsewhere");
            }
        }
        GatewaysCommand::Undrain { id } => {
            c.drain_gateway(DrainGatewayRequest {
                gateway_id: id.clone(),
                undo: true,
                within_ms: 0,
            })
            .await
            .map_err(status)?;
            out!("gateway {id} takes sessions again");
        }
    }
    Ok(())
}
