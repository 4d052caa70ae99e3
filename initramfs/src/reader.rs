//! Reading initramfs images: newc archives, concatenated and compressed as
//! the kernel accepts them.
//!
//! The input may come from anywhere (a peer, a download, a disk), so every
//! size and offset is checked: malformed input gives a [`ReadError`], never
//! a panic, and decompression stops at a size limit.
//!
//! Entries are returned as stored. Hard links (`nlink` above 1, one inode
//! number) stay separate entries; newc writers put the data on the last
//! one only.

use std::fmt::Write as _;

use crate::compress::{self, Compression, DecompressError, Format};
use crate::newc::{
    self, FIELDS, HEADER_LEN, MAGIC, MAGIC_CRC, MAX_NAME_LEN, Node, PERM_MASK, S_IFBLK, S_IFCHR,
    S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK, TRAILER, field,
};

/// Default limit on the bytes that decompression may produce, all
/// compressed segments together.
pub const DEFAULT_MAX_UNPACKED: u64 = 2 << 30;

/// One member of an archive as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The name as stored: usually relative (`bin/bcd`), though the kernel
    /// also accepts `/bin/bcd` and `./bin/bcd`.
    pub path: String,
    /// Permission bits, set-id and sticky bits included.
    pub perm: u32,
    /// The type and content.
    pub node: Node,
    pub uid: u32,
    pub gid: u32,
    pub mtime: u32,
    pub ino: u32,
    pub nlink: u32,
}

impl Entry {
    /// The full `st_mode`: type bits and permission bits.
    pub fn mode(&self) -> u32 {
        self.node.type_bits() | self.perm
    }
}

/// A run of the input the kernel unpacks in one go: one uncompressed
/// archive, or one compressed stream (which may hold several archives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Where the segment starts in the input.
    pub offset: usize,
    pub compression: Compression,
    pub entries: Vec<Entry>,
}

/// Why an image could not be read. Offsets count from the start of the
/// input, or of the unpacked stream for errors inside [`ReadError::InSegment`].
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "truncated {what} at offset {offset}: the image ends early; check that it was copied whole"
    )]
    Truncated { offset: usize, what: &'static str },
    #[error("bad magic {found:?} at offset {offset}: not a cpio newc archive (070701 or 070702)")]
    BadMagic { offset: usize, found: String },
    #[error("bad hex digits in the {field} field of the header at offset {offset}")]
    BadHex { offset: usize, field: &'static str },
    #[error("entry at offset {offset} has an empty name")]
    EmptyName { offset: usize },
    #[error(
        "entry at offset {offset} has a {len}-byte name; the kernel takes at most {MAX_NAME_LEN}"
    )]
    NameTooLong { offset: usize, len: usize },
    #[error("name of the entry at offset {offset} is not NUL-terminated")]
    NameNotTerminated { offset: usize },
    #[error("name of the entry at offset {offset} contains a NUL byte before its end")]
    NameHasNul { offset: usize },
    #[error("name of the entry at offset {offset} is not UTF-8")]
    NameNotUtf8 { offset: usize },
    #[error("size of {path} at offset {offset} runs past the end of memory")]
    SizeOverflow { offset: usize, path: String },
    #[error("{path} at offset {offset} has mode {mode:o}, which is no file type")]
    UnknownType {
        offset: usize,
        path: String,
        mode: u32,
    },
    #[error("{path} at offset {offset} is a {kind} but carries {size} bytes of data")]
    DataOnNonFile {
        offset: usize,
        path: String,
        kind: &'static str,
        size: u32,
    },
    #[error("target of symlink {path} at offset {offset} is not UTF-8")]
    TargetNotUtf8 { offset: usize, path: String },
    #[error(
        "checksum of {path} at offset {offset} is {actual:08X}, the header says {expected:08X}: the data is corrupt"
    )]
    Checksum {
        offset: usize,
        path: String,
        expected: u32,
        actual: u32,
    },
    #[error(
        "cpio header at offset {offset} is not on a 4-byte boundary: \
         the kernel rejects it; pad the previous segment with zeros"
    )]
    Misaligned { offset: usize },
    #[error(
        "{format}-compressed segment at offset {offset}: not supported here; \
         recompress the image with gzip or zstd"
    )]
    Unsupported { offset: usize, format: &'static str },
    #[error("cannot decompress the {compression} segment at offset {offset}")]
    Decompress {
        offset: usize,
        compression: Compression,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the {compression} segment at offset {offset} unpacks past the limit of {limit} bytes; \
         raise it with Reader::max_unpacked if the image is really that large"
    )]
    TooLarge {
        offset: usize,
        compression: Compression,
        limit: u64,
    },
    #[error("in the {compression} segment at offset {offset}")]
    InSegment {
        offset: usize,
        compression: Compression,
        #[source]
        source: Box<ReadError>,
    },
}

/// Reads images with a limit on how much decompression may produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reader {
    max_unpacked: u64,
}

impl Default for Reader {
    fn default() -> Self {
        Self {
            max_unpacked: DEFAULT_MAX_UNPACKED,
        }
    }
}

/// Reads every entry of an image, all segments in order, with the default
/// limits. Later entries for the same path replace earlier ones when the
/// kernel unpacks the image.
pub fn read(bytes: &[u8]) -> Result<Vec<Entry>, ReadError> {
    Reader::new().read(bytes)
}

impl Reader {
    /// A reader with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the most bytes that decompression may produce, all segments
    /// together.
    pub fn max_unpacked(mut self, limit: u64) -> Self {
        self.max_unpacked = limit;
        self
    }

    /// Reads every entry of an image, all segments in order.
    pub fn read(&self, bytes: &[u8]) -> Result<Vec<Entry>, ReadError> {
        Ok(self
            .read_segments(bytes)?
            .into_iter()
            .flat_map(|segment| segment.entries)
            .collect())
    }

    /// Reads an image segment by segment, as the kernel unpacks it: zero
    /// bytes between segments are skipped, an uncompressed archive must
    /// start on a 4-byte boundary of the input (inside a compressed
    /// stream, of the unpacked data), and a compressed stream must unpack
    /// to archives and zero padding only.
    pub fn read_segments(&self, bytes: &[u8]) -> Result<Vec<Segment>, ReadError> {
        let mut segments = Vec::new();
        let mut pos = 0;
        let mut budget = self.max_unpacked;
        loop {
            pos += bytes[pos..].iter().take_while(|&&b| b == 0).count();
            let rest = &bytes[pos..];
            if rest.is_empty() {
                return Ok(segments);
            }
            let format = compress::detect(rest);
            match format {
                Format::Cpio => {
                    if pos % 4 != 0 {
                        return Err(ReadError::Misaligned { offset: pos });
                    }
                    let mut entries = Vec::new();
                    let end = parse_archive(bytes, pos, &mut entries)?;
                    segments.push(Segment {
                        offset: pos,
                        compression: Compression::None,
                        entries,
                    });
                    pos = end;
                }
                Format::Compressed(compression) => {
                    let (data, used) = compress::decompress_one(compression, rest, budget)
                        .map_err(|err| match err {
                            DecompressError::Io(source) => ReadError::Decompress {
                                offset: pos,
                                compression,
                                source,
                            },
                            DecompressError::TooLarge => ReadError::TooLarge {
                                offset: pos,
                                compression,
                                limit: self.max_unpacked,
                            },
                        })?;
                    budget = budget.saturating_sub(data.len() as u64);
                    let mut entries = Vec::new();
                    parse_stream(&data, &mut entries).map_err(|source| ReadError::InSegment {
                        offset: pos,
                        compression,
                        source: Box::new(source),
                    })?;
                    segments.push(Segment {
                        offset: pos,
                        compression,
                        entries,
                    });
                    pos += used;
                }
                Format::Unsupported(format) => {
                    return Err(ReadError::Unsupported {
                        offset: pos,
                        format,
                    });
                }
                Format::Unknown => {
                    return Err(ReadError::BadMagic {
                        offset: pos,
                        found: found_magic(rest),
                    });
                }
            }
        }
    }
}

/// An `ls -l` style listing of entries, one line each, for golden files
/// and for people: `-rwxr-xr-x 0/0 5 bin/bcd`, `lrwxrwxrwx 0/0 7 init ->
/// bin/bcd`, `crw------- 0/0 5,1 dev/console`.
pub fn listing(entries: &[Entry]) -> String {
    let mut out = String::new();
    for entry in entries {
        let size = match entry.node {
            Node::CharDev { major, minor } | Node::BlockDev { major, minor } => {
                format!("{major},{minor}")
            }
            ref node => node.data().len().to_string(),
        };
        let _ = write!(
            out,
            "{} {}/{} {size} {}",
            newc::mode_string(entry.mode()),
            entry.uid,
            entry.gid,
            entry.path
        );
        if let Node::Symlink(target) = &entry.node {
            let _ = write!(out, " -> {target}");
        }
        out.push('\n');
    }
    out
}

fn found_magic(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(6)]).into_owned()
}

fn align4(pos: usize) -> usize {
    pos + newc::pad4(pos)
}

/// Parses unpacked data: archives separated by zero padding, nothing else.
fn parse_stream(data: &[u8], out: &mut Vec<Entry>) -> Result<(), ReadError> {
    let mut pos = 0;
    loop {
        pos += data[pos..].iter().take_while(|&&b| b == 0).count();
        if pos == data.len() {
            return Ok(());
        }
        if pos % 4 != 0 {
            return Err(ReadError::Misaligned { offset: pos });
        }
        pos = parse_archive(data, pos, out)?;
    }
}

/// Parses one archive starting at `pos`, up to and including its trailer;
/// returns the offset after the trailer's padding.
fn parse_archive(data: &[u8], mut pos: usize, out: &mut Vec<Entry>) -> Result<usize, ReadError> {
    loop {
        let offset = pos;
        let rest = data.get(pos..).unwrap_or_default();
        let magic = &rest[..rest.len().min(MAGIC.len())];
        let with_check = if MAGIC.starts_with(magic) {
            false
        } else if MAGIC_CRC.starts_with(magic) {
            true
        } else {
            return Err(ReadError::BadMagic {
                offset,
                found: found_magic(magic),
            });
        };
        let header = rest.get(..HEADER_LEN).ok_or(ReadError::Truncated {
            offset,
            what: "header",
        })?;
        let mut fields = [0u32; 13];
        for (i, value) in fields.iter_mut().enumerate() {
            let at = 6 + 8 * i;
            *value = newc::parse_hex8(&header[at..at + 8]).ok_or(ReadError::BadHex {
                offset: offset + at,
                field: FIELDS[i],
            })?;
        }

        let name_len = fields[field::NAMESIZE] as usize;
        if name_len == 0 {
            return Err(ReadError::EmptyName { offset });
        }
        if name_len > MAX_NAME_LEN {
            return Err(ReadError::NameTooLong {
                offset,
                len: name_len,
            });
        }
        let name_start = offset + HEADER_LEN;
        let name_end = name_start + name_len;
        let name = data.get(name_start..name_end).ok_or(ReadError::Truncated {
            offset,
            what: "name",
        })?;
        let (&last, name) = name.split_last().ok_or(ReadError::EmptyName { offset })?;
        if last != 0 {
            return Err(ReadError::NameNotTerminated { offset });
        }
        if name.contains(&0) {
            return Err(ReadError::NameHasNul { offset });
        }
        let path = std::str::from_utf8(name)
            .map_err(|_| ReadError::NameNotUtf8 { offset })?
            .to_owned();
        pos = align4(name_end);
        if path == TRAILER {
            return Ok(pos.min(data.len()));
        }

        let size = fields[field::FILESIZE];
        let body = pos
            .checked_add(size as usize)
            .ok_or_else(|| ReadError::SizeOverflow {
                offset,
                path: path.clone(),
            })
            .and_then(|end| {
                data.get(pos..end).ok_or(ReadError::Truncated {
                    offset,
                    what: "file data",
                })
            })?;
        pos = align4(pos + body.len());

        let mode = fields[field::MODE];
        let node = match mode & S_IFMT {
            S_IFREG => {
                let sum = body.iter().fold(0u32, |acc, &b| acc.wrapping_add(b.into()));
                if with_check && sum != fields[field::CHECK] {
                    return Err(ReadError::Checksum {
                        offset,
                        path,
                        expected: fields[field::CHECK],
                        actual: sum,
                    });
                }
                Node::File(body.to_vec())
            }
            S_IFLNK => match std::str::from_utf8(body) {
                Ok(target) => Node::Symlink(target.to_owned()),
                Err(_) => return Err(ReadError::TargetNotUtf8 { offset, path }),
            },
            S_IFDIR => Node::Dir,
            S_IFCHR => Node::CharDev {
                major: fields[field::RDEVMAJOR],
                minor: fields[field::RDEVMINOR],
            },
            S_IFBLK => Node::BlockDev {
                major: fields[field::RDEVMAJOR],
                minor: fields[field::RDEVMINOR],
            },
            S_IFIFO => Node::Fifo,
            S_IFSOCK => Node::Socket,
            _ => return Err(ReadError::UnknownType { offset, path, mode }),
        };
        if size != 0 && !matches!(node, Node::File(_) | Node::Symlink(_)) {
            return Err(ReadError::DataOnNonFile {
                offset,
                path,
                kind: node.kind(),
                size,
            });
        }
        out.push(Entry {
            path,
            perm: mode & PERM_MASK,
            node,
            uid: fields[field::UID],
            gid: fields[field::GID],
            mtime: fields[field::MTIME],
            ino: fields[field::INO],
            nlink: fields[field::NLINK],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Archive;

    fn header(magic: &[u8; 6], mode: u32, size: usize, check: u32, name: &str) -> Vec<u8> {
        let mut fields = [0u32; 13];
        fields[field::MODE] = mode;
        fields[field::FILESIZE] = u32::try_from(size).unwrap();
        fields[field::NAMESIZE] = u32::try_from(name.len() + 1).unwrap();
        fields[field::CHECK] = check;
        fields[field::NLINK] = 1;
        let mut out = Vec::new();
        newc::push_header(&mut out, &fields, name);
        out[..6].copy_from_slice(magic);
        out
    }

    fn trailer() -> Vec<u8> {
        header(MAGIC, 0, 0, 0, TRAILER)
    }

    fn small() -> Vec<u8> {
        let mut a = Archive::new();
        a.file("bin/bcd", 0o755, b"agent".to_vec()).unwrap();
        a.symlink("init", "bin/bcd").unwrap();
        a.to_bytes()
    }

    #[test]
    fn reads_crc_archives_and_checks_their_sums() {
        let mut bytes = header(MAGIC_CRC, S_IFREG | 0o644, 3, 0x61 + 0x62 + 0x63, "f");
        newc::push_data(&mut bytes, b"abc");
        bytes.extend(trailer());
        let entries = read(&bytes).unwrap();
        assert_eq!(entries[0].node, Node::File(b"abc".to_vec()));

        let mut bad = header(MAGIC_CRC, S_IFREG | 0o644, 3, 1, "f");
        newc::push_data(&mut bad, b"abc");
        bad.extend(trailer());
        let err = read(&bad).unwrap_err();
        assert!(
            matches!(
                err,
                ReadError::Checksum {
                    expected: 1,
                    actual: 0x126,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn reads_concatenated_archives_with_zero_padding_between() {
        let mut bytes = small();
        bytes.extend([0u8; 12]);
        let mut other = Archive::new();
        other.file("etc/motd", 0o644, b"hi".to_vec()).unwrap();
        bytes.extend(other.to_bytes());
        let segments = Reader::new().read_segments(&bytes).unwrap();
        assert_eq!(segments.len(), 2);
        assert_eq!(segments[1].offset, small().len() + 12);
        let paths: Vec<String> = read(&bytes).unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["bin", "bin/bcd", "init", "etc", "etc/motd"]);
    }

    #[test]
    fn refuses_an_archive_that_does_not_start_on_a_4_byte_boundary() {
        let mut bytes = small();
        bytes.extend([0u8; 3]);
        bytes.extend(small());
        let err = read(&bytes).unwrap_err();
        assert!(matches!(err, ReadError::Misaligned { offset } if offset == small().len() + 3));
    }

    #[test]
    fn reads_compressed_segments_between_plain_ones() {
        let plain = small();
        let mut a = Archive::new();
        a.file("lib/modules/x.ko", 0o644, vec![7; 1000]).unwrap();
        let gz = Compression::Gzip.compress(&a.to_bytes()).unwrap();
        let zst = Compression::Zstd.compress(&plain).unwrap();
        let mut image = plain.clone();
        image.extend(&gz);
        image.extend(&zst);
        image.resize(image.len().next_multiple_of(4) + 8, 0);
        image.extend(&plain);
        let segments = Reader::new().read_segments(&image).unwrap();
        let kinds: Vec<Compression> = segments.iter().map(|s| s.compression).collect();
        assert_eq!(
            kinds,
            [
                Compression::None,
                Compression::Gzip,
                Compression::Zstd,
                Compression::None
            ]
        );
        assert_eq!(segments[1].offset, plain.len());
        assert_eq!(segments[2].offset, plain.len() + gz.len());
        assert_eq!(segments[1].entries[2].node, Node::File(vec![7; 1000]));
        assert_eq!(segments[2].entries, segments[0].entries);

        // Alignment counts from the start of the input, not of the segment.
        let mut bad = gz.clone();
        bad.resize(gz.len().next_multiple_of(4) + 1, 0);
        bad.extend(&plain);
        assert!(matches!(read(&bad), Err(ReadError::Misaligned { .. })));
    }

    #[test]
    fn decompression_stops_at_the_limit() {
        let mut a = Archive::new();
        a.file("zeros", 0o644, vec![0; 1 << 20]).unwrap();
        let gz = Compression::Gzip.compress(&a.to_bytes()).unwrap();
        let err = Reader::new().max_unpacked(4096).read(&gz).unwrap_err();
        assert!(
            matches!(err, ReadError::TooLarge { limit: 4096, .. }),
            "{err}"
        );
        Reader::new().max_unpacked(2 << 20).read(&gz).unwrap();
    }

    #[test]
    fn junk_inside_a_compressed_segment_is_an_error_with_both_offsets() {
        let mut data = small();
        data.extend(b"junk");
        let gz = Compression::Gzip.compress(&data).unwrap();
        let mut image = small();
        image.extend(&gz);
        let err = read(&image).unwrap_err();
        let ReadError::InSegment {
            offset,
            compression,
            source,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!((*offset, *compression), (small().len(), Compression::Gzip));
        assert!(matches!(**source, ReadError::BadMagic { offset, .. } if offset == small().len()));
    }

    #[test]
    fn malformed_headers_give_precise_errors() {
        let good = small();
        let err = |bytes: &[u8]| read(bytes).unwrap_err();

        assert!(matches!(
            err(&good[..50]),
            ReadError::Truncated { what: "header", .. }
        ));
        assert!(matches!(
            err(&good[..112]),
            ReadError::Truncated { what: "name", .. }
        ));

        let mut bad = good.clone();
        bad[5] = b'7';
        assert!(matches!(err(&bad), ReadError::BadMagic { offset: 0, .. }));

        let mut bad = good.clone();
        bad[6 + 8 + 3] = b'x';
        assert!(matches!(
            err(&bad),
            ReadError::BadHex {
                field: "mode",
                offset: 14
            }
        ));

        let mut bad = header(MAGIC, S_IFREG | 0o644, 0, 0, "abc");
        bad[110 + 3] = b'!';
        assert!(matches!(
            err(&bad),
            ReadError::NameNotTerminated { offset: 0 }
        ));

        let mut bad = header(MAGIC, S_IFREG | 0o644, 0, 0, "abc");
        bad[111] = 0;
        assert!(matches!(err(&bad), ReadError::NameHasNul { offset: 0 }));

        let mut bad = header(MAGIC, S_IFREG | 0o644, 0, 0, "abc");
        bad[6 + 8 * 11..6 + 8 * 12].copy_from_slice(b"00000000");
        assert!(matches!(err(&bad), ReadError::EmptyName { offset: 0 }));

        let mut bad = header(MAGIC, S_IFREG | 0o644, 0, 0, "abc");
        bad[6 + 8 * 6..6 + 8 * 7].copy_from_slice(b"FFFFFFFF");
        assert!(matches!(
            err(&bad),
            ReadError::Truncated {
                what: "file data",
                ..
            }
        ));

        let bad = header(MAGIC, 0o644, 0, 0, "typeless");
        assert!(matches!(
            err(&bad),
            ReadError::UnknownType { mode: 0o644, .. }
        ));

        let mut bad = header(MAGIC, S_IFDIR | 0o755, 4, 0, "d");
        newc::push_data(&mut bad, b"data");
        bad.extend(trailer());
        assert!(matches!(
            err(&bad),
            ReadError::DataOnNonFile { size: 4, .. }
        ));

        let mut bad = header(MAGIC, S_IFREG | 0o644, 0, 0, "no-trailer");
        bad.extend(b"\x01");
        assert!(matches!(
            err(&bad),
            ReadError::Truncated { .. } | ReadError::BadMagic { .. }
        ));

        assert!(matches!(
            err(b"\xfd7zXZ\0rest"),
            ReadError::Unsupported { format: "xz", .. }
        ));
        assert!(matches!(err(b"hello world"), ReadError::BadMagic { .. }));
        assert!(matches!(
            err(b"\x1f\x8b\x08\0\0\0"),
            ReadError::Decompress {
                compression: Compression::Gzip,
                ..
            }
        ));
    }

    #[test]
    fn empty_and_all_zero_inputs_hold_no_entries() {
        assert_eq!(read(&[]).unwrap(), []);
        assert_eq!(read(&[0; 1024]).unwrap(), []);
    }

    #[test]
    fn names_with_a_leading_slash_are_returned_as_stored() {
        let mut bytes = header(MAGIC, S_IFDIR | 0o755, 0, 0, "/abs");
        bytes.extend(header(MAGIC, S_IFDIR | 0o755, 0, 0, "."));
        bytes.extend(trailer());
        let paths: Vec<String> = read(&bytes).unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["/abs", "."]);
    }

    #[test]
    fn listing_shows_types_modes_sizes_and_targets() {
        let mut a = Archive::new();
        a.file("bin/bcd", 0o755, b"agent".to_vec()).unwrap();
        a.symlink("init", "bin/bcd").unwrap();
        a.char_dev("dev/console", 0o600, 5, 1).unwrap();
        let text = listing(&read(&a.to_bytes()).unwrap());
        assert_eq!(
            text,
            "drwxr-xr-x 0/0 0 bin\n\
             -rwxr-xr-x 0/0 5 bin/bcd\n\
             drwxr-xr-x 0/0 0 dev\n\
             crw------- 0/0 5,1 dev/console\n\
             lrwxrwxrwx 0/0 7 init -> bin/bcd\n"
        );
    }
}
