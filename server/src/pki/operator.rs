//! The operator CA: a CA of its own, distinct from the fleet CA, for the
//! operator API alone. Created on first start in the data directory beside
//! the fleet CA (`operator-ca.key` mode 0600, `operator-ca.crt`), with the
//! API's serving certificate (`api.key`, `api.crt`) for
//! [`bcd_proto::API_NAME`] plus the operator's extra names. It issues the
//! operators' client certificates; the API requires one. Nodes never trust
//! it, and the API never trusts the fleet CA: a node certificate opens no
//! operator call, an operator certificate no node session.

use std::path::Path;
use std::time::Duration;

use bc_store::tokens::OperatorRole;
use rcgen::KeyPair;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::ca::{
    CaError, IssueError, NodeCert, issue_client_cert, load_or_create_root, load_or_create_serving,
};

pub const KEY_FILE: &str = "operator-ca.key";
pub const CERT_FILE: &str = "operator-ca.crt";
/// The API's serving certificate: `api.key`, `api.crt`, `api.names`.
pub const SERVING_BASE: &str = "api";

/// How long an operator's certificate is valid.
pub const OPERATOR_CERT_TTL: Duration = Duration::from_secs(365 * 86_400);

pub struct OperatorCa {
    pub cert: CertificateDer<'static>,
    key: KeyPair,
    pub serving_chain: Vec<CertificateDer<'static>>,
    serving_key_pem: String,
}

impl std::fmt::Debug for OperatorCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorCa")
            .field("fingerprint", &bcd_proto::fingerprint(&self.cert))
            .finish_non_exhaustive()
    }
}

/// The URI an operator certificate names its operator by.
pub const OPERATOR_URI: &str = "urn:bc:operator:";

/// The URI an operator certificate names its role by (`admin`,
/// `read-only`).
pub const OPERATOR_ROLE_URI: &str = "urn:bc:operator-role:";

impl OperatorCa {
    /// Loads the operator CA from `dir`, creating it and the API's serving
    /// certificate on first start. `sans` are extra names for the serving
    /// certificate.
    pub fn load_or_create(dir: &Path, sans: &[String], now_ms: i64) -> Result<Self, CaError> {
        let (cert, key) = load_or_create_root(
            dir,
            (KEY_FILE, CERT_FILE),
            "better-compute operator CA",
            now_ms,
        )?;
        let mut names = vec![bcd_proto::API_NAME.to_string()];
        names.extend(sans.iter().cloned());
        let (serving_chain, serving_key_pem) = load_or_create_serving(
            dir,
            SERVING_BASE,
            &names,
            "better-compute operator API",
            (&cert, &key),
            now_ms,
        )?;
        Ok(OperatorCa {
            cert,
            key,
            serving_chain,
            serving_key_pem,
        })
    }

    pub fn serving_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.serving_key_pem.as_bytes())
            .expect("the serving key parsed when it was loaded")
    }

    /// Issues operator `name` a client certificate to the key of `csr_der`,
    /// valid for [`OPERATOR_CERT_TTL`], naming its `role`
    /// ([`OPERATOR_ROLE_URI`]): the role is what this CA signed, and the
    /// store's row can narrow it (or revoke it), never widen it. What the
    /// request asks for beyond its key is ignored.
    pub fn issue(
        &self,
        csr_der: &[u8],
        name: &str,
        role: OperatorRole,
        now_ms: i64,
    ) -> Result<NodeCert, IssueError> {
        issue_client_cert(
            csr_der,
            (name, format!("{OPERATOR_URI}{name}")),
            (&self.cert, &self.key),
            now_ms,
            OPERATOR_CERT_TTL,
            &[format!("{OPERATOR_ROLE_URI}{role}")],
        )
    }
}

/// A role as the wire names it.
pub fn wire_role(r: OperatorRole) -> bcd_proto::v1::OperatorRole {
    match r {
        OperatorRole::ReadOnly => bcd_proto::v1::OperatorRole::ReadOnly,
        OperatorRole::Admin => bcd_proto::v1::OperatorRole::Admin,
    }
}

/// The role a wire value names; `None` for UNSPECIFIED or one this server
/// does not know.
pub fn role(v: i32) -> Option<OperatorRole> {
    match bcd_proto::typed::wire::<bcd_proto::v1::OperatorRole>(v)? {
        bcd_proto::v1::OperatorRole::Unspecified => None,
        bcd_proto::v1::OperatorRole::ReadOnly => Some(OperatorRole::ReadOnly),
        bcd_proto::v1::OperatorRole::Admin => Some(OperatorRole::Admin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_proto::typed::Spelling;

    fn verifies(ca: &CertificateDer<'static>, cert: &CertificateDer<'static>) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            bcd_proto::tls::provider(),
        )
        .build()
        .unwrap();
        verifier
            .verify_client_cert(cert, &[], rustls_pki_types::UnixTime::now())
            .is_ok()
    }

    #[test]
    fn operator_certificates_chain_to_the_operator_ca_and_not_the_fleet_ca() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
        let fleet = super::super::Ca::load_or_create(d.path(), &[], now).unwrap();
        let ops = OperatorCa::load_or_create(d.path(), &["127.0.0.1".into()], now).unwrap();
        let again = OperatorCa::load_or_create(d.path(), &["127.0.0.1".into()], now).unwrap();
        assert_eq!(ops.cert, again.cert, "the operator CA persists");
        assert_ne!(ops.cert, fleet.cert, "a CA of its own");
        for f in [KEY_FILE, "api.key"] {
            let mode = std::fs::metadata(d.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }

        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let csr = rcgen::CertificateParams::default()
            .serialize_request(&key)
            .unwrap();
        let cert = ops
            .issue(csr.der(), "alice", OperatorRole::ReadOnly, now)
            .unwrap();
        assert_eq!(
            crate::certs::named(&cert.der, OPERATOR_ROLE_URI).map(|(r, _)| r),
            Some("read-only".to_string())
        );
        assert_eq!(
            crate::certs::named(&cert.der, OPERATOR_URI).map(|(r, _)| r),
            Some("alice".to_string())
        );
        assert_eq!(
            cert.not_after_ms - now,
            OPERATOR_CERT_TTL.as_millis() as i64
        );
        assert!(verifies(&ops.cert, &cert.der));
        assert!(!verifies(&fleet.cert, &cert.der), "nodes never trust it");
        let node = fleet
            .issue_node_cert(csr.der(), "nd-1", None, now, Duration::from_secs(3600))
            .unwrap();
        assert!(
            !verifies(&ops.cert, &node.der),
            "a node certificate is no operator's"
        );
    }

    /// Each role crosses the wire and comes back, spelled as the store
    /// keeps it; UNSPECIFIED and unknown values name none.
    #[test]
    fn roles_survive_the_wire() {
        for r in [OperatorRole::ReadOnly, OperatorRole::Admin] {
            assert_eq!(role(wire_role(r) as i32), Some(r));
            assert_eq!(wire_role(r).spelling(), r.as_str());
        }
        assert_eq!(role(0), None);
        assert_eq!(role(99), None);
    }
}
