//! The pure-Rust backend: TPM 2.0 commands marshalled by the `tpm2-protocol`
//! crate and sent over a [`Endpoint`] (no C, so it links into the static
//! musl `bcd`).

use ring::rand::{SecureRandom, SystemRandom};
use tpm2_protocol::basic::{TpmHandle, TpmInt32, TpmUint16};
use tpm2_protocol::data::{
    Tpm2bData, Tpm2bDigest, Tpm2bEncryptedSecret, Tpm2bIdObject, Tpm2bNonce, Tpm2bPublic, TpmAlgId,
    TpmRc, TpmRcBase, TpmRh, TpmSe, TpmSt, TpmaSession, TpmsAuthCommand, TpmtPublic, TpmtSigScheme,
    TpmtSymDef, TpmtTkHashcheck, TpmuSigScheme, TpmuSymKeyBits, TpmuSymMode,
};
use tpm2_protocol::frame::{
    TpmActivateCredentialCommand, TpmActivateCredentialResponse, TpmCertifyCommand,
    TpmCreatePrimaryCommand, TpmFlushContextCommand, TpmFrame, TpmNvReadCommand,
    TpmNvReadPublicCommand, TpmNvReadPublicResponse, TpmNvReadResponse, TpmPolicySecretCommand,
    TpmReadPublicCommand, TpmResponse, TpmSignCommand, TpmStartAuthSessionCommand,
    TpmStartAuthSessionResponse, TpmUnmarshalBody, tpm_marshal_command,
};
use tpm2_protocol::{TpmUnmarshal, TpmWriter};

use crate::Tpm;
use crate::attest::{Certification, EcdsaSignature};
use crate::cache::{HandleCache, Slot};
use crate::error::{Error, ResponseCode};
use crate::public::{EkKind, NodeKeyRecord, PublicArea, ak_template, node_key_template};
use crate::transport::{Connection, Endpoint};
use crate::wire::{Malformed, Reader, tpm2b_payload};

const RS_PW: u32 = 0x4000_0009;
const RH_OWNER: u32 = 0x4000_0001;
const RH_NULL: u32 = 0x4000_0007;
const RH_ENDORSEMENT: u32 = 0x4000_000b;
/// NV_Read chunk: within every TPM's MAX_NV_BUFFER_SIZE.
const NV_CHUNK: u16 = 512;

/// A TPM reached through `tpm2-protocol` over a device or swtpm socket.
#[derive(Debug)]
pub struct ProtocolTpm {
    endpoint: Endpoint,
    conn: Option<Connection>,
    cache: HandleCache<u32>,
}

fn password_session() -> TpmsAuthCommand {
    TpmsAuthCommand {
        session_handle: TpmHandle::new(RS_PW),
        nonce: Tpm2bNonce::default(),
        session_attributes: TpmaSession::default(),
        hmac: tpm2_protocol::data::Tpm2bAuth::default(),
    }
}

fn buffer<const N: usize>(
    command: &'static str,
    bytes: &[u8],
) -> Result<tpm2_protocol::basic::TpmBuffer<N>, Error> {
    tpm2_protocol::basic::TpmBuffer::try_from(bytes).map_err(|_| {
        Error::Invalid(format!(
            "{command}: {} bytes do not fit a buffer of {N}",
            bytes.len()
        ))
    })
}

fn protocol_error(command: &'static str, e: impl std::fmt::Debug) -> Error {
    Error::malformed(
        command,
        Malformed {
            what: "TPM response",
            offset: 0,
            reason: format!("{e:?}"),
        },
    )
}

/// The parameter area of a successful response with `handles` handles.
fn parameters(command: &'static str, response: &[u8], handles: usize) -> Result<Vec<u8>, Error> {
    let mut r = Reader::new("TPM response", response);
    let tag = r.u16().map_err(|e| Error::malformed(command, e))?;
    r.bytes(8 + 4 * handles)
        .map_err(|e| Error::malformed(command, e))?;
    if tag == 0x8002 {
        let size = r.u32().map_err(|e| Error::malformed(command, e))? as usize;
        Ok(r.bytes(size)
            .map_err(|e| Error::malformed(command, e))?
            .to_vec())
    } else {
        let at = r.position();
        Ok(response[at..].to_vec())
    }
}

impl ProtocolTpm {
    /// Connects to the TPM at `endpoint`; fails with [`Error::Unreachable`]
    /// when it cannot be opened.
    pub fn open(endpoint: Endpoint) -> Result<Self, Error> {
        let conn = Connection::open(&endpoint).map_err(|source| Error::Unreachable {
            device: endpoint.to_string(),
            source,
        })?;
        Ok(ProtocolTpm {
            endpoint,
            conn: Some(conn),
            cache: HandleCache::new(),
        })
    }

    /// The kernel's resource-managed TPM, `/dev/tpmrm0`.
    pub fn open_default() -> Result<Self, Error> {
        Self::open(Endpoint::Device(crate::transport::DEFAULT_DEVICE.into()))
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn unreachable(&mut self, source: std::io::Error) -> Error {
        // The connection is gone, and with it (resource manager) or not
        // (swtpm restarted) what was loaded: start over on the next call.
        self.conn = None;
        self.cache.drain();
        Error::Unreachable {
            device: self.endpoint.to_string(),
            source,
        }
    }

    /// Sends one command; returns the whole response when the TPM
    /// answered TPM_RC_SUCCESS.
    fn run<C: TpmFrame>(
        &mut self,
        name: &'static str,
        command: &C,
        sessions: &[TpmsAuthCommand],
    ) -> Result<Vec<u8>, Error> {
        let mut buf = vec![0u8; 4096];
        let len = {
            let mut w = TpmWriter::new(&mut buf);
            let tag = if sessions.is_empty() {
                TpmSt::NoSessions
            } else {
                TpmSt::Sessions
            };
            tpm_marshal_command(command, tag, sessions, &mut w)
                .map_err(|e| Error::Invalid(format!("{name} does not marshal: {e:?}")))?;
            w.len()
        };
        buf.truncate(len);
        if self.conn.is_none() {
            match Connection::open(&self.endpoint) {
                Ok(c) => self.conn = Some(c),
                Err(e) => return Err(self.unreachable(e)),
            }
        }
        let result = match self.conn.as_mut() {
            Some(conn) => conn.transceive(&buf),
            None => Err(std::io::Error::from(std::io::ErrorKind::NotConnected)),
        };
        let response = match result {
            Ok(r) => r,
            Err(e) => return Err(self.unreachable(e)),
        };
        let view = TpmResponse::cast(&response).map_err(|e| protocol_error(name, e))?;
        let raw_rc = u32::from_be_bytes([response[6], response[7], response[8], response[9]]);
        match view.rc() {
            Ok(TpmRc::Fmt0(TpmRcBase::Success)) => Ok(response),
            _ => Err(Error::Tpm {
                command: name,
                rc: ResponseCode(raw_rc),
            }),
        }
    }

    fn run_parsed<C: TpmFrame, R: TpmUnmarshalBody>(
        &mut self,
        name: &'static str,
        command: &C,
        sessions: &[TpmsAuthCommand],
    ) -> Result<R, Error> {
        let response = self.run(name, command, sessions)?;
        let view = TpmResponse::cast(&response).map_err(|e| protocol_error(name, e))?;
        view.unmarshal::<R>().map_err(|e| protocol_error(name, e))
    }

    fn flush(&mut self, handle: u32) {
        let cmd = TpmFlushContextCommand {
            handles: [],
            flush_handle: TpmHandle::new(handle),
        };
        // Best effort: a handle that is gone is what flushing wants.
        let _ = self.run("TPM2_FlushContext", &cmd, &[]);
    }

    fn read_public(&mut self, handle: u32) -> Result<PublicArea, Error> {
        let cmd = TpmReadPublicCommand {
            handles: [TpmHandle::new(handle)],
        };
        let response = self.run("TPM2_ReadPublic", &cmd, &[])?;
        let params = parameters("TPM2_ReadPublic", &response, 0)?;
        let mut r = Reader::new("TPM2_ReadPublic response", &params);
        let public = r
            .tpm2b(4096)
            .map_err(|e| Error::malformed("TPM2_ReadPublic", e))?;
        PublicArea::from_tpmt(public).map_err(|e| Error::malformed("TPM2_ReadPublic", e))
    }

    fn create_primary(
        &mut self,
        hierarchy: u32,
        template: &[u8],
    ) -> Result<(u32, PublicArea), Error> {
        const NAME: &str = "TPM2_CreatePrimary";
        let (inner, _) = TpmtPublic::unmarshal(template)
            .map_err(|e| Error::Invalid(format!("a key template does not parse: {e:?}")))?;
        let cmd = TpmCreatePrimaryCommand {
            handles: [TpmHandle::new(hierarchy)],
            in_sensitive: Default::default(),
            in_public: Tpm2bPublic { inner },
            outside_info: Tpm2bData::default(),
            creation_pcr: Default::default(),
        };
        let response = self.run(NAME, &cmd, &[password_session()])?;
        let handle = {
            let mut r = Reader::new("TPM2_CreatePrimary response", &response);
            r.bytes(10).map_err(|e| Error::malformed(NAME, e))?;
            r.u32().map_err(|e| Error::malformed(NAME, e))?
        };
        let params = parameters(NAME, &response, 1)?;
        let mut r = Reader::new("TPM2_CreatePrimary response", &params);
        let parsed = r
            .tpm2b(4096)
            .map_err(|e| Error::malformed(NAME, e))
            .and_then(|p| PublicArea::from_tpmt(p).map_err(|e| Error::malformed(NAME, e)));
        match parsed {
            Ok(public) => Ok((handle, public)),
            Err(e) => {
                self.flush(handle);
                Err(e)
            }
        }
    }

    /// Loads the key in `slot` unless it is loaded; keeps `keep` loaded.
    fn load(&mut self, slot: Slot, keep: &[Slot]) -> Result<(u32, PublicArea), Error> {
        if let Some(found) = self.cache.get(&slot) {
            return Ok(found);
        }
        if let Slot::Ek(kind) = &slot {
            // A platform keeps its EK at the TCG handle; use it when it is
            // the default template's key.
            match self.read_public(kind.persistent_handle()) {
                Ok(public) => {
                    let template = PublicArea::from_tpmt(&kind.template())
                        .map_err(|e| Error::malformed("EK template", e))?;
                    if public.same_template(&template) {
                        self.cache.insert(
                            slot.clone(),
                            kind.persistent_handle(),
                            false,
                            public.clone(),
                        );
                        return Ok((kind.persistent_handle(), public));
                    }
                }
                Err(Error::Tpm { rc, .. }) if rc.is_handle() => {}
                Err(e) => return Err(e),
            }
        }
        for handle in self.cache.make_room(keep) {
            self.flush(handle);
        }
        let (hierarchy, template) = match &slot {
            Slot::Ek(kind) => (RH_ENDORSEMENT, kind.template()),
            Slot::Ak => (RH_ENDORSEMENT, ak_template()),
            Slot::Node(unique) => (
                RH_OWNER,
                node_key_template(&NodeKeyRecord::from_unique(*unique)),
            ),
        };
        let (handle, public) = self.create_primary(hierarchy, &template)?;
        self.cache.insert(slot, handle, true, public.clone());
        Ok((handle, public))
    }

    /// A policy session that satisfies the EK policy:
    /// PolicySecret(TPM_RH_ENDORSEMENT).
    fn ek_policy_session(&mut self) -> Result<u32, Error> {
        let mut nonce = [0u8; 32];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::Invalid("no randomness from the system".into()))?;
        let cmd = TpmStartAuthSessionCommand {
            handles: [TpmHandle::new(RH_NULL), TpmHandle::new(RH_NULL)],
            nonce_caller: buffer("TPM2_StartAuthSession", &nonce)?,
            encrypted_salt: Tpm2bEncryptedSecret::default(),
            session_type: TpmSe::Policy,
            symmetric: TpmtSymDef {
                algorithm: TpmAlgId::Null,
                key_bits: TpmuSymKeyBits::Null,
                mode: TpmuSymMode::Null,
            },
            auth_hash: TpmAlgId::Sha256,
        };
        let r: TpmStartAuthSessionResponse = self.run_parsed("TPM2_StartAuthSession", &cmd, &[])?;
        let session = r.handles[0].value();
        let cmd = TpmPolicySecretCommand {
            handles: [TpmHandle::new(RH_ENDORSEMENT), TpmHandle::new(session)],
            nonce_tpm: Tpm2bNonce::default(),
            cp_hash_a: Tpm2bDigest::default(),
            policy_ref: Tpm2bNonce::default(),
            expiration: TpmInt32::new(0),
        };
        if let Err(e) = self.run("TPM2_PolicySecret", &cmd, &[password_session()]) {
            self.flush(session);
            return Err(e);
        }
        Ok(session)
    }

    /// Retries once after the TPM forgot a handle this backend kept (a
    /// TPM2_Clear or restart under a live connection).
    fn with_retry<T>(
        &mut self,
        mut f: impl FnMut(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        match f(self) {
            Err(Error::Tpm { rc, .. }) if rc.is_stale_reference() => {
                for h in self.cache.drain() {
                    self.flush(h);
                }
                f(self)
            }
            other => other,
        }
    }
}

impl Drop for ProtocolTpm {
    fn drop(&mut self) {
        if self.conn.is_some() {
            for h in self.cache.drain() {
                self.flush(h);
            }
        }
    }
}

impl Tpm for ProtocolTpm {
    fn backend(&self) -> &'static str {
        "tpm2-protocol"
    }

    fn ek_public(&mut self, kind: EkKind) -> Result<PublicArea, Error> {
        self.with_retry(|t| t.load(Slot::Ek(kind), &[]).map(|(_, p)| p))
    }

    fn nv_read(&mut self, index: u32) -> Result<Option<Vec<u8>>, Error> {
        let cmd = TpmNvReadPublicCommand {
            handles: [TpmHandle::new(index)],
        };
        let public: TpmNvReadPublicResponse = match self.run_parsed("TPM2_NV_ReadPublic", &cmd, &[])
        {
            Ok(p) => p,
            Err(Error::Tpm { rc, .. }) if rc.is_handle() => return Ok(None),
            Err(e) => return Err(e),
        };
        let size = public.nv_public.inner.data_size.value();
        let mut out = Vec::with_capacity(usize::from(size));
        while out.len() < usize::from(size) {
            let offset = out.len() as u16;
            let chunk = (size - offset).min(NV_CHUNK);
            let cmd = TpmNvReadCommand {
                handles: [TpmHandle::new(index), TpmHandle::new(index)],
                size: TpmUint16::new(chunk),
                offset: TpmUint16::new(offset),
            };
            let r: TpmNvReadResponse =
                self.run_parsed("TPM2_NV_Read", &cmd, &[password_session()])?;
            if r.data.is_empty() {
                return Err(protocol_error("TPM2_NV_Read", "an empty read"));
            }
            out.extend_from_slice(&r.data);
        }
        Ok(Some(out))
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
        let credential_blob: Tpm2bIdObject = buffer(NAME, blob)?;
        let secret: Tpm2bEncryptedSecret = buffer(NAME, secret)?;
        self.with_retry(|t| {
            let (ak, _) = t.load(Slot::Ak, &[Slot::Ek(kind)])?;
            let (ek, _) = t.load(Slot::Ek(kind), &[Slot::Ak])?;
            let session = t.ek_policy_session()?;
            let cmd = TpmActivateCredentialCommand {
                handles: [TpmHandle::new(ak), TpmHandle::new(ek)],
                credential_blob,
                secret,
            };
            let policy = TpmsAuthCommand {
                session_handle: TpmHandle::new(session),
                nonce: Tpm2bNonce::default(),
                // continueSession clear: the TPM ends the session.
                session_attributes: TpmaSession::default(),
                hmac: tpm2_protocol::data::Tpm2bAuth::default(),
            };
            let result: Result<TpmActivateCredentialResponse, Error> =
                t.run_parsed(NAME, &cmd, &[password_session(), policy]);
            match result {
                Ok(r) => Ok(r.cert_info.to_vec()),
                Err(e) => {
                    // A failed command leaves the session loaded.
                    t.flush(session);
                    Err(e)
                }
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
        let qualifying: Tpm2bData = buffer(NAME, qualifying_data)?;
        self.with_retry(|t| {
            let node = Slot::Node(*record.unique());
            let (ak, _) = t.load(Slot::Ak, std::slice::from_ref(&node))?;
            let (key, _) = t.load(node, &[Slot::Ak])?;
            let cmd = TpmCertifyCommand {
                handles: [TpmHandle::new(key), TpmHandle::new(ak)],
                qualifying_data: qualifying,
                in_scheme: TpmtSigScheme {
                    scheme: TpmAlgId::Null,
                    details: TpmuSigScheme::Null,
                },
            };
            let response = t.run(NAME, &cmd, &[password_session(), password_session()])?;
            let params = parameters(NAME, &response, 0)?;
            let mut r = Reader::new("TPM2_Certify response", &params);
            let attest = r.tpm2b(4096).map_err(|e| Error::malformed(NAME, e))?;
            let at = r.position();
            Ok(Certification {
                attest: attest.to_vec(),
                signature: params[at..].to_vec(),
            })
        })
    }

    fn sign(&mut self, record: &NodeKeyRecord, digest: &[u8; 32]) -> Result<EcdsaSignature, Error> {
        const NAME: &str = "TPM2_Sign";
        self.with_retry(|t| {
            let (key, _) = t.load(Slot::Node(*record.unique()), &[])?;
            let cmd = TpmSignCommand {
                handles: [TpmHandle::new(key)],
                digest: buffer(NAME, digest)?,
                in_scheme: TpmtSigScheme {
                    scheme: TpmAlgId::Null,
                    details: TpmuSigScheme::Null,
                },
                validation: TpmtTkHashcheck {
                    tag: TpmSt::HashCheck,
                    hierarchy: TpmRh::Null,
                    digest: Tpm2bDigest::default(),
                },
            };
            let response = t.run(NAME, &cmd, &[password_session()])?;
            let params = parameters(NAME, &response, 0)?;
            EcdsaSignature::from_tpmt(&params).map_err(|e| Error::malformed(NAME, e))
        })
    }
}
