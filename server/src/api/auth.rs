//! Operator authentication: a bearer credential, written once to
//! `operator.json` (mode 0600) in the server's data directory, whose
//! SHA-256 the store keeps; the API checks every call against it.

use super::status::{Turned, turned};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use bc_store::Store;
use serde::{Deserialize, Serialize};
use tonic::{Request, Status};
use tracing::info;

use crate::files;

/// What `operator.json` holds: how the CLI reaches and proves itself to the
/// API. Readable by its owner only.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperatorCredential {
    pub server: String,
    pub ca_pem: String,
    pub token: String,
}

pub const OPERATOR_FILE: &str = "operator.json";

/// Checks the bearer credential against the operators known at start.
#[derive(Debug, Clone)]
pub struct OperatorAuth {
    pub token_hashes: Arc<HashSet<String>>,
}

impl tonic::service::Interceptor for OperatorAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let token = request
            .metadata()
            .get(bcd_proto::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                turned(Turned::Operator(
                    "the operator API needs the operator credential (operator.json in the \
                     server's data directory)",
                ))
            })?;
        if !self
            .token_hashes
            .contains(&bcd_proto::fingerprint(token.as_bytes()))
        {
            return Err(turned(Turned::Operator(
                "the operator credential is not valid",
            )));
        }
        Ok(request)
    }
}

/// Writes the operator credential on first start; afterwards keeps its
/// server address current. Returns the operator token hashes.
pub async fn operator_credential(
    dir: &Path,
    store: &Store,
    ca_der: &[u8],
    addr: SocketAddr,
) -> anyhow::Result<HashSet<String>> {
    let path = dir.join(OPERATOR_FILE);
    let server = format!("https://{addr}");
    let cred = if path.exists() {
        let mut c: OperatorCredential = serde_json::from_slice(
            &std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?,
        )
        .with_context(|| format!("{} is corrupt", path.display()))?;
        if c.server != server {
            c.server = server;
            files::write_atomic(&path, &serde_json::to_vec_pretty(&c)?, 0o600)?;
        }
        c
    } else {
        let token = format!(
            "bco1.{:032x}{:032x}",
            rand::random::<u128>(),
            rand::random::<u128>()
        );
        store
            .add_operator("admin", &bcd_proto::fingerprint(token.as_bytes()))
            .await?;
        let c = OperatorCredential {
            server,
            ca_pem: files::pem_certificate(ca_der),
            token,
        };
        files::write_atomic(&path, &serde_json::to_vec_pretty(&c)?, 0o600)?;
        info!(path = %path.display(), "wrote the operator credential");
        c
    };
    let mut hashes = HashSet::new();
    hashes.insert(bcd_proto::fingerprint(cred.token.as_bytes()));
    Ok(hashes)
}
