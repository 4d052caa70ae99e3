//! TLS for both ends, on rustls with ring as the one crypto provider.
//!
//! Clients dial through [`dial`] (one HTTP/2 connection, what bcd uses) or
//! [`connect`] (a tonic channel that dials again by itself, for the
//! server's long-lived links; the `channel` feature), both of which dial
//! TCP and run the TLS handshake themselves: this is how a joining node
//! pins the fleet CA from its token before it has the CA, and how every
//! node presents its certificate. Servers accept through [`incoming`],
//! which hands tonic connections that carry the peer's certificate, so
//! handlers know which node is speaking. Client certificates are verified
//! against the fleet CA but optional at the TLS layer: Join has none yet,
//! and every other service refuses a request without one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::net::TcpStream;
#[cfg(feature = "channel")]
use tonic::transport::{Channel, Endpoint};

use crate::{GATEWAY_NAME, fingerprint};

/// How long a peer may take to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 PINGs on idle and busy connections alike, to find dead links.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("certificate or key is not usable")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("server address {0:?} is not of the form https://HOST:PORT")]
    BadAddress(String),
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: DialError,
    },
}

/// ring's provider, with TLS13_AES_128_GCM_SHA256 first among its suites
/// (ring lists AES-256-GCM with SHA-384 first): the handshake's transcript
/// hash and key schedule then run on SHA-256, which current x86 and ARM
/// CPUs do in hardware, where SHA-384 runs in software (in a gateway's
/// profile during a reconnect storm: 2.9 % of its CPU in SHA-384, 1.0 % in
/// SHA-256 after). A server follows the client's order, so a node with an
/// older bcd still gets the suite it asks for.
pub fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

/// How a client decides to trust the server.
#[derive(Debug, Clone)]
pub enum ServerTrust {
    /// The fleet CA this node or operator already holds.
    Ca(CertificateDer<'static>),
    /// First contact: the server must present, in its chain, a CA whose
    /// SHA-256 is this hex pin, and its certificate must chain to that CA.
    Pin(String),
}

/// A client certificate chain and its key.
#[derive(Debug)]
pub struct ClientIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

/// A client certificate chain whose key signs elsewhere (a TPM): rustls
/// asks `key` for each handshake's signature.
#[derive(Debug, Clone)]
pub struct ClientSigner {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: Arc<dyn rustls::sign::SigningKey>,
}

/// Presents one certificate and key to every server.
#[derive(Debug)]
struct FixedClientCert(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for FixedClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        schemes: &[SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.key.choose_scheme(schemes)?;
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

pub fn client_config(
    trust: ServerTrust,
    identity: Option<ClientIdentity>,
) -> Result<Arc<ClientConfig>, TlsError> {
    build_client_config(trust, identity.map(Auth::Key))
}

/// [`client_config`] with a certificate whose key signs through `signer`.
pub fn client_config_signed(
    trust: ServerTrust,
    signer: ClientSigner,
) -> Result<Arc<ClientConfig>, TlsError> {
    build_client_config(trust, Some(Auth::Signer(signer)))
}

enum Auth {
    Key(ClientIdentity),
    Signer(ClientSigner),
}

fn build_client_config(
    trust: ServerTrust,
    identity: Option<Auth>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match trust {
        ServerTrust::Ca(ca) => ca_verifier(ca, provider.clone())?,
        ServerTrust::Pin(pin) => Arc::new(PinVerifier {
            pin: pin.to_ascii_lowercase(),
            provider: provider.clone(),
        }),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match identity {
        Some(Auth::Key(id)) => builder.with_client_auth_cert(id.chain, id.key)?,
        Some(Auth::Signer(s)) => builder.with_client_cert_resolver(Arc::new(FixedClientCert(
            Arc::new(rustls::sign::CertifiedKey::new(s.chain, s.key)),
        ))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.resumption = rustls::client::Resumption::in_memory_sessions(RESUMPTION_SERVERS);
    Ok(Arc::new(config))
}

/// Servers a client configuration keeps TLS sessions for. A configuration
/// speaks to one server name (the gateway's or the API's); rustls' default
/// makes room for 256 up front, about 5 KiB a configuration, which a fleet
/// of agents in one process (`bcd sim`) pays per agent.
const RESUMPTION_SERVERS: usize = 4;

fn ca_verifier(
    ca: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.add(ca)?;
    let v = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    Ok(v)
}

/// Trust on first contact, bounded by a pin the operator handed over with
/// the join token.
#[derive(Debug)]
struct PinVerifier {
    pin: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| fingerprint(c) == self.pin)
            .ok_or_else(|| {
                rustls::Error::General(format!(
                    "the server's CA does not match the token's pin sha256:{}; check --server, \
                     or ask the operator for a token from this server",
                    self.pin
                ))
            })?;
        let v = ca_verifier(ca.clone().into_owned(), self.provider.clone())
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        v.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `https://host:port`, `host:port` → `host:port`.
pub fn host_port(url: &str) -> Result<String, TlsError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url);
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
        return Err(TlsError::BadAddress(url.to_string()));
    }
    Ok(rest.to_string())
}

/// One HTTP/2 connection to a gateway over our TLS,
/// for tonic clients: `JoinClient::new(conn)`, `Grpc::new(conn)`. Clones
/// share the connection. Unlike a tonic `Channel` it never dials again:
/// once the connection is gone every call fails, and the caller dials anew
/// (a node's session, a join, a download each make their own). It holds no
/// request queue and no worker task of its own, so a fleet of simulated
/// nodes in one process pays only for the connection itself.
#[derive(Debug, Clone)]
pub struct Conn {
    send: hyper::client::conn::http2::SendRequest<tonic::body::Body>,
    /// `host:port` as dialled: the `:authority` of every request.
    authority: http::uri::Authority,
    /// SHA-256 of the server's certificate (DER, lowercase hex).
    peer_sha256: Arc<str>,
}

impl Conn {
    /// SHA-256 of the certificate the server presented (DER, lowercase
    /// hex): which gateway this is, as a revocation list names it.
    pub fn peer_sha256(&self) -> &str {
        &self.peer_sha256
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Conn {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        // tonic's clients send the method's path only; HTTP/2 needs the
        // scheme and authority beside it.
        let mut parts = std::mem::take(req.uri_mut()).into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
        Box::pin(self.send.send_request(req))
    }
}

/// Dials the gateway at `url` over our TLS, checking its certificate for
/// [`GATEWAY_NAME`]. The connection is made now (TCP, the TLS handshake and
/// HTTP/2's preface), so an unreachable server or a refused certificate
/// fails here.
pub async fn dial(url: &str, config: Arc<ClientConfig>) -> Result<Conn, TlsError> {
    let addr = host_port(url)?;
    let failed = |source: DialError| TlsError::Connect {
        addr: addr.clone(),
        source,
    };
    let authority = http::uri::Authority::try_from(addr.as_str())
        .map_err(|_| TlsError::BadAddress(url.to_string()))?;
    let tls = tls_stream(&addr, config, GATEWAY_NAME)
        .await
        .map_err(|e| failed(DialError::Io(e)))?;
    let peer_sha256: Arc<str> = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| crate::fingerprint(c))
        .unwrap_or_default()
        .into();
    let (send, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_INTERVAL)
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(tls))
        .await
        .map_err(|e| failed(DialError::Http2(e)))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "connection ended");
        }
    });
    Ok(Conn {
        send,
        authority,
        peer_sha256,
    })
}

/// What failed while dialling.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("HTTP/2: {0}")]
    Http2(#[source] hyper::Error),
    #[cfg(feature = "channel")]
    #[error(transparent)]
    Channel(tonic::transport::Error),
}

/// TCP to `addr`, then the TLS handshake checking the server's certificate
/// for `name`; each step within its own time limit.
async fn tls_stream(
    addr: &str,
    config: Arc<ClientConfig>,
    name: &'static str,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TCP connect timed out"))??;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(name).map_err(io::Error::other)?;
    tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?
}

/// How long a TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects a tonic channel to `url` over our TLS: for a long-lived link
/// that should dial again by itself when its connection drops (a gateway's
/// link to the key-holding process, an operator's client). The connection
/// is made now, so an unreachable server or a refused certificate fails
/// here.
#[cfg(feature = "channel")]
pub async fn connect(url: &str, config: Arc<ClientConfig>) -> Result<Channel, TlsError> {
    connect_named(url, config, GATEWAY_NAME).await
}

/// As [`connect`], checking the server's certificate for `name` (the
/// operator API's is [`crate::API_NAME`]) instead of the gateway's.
#[cfg(feature = "channel")]
pub async fn connect_named(
    url: &str,
    config: Arc<ClientConfig>,
    name: &'static str,
) -> Result<Channel, TlsError> {
    let addr = host_port(url)?;
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|_| TlsError::BadAddress(url.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_INTERVAL)
        .keep_alive_while_idle(true);
    let dial = addr.clone();
    let service = tower::service_fn(move |_: http::Uri| {
        let config = config.clone();
        let dial = dial.clone();
        async move {
            let tls = tls_stream(&dial, config, name).await?;
            Ok::<_, io::Error>(TokioIo::new(tls))
        }
    });
    endpoint
        .connect_with_connector(service)
        .await
        .map_err(|source| TlsError::Connect {
            addr,
            source: DialError::Channel(source),
        })
}

/// Server configuration: our chain and key; client certificates verified
/// against `client_ca` when presented.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: CertificateDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = server_builder(client_ca)?.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    resumable(&mut config)?;
    Ok(Arc::new(config))
}

/// Server configuration whose certificate `resolver` picks at each
/// handshake (one that is renewed while the server runs); client
/// certificates verified against `client_ca` when presented.
pub fn server_config_resolving(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    client_ca: CertificateDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = server_builder(client_ca)?.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    resumable(&mut config)?;
    Ok(Arc::new(config))
}

/// Session tickets for the gateway port: a node that dials again resumes
/// (TLS 1.3 PSK with a fresh ECDHE) and skips the certificate signatures
/// and chain checks of a full handshake on both ends.
///
/// Each process encrypts its tickets under its own key, made at start and
/// rotated by rustls every six hours; no key is shared or stored, so a
/// ticket is good only at the gateway that issued it, and a gateway can
/// mint none another gateway accepts. A resumed session carries the client
/// chain of the handshake it resumes; expiry and revocation are checked at
/// Hello against the store either way. A node caches its client
/// configuration per certificate, so a renewed certificate starts with a
/// full handshake.
fn resumable(config: &mut ServerConfig) -> Result<(), TlsError> {
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    config.send_tls13_tickets = TICKETS_PER_HANDSHAKE;
    Ok(())
}

/// Tickets a server sends after each handshake: a node holds one session
/// at a time, so one ticket serves its next dial (each resumption brings a
/// new one).
const TICKETS_PER_HANDSHAKE: usize = 1;

fn server_builder(
    client_ca: CertificateDer<'static>,
) -> Result<rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>, TlsError> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    roots.add(client_ca)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    Ok(ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier))
}

/// Server configuration that requires a client certificate issued by
/// `client_ca`: the handshake fails without one (the operator API).
pub fn server_config_mutual(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: CertificateDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    client_verified(chain, key, client_ca, true, b"h2")
}

/// Server configuration for HTTPS to browsers (the web console): HTTP/1.1,
/// TLS 1.3, and a client certificate from `client_ca` taken when the
/// browser offers one, not required.
pub fn server_config_browser(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: CertificateDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    client_verified(chain, key, client_ca, false, b"http/1.1")
}

/// TLS 1.3 serving `chain`, verifying client certificates against
/// `client_ca` (one `required`, or taken when offered), speaking `alpn`.
fn client_verified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: CertificateDer<'static>,
    required: bool,
    alpn: &[u8],
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    roots.add(client_ca)?;
    let mut verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    if !required {
        verifier = verifier.allow_unauthenticated();
    }
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier.build()?)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

#[cfg(feature = "server")]
pub use accept::*;

/// The accepting side, for the server.
#[cfg(feature = "server")]
mod accept {
    use std::io;
    use std::net::SocketAddr;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use rustls::ServerConfig;
    use rustls_pki_types::CertificateDer;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::{TcpListener, TcpStream};

    use super::HANDSHAKE_TIMEOUT;
    use crate::fingerprint;

    /// Who is on the other end of a server connection.
    #[derive(Debug, Clone)]
    pub struct PeerInfo {
        pub remote: SocketAddr,
        /// The verified client certificate (end entity), if one was presented.
        pub cert: Option<Arc<CertificateDer<'static>>>,
        /// Its SHA-256, hex.
        pub cert_fingerprint: Option<String>,
    }

    /// A server connection after a completed handshake. It holds one of
    /// the listener's connection slots until it is dropped.
    #[derive(Debug)]
    pub struct TlsConn {
        inner: tokio_rustls::server::TlsStream<TcpStream>,
        info: PeerInfo,
        _slot: tokio::sync::OwnedSemaphorePermit,
        _address: AddressSlot,
    }

    impl tonic::transport::server::Connected for TlsConn {
        type ConnectInfo = PeerInfo;

        fn connect_info(&self) -> PeerInfo {
            self.info.clone()
        }
    }

    impl AsyncRead for TlsConn {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for TlsConn {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.inner).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.inner.is_write_vectored()
        }
    }

    /// Decides, per accepted TCP connection, whether to run the handshake now.
    /// The gateway uses it for its handshake token bucket.
    pub trait Admission: Send + Sync + 'static {
        fn admit(&self, remote: std::net::IpAddr) -> bool;
        /// A handshake from `remote` presented a client certificate the
        /// fleet CA signed; `resumed` when it resumed an earlier session
        /// (the certificate is that session's).
        fn authenticated(&self, _remote: std::net::IpAddr, _resumed: bool) {}
        /// A connection from `remote` was closed as it arrived: its
        /// address already held [`ConnectionCaps::per_address`].
        fn over_address_cap(&self, _remote: std::net::IpAddr) {}
    }

    /// How many connections a listener holds open at once, handshakes
    /// included, and what counts as a connection's source address.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ConnectionCaps {
        /// From everyone.
        pub total: usize,
        /// From one source address (see [`PerAddress`]).
        pub per_address: usize,
        /// Load balancers that send a PROXY protocol v2 header first: a
        /// connection from one of them counts as the client's address in
        /// its header, never as the balancer's ([`read_proxy_v2`]).
        pub balancers: Vec<std::net::IpAddr>,
    }

    /// The longest PROXY v2 header read: the addresses and the TLVs a
    /// balancer adds (HAProxy's unique id, an NLB's endpoint id) fit well
    /// inside it; a longer one is refused unread.
    pub const MAX_PROXY_HEADER: usize = 1024;

    /// Reads a PROXY protocol v2 header off the start of `stream`, and not
    /// a byte more (the TLS handshake follows it). Returns the client's
    /// address for a proxied TCP connection over IPv4 or IPv6, and `None`
    /// for the balancer's own connection (the LOCAL command: its health
    /// checks) or an address family that is not IP. Anything else (a
    /// connection that does not start with the signature, another
    /// version, a header longer than [`MAX_PROXY_HEADER`]) is an error
    /// that names what was wrong.
    pub async fn read_proxy_v2<R>(stream: &mut R) -> io::Result<Option<SocketAddr>>
    where
        R: AsyncRead + Unpin,
    {
        use ppp::v2::{Addresses, Command, Header, ParseError};
        use tokio::io::AsyncReadExt;

        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let mut header = vec![0u8; 16];
        stream.read_exact(&mut header).await?;
        let length = usize::from(u16::from_be_bytes([header[14], header[15]]));
        match Header::try_from(&header[..]) {
            Ok(_) | Err(ParseError::Partial(..)) => {}
            Err(e) => return Err(bad(format!("not a PROXY protocol v2 header: {e}"))),
        }
        if 16 + length > MAX_PROXY_HEADER {
            return Err(bad(format!(
                "a PROXY protocol v2 header of {} bytes, over the {MAX_PROXY_HEADER} read",
                16 + length
            )));
        }
        header.resize(16 + length, 0);
        stream.read_exact(&mut header[16..]).await?;
        let parsed = Header::try_from(&header[..])
            .map_err(|e| bad(format!("not a PROXY protocol v2 header: {e}")))?;
        if parsed.command == Command::Local {
            return Ok(None);
        }
        Ok(match parsed.addresses {
            Addresses::IPv4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
            Addresses::IPv6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
            Addresses::Unspecified | Addresses::Unix(_) => None,
        })
    }

    /// Open connections counted by source address, sans-IO. An IPv4
    /// address counts alone (an IPv4-mapped IPv6 address as its IPv4
    /// one); an IPv6 address counts with its /64, the least a site is
    /// handed. Only addresses with a connection open are kept, so the
    /// table is no larger than the listener's total cap.
    #[derive(Debug, Clone)]
    pub struct PerAddress {
        limit: usize,
        open: std::collections::HashMap<std::net::IpAddr, usize>,
    }

    impl PerAddress {
        pub fn new(limit: usize) -> PerAddress {
            PerAddress {
                limit,
                open: std::collections::HashMap::new(),
            }
        }

        /// What `remote` counts as.
        pub fn key(remote: std::net::IpAddr) -> std::net::IpAddr {
            match remote {
                std::net::IpAddr::V4(_) => remote,
                std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                    Some(v4) => std::net::IpAddr::V4(v4),
                    None => std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                        u128::from(v6) & !((1u128 << 64) - 1),
                    )),
                },
            }
        }

        /// A connection from `remote` opens: false (and nothing counted)
        /// when its address is at the cap.
        pub fn open(&mut self, remote: std::net::IpAddr) -> bool {
            let key = Self::key(remote);
            let n = self.open.get(&key).copied().unwrap_or(0);
            if n >= self.limit {
                return false;
            }
            self.open.insert(key, n + 1);
            true
        }

        /// A connection [`open`](Self::open) admitted has closed.
        pub fn close(&mut self, remote: std::net::IpAddr) {
            let key = Self::key(remote);
            if let Some(n) = self.open.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.open.remove(&key);
                }
            }
        }

        /// Connections open from `remote`'s address.
        pub fn count(&self, remote: std::net::IpAddr) -> usize {
            self.open.get(&Self::key(remote)).copied().unwrap_or(0)
        }

        /// Addresses with a connection open.
        pub fn addresses(&self) -> usize {
            self.open.len()
        }
    }

    /// One connection's place in a [`PerAddress`] table, given back when
    /// the connection is dropped.
    #[derive(Debug)]
    pub struct AddressSlot {
        remote: std::net::IpAddr,
        table: Arc<std::sync::Mutex<PerAddress>>,
    }

    impl AddressSlot {
        /// A place for a connection from `remote`; `None` when its address
        /// is at the cap.
        pub fn take(
            table: &Arc<std::sync::Mutex<PerAddress>>,
            remote: std::net::IpAddr,
        ) -> Option<AddressSlot> {
            let admitted = table.lock().unwrap_or_else(|p| p.into_inner()).open(remote);
            admitted.then(|| AddressSlot {
                remote,
                table: table.clone(),
            })
        }
    }

    impl Drop for AddressSlot {
        fn drop(&mut self) {
            self.table
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .close(self.remote);
        }
    }

    /// Admits everything.
    #[derive(Debug, Clone, Copy)]
    pub struct AdmitAll;

    impl Admission for AdmitAll {
        fn admit(&self, _remote: std::net::IpAddr) -> bool {
            true
        }
    }

    /// What an accepted connection goes through before it is yielded.
    struct Accepting {
        acceptor: tokio_rustls::TlsAcceptor,
        admission: Arc<dyn Admission>,
        addresses: Arc<std::sync::Mutex<PerAddress>>,
        tx: tokio::sync::mpsc::Sender<Result<TlsConn, io::Error>>,
    }

    impl Accepting {
        /// A place under the address cap and a turn from the admission
        /// for a connection from `remote`; `None` (and the connection is
        /// to be closed) otherwise.
        fn admit(&self, remote: SocketAddr) -> Option<AddressSlot> {
            let Some(address) = AddressSlot::take(&self.addresses, remote.ip()) else {
                tracing::debug!(%remote, "at the per-address connection limit; closed");
                self.admission.over_address_cap(remote.ip());
                return None;
            };
            self.admission.admit(remote.ip()).then_some(address)
        }

        /// The TLS handshake, bounded by [`HANDSHAKE_TIMEOUT`]; a finished
        /// connection is yielded.
        async fn handshake(
            self,
            tcp: TcpStream,
            remote: SocketAddr,
            slot: tokio::sync::OwnedSemaphorePermit,
            address: AddressSlot,
        ) {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let conn = stream.get_ref().1;
                    let cert = conn
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| Arc::new(c.clone().into_owned()));
                    if cert.is_some() {
                        let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                        self.admission.authenticated(remote.ip(), resumed);
                    }
                    let info = PeerInfo {
                        remote,
                        cert_fingerprint: cert.as_deref().map(|c| fingerprint(c)),
                        cert,
                    };
                    let _ = self
                        .tx
                        .send(Ok(TlsConn {
                            inner: stream,
                            info,
                            _slot: slot,
                            _address: address,
                        }))
                        .await;
                }
                Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
            }
        }
    }

    /// Accepts TCP connections and completes TLS handshakes concurrently; yields
    /// finished connections for `Server::serve_with_incoming`. Handshake failures
    /// are logged and dropped, never fatal to the server. At most
    /// `caps.total` are open at once, handshakes included, and at most
    /// `caps.per_address` from one source address: one more is closed as
    /// it is accepted (over the address cap, counted through
    /// [`Admission::over_address_cap`]). A connection from one of
    /// `caps.balancers` is counted, admitted and reported as the client
    /// its PROXY v2 header names. The accept task ends when the
    /// returned stream is dropped.
    pub fn incoming(
        listener: TcpListener,
        config: Arc<ServerConfig>,
        admission: Arc<dyn Admission>,
        caps: ConnectionCaps,
    ) -> tokio_stream::wrappers::ReceiverStream<Result<TlsConn, io::Error>> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let slots = Arc::new(tokio::sync::Semaphore::new(caps.total));
        let addresses = Arc::new(std::sync::Mutex::new(PerAddress::new(caps.per_address)));
        let mut caps = caps;
        for b in &mut caps.balancers {
            *b = b.to_canonical();
        }
        tokio::spawn(async move {
            loop {
                let (tcp, remote) = tokio::select! {
                    r = listener.accept() => match r {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = tx.closed() => return,
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::debug!(%remote, "at the connection limit; closed");
                    drop(tcp);
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let proxied = caps.balancers.contains(&remote.ip().to_canonical());
                let conn = Accepting {
                    acceptor: acceptor.clone(),
                    admission: admission.clone(),
                    addresses: addresses.clone(),
                    tx: tx.clone(),
                };
                if proxied {
                    tokio::spawn(async move {
                        let mut tcp = tcp;
                        let client = match tokio::time::timeout(
                            HANDSHAKE_TIMEOUT,
                            read_proxy_v2(&mut tcp),
                        )
                        .await
                        {
                            Ok(Ok(client)) => client.unwrap_or(remote),
                            Ok(Err(e)) => {
                                tracing::debug!(balancer = %remote, error = %e, "PROXY header refused");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(balancer = %remote, "PROXY header timed out");
                                return;
                            }
                        };
                        if let Some(address) = conn.admit(client) {
                            conn.handshake(tcp, client, slot, address).await;
                        }
                    });
                } else if let Some(address) = conn.admit(remote) {
                    tokio::spawn(conn.handshake(tcp, remote, slot, address));
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_accepts_urls_and_bare_addresses() {
        assert_eq!(
            host_port("https://127.0.0.1:7443").unwrap(),
            "127.0.0.1:7443"
        );
        assert_eq!(host_port("https://[::1]:7443/").unwrap(), "[::1]:7443");
        assert_eq!(host_port("gw.example:443").unwrap(), "gw.example:443");
        assert!(host_port("https://nohost").is_err());
        assert!(host_port("https://h:1/path").is_err());
        assert!(host_port("").is_err());
    }

    #[cfg(feature = "server")]
    mod proxy_v2 {
        use super::super::{MAX_PROXY_HEADER, read_proxy_v2};
        use proptest::prelude::*;
        use std::net::{IpAddr, SocketAddr};

        const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

        /// A header as the HAProxy document lays it out, written here
        /// rather than by the parser's own builder.
        fn header(command: u8, src: SocketAddr, dst: SocketAddr, tlvs: &[u8]) -> Vec<u8> {
            let mut addresses = Vec::new();
            let family = match (src.ip(), dst.ip()) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    addresses.extend(s.octets());
                    addresses.extend(d.octets());
                    0x11
                }
                (IpAddr::V6(s), IpAddr::V6(d)) => {
                    addresses.extend(s.octets());
                    addresses.extend(d.octets());
                    0x21
                }
                _ => panic!("one family"),
            };
            addresses.extend(src.port().to_be_bytes());
            addresses.extend(dst.port().to_be_bytes());
            addresses.extend(tlvs);
            let mut h = SIGNATURE.to_vec();
            h.push(0x20 | command);
            h.push(family);
            h.extend((addresses.len() as u16).to_be_bytes());
            h.extend(addresses);
            h
        }

        fn read(bytes: &[u8]) -> (std::io::Result<Option<SocketAddr>>, usize) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let mut rest = bytes;
            let r = rt.block_on(read_proxy_v2(&mut rest));
            (r, bytes.len() - rest.len())
        }

        fn tlvs() -> impl Strategy<Value = Vec<u8>> {
            // Well-formed TLVs: a type, a length, that many bytes.
            prop::collection::vec(
                (any::<u8>(), prop::collection::vec(any::<u8>(), 0..40)),
                0..4,
            )
            .prop_map(|v| {
                v.into_iter()
                    .flat_map(|(t, value)| {
                        let mut b = vec![t];
                        b.extend((value.len() as u16).to_be_bytes());
                        b.extend(value);
                        b
                    })
                    .collect()
            })
        }

        proptest! {
            #[test]
            fn the_client_address_is_read_and_not_a_byte_past_the_header(
                v6 in any::<bool>(),
                src in any::<[u8; 16]>(),
                dst in any::<[u8; 16]>(),
                ports in any::<(u16, u16)>(),
                tlvs in tlvs(),
                after in prop::collection::vec(any::<u8>(), 0..64),
            ) {
                let (src, dst) = if v6 {
                    (IpAddr::from(src), IpAddr::from(dst))
                } else {
                    let (s, d): ([u8; 4], [u8; 4]) =
                        (src[..4].try_into().unwrap(), dst[..4].try_into().unwrap());
                    (IpAddr::from(s), IpAddr::from(d))
                };
                let src = SocketAddr::new(src, ports.0);
                let h = header(0x1, src, SocketAddr::new(dst, ports.1), &tlvs);
                let mut bytes = h.clone();
                bytes.extend(&after);
                let (r, consumed) = read(&bytes);
                prop_assert_eq!(r.unwrap(), Some(src));
                prop_assert_eq!(consumed, h.len(), "the TLS bytes after it are left");
            }

            #[test]
            fn any_bytes_are_refused_or_read_within_the_bound(
                bytes in prop::collection::vec(any::<u8>(), 0..2048),
                signed in any::<bool>(),
            ) {
                let mut bytes = bytes;
                if signed {
                    // Past the signature, so the rest of the parser is reached.
                    bytes.splice(0..bytes.len().min(12), SIGNATURE);
                }
                let (r, consumed) = read(&bytes);
                prop_assert!(consumed <= MAX_PROXY_HEADER);
                if r.is_ok() {
                    let length = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
                    prop_assert_eq!(consumed, 16 + length);
                }
            }
        }

        #[test]
        fn a_local_connection_is_the_balancer_s_own() {
            let any: SocketAddr = "192.0.2.1:1".parse().unwrap();
            let (r, _) = read(&header(0x0, any, any, &[]));
            assert_eq!(r.unwrap(), None);
        }

        #[test]
        fn what_is_not_a_proxy_header_is_refused_with_its_reason() {
            // A TLS ClientHello's first bytes, as a client that does not
            // go through the balancer would send.
            let mut hello = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01];
            hello.resize(64, 0);
            let e = read(&hello).0.unwrap_err();
            assert!(
                e.to_string().contains("not a PROXY protocol v2 header"),
                "{e}"
            );
            let any: SocketAddr = "192.0.2.1:1".parse().unwrap();
            let mut long = header(0x1, any, any, &[]);
            long[14..16].copy_from_slice(&2000u16.to_be_bytes());
            let (r, consumed) = read(&long);
            assert!(r.unwrap_err().to_string().contains("over the 1024 read"));
            assert_eq!(consumed, 16, "nothing of it read past the fixed part");
            let mut v1 = header(0x1, any, any, &[]);
            v1[12] = 0x11;
            assert!(read(&v1).0.is_err(), "version 1 in the binary form");
            assert!(
                read(&header(0x1, any, any, &[])[..20]).0.is_err(),
                "cut short"
            );
        }
    }

    #[cfg(feature = "server")]
    mod per_address {
        use super::super::PerAddress;
        use proptest::prelude::*;
        use std::net::IpAddr;

        fn ip(s: &str) -> IpAddr {
            s.parse().unwrap()
        }

        #[test]
        fn one_address_holds_at_most_its_cap_and_others_are_untouched() {
            let mut t = PerAddress::new(3);
            let (flood, node) = (ip("127.0.0.1"), ip("127.0.0.2"));
            assert_eq!((0..10).filter(|_| t.open(flood)).count(), 3);
            assert_eq!(t.count(flood), 3);
            assert!(t.open(node), "another address still gets in");
            t.close(flood);
            assert!(t.open(flood), "a closed one makes room");
            assert!(!t.open(flood));
            for _ in 0..3 {
                t.close(flood);
            }
            t.close(node);
            assert_eq!(t.addresses(), 0, "no empty entries are kept");
            t.close(node);
            assert_eq!(t.count(node), 0, "a stray close counts nothing");
            let mut none = PerAddress::new(0);
            assert!(!none.open(node));
            assert_eq!(none.addresses(), 0);
        }

        #[test]
        fn ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
            let mut t = PerAddress::new(2);
            assert!(t.open(ip("2001:db8:1:2::1")));
            assert!(t.open(ip("2001:db8:1:2:ffff::9")));
            assert!(!t.open(ip("2001:db8:1:2::77")), "same /64");
            assert!(t.open(ip("2001:db8:1:3::1")), "another /64");
            assert!(t.open(ip("::ffff:192.0.2.1")));
            assert!(t.open(ip("192.0.2.1")));
            assert!(!t.open(ip("192.0.2.1")), "the mapped one counted");
        }

        proptest! {
            /// Whatever opens and closes arrive, no address holds more
            /// than the cap, counts match what was admitted and not yet
            /// closed, and the table holds only addresses with one open.
            #[test]
            fn counts_follow_opens_and_closes(
                cap in 0usize..5,
                ops in prop::collection::vec((any::<bool>(), 0u8..6), 0..200),
            ) {
                let mut t = PerAddress::new(cap);
                let mut model = [0usize; 6];
                for (open, a) in ops {
                    let remote = IpAddr::from([10, 0, 0, a]);
                    if open {
                        let admitted = t.open(remote);
                        prop_assert_eq!(admitted, model[a as usize] < cap);
                        if admitted {
                            model[a as usize] += 1;
                        }
                    } else if model[a as usize] > 0 {
                        t.close(remote);
                        model[a as usize] -= 1;
                    }
                    prop_assert_eq!(t.count(remote), model[a as usize]);
                    prop_assert!(t.count(remote) <= cap);
                    prop_assert_eq!(t.addresses(), model.iter().filter(|n| **n > 0).count());
                }
            }
        }
    }
}
