//! The node's TPM: the endorsement key (EK), the attestation key (AK), the
//! activation of a credential the server made for them, and node keys that
//! live in the TPM (derived from a record the agent keeps in `node.key`),
//! certified by the AK and signing for the node without leaving the TPM.
//!
//! One trait, [`Tpm`], two real backends:
//! - [`ProtocolTpm`] (always built): pure Rust over the `tpm2-protocol`
//!   crate, talking to `/dev/tpmrm0` or to swtpm's socket. No C: it links
//!   into the static musl `bcd`.
//! - `TssTpm` (feature `tss`): the C TPM software stack through
//!   `tss-esapi`, for the glibc flavour (Debian `libtss2-dev`).
//!
//! [`TpmAt`] names a TPM and the [`Backend`] to reach it with, and opens
//! it as a `Box<dyn Tpm>`: what the agent's join, node key and doctor use.
//! The tss-esapi backend reaches a device or swtpm, not a TPM behind
//! `bcd helper`.
//!
//! The server's half of attestation, in software and without a TPM, is the
//! [`verify`] module (feature `verify`): MakeCredential for RSA and ECC EKs
//! and the verification of TPM2_Certify statements. Parsing and naming of
//! TPM public areas ([`public`]) and of certifications ([`attest`]) is shared
//! by both sides.
//!
//! What this crate must not do: decide policy (which EK to trust, when to
//! renew, what an error means to an operator: the agent and the server
//! word those), hold state on disk, or change the TPM's hierarchies (it
//! never clears, evicts or changes authorizations). It assumes empty
//! endorsement and owner authorizations, as a platform ships them.
//!
//! Neighbours: `bcd` (the agent) calls the trait from `spawn_blocking`;
//! `better-compute` (the join service) calls [`verify`]; [`swtpm`] starts
//! software TPMs for the tests and benchmarks of both.

pub mod attest;
mod backend;
mod cache;
pub mod error;
mod protocol;
pub mod public;
pub mod swtpm;
pub mod transport;
#[cfg(feature = "tss")]
mod tss;
#[cfg(feature = "verify")]
pub mod verify;
mod wire;

pub use attest::{Certification, CertifyInfo, EcdsaSignature};
pub use backend::{Backend, TpmAt, tcti};
pub use error::{Error, ResponseCode};
pub use protocol::ProtocolTpm;
pub use public::{EkKind, Name, NodeKeyRecord, PublicArea};
pub use transport::Endpoint;
#[cfg(feature = "tss")]
pub use tss::TssTpm;
pub use wire::Malformed;

/// The first NV index of the EK certificate chain (TCG EK Credential
/// Profile: 0x01c00100 to 0x01c001ff, filled from the first on).
pub const EK_CHAIN_FIRST_INDEX: u32 = 0x01c0_0100;
/// The most chain certificates a node reads and sends: as many as a server
/// follows between an EK certificate and an enrolled root.
pub const EK_CHAIN_MAX: usize = 4;

/// A TPM as the attestor and the node key need it. Calls block (the agent
/// runs them on a blocking thread); a backend keeps the keys it derived
/// loaded between calls and reconnects after the TPM was unreachable.
pub trait Tpm: Send {
    /// Which backend this is ("tpm2-protocol", "tss-esapi").
    fn backend(&self) -> &'static str;

    /// The EK of the TCG default template `kind`: the platform's persistent
    /// EK when it is that template's, else derived now.
    fn ek_public(&mut self, kind: EkKind) -> Result<PublicArea, Error>;

    /// The whole contents of NV index `index` (an EK certificate or one of
    /// its chain, which a manufacturer leaves readable without a
    /// password); `None` when the TPM has no such index.
    fn nv_read(&mut self, index: u32) -> Result<Option<Vec<u8>>, Error>;

    /// The EK certificate (DER) from its NV index; `None` when the TPM has
    /// none.
    fn ek_certificate(&mut self, kind: EkKind) -> Result<Option<Vec<u8>>, Error> {
        self.nv_read(kind.certificate_index())
    }

    /// The certificates a manufacturer left between the EK certificate and
    /// its root, one per NV index from [`EK_CHAIN_FIRST_INDEX`] on (the TCG
    /// EK credential profile's chain indices, consecutive), at most
    /// [`EK_CHAIN_MAX`]; empty when the TPM holds none.
    fn ek_chain(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        let mut chain = Vec::new();
        for index in (EK_CHAIN_FIRST_INDEX..).take(EK_CHAIN_MAX) {
            match self.nv_read(index)? {
                Some(cert) => chain.push(cert),
                None => break,
            }
        }
        Ok(chain)
    }

    /// The AK: a restricted ECDSA P-256 signing key, a primary of the
    /// endorsement hierarchy (the same on every call; TPM2_Clear keeps it).
    fn ak_public(&mut self) -> Result<PublicArea, Error>;

    /// TPM2_ActivateCredential of a credential made for this TPM's EK
    /// (`kind`) and AK: `credential_blob` is the TPM2B_ID_OBJECT and
    /// `encrypted_secret` the TPM2B_ENCRYPTED_SECRET, size prefixes
    /// included. Returns the secret the server put in.
    fn activate_credential(
        &mut self,
        kind: EkKind,
        credential_blob: &[u8],
        encrypted_secret: &[u8],
    ) -> Result<Vec<u8>, Error>;

    /// The node key `record` derives: an ECDSA P-256 signing key, a primary
    /// of the owner hierarchy (another key after TPM2_Clear).
    fn node_key_public(&mut self, record: &NodeKeyRecord) -> Result<PublicArea, Error>;

    /// TPM2_Certify of the node key by the AK, with the server's
    /// `qualifying_data` (at most 64 bytes).
    fn certify(
        &mut self,
        record: &NodeKeyRecord,
        qualifying_data: &[u8],
    ) -> Result<Certification, Error>;

    /// Signs a SHA-256 digest with the node key.
    fn sign(&mut self, record: &NodeKeyRecord, digest: &[u8; 32]) -> Result<EcdsaSignature, Error>;
}

/// Checks that this TPM's AK is the one a certificate names; returns its
/// public area. [`Error::AkMismatch`] when it is another (another TPM, or
/// its endorsement seed changed).
pub fn check_ak(tpm: &mut dyn Tpm, expected: &Name) -> Result<PublicArea, Error> {
    let ak = tpm.ak_public()?;
    let actual = ak.name();
    if &actual != expected {
        return Err(Error::AkMismatch {
            expected: expected.clone(),
            actual,
        });
    }
    Ok(ak)
}

/// Checks that `record` still derives the key whose SubjectPublicKeyInfo
/// (DER) the node certificate holds; returns its public area.
/// [`Error::NodeKeyMismatch`] when it derives another (TPM2_Clear).
pub fn check_node_key(
    tpm: &mut dyn Tpm,
    record: &NodeKeyRecord,
    expected_spki: &[u8],
) -> Result<PublicArea, Error> {
    let key = tpm.node_key_public(record)?;
    if !key.matches_spki(expected_spki) {
        return Err(Error::NodeKeyMismatch);
    }
    Ok(key)
}
