//! A node's side of `boot.kexec` by image id: putting an image's kernel
//! and initrd back together from the chunks a gateway streams
//! ([`Download`]) once the signed manifest verified
//! ([`verified_manifest`]), and deciding whether what arrived may be
//! loaded ([`Download::finish`]).
//!
//! Nothing a gateway sends is trusted but what the image keys the node
//! learned at join vouch for: the signed manifest must verify against one
//! of them and be the image asked for (its SHA-256 is the image id), and
//! the kernel and initrd must be exactly the sizes and SHA-256s it names.
//! Sans-IO: the caller writes each chunk where [`Download::push`] says and
//! feeds the bytes here, which hashes them as they pass, so neither file is
//! ever held in memory whole.

use serde::Deserialize;

use crate::{FORMAT, Part};

/// The largest kernel or initrd a node takes: a signed manifest naming
/// more is refused before anything is written.
pub const MAX_PART_SIZE: u64 = 1 << 30;

/// Which file of an image a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Kernel,
    Initrd,
}

/// One file being received.
struct Receiving {
    part: Part,
    received: u64,
    hash: ring::digest::Context,
}

impl std::fmt::Debug for Receiving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiving")
            .field("part", &self.part)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl Receiving {
    fn new(part: &Part) -> Result<Receiving, NotLoaded> {
        if part.size > MAX_PART_SIZE {
            return Err(NotLoaded::TooLarge {
                file: part.file.clone(),
                size: part.size,
            });
        }
        Ok(Receiving {
            part: part.clone(),
            received: 0,
            hash: ring::digest::Context::new(&ring::digest::SHA256),
        })
    }

    fn whole(&self) -> bool {
        self.received == self.part.size
    }

    fn push(&mut self, offset: u64, data: &[u8]) -> Result<(), NotLoaded> {
        let file = || self.part.file.clone();
        if data.is_empty() {
            return Err(NotLoaded::Empty {
                file: file(),
                offset,
            });
        }
        if offset != self.received {
            return Err(NotLoaded::Gap {
                file: file(),
                expected: self.received,
                got: offset,
            });
        }
        if data.len() as u64 > self.part.size - self.received {
            return Err(NotLoaded::TooLong {
                file: file(),
                size: self.part.size,
            });
        }
        self.hash.update(data);
        self.received += data.len() as u64;
        Ok(())
    }

    /// The file is whole and is the one the manifest names.
    fn finish(self) -> Result<(), NotLoaded> {
        if !self.whole() {
            return Err(NotLoaded::Short {
                file: self.part.file,
                expected: self.part.size,
                actual: self.received,
            });
        }
        let actual = hex::encode(self.hash.finish());
        if actual != self.part.sha256 {
            return Err(NotLoaded::Hash {
                file: self.part.file,
                expected: self.part.sha256,
                actual,
            });
        }
        Ok(())
    }
}

/// An image download in progress: the kernel's chunks in order, then the
/// initrd's, against the verified manifest.
#[derive(Debug)]
pub struct Download {
    manifest: Bootable,
    kernel: Receiving,
    initrd: Receiving,
}

impl Download {
    /// Starts a download of the files `manifest` names
    /// ([`verified_manifest`]'s).
    pub fn new(manifest: Bootable) -> Result<Download, NotLoaded> {
        Ok(Download {
            kernel: Receiving::new(&manifest.kernel)?,
            initrd: Receiving::new(&manifest.initrd)?,
            manifest,
        })
    }

    /// Takes the chunk of `which` the server says starts at `offset`; the
    /// caller appends `data` to that file only when this says yes. Every
    /// chunk carries bytes, so a stream cannot go on without moving
    /// forward.
    pub fn push(&mut self, which: Which, offset: u64, data: &[u8]) -> Result<(), NotLoaded> {
        match which {
            Which::Kernel if self.initrd.received > 0 => Err(NotLoaded::OutOfOrder {
                expected: Which::Initrd,
                got: Which::Kernel,
            }),
            Which::Kernel => self.kernel.push(offset, data),
            Which::Initrd if !self.kernel.whole() => Err(NotLoaded::OutOfOrder {
                expected: Which::Kernel,
                got: Which::Initrd,
            }),
            Which::Initrd => self.initrd.push(offset, data),
        }
    }

    /// The stream ended: what to load, if both files are whole and are
    /// the ones the manifest names (sizes and SHA-256s). `extra` follows
    /// the manifest's command line.
    pub fn finish(self, extra: &str) -> Result<Load, NotLoaded> {
        self.kernel.finish()?;
        self.initrd.finish()?;
        let mut cmdline = self.manifest.cmdline.trim().to_string();
        let extra = extra.trim();
        if !extra.is_empty() {
            if !cmdline.is_empty() {
                cmdline.push(' ');
            }
            cmdline.push_str(extra);
        }
        Ok(Load {
            manifest: self.manifest,
            cmdline,
        })
    }
}

/// Why a node loads nothing: what did not verify, or how the download
/// went wrong. One type for both, so a node carries one way of saying it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotLoaded {
    #[error(
        "this node learned no image keys at join (the control plane had none, or predates \
         them): nothing was loaded; start serve with --image-pubkey, then join this node again \
         (bcd join --reset --yes, then bcd join)"
    )]
    NoKeys,
    #[error(
        "the image manifest is signed by key {0}, which is not an image key this node learned \
         at join: nothing was loaded"
    )]
    UnknownKey(String),
    #[error(
        "the image manifest's signature does not verify against image key {0} (tampered or \
         forged): nothing was loaded"
    )]
    BadSignature(String),
    #[error("the image manifest does not read ({0}): nothing was loaded")]
    Malformed(String),
    #[error(
        "asked for image {asked}, the server sent the manifest of image {got}: nothing was loaded"
    )]
    OtherImage { asked: String, got: String },
    #[error(
        "the {file} fetched has SHA-256 {actual}; the signed manifest says {expected}: nothing \
         was loaded"
    )]
    Hash {
        file: String,
        expected: String,
        actual: String,
    },
    #[error(
        "the image manifest names a {file} of {size} bytes, more than the {MAX_PART_SIZE} a node \
         takes: nothing was loaded"
    )]
    TooLarge { file: String, size: u64 },
    #[error(
        "the server sent {got:?} bytes while the {expected:?} was not yet whole: nothing was loaded"
    )]
    OutOfOrder { expected: Which, got: Which },
    #[error(
        "the server sent {file} bytes at offset {got}, but {expected} bytes are in hand: nothing \
         was loaded"
    )]
    Gap {
        file: String,
        expected: u64,
        got: u64,
    },
    #[error("the server sent an empty {file} chunk at offset {offset}: nothing was loaded")]
    Empty { file: String, offset: u64 },
    #[error("the server sent more {file} bytes than the manifest's {size}: nothing was loaded")]
    TooLong { file: String, size: u64 },
    #[error(
        "the download ended after {actual} bytes of the {file}; the manifest says {expected}: \
         nothing was loaded"
    )]
    Short {
        file: String,
        expected: u64,
        actual: u64,
    },
}

/// What a node reads of a signed image manifest (`crate::Manifest`; the
/// fields it does not need are skipped when it is read).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Bootable {
    pub format: u32,
    pub name: String,
    pub cmdline: String,
    pub kernel: Part,
    pub initrd: Part,
}

/// What to load: the verified manifest and the kernel command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    pub manifest: Bootable,
    /// The manifest's command line, then the command's own addition.
    pub cmdline: String,
}

/// The signed manifest of image `image_id`, verified against the image
/// keys the node learned at join: checked when it arrives, before any of
/// the image's bytes are taken. The signature is checked as a release's is
/// (`release::SignedManifest`, the same envelope), and the image id is the
/// SHA-256 of the signed bytes.
pub fn verified_manifest(
    image_id: &str,
    signed_manifest: &[u8],
    keys: &[Vec<u8>],
) -> Result<Bootable, NotLoaded> {
    use release::ReleaseError as R;
    if keys.is_empty() {
        return Err(NotLoaded::NoKeys);
    }
    let signed = release::SignedManifest::parse(signed_manifest).map_err(|e| match e {
        R::Malformed(m) => NotLoaded::Malformed(m),
        other => NotLoaded::Malformed(other.to_string()),
    })?;
    let bytes = signed.verified_bytes(keys).map_err(|e| match e {
        R::UnknownKey(k) => NotLoaded::UnknownKey(k),
        R::BadSignature => NotLoaded::BadSignature(signed.key_id.clone()),
        R::Malformed(m) => NotLoaded::Malformed(m),
        other => NotLoaded::Malformed(other.to_string()),
    })?;
    let got = crate::sha256_hex(&bytes);
    if got != image_id {
        return Err(NotLoaded::OtherImage {
            asked: image_id.to_string(),
            got,
        });
    }
    let m: Bootable =
        serde_json::from_slice(&bytes).map_err(|e| NotLoaded::Malformed(e.to_string()))?;
    if m.format != FORMAT {
        return Err(NotLoaded::Malformed(format!(
            "format {}; this bcd reads format {FORMAT}",
            m.format
        )));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{INITRD_FILE, KERNEL_FILE, Manifest, SignedManifest, sign};
    use proptest::prelude::*;
    use ring::signature::{Ed25519KeyPair, KeyPair};

    fn key(seed: u8) -> Ed25519KeyPair {
        Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
    }

    fn public(k: &Ed25519KeyPair) -> Vec<u8> {
        k.public_key().as_ref().to_vec()
    }

    fn manifest(kernel: &[u8], initrd: &[u8]) -> Manifest {
        Manifest {
            format: FORMAT,
            name: "gpu-node".into(),
            kernel_version: "6.1.0".into(),
            bcd_version: "bcd 0.1.0".into(),
            cmdline: "console=ttyS0 bcd.server=https://10.0.2.100:7443".into(),
            kernel: Part::of(KERNEL_FILE, kernel),
            initrd: Part::of(INITRD_FILE, initrd),
            modules: vec![],
        }
    }

    fn bootable(m: &Manifest) -> Bootable {
        Bootable {
            format: m.format,
            name: m.name.clone(),
            cmdline: m.cmdline.clone(),
            kernel: m.kernel.clone(),
            initrd: m.initrd.clone(),
        }
    }

    /// An image signed by `k`: its id and signed manifest bytes.
    fn image(k: &Ed25519KeyPair, kernel: &[u8], initrd: &[u8]) -> (String, Vec<u8>) {
        let signed = sign(&manifest(kernel, initrd), k);
        (signed.id().unwrap().0, signed.to_json())
    }

    /// What a node does with an image sent whole: the manifest verified,
    /// each file in one chunk, and the verdict.
    fn fetch(
        id: &str,
        signed: &[u8],
        keys: &[Vec<u8>],
        kernel: &[u8],
        initrd: &[u8],
        extra: &str,
    ) -> Result<Load, NotLoaded> {
        let mut d = Download::new(verified_manifest(id, signed, keys)?)?;
        d.push(Which::Kernel, 0, kernel)?;
        d.push(Which::Initrd, 0, initrd)?;
        d.finish(extra)
    }

    #[test]
    fn a_verified_image_loads_with_its_command_line_and_the_addition() {
        let k = key(1);
        let (id, signed) = image(&k, b"kernel", b"initrd");
        let load = fetch(
            &id,
            &signed,
            &[public(&key(2)), public(&k)],
            b"kernel",
            b"initrd",
            " bcd.log=debug ",
        )
        .unwrap();
        assert_eq!(
            load.cmdline,
            "console=ttyS0 bcd.server=https://10.0.2.100:7443 bcd.log=debug"
        );
        assert_eq!(load.manifest, bootable(&manifest(b"kernel", b"initrd")));
    }

    #[test]
    fn each_failure_says_what_did_not_verify() {
        let k = key(1);
        let keys = [public(&k)];
        let (id, signed) = image(&k, b"kernel", b"initrd");
        let (kernel, initrd): (&[u8], &[u8]) = (b"kernel", b"initrd");
        let no = |id: &str, signed: &[u8], keys: &[Vec<u8>], kn: &[u8], ir: &[u8]| {
            fetch(id, signed, keys, kn, ir, "").unwrap_err()
        };
        assert_eq!(no(&id, &signed, &[], kernel, initrd), NotLoaded::NoKeys);
        let (other_id, stranger) = image(&key(3), b"kernel", b"initrd");
        let e = no(&other_id, &stranger, &keys, kernel, initrd);
        assert_eq!(e, NotLoaded::UnknownKey(release::key_id(&public(&key(3)))));
        assert!(
            e.to_string()
                .contains("not an image key this node learned at join")
        );
        let (_, another) = image(&k, b"kernel2", b"initrd");
        let e = no(&id, &another, &keys, kernel, initrd);
        assert!(matches!(e, NotLoaded::OtherImage { .. }), "{e}");
        let e = no(&id, &signed, &keys, b"kernel!", initrd);
        assert!(
            matches!(&e, NotLoaded::TooLong { file, .. } if file == KERNEL_FILE),
            "{e}"
        );
        let e = no(&id, &signed, &keys, b"kerne", initrd);
        assert!(
            matches!(&e, NotLoaded::OutOfOrder { .. }),
            "the initrd before the whole kernel: {e}"
        );
        let e = no(&id, &signed, &keys, kernel, b"initrD");
        assert!(
            matches!(&e, NotLoaded::Hash { file, .. } if file == INITRD_FILE),
            "{e}"
        );
        assert!(e.to_string().contains("nothing was loaded"), "{e}");
        assert!(matches!(
            no(&id, b"{}", &keys, kernel, initrd),
            NotLoaded::Malformed(_)
        ));
        // The manifest's bytes swapped under the signature.
        let mut forged: SignedManifest = serde_json::from_slice(&signed).unwrap();
        forged.manifest = sign(&manifest(b"kernel", b"other"), &key(3)).manifest;
        let e = no(&id, &forged.to_json(), &keys, kernel, initrd);
        assert_eq!(e, NotLoaded::BadSignature(release::key_id(&keys[0])));
    }

    #[test]
    fn chunks_in_order_download_and_anything_else_is_refused() {
        let m = bootable(&manifest(b"kernel", b"initrd"));
        let mut d = Download::new(m.clone()).unwrap();
        d.push(Which::Kernel, 0, b"ker").unwrap();
        assert!(matches!(
            d.push(Which::Initrd, 0, b"in"),
            Err(NotLoaded::OutOfOrder { .. })
        ));
        assert!(matches!(
            d.push(Which::Kernel, 2, b"nel"),
            Err(NotLoaded::Gap { .. })
        ));
        assert!(matches!(
            d.push(Which::Kernel, 3, b""),
            Err(NotLoaded::Empty { .. })
        ));
        assert!(matches!(
            d.push(Which::Kernel, 3, b"nel!"),
            Err(NotLoaded::TooLong { .. })
        ));
        d.push(Which::Kernel, 3, b"nel").unwrap();
        d.push(Which::Initrd, 0, b"init").unwrap();
        assert!(matches!(
            d.push(Which::Kernel, 6, b"x"),
            Err(NotLoaded::OutOfOrder { .. })
        ));
        let short = Download::new(m.clone()).unwrap();
        assert!(matches!(short.finish(""), Err(NotLoaded::Short { .. })));
        d.push(Which::Initrd, 4, b"rd").unwrap();
        assert_eq!(d.finish("").unwrap().manifest, m);
        let mut huge = m.clone();
        huge.initrd.size = MAX_PART_SIZE + 1;
        assert!(matches!(
            Download::new(huge),
            Err(NotLoaded::TooLarge { .. })
        ));
    }

    /// `bytes` cut at the given points, as (offset, chunk).
    fn chunks(bytes: &[u8], cuts: &[usize]) -> Vec<(u64, Vec<u8>)> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        cuts.dedup();
        cuts.windows(2)
            .map(|w| (w[0] as u64, bytes[w[0]..w[1]].to_vec()))
            .collect()
    }

    proptest! {
        /// However the server cuts the files, in order they download to
        /// exactly what the manifest names, and the image loads.
        #[test]
        fn any_cut_in_order_downloads_and_loads(
            kernel in prop::collection::vec(any::<u8>(), 1..2048),
            initrd in prop::collection::vec(any::<u8>(), 1..2048),
            kcuts in prop::collection::vec(any::<usize>(), 0..8),
            icuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            let k = key(1);
            let (id, signed) = image(&k, &kernel, &initrd);
            let m = verified_manifest(&id, &signed, &[public(&k)]).unwrap();
            let mut d = Download::new(m).unwrap();
            for (offset, data) in chunks(&kernel, &kcuts) {
                d.push(Which::Kernel, offset, &data).unwrap();
            }
            for (offset, data) in chunks(&initrd, &icuts) {
                d.push(Which::Initrd, offset, &data).unwrap();
            }
            prop_assert!(d.finish("").is_ok());
        }

        /// Chunks from a peer (any file, offsets, bytes) never panic, never
        /// take more than the manifest names, and download into something
        /// that loads only when it is exactly the image.
        #[test]
        fn arbitrary_chunks_load_only_the_image(
            kernel in prop::collection::vec(any::<u8>(), 1..512),
            initrd in prop::collection::vec(any::<u8>(), 1..512),
            sent in prop::collection::vec(
                (any::<bool>(), 0u64..1024, prop::collection::vec(any::<u8>(), 0..300)),
                0..12,
            ),
        ) {
            let k = key(1);
            let (id, signed) = image(&k, &kernel, &initrd);
            let m = verified_manifest(&id, &signed, &[public(&k)]).unwrap();
            let mut d = Download::new(m).unwrap();
            let (mut kb, mut ib) = (Vec::new(), Vec::new());
            for (is_kernel, offset, data) in &sent {
                let which = if *is_kernel { Which::Kernel } else { Which::Initrd };
                if d.push(which, *offset, data).is_ok() {
                    if *is_kernel { kb.extend_from_slice(data) } else { ib.extend_from_slice(data) }
                }
                prop_assert!(kb.len() <= kernel.len() && ib.len() <= initrd.len());
            }
            let loads = d.finish("").is_ok();
            prop_assert_eq!(loads, kb == kernel && ib == initrd);
        }

        /// Any byte of the signed manifest flipped: nothing loads, or it is
        /// still exactly the image (a flip JSON does not see, such as in
        /// white space, changes nothing signed).
        #[test]
        fn a_tampered_manifest_never_loads_another_image(
            at in any::<usize>(),
            bit in 0u8..8,
        ) {
            let k = key(1);
            let (id, signed) = image(&k, b"kernel", b"initrd");
            let mut tampered = signed.clone();
            let i = at % tampered.len();
            tampered[i] ^= 1 << bit;
            let r = fetch(&id, &tampered, &[public(&k)], b"kernel", b"initrd", "");
            if let Ok(load) = r {
                prop_assert_eq!(load.manifest, bootable(&manifest(b"kernel", b"initrd")));
            }
        }

        /// A tampered kernel or initrd never loads.
        #[test]
        fn a_tampered_file_never_loads(
            kernel in prop::collection::vec(any::<u8>(), 1..256),
            initrd in prop::collection::vec(any::<u8>(), 1..256),
            at in any::<usize>(),
            bit in 0u8..8,
            in_kernel in any::<bool>(),
        ) {
            let k = key(1);
            let (id, signed) = image(&k, &kernel, &initrd);
            let (mut kb, mut ib) = (kernel.clone(), initrd.clone());
            let target = if in_kernel { &mut kb } else { &mut ib };
            let i = at % target.len();
            target[i] ^= 1 << bit;
            let e = fetch(&id, &signed, &[public(&k)], &kb, &ib, "").unwrap_err();
            let is_hash = matches!(e, NotLoaded::Hash { .. });
            prop_assert!(is_hash);
        }
    }
}
