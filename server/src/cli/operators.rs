//! `better-compute operators`: add, list and revoke the operators who may
//! call the API, each with a client certificate from the operator CA; and
//! `login`, a short-lived token that opens the web console in a browser.

use std::time::Duration;

use bcd_proto::typed::Spelling;
use bcd_proto::v1::{
    self, AddOperatorRequest, ListOperatorsRequest, MintConsoleTokenRequest, RevokeOperatorRequest,
};
use clap::Subcommand;

use super::Target;
use super::output::{self, out, spelled};
use crate::api::auth::{OperatorCredential, cert_pem, new_key_and_csr, write_credential};
use crate::client::status;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Role {
    /// Everything the API offers.
    Admin,
    /// Lists and reads; changes nothing.
    ReadOnly,
}

impl From<Role> for v1::OperatorRole {
    fn from(r: Role) -> Self {
        match r {
            Role::Admin => v1::OperatorRole::Admin,
            Role::ReadOnly => v1::OperatorRole::ReadOnly,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// Add an operator: makes its key here, has the operator CA sign it
    /// (valid one year) and writes the credential file (mode 0600) to hand
    /// over; use it with --operator FILE.
    #[command(
        after_help = "Examples:\n  better-compute operators add alice --role admin --out alice.json\n  better-compute operators add grafana --role read-only --out grafana.json"
    )]
    Add {
        /// The operator's name, as audit records and logs show it.
        name: String,
        /// What the operator may do.
        #[arg(long, value_enum)]
        role: Role,
        #[command(flatten)]
        file: super::CredentialOut,
    },
    /// Every operator: role, certificate serial and expiry, revocation.
    #[command(
        after_help = "Examples:\n  better-compute operators list\n  better-compute operators list --json"
    )]
    List {
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Revoke an operator: its certificate is refused from its next call,
    /// on every server sharing the store.
    #[command(after_help = "Examples:\n  better-compute operators revoke grafana")]
    Revoke {
        /// The operator's name (operators list shows them).
        name: String,
    },
    /// A token that signs you in to the web console (serve
    /// --console-listen) as the operator of your credential, with its role;
    /// paste it into the console's sign-in page. Revoking the operator ends
    /// its tokens too.
    #[command(after_help = "Examples:\n  better-compute operators login\n  \
                            better-compute operators login --ttl 8h -o json")]
    Login {
        /// How long the token opens the console (at most 12h).
        #[arg(long, default_value = "1h", value_parser = super::dur)]
        ttl: Duration,
        /// JSON instead of text (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(cmd: OperatorsCommand, target: &Target) -> anyhow::Result<()> {
    match cmd {
        OperatorsCommand::Login { ttl, json } => {
            let mut c = target.connect().await?;
            let r = c
                .mint_console_token(MintConsoleTokenRequest {
                    ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1),
                })
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r);
            }
            out!("console  {}", r.console_url);
            out!("until    {}", output::time(r.expires_ms));
            out!("token    {}", r.token);
            eprintln!(
                "Open the console and paste the token to sign in; it opens it for you alone \
                 until it ends. Keep it as you would the credential."
            );
            Ok(())
        }
        OperatorsCommand::Add { name, role, file } => {
            file.check()?;
            let super::CredentialOut { out, force } = file;
            let server = match &target.server {
                Some(s) => s.clone(),
                None => crate::client::read_credential(&target.operator)?.server,
            };
            let mut c = target.connect().await?;
            let (key, csr) = new_key_and_csr()?;
            let r = c
                .add_operator(AddOperatorRequest {
                    name: name.clone(),
                    role: v1::OperatorRole::from(role) as i32,
                    csr_der: csr,
                })
                .await
                .map_err(status)?
                .into_inner();
            let cred = OperatorCredential {
                server,
                name: name.clone(),
                ca_pem: cert_pem(&r.ca_der),
                cert_pem: cert_pem(&r.cert_der),
                key_pem: key.serialize_pem(),
            };
            write_credential(&out, &cred, force)?;
            let not_after = r.operator.map_or(0, |o| o.not_after_ms);
            out!(
                "operator {name} ({}) added; credential in {}, valid until {}",
                v1::OperatorRole::from(role).spelling(),
                out.display(),
                output::time(not_after)
            );
            Ok(())
        }
        OperatorsCommand::List { json } => {
            let mut c = target.connect().await?;
            let r = c
                .list_operators(ListOperatorsRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r);
            }
            out!("operator certificates are valid for one year from when they were added");
            out!(
                "{:<20} {:<10} {:<33} {:<21} {:<21} {:<21}",
                "NAME",
                "ROLE",
                "CERT SERIAL",
                "ADDED",
                "CERT EXPIRES",
                "REVOKED"
            );
            for o in &r.operators {
                let or_dash = |ms: i64| {
                    if ms == 0 {
                        "-".to_string()
                    } else {
                        output::time(ms)
                    }
                };
                out!(
                    "{:<20} {:<10} {:<33} {:<21} {:<21} {:<21}",
                    o.name,
                    spelled::<v1::OperatorRole>(o.role),
                    if o.cert_serial.is_empty() {
                        "-"
                    } else {
                        &o.cert_serial
                    },
                    output::time(o.created_at_ms),
                    or_dash(o.not_after_ms),
                    or_dash(o.revoked_at_ms)
                );
            }
            Ok(())
        }
        OperatorsCommand::Revoke { name } => {
            let mut c = target.connect().await?;
            let r = c
                .revoke_operator(RevokeOperatorRequest { name })
                .await
                .map_err(status)?
                .into_inner();
            out!(
                "operator {} revoked at {}",
                r.name,
                output::time(r.revoked_at_ms)
            );
            Ok(())
        }
    }
}
