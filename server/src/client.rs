//! The operator's client: reads a credential file (`operator.json`, or one
//! `operators add` wrote), connects over TLS to the operator API, checks its
//! certificate against the operator CA the file names, and presents the
//! operator's client certificate.

use std::path::Path;

use anyhow::Context;
use bcd_proto::tls::{self, ClientIdentity, ServerTrust};
use bcd_proto::v1::admin_client::AdminClient;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::Channel;

use crate::api::auth::{OperatorCredential, is_bearer_credential};

pub type Admin = AdminClient<Channel>;

/// Reads a credential file.
pub fn read_credential(credential: &Path) -> anyhow::Result<OperatorCredential> {
    let bytes = std::fs::read(credential).with_context(|| {
        format!(
            "cannot read the operator credential {}: pass --operator FILE or --data-dir DIR of \
             the server",
            credential.display()
        )
    })?;
    if is_bearer_credential(&bytes) {
        anyhow::bail!(
            "{} holds a bearer token, which the operator API no longer accepts: if it is the \
             server's operator.json, delete it and restart better-compute serve (it writes a \
             certificate credential); otherwise ask an admin for one (better-compute operators \
             add)",
            credential.display()
        );
    }
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not an operator credential", credential.display()))
}

pub async fn connect(credential: &Path, server: Option<&str>) -> anyhow::Result<Admin> {
    let cred = read_credential(credential)?;
    let unusable = || {
        format!(
            "{} holds no usable certificate or key",
            credential.display()
        )
    };
    let ca = CertificateDer::from_pem_slice(cred.ca_pem.as_bytes()).with_context(unusable)?;
    let cert = CertificateDer::from_pem_slice(cred.cert_pem.as_bytes()).with_context(unusable)?;
    let key = PrivateKeyDer::from_pem_slice(cred.key_pem.as_bytes()).with_context(unusable)?;
    let config = tls::client_config(
        ServerTrust::Ca(ca),
        Some(ClientIdentity {
            chain: vec![cert],
            key,
        }),
    )?;
    let url = server.unwrap_or(&cred.server).to_string();
    let channel = tls::connect_named(&url, config, bcd_proto::API_NAME)
        .await
        .with_context(|| {
            format!(
                "cannot reach the operator API at {url}; is better-compute serve running, and is \
                 this its API address (serve prints `api on ADDR`)?"
            )
        })?;
    Ok(AdminClient::new(channel).max_encoding_message_size(crate::api::MAX_REQUEST))
}

/// The message of a failed API call, for the operator.
pub fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", s.message())
}
