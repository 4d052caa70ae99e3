//! The `tss-esapi` backend (feature `tss`): the TCG software stack in C,
//! for the glibc flavour. TCTI `device:/dev/tpmrm0` on a machine,
//! `swtpm:host=...,port=...` against swtpm. The same templates and the same
//! parsed results as the pure-Rust backend.

use std::str::FromStr;

use tss_esapi::Context;
use tss_esapi::constants::tss::{TPM2_RH_NULL, TPM2_ST_HASHCHECK};
use tss_esapi::constants::{CapabilityType, SessionType};
use tss_esapi::handles::{
    AuthHandle, KeyHandle, NvIndexTpmHandle, ObjectHandle, PersistentTpmHandle, SessionHandle,
    TpmHandle,
};
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::resource_handles::{Hierarchy, NvAuth};
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    CapabilityData, Data, Digest, EncryptedSecret, HashcheckTicket, IdObject, Nonce, Public,
    SignatureScheme, SymmetricDefinition,
};
use tss_esapi::tcti_ldr::TctiNameConf;
use tss_esapi::traits::{Marshall, UnMarshall};
use tss_esapi::tss2_esys::TPMT_TK_HASHCHECK;

use crate::Tpm;
use crate::attest::{Certification, EcdsaSignature};
use crate::cache::{HandleCache, Slot};
use crate::error::{Error, ResponseCode};
use crate::public::{EkKind, NodeKeyRecord, PublicArea, ak_template, node_key_template};
use crate::wire::tpm2b_payload;

/// The TSS layer of TPM response codes (bits 16..24 zero).
const LAYER_TPM: u32 = 0;
/// TSS2_BASE_RC_IO_ERROR and TSS2_BASE_RC_NO_CONNECTION.
const BASE_IO_ERROR: u32 = 10;
const BASE_NO_CONNECTION: u32 = 11;

/// A TPM reached through tpm2-tss's ESAPI.
pub struct TssTpm {
    tcti: String,
    ctx: Option<Context>,
    cache: HandleCache<KeyHandle>,
}

impl std::fmt::Debug for TssTpm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TssTpm")
            .field("tcti", &self.tcti)
            .field("connected", &self.ctx.is_some())
            .finish_non_exhaustive()
    }
}

/// The TSS2_RC inside a tss-esapi error, when it carries one.
fn raw_rc(e: &tss_esapi::Error) -> Option<u32> {
    use tss_esapi::constants::response_code::Tss2ResponseCode;
    let text = match e {
        tss_esapi::Error::Tss2Error(Tss2ResponseCode::FormatZero(rc)) => rc.to_string(),
        tss_esapi::Error::Tss2Error(Tss2ResponseCode::FormatOne(rc)) => rc.to_string(),
        _ => return None,
    };
    // Both print "Response code value: 0x...".
    let hex = text.rsplit("0x").next()?;
    u32::from_str_radix(hex.trim(), 16).ok()
}

impl TssTpm {
    /// Opens the TPM through `tcti` (a tpm2-tss TCTI string such as
    /// `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`).
    pub fn open(tcti: &str) -> Result<Self, Error> {
        let mut t = TssTpm {
            tcti: tcti.to_owned(),
            ctx: None,
            cache: HandleCache::new(),
        };
        t.context()?;
        Ok(t)
    }

    /// The kernel's resource-managed TPM.
    pub fn open_default() -> Result<Self, Error> {
        Self::open("device:/dev/tpmrm0")
    }

    fn context(&mut self) -> Result<&mut Context, Error> {
        if self.ctx.is_none() {
            let conf = TctiNameConf::from_str(&self.tcti)
                .map_err(|e| Error::Invalid(format!("TCTI {:?}: {e}", self.tcti)))?;
            let ctx = Context::new(conf).map_err(|e| self.error("Esys_Initialize", e))?;
            self.ctx = Some(ctx);
        }
        match self.ctx.as_mut() {
            Some(c) => Ok(c),
            None => Err(Error::Invalid("no TSS context".into())),
        }
    }

    /// Maps a tss-esapi error; an unreachable TPM drops the context so that
    /// the next call connects again.
    fn error(&mut self, command: &'static str, e: tss_esapi::Error) -> Error {
        match raw_rc(&e) {
            Some(rc) if rc >> 16 == LAYER_TPM => Error::Tpm {
                command,
                rc: ResponseCode(rc),
            },
            Some(rc) if matches!(rc & 0xffff, BASE_IO_ERROR | BASE_NO_CONNECTION) => {
                // The context and the handles it held are gone.
                self.ctx = None;
                self.cache.drain();
                Error::Unreachable {
                    device: self.tcti.clone(),
                    source: std::io::Error::other(e),
                }
            }
            _ => Error::Stack {
                command,
                detail: e.to_string(),
            },
        }
    }

    fn flush(&mut self, handle: ObjectHandle) {
        if let Some(ctx) = self.ctx.as_mut() {
            // Best effort: a handle that is gone is what flushing wants.
            let _ = ctx.flush_context(handle);
        }
    }

    fn create_primary(
        &mut self,
        hierarchy: Hierarchy,
        template: &[u8],
    ) -> Result<(KeyHandle, PublicArea), Error> {
        const NAME: &str = "TPM2_CreatePrimary";
        let public = Public::unmarshall(template)
            .map_err(|e| Error::Invalid(format!("a key template does not parse: {e}")))?;
        let result = self
            .context()?
            .execute_with_session(Some(AuthSession::Password), |c| {
                c.create_primary(hierarchy, public, None, None, None, None)
            });
        let created = result.map_err(|e| self.error(NAME, e))?;
        let bytes = created
            .out_public
            .marshall()
            .map_err(|e| self.error(NAME, e));
        match bytes.and_then(|b| PublicArea::from_tpmt(&b).map_err(|e| Error::malformed(NAME, e))) {
            Ok(p) => Ok((created.key_handle, p)),
            Err(e) => {
                self.flush(created.key_handle.into());
                Err(e)
            }
        }
    }

    /// Whether the TPM holds `handle` (a persistent object or an NV
    /// index), asked with TPM2_GetCapability. Probing with the command
    /// itself would fail for an absence that is normal (no persistent EK
    /// yet, no EK certificate), and the C stack logs every failed command
    /// as an ERROR line.
    fn has_handle(&mut self, handle: u32) -> Result<bool, Error> {
        let asked = self
            .context()?
            .get_capability(CapabilityType::Handles, handle, 1);
        let (data, _) = asked.map_err(|e| self.error("TPM2_GetCapability", e))?;
        Ok(match data {
            CapabilityData::Handles(list) => list
                .as_ref()
                .first()
                .is_some_and(|h| u32::from(*h) == handle),
            _ => false,
        })
    }

    fn persistent(&mut self, handle: u32) -> Result<Option<(KeyHandle, PublicArea)>, Error> {
        const NAME: &str = "TPM2_ReadPublic";
        if !self.has_handle(handle)? {
            return Ok(None);
        }
        let tpm_handle = PersistentTpmHandle::new(handle)
            .map_err(|e| Error::Invalid(format!("handle {handle:#x}: {e}")))?;
        let found = self
            .context()?
            .tr_from_tpm_public(TpmHandle::Persistent(tpm_handle));
        let object = match found {
            Ok(o) => o,
            Err(e) => {
                return match self.error(NAME, e) {
                    Error::Tpm { rc, .. } if rc.is_handle() => Ok(None),
                    other => Err(other),
                };
            }
        };
        let read = self.context()?.read_public(KeyHandle::from(object));
        let (public, _, _) = read.map_err(|e| self.error(NAME, e))?;
        let bytes = public.marshall().map_err(|e| self.error(NAME, e))?;
        let area = PublicArea::from_tpmt(&bytes).map_err(|e| Error::malformed(NAME, e))?;
        Ok(Some((KeyHandle::from(object), area)))
    }

    fn load(&mut self, slot: Slot, keep: &[Slot]) -> Result<(KeyHandle, PublicArea), Error> {
        if let Some(found) = self.cache.get(&slot) {
            return Ok(found);
        }
        if let Slot::Ek(kind) = &slot
            && let Some((handle, public)) = self.persistent(kind.persistent_handle())?
        {
            let template = PublicArea::from_tpmt(&kind.template())
                .map_err(|e| Error::malformed("EK template", e))?;
            if public.same_template(&template) {
                self.cache
                    .insert(slot.clone(), handle, false, public.clone());
                return Ok((handle, public));
            }
            if let Some(ctx) = self.ctx.as_mut() {
                let mut object = ObjectHandle::from(handle);
                let _ = ctx.tr_close(&mut object);
            }
        }
        for handle in self.cache.make_room(keep) {
            self.flush(handle.into());
        }
        let (hierarchy, template) = match &slot {
            Slot::Ek(kind) => (Hierarchy::Endorsement, kind.template()),
            Slot::Ak => (Hierarchy::Endorsement, ak_template()),
            Slot::Node(unique) => (
                Hierarchy::Owner,
                node_key_template(&NodeKeyRecord::from_unique(*unique)),
            ),
        };
        let (handle, public) = self.create_primary(hierarchy, &template)?;
        self.cache.insert(slot, handle, true, public.clone());
        Ok((handle, public))
    }

    fn with_retry<T>(
        &mut self,
        mut f: impl FnMut(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        match f(self) {
            Err(Error::Tpm { rc, .. }) if rc.is_stale_reference() => {
                for h in self.cache.drain() {
                    self.flush(h.into());
                }
                f(self)
            }
            other => other,
        }
    }

    fn ek_policy_session(&mut self) -> Result<AuthSession, Error> {
        let started = self.context()?.start_auth_session(
            None,
            None,
            None,
            SessionType::Policy,
            SymmetricDefinition::Null,
            HashingAlgorithm::Sha256,
        );
        let session = started
            .map_err(|e| self.error("TPM2_StartAuthSession", e))?
            .ok_or_else(|| Error::Stack {
                command: "TPM2_StartAuthSession",
                detail: "no session".into(),
            })?;
        let policy =
            PolicySession::try_from(session).map_err(|e| self.error("TPM2_PolicySecret", e))?;
        let result = self
            .context()?
            .execute_with_session(Some(AuthSession::Password), |c| {
                c.policy_secret(
                    policy,
                    AuthHandle::Endorsement,
                    Nonce::default(),
                    Digest::default(),
                    Nonce::default(),
                    None,
                )
            });
        if let Err(e) = result {
            let err = self.error("TPM2_PolicySecret", e);
            self.flush(SessionHandle::from(session).into());
            return Err(err);
        }
        Ok(session)
    }
}

impl Drop for TssTpm {
    fn drop(&mut self) {
        for h in self.cache.drain() {
            self.flush(h.into());
        }
    }
}

fn malformed_input(what: &'static str, e: tss_esapi::Error) -> Error {
    Error::Invalid(format!("{what}: {e}"))
}

impl Tpm for TssTpm {
    fn backend(&self) -> &'static str {
        "tss-esapi"
    }

    fn ek_public(&mut self, kind: EkKind) -> Result<PublicArea, Error> {
        self.with_retry(|t| t.load(Slot::Ek(kind), &[]).map(|(_, p)| p))
    }

    fn nv_read(&mut self, index: u32) -> Result<Option<Vec<u8>>, Error> {
        const NAME: &str = "TPM2_NV_Read";
        if !self.has_handle(index)? {
            return Ok(None);
        }
        let index =
            NvIndexTpmHandle::new(index).map_err(|e| Error::Invalid(format!("NV index: {e}")))?;
        let read = {
            let ctx = self.context()?;
            ctx.execute_with_session(Some(AuthSession::Password), |c| {
                tss_esapi::abstraction::nv::read_full(c, NvAuth::Owner, index)
            })
        };
        match read {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) => match self.error(NAME, e) {
                Error::Tpm { rc, .. } if rc.is_handle() => Ok(None),
                other => Err(other),
            },
        }
    }

    fn ak_public(&mut self) -> Result<PublicArea, Error> {
        self.with_retry(|t| t.load(Slot::Ak, &[]).map(|(_, p)| p))
    }

    fn activate_credential(
        &mut self,
        kind: EkKind,
        credential_blob: &[u8],
        encrypted_secret: &[u8],
    ) -> Result<Vec<u8>, Error> {
        const NAME: &str = "TPM2_ActivateCredential";
        let blob = tpm2b_payload("TPM2B_ID_OBJECT", credential_blob, 132)
            .map_err(|e| Error::Invalid(format!("the credential: {e}")))?;
        let secret = tpm2b_payload("TPM2B_ENCRYPTED_SECRET", encrypted_secret, 512)
            .map_err(|e| Error::Invalid(format!("the credential's secret: {e}")))?;
        let blob = IdObject::try_from(blob.to_vec()).map_err(|e| malformed_input(NAME, e))?;
        let secret =
            EncryptedSecret::try_from(secret.to_vec()).map_err(|e| malformed_input(NAME, e))?;
        self.with_retry(|t| {
            let (ak, _) = t.load(Slot::Ak, &[Slot::Ek(kind)])?;
            let (ek, _) = t.load(Slot::Ek(kind), &[Slot::Ak])?;
            let session = t.ek_policy_session()?;
            let result = t
                .context()?
                .execute_with_sessions((Some(AuthSession::Password), Some(session), None), |c| {
                    c.activate_credential(ak, ek, blob.clone(), secret.clone())
                });
            t.flush(SessionHandle::from(session).into());
            match result {
                Ok(digest) => Ok(digest.to_vec()),
                Err(e) => Err(t.error(NAME, e)),
            }
        })
    }

    fn node_key_public(&mut self, record: &NodeKeyRecord) -> Result<PublicArea, Error> {
        self.with_retry(|t| t.load(Slot::Node(*record.unique()), &[]).map(|(_, p)| p))
    }

    fn certify(
        &mut self,
        record: &NodeKeyRecord,
        qualifying_data: &[u8],
    ) -> Result<Certification, Error> {
        const NAME: &str = "TPM2_Certify";
        let data =
            Data::try_from(qualifying_data.to_vec()).map_err(|e| malformed_input(NAME, e))?;
        self.with_retry(|t| {
            let node = Slot::Node(*record.unique());
            let (ak, _) = t.load(Slot::Ak, std::slice::from_ref(&node))?;
            let (key, _) = t.load(node, &[Slot::Ak])?;
            let result = t.context()?.execute_with_sessions(
                (
                    Some(AuthSession::Password),
                    Some(AuthSession::Password),
                    None,
                ),
                |c| c.certify(key.into(), ak, data.clone(), SignatureScheme::Null),
            );
            let (attest, signature) = result.map_err(|e| t.error(NAME, e))?;
            Ok(Certification {
                attest: attest.marshall().map_err(|e| t.error(NAME, e))?,
                signature: signature.marshall().map_err(|e| t.error(NAME, e))?,
            })
        })
    }

    fn sign(&mut self, record: &NodeKeyRecord, digest: &[u8; 32]) -> Result<EcdsaSignature, Error> {
        const NAME: &str = "TPM2_Sign";
        let digest = Digest::try_from(digest.to_vec()).map_err(|e| malformed_input(NAME, e))?;
        let validation = HashcheckTicket::try_from(TPMT_TK_HASHCHECK {
            tag: TPM2_ST_HASHCHECK,
            hierarchy: TPM2_RH_NULL,
            digest: Default::default(),
        })
        .map_err(|e| malformed_input(NAME, e))?;
        self.with_retry(|t| {
            let (key, _) = t.load(Slot::Node(*record.unique()), &[])?;
            let result = t
                .context()?
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.sign(
                        key,
                        digest.clone(),
                        SignatureScheme::Null,
                        validation.clone(),
                    )
                });
            let signature = result.map_err(|e| t.error(NAME, e))?;
            let bytes = signature.marshall().map_err(|e| t.error(NAME, e))?;
            EcdsaSignature::from_tpmt(&bytes).map_err(|e| Error::malformed(NAME, e))
        })
    }
}
