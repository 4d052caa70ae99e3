//! The in-memory archive and its reproducible newc encoding.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;

use crate::compress::Compression;
use crate::newc::{self, MAX_NAME_LEN, Node, PERM_MASK, TRAILER, field};

/// Mode given to directories created because a path below them was added.
pub const IMPLICIT_DIR_PERM: u32 = 0o755;

/// The archive ends padded with zeros to a multiple of this many bytes, as
/// GNU cpio and the kernel's `gen_init_cpio` leave theirs.
pub const BLOCK_LEN: usize = 512;

/// Why an entry could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("empty path {0:?}: name a path inside the archive, such as bin/bcd")]
    EmptyPath(String),
    #[error("path {0:?} contains \"..\": give the path from the archive root without \"..\"")]
    DotDot(String),
    #[error("path {0:?} contains a NUL byte")]
    Nul(String),
    #[error("path {0:?} is not valid UTF-8: rename it, archives hold UTF-8 names only")]
    NotUtf8(String),
    #[error("path {path} is {len} bytes long; the kernel unpacks names up to {max} bytes")]
    TooLong {
        path: String,
        len: usize,
        max: usize,
    },
    #[error("mode {mode:o} of {path} has bits outside 7777: pass permission bits only")]
    BadMode { path: String, mode: u32 },
    #[error("symlink {path} has an empty or NUL-containing target {target:?}")]
    BadTarget { path: String, target: String },
    #[error("file {path} is {len} bytes; a newc member holds at most 4 GiB - 1")]
    FileTooLarge { path: String, len: usize },
    #[error("cannot add {path}: its parent {parent} is a {kind} in the archive, not a directory")]
    ParentNotDir {
        path: String,
        parent: String,
        kind: &'static str,
    },
    #[error(
        "cannot add {path} as a {new}: it is already in the archive as a {existing}; \
         add each path once, or again with the same type, mode and content"
    )]
    Conflict {
        path: String,
        existing: String,
        new: String,
    },
}

/// A path inside the archive, ordered component by component so that a
/// directory comes right before everything below it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key(String);

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.split('/').cmp(other.0.split('/'))
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    perm: u32,
    node: Node,
    /// False for a directory that exists only because something below it
    /// was added; an explicit `dir` call may still set its mode.
    explicit: bool,
}

impl Item {
    fn describe(&self) -> String {
        let Item {
            perm,
            node,
            explicit,
        } = self;
        match node {
            Node::File(data) => format!("regular file of {} bytes, mode {perm:04o}", data.len()),
            Node::Dir if !explicit => "directory created as a parent".to_owned(),
            Node::Symlink(target) => format!("symlink to {target}"),
            Node::CharDev { major, minor } | Node::BlockDev { major, minor } => {
                format!("{} {major}:{minor}, mode {perm:04o}", node.kind())
            }
            Node::Dir | Node::Fifo | Node::Socket => format!("{}, mode {perm:04o}", node.kind()),
        }
    }
}

/// An initramfs being built in memory.
///
/// Entries are keyed by path; the encoding ([`Archive::to_bytes`]) depends
/// only on the set of entries and the archive's `mtime`, never on the order
/// in which they were added.
///
/// ```
/// use initramfs::{Archive, Compression};
///
/// let mut archive = Archive::new();
/// archive.file("/bin/bcd", 0o755, b"\x7fELF...".to_vec())?;
/// archive.symlink("init", "bin/bcd")?;
/// archive.char_dev("dev/console", 0o600, 5, 1)?;
/// let initrd = archive.to_compressed(Compression::Gzip)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Archive {
    mtime: u32,
    items: BTreeMap<Key, Item>,
}

impl Archive {
    /// An empty archive whose entries carry mtime 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty archive whose entries carry `mtime` (seconds since the
    /// epoch), for builds that honour `SOURCE_DATE_EPOCH`.
    pub fn with_mtime(mtime: u32) -> Self {
        Self {
            mtime,
            items: BTreeMap::new(),
        }
    }

    /// The modification time written into every entry.
    pub fn mtime(&self) -> u32 {
        self.mtime
    }

    /// Sets the modification time written into every entry.
    pub fn set_mtime(&mut self, mtime: u32) {
        self.mtime = mtime;
    }

    /// Number of entries, directories created as parents included.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing has been added.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The entry at `path`: its permission bits and node.
    pub fn get(&self, path: impl AsRef<Path>) -> Option<(u32, &Node)> {
        let key = normalize(path.as_ref()).ok()?;
        self.items
            .get(&Key(key))
            .map(|item| (item.perm, &item.node))
    }

    /// True when `path` is in the archive.
    pub fn contains(&self, path: impl AsRef<Path>) -> bool {
        self.get(path).is_some()
    }

    /// Entries in output order: `(path, permission bits, node)`.
    pub fn entries(&self) -> impl Iterator<Item = (&str, u32, &Node)> {
        self.items
            .iter()
            .map(|(key, item)| (key.0.as_str(), item.perm, &item.node))
    }

    /// Adds a regular file.
    pub fn file(
        &mut self,
        path: impl AsRef<Path>,
        perm: u32,
        data: impl Into<Vec<u8>>,
    ) -> Result<(), BuildError> {
        self.add(path, perm, Node::File(data.into()))
    }

    /// Adds a directory, or sets the mode of one created as a parent.
    pub fn dir(&mut self, path: impl AsRef<Path>, perm: u32) -> Result<(), BuildError> {
        self.add(path, perm, Node::Dir)
    }

    /// Adds a symbolic link; its mode is always 0777.
    pub fn symlink(
        &mut self,
        path: impl AsRef<Path>,
        target: impl AsRef<Path>,
    ) -> Result<(), BuildError> {
        let target = target.as_ref();
        let target = target
            .to_str()
            .ok_or_else(|| BuildError::NotUtf8(lossy(target)))?;
        self.add(path, 0o777, Node::Symlink(target.to_owned()))
    }

    /// Adds a character device node.
    pub fn char_dev(
        &mut self,
        path: impl AsRef<Path>,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), BuildError> {
        self.add(path, perm, Node::CharDev { major, minor })
    }

    /// Adds a block device node.
    pub fn block_dev(
        &mut self,
        path: impl AsRef<Path>,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), BuildError> {
        self.add(path, perm, Node::BlockDev { major, minor })
    }

    /// Adds a named pipe.
    pub fn fifo(&mut self, path: impl AsRef<Path>, perm: u32) -> Result<(), BuildError> {
        self.add(path, perm, Node::Fifo)
    }

    /// Adds any node at `path` with permission bits `perm` (at most 0o7777).
    ///
    /// The path may start with `/` or `./`; it is stored relative to the
    /// archive root. Missing parents are added as directories with mode
    /// 0755. Adding an identical entry again does nothing; adding a
    /// different one at the same path is an error, except that an explicit
    /// directory may set the mode of a directory created as a parent. On
    /// error the archive is unchanged.
    pub fn add(&mut self, path: impl AsRef<Path>, perm: u32, node: Node) -> Result<(), BuildError> {
        let path = normalize(path.as_ref())?;
        let perm = match node {
            Node::Symlink(_) => 0o777,
            _ => perm,
        };
        if perm & !PERM_MASK != 0 {
            return Err(BuildError::BadMode { path, mode: perm });
        }
        match &node {
            Node::Symlink(target) if target.is_empty() || target.contains('\0') => {
                return Err(BuildError::BadTarget {
                    path,
                    target: target.clone(),
                });
            }
            Node::File(data) if u32::try_from(data.len()).is_err() => {
                return Err(BuildError::FileTooLarge {
                    len: data.len(),
                    path,
                });
            }
            _ => {}
        }

        // Check everything before changing anything.
        let parents: Vec<Key> = parents(&path)
            .into_iter()
            .map(|parent| Key(parent.to_owned()))
            .collect();
        for parent in &parents {
            if let Some(item) = self.items.get(parent)
                && item.node != Node::Dir
            {
                return Err(BuildError::ParentNotDir {
                    path,
                    parent: parent.0.clone(),
                    kind: item.node.kind(),
                });
            }
        }
        let new = Item {
            perm,
            node,
            explicit: true,
        };
        let key = Key(path);
        let replace = match self.items.get(&key) {
            None => true,
            Some(old) if old.node == Node::Dir && new.node == Node::Dir && !old.explicit => true,
            Some(old) if *old == new => false,
            Some(old) => {
                return Err(BuildError::Conflict {
                    path: key.0,
                    existing: old.describe(),
                    new: new.describe(),
                });
            }
        };

        for parent in parents {
            self.items.entry(parent).or_insert_with(|| Item {
                perm: IMPLICIT_DIR_PERM,
                node: Node::Dir,
                explicit: false,
            });
        }
        if replace {
            self.items.insert(key, new);
        }
        Ok(())
    }

    /// Encodes the archive: entries sorted by path, inode numbers counted
    /// from 1 in that order, uid and gid 0, this archive's mtime, then the
    /// trailer, zero-padded to a multiple of [`BLOCK_LEN`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut subdirs: HashMap<&str, u32> = HashMap::new();
        for (key, item) in &self.items {
            if item.node == Node::Dir
                && let Some(parent) = parents(&key.0).last()
            {
                *subdirs.entry(parent).or_default() += 1;
            }
        }
        let size = self
            .items
            .iter()
            .map(|(key, item)| newc::HEADER_LEN + key.0.len() + 8 + item.node.data().len())
            .sum::<usize>();
        let mut out = Vec::with_capacity(size + BLOCK_LEN);
        for (ino, (key, item)) in (1u32..).zip(&self.items) {
            let data = item.node.data();
            let (rdev_major, rdev_minor) = item.node.rdev();
            let mut fields = [0u32; 13];
            fields[field::INO] = ino;
            fields[field::MODE] = item.node.type_bits() | item.perm;
            fields[field::NLINK] = match item.node {
                Node::Dir => 2 + subdirs.get(key.0.as_str()).copied().unwrap_or(0),
                _ => 1,
            };
            fields[field::MTIME] = self.mtime;
            // `add` refuses data longer than u32::MAX.
            fields[field::FILESIZE] = u32::try_from(data.len()).unwrap_or(u32::MAX);
            fields[field::RDEVMAJOR] = rdev_major;
            fields[field::RDEVMINOR] = rdev_minor;
            fields[field::NAMESIZE] = name_size(&key.0);
            newc::push_header(&mut out, &fields, &key.0);
            newc::push_data(&mut out, data);
        }
        let mut fields = [0u32; 13];
        fields[field::NLINK] = 1;
        fields[field::NAMESIZE] = name_size(TRAILER);
        newc::push_header(&mut out, &fields, TRAILER);
        let tail = (BLOCK_LEN - out.len() % BLOCK_LEN) % BLOCK_LEN;
        out.resize(out.len() + tail, 0);
        out
    }

    /// Encodes the archive into `writer`.
    pub fn write_to(&self, mut writer: impl io::Write) -> io::Result<()> {
        writer.write_all(&self.to_bytes())
    }

    /// Encodes and compresses the archive.
    pub fn to_compressed(&self, compression: Compression) -> io::Result<Vec<u8>> {
        compression.compress(&self.to_bytes())
    }
}

/// `namesize`: the name and its NUL. Names are at most [`MAX_NAME_LEN`].
fn name_size(name: &str) -> u32 {
    u32::try_from(name.len() + 1).unwrap_or(u32::MAX)
}

fn lossy(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The path relative to the archive root, with empty and `.` components
/// dropped: `/bin//./bcd` becomes `bin/bcd`.
pub(crate) fn normalize(path: &Path) -> Result<String, BuildError> {
    let text = path
        .to_str()
        .ok_or_else(|| BuildError::NotUtf8(lossy(path)))?;
    if text.contains('\0') {
        return Err(BuildError::Nul(text.to_owned()));
    }
    let mut parts = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(BuildError::DotDot(text.to_owned())),
            part => parts.push(part),
        }
    }
    if parts.is_empty() {
        return Err(BuildError::EmptyPath(text.to_owned()));
    }
    let joined = parts.join("/");
    if joined.len() + 1 > MAX_NAME_LEN {
        return Err(BuildError::TooLong {
            len: joined.len(),
            path: joined,
            max: MAX_NAME_LEN - 1,
        });
    }
    Ok(joined)
}

/// Every proper ancestor of a normalized path, outermost first:
/// `a/b/c` gives `a`, `a/b`.
fn parents(path: &str) -> Vec<&str> {
    path.match_indices('/').map(|(i, _)| &path[..i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::newc::{S_IFDIR, S_IFREG};
    use crate::reader;

    fn sample() -> Archive {
        let mut a = Archive::new();
        a.file("bin/bcd", 0o755, b"agent".to_vec()).unwrap();
        a.symlink("init", "bin/bcd").unwrap();
        a.dir("/etc", 0o700).unwrap();
        a.file("./etc/bcd/config.toml", 0o600, b"x = 1\n".to_vec())
            .unwrap();
        a.char_dev("dev/console", 0o600, 5, 1).unwrap();
        a.block_dev("dev/vda", 0o660, 253, 0).unwrap();
        a.fifo("run/initctl", 0o600).unwrap();
        a
    }

    #[test]
    fn paths_are_normalized_and_parents_added() {
        let a = sample();
        let paths: Vec<&str> = a.entries().map(|(p, _, _)| p).collect();
        assert_eq!(
            paths,
            [
                "bin",
                "bin/bcd",
                "dev",
                "dev/console",
                "dev/vda",
                "etc",
                "etc/bcd",
                "etc/bcd/config.toml",
                "init",
                "run",
                "run/initctl"
            ]
        );
        assert_eq!(a.get("/etc"), Some((0o700, &Node::Dir)));
        assert_eq!(a.get("etc/bcd"), Some((IMPLICIT_DIR_PERM, &Node::Dir)));
        assert_eq!(
            a.get("init"),
            Some((0o777, &Node::Symlink("bin/bcd".into())))
        );
    }

    #[test]
    fn directories_sort_before_siblings_that_share_a_prefix() {
        let mut a = Archive::new();
        a.file("a-b", 0o644, Vec::new()).unwrap();
        a.file("a/b", 0o644, Vec::new()).unwrap();
        a.file("a.b", 0o644, Vec::new()).unwrap();
        let paths: Vec<&str> = a.entries().map(|(p, _, _)| p).collect();
        assert_eq!(paths, ["a", "a/b", "a-b", "a.b"]);
    }

    #[test]
    fn invalid_paths_are_refused() {
        let mut a = Archive::new();
        for path in ["", "/", ".", "./", "//"] {
            assert!(
                matches!(
                    a.file(path, 0o644, Vec::new()),
                    Err(BuildError::EmptyPath(_))
                ),
                "{path:?}"
            );
        }
        assert!(matches!(
            a.file("bin/../etc/passwd", 0o644, Vec::new()),
            Err(BuildError::DotDot(_))
        ));
        assert!(matches!(
            a.file("a\0b", 0o644, Vec::new()),
            Err(BuildError::Nul(_))
        ));
        assert!(matches!(
            a.file("x".repeat(MAX_NAME_LEN), 0o644, Vec::new()),
            Err(BuildError::TooLong { .. })
        ));
        a.file("x".repeat(MAX_NAME_LEN - 1), 0o644, Vec::new())
            .unwrap();
        assert!(matches!(
            a.file("f", 0o100_644, Vec::new()),
            Err(BuildError::BadMode { .. })
        ));
        assert!(matches!(
            a.symlink("l", ""),
            Err(BuildError::BadTarget { .. })
        ));
    }

    #[test]
    fn conflicting_duplicates_are_refused_and_leave_the_archive_unchanged() {
        let mut a = sample();
        let before = a.clone();
        let err = a.dir("bin/bcd", 0o755).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot add bin/bcd as a directory, mode 0755: it is already in the archive as a \
             regular file of 5 bytes, mode 0755; add each path once, or again with the same \
             type, mode and content"
        );
        assert!(matches!(
            a.file("bin/bcd", 0o755, b"other".to_vec()),
            Err(BuildError::Conflict { .. })
        ));
        assert!(matches!(
            a.file("bin/bcd", 0o700, b"agent".to_vec()),
            Err(BuildError::Conflict { .. })
        ));
        assert!(matches!(
            a.symlink("init", "sbin/init"),
            Err(BuildError::Conflict { .. })
        ));
        assert!(matches!(
            a.dir("etc", 0o755),
            Err(BuildError::Conflict { .. })
        ));
        assert!(matches!(
            a.file("etc/bcd", 0o644, Vec::new()),
            Err(BuildError::Conflict { .. })
        ));
        let err = a.file("init/x", 0o644, Vec::new()).unwrap_err();
        assert_eq!(
            err,
            BuildError::ParentNotDir {
                path: "init/x".into(),
                parent: "init".into(),
                kind: "symlink"
            }
        );
        assert!(matches!(
            a.file("bin/bcd/x/y", 0o644, Vec::new()),
            Err(BuildError::ParentNotDir { .. })
        ));
        assert_eq!(a, before);
        // The same entry again is accepted.
        a.file("bin/bcd", 0o755, b"agent".to_vec()).unwrap();
        a.symlink("/init", "bin/bcd").unwrap();
        a.dir("etc", 0o700).unwrap();
        assert_eq!(a, before);
    }

    #[test]
    fn an_explicit_directory_sets_the_mode_of_an_implicit_one_in_either_order() {
        let mut first = Archive::new();
        first.file("usr/bin/x", 0o755, Vec::new()).unwrap();
        first.dir("usr", 0o555).unwrap();
        let mut second = Archive::new();
        second.dir("usr", 0o555).unwrap();
        second.file("usr/bin/x", 0o755, Vec::new()).unwrap();
        assert_eq!(first.to_bytes(), second.to_bytes());
        assert_eq!(first.get("usr"), Some((0o555, &Node::Dir)));
    }

    #[test]
    fn encoding_has_fixed_metadata_and_a_padded_trailer() {
        let mut a = Archive::with_mtime(1_700_000_000);
        a.file("bin/x", 0o755, b"hello".to_vec()).unwrap();
        a.dir("bin/sub", 0o755).unwrap();
        let bytes = a.to_bytes();
        assert_eq!(bytes.len() % BLOCK_LEN, 0);
        let entries = reader::read(&bytes).unwrap();
        assert_eq!(entries.len(), 3);
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(e.ino, u32::try_from(i + 1).unwrap());
            assert_eq!((e.uid, e.gid, e.mtime), (0, 0, 1_700_000_000));
        }
        assert_eq!(entries[0].path, "bin");
        assert_eq!(entries[0].mode(), S_IFDIR | 0o755);
        assert_eq!(entries[0].nlink, 3, "bin has one subdirectory");
        assert_eq!(entries[1].path, "bin/sub");
        assert_eq!(entries[1].nlink, 2);
        assert_eq!(entries[2].mode(), S_IFREG | 0o755);
        assert_eq!(entries[2].nlink, 1);
        assert_eq!(entries[2].node, Node::File(b"hello".to_vec()));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("TRAILER!!!"));
        assert!(!text.contains("/bin"), "names carry no leading slash");
    }

    #[test]
    fn empty_archive_is_just_the_trailer() {
        let bytes = Archive::new().to_bytes();
        assert_eq!(bytes.len(), BLOCK_LEN);
        assert!(bytes.starts_with(b"070701"));
        assert_eq!(reader::read(&bytes).unwrap(), []);
    }
}
