//! `better-compute machines`: machines with a TPM, enrolled by their EK so
//! they join with no token (`bcd join --attestor tpm --ca-pin PIN`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use bcd_proto::v1::{EnrollMachineRequest, ListMachinesRequest, RemoveMachineRequest};
use clap::{Args, Subcommand};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::Target;
use super::output::{self, out};
use crate::client::status;

#[derive(Debug, Subcommand)]
pub enum MachinesCommand {
    /// Enrol a machine by its TPM's EK, or every machine whose EK
    /// certificate an EK CA signed: it joins with no token, and a diskless
    /// node re-attests at every boot as the same node.
    #[command(
        after_help = "Examples:\n  better-compute machines enroll --ek-cert ek.pem --description 'gpu-a-17'\n  better-compute machines enroll --ek-sha256 \"$EK_SHA256\"\n  better-compute machines enroll --ek-ca vendor-root.pem --ek-intermediates vendor-ica.pem"
    )]
    Enroll {
        #[command(flatten)]
        what: EnrolWhat,
        /// With --ek-ca: the intermediate CAs between it and the EK
        /// certificates (PEM, one or more certificates; or DER, one), for
        /// a vendor whose EK certificates its root does not sign itself;
        /// repeatable.
        #[arg(long, value_name = "FILE", requires = "ek_ca")]
        ek_intermediates: Vec<PathBuf>,
        /// What the enrolment is for, shown in machines list.
        #[arg(long, default_value = "")]
        description: String,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Enrolments, and the node bound to each enrolled EK.
    #[command(
        after_help = "Examples:\n  better-compute machines list\n  better-compute machines list --json"
    )]
    List {
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Remove an enrolment (an id from `machines list`): no new node joins
    /// by it; a node already bound to the EK stays bound until `nodes
    /// delete` frees it.
    #[command(after_help = "Examples:\n  better-compute machines remove \"ek:$EK_SHA256\"")]
    Remove {
        /// The enrolment's id (machines list shows them).
        id: String,
    },
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct EnrolWhat {
    /// The SHA-256 of the EK (64 hex digits), as a refused join prints it.
    #[arg(long, value_name = "HEX")]
    ek_sha256: Option<String>,
    /// The machine's EK certificate (PEM or DER), e.g. read from its TPM
    /// with `tpm2_getekcertificate`.
    #[arg(long, value_name = "FILE")]
    ek_cert: Option<PathBuf>,
    /// An EK CA certificate (PEM or DER): the EKs it certified join.
    #[arg(long, value_name = "FILE")]
    ek_ca: Option<PathBuf>,
}

/// Every certificate in a file: PEM (one or more) or DER (one).
fn certificates(path: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.first() == Some(&0x30) {
        return Ok(vec![bytes]);
    }
    let all = CertificateDer::pem_slice_iter(&bytes)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(
        !all.is_empty(),
        "{} holds no certificate (PEM or DER)",
        path.display()
    );
    Ok(all)
}

/// A certificate file, PEM or DER.
fn certificate(path: &Path) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.first() == Some(&0x30) {
        return Ok(bytes);
    }
    let der = CertificateDer::from_pem_slice(&bytes).map_err(|e| {
        anyhow::anyhow!("{} holds no certificate (PEM or DER): {e}", path.display())
    })?;
    Ok(der.to_vec())
}

pub async fn run(cmd: MachinesCommand, target: &Target) -> anyhow::Result<()> {
    let mut c = target.connect().await?;
    match cmd {
        MachinesCommand::Enroll {
            what,
            ek_intermediates,
            description,
            json,
        } => {
            let mut intermediates = Vec::new();
            for path in &ek_intermediates {
                intermediates.extend(certificates(path)?);
            }
            let request = EnrollMachineRequest {
                ek_sha256: what.ek_sha256.unwrap_or_default(),
                ek_certificate_der: what
                    .ek_cert
                    .as_deref()
                    .map(certificate)
                    .transpose()?
                    .unwrap_or_default(),
                ek_ca_der: what
                    .ek_ca
                    .as_deref()
                    .map(certificate)
                    .transpose()?
                    .unwrap_or_default(),
                ek_intermediates_der: intermediates,
                description,
            };
            let r = c
                .enroll_machine(request)
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json_line(&r);
            }
            let m = r.machine.unwrap_or_default();
            out!("{}", m.id);
            eprintln!(
                "enrolled; its machines join with no token: bcd join --attestor tpm --server \
                 https://HOST:PORT --ca-pin {}",
                r.ca_pin
            );
        }
        MachinesCommand::List { json } => {
            let r = c
                .list_machines(ListMachinesRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r.machines);
            }
            out!("{:<72} {:<18} {:<26} SUBJECT", "ID", "NODE", "ENROLLED");
            for m in r.machines {
                let node = if m.node_id.is_empty() {
                    "-"
                } else {
                    &m.node_id
                };
                out!(
                    "{:<72} {:<18} {:<26} {}",
                    m.id,
                    node,
                    output::time(m.created_at_ms),
                    m.subject
                );
            }
        }
        MachinesCommand::Remove { id } => {
            c.remove_machine(RemoveMachineRequest { id: id.clone() })
                .await
                .map_err(status)?;
            out!("enrolment {id} removed");
        }
    }
    Ok(())
}
