//! Netboot images: `RegisterImage` (only an image whose manifest verifies
//! against one of the server's image keys, `serve --image-pubkey`, and
//! whose kernel and initrd match it), `ListImages`, `AssignImage` (what a
//! MAC address boots, or the fleet by default, with an optional addition
//! to the kernel command line), `ListBoots`. The boot endpoint that serves
//! them is `boot`; what goes into an image is the `image` crate's.

use bc_store::ImageId;
use bc_store::Refusal;
use bc_store::images::valid_pool;
use bc_store::images::{BootRow, ImageRow, NewImage};
use bcd_proto::v1::{
    self, AssignImageRequest, AssignImageResponse, BootInfo, BootMac, DefaultTarget, ImageInfo,
    ImageTarget, ListBootMacsResponse, ListBootsRequest, ListBootsResponse, ListImagesResponse,
    RegisterImageRequest, SetBootMacRequest, image_target,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, status, unavailable};

/// The most an assignment may append to the kernel command line.
const MAX_APPEND: usize = 2048;

/// The longest a minted join token may live.
pub const MAX_MINT_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The store's key of an assignment target (`default`, `mac:<MAC>`,
/// `node:<id>`, `pool:<name>`), or `None` for a target that names none (or
/// a MAC, node id or pool name that does not parse).
pub fn target_key(t: &ImageTarget) -> Option<String> {
    match t.target.as_ref()? {
        image_target::Target::Default(_) => Some("default".to_string()),
        image_target::Target::Mac(m) => {
            let mac = crate::boot::parse::parse_mac(m)?;
            Some(format!("mac:{mac}"))
        }
        image_target::Target::Node(n) => valid_pool(n).then(|| format!("node:{n}")),
        image_target::Target::Pool(p) => valid_pool(p).then(|| format!("pool:{p}")),
    }
}

/// The target a store key names.
pub fn wire_target(key: &str) -> ImageTarget {
    use image_target::Target;
    let target = if key == "default" {
        Some(Target::Default(DefaultTarget {}))
    } else if let Some(m) = key.strip_prefix("mac:") {
        Some(Target::Mac(m.to_string()))
    } else if let Some(n) = key.strip_prefix("node:") {
        Some(Target::Node(n.to_string()))
    } else {
        key.strip_prefix("pool:")
            .map(|p| Target::Pool(p.to_string()))
    };
    ImageTarget { target }
}

/// Whether a kernel command line addition carries a join token.
pub fn carries_token(append: &str) -> bool {
    append
        .split_whitespace()
        .any(|w| w.trim_start_matches('"').starts_with("bcd.token="))
}

fn info(i: ImageRow) -> ImageInfo {
    ImageInfo {
        image_id: i.image_id.into_string(),
        name: i.name,
        kernel_version: i.kernel_version,
        bcd_version: i.bcd_version,
        cmdline: i.cmdline,
        kernel_size: i.kernel_size,
        kernel_sha256: i.kernel_sha256,
        initrd_size: i.initrd_size,
        initrd_sha256: i.initrd_sha256,
        key_id: i.key_id,
        registered_at_ms: i.registered_at_ms,
        assigned_to: i.assigned_to.iter().map(|t| wire_target(t)).collect(),
    }
}

fn boot_info(b: BootRow) -> BootInfo {
    let (outcome, detail) = crate::boot::outcome(&b.outcome);
    BootInfo {
        mac: b.mac,
        image_id: b.image_id.into_string(),
        at_ms: b.at_ms,
        remote: b.remote,
        outcome: outcome as i32,
        detail,
    }
}

/// `UploadImage`: the signed manifest first, verified before a byte of a
/// part is kept, then the kernel's and the initrd's bytes in order, each
/// held to the size the manifest signs; then as [`register`].
pub async fn upload(
    svc: &AdminService,
    mut parts: tonic::Streaming<v1::ImageUpload>,
) -> Result<ImageInfo, Status> {
    use v1::image_upload::Part;
    let first = parts.message().await?.map(|m| m.part);
    let Some(Some(Part::SignedManifest(signed_manifest))) = first else {
        return Err(bad_request(
            "an image upload starts with its signed manifest (manifest.json from images build)",
        ));
    };
    if svc.image_keys.is_empty() {
        return Err(refusal(Refusal::Conflict(
            "this server has no image key: start it with --image-pubkey HEX (from images keygen)"
                .into(),
        )));
    }
    let manifest = image::SignedManifest::parse(&signed_manifest)
        .and_then(|s| s.verify(&svc.image_keys))
        .map_err(|e| bad_request(e.to_string()))?;
    let (mut kernel, mut initrd) = (Vec::new(), Vec::new());
    while let Some(m) = parts.message().await? {
        let (into, bytes, name, size) = match m.part {
            Some(Part::Kernel(_)) if !initrd.is_empty() => {
                return Err(bad_request(
                    "the kernel's bytes come before the initrd's in an image upload",
                ));
            }
            Some(Part::Kernel(b)) => (&mut kernel, b, "kernel", manifest.kernel.size),
            Some(Part::Initrd(b)) => (&mut initrd, b, "initrd", manifest.initrd.size),
            Some(Part::SignedManifest(_)) | None => {
                return Err(bad_request(
                    "an image upload has one manifest, first; then kernel and initrd bytes",
                ));
            }
        };
        if (into.len() + bytes.len()) as u64 > size {
            return Err(bad_request(format!(
                "more {name} bytes than the signed manifest's {size}: the files are not the \
                 ones images build signed"
            )));
        }
        into.extend_from_slice(&bytes);
    }
    register(
        svc,
        RegisterImageRequest {
            signed_manifest,
            kernel,
            initrd,
        },
    )
    .await
}

pub async fn register(svc: &AdminService, r: RegisterImageRequest) -> Result<ImageInfo, Status> {
    if svc.image_keys.is_empty() {
        return Err(refusal(Refusal::Conflict(
            "this server has no image key: start it with --image-pubkey HEX (from images keygen)"
                .into(),
        )));
    }
    let signed =
        image::SignedManifest::parse(&r.signed_manifest).map_err(|e| bad_request(e.to_string()))?;
    let manifest = signed
        .verify(&svc.image_keys)
        .map_err(|e| bad_request(e.to_string()))?;
    for (part, bytes) in [(&manifest.kernel, &r.kernel), (&manifest.initrd, &r.initrd)] {
        part.check(bytes).map_err(|e| bad_request(e.to_string()))?;
    }
    let id = signed.id().map_err(|e| bad_request(e.to_string()))?.0;
    let created = svc
        .store
        .register_image(&NewImage {
            image_id: ImageId::from(id.clone()),
            name: manifest.name.clone(),
            key_id: signed.key_id.clone(),
            kernel_version: manifest.kernel_version,
            bcd_version: manifest.bcd_version,
            cmdline: manifest.cmdline,
            kernel_sha256: manifest.kernel.sha256,
            kernel_size: manifest.kernel.size,
            initrd_sha256: manifest.initrd.sha256,
            initrd_size: manifest.initrd.size,
            signed_manifest: r.signed_manifest,
            kernel: r.kernel,
            initrd: r.initrd,
        })
        .await
        .map_err(unavailable)?;
    info!(image = %id, name = %manifest.name, created, "image registered");
    let images = svc.store.list_images().await.map_err(unavailable)?;
    images
        .into_iter()
        .find(|i| i.image_id == id)
        .map(info)
        .ok_or_else(|| {
            refusal(Refusal::Internal(
                "the image just registered is not listed".into(),
            ))
        })
}

pub async fn list(svc: &AdminService) -> Result<ListImagesResponse, Status> {
    let images = svc.store.list_images().await.map_err(unavailable)?;
    Ok(ListImagesResponse {
        images: images.into_iter().map(info).collect(),
    })
}

pub async fn assign(
    svc: &AdminService,
    r: AssignImageRequest,
) -> Result<AssignImageResponse, Status> {
    let target = r.target.as_ref().and_then(target_key).ok_or_else(|| {
        bad_request(
            "name a target: --default, --mac 52:54:00:12:34:56, --node NODE_ID or --pool NAME \
                 (node ids and pool names: a-z, 0-9, '-', '_', '.')",
        )
    })?;
    if r.append.len() > MAX_APPEND || r.append.contains(['\n', '\r', '\0']) {
        return Err(bad_request(format!(
            "--append takes one line of at most {MAX_APPEND} bytes"
        )));
    }
    let mint_ttl_ms = match r.join_token_ttl_ms {
        0 => None,
        ms if ms < 1000 || ms > MAX_MINT_TTL.as_millis() as u64 => {
            return Err(bad_request(
                "--join-token-ttl takes 1s to 24h: minted tokens are short-lived",
            ));
        }
        _ if carries_token(&r.append) => {
            return Err(bad_request(
                "the boot endpoint mints the token for this assignment: drop bcd.token= from \
                 --append",
            ));
        }
        ms => Some(ms as i64),
    };
    let image_id = if r.image.is_empty() {
        None
    } else {
        Some(svc.store.resolve_image(&r.image).await.map_err(status)?)
    };
    svc.store
        .assign_image(&target, image_id.as_ref(), &r.append, mint_ttl_ms)
        .await
        .map_err(unavailable)?;
    info!(%target, image = ?image_id, ?mint_ttl_ms, "image assignment changed");
    Ok(AssignImageResponse {
        image_id: image_id.unwrap_or_default().into_string(),
        target: Some(wire_target(&target)),
        append: r.append,
        join_token_ttl_ms: mint_ttl_ms.unwrap_or(0) as u64,
    })
}

pub async fn set_boot_mac(
    svc: &AdminService,
    r: SetBootMacRequest,
) -> Result<ListBootMacsResponse, Status> {
    let mac = crate::boot::parse::parse_mac(&r.mac).ok_or_else(|| {
        bad_request(format!(
            "{:?} is not a MAC address: give six hex pairs (52:54:00:12:34:56)",
            r.mac.chars().take(40).collect::<String>()
        ))
    })?;
    if r.allowed {
        let pool = super::tokens::pool_name(&r.pool)?;
        svc.store
            .allow_boot_mac(&mac, pool.as_deref())
            .await
            .map_err(unavailable)?;
        info!(%mac, ?pool, "MAC address allowed to boot with a minted token");
    } else {
        let was = svc
            .store
            .disallow_boot_mac(&mac)
            .await
            .map_err(unavailable)?;
        if !was {
            return Err(refusal(Refusal::NotFound(format!(
                "{mac} is not on the boot allow-list: see better-compute images allowed-macs"
            ))));
        }
        info!(%mac, "MAC address taken off the boot allow-list");
    }
    boot_macs(svc).await
}

pub async fn boot_macs(svc: &AdminService) -> Result<ListBootMacsResponse, Status> {
    let macs = svc.store.boot_macs().await.map_err(unavailable)?;
    Ok(ListBootMacsResponse {
        macs: macs
            .into_iter()
            .map(|m| BootMac {
                mac: m.mac,
                pool: m.pool.unwrap_or_default(),
                added_at_ms: m.added_at_ms,
            })
            .collect(),
    })
}

pub async fn boots(svc: &AdminService, r: ListBootsRequest) -> Result<ListBootsResponse, Status> {
    let mac = if r.mac.is_empty() {
        None
    } else {
        Some(
            crate::boot::parse::parse_mac(&r.mac)
                .ok_or_else(|| bad_request(format!("{:?} is not a MAC address", r.mac)))?,
        )
    };
    let limit = if r.limit == 0 {
        100
    } else {
        r.limit.min(10_000)
    };
    let boots = svc
        .store
        .boots(mac.as_deref(), limit)
        .await
        .map_err(unavailable)?;
    Ok(ListBootsResponse {
        boots: boots.into_iter().map(boot_info).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_proto::v1;

    fn mac(m: &str) -> ImageTarget {
        ImageTarget {
            target: Some(image_target::Target::Mac(m.into())),
        }
    }

    #[test]
    fn targets() {
        let default = ImageTarget {
            target: Some(image_target::Target::Default(DefaultTarget {})),
        };
        assert_eq!(target_key(&default).as_deref(), Some("default"));
        assert_eq!(
            target_key(&mac("52-54-00-12-34-AB")).as_deref(),
            Some("mac:52:54:00:12:34:ab")
        );
        assert_eq!(target_key(&mac("node:x")), None);
        assert_eq!(target_key(&ImageTarget { target: None }), None);
        let node = |n: &str| ImageTarget {
            target: Some(image_target::Target::Node(n.into())),
        };
        let pool = |p: &str| ImageTarget {
            target: Some(image_target::Target::Pool(p.into())),
        };
        assert_eq!(
            target_key(&node("nd-0f3a")).as_deref(),
            Some("node:nd-0f3a")
        );
        assert_eq!(target_key(&pool("gpu")).as_deref(), Some("pool:gpu"));
        assert_eq!(target_key(&pool("a b")), None);
        assert_eq!(target_key(&node("")), None);
        for key in [
            "default",
            "mac:52:54:00:12:34:ab",
            "node:nd-0f3a",
            "pool:gpu",
        ] {
            assert_eq!(target_key(&wire_target(key)).as_deref(), Some(key));
        }
    }

    #[test]
    fn literal_tokens_are_found_in_an_append() {
        assert!(carries_token("bcd.state=x bcd.token=bct1.a.b"));
        assert!(carries_token("\"bcd.token=x\""));
        assert!(!carries_token("bcd.state=bcd.token"));
        assert!(!carries_token(""));
    }

    #[test]
    fn boot_outcomes_are_recorded_and_read_back_typed() {
        for (o, d) in [
            (v1::BootOutcome::Script, ""),
            (v1::BootOutcome::NoImage, ""),
            (v1::BootOutcome::Refused, "the signature does not verify"),
        ] {
            assert_eq!(
                crate::boot::outcome(&crate::boot::record(o, d)),
                (o, d.to_string())
            );
        }
        assert_eq!(
            crate::boot::outcome("no image"),
            (v1::BootOutcome::NoImage, String::new()),
            "as rows were written before"
        );
    }
}
