//! Finding a filesystem by its label without udev or blkid: the ext2/3/4
//! superblock names its volume, and the kernel lists block devices under
//! `/sys/class/block`.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the superblock starts on an ext2/3/4 filesystem.
const SUPERBLOCK: usize = 1024;
/// `s_magic`, little-endian, at this offset in the superblock.
const MAGIC_AT: usize = 0x38;
const EXT_MAGIC: u16 = 0xEF53;
/// `s_volume_name`: 16 bytes, NUL-padded.
const LABEL_AT: usize = 0x78;
const LABEL_LEN: usize = 16;
/// Bytes to read from a device to know its label.
pub const PROBE_LEN: usize = SUPERBLOCK + LABEL_AT + LABEL_LEN;

/// The label of an ext2/3/4 filesystem whose first bytes are `head`; `None`
/// for anything else (or no label).
pub fn ext_label(head: &[u8]) -> Option<String> {
    let sb = head.get(SUPERBLOCK..PROBE_LEN)?;
    let magic = u16::from_le_bytes([sb[MAGIC_AT], sb[MAGIC_AT + 1]]);
    if magic != EXT_MAGIC {
        return None;
    }
    let raw = &sb[LABEL_AT..LABEL_AT + LABEL_LEN];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(LABEL_LEN);
    let label = std::str::from_utf8(&raw[..end]).ok()?;
    (!label.is_empty()).then(|| label.to_string())
}

/// The block devices under `sys` (`<sys>/class/block/*`) whose ext label is
/// `label`, as paths under `dev`, sorted.
pub fn find(sys: &Path, dev: &Path, label: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(sys.join("class/block")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        // Loop and RAM disks never hold the state partition.
        .filter(|n| !n.starts_with("loop") && !n.starts_with("ram"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| dev.join(n))
        .filter(|path| {
            let mut head = vec![0u8; PROBE_LEN];
            std::fs::File::open(path)
                .and_then(|mut f| f.read_exact(&mut head))
                .is_ok()
                && ext_label(&head).as_deref() == Some(label)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn superblock(label: &[u8]) -> Vec<u8> {
        let mut head = vec![0u8; 4096];
        head[SUPERBLOCK + MAGIC_AT..SUPERBLOCK + MAGIC_AT + 2]
            .copy_from_slice(&EXT_MAGIC.to_le_bytes());
        head[SUPERBLOCK + LABEL_AT..SUPERBLOCK + LABEL_AT + label.len()].copy_from_slice(label);
        head
    }

    #[test]
    fn reads_the_label_of_an_ext_superblock() {
        assert_eq!(
            ext_label(&superblock(b"bcd-state")).as_deref(),
            Some("bcd-state")
        );
        assert_eq!(
            ext_label(&superblock(b"sixteen-bytes-xx")).as_deref(),
            Some("sixteen-bytes-xx")
        );
        assert_eq!(ext_label(&superblock(b"")), None);
        let mut not_ext = superblock(b"bcd-state");
        not_ext[SUPERBLOCK + MAGIC_AT] = 0;
        assert_eq!(ext_label(&not_ext), None);
        assert_eq!(ext_label(&[0u8; 100]), None);
    }

    #[test]
    fn finds_devices_by_label_under_a_sys_and_dev_tree() {
        let d = tempfile::tempdir().unwrap();
        let (sys, dev) = (d.path().join("sys"), d.path().join("dev"));
        std::fs::create_dir_all(sys.join("class/block")).unwrap();
        std::fs::create_dir_all(&dev).unwrap();
        for (name, content) in [
            ("vda", superblock(b"root")),
            ("vdb", superblock(b"bcd-state")),
            ("loop0", superblock(b"bcd-state")),
            ("vdc", vec![1u8; 10]),
        ] {
            std::fs::create_dir(sys.join("class/block").join(name)).unwrap();
            std::fs::write(dev.join(name), content).unwrap();
        }
        assert_eq!(find(&sys, &dev, "bcd-state"), vec![dev.join("vdb")]);
        assert!(find(&sys, &dev, "other").is_empty());
        assert!(find(&d.path().join("none"), &dev, "root").is_empty());
    }

    proptest! {
        #[test]
        fn any_bytes_are_read_without_panicking(head in proptest::collection::vec(any::<u8>(), 0..1300)) {
            let _ = ext_label(&head);
        }

        #[test]
        fn every_label_reads_back(label in "[a-zA-Z0-9_.-]{1,16}") {
            prop_assert_eq!(ext_label(&superblock(label.as_bytes())), Some(label));
        }
    }
}
