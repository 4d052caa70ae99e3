//! How the store reaches PostgreSQL: TLS that verifies the server, and a
//! password that never sits on a command line.
//!
//! The address takes libpq's own words for TLS, which tokio-postgres does
//! not know past `sslmode=require`: `sslrootcert=CA.pem` turns on TLS
//! (rustls) that checks the server's chain against that CA and its name
//! against the host in the address (`sslmode=verify-full`, the only mode
//! that comes with `sslrootcert`), and `sslcert=` with `sslkey=` present a
//! client certificate. A mode that encrypts without checking the server
//! (`require`, `verify-ca`) is refused, saying how to check it. The
//! password comes from `password_file=PATH` (the file's first line) or
//! `PGPASSWORD`, so it need not be in an address `ps` shows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::StoreError;

/// The TLS client of the store's connections.
pub type Tls = MakeRustlsConnect;

/// The address's TLS and password settings, taken out of it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The address with our settings removed, as tokio-postgres reads it.
    pub url: String,
    pub root_cert: Option<PathBuf>,
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub password_file: Option<PathBuf>,
}

fn bad(message: impl Into<String>) -> StoreError {
    StoreError::Address(message.into())
}

/// Splits the settings this module handles out of `url`. Only the URL
/// form (`postgres://`, `postgresql://`) carries them; a key=value
/// string is passed through as it is.
pub fn settings(url: &str) -> Result<Settings, StoreError> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return Ok(Settings {
            url: url.to_string(),
            ..Settings::default()
        });
    };
    let mut kept = Vec::new();
    let (mut mode, mut root, mut cert, mut key, mut password_file) = (None, None, None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = || {
            percent_decode_str(value)
                .decode_utf8()
                .map(|v| v.into_owned())
                .map_err(|_| bad(format!("the store address's {name} is not UTF-8")))
        };
        match name {
            "sslmode" => mode = Some(decoded()?),
            "sslrootcert" => root = Some(PathBuf::from(decoded()?)),
            "sslcert" => cert = Some(PathBuf::from(decoded()?)),
            "sslkey" => key = Some(PathBuf::from(decoded()?)),
            "password_file" => password_file = Some(PathBuf::from(decoded()?)),
            _ => kept.push(pair),
        }
    }
    match (mode.as_deref(), &root) {
        (None | Some("verify-full"), Some(_)) => kept.push("sslmode=require"),
        (Some(m @ ("disable" | "prefer")), None) => kept.push(if m == "disable" {
            "sslmode=disable"
        } else {
            "sslmode=prefer"
        }),
        (None, None) => {}
        (Some("require" | "verify-ca" | "verify-full"), None) => {
            return Err(bad(
                "the store address asks for TLS without naming the CA that signed the \
                 server's certificate, so the server would not be checked: add \
                 sslrootcert=/PATH/TO/CA.pem (with sslmode=verify-full or no sslmode)",
            ));
        }
        (Some(m), Some(_)) => {
            return Err(bad(format!(
                "the store address's sslmode={m} does not check the server's name: with \
                 sslrootcert use sslmode=verify-full (or leave sslmode out)"
            )));
        }
        (Some(m), None) => {
            return Err(bad(format!(
                "the store address's sslmode={m} is not one of disable, prefer, verify-full"
            )));
        }
    }
    let client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            return Err(bad(
                "the store address names sslcert without sslkey or the other way round: a \
                 client certificate needs both",
            ));
        }
    };
    if client_cert.is_some() && root.is_none() {
        return Err(bad(
            "the store address names a client certificate but no sslrootcert: name the CA \
             that signed the server's certificate too",
        ));
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(Settings {
        url,
        root_cert: root,
        client_cert,
        password_file,
    })
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| {
        bad(format!(
            "cannot read the store's {what} {}: {e}",
            path.display()
        ))
    })
}

/// The TLS client for `settings`, if they ask for TLS: the roots from
/// `sslrootcert` only (never the system's), TLS 1.2 or 1.3 on ring.
pub fn tls(settings: &Settings) -> Result<Option<MakeRustlsConnect>, StoreError> {
    let Some(root) = &settings.root_cert else {
        return Ok(None);
    };
    let pem = read(root, "CA file (sslrootcert)")?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|_| {
            bad(format!(
                "the store's CA file {} is not PEM certificates",
                root.display()
            ))
        })?;
        roots.add(cert).map_err(|e| {
            bad(format!(
                "the store's CA file {} holds a certificate that is not a CA: {e}",
                root.display()
            ))
        })?;
    }
    if roots.is_empty() {
        return Err(bad(format!(
            "the store's CA file {} holds no certificate",
            root.display()
        )));
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| bad(format!("TLS to the store: {e}")))?
    .with_root_certificates(roots);
    let config = match &settings.client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain =
                CertificateDer::pem_slice_iter(&read(cert, "client certificate (sslcert)")?)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| {
                        bad(format!(
                            "the store's client certificate {} is not PEM",
                            cert.display()
                        ))
                    })?;
            let key_der = PrivateKeyDer::from_pem_slice(&read(key, "client key (sslkey)")?)
                .map_err(|_| {
                    bad(format!(
                        "the store's client key {} is not a PEM private key",
                        key.display()
                    ))
                })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| bad(format!("the store's client certificate and key: {e}")))?
        }
    };
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// The password for a connection whose address has none: `password_file`'s
/// first line, else `PGPASSWORD`.
pub fn password(settings: &Settings) -> Result<Option<Vec<u8>>, StoreError> {
    if let Some(path) = &settings.password_file {
        let text = read(path, "password file (password_file)")?;
        let line = text.split(|b| *b == b'\n').next().unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return Err(bad(format!(
                "the store's password file {} is empty",
                path.display()
            )));
        }
        return Ok(Some(line.to_vec()));
    }
    Ok(std::env::var_os("PGPASSWORD").map(|p| {
        use std::os::unix::ffi::OsStrExt;
        p.as_bytes().to_vec()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_words_come_out_of_the_address_and_the_rest_stays() {
        let s = settings(
            "postgres://bc@db.example:5433/fleet?sslrootcert=/etc/bc/ca%20x.pem&\
             application_name=a&sslcert=/c.pem&sslkey=/k.pem&password_file=/run/pw",
        )
        .unwrap();
        assert_eq!(
            s.url,
            "postgres://bc@db.example:5433/fleet?application_name=a&sslmode=require"
        );
        assert_eq!(s.root_cert, Some(PathBuf::from("/etc/bc/ca x.pem")));
        assert_eq!(
            s.client_cert,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        assert_eq!(s.password_file, Some(PathBuf::from("/run/pw")));
        let s = settings("postgres://db/fleet?sslmode=verify-full&sslrootcert=/ca.pem").unwrap();
        assert_eq!(s.url, "postgres://db/fleet?sslmode=require");
        // No settings of ours: the address as it was.
        for url in [
            "postgresql:///postgres?host=/tmp/x&port=5432&user=bc",
            "postgres://db/fleet",
            "host=/tmp user=bc",
        ] {
            assert_eq!(settings(url).unwrap().url, url);
        }
        assert_eq!(
            settings("postgres://db/f?sslmode=disable").unwrap().url,
            "postgres://db/f?sslmode=disable"
        );
    }

    #[test]
    fn tls_that_would_not_check_the_server_is_refused_saying_how() {
        let text = |url: &str| settings(url).unwrap_err().to_string();
        for m in ["require", "verify-ca", "verify-full"] {
            let t = text(&format!("postgres://db/f?sslmode={m}"));
            assert!(t.contains("add sslrootcert="), "{t}");
        }
        let t = text("postgres://db/f?sslmode=verify-ca&sslrootcert=/ca.pem");
        assert!(t.contains("use sslmode=verify-full"), "{t}");
        let t = text("postgres://db/f?sslmode=allow");
        assert!(t.contains("not one of disable, prefer, verify-full"), "{t}");
        let t = text("postgres://db/f?sslrootcert=/ca.pem&sslcert=/c.pem");
        assert!(t.contains("needs both"), "{t}");
        let t = text("postgres://db/f?sslcert=/c.pem&sslkey=/k.pem");
        assert!(t.contains("no sslrootcert"), "{t}");
    }

    #[test]
    fn a_password_comes_from_its_file_without_the_line_end() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("pw");
        std::fs::write(&path, "s3cret\r\nignored\n").unwrap();
        let s = Settings {
            password_file: Some(path.clone()),
            ..Settings::default()
        };
        assert_eq!(password(&s).unwrap(), Some(b"s3cret".to_vec()));
        std::fs::write(&path, "\n").unwrap();
        assert!(password(&s).unwrap_err().to_string().contains("is empty"));
        let missing = Settings {
            password_file: Some(d.path().join("nope")),
            ..Settings::default()
        };
        assert!(
            password(&missing)
                .unwrap_err()
                .to_string()
                .contains("cannot read the store's password file")
        );
    }
}
