//! Whole-archive compression, deterministic, and detection by magic bytes.

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

/// gzip level: the smallest output; the kernel unpacks every level alike.
const GZIP_LEVEL: u32 = 9;
/// zstd level: the highest without `--ultra`; its window of at most 8 MiB
/// keeps the memory the kernel needs to unpack the image small.
const ZSTD_LEVEL: i32 = 19;
/// The OS byte of a gzip header: Unix, as `gzip -n` writes it.
const GZIP_OS_UNIX: u8 = 3;

/// How a whole archive is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Compression {
    /// Plain newc bytes.
    #[default]
    None,
    /// gzip (RFC 1952), header with mtime 0, no file name, OS Unix.
    Gzip,
    /// One zstd frame with content size and checksum.
    Zstd,
}

impl Compression {
    /// Every variant, for tests and command-line help.
    pub const ALL: [Compression; 3] = [Compression::None, Compression::Gzip, Compression::Zstd];

    /// Compresses `data`. The same input gives the same output: no time,
    /// file name or thread count enters the stream.
    pub fn compress(self, data: &[u8]) -> io::Result<Vec<u8>> {
        match self {
            Compression::None => Ok(data.to_vec()),
            Compression::Gzip => {
                let mut encoder = flate2::GzBuilder::new()
                    .mtime(0)
                    .operating_system(GZIP_OS_UNIX)
                    .write(
                        Vec::with_capacity(data.len() / 2),
                        flate2::Compression::new(GZIP_LEVEL),
                    );
                encoder.write_all(data)?;
                encoder.finish()
            }
            Compression::Zstd => {
                let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
                compressor.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
                compressor.set_parameter(zstd::zstd_safe::CParameter::ContentSizeFlag(true))?;
                compressor.compress(data)
            }
        }
    }

    /// The compression of a stream that starts with `bytes`, by its magic:
    /// `1f 8b` gzip, `28 b5 2f fd` zstd, `07070` an uncompressed archive.
    pub fn detect(bytes: &[u8]) -> Option<Compression> {
        match detect(bytes) {
            Format::Cpio if bytes.starts_with(b"07070") => Some(Compression::None),
            Format::Compressed(compression) => Some(compression),
            _ => None,
        }
    }

    /// The usual file name suffix: `""`, `".gz"`, `".zst"`.
    pub fn suffix(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Gzip => ".gz",
            Compression::Zstd => ".zst",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "uncompressed",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        })
    }
}

/// A name that is no [`Compression`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown compression {0:?}: use none, gzip or zstd")]
pub struct UnknownCompression(pub String);

impl FromStr for Compression {
    type Err = UnknownCompression;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" | "uncompressed" => Ok(Compression::None),
            "gzip" | "gz" => Ok(Compression::Gzip),
            "zstd" | "zst" => Ok(Compression::Zstd),
            other => Err(UnknownCompression(other.to_owned())),
        }
    }
}

/// What a segment of an image is, judged by its first bytes the way the
/// kernel's `unpack_to_rootfs` judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Starts with `0`: taken as a newc header.
    Cpio,
    Compressed(Compression),
    /// A format the kernel may know but this crate does not unpack.
    Unsupported(&'static str),
    Unknown,
}

pub(crate) fn detect(bytes: &[u8]) -> Format {
    const UNSUPPORTED: [(&[u8], &str); 6] = [
        (b"\xfd7zXZ\0", "xz"),
        (b"\x5d\0\0", "lzma"),
        (b"BZh", "bzip2"),
        (b"\x02\x21\x4c\x18", "lz4"),
        (b"\x89LZO", "lzo"),
        (b"\x1f\x9e", "old gzip"),
    ];
    if bytes.starts_with(b"0") {
        return Format::Cpio;
    }
    if bytes.starts_with(b"\x1f\x8b") {
        return Format::Compressed(Compression::Gzip);
    }
    if bytes.starts_with(b"\x28\xb5\x2f\xfd") {
        return Format::Compressed(Compression::Zstd);
    }
    UNSUPPORTED
        .iter()
        .find(|(magic, _)| bytes.starts_with(magic))
        .map_or(Format::Unknown, |&(_, name)| Format::Unsupported(name))
}

#[derive(Debug)]
pub(crate) enum DecompressError {
    Io(io::Error),
    TooLarge,
}

impl From<io::Error> for DecompressError {
    fn from(err: io::Error) -> Self {
        DecompressError::Io(err)
    }
}

/// Decompresses the one gzip member or zstd frame at the start of `input`;
/// returns the data and how many input bytes it took. Fails with
/// `TooLarge` rather than produce more than `limit` bytes.
pub(crate) fn decompress_one(
    compression: Compression,
    input: &[u8],
    limit: u64,
) -> Result<(Vec<u8>, usize), DecompressError> {
    let mut rest = input;
    let mut out = Vec::new();
    match compression {
        Compression::None => {
            out.extend_from_slice(input);
            rest = &[];
        }
        Compression::Gzip => {
            let decoder = flate2::bufread::GzDecoder::new(&mut rest);
            decoder
                .take(limit.saturating_add(1))
                .read_to_end(&mut out)?;
        }
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(&mut rest)?.single_frame();
            decoder
                .take(limit.saturating_add(1))
                .read_to_end(&mut out)?;
        }
    }
    if out.len() as u64 > limit {
        return Err(DecompressError::TooLarge);
    }
    Ok((out, input.len() - rest.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        (0..20_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn compression_is_deterministic_and_round_trips() {
        let data = sample();
        for compression in Compression::ALL {
            let once = compression.compress(&data).unwrap();
            assert_eq!(once, compression.compress(&data).unwrap(), "{compression}");
            let (back, used) = decompress_one(compression, &once, u64::MAX).unwrap();
            assert_eq!(back, data, "{compression}");
            assert_eq!(used, once.len(), "{compression}");
        }
    }

    #[test]
    fn gzip_header_has_no_time_and_no_name() {
        let gz = Compression::Gzip.compress(b"x").unwrap();
        assert_eq!(&gz[..3], b"\x1f\x8b\x08", "magic and deflate");
        assert_eq!(gz[3], 0, "no FNAME, FCOMMENT or FEXTRA flags");
        assert_eq!(&gz[4..8], &[0, 0, 0, 0], "mtime 0");
        assert_eq!(gz[9], GZIP_OS_UNIX);
    }

    #[test]
    fn decompression_takes_exactly_one_stream() {
        let data = sample();
        for compression in [Compression::Gzip, Compression::Zstd] {
            let mut input = compression.compress(&data).unwrap();
            let len = input.len();
            input.extend(b"070701 and more");
            let (back, used) = decompress_one(compression, &input, u64::MAX).unwrap();
            assert_eq!((back.len(), used), (data.len(), len), "{compression}");
        }
    }

    #[test]
    fn truncated_streams_fail() {
        let data = sample();
        for compression in [Compression::Gzip, Compression::Zstd] {
            let input = compression.compress(&data).unwrap();
            let cut = &input[..input.len() - 5];
            assert!(
                matches!(
                    decompress_one(compression, cut, u64::MAX),
                    Err(DecompressError::Io(_))
                ),
                "{compression}"
            );
        }
    }

    #[test]
    fn detection_and_names() {
        for compression in Compression::ALL {
            let bytes = compression.compress(b"070701").unwrap();
            assert_eq!(Compression::detect(&bytes), Some(compression));
            assert_eq!(compression.to_string().parse(), Ok(compression));
        }
        assert_eq!(Compression::detect(b"BZh9"), None);
        assert_eq!(detect(b"BZh9"), Format::Unsupported("bzip2"));
        assert_eq!("zst".parse(), Ok(Compression::Zstd));
        assert_eq!(
            "xz".parse::<Compression>().unwrap_err().to_string(),
            "unknown compression \"xz\": use none, gzip or zstd"
        );
    }
}
