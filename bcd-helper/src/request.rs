//! Typed requests and replies: what a [`crate::Handler`] is given and
//! answers.
//!
//! [`Request::validate`] is the only way from the wire to a [`Request`]:
//! it runs the checks of [`crate::validate`] on every field. The reply a
//! request gets is fixed by its [`Kind`]; the server refuses to send a
//! handler's reply of another shape, and the client refuses to accept one.

use std::collections::BTreeSet;

use crate::validate::{
    self, AllocationId, CdiSpec, EnvFile, FirewallRule, Invalid, Kexec, PciAddress, SecretPath,
    SecretValue, Sha256, SshdFiles, StagedFile, TpmCommand,
};
use crate::wire;

/// A request that passed validation, with what the handler is to do.
///
/// Files are written atomically (temporary file, fsync, rename, fsync the
/// directory) and only when their bytes differ, as the agent's convergers
/// write them in root mode, so both modes leave the same machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Write the `nvidia.com/gpu` CDI spec's bytes as sent
    /// (`<cdi dir>/bcd-nvidia-gpu.json`, mode 0644).
    WriteCdiSpec(Box<CdiSpec>),
    /// Remove the CDI spec if it is there.
    RemoveCdiSpec,
    /// Write [`EnvFile::render`] to `<env dir>/<id>.env` (mode 0644).
    WriteEnvFile(EnvFile),
    /// Remove `<env dir>/<id>.env` if it is there.
    RemoveEnvFile(AllocationId),
    /// Write the sshd files and `sshd_config.d/bcd.conf` after `sshd -t`
    /// accepts them; when empty, remove them.
    WriteSshd(SshdFiles),
    /// Replace table `inet bcd` with these rules in one `nft` transaction.
    ApplyFirewall(Vec<FirewallRule>),
    /// Delete table `inet bcd` if it is there.
    DeleteFirewall,
    /// Reset the GPU at this PCI address (the server checked under sysfs
    /// that it is an NVIDIA GPU before the handler sees it).
    ResetGpu(PciAddress),
    /// Reboot: through logind where [`crate::systemd::detect`] finds
    /// systemd, else directly.
    Reboot { reason: String },
    /// Copy the staged kernel (and initrd) somewhere the client cannot
    /// write, check the copies' SHA-256, then load and execute them.
    Kexec(Kexec),
    /// Copy a staged release binary into the slot (root-owned, mode 0755)
    /// after checking the copy's SHA-256.
    InstallSlot {
        slot: validate::Slot,
        file: StagedFile,
        sha256: Sha256,
    },
    /// Point `current` at the slot, once its binary exists and has this
    /// SHA-256.
    SwitchSlot {
        slot: validate::Slot,
        sha256: Sha256,
    },
    /// Swap an unconfirmed upgrade back (as `bcd rollback`).
    RollBack,
    /// Restart the bcd service: the systemd manager's `RestartUnit` where
    /// systemd runs.
    RestartDaemon,
    /// Send the command to the TPM on this connection's own open of
    /// `/dev/tpmrm0`, and answer its whole response.
    Tpm(TpmCommand),
    /// Write a secret's value to `<secrets dir>/ALLOCATION/FILE` (mode
    /// 0400, directories 0700), only where that directory is
    /// memory-backed.
    WriteSecret {
        path: SecretPath,
        value: SecretValue,
    },
    /// Remove every secret file under the secrets directory but these.
    RetainSecrets(BTreeSet<SecretPath>),
}

/// A request's kind: what it is without its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    WriteCdiSpec,
    RemoveCdiSpec,
    WriteEnvFile,
    RemoveEnvFile,
    WriteSshd,
    ApplyFirewall,
    DeleteFirewall,
    ResetGpu,
    Reboot,
    Kexec,
    InstallSlot,
    SwitchSlot,
    RollBack,
    RestartDaemon,
    Tpm,
    WriteSecret,
    RetainSecrets,
}

/// What a request's reply holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyShape {
    Done,
    Written,
    Tpm,
    RolledBack,
}

impl Kind {
    /// The kind's name, for logs and errors: `write-cdi-spec`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::WriteCdiSpec => "write-cdi-spec",
            Kind::RemoveCdiSpec => "remove-cdi-spec",
            Kind::WriteEnvFile => "write-env-file",
            Kind::RemoveEnvFile => "remove-env-file",
            Kind::WriteSshd => "write-sshd",
            Kind::ApplyFirewall => "apply-firewall",
            Kind::DeleteFirewall => "delete-firewall",
            Kind::ResetGpu => "reset-gpu",
            Kind::Reboot => "reboot",
            Kind::Kexec => "kexec",
            Kind::InstallSlot => "install-slot",
            Kind::SwitchSlot => "switch-slot",
            Kind::RollBack => "roll-back",
            Kind::RestartDaemon => "restart-daemon",
            Kind::Tpm => "tpm",
            Kind::WriteSecret => "write-secret",
            Kind::RetainSecrets => "retain-secrets",
        }
    }

    /// The reply this kind gets.
    pub fn reply_shape(self) -> ReplyShape {
        match self {
            Kind::WriteCdiSpec
            | Kind::RemoveCdiSpec
            | Kind::WriteEnvFile
            | Kind::RemoveEnvFile
            | Kind::WriteSshd
            | Kind::ApplyFirewall
            | Kind::DeleteFirewall
            | Kind::InstallSlot
            | Kind::SwitchSlot
            | Kind::WriteSecret
            | Kind::RetainSecrets => ReplyShape::Written,
            Kind::ResetGpu | Kind::Reboot | Kind::Kexec | Kind::RestartDaemon => ReplyShape::Done,
            Kind::RollBack => ReplyShape::RolledBack,
            Kind::Tpm => ReplyShape::Tpm,
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Request {
    /// Checks every field of a wire request.
    pub fn validate(r: wire::Request) -> Result<Request, Invalid> {
        use wire::request::Kind as W;
        let Some(kind) = r.kind else {
            return Err(Invalid(
                "an empty request (a newer client? restart bcd and bcd-helper after replacing the binary)"
                    .into(),
            ));
        };
        Ok(match kind {
            W::WriteCdiSpec(m) => Request::WriteCdiSpec(Box::new(CdiSpec::parse(m.json)?)),
            W::RemoveCdiSpec(_) => Request::RemoveCdiSpec,
            W::WriteEnvFile(m) => Request::WriteEnvFile(EnvFile::parse(m)?),
            W::RemoveEnvFile(m) => Request::RemoveEnvFile(AllocationId::parse(&m.allocation_id)?),
            W::WriteSshd(m) => Request::WriteSshd(SshdFiles::parse(m)?),
            W::ApplyFirewall(m) => Request::ApplyFirewall(validate::check_firewall(&m.rules)?),
            W::DeleteFirewall(_) => Request::DeleteFirewall,
            W::ResetGpu(m) => Request::ResetGpu(PciAddress::parse(&m.pci_address)?),
            W::Reboot(m) => {
                validate::check_reason(&m.reason)?;
                Request::Reboot { reason: m.reason }
            }
            W::Kexec(m) => Request::Kexec(Kexec::parse(m)?),
            W::InstallSlot(m) => Request::InstallSlot {
                slot: validate::Slot::parse(m.slot)?,
                file: StagedFile::parse(&m.file)?,
                sha256: Sha256::parse("the release binary", &m.sha256)?,
            },
            W::SwitchSlot(m) => Request::SwitchSlot {
                slot: validate::Slot::parse(m.slot)?,
                sha256: Sha256::parse("the slot's binary", &m.sha256)?,
            },
            W::RollBack(_) => Request::RollBack,
            W::RestartDaemon(_) => Request::RestartDaemon,
            W::TpmCommand(m) => Request::Tpm(TpmCommand::parse(m.command)?),
            W::WriteSecret(m) => {
                let path = SecretPath::parse(&m.allocation_id, &m.file)?;
                let value = SecretValue::parse(&path, m.value)?;
                Request::WriteSecret { path, value }
            }
            W::RetainSecrets(m) => Request::RetainSecrets(validate::check_secret_files(&m.keep)?),
        })
    }

    pub fn kind(&self) -> Kind {
        match self {
            Request::WriteCdiSpec(_) => Kind::WriteCdiSpec,
            Request::RemoveCdiSpec => Kind::RemoveCdiSpec,
            Request::WriteEnvFile(_) => Kind::WriteEnvFile,
            Request::RemoveEnvFile(_) => Kind::RemoveEnvFile,
            Request::WriteSshd(_) => Kind::WriteSshd,
            Request::ApplyFirewall(_) => Kind::ApplyFirewall,
            Request::DeleteFirewall => Kind::DeleteFirewall,
            Request::ResetGpu(_) => Kind::ResetGpu,
            Request::Reboot { .. } => Kind::Reboot,
            Request::Kexec(_) => Kind::Kexec,
            Request::InstallSlot { .. } => Kind::InstallSlot,
            Request::SwitchSlot { .. } => Kind::SwitchSlot,
            Request::RollBack => Kind::RollBack,
            Request::RestartDaemon => Kind::RestartDaemon,
            Request::Tpm(_) => Kind::Tpm,
            Request::WriteSecret { .. } => Kind::WriteSecret,
            Request::RetainSecrets(_) => Kind::RetainSecrets,
        }
    }

    /// The wire form; validating it gives this request back.
    pub fn to_wire(&self) -> wire::Request {
        use wire::request::Kind as W;
        let kind = match self {
            Request::WriteCdiSpec(s) => W::WriteCdiSpec(wire::WriteCdiSpec {
                json: s.json().to_vec(),
            }),
            Request::RemoveCdiSpec => W::RemoveCdiSpec(wire::RemoveCdiSpec {}),
            Request::WriteEnvFile(e) => W::WriteEnvFile(e.to_wire()),
            Request::RemoveEnvFile(a) => W::RemoveEnvFile(wire::RemoveEnvFile {
                allocation_id: a.as_str().to_string(),
            }),
            Request::WriteSshd(s) => W::WriteSshd(s.to_wire()),
            Request::ApplyFirewall(rules) => W::ApplyFirewall(wire::ApplyFirewall {
                rules: rules.iter().map(FirewallRule::to_wire).collect(),
            }),
            Request::DeleteFirewall => W::DeleteFirewall(wire::DeleteFirewall {}),
            Request::ResetGpu(a) => W::ResetGpu(wire::ResetGpu {
                pci_address: a.as_str().to_string(),
            }),
            Request::Reboot { reason } => W::Reboot(wire::Reboot {
                reason: reason.clone(),
            }),
            Request::Kexec(k) => W::Kexec(k.to_wire()),
            Request::InstallSlot { slot, file, sha256 } => W::InstallSlot(wire::InstallSlot {
                slot: slot.to_wire(),
                file: file.as_str().to_string(),
                sha256: sha256.0.to_vec(),
            }),
            Request::SwitchSlot { slot, sha256 } => W::SwitchSlot(wire::SwitchSlot {
                slot: slot.to_wire(),
                sha256: sha256.0.to_vec(),
            }),
            Request::RollBack => W::RollBack(wire::RollBack {}),
            Request::RestartDaemon => W::RestartDaemon(wire::RestartDaemon {}),
            Request::Tpm(c) => W::TpmCommand(wire::TpmCommand {
                command: c.bytes().to_vec(),
            }),
            Request::WriteSecret { path, value } => W::WriteSecret(wire::WriteSecret {
                allocation_id: path.allocation.as_str().to_string(),
                file: path.file().to_string(),
                value: value.bytes().to_vec(),
            }),
            Request::RetainSecrets(keep) => W::RetainSecrets(wire::RetainSecrets {
                keep: keep.iter().map(SecretPath::to_wire).collect(),
            }),
        };
        wire::Request { kind: Some(kind) }
    }
}

/// A handler's answer to a request it carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Done (reset, reboot, kexec, restart: the act started or finished).
    Done,
    /// Files or the table were made to match; `changed`: something was
    /// written or removed.
    Written { changed: bool },
    /// The TPM's whole response.
    Tpm(Vec<u8>),
    /// The outcome of a roll-back, with a line for the operator.
    RolledBack { swapped: bool, message: String },
}

impl Reply {
    pub fn shape(&self) -> ReplyShape {
        match self {
            Reply::Done => ReplyShape::Done,
            Reply::Written { .. } => ReplyShape::Written,
            Reply::Tpm(_) => ReplyShape::Tpm,
            Reply::RolledBack { .. } => ReplyShape::RolledBack,
        }
    }

    pub(crate) fn to_wire(&self) -> wire::Response {
        use wire::response::Result as W;
        let result = match self {
            Reply::Done => W::Done(wire::Done {}),
            Reply::Written { changed } => W::Written(wire::Written { changed: *changed }),
            Reply::Tpm(r) => W::TpmResponse(wire::TpmResponse {
                response: r.clone(),
            }),
            Reply::RolledBack { swapped, message } => W::RolledBack(wire::RolledBack {
                swapped: *swapped,
                message: message.clone(),
            }),
        };
        wire::Response {
            result: Some(result),
        }
    }
}

/// A request frame's body, decoded and validated: what the server does
/// with every frame after the handshake.
pub fn decode(body: &[u8]) -> Result<Request, Invalid> {
    let wire: wire::Request =
        prost::Message::decode(body).map_err(|e| Invalid(format!("not a helper request ({e})")))?;
    Request::validate(wire)
}
