//! TLS session resumption between the node's client configuration and the
//! gateway's server configuration, handshakes run in memory: a second dial
//! with the same client configuration resumes and still names the node's
//! certificate; a new client configuration (a renewed certificate) or
//! another gateway process (another ticket key) gets a full handshake with
//! a fresh certificate check.

use std::sync::Arc;

use bcd_proto::tls::{self, ClientIdentity, ServerTrust};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{
    CipherSuite, ClientConfig, ClientConnection, HandshakeKind, ServerConfig, ServerConnection,
};

const GATEWAY: &str = "gateway.test";

struct Fleet {
    ca: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl Fleet {
    fn new() -> Fleet {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "test fleet CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap().der().clone();
        Fleet {
            ca,
            issuer: Issuer::new(params, key),
        }
    }

    fn leaf(&self, names: &[&str], cn: &str) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap().der().clone();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert, key)
    }

    fn gateway(&self) -> Arc<ServerConfig> {
        let (cert, key) = self.leaf(&[GATEWAY], "gateway");
        tls::server_config(vec![cert], key, self.ca.clone()).unwrap()
    }

    fn node(&self, cn: &str) -> (CertificateDer<'static>, Arc<ClientConfig>) {
        let (cert, key) = self.leaf(&[], cn);
        let config = tls::client_config(
            ServerTrust::Ca(self.ca.clone()),
            Some(ClientIdentity {
                chain: vec![cert.clone()],
                key,
            }),
        )
        .unwrap();
        (cert, config)
    }
}

/// Runs one handshake to its end, then lets the server's tickets reach the
/// client; returns how it went and the certificate the server saw.
fn dial(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
) -> (HandshakeKind, Option<CertificateDer<'static>>) {
    let (_, s) = handshake(client, server);
    let seen = s
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned());
    (s.handshake_kind().unwrap(), seen)
}

/// One handshake run to its end in memory; both ends after it.
fn handshake(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
) -> (ClientConnection, ServerConnection) {
    let name = ServerName::try_from(GATEWAY).unwrap();
    let mut c = ClientConnection::new(client.clone(), name).unwrap();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    for _ in 0..16 {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            s.read_tls(&mut buf.as_slice()).unwrap();
            s.process_new_packets().unwrap();
        }
        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            c.read_tls(&mut buf.as_slice()).unwrap();
            c.process_new_packets().unwrap();
        }
        if !c.is_handshaking() && !s.is_handshaking() && !c.wants_write() && !s.wants_write() {
            break;
        }
    }
    assert!(
        !c.is_handshaking() && !s.is_handshaking(),
        "handshake stalled"
    );
    (c, s)
}

fn suites(c: &ClientConnection, s: &ServerConnection) -> [Option<CipherSuite>; 2] {
    [c.negotiated_cipher_suite(), s.negotiated_cipher_suite()].map(|s| s.map(|s| s.suite()))
}

#[test]
fn nodes_and_gateways_agree_on_aes_128_gcm_with_sha256() {
    let fleet = Fleet::new();
    let (_, node) = fleet.node("node-a");
    let (c, s) = handshake(&node, &fleet.gateway());
    assert_eq!(
        suites(&c, &s),
        [Some(CipherSuite::TLS13_AES_128_GCM_SHA256); 2]
    );
}

#[test]
fn a_node_that_asks_for_aes_256_first_still_gets_it() {
    // An older bcd used ring's order unchanged: AES-256-GCM with SHA-384
    // first. The gateway follows the client's order.
    let fleet = Fleet::new();
    let (cert, key) = fleet.leaf(&[], "node-old");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(fleet.ca.clone()).unwrap();
    let old =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![cert.clone()], key)
            .unwrap();
    let (c, s) = handshake(&Arc::new(old), &fleet.gateway());
    assert_eq!(
        suites(&c, &s),
        [Some(CipherSuite::TLS13_AES_256_GCM_SHA384); 2]
    );
    assert_eq!(
        s.peer_certificates().and_then(|c| c.first()).cloned(),
        Some(cert)
    );
}

#[test]
fn a_second_dial_with_the_same_configuration_resumes_and_names_the_same_certificate() {
    let fleet = Fleet::new();
    let gateway = fleet.gateway();
    let (cert, node) = fleet.node("node-a");
    assert_eq!(
        dial(&node, &gateway),
        (HandshakeKind::Full, Some(cert.clone()))
    );
    for _ in 0..3 {
        assert_eq!(
            dial(&node, &gateway),
            (HandshakeKind::Resumed, Some(cert.clone()))
        );
    }
}

#[test]
fn a_renewed_certificate_another_node_or_another_gateway_gets_a_full_handshake() {
    let fleet = Fleet::new();
    let gateway = fleet.gateway();
    let (cert, node) = fleet.node("node-a");
    assert_eq!(dial(&node, &gateway).0, HandshakeKind::Full);

    // A renewed certificate comes with a new configuration, whose first
    // dial presents (and the gateway checks) the new certificate.
    let (renewed, next) = fleet.node("node-a");
    assert_eq!(dial(&next, &gateway), (HandshakeKind::Full, Some(renewed)));

    // Another node never resumes the first one's session.
    let (b_cert, b) = fleet.node("node-b");
    assert_eq!(dial(&b, &gateway), (HandshakeKind::Full, Some(b_cert)));
    assert_eq!(
        dial(&node, &gateway),
        (HandshakeKind::Resumed, Some(cert.clone()))
    );

    // The same node at another gateway process: that process's ticket key
    // opens none of the first one's tickets; its own it does.
    let other = fleet.gateway();
    assert_eq!(
        dial(&node, &other),
        (HandshakeKind::Full, Some(cert.clone()))
    );
    assert_eq!(dial(&node, &other), (HandshakeKind::Resumed, Some(cert)));
}
