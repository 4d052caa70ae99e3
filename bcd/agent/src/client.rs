//! Calls to the server outside the session stream, over the node's own
//! TLS credentials: renewing the certificate, fetching a release, and
//! opening the session stream itself. `bcd join`'s call is in `join`.

use bcd_proto::tls::{self, ClientIdentity, ServerTrust};
use bcd_proto::v1::{
    NodeMessage, ServerMessage, gateway_client::GatewayClient, join_client::JoinClient,
};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls_pki_types::CertificateDer;
use tokio::sync::mpsc;

use crate::identity::{Identity, NextCert};

/// The node's credentials for a call.
fn credentials(identity: &Identity) -> ClientIdentity {
    ClientIdentity {
        chain: vec![identity.cert.clone()],
        key: identity.private_key(),
    }
}

/// An open session stream: what the node sends, what the gateway sends.
#[derive(Debug)]
pub struct Stream {
    pub tx: mpsc::Sender<NodeMessage>,
    pub rx: tonic::Streaming<ServerMessage>,
}

/// Dials the gateway with the node's certificate, trusting only the fleet
/// CA, and opens the session stream.
pub async fn open_session(identity: &Identity) -> Result<Stream, String> {
    let config = tls::client_config(
        ServerTrust::Ca(identity.ca.clone()),
        Some(credentials(identity)),
    )
    .map_err(|e| format!("{e:#}"))?;
    let channel = tls::connect(&identity.file.server, config)
        .await
        .map_err(|e| bcd_sys::error::chain(&e))?;
    let (tx, rx) = mpsc::channel(64);
    let stream = GatewayClient::new(channel)
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("{}: {}", s.code(), s.message()))?
        .into_inner();
    Ok(Stream { tx, rx: stream })
}

/// A renewed key and certificate, ready to install.
#[derive(Debug)]
pub struct Renewed {
    pub key_pem: String,
    pub cert: CertificateDer<'static>,
    pub next: NextCert,
}

/// Renew: a new key, proven by its CSR, over a session authenticated with
/// the current certificate.
pub async fn renew_certificate(
    server: &str,
    ca: CertificateDer<'static>,
    current: tls::ClientIdentity,
    hostname: &str,
) -> Result<Renewed, String> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, hostname);
    params.distinguished_name = dn;
    let csr = params.serialize_request(&key).map_err(|e| e.to_string())?;
    let config =
        tls::client_config(ServerTrust::Ca(ca), Some(current)).map_err(|e| format!("{e:#}"))?;
    let channel = tls::connect(server, config)
        .await
        .map_err(|e| bcd_sys::error::chain(&e))?;
    let resp = JoinClient::new(channel)
        .renew(bcd_proto::v1::RenewRequest {
            csr_der: csr.der().to_vec(),
        })
        .await
        .map_err(|s| format!("the server refused the renewal: {}", s.message()))?
        .into_inner();
    let cert = CertificateDer::from(resp.cert_der);
    let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
    if !cert.windows(spki.len()).any(|w| w == spki.as_slice()) {
        return Err("the renewed certificate is not for the new key".into());
    }
    Ok(Renewed {
        key_pem: key.serialize_pem(),
        cert,
        next: NextCert {
            serial: resp.cert_serial,
            not_after_ms: resp.not_after_ms,
            issued_ms: resp.server_time_ms,
        },
    })
}

/// Downloads a release over the node's own session credentials and checks
/// it before anything is written: the manifest must verify against the
/// release keys learned at join, and the binary must match it.
pub async fn fetch_release(
    identity: &Identity,
    sequence: u64,
) -> Result<(release::Manifest, Vec<u8>), String> {
    let config = tls::client_config(
        ServerTrust::Ca(identity.ca.clone()),
        Some(credentials(identity)),
    )
    .map_err(|e| format!("{e:#}"))?;
    let channel = tls::connect(&identity.file.server, config)
        .await
        .map_err(|e| bcd_sys::error::chain(&e))?;
    let resp = JoinClient::new(channel)
        .max_decoding_message_size(256 << 20)
        .fetch_release(bcd_proto::v1::FetchReleaseRequest { sequence })
        .await
        .map_err(|s| {
            format!(
                "the server did not hand out release {sequence}: {}",
                s.message()
            )
        })?
        .into_inner();
    let keys: Vec<Vec<u8>> = identity
        .file
        .release_keys
        .iter()
        .filter_map(|k| hex::decode(k).ok())
        .collect();
    let signed =
        release::SignedManifest::parse(&resp.signed_manifest).map_err(|e| e.to_string())?;
    let manifest = signed.verify(&keys).map_err(|e| e.to_string())?;
    if manifest.sequence != sequence {
        return Err(format!(
            "asked for release {sequence}, got a manifest for {}",
            manifest.sequence
        ));
    }
    manifest.check(&resp.binary).map_err(|e| e.to_string())?;
    Ok((manifest, resp.binary))
}
