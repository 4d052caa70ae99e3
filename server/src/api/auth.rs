//! Operator authentication and roles.
//!
//! The operator API has a listener of its own whose TLS requires a client
//! certificate issued by the operator CA ([`crate::pki::operator`]); the
//! handshake fails without one, or with any other CA's (a node's included).
//! Past the handshake, [`Guarded`] wraps the Admin service: for every call
//! it looks the certificate up in the store (so a revocation holds from the
//! next call on every server sharing the store) and checks the operator's
//! role against [`required_role`], the one table of which call needs which
//! role. Handlers check nothing of their own.
//!
//! `serve` writes the first admin's credential, `operator.json` (mode
//! 0600), in its data directory on first start; `better-compute operators
//! add` makes more.

use bc_store::OperatorId;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use bc_store::Store;
use bc_store::tokens::{NewOperator, OperatorRole, OperatorRow};
use bcd_proto::tls::PeerInfo;
use rustls_pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};
use tonic::Status;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tracing::{info, warn};

use super::revoked_operators::RevokedOperators;
use super::status::{Turned, turned, unavailable};
use crate::pki::OperatorCa;

/// What a credential file (`operator.json`, or the file `operators add
/// --out` writes) holds: where the API is, the CA its serving certificate
/// chains to, and the operator's client certificate and key. Readable by
/// its owner only.
#[derive(Clone, Serialize, Deserialize)]
pub struct OperatorCredential {
    /// `https://HOST:PORT` of the operator API.
    pub server: String,
    pub name: String,
    /// The operator CA (PEM).
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for OperatorCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorCredential")
            .field("server", &self.server)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

pub const OPERATOR_FILE: &str = "operator.json";

/// What an earlier server wrote to `operator.json`: a bearer token, which
/// no server accepts any more.
pub fn is_bearer_credential(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .is_ok_and(|v| v.get("token").is_some() && v.get("cert_pem").is_none())
}

/// Calls a read-only operator may make: they list and read, and change
/// nothing. Every other call of the Admin service needs an admin, so a new
/// call is admin-only until it is listed here.
const READ_ONLY_CALLS: &[&str] = &[
    "ListNodes",
    "ListCommands",
    "GetCommand",
    "GetNodeSpec",
    "GetNodeInventory",
    "ListReleases",
    "ListRollouts",
    "GetRollout",
    "ListImages",
    "ListBoots",
    "ListBootMacs",
    "ListOperators",
    "ListGateways",
    "ListSecrets",
    "ListMachines",
    "ListTokens",
    "ListEvents",
    // A token that opens the read-only console, for the caller alone.
    "MintConsoleToken",
];

/// The role a call (its gRPC path, `/bcd.v1.Admin/ListNodes`) needs.
pub fn required_role(path: &str) -> OperatorRole {
    let call = path.rsplit('/').next().unwrap_or_default();
    if READ_ONLY_CALLS.contains(&call) {
        OperatorRole::ReadOnly
    } else {
        OperatorRole::Admin
    }
}

/// The operator making a call, once admitted; handlers find it in the
/// request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub name: String,
    pub role: OperatorRole,
}

/// Why a call is turned away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No client certificate (the API's TLS requires one; defence in depth).
    NoCertificate,
    /// A certificate the operator CA signed that the store does not know.
    Unknown,
    Revoked(String),
    Expired(String),
    /// A certificate from before roles were signed into certificates.
    NoRole(String),
    /// The operator's role is short of what the call needs.
    Role {
        name: String,
        has: OperatorRole,
        call: String,
        needs: OperatorRole,
    },
}

impl Denied {
    pub fn status(&self) -> Status {
        let message = match self {
            Denied::NoCertificate => "the operator API needs a client certificate from the \
                                      operator CA: use operator.json from the server's data \
                                      directory, or ask an admin for a credential (better-compute \
                                      operators add)"
                .to_string(),
            Denied::Unknown => "this certificate belongs to no operator: ask an admin for a \
                                credential (better-compute operators add)"
                .to_string(),
            Denied::Revoked(name) => format!(
                "operator {name} was revoked: ask an admin for a new credential (better-compute \
                 operators add)"
            ),
            Denied::Expired(name) => format!(
                "the certificate of operator {name} expired: ask an admin for a new credential \
                 (better-compute operators add)"
            ),
            Denied::NoRole(name) => format!(
                "the credential of operator {name} was issued before operator certificates \
                 named their role, and no longer opens the API: ask an admin for a new one \
                 (better-compute operators add NAME --role ROLE), then revoke this one (the \
                 first admin's operator.json is replaced when better-compute serve starts)"
            ),
            Denied::Role {
                name,
                has,
                call,
                needs,
            } => {
                return turned(Turned::Forbidden(format!(
                    "operator {name} is {has}; {call} needs the {needs} role: ask an admin to \
                     make the change, or for an {needs} credential"
                )));
            }
        };
        turned(Turned::Operator(message))
    }
}

/// What the caller's certificate, which the operator CA signed, says of
/// it: the operator it names and the role it grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Granted {
    pub name: Option<String>,
    pub role: Option<OperatorRole>,
}

impl Granted {
    /// Reads an operator certificate (already verified by the API's TLS).
    pub fn of(cert_der: &[u8]) -> Granted {
        use crate::pki::operator::{OPERATOR_ROLE_URI, OPERATOR_URI};
        Granted {
            name: crate::certs::named(cert_der, OPERATOR_URI).map(|(n, _)| n),
            role: crate::certs::named(cert_der, OPERATOR_ROLE_URI)
                .and_then(|(r, _)| OperatorRole::parse(&r)),
        }
    }
}

/// Whether the operator `row` (found by the caller's certificate, which
/// grants `granted`) may make the call at `path` at `now_ms`. The role is
/// the lower of the certificate's and the row's: the row, which whoever
/// can write the store can edit, narrows a role or revokes it, and never
/// widens what the operator CA signed.
pub fn decide(
    row: Option<&OperatorRow>,
    granted: &Granted,
    path: &str,
    now_ms: i64,
) -> Result<Operator, Denied> {
    let row = row.ok_or(Denied::Unknown)?;
    if granted.name.as_deref() != Some(row.id.as_str()) {
        return Err(Denied::Unknown);
    }
    if row.revoked_at.is_some() || row.cert_sha256.is_none() {
        return Err(Denied::Revoked(row.id.to_string()));
    }
    if !row.active(now_ms) {
        return Err(Denied::Expired(row.id.to_string()));
    }
    let Some(signed_role) = granted.role else {
        return Err(Denied::NoRole(row.id.to_string()));
    };
    let role = signed_role.min(row.role);
    let needs = required_role(path);
    if role < needs {
        return Err(Denied::Role {
            name: row.id.to_string(),
            has: role,
            call: path.rsplit('/').next().unwrap_or_default().to_string(),
            needs,
        });
    }
    Ok(Operator {
        name: row.id.to_string(),
        role,
    })
}

/// The Admin service behind the operator check: every call is admitted by
/// [`decide`] on the store's current row for the caller's certificate.
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    store: Store,
    revoked: Arc<RevokedOperators>,
}

impl<S> Guarded<S> {
    pub fn new(inner: S, store: Store, revoked: Arc<RevokedOperators>) -> Self {
        Guarded {
            inner,
            store,
            revoked,
        }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Guarded<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        // The ready service answers this call; its clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let store = self.store.clone();
        let revoked = self.revoked.clone();
        Box::pin(async move {
            let path = req.uri().path().to_string();
            let peer = req.extensions().get::<PeerInfo>();
            let presented = peer.and_then(|p| Some((p.cert_fingerprint.clone()?, p.cert.clone()?)));
            let verdict = match presented {
                None => Err(Denied::NoCertificate.status()),
                Some((fp, cert)) => admit(&store, &revoked, &fp, &Granted::of(&cert), &path)
                    .await
                    .map_err(|e| match e {
                        Refused::Denied(d) => d.status(),
                        Refused::Store(e) => unavailable(e),
                    }),
            };
            match verdict {
                Ok(operator) => {
                    req.extensions_mut().insert(operator);
                    inner.call(req).await
                }
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// Why [`admit`] turned a caller away.
#[derive(Debug)]
pub enum Refused {
    Denied(Denied),
    /// The store could not be read.
    Store(bc_store::StoreError),
}

/// The operator check both doors share (the API's client certificate, the
/// console's certificate or token): the store's row for the certificate
/// `fp`, which grants `granted`, and the signed revocations remembered,
/// decide whether the call at `path` is made now.
pub async fn admit(
    store: &Store,
    revoked: &RevokedOperators,
    fp: &str,
    granted: &Granted,
    path: &str,
) -> Result<Operator, Refused> {
    let row = store.operator_by_cert(fp).await.map_err(Refused::Store)?;
    // A signed revocation beside the row is remembered; one remembered
    // holds whatever the row says now.
    if let Some(statement) = row.as_ref().and_then(|r| r.revocation.as_deref())
        && let Err(why) = revoked.learn(statement)
    {
        warn!(call = %path, %why, "an operator row carries a revocation no worker key signed");
    }
    let verdict = if revoked.contains(fp) {
        Err(Denied::Revoked(granted.name.clone().unwrap_or_default()))
    } else {
        decide(row.as_ref(), granted, path, crate::clock::unix_ms())
    };
    verdict.map_err(|d| {
        info!(call = %path, denied = ?d, "operator call refused");
        Refused::Denied(d)
    })
}

/// A certificate PEM block (64-column lines, LF).
pub fn cert_pem(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// A new operator key (ECDSA P-256) and a certificate request for it.
pub fn new_key_and_csr() -> anyhow::Result<(rcgen::KeyPair, Vec<u8>)> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .context("cannot make an operator key")?;
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .context("cannot make a certificate request")?;
    Ok((key, csr.der().to_vec()))
}

/// Writes a credential file, mode 0600. Refuses to replace an existing
/// file unless `force`.
pub fn write_credential(path: &Path, c: &OperatorCredential, force: bool) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec_pretty(c)?;
    if force {
        bcd_sys::fs::atomic_write(path, &bytes, 0o600)
            .with_context(|| format!("cannot write {}", path.display()))?;
        return Ok(());
    }
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::anyhow!(
                    "{} already exists: choose another --out, or pass --force to replace it",
                    path.display()
                )
            } else {
                anyhow::Error::new(e).context(format!("cannot write {}", path.display()))
            }
        })?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Issues the first admin's credential from this process's operator CA:
/// named `admin`, or `admin-N` when another process sharing the store took
/// that name.
async fn first_admin(
    store: &Store,
    ca: &OperatorCa,
    server: String,
) -> anyhow::Result<OperatorCredential> {
    let (key, csr) = new_key_and_csr()?;
    let now = store.now().await?;
    for n in 1..=1000u32 {
        let name = if n == 1 {
            "admin".to_string()
        } else {
            format!("admin-{n}")
        };
        let cert = ca
            .issue(&csr, &name, OperatorRole::Admin, now)
            .context("cannot issue the first admin's certificate")?;
        let added = store
            .add_operator(&NewOperator {
                id: OperatorId::from(name.clone()),
                role: OperatorRole::Admin,
                cert_sha256: bcd_proto::fingerprint(&cert.der),
                cert_serial: cert.serial.clone(),
                not_after: cert.not_after_ms,
            })
            .await;
        match added {
            Ok(()) => {
                return Ok(OperatorCredential {
                    server,
                    name,
                    ca_pem: cert_pem(&ca.cert),
                    cert_pem: cert_pem(&cert.der),
                    key_pem: key.serialize_pem(),
                });
            }
            Err(bc_store::TxError::Refused(bc_store::Refusal::Conflict(_))) => continue,
            Err(e) => return Err(anyhow::Error::new(e).context("cannot record the first admin")),
        }
    }
    anyhow::bail!("cannot name the first admin: admin to admin-1000 are all taken")
}

/// Writes the first admin's credential on first start (and in place of a
/// bearer-token `operator.json` an earlier server wrote); afterwards keeps
/// its server address current.
pub async fn operator_credential(
    dir: &Path,
    store: &Store,
    ca: &OperatorCa,
    api: SocketAddr,
) -> anyhow::Result<()> {
    let path = dir.join(OPERATOR_FILE);
    let server = format!("https://{api}");
    let existing = match std::fs::read(&path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("cannot read {}", path.display())));
        }
    };
    // A credential whose certificate names no role (from before roles were
    // signed into certificates) opens nothing now: replaced like a bearer
    // token.
    let roleless = |bytes: &[u8]| {
        serde_json::from_slice::<OperatorCredential>(bytes)
            .ok()
            .and_then(|c| {
                rustls_pki_types::CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).ok()
            })
            .is_some_and(|der| Granted::of(&der).role.is_none())
    };
    match existing {
        Some(bytes) if roleless(&bytes) => {
            let c = first_admin(store, ca, server).await?;
            bcd_sys::fs::atomic_write(&path, &serde_json::to_vec_pretty(&c)?, 0o600)?;
            warn!(
                path = %path.display(),
                operator = %c.name,
                "operator.json held a certificate that names no role, which the API no longer \
                 accepts: replaced it with a new admin credential"
            );
        }
        Some(bytes) if !is_bearer_credential(&bytes) => {
            let mut c: OperatorCredential = serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is corrupt: delete it and restart better-compute serve (it writes a new \
                     admin credential)",
                    path.display()
                )
            })?;
            if c.server != server {
                c.server = server;
                bcd_sys::fs::atomic_write(&path, &serde_json::to_vec_pretty(&c)?, 0o600)?;
            }
        }
        bearer => {
            let c = first_admin(store, ca, server).await?;
            bcd_sys::fs::atomic_write(&path, &serde_json::to_vec_pretty(&c)?, 0o600)?;
            if bearer.is_some() {
                warn!(
                    path = %path.display(),
                    operator = %c.name,
                    "operator.json held a bearer token, which the API no longer accepts: replaced \
                     it with a client-certificate credential"
                );
            } else {
                info!(path = %path.display(), operator = %c.name, "wrote the operator credential");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Admin service's calls, read from the protocol file.
    fn admin_calls() -> Vec<String> {
        let proto = include_str!("../../../bcd/proto/proto/bcd.proto");
        let start = proto.find("service Admin {").expect("the Admin service");
        let end = start + proto[start..].find("\n}").expect("its end");
        proto[start..end]
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|l| l.split('(').next().unwrap().trim().to_string())
            .collect()
    }

    fn path(call: &str) -> String {
        format!("/bcd.v1.Admin/{call}")
    }

    #[test]
    fn reads_are_read_only_and_everything_else_needs_an_admin() {
        let calls = admin_calls();
        assert!(calls.len() >= 20, "{calls:?}");
        for call in &calls {
            // Minting a console token reads nothing and changes nothing:
            // it signs the caller's own view in.
            let reads =
                call.starts_with("List") || call.starts_with("Get") || call == "MintConsoleToken";
            let want = if reads {
                OperatorRole::ReadOnly
            } else {
                OperatorRole::Admin
            };
            assert_eq!(required_role(&path(call)), want, "{call}");
        }
        for listed in READ_ONLY_CALLS {
            assert!(
                calls.iter().any(|c| c == listed),
                "{listed} is no call of the Admin service"
            );
        }
        // Anything not known needs an admin.
        assert_eq!(required_role("/bcd.v1.Admin/Unheard"), OperatorRole::Admin);
        assert_eq!(required_role(""), OperatorRole::Admin);
    }

    fn granted(role: OperatorRole) -> Granted {
        Granted {
            name: Some("op".into()),
            role: Some(role),
        }
    }

    fn row(role: OperatorRole) -> OperatorRow {
        OperatorRow {
            id: "op".into(),
            role,
            cert_sha256: Some("c".into()),
            cert_serial: Some("s".into()),
            created_at: 0,
            not_after: Some(1_000),
            revoked_at: None,
            revocation: None,
        }
    }

    #[test]
    fn a_read_only_operator_reads_and_is_told_which_role_a_change_needs() {
        let ro = row(OperatorRole::ReadOnly);
        assert_eq!(
            decide(
                Some(&ro),
                &granted(OperatorRole::ReadOnly),
                &path("ListNodes"),
                10
            )
            .unwrap(),
            Operator {
                name: "op".into(),
                role: OperatorRole::ReadOnly
            }
        );
        let denied = decide(
            Some(&ro),
            &granted(OperatorRole::ReadOnly),
            &path("RunCommand"),
            10,
        )
        .unwrap_err();
        assert!(matches!(
            denied,
            Denied::Role {
                needs: OperatorRole::Admin,
                ..
            }
        ));
        let status = denied.status();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("RunCommand needs the admin role"),
            "{}",
            status.message()
        );
        let admin = row(OperatorRole::Admin);
        for call in ["RunCommand", "AddOperator", "ListNodes"] {
            assert!(
                decide(Some(&admin), &granted(OperatorRole::Admin), &path(call), 10).is_ok(),
                "{call}"
            );
        }
    }

    #[test]
    fn the_row_narrows_the_certificates_role_and_never_widens_it() {
        // A read-only certificate whose row was rewritten to admin.
        let edited = row(OperatorRole::Admin);
        let d = decide(
            Some(&edited),
            &granted(OperatorRole::ReadOnly),
            &path("RunCommand"),
            10,
        )
        .unwrap_err();
        assert!(
            matches!(
                d,
                Denied::Role {
                    has: OperatorRole::ReadOnly,
                    ..
                }
            ),
            "{d:?}"
        );
        // An admin certificate whose row says read-only reads only.
        let narrowed = row(OperatorRole::ReadOnly);
        assert!(
            decide(
                Some(&narrowed),
                &granted(OperatorRole::Admin),
                &path("RunCommand"),
                10
            )
            .is_err()
        );
        // A certificate naming no role, or another operator than the row.
        let d = decide(
            Some(&edited),
            &Granted {
                role: None,
                ..granted(OperatorRole::Admin)
            },
            &path("ListNodes"),
            10,
        )
        .unwrap_err();
        assert_eq!(d, Denied::NoRole("op".into()));
        assert!(
            d.status().message().contains("operators add"),
            "{}",
            d.status().message()
        );
        let other = Granted {
            name: Some("someone".into()),
            role: Some(OperatorRole::Admin),
        };
        assert_eq!(
            decide(Some(&edited), &other, &path("ListNodes"), 10),
            Err(Denied::Unknown)
        );
    }

    #[test]
    fn unknown_revoked_and_expired_certificates_are_refused() {
        assert_eq!(
            decide(None, &granted(OperatorRole::Admin), &path("ListNodes"), 10),
            Err(Denied::Unknown)
        );
        let mut revoked = row(OperatorRole::Admin);
        revoked.revoked_at = Some(5);
        assert_eq!(
            decide(
                Some(&revoked),
                &granted(OperatorRole::Admin),
                &path("ListNodes"),
                10
            ),
            Err(Denied::Revoked("op".into()))
        );
        let mut bearer = row(OperatorRole::Admin);
        bearer.cert_sha256 = None;
        assert!(
            decide(
                Some(&bearer),
                &granted(OperatorRole::Admin),
                &path("ListNodes"),
                10
            )
            .is_err()
        );
        assert_eq!(
            decide(
                Some(&row(OperatorRole::Admin)),
                &granted(OperatorRole::Admin),
                &path("ListNodes"),
                1_000
            ),
            Err(Denied::Expired("op".into()))
        );
        for d in [Denied::Unknown, Denied::Revoked("op".into())] {
            assert_eq!(d.status().code(), tonic::Code::Unauthenticated);
        }
    }

    #[test]
    fn credential_files_are_private_and_not_replaced_without_force() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("op.json");
        let c = OperatorCredential {
            server: "https://127.0.0.1:1".into(),
            name: "a".into(),
            ca_pem: String::new(),
            cert_pem: String::new(),
            key_pem: String::new(),
        };
        write_credential(&p, &c, false).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let err = write_credential(&p, &c, false).unwrap_err().to_string();
        assert!(err.contains("--force"), "{err}");
        write_credential(&p, &c, true).unwrap();
        assert!(!is_bearer_credential(&std::fs::read(&p).unwrap()));
        assert!(is_bearer_credential(
            br#"{"server":"x","ca_pem":"y","token":"bco1.z"}"#
        ));
    }
}
