//! What a node reads from an X.509 certificate, through the same webpki
//! that rustls verifies with (its DER reader is linked already): the URIs
//! of the subject alternative name and the SubjectPublicKeyInfo. Nothing
//! here verifies a signature or a validity; it reads fields.

use rustls_pki_types::CertificateDer;

/// The URIs in the certificate's subject alternative name, in order; none
/// when the bytes are not a certificate.
pub fn san_uris(der: &[u8]) -> Vec<String> {
    let der = CertificateDer::from(der);
    match webpki::EndEntityCert::try_from(&der) {
        Ok(cert) => cert.valid_uri_names().map(str::to_string).collect(),
        Err(_) => Vec::new(),
    }
}

/// The first SAN URI that starts with `prefix`, without the prefix.
pub fn san_uri_after(der: &[u8], prefix: &str) -> Option<String> {
    san_uris(der)
        .into_iter()
        .find_map(|u| u.strip_prefix(prefix).map(str::to_string))
}

/// The certificate's SubjectPublicKeyInfo (DER, with its SEQUENCE header).
pub fn spki(der: &[u8]) -> Option<Vec<u8>> {
    let der = CertificateDer::from(der);
    let cert = webpki::EndEntityCert::try_from(&der).ok()?;
    Some(cert.subject_public_key_info().as_ref().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever bytes come in, the readers answer without a panic.
        #[test]
        fn any_bytes_read_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = san_uris(&bytes);
            let _ = spki(&bytes);
        }
    }
}
