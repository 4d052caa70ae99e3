//! Putting a release back together from the chunks a server streams.
//!
//! The bytes come from a peer, so nothing about them is trusted but the
//! verified manifest: each chunk must start where the previous one ended,
//! the total may not pass the manifest's size, and only a download of
//! exactly that size whose SHA-256 and target match the manifest is handed
//! back. Sans-IO: the caller feeds what it reads off the wire.

use crate::{Manifest, ReleaseError};

/// The largest release a node puts together: twice what the server
/// registers, so a signed manifest naming more is refused before anything
/// is allocated.
pub const MAX_RELEASE_SIZE: u64 = 256 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error(
        "the release's manifest names {size} bytes, more than the {MAX_RELEASE_SIZE} a node accepts"
    )]
    TooLarge { size: u64 },
    #[error(
        "the server sent release bytes at offset {got}, but {expected} bytes are in hand: the download is refused"
    )]
    Gap { expected: u64, got: u64 },
    #[error("the server sent an empty chunk at offset {offset}: the download is refused")]
    Empty { offset: u64 },
    #[error("the server sent more than the manifest's {size} bytes: the download is refused")]
    TooLong { size: u64 },
    #[error("the download ended after {actual} bytes; the manifest says {expected}")]
    Short { expected: u64, actual: u64 },
    #[error(transparent)]
    Check(#[from] ReleaseError),
}

/// A release download in progress, against its verified manifest.
#[derive(Debug)]
pub struct Assembly {
    manifest: Manifest,
    binary: Vec<u8>,
}

impl Assembly {
    /// Starts a download of the release `manifest` (verified by the caller)
    /// names.
    pub fn new(manifest: Manifest) -> Result<Assembly, ChunkError> {
        if manifest.size > MAX_RELEASE_SIZE {
            return Err(ChunkError::TooLarge {
                size: manifest.size,
            });
        }
        let binary = Vec::with_capacity(manifest.size as usize);
        Ok(Assembly { manifest, binary })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// How many bytes are in hand: where a resumed download starts.
    pub fn received(&self) -> u64 {
        self.binary.len() as u64
    }

    /// Takes the chunk the server says starts at `offset`. Every chunk
    /// carries bytes, so a stream cannot go on without moving forward.
    pub fn push(&mut self, offset: u64, data: &[u8]) -> Result<(), ChunkError> {
        let expected = self.received();
        if data.is_empty() {
            return Err(ChunkError::Empty { offset });
        }
        if offset != expected {
            return Err(ChunkError::Gap {
                expected,
                got: offset,
            });
        }
        if (data.len() as u64) > self.manifest.size - expected {
            return Err(ChunkError::TooLong {
                size: self.manifest.size,
            });
        }
        self.binary.extend_from_slice(data);
        Ok(())
    }

    /// The stream ended: the binary, if it is the whole release and
    /// matches its manifest.
    pub fn finish(self) -> Result<(Manifest, Vec<u8>), ChunkError> {
        if self.received() != self.manifest.size {
            return Err(ChunkError::Short {
                expected: self.manifest.size,
                actual: self.received(),
            });
        }
        self.manifest.check(&self.binary)?;
        Ok((self.manifest, self.binary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest_for;
    use proptest::prelude::*;

    fn elf(mut b: Vec<u8>) -> Vec<u8> {
        b.resize(b.len().max(64), 0);
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&62u16.to_le_bytes());
        b
    }

    fn manifest(binary: &[u8]) -> Manifest {
        manifest_for(binary, "0.2.0", 7, "x86_64-unknown-linux-musl")
    }

    /// `binary` cut at the given points (sorted, deduplicated, in range).
    fn chunks(binary: &[u8], cuts: &[usize]) -> Vec<(u64, Vec<u8>)> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (binary.len() + 1)).collect();
        cuts.push(0);
        cuts.push(binary.len());
        cuts.sort_unstable();
        cuts.dedup();
        cuts.windows(2)
            .map(|w| (w[0] as u64, binary[w[0]..w[1]].to_vec()))
            .collect()
    }

    #[test]
    fn a_release_in_order_assembles_and_anything_else_is_refused() {
        let bin = elf(vec![1; 1000]);
        let m = manifest(&bin);
        let mut a = Assembly::new(m.clone()).unwrap();
        a.push(0, &bin[..400]).unwrap();
        assert_eq!(
            a.push(500, &bin[500..]),
            Err(ChunkError::Gap {
                expected: 400,
                got: 500
            })
        );
        a.push(400, &bin[400..]).unwrap();
        assert_eq!(a.push(1000, b"x"), Err(ChunkError::TooLong { size: 1000 }));
        assert_eq!(a.push(1000, b""), Err(ChunkError::Empty { offset: 1000 }));
        assert_eq!(a.finish().unwrap(), (m.clone(), bin.clone()));

        let mut short = Assembly::new(m.clone()).unwrap();
        short.push(0, &bin[..999]).unwrap();
        assert_eq!(
            short.finish().unwrap_err(),
            ChunkError::Short {
                expected: 1000,
                actual: 999
            }
        );
        let mut other = bin.clone();
        other[700] ^= 1;
        let mut corrupt = Assembly::new(m.clone()).unwrap();
        corrupt.push(0, &other).unwrap();
        assert!(matches!(
            corrupt.finish(),
            Err(ChunkError::Check(ReleaseError::Hash { .. }))
        ));
        let huge = Manifest {
            size: MAX_RELEASE_SIZE + 1,
            ..m
        };
        assert!(matches!(
            Assembly::new(huge),
            Err(ChunkError::TooLarge { .. })
        ));
    }

    proptest! {
        /// However the server cuts the binary, in order it assembles to
        /// exactly the release.
        #[test]
        fn any_cut_in_order_assembles(
            body in prop::collection::vec(any::<u8>(), 0..4096),
            cuts in prop::collection::vec(any::<usize>(), 0..16),
        ) {
            let bin = elf(body);
            let m = manifest(&bin);
            let mut a = Assembly::new(m.clone()).unwrap();
            for (offset, data) in chunks(&bin, &cuts) {
                prop_assert!(!data.is_empty());
                a.push(offset, &data).unwrap();
            }
            prop_assert_eq!(a.finish().unwrap(), (m, bin));
        }

        /// Chunks from a peer (any offsets, any bytes) never panic, never
        /// grow past the manifest's size, and assemble only into the exact
        /// release.
        #[test]
        fn arbitrary_chunks_assemble_only_the_release(
            body in prop::collection::vec(any::<u8>(), 0..2048),
            sent in prop::collection::vec(
                (0u64..4096, prop::collection::vec(any::<u8>(), 0..700)),
                0..12,
            ),
        ) {
            let bin = elf(body);
            let m = manifest(&bin);
            let mut a = Assembly::new(m.clone()).unwrap();
            for (offset, data) in &sent {
                let before = a.received();
                match a.push(*offset, data) {
                    Ok(()) => prop_assert_eq!(a.received(), before + data.len() as u64),
                    Err(_) => prop_assert_eq!(a.received(), before),
                }
                prop_assert!(a.received() <= m.size);
            }
            if let Ok((_, got)) = a.finish() {
                prop_assert_eq!(got, bin);
            }
        }

        /// A chunk dropped, repeated or altered is refused.
        #[test]
        fn a_damaged_stream_is_refused(
            body in prop::collection::vec(any::<u8>(), 64..2048),
            cuts in prop::collection::vec(any::<usize>(), 1..8),
            pick in any::<prop::sample::Index>(),
            how in 0u8..3,
        ) {
            let bin = elf(body);
            let m = manifest(&bin);
            let mut sent = chunks(&bin, &cuts);
            let i = pick.index(sent.len());
            match how {
                0 => { sent.remove(i); }
                1 => { let c = sent[i].clone(); sent.insert(i, c); }
                _ => {
                    let (_, data) = &mut sent[i];
                    if data.is_empty() { data.push(0) } else { data[0] ^= 0x80 }
                }
            }
            let mut a = Assembly::new(m).unwrap();
            let pushed = sent.iter().try_for_each(|(o, d)| a.push(*o, d));
            prop_assert!(pushed.is_err() || a.finish().is_err());
        }
    }
}
