//! Which backend talks to a TPM, and opening one: [`TpmAt`] is what an
//! operator names (`--tpm` and `--tpm-backend` of `bcd`), and
//! [`TpmAt::open`] gives the [`Tpm`] the agent uses.
//!
//! The pure-Rust backend reaches every [`Endpoint`]. The tss-esapi
//! backend is only in builds with the `tss` feature (the glibc flavour;
//! the static musl `bcd` has no C) and reaches a device or swtpm through
//! tpm2-tss's TCTIs; it cannot reach a TPM through `bcd helper`, which
//! relays single commands over its own protocol, for which tpm2-tss has no
//! TCTI.

use std::fmt;

use crate::Tpm;
use crate::error::Error;
use crate::protocol::ProtocolTpm;
use crate::transport::Endpoint;

/// A TPM backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// [`ProtocolTpm`]: pure Rust over `tpm2-protocol`, in every build.
    #[default]
    Protocol,
    /// `TssTpm`: the C TPM software stack through `tss-esapi`, in builds
    /// with the `tss` feature.
    Tss,
}

impl Backend {
    /// Every backend, by the name an operator gives it.
    pub const ALL: [Backend; 2] = [Backend::Protocol, Backend::Tss];

    /// The name an operator gives (`--tpm-backend`).
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Protocol => "protocol",
            Backend::Tss => "tss",
        }
    }

    /// The library behind it, as [`Tpm::backend`] names it.
    pub fn library(self) -> &'static str {
        match self {
            Backend::Protocol => "tpm2-protocol",
            Backend::Tss => "tss-esapi",
        }
    }

    /// Whether this build has the backend.
    pub fn is_built(self) -> bool {
        match self {
            Backend::Protocol => true,
            Backend::Tss => cfg!(feature = "tss"),
        }
    }

    /// The backends this build has.
    pub fn built() -> Vec<Backend> {
        Self::ALL.into_iter().filter(|b| b.is_built()).collect()
    }

    /// Whether this backend can open `endpoint` in this build: an
    /// [`Error::Unsupported`] that says what to use instead when it cannot.
    pub fn check(self, endpoint: &Endpoint) -> Result<(), Error> {
        match self {
            Backend::Protocol => Ok(()),
            Backend::Tss if !self.is_built() => Err(Error::Unsupported(
                "this bcd was built without the tss-esapi TPM backend (cargo feature `tss`, \
                 glibc builds only; the static bcd has no C): use --tpm-backend protocol, or a \
                 bcd built with --features tss"
                    .into(),
            )),
            Backend::Tss => match endpoint {
                Endpoint::Device(_) | Endpoint::Tcp(_) => Ok(()),
                #[cfg(feature = "helper")]
                Endpoint::Helper(_) => Err(Error::Unsupported(
                    "the tss-esapi TPM backend cannot reach the TPM through bcd helper (the \
                     helper relays single TPM commands, for which tpm2-tss has no TCTI): an \
                     unprivileged bcd node uses --tpm-backend protocol"
                        .into(),
                )),
            },
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| format!("no TPM backend {s:?}: use protocol or tss"))
    }
}

/// The tpm2-tss TCTI that reaches `endpoint`, where one does.
pub fn tcti(endpoint: &Endpoint) -> Option<String> {
    match endpoint {
        Endpoint::Device(path) => Some(format!("device:{}", path.display())),
        Endpoint::Tcp(addr) => Some(format!("swtpm:host={},port={}", addr.ip(), addr.port())),
        #[cfg(feature = "helper")]
        Endpoint::Helper(_) => None,
    }
}

/// A TPM and the backend that talks to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmAt {
    pub backend: Backend,
    pub endpoint: Endpoint,
}

impl TpmAt {
    /// The TPM at `endpoint` through the pure-Rust backend.
    pub fn protocol(endpoint: Endpoint) -> Self {
        TpmAt {
            backend: Backend::Protocol,
            endpoint,
        }
    }

    /// Opens the TPM. [`Error::Unsupported`] when the backend is not in
    /// this build or cannot reach the endpoint (see [`Backend::check`]).
    pub fn open(&self) -> Result<Box<dyn Tpm>, Error> {
        self.backend.check(&self.endpoint)?;
        match self.backend {
            Backend::Protocol => Ok(Box::new(ProtocolTpm::open(self.endpoint.clone())?)),
            Backend::Tss => self.open_tss(),
        }
    }

    #[cfg(feature = "tss")]
    fn open_tss(&self) -> Result<Box<dyn Tpm>, Error> {
        let tcti = tcti(&self.endpoint).ok_or_else(|| {
            Error::Unsupported(format!("no tpm2-tss TCTI reaches {}", self.endpoint))
        })?;
        Ok(Box::new(crate::tss::TssTpm::open(&tcti)?))
    }

    #[cfg(not(feature = "tss"))]
    fn open_tss(&self) -> Result<Box<dyn Tpm>, Error> {
        // Backend::check refused it above.
        Err(Error::Unsupported(
            "this bcd was built without the tss-esapi TPM backend".into(),
        ))
    }
}

/// Where the TPM is (what `--tpm` named); errors of the tss-esapi backend
/// name its TCTI besides.
impl fmt::Display for TpmAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_by_their_names() {
        for b in Backend::ALL {
            assert_eq!(b.as_str().parse::<Backend>(), Ok(b));
        }
        let err = "tpm2-tss".parse::<Backend>().unwrap_err();
        assert!(err.contains("use protocol or tss"), "{err}");
        assert_eq!(Backend::default(), Backend::Protocol);
    }

    #[test]
    fn tctis_name_the_device_or_the_swtpm_socket() {
        assert_eq!(
            tcti(&Endpoint::Device("/dev/tpmrm0".into())).as_deref(),
            Some("device:/dev/tpmrm0")
        );
        assert_eq!(
            tcti(&Endpoint::Tcp("127.0.0.1:2321".parse().unwrap())).as_deref(),
            Some("swtpm:host=127.0.0.1,port=2321")
        );
    }

    #[test]
    fn the_protocol_backend_reaches_every_endpoint() {
        assert!(Backend::Protocol.is_built());
        assert!(
            Backend::Protocol
                .check(&Endpoint::Device("/dev/tpmrm0".into()))
                .is_ok()
        );
    }

    #[test]
    fn the_tss_backend_is_there_with_its_feature_only() {
        let device = Endpoint::Device("/dev/tpmrm0".into());
        assert_eq!(Backend::Tss.is_built(), cfg!(feature = "tss"));
        let checked = Backend::Tss.check(&device);
        assert_eq!(checked.is_ok(), cfg!(feature = "tss"), "{checked:?}");
        if let Err(e) = checked {
            let text = e.to_string();
            assert!(
                text.contains("feature `tss`") && text.contains("--tpm-backend protocol"),
                "{text}"
            );
        }
        // A missing device: the open fails either way, never silently
        // through the other backend.
        let dir = tempfile::tempdir().unwrap();
        let missing = TpmAt {
            backend: Backend::Tss,
            endpoint: Endpoint::Device(dir.path().join("tpmrm0")),
        };
        let err = missing.open().err().expect("nothing to open");
        if cfg!(feature = "tss") {
            assert!(!matches!(err, Error::Unsupported(_)), "{err}");
        } else {
            assert!(matches!(err, Error::Unsupported(_)), "{err}");
        }
    }

    #[cfg(feature = "helper")]
    #[test]
    fn the_tss_backend_does_not_go_through_the_helper() {
        let helper = Endpoint::Helper("/run/bcd/helper.sock".into());
        assert!(Backend::Protocol.check(&helper).is_ok());
        let err = Backend::Tss.check(&helper).unwrap_err().to_string();
        if cfg!(feature = "tss") {
            assert!(
                err.contains("through bcd helper") && err.contains("--tpm-backend protocol"),
                "{err}"
            );
        }
        assert_eq!(tcti(&helper), None);
    }
}
