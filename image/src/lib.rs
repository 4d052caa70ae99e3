//! Netboot images: a kernel, an initrd that carries `bcd` as its init, a
//! manifest that names both by size and SHA-256 with the kernel command
//! line and the bcd version, signed with an ed25519 image key, and the iPXE
//! script that boots them.
//!
//! This crate chooses what goes into the ramdisk ([`build`]) and owns the
//! manifest format and the scripts; the `initramfs` crate writes the cpio
//! archive, the server (`better-compute images`, the boot endpoint) stores
//! and serves images, and `bcd init` runs inside them. It never touches
//! the network.
//!
//! # Layout of a built image
//!
//! | file | what |
//! |---|---|
//! | `vmlinuz` | the kernel, as shipped |
//! | `initrd.img` | the ramdisk (cpio newc, compressed) |
//! | `manifest.json` | the [`SignedManifest`] |
//! | `boot.ipxe` | an iPXE script that loads the two files beside it (TFTP, or a plain web server) |
//!
//! Building twice from the same inputs gives the same bytes, signature
//! included (ed25519 signatures are deterministic): an image is named by
//! the SHA-256 of its manifest, its [`ImageId`].
#![forbid(unsafe_code)]

pub mod build;
pub mod fetch;
pub mod kernel;

use ring::signature::Ed25519KeyPair;
use serde::{Deserialize, Serialize};

/// The manifest format this crate writes and reads.
pub const FORMAT: u32 = 1;
pub const KERNEL_FILE: &str = "vmlinuz";
pub const INITRD_FILE: &str = "initrd.img";
pub const MANIFEST_FILE: &str = "manifest.json";
pub const IPXE_FILE: &str = "boot.ipxe";

/// One file of an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub file: String,
    pub size: u64,
    pub sha256: String,
}

impl Part {
    pub fn of(file: &str, bytes: &[u8]) -> Part {
        Part {
            file: file.to_string(),
            size: bytes.len() as u64,
            sha256: sha256_hex(bytes),
        }
    }

    /// Checks `bytes` against this part.
    pub fn check(&self, bytes: &[u8]) -> Result<(), ImageError> {
        if bytes.len() as u64 != self.size {
            return Err(ImageError::Size {
                file: self.file.clone(),
                expected: self.size,
                actual: bytes.len() as u64,
            });
        }
        let actual = sha256_hex(bytes);
        if actual != self.sha256 {
            return Err(ImageError::Hash {
                file: self.file.clone(),
                expected: self.sha256.clone(),
                actual,
            });
        }
        Ok(())
    }
}

/// What an image is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// A name for people (`gpu-node`, `gpu-node-debug`).
    pub name: String,
    /// The kernel's release (`uname -r`), from its header.
    pub kernel_version: String,
    /// What `bcd version` of the carried binary says.
    pub bcd_version: String,
    /// The kernel command line the image boots with; the boot endpoint
    /// adds `bcd.image=` and `bcd.mac=`.
    pub cmdline: String,
    pub kernel: Part,
    pub initrd: Part,
    /// The modules the init loads, dependencies included, in order.
    pub modules: Vec<String>,
}

/// The file `images build` writes and `images register` uploads: the
/// manifest's exact bytes (base64) and an ed25519 signature over them, so
/// no JSON canonicalization is involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedManifest {
    pub manifest: String,
    pub key_id: String,
    pub signature: String,
}

/// An image's name on the server: the SHA-256 of its manifest's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ImageId(pub String);

impl std::fmt::Display for ImageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("the signed image manifest is malformed: {0}")]
    Malformed(String),
    #[error(
        "the image is signed by key {0}, which is not an image key of this server: start serve \
         with --image-pubkey for it, or sign with a key it knows"
    )]
    UnknownKey(String),
    #[error("the image manifest's signature does not verify (tampered or forged)")]
    BadSignature,
    #[error("the image manifest has format {0}; this build reads format {FORMAT}")]
    Format(u32),
    #[error("{file} is {actual} bytes; the manifest says {expected}")]
    Size {
        file: String,
        expected: u64,
        actual: u64,
    },
    #[error("{file}'s SHA-256 is {actual}; the manifest says {expected} (corrupt or truncated)")]
    Hash {
        file: String,
        expected: String,
        actual: String,
    },
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// `key_id` of an image public key: 16 hex digits of its SHA-256 (as for
/// release keys).
pub fn key_id(public_key: &[u8]) -> String {
    release::key_id(public_key)
}

/// Signs the way release manifests are signed (`release::SignedManifest`).
pub fn sign(manifest: &Manifest, key: &Ed25519KeyPair) -> SignedManifest {
    SignedManifest::from(release::SignedManifest::seal(manifest, key))
}

impl From<release::SignedManifest> for SignedManifest {
    fn from(s: release::SignedManifest) -> SignedManifest {
        SignedManifest {
            manifest: s.manifest,
            key_id: s.key_id,
            signature: s.signature,
        }
    }
}

fn image_error(e: release::ReleaseError) -> ImageError {
    use release::ReleaseError as R;
    match e {
        R::UnknownKey(k) => ImageError::UnknownKey(k),
        R::BadSignature => ImageError::BadSignature,
        other => ImageError::Malformed(other.to_string()),
    }
}

impl SignedManifest {
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("serializes");
        v.push(b'\n');
        v
    }

    pub fn parse(bytes: &[u8]) -> Result<SignedManifest, ImageError> {
        serde_json::from_slice(bytes).map_err(|e| ImageError::Malformed(e.to_string()))
    }

    fn envelope(&self) -> release::SignedManifest {
        release::SignedManifest {
            manifest: self.manifest.clone(),
            key_id: self.key_id.clone(),
            signature: self.signature.clone(),
        }
    }

    /// The image's id: the SHA-256 of the manifest's bytes.
    pub fn id(&self) -> Result<ImageId, ImageError> {
        let bytes = self.envelope().manifest_bytes().map_err(image_error)?;
        Ok(ImageId(sha256_hex(&bytes)))
    }

    /// Verifies against the image public keys and returns the manifest.
    pub fn verify(&self, keys: &[Vec<u8>]) -> Result<Manifest, ImageError> {
        let m: Manifest = self.envelope().open(keys).map_err(image_error)?;
        if m.format != FORMAT {
            return Err(ImageError::Format(m.format));
        }
        Ok(m)
    }
}

/// Where an iPXE script finds the kernel and initrd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetch<'a> {
    /// By file name, relative to the script (TFTP, or a web folder).
    Beside,
    /// By content hash under an HTTP base: `<base>/<sha256>`.
    Http(&'a str),
}

/// The iPXE script that boots `m`. `extra` is appended to the kernel
/// command line (the boot endpoint adds `bcd.image=`). `${net0/mac}` is
/// left for iPXE to expand: the node learns which MAC booted.
pub fn ipxe_script(m: &Manifest, id: &ImageId, fetch: &Fetch<'_>, extra: &str) -> String {
    let (kernel, initrd) = match fetch {
        Fetch::Beside => (m.kernel.file.clone(), m.initrd.file.clone()),
        Fetch::Http(base) => {
            let base = base.trim_end_matches('/');
            (
                format!("{base}/{}", m.kernel.sha256),
                format!("{base}/{}", m.initrd.sha256),
            )
        }
    };
    let mut cmdline = format!("initrd={INITRD_FILE} {}", m.cmdline);
    cmdline.push_str(&format!(" bcd.image={} bcd.mac=${{net0/mac}}", id.0));
    if !extra.is_empty() {
        cmdline.push(' ');
        cmdline.push_str(extra);
    }
    format!(
        "#!ipxe\n\
         # better-compute image {name} ({short}), kernel {kver}, bcd {bcd}\n\
         echo Booting {name} ({short})\n\
         kernel {kernel} {cmdline}\n\
         initrd --name {INITRD_FILE} {initrd}\n\
         boot\n",
        name = m.name,
        short = &id.0[..id.0.len().min(16)],
        kver = m.kernel_version,
        // One line: a comment that spans two would run its second line.
        bcd = m.bcd_version.lines().next().unwrap_or_default(),
    )
}

/// Reads an ed25519 key file (PKCS#8, as `images keygen` writes it).
pub fn read_key(bytes: &[u8]) -> Result<Ed25519KeyPair, ImageError> {
    Ed25519KeyPair::from_pkcs8(bytes).map_err(|_| {
        ImageError::Malformed(
            "not an ed25519 PKCS#8 key: make one with better-compute images keygen".into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::KeyPair;

    pub(crate) fn key() -> Ed25519KeyPair {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
        Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()
    }

    fn manifest() -> Manifest {
        Manifest {
            format: FORMAT,
            name: "gpu-node".into(),
            kernel_version: "6.1.0-57-cloud-amd64".into(),
            bcd_version: "bcd 0.1.0".into(),
            cmdline: "console=ttyS0 bcd.server=https://10.0.2.100:7443".into(),
            kernel: Part::of(KERNEL_FILE, b"kernel"),
            initrd: Part::of(INITRD_FILE, b"initrd"),
            modules: vec!["virtio_net".into()],
        }
    }

    #[test]
    fn signs_verifies_and_refuses_tampering_and_strangers() {
        let k = key();
        let signed = sign(&manifest(), &k);
        let keys = vec![k.public_key().as_ref().to_vec()];
        assert_eq!(signed.verify(&keys).unwrap(), manifest());
        let parsed = SignedManifest::parse(&signed.to_json()).unwrap();
        assert_eq!(parsed.id().unwrap(), signed.id().unwrap());
        assert_eq!(
            signed.verify(&[key().public_key().as_ref().to_vec()]),
            Err(ImageError::UnknownKey(signed.key_id.clone()))
        );
        let mut other = manifest();
        other.cmdline.push_str(" init=/bin/sh");
        let mut forged = signed.clone();
        forged.manifest = sign(&other, &key()).manifest;
        assert_eq!(forged.verify(&keys), Err(ImageError::BadSignature));
        assert!(matches!(
            SignedManifest::parse(b"{}"),
            Err(ImageError::Malformed(_))
        ));
    }

    #[test]
    fn parts_check_size_and_hash() {
        let p = Part::of("vmlinuz", b"abc");
        p.check(b"abc").unwrap();
        assert!(matches!(p.check(b"ab"), Err(ImageError::Size { .. })));
        assert!(matches!(p.check(b"abd"), Err(ImageError::Hash { .. })));
    }

    #[test]
    fn a_version_of_several_lines_stays_in_the_comment() {
        let mut m = manifest();
        m.bcd_version = "0.1.0\nTPM backends: protocol".into();
        let script = ipxe_script(&m, &ImageId("ab".repeat(32)), &Fetch::Beside, "");
        assert_eq!(script.lines().count(), 6, "{script}");
        assert!(!script.contains("TPM backends"), "{script}");
    }

    #[test]
    fn ipxe_scripts_golden() {
        let m = manifest();
        let id = ImageId("ab".repeat(32));
        let beside = ipxe_script(&m, &id, &Fetch::Beside, "");
        let k = &m.kernel.sha256;
        let i = &m.initrd.sha256;
        assert_eq!(
            beside,
            format!(
                "#!ipxe\n\
                 # better-compute image gpu-node (abababababababab), kernel 6.1.0-57-cloud-amd64, bcd bcd 0.1.0\n\
                 echo Booting gpu-node (abababababababab)\n\
                 kernel vmlinuz initrd=initrd.img console=ttyS0 bcd.server=https://10.0.2.100:7443 bcd.image={} bcd.mac=${{net0/mac}}\n\
                 initrd --name initrd.img initrd.img\n\
                 boot\n",
                id.0
            )
        );
        let http = ipxe_script(
            &m,
            &id,
            &Fetch::Http("http://10.0.2.101:8080/boot/artifacts/"),
            "bcd.log=debug",
        );
        assert!(
            http.contains(&format!(
                "kernel http://10.0.2.101:8080/boot/artifacts/{k} initrd="
            )),
            "{http}"
        );
        assert!(
            http.contains(&format!(
                "initrd --name initrd.img http://10.0.2.101:8080/boot/artifacts/{i}\n"
            )),
            "{http}"
        );
        assert!(
            http.contains("bcd.mac=${net0/mac} bcd.log=debug\n"),
            "{http}"
        );
    }
}
