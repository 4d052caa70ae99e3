//! What TPM2_Certify and TPM2_Sign produce: TPMS_ATTEST (the signed
//! statement) and TPMT_SIGNATURE, with parsers for the copies a peer sends.

use std::fmt;

use crate::public::{Name, alg};
use crate::wire::{Malformed, Put, Reader, hex};

/// TPM_GENERATED_VALUE: every TPMS_ATTEST the TPM signs starts with it.
pub const TPM_GENERATED: u32 = 0xff54_4347;
/// TPM_ST_ATTEST_CERTIFY.
pub const ST_ATTEST_CERTIFY: u16 = 0x8017;

/// A parsed TPMS_ATTEST of TPM2_Certify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertifyInfo {
    /// The qualified name of the signing key (the AK).
    pub qualified_signer: Vec<u8>,
    /// The caller's qualifying data (the server's nonce).
    pub extra_data: Vec<u8>,
    pub clock: u64,
    pub reset_count: u32,
    pub restart_count: u32,
    pub safe: bool,
    pub firmware_version: u64,
    /// The name of the certified object (the node key).
    pub name: Name,
    pub qualified_name: Vec<u8>,
}

impl CertifyInfo {
    /// Parses the TPMS_ATTEST bytes of a certification.
    pub fn parse(bytes: &[u8]) -> Result<Self, Malformed> {
        let mut r = Reader::new("TPMS_ATTEST", bytes);
        let magic = r.u32()?;
        if magic != TPM_GENERATED {
            return Err(Malformed {
                what: "TPMS_ATTEST",
                offset: 0,
                reason: format!("magic {magic:#010x} is not TPM_GENERATED_VALUE"),
            });
        }
        let kind = r.u16()?;
        if kind != ST_ATTEST_CERTIFY {
            return Err(Malformed {
                what: "TPMS_ATTEST",
                offset: 4,
                reason: format!("type {kind:#06x} is not TPM_ST_ATTEST_CERTIFY"),
            });
        }
        let qualified_signer = r.tpm2b(66)?.to_vec();
        let extra_data = r.tpm2b(64)?.to_vec();
        let clock = r.u64()?;
        let reset_count = r.u32()?;
        let restart_count = r.u32()?;
        let safe = match r.u8()? {
            0 => false,
            1 => true,
            other => return Err(r.error(format!("TPMI_YES_NO {other} is neither 0 nor 1"))),
        };
        let firmware_version = r.u64()?;
        let name = Name::from_bytes(r.tpm2b(66)?.to_vec());
        let qualified_name = r.tpm2b(66)?.to_vec();
        r.finish()?;
        Ok(CertifyInfo {
            qualified_signer,
            extra_data,
            clock,
            reset_count,
            restart_count,
            safe,
            firmware_version,
            name,
            qualified_name,
        })
    }
}

/// An ECDSA signature from the TPM: r and s, each 32 bytes, big-endian.
#[derive(Clone, PartialEq, Eq)]
pub struct EcdsaSignature {
    pub r: [u8; 32],
    pub s: [u8; 32],
}

impl fmt::Debug for EcdsaSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EcdsaSignature({}{})", hex(&self.r), hex(&self.s))
    }
}

fn left_pad_32(what: &'static str, v: &[u8]) -> Result<[u8; 32], Malformed> {
    let v = &v[v.iter().take_while(|b| **b == 0).count()..];
    if v.len() > 32 {
        return Err(Malformed {
            what,
            offset: 0,
            reason: format!("a P-256 scalar of {} bytes", v.len()),
        });
    }
    let mut out = [0u8; 32];
    out[32 - v.len()..].copy_from_slice(v);
    Ok(out)
}

impl EcdsaSignature {
    /// Parses a TPMT_SIGNATURE that must be ECDSA with SHA-256.
    pub fn from_tpmt(bytes: &[u8]) -> Result<Self, Malformed> {
        let mut r = Reader::new("TPMT_SIGNATURE", bytes);
        let sig_alg = r.u16()?;
        if sig_alg != alg::ECDSA {
            return Err(r.error(format!("signature algorithm {sig_alg:#06x} is not ECDSA")));
        }
        let hash = r.u16()?;
        if hash != alg::SHA256 {
            return Err(r.error(format!("hash {hash:#06x} is not SHA-256")));
        }
        let sr = r.tpm2b(128)?;
        let ss = r.tpm2b(128)?;
        r.finish()?;
        Ok(EcdsaSignature {
            r: left_pad_32("TPMT_SIGNATURE", sr)?,
            s: left_pad_32("TPMT_SIGNATURE", ss)?,
        })
    }

    /// The TPMT_SIGNATURE bytes.
    pub fn to_tpmt(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(72);
        out.put_u16(alg::ECDSA);
        out.put_u16(alg::SHA256);
        out.put_tpm2b(&self.r);
        out.put_tpm2b(&self.s);
        out
    }

    /// r || s, as ring's `ECDSA_P256_SHA256_FIXED` verifies it.
    pub fn to_fixed(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        out[..32].copy_from_slice(&self.r);
        out[32..].copy_from_slice(&self.s);
        out
    }

    /// The DER `Ecdsa-Sig-Value` (SEQUENCE of two INTEGERs), as TLS and
    /// X.509 carry it.
    pub fn to_der(&self) -> Vec<u8> {
        fn int(v: &[u8; 32]) -> Vec<u8> {
            let skip = v.iter().take_while(|b| **b == 0).count().min(31);
            let v = &v[skip..];
            let mut out = vec![0x02, 0];
            if v[0] & 0x80 != 0 {
                out.push(0);
            }
            out.extend_from_slice(v);
            out[1] = (out.len() - 2) as u8;
            out
        }
        let mut body = int(&self.r);
        body.extend(int(&self.s));
        let mut out = vec![0x30, body.len() as u8];
        out.extend(body);
        out
    }
}

/// What TPM2_Certify returns: the attestation (TPMS_ATTEST bytes, the
/// signed data) and the AK's signature over it (TPMT_SIGNATURE bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct Certification {
    pub attest: Vec<u8>,
    pub signature: Vec<u8>,
}

impl fmt::Debug for Certification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certification")
            .field("attest", &hex(&self.attest))
            .field("signature", &hex(&self.signature))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_attest(extra: &[u8], name: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.put_u32(TPM_GENERATED);
        a.put_u16(ST_ATTEST_CERTIFY);
        a.put_tpm2b(&[0x00, 0x0b, 1, 2, 3]);
        a.put_tpm2b(extra);
        a.extend_from_slice(&42u64.to_be_bytes());
        a.put_u32(1);
        a.put_u32(2);
        a.push(1);
        a.extend_from_slice(&7u64.to_be_bytes());
        a.put_tpm2b(name);
        a.put_tpm2b(&[0x00, 0x0b, 9]);
        a
    }

    #[test]
    fn certify_info_parses() {
        let a = sample_attest(b"nonce", &[0x00, 0x0b, 5, 6]);
        let info = CertifyInfo::parse(&a).unwrap();
        assert_eq!(info.extra_data, b"nonce");
        assert_eq!(info.name.as_bytes(), &[0x00, 0x0b, 5, 6]);
        assert_eq!(info.clock, 42);
        assert!(info.safe);
        assert_eq!(info.firmware_version, 7);

        let mut quote = a.clone();
        quote[5] = 0x18;
        let err = CertifyInfo::parse(&quote).unwrap_err();
        assert!(err.reason.contains("not TPM_ST_ATTEST_CERTIFY"), "{err}");
        let mut forged = a.clone();
        forged[0] = 0;
        assert!(CertifyInfo::parse(&forged).is_err());
        let mut long = a;
        long.push(0);
        assert!(CertifyInfo::parse(&long).is_err());
    }

    #[test]
    fn signatures_convert() {
        let mut r = [0u8; 32];
        r[0] = 0x80;
        r[31] = 1;
        let mut s = [0u8; 32];
        s[31] = 5;
        let sig = EcdsaSignature { r, s };
        let tpmt = sig.to_tpmt();
        assert_eq!(EcdsaSignature::from_tpmt(&tpmt).unwrap(), sig);
        let der = sig.to_der();
        assert_eq!(der[0], 0x30);
        assert_eq!(usize::from(der[1]), der.len() - 2);
        assert_eq!(&der[2..5], &[0x02, 33, 0x00], "a high bit gets a zero byte");
        assert_eq!(&der[der.len() - 3..], &[0x02, 1, 5], "leading zeros go");
        // A TPM may strip leading zeros from r or s.
        let mut short = Vec::new();
        short.put_u16(alg::ECDSA);
        short.put_u16(alg::SHA256);
        short.put_tpm2b(&[1]);
        short.put_tpm2b(&[2, 3]);
        let parsed = EcdsaSignature::from_tpmt(&short).unwrap();
        assert_eq!(parsed.r[31], 1);
        assert_eq!(&parsed.s[30..], &[2, 3]);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = CertifyInfo::parse(&bytes);
            let _ = EcdsaSignature::from_tpmt(&bytes);
        }

        #[test]
        fn certify_infos_round_trip(
            extra in proptest::collection::vec(any::<u8>(), 0..=64),
            name in proptest::collection::vec(any::<u8>(), 0..=66),
            cut in any::<prop::sample::Index>(),
        ) {
            let a = sample_attest(&extra, &name);
            let info = CertifyInfo::parse(&a).unwrap();
            prop_assert_eq!(&info.extra_data, &extra);
            prop_assert_eq!(info.name.as_bytes(), &name[..]);
            let len = cut.index(a.len());
            prop_assert!(CertifyInfo::parse(&a[..len]).is_err());
        }

        #[test]
        fn der_signatures_are_well_formed(r in any::<[u8; 32]>(), s in any::<[u8; 32]>()) {
            let der = EcdsaSignature { r, s }.to_der();
            prop_assert_eq!(usize::from(der[1]), der.len() - 2);
            prop_assert!(der.len() <= 72);
        }
    }
}
