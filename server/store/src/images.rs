//! Netboot images: verified images, their artifacts (kept once per
//! SHA-256), what each MAC address boots, and the boots recorded.
//!
//! The caller verifies an image's signed manifest and its parts before it
//! is registered. An assignment target is `default`, `mac:<address>`,
//! `node:<id>` or `pool:<name>`; a booting MAC resolves to the most
//! specific one ([`resolve`]): its own, else that of the node that
//! reported it, else its pool's (the node's pool, or for a MAC no node in
//! a pool reported, the pool its allow-list entry names), else the
//! default.
//!
//! An assignment may ask the boot endpoint to mint a one-use join token for
//! each script it hands out ([`Assigned::mint_ttl_ms`]), only to MAC
//! addresses on the boot allow-list; at most one such token per MAC is
//! unspent at a time (minting replaces the previous one).

use crate::error::Refusal;
use crate::id::{ImageId, NodeId};

/// Boots kept per MAC address.
pub const BOOTS_KEPT: i64 = 1000;

/// A verified image to register, with its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewImage {
    pub image_id: ImageId,
    pub name: String,
    pub key_id: String,
    pub kernel_version: String,
    pub bcd_version: String,
    pub cmdline: String,
    pub kernel_sha256: String,
    pub kernel_size: u64,
    pub initrd_sha256: String,
    pub initrd_size: u64,
    pub signed_manifest: Vec<u8>,
    pub kernel: Vec<u8>,
    pub initrd: Vec<u8>,
}

/// The columns an [`ImageRow`] is read from, in its order (its assignments
/// are read apart).
pub const IMAGE_COLUMNS: &str = "image_id, name, kernel_version, bcd_version, cmdline, \
     kernel_size, kernel_sha256, initrd_size, initrd_sha256, key_id, registered_at";

/// A registered image, as the store lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRow {
    pub image_id: ImageId,
    pub name: String,
    pub kernel_version: String,
    pub bcd_version: String,
    pub cmdline: String,
    pub kernel_size: u64,
    pub kernel_sha256: String,
    pub initrd_size: u64,
    pub initrd_sha256: String,
    pub key_id: String,
    pub registered_at_ms: i64,
    /// Assignment targets that boot it.
    pub assigned_to: Vec<String>,
}

/// What the boot endpoint needs to answer a MAC address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// The target it was assigned to (`mac:...`, `node:...`, `pool:...`,
    /// `default`).
    pub target: String,
    pub image_id: ImageId,
    pub signed_manifest: Vec<u8>,
    pub append: String,
    /// Set: the boot endpoint mints a one-use join token living this long
    /// for each script (to allowed MAC addresses only).
    pub mint_ttl_ms: Option<i64>,
}

/// What the store knows of a booting MAC address: the node that reported
/// it (not deleted), and its pool: the node's, else the pool of the MAC's
/// allow-list entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MacOwner {
    pub node_id: Option<NodeId>,
    pub pool: Option<String>,
}

/// The assignment targets that may answer `mac`, most specific first: the
/// MAC's own, the node's that reported it, its pool's, the default.
pub fn boot_targets(mac: &str, owner: &MacOwner) -> Vec<String> {
    let mut t = vec![format!("mac:{mac}")];
    if let Some(node) = &owner.node_id {
        t.push(format!("node:{node}"));
    }
    if let Some(pool) = &owner.pool {
        t.push(format!("pool:{pool}"));
    }
    t.push("default".to_string());
    t
}

/// What `mac` boots among `found` (assignments keyed by target): the one
/// of the most specific target [`boot_targets`] names.
pub fn resolve<T>(mac: &str, owner: &MacOwner, found: Vec<(String, T)>) -> Option<T> {
    let mut found = found;
    for target in boot_targets(mac, owner) {
        if let Some(i) = found.iter().position(|(t, _)| *t == target) {
            return Some(found.swap_remove(i).1);
        }
    }
    None
}

/// A MAC address on the boot allow-list: the boot endpoint mints join
/// tokens for it (into `pool`, else the assignment's pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedMac {
    pub mac: String,
    pub pool: Option<String>,
    pub added_at_ms: i64,
}

/// A join token the boot endpoint minted for a MAC address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minted {
    pub expires_at_ms: i64,
    pub pool: Option<String>,
    /// Unspent tokens minted for the MAC before, now deleted (0 or 1).
    pub replaced: u64,
}

/// The pool the boot endpoint mints a token into for an assignment to
/// `target` (when the allow-list names none): the pool assigned to.
pub fn mint_pool(target: &str) -> Option<String> {
    target.strip_prefix("pool:").map(str::to_string)
}

/// The description of a token minted for `mac`.
pub fn minted_description(mac: &str) -> String {
    format!("minted by the boot endpoint for MAC {mac}")
}

/// A pool's name: 1 to 63 of `a-z 0-9 - _ .`, starting with a letter or
/// digit.
pub fn valid_pool(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// A request for a boot script, to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootRecord {
    pub mac: String,
    pub image_id: Option<ImageId>,
    pub remote: String,
    pub outcome: String,
}

/// A recorded boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootRow {
    pub mac: String,
    /// Empty when no image was served.
    pub image_id: ImageId,
    pub at_ms: i64,
    pub remote: String,
    pub outcome: String,
}

/// 64 lowercase hex digits: an image id or an artifact's name.
pub fn valid_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// How an operator named an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// A whole image id.
    Id(String),
    /// A name; also an id prefix when it is 6 or more hex digits.
    Name {
        name: String,
        prefix: Option<String>,
    },
}

pub fn image_ref(what: &str) -> ImageRef {
    if valid_sha256(what) {
        return ImageRef::Id(what.to_string());
    }
    let prefix = (what.len() >= 6 && what.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| what.to_ascii_lowercase());
    ImageRef::Name {
        name: what.to_string(),
        prefix,
    }
}

pub fn no_such_image(what: &str) -> Refusal {
    Refusal::NotFound(format!("no image {what}: see better-compute images list"))
}

/// The one image a prefix names.
pub fn by_prefix(what: &str, ids: Vec<String>) -> Result<String, Refusal> {
    match ids.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(no_such_image(what)),
        _ => Err(Refusal::NotFound(format!(
            "{what} names {} images: give more of the id",
            ids.len()
        ))),
    }
}

pub fn no_image_named(what: &str) -> Refusal {
    Refusal::NotFound(format!(
        "no image named {what}: give an image id (6 or more hex digits) or a name from better-compute images list"
    ))
}

/// A MAC address in the form the store keeps: six lowercase hex pairs
/// joined by `:`. Accepts `:` or `-` separators, `%3A` escapes and upper
/// case, as iPXE's `${net0/mac}` and `${net0/mac:hexhyp}` give them.
pub fn parse_mac(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut out = Vec::with_capacity(6);
    for p in parts {
        if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        out.push(p.to_ascii_lowercase());
    }
    Some(out.join(":"))
}

/// The most MAC addresses a node may report (at join, or in its host
/// inventory).
pub const MAX_MACS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_boots_its_own_then_its_nodes_then_its_pools_then_the_default() {
        let mac = "52:54:00:12:34:56";
        let owner = MacOwner {
            node_id: Some("nd-1".into()),
            pool: Some("gpu".into()),
        };
        let all = || {
            vec![
                ("default".to_string(), 'd'),
                ("pool:gpu".to_string(), 'p'),
                ("node:nd-1".to_string(), 'n'),
                (format!("mac:{mac}"), 'm'),
                ("node:nd-2".to_string(), 'x'),
                ("pool:cpu".to_string(), 'y'),
            ]
        };
        assert_eq!(resolve(mac, &owner, all()), Some('m'));
        let without = |t: &str| {
            all()
                .into_iter()
                .filter(|(k, _)| k != t)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            resolve(mac, &owner, without(&format!("mac:{mac}"))),
            Some('n')
        );
        let no_mac_no_node: Vec<_> = without(&format!("mac:{mac}"))
            .into_iter()
            .filter(|(k, _)| k != "node:nd-1")
            .collect();
        assert_eq!(resolve(mac, &owner, no_mac_no_node.clone()), Some('p'));
        // A node in no pool, or a MAC no node reported, skips to the default.
        let poolless = MacOwner {
            pool: None,
            ..owner.clone()
        };
        assert_eq!(resolve(mac, &poolless, no_mac_no_node.clone()), Some('d'));
        assert_eq!(
            resolve(mac, &MacOwner::default(), without(&format!("mac:{mac}"))),
            Some('d')
        );
        // A MAC no node reported boots the pool its allow-list entry names.
        let allowed = MacOwner {
            node_id: None,
            pool: Some("gpu".into()),
        };
        assert_eq!(resolve(mac, &allowed, no_mac_no_node.clone()), Some('p'));
        assert_eq!(
            boot_targets(mac, &allowed),
            [format!("mac:{mac}"), "pool:gpu".into(), "default".into()]
        );
        // Another node's or pool's assignment never answers.
        assert_eq!(
            resolve(
                mac,
                &MacOwner::default(),
                vec![
                    ("node:nd-2".to_string(), 'x'),
                    ("pool:gpu".to_string(), 'y')
                ]
            ),
            None
        );
        assert_eq!(
            boot_targets(mac, &owner),
            [
                format!("mac:{mac}"),
                "node:nd-1".into(),
                "pool:gpu".into(),
                "default".into()
            ]
        );
    }

    #[test]
    fn minted_tokens_go_into_the_pool_assigned_to() {
        assert_eq!(mint_pool("pool:gpu").as_deref(), Some("gpu"));
        assert_eq!(mint_pool("node:nd-1"), None);
        assert_eq!(mint_pool("default"), None);
    }

    #[test]
    fn pool_names() {
        for ok in ["gpu", "rack-1", "a", "h100.west_2"] {
            assert!(valid_pool(ok), "{ok}");
        }
        for bad in ["", "-gpu", "GPU", "a b", "x:y", &"a".repeat(64)] {
            assert!(!valid_pool(bad), "{bad}");
        }
    }

    #[test]
    fn images_are_named_by_id_name_or_prefix() {
        assert_eq!(image_ref(&"a".repeat(64)), ImageRef::Id("a".repeat(64)));
        assert_eq!(
            image_ref("ABCDEF"),
            ImageRef::Name {
                name: "ABCDEF".into(),
                prefix: Some("abcdef".into())
            }
        );
        assert_eq!(
            image_ref("bcd-node"),
            ImageRef::Name {
                name: "bcd-node".into(),
                prefix: None
            }
        );
        assert!(!valid_sha256(&"A".repeat(64)));
        assert_eq!(by_prefix("abcdef", vec!["x".into()]), Ok("x".into()));
        assert!(by_prefix("abcdef", vec![]).is_err());
        assert!(matches!(
            by_prefix("abcdef", vec!["x".into(), "y".into()]),
            Err(Refusal::NotFound(m)) if m.contains("names 2 images")
        ));
    }
}
