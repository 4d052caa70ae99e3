//! The cpio "newc" format: the header layout and the file types it carries.
//!
//! A newc member is a 110-byte ASCII header (the magic and thirteen 8-digit
//! hexadecimal fields), the NUL-terminated name padded to a multiple of four
//! bytes counted from the start of the header, then the data padded to a
//! multiple of four. The archive ends with a member named `TRAILER!!!`.

use std::fmt;

/// Magic of the newc format without checksums (SVR4 "new ASCII").
pub const MAGIC: &[u8; 6] = b"070701";
/// Magic of the newc format whose `check` field holds the sum of the data bytes.
pub const MAGIC_CRC: &[u8; 6] = b"070702";
/// Name of the member that ends an archive.
pub const TRAILER: &str = "TRAILER!!!";
/// Length of a header: the magic and thirteen fields of eight hex digits.
pub const HEADER_LEN: usize = 110;
/// The longest name the kernel unpacks, its NUL included (`PATH_MAX`).
pub const MAX_NAME_LEN: usize = 4096;

pub(crate) const S_IFMT: u32 = 0o170_000;
pub(crate) const S_IFSOCK: u32 = 0o140_000;
pub(crate) const S_IFLNK: u32 = 0o120_000;
pub(crate) const S_IFREG: u32 = 0o100_000;
pub(crate) const S_IFBLK: u32 = 0o060_000;
pub(crate) const S_IFDIR: u32 = 0o040_000;
pub(crate) const S_IFCHR: u32 = 0o020_000;
pub(crate) const S_IFIFO: u32 = 0o010_000;

/// Permission bits, set-id and sticky bits included.
pub const PERM_MASK: u32 = 0o7777;

/// The header fields after the magic, in their order on disk.
pub(crate) const FIELDS: [&str; 13] = [
    "ino",
    "mode",
    "uid",
    "gid",
    "nlink",
    "mtime",
    "filesize",
    "devmajor",
    "devminor",
    "rdevmajor",
    "rdevminor",
    "namesize",
    "check",
];

/// Indexes into [`FIELDS`].
pub(crate) mod field {
    pub const INO: usize = 0;
    pub const MODE: usize = 1;
    pub const UID: usize = 2;
    pub const GID: usize = 3;
    pub const NLINK: usize = 4;
    pub const MTIME: usize = 5;
    pub const FILESIZE: usize = 6;
    pub const RDEVMAJOR: usize = 9;
    pub const RDEVMINOR: usize = 10;
    pub const NAMESIZE: usize = 11;
    pub const CHECK: usize = 12;
}

/// What an archive member is, with its content.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Node {
    /// A regular file and its bytes.
    File(Vec<u8>),
    /// A directory.
    Dir,
    /// A symbolic link and its target, stored as the member's data.
    Symlink(String),
    /// A character device node.
    CharDev { major: u32, minor: u32 },
    /// A block device node.
    BlockDev { major: u32, minor: u32 },
    /// A named pipe.
    Fifo,
    /// A unix socket (the kernel creates it with mknod).
    Socket,
}

impl Node {
    /// The `S_IFMT` bits of this node's mode.
    pub fn type_bits(&self) -> u32 {
        match self {
            Node::File(_) => S_IFREG,
            Node::Dir => S_IFDIR,
            Node::Symlink(_) => S_IFLNK,
            Node::CharDev { .. } => S_IFCHR,
            Node::BlockDev { .. } => S_IFBLK,
            Node::Fifo => S_IFIFO,
            Node::Socket => S_IFSOCK,
        }
    }

    /// What kind of node this is, in words.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::File(_) => "regular file",
            Node::Dir => "directory",
            Node::Symlink(_) => "symlink",
            Node::CharDev { .. } => "character device",
            Node::BlockDev { .. } => "block device",
            Node::Fifo => "fifo",
            Node::Socket => "socket",
        }
    }

    /// The bytes stored after the name: file content or symlink target.
    pub fn data(&self) -> &[u8] {
        match self {
            Node::File(data) => data,
            Node::Symlink(target) => target.as_bytes(),
            _ => &[],
        }
    }

    /// Device numbers for device nodes, `(0, 0)` for anything else.
    pub fn rdev(&self) -> (u32, u32) {
        match *self {
            Node::CharDev { major, minor } | Node::BlockDev { major, minor } => (major, minor),
            _ => (0, 0),
        }
    }
}

impl fmt::Debug for Node {
    /// File contents are summarised by their length: archives hold megabytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::File(data) => write!(f, "File({} bytes)", data.len()),
            Node::Dir => f.write_str("Dir"),
            Node::Symlink(target) => write!(f, "Symlink({target:?})"),
            Node::CharDev { major, minor } => write!(f, "CharDev({major}:{minor})"),
            Node::BlockDev { major, minor } => write!(f, "BlockDev({major}:{minor})"),
            Node::Fifo => f.write_str("Fifo"),
            Node::Socket => f.write_str("Socket"),
        }
    }
}

/// Bytes of zero padding that bring `len` to a multiple of four.
pub(crate) fn pad4(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Appends one header, its name (NUL added) and the name's padding.
pub(crate) fn push_header(out: &mut Vec<u8>, fields: &[u32; 13], name: &str) {
    let start = out.len();
    out.extend_from_slice(MAGIC);
    for value in fields {
        out.extend_from_slice(format!("{value:08X}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    let written = out.len() - start;
    out.resize(out.len() + pad4(written), 0);
}

/// Appends data and its padding.
pub(crate) fn push_data(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(data);
    out.resize(out.len() + pad4(data.len()), 0);
}

/// Parses eight ASCII hex digits, either case; `None` for anything else.
pub(crate) fn parse_hex8(digits: &[u8]) -> Option<u32> {
    if digits.len() != 8 {
        return None;
    }
    digits.iter().try_fold(0u32, |acc, &b| {
        let digit = char::from(b).to_digit(16)?;
        Some((acc << 4) | digit)
    })
}

/// Human-readable `ls -l` style type and permission string, e.g. `drwxr-xr-x`.
pub(crate) fn mode_string(mode: u32) -> String {
    let kind = match mode & S_IFMT {
        S_IFDIR => 'd',
        S_IFLNK => 'l',
        S_IFCHR => 'c',
        S_IFBLK => 'b',
        S_IFIFO => 'p',
        S_IFSOCK => 's',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    let bit = |mask: u32, c: char| if mode & mask != 0 { c } else { '-' };
    let special = |exec: bool, set: bool, on: char, off: char| match (exec, set) {
        (true, true) => on,
        (false, true) => off,
        (true, false) => 'x',
        (false, false) => '-',
    };
    s.push(bit(0o400, 'r'));
    s.push(bit(0o200, 'w'));
    s.push(special(mode & 0o100 != 0, mode & 0o4000 != 0, 's', 'S'));
    s.push(bit(0o040, 'r'));
    s.push(bit(0o020, 'w'));
    s.push(special(mode & 0o010 != 0, mode & 0o2000 != 0, 's', 'S'));
    s.push(bit(0o004, 'r'));
    s.push(bit(0o002, 'w'));
    s.push(special(mode & 0o001 != 0, mode & 0o1000 != 0, 't', 'T'));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_fields_parse_both_cases_and_reject_everything_else() {
        assert_eq!(parse_hex8(b"0000abCD"), Some(0xabcd));
        assert_eq!(parse_hex8(b"FFFFFFFF"), Some(u32::MAX));
        assert_eq!(parse_hex8(b"0000000g"), None);
        assert_eq!(parse_hex8(b"+0000001"), None);
        assert_eq!(parse_hex8(b" 0000001"), None);
        assert_eq!(parse_hex8(b"0000001"), None);
    }

    #[test]
    fn header_is_110_bytes_and_name_padding_counts_from_the_header() {
        let mut out = Vec::new();
        push_header(&mut out, &[0; 13], "ab");
        // 110 + "ab\0" = 113, padded to 116.
        assert_eq!(out.len(), 116);
        assert_eq!(&out[..6], MAGIC);
        assert_eq!(&out[110..116], b"ab\0\0\0\0");
        let mut out = Vec::new();
        push_header(&mut out, &[0; 13], "a");
        assert_eq!(out.len(), 112, "110 + \"a\\0\" is already aligned");
    }

    #[test]
    fn mode_strings_match_ls() {
        assert_eq!(mode_string(S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(S_IFREG | 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(S_IFDIR | 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(S_IFLNK | 0o777), "lrwxrwxrwx");
        assert_eq!(mode_string(S_IFCHR | 0o600), "crw-------");
        assert_eq!(mode_string(S_IFREG | 0o2644), "-rw-r-Sr--");
    }
}
