//! The attestation flows against a real software TPM (swtpm), through each
//! backend: the same test bodies run for `tpm2-protocol` and, with the
//! `tss` feature, for `tss-esapi`.

use bcd_tpm::swtpm::{self, Swtpm};
use bcd_tpm::verify::{self, VerifyError};
use bcd_tpm::{EkKind, Error, NodeKeyRecord, ProtocolTpm, PublicArea, Tpm};

type Open = fn(&Swtpm) -> Result<Box<dyn Tpm>, Error>;

fn protocol(s: &Swtpm) -> Result<Box<dyn Tpm>, Error> {
    Ok(Box::new(ProtocolTpm::open(s.endpoint())?))
}

#[cfg(feature = "tss")]
fn tss(s: &Swtpm) -> Result<Box<dyn Tpm>, Error> {
    Ok(Box::new(bcd_tpm::TssTpm::open(&s.tcti())?))
}

fn fresh() -> (tempfile::TempDir, Swtpm) {
    let dir = tempfile::tempdir().unwrap();
    let s = Swtpm::start(dir.path()).unwrap();
    (dir, s)
}

fn manufactured() -> (tempfile::TempDir, Swtpm) {
    let dir = tempfile::tempdir().unwrap();
    swtpm::manufacture(dir.path()).unwrap();
    let s = Swtpm::start(dir.path()).unwrap();
    (dir, s)
}

fn record(n: u8) -> NodeKeyRecord {
    NodeKeyRecord::from_unique([n; 32])
}

/// The whole join: the server makes a credential for the EK and AK, the
/// TPM activates it, the node key is certified by the AK and verified.
fn round_trip(open: Open, s: &Swtpm, kind: EkKind) {
    let mut tpm = open(s).unwrap();
    let ek = tpm.ek_public(kind).unwrap();
    let ak = tpm.ak_public().unwrap();
    verify::check_ak(&ak).unwrap();

    // Server: a credential only this EK's TPM can open, only for this AK.
    let secret = b"a nonce of thirty-two bytes.....";
    let cred = verify::make_credential(&ek, &ak.name(), secret).unwrap();
    let opened = tpm
        .activate_credential(kind, &cred.blob, &cred.secret)
        .unwrap();
    assert_eq!(opened, secret);

    // Node key, certified by the AK over the server's nonce.
    let rec = NodeKeyRecord::generate().unwrap();
    let key = tpm.node_key_public(&rec).unwrap();
    verify::check_node_key(&key).unwrap();
    let cert = tpm.certify(&rec, b"server nonce").unwrap();
    let info = verify::verify_certify(
        &ak,
        &cert.attest,
        &cert.signature,
        &key.name(),
        b"server nonce",
    )
    .unwrap();
    assert_eq!(info.name, key.name());

    // The checks a forged statement meets.
    assert!(matches!(
        verify::verify_certify(
            &ak,
            &cert.attest,
            &cert.signature,
            &key.name(),
            b"other nonce"
        ),
        Err(VerifyError::WrongQualifyingData)
    ));
    let other = tpm.node_key_public(&record(9)).unwrap();
    assert!(matches!(
        verify::verify_certify(
            &ak,
            &cert.attest,
            &cert.signature,
            &other.name(),
            b"server nonce"
        ),
        Err(VerifyError::WrongName { .. })
    ));
    let mut tampered = cert.attest.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert!(matches!(
        verify::verify_certify(
            &ak,
            &tampered,
            &cert.signature,
            &key.name(),
            b"server nonce"
        ),
        Err(VerifyError::BadSignature)
    ));
}

fn round_trip_rsa(open: Open) {
    let (_d, s) = manufactured();
    round_trip(open, &s, EkKind::Rsa2048);
}

fn round_trip_ecc(open: Open) {
    let (_d, s) = fresh();
    round_trip(open, &s, EkKind::EccP256);
}

/// A credential made for another AK name, or for another TPM's EK, does
/// not activate: the TPM answers an integrity or decryption error.
fn foreign_credentials_do_not_activate(open: Open) {
    let (_d, s) = fresh();
    let (_d2, s2) = fresh();
    let (other_ek, other_ak) = {
        let mut t2 = open(&s2).unwrap();
        (
            t2.ek_public(EkKind::EccP256).unwrap(),
            t2.ak_public().unwrap(),
        )
    };
    let mut tpm = open(&s).unwrap();
    let ek = tpm.ek_public(EkKind::EccP256).unwrap();
    let ak = tpm.ak_public().unwrap();
    assert_ne!(ak.name(), other_ak.name(), "another TPM, another AK");

    let for_other_ak = verify::make_credential(&ek, &other_ak.name(), b"secret").unwrap();
    let err = tpm
        .activate_credential(EkKind::EccP256, &for_other_ak.blob, &for_other_ak.secret)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Tpm {
                command: "TPM2_ActivateCredential",
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_retryable());

    let for_other_ek = verify::make_credential(&other_ek, &ak.name(), b"secret").unwrap();
    let err = tpm
        .activate_credential(EkKind::EccP256, &for_other_ek.blob, &for_other_ek.secret)
        .unwrap_err();
    assert!(matches!(err, Error::Tpm { .. }), "{err}");

    // The backend is still usable after the refusals (sessions flushed).
    let cred = verify::make_credential(&ek, &ak.name(), b"secret").unwrap();
    for _ in 0..4 {
        assert_eq!(
            tpm.activate_credential(EkKind::EccP256, &cred.blob, &cred.secret)
                .unwrap(),
            b"secret"
        );
    }
}

/// The node key signs SHA-256 digests; ring verifies them against the
/// public area's key.
fn signatures_verify(open: Open) {
    let (_d, s) = fresh();
    let mut tpm = open(&s).unwrap();
    let rec = record(1);
    let key = tpm.node_key_public(&rec).unwrap();
    let message = b"a TLS 1.3 CertificateVerify";
    let digest = ring::digest::digest(&ring::digest::SHA256, message);
    let sig = tpm.sign(&rec, digest.as_ref().try_into().unwrap()).unwrap();
    assert!(verify::verify_signature(&key, message, &sig.to_der()));
    assert!(!verify::verify_signature(
        &key,
        b"another message",
        &sig.to_der()
    ));
    let other = tpm.node_key_public(&record(2)).unwrap();
    assert!(!verify::verify_signature(&other, message, &sig.to_der()));
    // The SPKI a certificate would carry for it parses in ring as the same key.
    let spki = key.spki_der().unwrap();
    assert_eq!(&spki[spki.len() - 65..], &key.p256_point().unwrap());
}

/// A machine's reboot: the same record derives the same key, the AK and
/// the EK stay.
fn keys_survive_restarts(open: Open) {
    let (_d, mut s) = fresh();
    let (ek, ak, k1, k2) = {
        let mut tpm = open(&s).unwrap();
        (
            tpm.ek_public(EkKind::EccP256).unwrap(),
            tpm.ak_public().unwrap(),
            tpm.node_key_public(&record(1)).unwrap(),
            tpm.node_key_public(&record(2)).unwrap(),
        )
    };
    assert_ne!(k1.name(), k2.name(), "another record, another key");
    s.restart().unwrap();
    let mut tpm = open(&s).unwrap();
    assert_eq!(tpm.ek_public(EkKind::EccP256).unwrap(), ek);
    assert_eq!(tpm.ak_public().unwrap(), ak);
    assert_eq!(tpm.node_key_public(&record(1)).unwrap(), k1);
    let spki = k1.spki_der().unwrap();
    bcd_tpm::check_node_key(tpm.as_mut(), &record(1), &spki).unwrap();
    bcd_tpm::check_ak(tpm.as_mut(), &ak.name()).unwrap();
}

/// TPM2_Clear replaces the owner seed: the AK (endorsement hierarchy)
/// stays, the node key the record derives changes.
fn clear_keeps_the_ak_and_changes_the_node_key(open: Open) {
    let (_d, s) = fresh();
    let rec = record(7);
    let (ak, key) = {
        let mut tpm = open(&s).unwrap();
        (tpm.ak_public().unwrap(), tpm.node_key_public(&rec).unwrap())
    };
    s.clear().unwrap();
    let mut tpm = open(&s).unwrap();
    bcd_tpm::check_ak(tpm.as_mut(), &ak.name()).unwrap();
    let err = bcd_tpm::check_node_key(tpm.as_mut(), &rec, &key.spki_der().unwrap()).unwrap_err();
    assert!(matches!(err, Error::NodeKeyMismatch), "{err}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("was the TPM cleared?"), "{err}");
}

/// Another TPM derives another AK.
fn another_tpm_has_another_ak(open: Open) {
    let (_d, s) = fresh();
    let (_d2, s2) = fresh();
    let ak = open(&s).unwrap().ak_public().unwrap();
    let mut other = open(&s2).unwrap();
    let err = bcd_tpm::check_ak(other.as_mut(), &ak.name()).unwrap_err();
    match &err {
        Error::AkMismatch { expected, actual } => {
            assert_eq!(expected, &ak.name());
            assert_ne!(actual, &ak.name());
        }
        e => panic!("{e}"),
    }
    assert!(!err.is_retryable());
}

/// A stopped TPM is unreachable, retryably; once it answers again, the
/// same backend works without being opened again.
fn a_stopped_tpm_is_unreachable(open: Open) {
    let (_d, mut s) = fresh();
    let mut tpm = open(&s).unwrap();
    let ak = tpm.ak_public().unwrap();
    s.stop();
    let err = tpm.node_key_public(&record(1)).unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(err.is_retryable());
    let err = open(&s).err().expect("opening a stopped TPM fails");
    assert!(err.is_unreachable(), "{err}");
    s.restart().unwrap();
    let mut again = open(&s).unwrap();
    assert_eq!(again.ak_public().unwrap(), ak);
}

/// The EK the backend reports is the TCG template's: the RSA one equals
/// the platform's persisted EK (what swtpm_setup made) and what
/// `tpm2_createek` derives, and the EK certificate holds its key.
fn ek_matches_the_platform(open: Open) {
    let (dir, s) = manufactured();
    let (rsa, ecc, cert, none) = {
        let mut tpm = open(&s).unwrap();
        (
            tpm.ek_public(EkKind::Rsa2048).unwrap(),
            tpm.ek_public(EkKind::EccP256).unwrap(),
            tpm.ek_certificate(EkKind::Rsa2048).unwrap(),
            tpm.ek_certificate(EkKind::EccP256).unwrap(),
        )
    };
    assert!(none.is_none(), "swtpm has no ECC P-256 EK certificate");
    let cert = cert.expect("swtpm_setup wrote an RSA EK certificate");
    let (_, parsed) = x509_parser::parse_x509_certificate(&cert).unwrap();
    assert!(rsa.matches_spki(parsed.tbs_certificate.subject_pki.raw));
    assert!(!ecc.matches_spki(parsed.tbs_certificate.subject_pki.raw));

    for (kind, alg, ours) in [
        (EkKind::Rsa2048, "rsa", &rsa),
        (EkKind::EccP256, "ecc", &ecc),
    ] {
        let out = dir.path().join(format!("ek-{alg}.pub"));
        let ctx = dir.path().join(format!("ek-{alg}.ctx"));
        s.tool(
            "tpm2_createek",
            &[
                "-c",
                ctx.to_str().unwrap(),
                "-G",
                alg,
                "-u",
                out.to_str().unwrap(),
            ],
        )
        .unwrap();
        // swtpm has no resource manager: free the slot the tool left.
        s.tool("tpm2_flushcontext", &["-t"]).unwrap();
        let theirs = PublicArea::from_tpm2b(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(&theirs, ours, "{kind}");
        let name_file = dir.path().join(format!("ek-{alg}.name"));
        if kind == EkKind::Rsa2048 {
            s.tool(
                "tpm2_readpublic",
                &["-c", "0x81010001", "-n", name_file.to_str().unwrap()],
            )
            .unwrap();
            assert_eq!(std::fs::read(&name_file).unwrap(), ours.name().as_bytes());
        }
    }
}

/// The EK chain NV indices: none, then two certificates (one larger than
/// a single NV read) as a manufacturer leaves them, read in order; a chain
/// that does not start at the first index is none.
fn ek_chain_reads_the_consecutive_indices(open: Open) {
    let (_d, s) = manufactured();
    assert_eq!(open(&s).unwrap().ek_chain().unwrap(), Vec::<Vec<u8>>::new());
    let first: Vec<u8> = (0..1500u32).map(|i| (i % 251) as u8).collect();
    let second = b"the certificate above it".to_vec();
    s.define_nv(bcd_tpm::EK_CHAIN_FIRST_INDEX, &first).unwrap();
    s.define_nv(bcd_tpm::EK_CHAIN_FIRST_INDEX + 1, &second)
        .unwrap();
    assert_eq!(open(&s).unwrap().ek_chain().unwrap(), [first, second]);

    let (_d, s) = manufactured();
    s.define_nv(bcd_tpm::EK_CHAIN_FIRST_INDEX + 1, b"orphan")
        .unwrap();
    assert!(open(&s).unwrap().ek_chain().unwrap().is_empty());
}

macro_rules! backend_tests {
    ($backend:ident) => {
        mod $backend {
            #[test]
            fn round_trip_rsa_ek() {
                super::round_trip_rsa(super::$backend);
            }
            #[test]
            fn round_trip_ecc_ek() {
                super::round_trip_ecc(super::$backend);
            }
            #[test]
            fn foreign_credentials_do_not_activate() {
                super::foreign_credentials_do_not_activate(super::$backend);
            }
            #[test]
            fn signatures_verify() {
                super::signatures_verify(super::$backend);
            }
            #[test]
            fn keys_survive_restarts() {
                super::keys_survive_restarts(super::$backend);
            }
            #[test]
            fn clear_keeps_the_ak_and_changes_the_node_key() {
                super::clear_keeps_the_ak_and_changes_the_node_key(super::$backend);
            }
            #[test]
            fn another_tpm_has_another_ak() {
                super::another_tpm_has_another_ak(super::$backend);
            }
            #[test]
            fn a_stopped_tpm_is_unreachable() {
                super::a_stopped_tpm_is_unreachable(super::$backend);
            }
            #[test]
            fn ek_matches_the_platform() {
                super::ek_matches_the_platform(super::$backend);
            }
            #[test]
            fn ek_chain_reads_the_consecutive_indices() {
                super::ek_chain_reads_the_consecutive_indices(super::$backend);
            }
        }
    };
}

backend_tests!(protocol);
#[cfg(feature = "tss")]
backend_tests!(tss);

#[test]
fn a_missing_device_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let err = ProtocolTpm::open(bcd_tpm::Endpoint::Device(dir.path().join("tpmrm0"))).unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(err.to_string().contains("tpmrm0"), "{err}");
}
