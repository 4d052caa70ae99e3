//! Netboot images: verified images, their artifacts (kept once per
//! SHA-256), what each MAC address boots, and the boots recorded.
//!
//! The caller verifies an image's signed manifest and its parts before it
//! is registered. An assignment target is `default` or `mac:<address>`; a
//! MAC's own assignment wins over the default.

use crate::error::Refusal;

/// Boots kept per MAC address.
pub const BOOTS_KEPT: i64 = 1000;

/// A verified image to register, with its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewImage {
    pub image_id: String,
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

/// A registered image, as the store lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRow {
    pub image_id: String,
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
    pub image_id: String,
    pub signed_manifest: Vec<u8>,
    pub append: String,
}

/// A request for a boot script, to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootRecord {
    pub mac: String,
    pub image_id: Option<String>,
    pub remote: String,
    pub outcome: String,
}

/// A recorded boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootRow {
    pub mac: String,
    /// Empty when no image was served.
    pub image_id: String,
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

#[cfg(test)]
mod tests {
    use super::*;

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
