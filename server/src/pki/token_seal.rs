//! The join service's seal key: what `bct2` join tokens are sealed to.
//!
//! Nodes seal a token's `<id>.<secret>` to this X25519 key with HPKE
//! (`bcd_proto::seal`, RFC 9180) under the SHA-256 of the CSR it comes
//! with, so a gateway relaying the join can neither read the token nor
//! move it to a request for a key of its own. The key is derived from the
//! fleet CA's private key ([`crate::pki::Ca::token_seal_key`]): every
//! process that holds the CA (a restored backup included) opens the same
//! tokens, and no gateway can.

use hpke::aead::AesGcm128;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, Serializable};

use bcd_proto::seal::{ENC_LEN, INFO, TAG_LEN, aad};

/// The longest sealed token opened: a credential is 49 bytes.
const MAX_SEALED: usize = ENC_LEN + 256 + TAG_LEN;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("the sealed join token is {0} bytes, not a sealed token")]
    Size(usize),
    #[error(
        "the sealed join token does not open: it was sealed for another join service or another \
         CSR, or changed on the way"
    )]
    Sealed,
    #[error("the sealed join token opens to something that is not text")]
    NotText,
}

pub struct TokenSealKey {
    secret: <X25519HkdfSha256 as Kem>::PrivateKey,
    public: [u8; 32],
}

impl std::fmt::Debug for TokenSealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenSealKey({})", hex::encode(self.public))
    }
}

impl TokenSealKey {
    /// The key pair HPKE's DeriveKeyPair makes from `ikm`.
    pub fn derive(ikm: &[u8]) -> TokenSealKey {
        let (secret, public) = X25519HkdfSha256::derive_keypair(ikm);
        let public = public
            .to_bytes()
            .as_slice()
            .try_into()
            .expect("an X25519 public key is 32 bytes");
        TokenSealKey { secret, public }
    }

    /// The public key, as `bct2` tokens carry it.
    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    /// Opens what a node sealed with the CSR `csr_der`: the token's
    /// `<id>.<secret>`.
    pub fn open(&self, sealed: &[u8], csr_der: &[u8]) -> Result<String, OpenError> {
        if !(ENC_LEN + TAG_LEN..=MAX_SEALED).contains(&sealed.len()) {
            return Err(OpenError::Size(sealed.len()));
        }
        let enc = <X25519HkdfSha256 as Kem>::EncappedKey::from_bytes(&sealed[..ENC_LEN])
            .map_err(|_| OpenError::Sealed)?;
        let plain = hpke::single_shot_open::<AesGcm128, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            &self.secret,
            &enc,
            INFO,
            &sealed[ENC_LEN..],
            &aad(csr_der),
        )
        .map_err(|_| OpenError::Sealed)?;
        String::from_utf8(plain).map_err(|_| OpenError::NotText)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A token sealed by an earlier build (`bcd_proto::seal`, format v1) to
    /// the key derived from `GOLDEN_IKM`, under the CSR `b"golden csr"`:
    /// every later build opens it.
    const GOLDEN_IKM: &[u8] = b"better-compute golden seal key v1";
    const GOLDEN_SEALED: &str = include_str!("../../tests/golden/sealed_token_v1.hex");

    #[test]
    fn a_token_sealed_by_the_first_format_still_opens() {
        let key = TokenSealKey::derive(GOLDEN_IKM);
        let sealed = hex::decode(GOLDEN_SEALED.trim()).unwrap();
        if std::env::var_os("BC_UPDATE_GOLDEN").is_some() {
            let fresh = bcd_proto::seal::seal(
                &key.public(),
                b"0123456789abcdef.0123456789abcdef0123456789abcdef",
                &aad(b"golden csr"),
            )
            .unwrap();
            std::fs::write("tests/golden/sealed_token_v1.hex", hex::encode(fresh)).unwrap();
        }
        assert_eq!(
            key.open(&sealed, b"golden csr").unwrap(),
            "0123456789abcdef.0123456789abcdef0123456789abcdef"
        );
        assert_eq!(key.open(&sealed, b"another csr"), Err(OpenError::Sealed));
    }

    #[test]
    fn what_a_node_seals_opens_here_only() {
        let key = TokenSealKey::derive(b"a join service's key material, 32");
        let sealed = bcd_proto::seal::seal(&key.public(), b"id.secret", &aad(b"csr")).unwrap();
        assert_eq!(key.open(&sealed, b"csr").unwrap(), "id.secret");
        let other = TokenSealKey::derive(b"another join service's material!");
        assert_eq!(other.open(&sealed, b"csr"), Err(OpenError::Sealed));
        assert_eq!(key.open(&sealed[..40], b"csr"), Err(OpenError::Size(40)));
        assert_eq!(
            key.open(&vec![0; MAX_SEALED + 1], b"csr"),
            Err(OpenError::Size(MAX_SEALED + 1))
        );
    }

    proptest! {
        /// Whatever a peer sends opens as an error, never a panic.
        #[test]
        fn any_bytes_are_refused_without_panicking(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            csr in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            let key = TokenSealKey::derive(b"a join service's key material, 32");
            prop_assert!(key.open(&bytes, &csr).is_err());
        }
    }
}
