//! The errors of both backends, one taxonomy: the TPM cannot be reached,
//! the TPM answered with an error code, the TPM answered something that does
//! not parse, and the identity checks (another AK, a node key the record no
//! longer derives).

use std::fmt;

use crate::public::Name;
use crate::wire::Malformed;

/// A TPM response code (TPM_RC), as the TPM sent it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResponseCode(pub u32);

/// TPM_RC_HANDLE, format one, without the handle number.
const RC_HANDLE: u32 = 0x08b;
const RC_FMT1: u32 = 0x080;

impl ResponseCode {
    /// The error number without the handle, session or parameter index of a
    /// format-one code (so TPM_RC_HANDLE of any handle compares equal).
    pub fn base(self) -> u32 {
        if self.0 & RC_FMT1 != 0 {
            self.0 & 0xbf
        } else {
            self.0
        }
    }

    /// TPM_RC_HANDLE: the handle (an object, an NV index) does not exist.
    pub fn is_handle(self) -> bool {
        self.base() == RC_HANDLE
    }

    /// A warning the TPM expects the caller to retry (TPM_RC_RETRY,
    /// TPM_RC_YIELDED, TPM_RC_TESTING, TPM_RC_NV_RATE, out of memory for
    /// objects or sessions).
    pub fn is_transient(self) -> bool {
        matches!(
            self.0,
            0x902 | 0x903 | 0x904 | 0x908 | 0x90a | 0x920 | 0x922 | 0x923
        )
    }

    /// A reference to a handle or session the TPM no longer holds.
    pub fn is_stale_reference(self) -> bool {
        (0x910..=0x91e).contains(&self.0) || self.is_handle()
    }
}

impl fmt::Display for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match tpm2_protocol::data::TpmRc::try_from(self.0) {
            Ok(rc) => write!(f, "{rc} ({:#x})", self.0),
            Err(_) => write!(f, "TPM_RC {:#x}", self.0),
        }
    }
}

impl fmt::Debug for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResponseCode({self})")
    }
}

/// An error of a TPM operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The TPM cannot be reached: no device, a closed or refused socket, a
    /// transport error. Retrying later can help.
    #[error("the TPM at {device} cannot be reached")]
    Unreachable {
        device: String,
        #[source]
        source: std::io::Error,
    },
    /// The TPM answered the command with an error code.
    #[error("the TPM refused {command}: {rc}")]
    Tpm {
        command: &'static str,
        rc: ResponseCode,
    },
    /// The TPM's answer does not parse, or is not what was asked for.
    #[error("the TPM's answer to {command} is malformed")]
    Malformed {
        command: &'static str,
        #[source]
        source: Malformed,
    },
    /// The TPM software stack failed outside the TPM (tss backend).
    #[error("the TPM software stack failed in {command}: {detail}")]
    Stack {
        command: &'static str,
        detail: String,
    },
    /// Input this crate cannot use (a credential over the EK's limit, an
    /// unsupported key type).
    #[error("{0}")]
    Invalid(String),
    /// The backend asked for is not in this build, or cannot reach the
    /// endpoint asked for (see `Backend::check`): the text says what to
    /// use instead. Retrying cannot help.
    #[error("{0}")]
    Unsupported(String),
    /// This TPM derives another attestation key than the expected one
    /// (another TPM, or its endorsement seed changed). Retrying cannot help.
    #[error("this TPM's attestation key {actual} is not the expected {expected}")]
    AkMismatch { expected: Name, actual: Name },
    /// The node key record derives another key than the expected one (the
    /// owner seed changed: TPM2_Clear). Retrying cannot help.
    #[error("the TPM derives another key from the node key record (was the TPM cleared?)")]
    NodeKeyMismatch,
}

impl Error {
    /// Whether a later retry can succeed (the TPM was unreachable or busy);
    /// false where the TPM or its identity must change first.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unreachable { .. } => true,
            Error::Tpm { rc, .. } => rc.is_transient(),
            _ => false,
        }
    }

    /// Whether the TPM could not be reached at all.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable { .. })
    }

    pub(crate) fn malformed(command: &'static str, source: Malformed) -> Self {
        Error::Malformed { command, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_codes_decode() {
        let h = ResponseCode(0x18b);
        assert!(h.is_handle(), "TPM_RC_HANDLE of handle 1");
        assert!(ResponseCode(0x08b).is_handle());
        assert_eq!(h.to_string(), "[TPM_RC_HANDLE, handle[1]] (0x18b)");
        assert_eq!(
            ResponseCode(0x9a2).to_string().split(' ').next(),
            Some("[TPM_RC_BAD_AUTH,")
        );
        assert_eq!(
            ResponseCode(0x902).to_string(),
            "TPM_RC_OBJECT_MEMORY (0x902)"
        );
        assert!(ResponseCode(0x922).is_transient());
        assert!(!ResponseCode(0x9a2).is_transient());
        assert_eq!(ResponseCode(0x1234_5678).to_string(), "TPM_RC 0x12345678");
        let integrity = ResponseCode(0x09f | 0x100 | 0x40);
        assert_eq!(integrity.base(), 0x09f);
    }

    #[test]
    fn retry_follows_the_kind_of_failure() {
        let unreachable = Error::Unreachable {
            device: "/dev/tpmrm0".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert!(unreachable.is_retryable());
        assert!(unreachable.is_unreachable());
        assert!(!Error::NodeKeyMismatch.is_retryable());
        let ak = Error::AkMismatch {
            expected: Name::from_bytes(vec![0, 0xb, 1]),
            actual: Name::from_bytes(vec![0, 0xb, 2]),
        };
        assert!(!ak.is_retryable());
        assert_eq!(
            ak.to_string(),
            "this TPM's attestation key 000b02 is not the expected 000b01"
        );
    }
}
