//! What the helper answers when it does not do what was asked.

use crate::wire;

/// Why a request did not succeed, as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is not valid: sending it again cannot help.
    Invalid,
    /// The act failed on this machine; a later attempt may succeed.
    Failed,
    /// What the act needs is not here (no TPM, no `nft`, no systemd).
    Unavailable,
    /// The act did not finish within the helper's request timeout.
    Timeout,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Invalid => "invalid",
            ErrorKind::Failed => "failed",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
        }
    }

    pub(crate) fn to_wire(self) -> wire::ErrorKind {
        match self {
            ErrorKind::Invalid => wire::ErrorKind::Invalid,
            ErrorKind::Failed => wire::ErrorKind::Failed,
            ErrorKind::Unavailable => wire::ErrorKind::Unavailable,
            ErrorKind::Timeout => wire::ErrorKind::Timeout,
        }
    }

    /// An unknown or unspecified kind reads as `Failed`: the client treats
    /// it as a failure worth retrying, never as success.
    pub(crate) fn from_wire(v: i32) -> ErrorKind {
        match wire::ErrorKind::try_from(v) {
            Ok(wire::ErrorKind::Invalid) => ErrorKind::Invalid,
            Ok(wire::ErrorKind::Unavailable) => ErrorKind::Unavailable,
            Ok(wire::ErrorKind::Timeout) => ErrorKind::Timeout,
            _ => ErrorKind::Failed,
        }
    }
}

/// A handler's (or the server's) refusal or failure: a kind and a message
/// worded for the operator, saying what to do next where there is
/// something to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HelperError {
    pub kind: ErrorKind,
    pub message: String,
}

impl HelperError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> HelperError {
        HelperError {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> HelperError {
        HelperError::new(ErrorKind::Invalid, message)
    }

    pub fn failed(message: impl Into<String>) -> HelperError {
        HelperError::new(ErrorKind::Failed, message)
    }

    pub fn unavailable(message: impl Into<String>) -> HelperError {
        HelperError::new(ErrorKind::Unavailable, message)
    }

    pub fn timeout(message: impl Into<String>) -> HelperError {
        HelperError::new(ErrorKind::Timeout, message)
    }

    pub(crate) fn to_wire(&self) -> wire::Failure {
        wire::Failure {
            kind: self.kind.to_wire() as i32,
            message: self.message.clone(),
        }
    }

    pub(crate) fn from_wire(f: wire::Failure) -> HelperError {
        HelperError {
            kind: ErrorKind::from_wire(f.kind),
            message: f.message,
        }
    }
}

impl From<crate::validate::Invalid> for HelperError {
    fn from(e: crate::validate::Invalid) -> HelperError {
        HelperError::invalid(e.to_string())
    }
}
