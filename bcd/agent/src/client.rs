//! Calls to the server outside the session stream, over the node's own
//! TLS credentials: renewing the certificate, fetching a release or a
//! netboot image, and opening the session stream itself. `bcd join`'s call
//! is in `join`.

use bcd_proto::tls::{self, ServerTrust};
use bcd_proto::v1::{NodeMessage, ServerMessage, join_client::JoinClient};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls_pki_types::CertificateDer;
use tokio::sync::mpsc;

use crate::identity::{Identity, NextCert};
use release::assemble::Assembly;

/// An open session stream: what the node sends, what the gateway sends.
/// Messages wait boxed: a channel keeps its slots in blocks of 32 from the
/// start, and a `NodeMessage` is a few hundred bytes inline.
#[derive(Debug)]
pub struct Stream {
    pub tx: mpsc::Sender<Box<NodeMessage>>,
    pub rx: tonic::Streaming<ServerMessage>,
    /// SHA-256 of the gateway's certificate (DER, lowercase hex).
    pub gateway: std::sync::Arc<str>,
    /// The connection, for the tunnels the session opens beside it.
    pub conn: tls::Conn,
    /// Dropped with the stream: the tunnels opened in this session close.
    pub closed: tokio::sync::watch::Receiver<()>,
    _closing: tokio::sync::watch::Sender<()>,
}

/// The session stream's method, as the generated client names it.
const SESSION_PATH: &str = "/bcd.v1.Gateway/Session";

/// The session stream's codec: prost, with encode and decode buffers that
/// start at a given size and grow for a larger message.
#[derive(Debug, Clone, Copy)]
struct SessionCodec(tonic::codec::BufferSettings);

type Prost = tonic_prost::ProstCodec<NodeMessage, ServerMessage>;

impl tonic::codec::Codec for SessionCodec {
    type Encode = NodeMessage;
    type Decode = ServerMessage;
    type Encoder = <Prost as tonic::codec::Codec>::Encoder;
    type Decoder = <Prost as tonic::codec::Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        Prost::raw_encoder(self.0)
    }

    fn decoder(&mut self) -> Self::Decoder {
        Prost::raw_decoder(self.0)
    }
}

/// How much a stream encodes before it lets other tasks run: tonic's
/// default.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// Dials the gateway with the node's certificate, trusting only the fleet
/// CA, and opens the session stream, whose encode and decode buffers start
/// at `stream_buffer` bytes (see [`crate::node::Footprint`]).
pub async fn open_session(identity: &Identity, stream_buffer: usize) -> Result<Stream, String> {
    use tokio_stream::StreamExt;
    let config = identity.client_config()?;
    let conn = tls::dial(&identity.file.server, config)
        .await
        .map_err(|e| bcd_sys::error::chain(&e))?;
    let (tx, rx) = mpsc::channel::<Box<NodeMessage>>(64);
    let gateway: std::sync::Arc<str> = conn.peer_sha256().into();
    let tunnels = conn.clone();
    let mut grpc = tonic::client::Grpc::new(conn);
    grpc.ready()
        .await
        .map_err(|e| format!("the connection to the gateway is not ready: {e}"))?;
    let mut request =
        tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx).map(|m| *m));
    request
        .extensions_mut()
        .insert(tonic::GrpcMethod::new("bcd.v1.Gateway", "Session"));
    let codec = SessionCodec(tonic::codec::BufferSettings::new(
        stream_buffer,
        YIELD_THRESHOLD,
    ));
    let stream = grpc
        .streaming(
            request,
            tonic::codegen::http::uri::PathAndQuery::from_static(SESSION_PATH),
            codec,
        )
        .await
        .map_err(|s| format!("{}: {}", s.code(), s.message()))?
        .into_inner();
    let (closing, closed) = tokio::sync::watch::channel(());
    Ok(Stream {
        tx,
        rx: stream,
        gateway,
        conn: tunnels,
        closed,
        _closing: closing,
    })
}

/// A renewed key and certificate, ready to install.
#[derive(Debug)]
pub struct Renewed {
    /// What `node.key` becomes: a PEM key, or the next key's TPM record.
    pub key_pem: String,
    pub cert: CertificateDer<'static>,
    pub next: NextCert,
    /// The next key in the TPM (its record is `key_pem`), for a TPM-held
    /// identity.
    pub tpm: Option<(bcd_tpm::NodeKeyRecord, bcd_tpm::PublicArea)>,
}

/// A renewal that failed: why, and whether another attempt can help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewFailed {
    pub message: String,
    pub failure: bcd_core::renewal::Failure,
}

impl RenewFailed {
    /// A failure no retry mends (the TPM derives another AK).
    pub fn final_failure(message: impl Into<String>) -> Self {
        RenewFailed {
            message: message.into(),
            failure: bcd_core::renewal::Failure::Final,
        }
    }
}

/// Any other failure: worth another attempt after the back-off.
impl From<String> for RenewFailed {
    fn from(message: String) -> Self {
        RenewFailed {
            message,
            failure: bcd_core::renewal::Failure::Transient,
        }
    }
}

impl From<&str> for RenewFailed {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

impl std::fmt::Display for RenewFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The current node key and what its renewal proof names.
#[derive(Debug)]
pub struct Current {
    pub identity: tls::ClientIdentity,
    pub key_pem: String,
    pub node_id: String,
    /// The node's estimate of the server's time now.
    pub server_now_ms: i64,
    /// The certificate has run out (x509pop): a TLS session cannot present
    /// it, so the request carries it, and only the proof stands for the key.
    pub expired: bool,
}

/// Renew: a new key, proven by its CSR, over a session authenticated with
/// the current certificate, and a proof of possession of the current key
/// (`bcd_proto::renew`) for a join service behind a gateway. A certificate
/// that has run out goes in the request instead (x509pop), over a session
/// without a client certificate.
pub async fn renew_certificate(
    server: &str,
    ca: CertificateDer<'static>,
    current: Current,
    hostname: &str,
) -> Result<Renewed, String> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, hostname);
    params.distinguished_name = dn;
    let csr = crate::tpm_key::csr(&params, &key).map_err(|e| e.to_string())?;
    let csr_der = csr.der().to_vec();
    let statement = bcd_proto::renew::statement(&current.node_id, current.server_now_ms, &csr_der);
    let proof = KeyPair::from_pem(&current.key_pem)
        .and_then(|k| rcgen::SigningKey::sign(&k, &statement))
        .map_err(|e| format!("cannot sign the renewal with the current node key: {e}"))?;
    let (presented, expired_cert_der) = if current.expired {
        let cert = current.identity.chain.first().map(|c| c.to_vec());
        (None, cert.unwrap_or_default())
    } else {
        (Some(current.identity), vec![])
    };
    let config =
        tls::client_config(ServerTrust::Ca(ca.clone()), presented).map_err(|e| format!("{e:#}"))?;
    let request = bcd_proto::v1::RenewRequest {
        csr_der,
        proof,
        proof_time_ms: current.server_now_ms,
        node_id: current.node_id,
        expired_cert_der,
        next_key: None,
    };
    let resp = send_renewal(server, config, request, &ca).await?;
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
        tpm: None,
    })
}

/// Sends a renewal over `config` and checks the CA's signature on the
/// response: the times the next renewal is scheduled by come signed by
/// the CA.
async fn send_renewal(
    server: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
    request: bcd_proto::v1::RenewRequest,
    ca: &CertificateDer<'static>,
) -> Result<bcd_proto::v1::RenewResponse, String> {
    let csr_der = request.csr_der.clone();
    let conn = tls::dial(server, config)
        .await
        .map_err(|e| bcd_sys::error::chain(&e))?;
    let resp = JoinClient::new(conn)
        .renew(request)
        .await
        .map_err(|s| format!("the server refused the renewal: {}", s.message()))?
        .into_inner();
    bcd_proto::joined::verify_renewal(&resp, &csr_der, ca).map_err(|e| e.to_string())?;
    Ok(resp)
}

/// The current TPM-held certificate and what its renewal proof names.
#[derive(Debug)]
pub struct TpmCurrent {
    pub cert: CertificateDer<'static>,
    pub key: std::sync::Arc<crate::tpm_key::TpmKey>,
    pub node_id: String,
    /// The node's estimate of the server's time now.
    pub server_now_ms: i64,
    /// The certificate has run out (x509pop): see [`Current::expired`].
    pub expired: bool,
}

/// Renew a certificate that names the TPM's AK: a next key made in the
/// same TPM from a fresh record, its CSR signed there, certified by the AK
/// over the renewal's proof statement, and the proof signed by the current
/// key in the TPM. Before any request, the TPM must answer and its AK must
/// be the certificate's (the spec's texts otherwise). Never a file key.
/// Another AK is a [`RenewFailed::final_failure`]: no attempt in this TPM
/// can succeed.
pub async fn renew_tpm_certificate(
    server: &str,
    ca: CertificateDer<'static>,
    current: TpmCurrent,
    hostname: &str,
) -> Result<Renewed, RenewFailed> {
    use crate::tpm_key::{TPM_OTHER_AK, TPM_UNAVAILABLE};
    let TpmCurrent {
        cert,
        key,
        node_id,
        server_now_ms,
        expired,
    } = current;
    let expected_ak = crate::tpm_key::certificate_ak(&cert)
        .ok_or("the certificate names no TPM attestation key")?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, hostname);
    params.distinguished_name = dn;
    let (k, id) = (key.clone(), node_id.clone());
    let prepared = crate::tpm_key::blocking(move || {
        let tpm_failed = |e: bcd_tpm::Error| {
            if e.is_unreachable() {
                TPM_UNAVAILABLE.to_string()
            } else {
                format!("the TPM failed: {}", bcd_sys::error::chain(&e))
            }
        };
        let ak = k
            // Derived now, not what the connection loaded at the start.
            .with_fresh_tpm(|t| {
                bcd_tpm::check_ak(t, &bcd_tpm::Name::from_bytes(expected_ak.clone()))
            })
            .map_err(|e| match e {
                bcd_tpm::Error::AkMismatch { .. } => RenewFailed::final_failure(TPM_OTHER_AK),
                e => tpm_failed(e).into(),
            })?;
        let record = bcd_tpm::NodeKeyRecord::generate()
            .map_err(|_| "no randomness for the next node key".to_string())?;
        let public = k
            .with_tpm(|t| t.node_key_public(&record))
            .map_err(tpm_failed)?;
        let signer = k
            .signer(record.clone(), &public)
            .ok_or("the TPM's next key is not a P-256 key")?;
        let csr_der = crate::tpm_key::csr(&params, &signer)
            .map_err(|e| format!("the TPM did not sign the certificate request: {e}"))?
            .der()
            .to_vec();
        let statement = bcd_proto::renew::statement(&id, server_now_ms, &csr_der);
        let proof = k.sign(&statement).map_err(tpm_failed)?;
        let qualifying = bcd_proto::attest::renewal_qualifying_data(&statement);
        let certification = k
            .with_tpm(|t| t.certify(&record, &qualifying))
            .map_err(tpm_failed)?;
        Ok::<_, RenewFailed>((ak, record, public, csr_der, proof, certification))
    });
    let (ak, record, public, csr_der, proof, certification) = prepared?;

    // A certificate that ran out (x509pop) cannot be presented in TLS: it
    // goes in the request, and the proof made in the TPM stands for the key.
    let (config, expired_cert_der) = if expired {
        let config = tls::client_config(ServerTrust::Ca(ca.clone()), None);
        (config, cert.to_vec())
    } else {
        let config = tls::client_config_signed(
            ServerTrust::Ca(ca.clone()),
            tls::ClientSigner {
                chain: vec![cert],
                key: key.rustls_key(),
            },
        );
        (config, vec![])
    };
    let config = config.map_err(|e| format!("{e:#}"))?;
    let request = bcd_proto::v1::RenewRequest {
        csr_der,
        proof,
        proof_time_ms: server_now_ms,
        node_id,
        expired_cert_der,
        next_key: Some(bcd_proto::v1::KeyCertification {
            version: bcd_proto::attest::VERSION,
            ak_public: ak.tpmt_bytes().to_vec(),
            key_public: public.tpmt_bytes().to_vec(),
            certify_attest: certification.attest,
            certify_signature: certification.signature,
        }),
    };
    let resp = send_renewal(server, config, request, &ca).await?;
    let cert = CertificateDer::from(resp.cert_der);
    let spki = public
        .spki_der()
        .ok_or("the next key has no P-256 key info")?;
    if !cert.windows(spki.len()).any(|w| w == spki.as_slice()) {
        return Err("the renewed certificate is not for the new key".into());
    }
    if crate::tpm_key::certificate_ak(&cert).as_deref() != Some(ak.name().as_bytes()) {
        return Err("the renewed certificate does not name this TPM's attestation key".into());
    }
    Ok(Renewed {
        key_pem: record.to_text(),
        cert,
        next: NextCert {
            serial: resp.cert_serial,
            not_after_ms: resp.not_after_ms,
            issued_ms: resp.server_time_ms,
        },
        tpm: Some((record, public)),
    })
}

/// How long a release download keeps trying through transport failures
/// (a gateway or the control plane restarting) before the upgrade fails.
pub const FETCH_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// Whether a failed call may work if tried again: anything but a refusal
/// (a transport failure mid-call reaches us as Internal or Unknown, a
/// server starting, stopping or full as Unavailable or ResourceExhausted).
fn transient(code: tonic::Code) -> bool {
    !matches!(
        code,
        tonic::Code::InvalidArgument
            | tonic::Code::NotFound
            | tonic::Code::AlreadyExists
            | tonic::Code::PermissionDenied
            | tonic::Code::FailedPrecondition
            | tonic::Code::OutOfRange
            | tonic::Code::Unimplemented
            | tonic::Code::Unauthenticated
            | tonic::Code::DataLoss
    )
}

/// Downloads a release over the node's own session credentials and checks
/// it before anything is written: the manifest must verify against the
/// release keys learned at join, and the binary must match it. The release
/// streams in chunks (`FetchReleaseChunks`) put together by
/// [`release::assemble::Assembly`]; a server that predates the stream
/// hands it whole (`FetchRelease`). Transport failures are tried again with
/// back-off for [`FETCH_RETRY_FOR`], resuming where the download broke; a
/// refusal, or bytes that do not fit the manifest, fail at once.
pub async fn fetch_release(
    identity: &Identity,
    sequence: u64,
) -> Result<(release::Manifest, Vec<u8>), String> {
    let mut backoff = bcd_core::backoff::Backoff::new(bcd_core::backoff::BackoffConfig {
        base: std::time::Duration::from_secs(1),
        cap: std::time::Duration::from_secs(15),
    });
    let mut rng = bcd_core::SplitMix64::new(sequence ^ std::process::id() as u64);
    let started = bcd_sys::clock::mono();
    let mut partial = None;
    loop {
        let (e, again) = match download(identity, sequence, &mut partial).await {
            Ok(done) => return Ok(done),
            Err(e) => e,
        };
        if !again || started.elapsed() >= FETCH_RETRY_FOR {
            return Err(e);
        }
        let delay = backoff.next_delay(&mut rng);
        let resume_at = partial.as_ref().map_or(0, Assembly::received);
        tracing::warn!(error = %e, retry_in = ?delay, resume_at, "release download failed; trying again");
        tokio::time::sleep(delay).await;
    }
}

/// A failed download attempt: why, and whether to try again.
type Failed = (String, bool);

/// One download attempt, continuing `partial` (what earlier attempts put
/// together) where there is one.
async fn download(
    identity: &Identity,
    sequence: u64,
    partial: &mut Option<Assembly>,
) -> Result<(release::Manifest, Vec<u8>), Failed> {
    let config = identity.client_config().map_err(|e| (e, false))?;
    let conn = tls::dial(&identity.file.server, config)
        .await
        .map_err(|e| (bcd_sys::error::chain(&e), true))?;
    let mut client = JoinClient::new(conn);
    let offset = partial.as_ref().map_or(0, Assembly::received);
    let refused = |s: tonic::Status| {
        (
            format!(
                "the server did not hand out release {sequence}: {}",
                s.message()
            ),
            transient(s.code()),
        )
    };
    let mut stream = match client
        .fetch_release_chunks(bcd_proto::v1::FetchReleaseRequest { sequence, offset })
        .await
    {
        Ok(s) => s.into_inner(),
        Err(s) if s.code() == tonic::Code::Unimplemented => {
            return whole(client, identity, sequence).await;
        }
        Err(s) => return Err(refused(s)),
    };
    let first = stream.message().await.map_err(refused)?.ok_or_else(|| {
        (
            format!("the server ended release {sequence}'s download before its manifest"),
            true,
        )
    })?;
    if first.signed_manifest.is_empty() || !first.data.is_empty() {
        return Err((
            format!("the server's download of release {sequence} does not start with its manifest"),
            false,
        ));
    }
    let manifest = verified(identity, sequence, &first.signed_manifest).map_err(|e| (e, false))?;
    let assembly = match partial {
        Some(a) if *a.manifest() == manifest => a,
        Some(_) => {
            *partial = None;
            return Err((
                format!("release {sequence}'s manifest changed while it downloaded; starting over"),
                true,
            ));
        }
        None => partial.insert(Assembly::new(manifest).map_err(|e| (e.to_string(), false))?),
    };
    while let Some(chunk) = stream.message().await.map_err(refused)? {
        if !chunk.signed_manifest.is_empty() {
            *partial = None;
            return Err((
                format!("the server sent release {sequence}'s manifest twice in one download"),
                false,
            ));
        }
        if let Err(e) = assembly.push(chunk.offset, &chunk.data) {
            *partial = None;
            return Err((e.to_string(), false));
        }
    }
    let done = partial.take().expect("assembled above");
    done.finish().map_err(|e| (e.to_string(), false))
}

/// A release whole, from a server without `FetchReleaseChunks`.
async fn whole(
    mut client: JoinClient<bcd_proto::tls::Conn>,
    identity: &Identity,
    sequence: u64,
) -> Result<(release::Manifest, Vec<u8>), Failed> {
    let resp = client
        .fetch_release(bcd_proto::v1::FetchReleaseRequest {
            sequence,
            offset: 0,
        })
        .await
        .map_err(|s| {
            (
                format!(
                    "the server did not hand out release {sequence}: {}",
                    s.message()
                ),
                transient(s.code()),
            )
        })?
        .into_inner();
    let manifest = verified(identity, sequence, &resp.signed_manifest).map_err(|e| (e, false))?;
    manifest
        .check(&resp.binary)
        .map_err(|e| (e.to_string(), false))?;
    Ok((manifest, resp.binary))
}

/// A release's signed manifest, verified against the fleet's release keys
/// and for the release asked for.
fn verified(
    identity: &Identity,
    sequence: u64,
    signed_manifest: &[u8],
) -> Result<release::Manifest, String> {
    let keys: Vec<Vec<u8>> = identity
        .file
        .release_keys
        .iter()
        .filter_map(|k| hex::decode(k).ok())
        .collect();
    let signed = release::SignedManifest::parse(signed_manifest).map_err(|e| e.to_string())?;
    let manifest = signed.verify(&keys).map_err(|e| e.to_string())?;
    if manifest.sequence != sequence {
        return Err(format!(
            "asked for release {sequence}, got a manifest for {}",
            manifest.sequence
        ));
    }
    Ok(manifest)
}

/// The folder under the data directory an image for `boot.kexec image=`
/// is written to unless the agent names another (`Agent::kexec_dir`;
/// emptied before each download, removed when it fails).
pub const KEXEC_DIR: &str = "kexec";

/// A netboot image fetched and verified for `boot.kexec image=`: where its
/// kernel and initrd were written, and the command line to boot them with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KexecImage {
    pub image_id: String,
    pub name: String,
    pub kernel: std::path::PathBuf,
    pub initrd: std::path::PathBuf,
    pub cmdline: String,
}

/// Fetches image `image_id` over the node's own certificate (`FetchImage`)
/// into `dir`, and says whether it may be loaded: its signed manifest must
/// verify against the image keys learned at join (checked as soon as it
/// arrives, before any of the image's bytes are taken) and be that image's,
/// and the kernel and initrd, hashed as they are written, must match it
/// (`image::fetch`). `extra` follows the manifest's command line. On any
/// failure `dir` is removed and the reason says what did not verify.
pub async fn fetch_image(
    identity: &Identity,
    image_id: &str,
    extra: &str,
    dir: &std::path::Path,
) -> Result<KexecImage, String> {
    let result = fetch_image_into(identity, image_id, extra, dir).await;
    if result.is_err() {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

async fn fetch_image_into(
    identity: &Identity,
    image_id: &str,
    extra: &str,
    dir: &std::path::Path,
) -> Result<KexecImage, String> {
    use image::fetch;

    let keys: Vec<Vec<u8>> = identity
        .file
        .image_keys
        .iter()
        .filter_map(|k| hex::decode(k).ok())
        .collect();
    if keys.is_empty() {
        return Err(fetch::NotLoaded::NoKeys.to_string());
    }
    let config = identity.client_config()?;
    let conn = tls::dial(&identity.file.server, config)
        .await
        .map_err(|e| format!("cannot reach the server: {}", bcd_sys::error::chain(&e)))?;
    let refused = |s: tonic::Status| {
        format!(
            "the server did not hand out image {image_id}: {}",
            s.message()
        )
    };
    let mut stream = JoinClient::new(conn)
        .fetch_image(bcd_proto::v1::FetchImageRequest {
            image_id: image_id.to_string(),
        })
        .await
        .map_err(refused)?
        .into_inner();
    let mut writing: Option<ImageFiles> = None;
    while let Some(chunk) = stream.message().await.map_err(refused)? {
        match &mut writing {
            None => writing = Some(ImageFiles::start(image_id, &chunk, &keys, dir)?),
            Some(w) => w.take(chunk)?,
        }
    }
    let w = writing.ok_or_else(|| {
        format!("the server ended image {image_id}'s download before its manifest")
    })?;
    w.finish(image_id, extra)
}

/// An image download being written: the two files, and what
/// `image::fetch::Download` (holding the verified manifest) has checked of
/// them.
struct ImageFiles {
    download: image::fetch::Download,
    kernel: (std::path::PathBuf, std::fs::File),
    initrd: (std::path::PathBuf, std::fs::File),
}

impl ImageFiles {
    /// The first chunk: the signed manifest alone, which must verify
    /// before `dir` is created.
    fn start(
        image_id: &str,
        first: &bcd_proto::v1::ImageChunk,
        keys: &[Vec<u8>],
        dir: &std::path::Path,
    ) -> Result<ImageFiles, String> {
        if first.signed_manifest.is_empty() || !first.data.is_empty() {
            return Err(format!(
                "the server's download of image {image_id} does not start with its manifest: \
                 nothing was loaded"
            ));
        }
        let manifest = image::fetch::verified_manifest(image_id, &first.signed_manifest, keys)
            .map_err(|e| e.to_string())?;
        let download = image::fetch::Download::new(manifest).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(dir);
        let file = |name: &str| {
            let path = dir.join(name);
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::File::create(&path))
                .map(|f| (path, f))
                .map_err(|e| format!("writing the image to {}: {e}", dir.display()))
        };
        Ok(ImageFiles {
            download,
            kernel: file(image::KERNEL_FILE)?,
            initrd: file(image::INITRD_FILE)?,
        })
    }

    /// A later chunk: appended to its file only once the download took it.
    fn take(&mut self, chunk: bcd_proto::v1::ImageChunk) -> Result<(), String> {
        use bcd_proto::v1::ImagePart;
        use image::fetch::Which;
        use std::io::Write;
        let (which, (path, file)) = match ImagePart::try_from(chunk.part) {
            _ if !chunk.signed_manifest.is_empty() => {
                return Err(
                    "the server sent the image manifest twice in one download: nothing was loaded"
                        .to_string(),
                );
            }
            Ok(ImagePart::Kernel) => (Which::Kernel, &mut self.kernel),
            Ok(ImagePart::Initrd) => (Which::Initrd, &mut self.initrd),
            _ => {
                return Err(format!(
                    "the server sent a chunk of no known part of the image (part {}): nothing \
                     was loaded",
                    chunk.part
                ));
            }
        };
        self.download
            .push(which, chunk.offset, &chunk.data)
            .map_err(|e| e.to_string())?;
        file.write_all(&chunk.data)
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// The stream ended: both files whole, on disk, and matching the
    /// manifest, or why not.
    fn finish(self, image_id: &str, extra: &str) -> Result<KexecImage, String> {
        let load = self.download.finish(extra).map_err(|e| e.to_string())?;
        for (path, file) in [&self.kernel, &self.initrd] {
            file.sync_all()
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        Ok(KexecImage {
            image_id: image_id.to_string(),
            name: load.manifest.name,
            kernel: self.kernel.0,
            initrd: self.initrd.0,
            cmdline: load.cmdline,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_core::renewal::Failure;

    #[test]
    fn only_another_ak_is_a_failure_no_retry_mends() {
        let other_ak = RenewFailed::final_failure(crate::tpm_key::TPM_OTHER_AK);
        assert_eq!(other_ak.failure, Failure::Final);
        assert_eq!(other_ak.to_string(), crate::tpm_key::TPM_OTHER_AK);
        // The TPM unreachable, a refusal, a transport failure: retried.
        for e in [
            RenewFailed::from(crate::tpm_key::TPM_UNAVAILABLE),
            RenewFailed::from("the server refused the renewal: transport error".to_string()),
        ] {
            assert_eq!(e.failure, Failure::Transient, "{e}");
        }
    }

    #[test]
    fn the_session_path_is_the_gateway_services() {
        assert_eq!(
            SESSION_PATH,
            format!("/{}/Session", bcd_proto::v1::gateway_server::SERVICE_NAME)
        );
    }
}
