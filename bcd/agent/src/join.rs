//! `bcd join`: create the node key, prove the token, receive a certificate
//! and the fleet CA, and persist the identity.
//!
//! A machine that joined before and still holds its old node key (moved
//! aside by `bcd join --reset`, or left behind when `identity.json` was
//! lost: [`identity::previous`]) proves it: the join signs
//! `bcd_proto::reenrol::statement` with the old key, and the server
//! re-enrols that node (same id, next identity generation, its old
//! certificates revoked) instead of adding another. `--new-node` joins as
//! a new node regardless.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use bcd_proto::tls::{self, ServerTrust};
use bcd_proto::token::JoinToken;
use bcd_proto::v1::{InventoryHash, JoinRequest, PreviousIdentity, join_client::JoinClient};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls_pki_types::CertificateDer;

use crate::hw::{self, Host};
use crate::identity::{self, Identity, IdentityFile, Previous, ReplayFloors};
use crate::lock::DirLock;

#[derive(Debug, Clone)]
pub struct JoinOptions {
    pub server: Option<String>,
    pub token: Option<String>,
    pub data_dir: PathBuf,
    pub reset: bool,
    pub yes: bool,
    pub ramdisk: bool,
    /// Join as a new node even when an earlier identity's key is on disk.
    pub new_node: bool,
    /// With a TPM: the node key is made in this TPM and certified by its
    /// AK (`--attestor tpm`), through the backend it names; `None` joins
    /// with a file key.
    pub tpm: Option<bcd_tpm::TpmAt>,
    /// The fleet CA's pin, for a TPM join with no token (the machine is
    /// enrolled by its EK, or bound to a node already). A token carries it.
    pub ca_pin: Option<String>,
}

/// What `bcd join` did.
#[derive(Debug)]
pub enum Joined {
    Joined(Box<Identity>),
    /// Only `--reset --yes`: the old identity was moved to these paths.
    ResetOnly(Vec<PathBuf>),
}

impl Joined {
    /// What `bcd join` prints: the node and its certificate, or the paths
    /// a reset moved aside.
    pub fn summary(&self) -> String {
        match self {
            Joined::Joined(id) => {
                let how = if id.file.identity_generation > 1 {
                    "re-enrolled as"
                } else {
                    "joined as"
                };
                format!(
                    "{how} node {} (certificate {} valid until {})\n",
                    id.file.node_id,
                    id.file.cert_serial,
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH
                            + std::time::Duration::from_millis(
                                id.file.cert_not_after_ms.max(0) as u64
                            )
                    )
                )
            }
            Joined::ResetOnly(moved) => moved
                .iter()
                .map(|m| format!("moved aside: {}\n", m.display()))
                .collect(),
        }
    }
}

pub fn prepare_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    bcd_sys::fs::remove_stale_temps(dir);
    Ok(())
}

pub async fn run(opts: &JoinOptions, host: &dyn Host) -> anyhow::Result<Joined> {
    prepare_dir(&opts.data_dir)?;
    let _lock = DirLock::acquire(&opts.data_dir)?;
    let mut moved = Vec::new();
    if opts.reset && !opts.yes {
        bail!(
            "bcd join --reset moves this node's identity and journal aside; confirm with --reset \
             --yes"
        );
    }
    if identity::exists(&opts.data_dir) {
        if opts.reset {
            moved = identity::reset(&opts.data_dir)?;
        } else {
            let who = Identity::load(&opts.data_dir)
                .map(|i| format!(" as node {}", i.file.node_id))
                .unwrap_or_default();
            bail!(
                "this machine already joined{who} (identity in {}): to join again: bcd join \
                 --reset --yes, then bcd join",
                opts.data_dir.display()
            );
        }
    }
    if let Some(endpoint) = &opts.tpm {
        let (server, pin, token) = match (&opts.server, &opts.token, &opts.ca_pin) {
            (None, None, None) if opts.reset => return Ok(Joined::ResetOnly(moved)),
            (Some(s), Some(t), pin) => {
                let token = JoinToken::parse(t)?;
                if pin.as_ref().is_some_and(|p| *p != token.ca_pin) {
                    bail!(
                        "--ca-pin is not the pin of the token's CA: the token is from another \
                         server; drop --ca-pin (the token carries it) or use a token of this one"
                    );
                }
                (s.clone(), token.ca_pin.clone(), Some(token))
            }
            (Some(s), None, Some(pin)) => (s.clone(), check_pin(pin)?, None),
            _ => bail!(
                "bcd join --attestor tpm needs --server https://HOST:PORT and either --ca-pin \
                 PIN (a machine enrolled by its EK: better-compute machines enroll prints the \
                 pin) or --token TOKEN"
            ),
        };
        let identity = join_with_tpm(
            &server,
            &pin,
            token.as_ref(),
            &opts.data_dir,
            opts.ramdisk,
            host,
            endpoint,
        )
        .await?;
        return Ok(Joined::Joined(Box::new(identity)));
    }
    let (server, token) = match (&opts.server, &opts.token) {
        (Some(s), Some(t)) => (s.clone(), t.clone()),
        (None, None) if opts.reset => return Ok(Joined::ResetOnly(moved)),
        _ => bail!("bcd join needs --server https://HOST:PORT and --token TOKEN"),
    };
    if opts.ca_pin.is_some() {
        bail!(
            "--ca-pin is for bcd join --attestor tpm with no token; a token carries its CA's pin"
        );
    }
    let token = JoinToken::parse(&token)?;
    let previous = if opts.new_node {
        None
    } else {
        identity::previous(&opts.data_dir)
    };
    let identity = join_with_token(
        &server,
        &token,
        &opts.data_dir,
        opts.ramdisk,
        host,
        previous.as_ref(),
    )
    .await?;
    Ok(Joined::Joined(Box::new(identity)))
}

/// A CA pin as `--ca-pin` takes it: the SHA-256 of the fleet CA
/// certificate, 64 hex digits (what a token's last part holds).
fn check_pin(pin: &str) -> anyhow::Result<String> {
    let pin = pin.trim().to_ascii_lowercase();
    if pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "--ca-pin takes the fleet CA's pin, 64 hex digits, as better-compute machines enroll \
             prints it"
        );
    }
    Ok(pin)
}

/// The proof that this machine holds `previous`'s key, bound to this
/// request's CSR and token.
fn prove(previous: &Previous, token_id: &str, csr_der: &[u8]) -> anyhow::Result<PreviousIdentity> {
    let key = KeyPair::from_pem(&previous.key_pem).with_context(|| {
        format!(
            "cannot read the previous node key {}",
            previous.key_path.display()
        )
    })?;
    let statement = bcd_proto::reenrol::statement(&previous.node_id, token_id, csr_der);
    let signature = rcgen::SigningKey::sign(&key, &statement).with_context(|| {
        format!(
            "cannot sign with the previous node key {}",
            previous.key_path.display()
        )
    })?;
    Ok(PreviousIdentity {
        node_id: previous.node_id.clone(),
        signature,
    })
}

/// Joins without touching the lock: the caller holds it (or, in the
/// simulator, owns the whole tree). With `previous`, the join proves that
/// identity and the server re-enrols its node.
pub async fn join_with_token(
    server: &str,
    token: &JoinToken,
    dir: &Path,
    ramdisk: bool,
    host: &dyn Host,
    previous: Option<&Previous>,
) -> anyhow::Result<Identity> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("cannot create a key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, host.hostname());
    params.distinguished_name = dn;
    let csr = crate::tpm_key::csr(&params, &key)?;
    let proof = previous
        .map(|p| prove(p, &token.id, csr.der()))
        .transpose()?;

    let mut client = dial(server, &token.ca_pin).await?;
    let resp = send_join(
        &mut client,
        Some(token),
        csr.der().to_vec(),
        host,
        ramdisk,
        proof,
        None,
    )
    .await?;

    let identity = save(
        dir,
        server,
        &token.ca_pin,
        ramdisk,
        csr.der(),
        resp,
        key.serialize_pem(),
    )?;
    match previous {
        Some(p) if p.node_id == identity.file.node_id => carry_last_session(identity, p),
        _ => Ok(identity),
    }
}

/// A re-enrolled node's identity takes over the boot and journal of the
/// earlier identity's last confirmed session, so its first Hello proof says
/// what came before (a reboot or a lost journal it drives is proved, not
/// read as forged).
fn carry_last_session(mut identity: Identity, previous: &Previous) -> anyhow::Result<Identity> {
    if previous.last_boot_id.is_empty() && previous.last_journal_id.is_empty() {
        return Ok(identity);
    }
    identity.file.last_boot_id = previous.last_boot_id.clone();
    identity.file.last_journal_id = previous.last_journal_id.clone();
    identity
        .save_state()
        .context("cannot record the earlier identity's last session")?;
    Ok(identity)
}

/// Dials the server, trusting it only with the CA `pin` names (a token's).
async fn dial(server: &str, pin: &str) -> anyhow::Result<JoinClient<bcd_proto::tls::Conn>> {
    let config = tls::client_config(ServerTrust::Pin(pin.to_string()), None)?;
    let conn = tls::dial(server, config).await.map_err(|e| {
        anyhow::Error::new(e).context(format!(
            "cannot reach the server at {server}; check --server and that better-compute \
             serve runs there"
        ))
    })?;
    Ok(JoinClient::new(conn))
}

/// Sends the join: what every join carries, and the proof of a previous
/// identity or the TPM's attestation.
async fn send_join(
    client: &mut JoinClient<bcd_proto::tls::Conn>,
    token: Option<&JoinToken>,
    csr_der: Vec<u8>,
    host: &dyn Host,
    ramdisk: bool,
    previous: Option<PreviousIdentity>,
    tpm: Option<bcd_proto::v1::TpmAttestation>,
) -> anyhow::Result<bcd_proto::v1::JoinResponse> {
    let inventory = hw::inventory(host);
    // A bct2 token travels sealed to the join service, under this CSR.
    let (plain, sealed_token) = match token {
        None => (String::new(), Vec::new()),
        Some(t) => match &t.seal_key {
            None => (t.credential(), Vec::new()),
            Some(key) => {
                let aad = bcd_proto::seal::aad(&csr_der);
                let sealed = bcd_proto::seal::seal(key, t.credential().as_bytes(), &aad)
                    .map_err(|e| anyhow::anyhow!("cannot seal the join token: {e}"))?;
                (String::new(), sealed)
            }
        },
    };
    Ok(client
        .join(JoinRequest {
            token: plain,
            sealed_token,
            csr_der,
            hostname: host.hostname(),
            inventory_hashes: inventory
                .iter()
                .map(|s| InventoryHash {
                    section: bcd_proto::v1::InventoryKind::from(s.name) as i32,
                    sha256: s.sha256.clone(),
                })
                .collect(),
            ramdisk,
            previous,
            tpm,
            // A sighting for the server's clone watch.
            boot_id: host.boot_id().unwrap_or_default(),
            macs: host.macs(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("the server refused to join this node: {}", s.message()))?
        .into_inner())
}

/// What the TPM showed for the first round trip: its EK (and certificate)
/// and AK.
struct TpmFacts {
    kind: bcd_tpm::EkKind,
    ek: bcd_tpm::PublicArea,
    ek_certificate: Option<Vec<u8>>,
    /// The chain certificates the TPM holds, for a certificate it has.
    ek_chain: Vec<Vec<u8>>,
    ak: bcd_tpm::PublicArea,
}

/// The EK to attest with: the first template whose certificate the TPM
/// holds (ECC P-256, then RSA 2048), else ECC P-256 without one.
fn tpm_facts(tpm: &mut dyn bcd_tpm::Tpm) -> Result<TpmFacts, bcd_tpm::Error> {
    use bcd_tpm::EkKind;
    let mut chosen = (EkKind::EccP256, None);
    for kind in [EkKind::EccP256, EkKind::Rsa2048] {
        if let Some(cert) = tpm.ek_certificate(kind)? {
            chosen = (kind, Some(cert));
            break;
        }
    }
    let (kind, ek_certificate) = chosen;
    let ek_chain = match ek_certificate {
        Some(_) => tpm.ek_chain()?,
        None => Vec::new(),
    };
    Ok(TpmFacts {
        kind,
        ek: tpm.ek_public(kind)?,
        ek_certificate,
        ek_chain,
        ak: tpm.ak_public()?,
    })
}

/// What a TPM failure means to the person running the join.
fn tpm_failed(endpoint: &bcd_tpm::TpmAt, e: bcd_tpm::Error) -> anyhow::Error {
    if let bcd_tpm::Error::Unsupported(m) = e {
        anyhow::anyhow!("{m}")
    } else if e.is_unreachable() {
        anyhow::anyhow!(
            "the TPM at {endpoint} cannot be reached ({}): check --tpm (/dev/tpmrm0, or \
             swtpm:HOST:PORT) and that this user may open it",
            bcd_sys::error::chain(&e)
        )
    } else {
        anyhow::anyhow!(
            "the TPM at {endpoint} failed: {}",
            bcd_sys::error::chain(&e)
        )
    }
}

/// Joins with the TPM attestor: the server's credential for this TPM's EK
/// and AK is activated, the node key is made in the TPM from a fresh
/// record, its CSR signed there and its public area certified by the AK
/// over the challenge and the CSR. `node.key` gets the record, never a key.
pub async fn join_with_tpm(
    server: &str,
    pin: &str,
    token: Option<&JoinToken>,
    dir: &Path,
    ramdisk: bool,
    host: &dyn Host,
    endpoint: &bcd_tpm::TpmAt,
) -> anyhow::Result<Identity> {
    use bcd_proto::v1::{AttestationRequest, TpmAttestation};
    use std::sync::Arc;

    let failed = |e| tpm_failed(endpoint, e);
    let ep = endpoint.clone();
    let (key, facts) = crate::tpm_key::blocking(move || {
        let record = bcd_tpm::NodeKeyRecord::generate()
            .map_err(|_| bcd_tpm::Error::Invalid("no randomness for the node key".into()))?;
        let key = crate::tpm_key::TpmKey::open(ep, record)?;
        let facts = key.with_tpm(|t| tpm_facts(t))?;
        Ok::<_, bcd_tpm::Error>((Arc::new(key), facts))
    })
    .map_err(failed)?;

    let mut client = dial(server, pin).await?;
    let challenge = client
        .begin_attestation(AttestationRequest {
            version: bcd_proto::attest::VERSION,
            ek_public: facts.ek.tpmt_bytes().to_vec(),
            ek_certificate: facts.ek_certificate.clone().unwrap_or_default(),
            ak_public: facts.ak.tpmt_bytes().to_vec(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("the server refused to attest this TPM: {}", s.message()))?
        .into_inner();
    if challenge.version != bcd_proto::attest::VERSION {
        bail!(
            "the server's attestation challenge is version {}, this bcd speaks {}: use a bcd of \
             the server's release",
            challenge.version,
            bcd_proto::attest::VERSION
        );
    }

    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, host.hostname());
    params.distinguished_name = dn;
    let (k, kind) = (key.clone(), facts.kind);
    let (secret, csr_der, certification) = crate::tpm_key::blocking(move || {
        let secret = k
            .with_tpm(|t| {
                t.activate_credential(
                    kind,
                    &challenge.credential_blob,
                    &challenge.encrypted_secret,
                )
            })
            .map_err(|e| {
                anyhow::anyhow!(
                    "the TPM did not activate the server's credential: {}",
                    bcd_sys::error::chain(&e)
                )
            })?;
        let signer = k
            .signer(k.record(), &k.public())
            .context("the TPM's node key is not a P-256 key")?;
        let csr = crate::tpm_key::csr(&params, &signer)
            .context("the TPM did not sign the certificate request")?;
        let csr_der = csr.der().to_vec();
        let qualifying = bcd_proto::attest::qualifying_data(&challenge.ticket, &csr_der);
        let certification = k
            .with_tpm(|t| t.certify(&k.record(), &qualifying))
            .map_err(|e| {
                anyhow::anyhow!(
                    "the TPM's AK did not certify the node key: {}",
                    bcd_sys::error::chain(&e)
                )
            })?;
        Ok::<_, anyhow::Error>((secret, csr_der, (challenge.ticket, certification)))
    })?;
    let (ticket, certification) = certification;

    let attestation = TpmAttestation {
        version: bcd_proto::attest::VERSION,
        ticket,
        activated_secret: secret,
        ak_public: facts.ak.tpmt_bytes().to_vec(),
        node_key_public: key.public().tpmt_bytes().to_vec(),
        certify_attest: certification.attest,
        certify_signature: certification.signature,
        ek_certificate: facts.ek_certificate.clone().unwrap_or_default(),
        ek_chain: facts.ek_chain.clone(),
    };
    let resp = send_join(
        &mut client,
        token,
        csr_der.clone(),
        host,
        ramdisk,
        None,
        Some(attestation),
    )
    .await?;
    if crate::tpm_key::certificate_ak(&resp.cert_der).as_deref() != Some(facts.ak.name().as_bytes())
    {
        bail!(
            "the server's certificate does not name this TPM's attestation key: the server \
             predates the TPM attestor; upgrade it"
        );
    }
    let record = key.record().to_text();
    drop(key);
    save(dir, server, pin, ramdisk, &csr_der, resp, record)
}

/// Checks a join's response against the CA pin (the token's, or
/// `--ca-pin`) and the CA's signature, and writes the identity with
/// `node_key` as `node.key`.
fn save(
    dir: &Path,
    server: &str,
    pin: &str,
    ramdisk: bool,
    csr_der: &[u8],
    resp: bcd_proto::v1::JoinResponse,
    node_key: String,
) -> anyhow::Result<Identity> {
    if bcd_proto::fingerprint(&resp.ca_der) != pin {
        bail!(
            "the server returned a CA that does not match the pin (the token's, or --ca-pin): \
             ask the operator for the pin or a token of this server"
        );
    }
    // Everything kept below comes signed by that CA.
    bcd_proto::joined::verify(&resp, csr_der, &resp.ca_der)?;
    let image_keys = bcd_proto::joined::verified_image_keys(&resp, csr_der, &resp.ca_der)?;
    let file = IdentityFile {
        version: crate::identity::IDENTITY_VERSION,
        node_id: resp.node_id,
        server: server.to_string(),
        cert_serial: resp.cert_serial,
        cert_not_after_ms: resp.not_after_ms,
        identity_generation: resp.identity_generation,
        server_time_mark_ms: resp.server_time_ms,
        last_epoch: 0,
        ramdisk,
        worker_keys: resp.worker_keys.iter().map(hex::encode).collect(),
        release_keys: resp.release_keys.iter().map(hex::encode).collect(),
        image_keys: image_keys.iter().map(hex::encode).collect(),
        cert_issued_ms: resp.server_time_ms,
        next: None,
        // A node that joins again as itself starts above what it saw.
        replay_floors: resp
            .floors
            .map(|f| ReplayFloors {
                command_seq: f.command_seq,
                spec_generation: f.spec_generation,
            })
            .unwrap_or_default(),
        clock_base: None,
        hello_seq: 0,
        last_boot_id: String::new(),
        last_journal_id: String::new(),
    };
    let identity = Identity::create(
        dir,
        file,
        node_key,
        CertificateDer::from(resp.cert_der),
        CertificateDer::from(resp.ca_der),
    )?;
    // Check what was written reads back as a whole identity.
    Identity::load(dir)?;
    Ok(identity)
}
