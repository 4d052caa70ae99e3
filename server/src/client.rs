//! The operator's client: reads `operator.json`, connects over TLS to the
//! fleet CA it names, and sends the bearer credential with every call.

use std::path::Path;

use anyhow::Context;
use bcd_proto::tls::{self, ServerTrust};
use bcd_proto::v1::admin_client::AdminClient;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::api::auth::OperatorCredential;

#[derive(Debug, Clone)]
pub struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        r.metadata_mut()
            .insert(bcd_proto::AUTHORIZATION, self.0.clone());
        Ok(r)
    }
}

pub type Admin = AdminClient<InterceptedService<Channel, Bearer>>;

pub async fn connect(credential: &Path, server: Option<&str>) -> anyhow::Result<Admin> {
    let cred: OperatorCredential =
        serde_json::from_slice(&std::fs::read(credential).with_context(|| {
            format!(
                "cannot read the operator credential {}: pass --operator FILE or --data-dir DIR \
                 of the server",
                credential.display()
            )
        })?)
        .with_context(|| format!("{} is not an operator credential", credential.display()))?;
    let ca = CertificateDer::from_pem_slice(cred.ca_pem.as_bytes())
        .with_context(|| format!("{} holds no usable CA", credential.display()))?;
    let config = tls::client_config(ServerTrust::Ca(ca), None)?;
    let url = server.unwrap_or(&cred.server).to_string();
    let channel = tls::connect(&url, config).await.with_context(|| {
        format!("cannot reach the server at {url}; is better-compute serve running?")
    })?;
    let bearer: MetadataValue<_> = format!("Bearer {}", cred.token)
        .parse()
        .context("the operator token is not valid ASCII")?;
    Ok(AdminClient::with_interceptor(channel, Bearer(bearer))
        .max_encoding_message_size(crate::api::MAX_REQUEST))
}

/// The message of a failed API call, for the operator.
pub fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", s.message())
}
