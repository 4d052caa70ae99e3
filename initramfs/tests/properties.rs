//! Properties: the encoding does not depend on insertion order, what we
//! write reads back unchanged, and the reader never panics.

use initramfs::{Archive, Compression, Node, Reader, read};
use proptest::prelude::*;

/// One call on the builder.
#[derive(Debug, Clone)]
struct Op {
    path: String,
    perm: u32,
    node: Node,
}

fn component() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{1,6}".prop_filter("not . or ..", |c| c != "." && c != "..")
}

fn path() -> impl Strategy<Value = String> {
    (prop::collection::vec(component(), 1..4), any::<bool>()).prop_map(|(parts, slash)| {
        let joined = parts.join("/");
        if slash { format!("/{joined}") } else { joined }
    })
}

fn node() -> impl Strategy<Value = Node> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Node::File),
        3 => Just(Node::Dir),
        2 => "[a-z/._-]{1,16}".prop_map(Node::Symlink),
        1 => (any::<u32>(), any::<u32>()).prop_map(|(major, minor)| Node::CharDev { major, minor }),
        1 => (0u32..4096, 0u32..256).prop_map(|(major, minor)| Node::BlockDev { major, minor }),
        1 => Just(Node::Fifo),
        1 => Just(Node::Socket),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (path(), 0u32..=0o7777, node()).prop_map(|(path, perm, node)| Op { path, perm, node }),
        0..24,
    )
}

/// Applies `ops`, skipping those the builder refuses; returns the archive
/// and the accepted ops.
fn build(ops: &[Op], mtime: u32) -> (Archive, Vec<Op>) {
    let mut archive = Archive::with_mtime(mtime);
    let accepted = ops
        .iter()
        .filter(|op| archive.add(&op.path, op.perm, op.node.clone()).is_ok())
        .cloned()
        .collect();
    (archive, accepted)
}

fn compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Gzip),
        Just(Compression::Zstd)
    ]
}

proptest! {
    #[test]
    fn insertion_order_does_not_change_the_bytes(
        (ops, shuffled) in ops().prop_flat_map(|ops| {
            let (_, accepted) = build(&ops, 0);
            (Just(accepted.clone()), Just(accepted).prop_shuffle())
        }),
        mtime in any::<u32>(),
    ) {
        let (first, _) = build(&ops, mtime);
        let mut second = Archive::with_mtime(mtime);
        for op in &shuffled {
            second.add(&op.path, op.perm, op.node.clone()).unwrap();
        }
        prop_assert_eq!(first.to_bytes(), second.to_bytes());
        for compression in [Compression::Gzip, Compression::Zstd] {
            prop_assert_eq!(
                first.to_compressed(compression).unwrap(),
                second.to_compressed(compression).unwrap()
            );
        }
    }

    #[test]
    fn written_entries_read_back_unchanged(
        ops in ops(),
        mtime in any::<u32>(),
        compression in compression(),
    ) {
        let (archive, _) = build(&ops, mtime);
        let entries = read(&archive.to_compressed(compression).unwrap()).unwrap();
        let read_back: Vec<(&str, u32, &Node)> =
            entries.iter().map(|e| (e.path.as_str(), e.perm, &e.node)).collect();
        let written: Vec<(&str, u32, &Node)> = archive.entries().collect();
        prop_assert_eq!(read_back, written);
        for (i, entry) in entries.iter().enumerate() {
            prop_assert_eq!((entry.uid, entry.gid, entry.mtime), (0, 0, mtime));
            prop_assert_eq!(entry.ino as usize, i + 1);
            prop_assert!(!entry.path.starts_with('/'));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = Reader::new().max_unpacked(1 << 20).read(&bytes);
    }

    #[test]
    fn headers_with_random_fields_never_panic(
        magic in prop_oneof![Just("070701"), Just("070702")],
        fields in "[0-9a-fA-F]{104}",
        tail in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = format!("{magic}{fields}").into_bytes();
        bytes.extend(tail);
        let _ = read(&bytes);
    }

    #[test]
    fn mutated_archives_never_panic(
        ops in ops(),
        compression in compression(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let (archive, _) = build(&ops, 0);
        let mut bytes = archive.to_compressed(compression).unwrap();
        for (index, value) in edits {
            let i = index.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        let _ = Reader::new().max_unpacked(1 << 20).read(&bytes);
    }

    #[test]
    fn concatenated_archives_read_as_one_sequence(
        first in ops(),
        second in ops(),
        c1 in compression(),
        c2 in compression(),
        gap in 0usize..3,
    ) {
        let (a, _) = build(&first, 0);
        let (b, _) = build(&second, 0);
        let mut image = a.to_compressed(c1).unwrap();
        // Uncompressed archives must start on a 4-byte boundary.
        image.resize(image.len().next_multiple_of(4) + 4 * gap, 0);
        image.extend(b.to_compressed(c2).unwrap());
        let mut expected = read(&a.to_bytes()).unwrap();
        expected.extend(read(&b.to_bytes()).unwrap());
        prop_assert_eq!(read(&image).unwrap(), expected);
    }
}
