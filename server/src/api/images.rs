//! Netboot images: `RegisterImage` (only an image whose manifest verifies
//! against one of the server's image keys, `serve --image-pubkey`, and
//! whose kernel and initrd match it), `ListImages`, `AssignImage` (what a
//! MAC address boots, or the fleet by default, with an optional addition
//! to the kernel command line), `ListBoots`. The boot endpoint that serves
//! them is `boot`; what goes into an image is the `image` crate's.

use bc_store::Refusal;
use bc_store::images::{BootRow, ImageRow, NewImage};
use bcd_proto::v1::{
    AssignImageRequest, AssignImageResponse, BootInfo, DefaultTarget, ImageInfo, ImageTarget,
    ListBootsRequest, ListBootsResponse, ListImagesResponse, RegisterImageRequest, image_target,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, status, unavailable};

/// The most an assignment may append to the kernel command line.
const MAX_APPEND: usize = 2048;

/// The store's key of an assignment target (`default`, `mac:<MAC>`), or
/// `None` for a target that names neither (or a MAC that does not parse).
pub fn target_key(t: &ImageTarget) -> Option<String> {
    match t.target.as_ref()? {
        image_target::Target::Default(_) => Some("default".to_string()),
        image_target::Target::Mac(m) => {
            let mac = crate::boot::parse::parse_mac(m)?;
            Some(format!("mac:{mac}"))
        }
    }
}

/// The target a store key names.
pub fn wire_target(key: &str) -> ImageTarget {
    let target = if key == "default" {
        Some(image_target::Target::Default(DefaultTarget {}))
    } else {
        key.strip_prefix("mac:")
            .map(|m| image_target::Target::Mac(m.to_string()))
    };
    ImageTarget { target }
}

fn info(i: ImageRow) -> ImageInfo {
    ImageInfo {
        image_id: i.image_id,
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
        image_id: b.image_id,
        at_ms: b.at_ms,
        remote: b.remote,
        outcome: outcome as i32,
        detail,
    }
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
            image_id: id.clone(),
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
    let target = r
        .target
        .as_ref()
        .and_then(target_key)
        .ok_or_else(|| bad_request("name a target: --default, or --mac 52:54:00:12:34:56"))?;
    if r.append.len() > MAX_APPEND || r.append.contains(['\n', '\r', '\0']) {
        return Err(bad_request(format!(
            "--append takes one line of at most {MAX_APPEND} bytes"
        )));
    }
    let image_id = if r.image.is_empty() {
        None
    } else {
        Some(svc.store.resolve_image(&r.image).await.map_err(status)?)
    };
    svc.store
        .assign_image(&target, image_id.as_deref(), &r.append)
        .await
        .map_err(unavailable)?;
    info!(%target, image = ?image_id, "image assignment changed");
    Ok(AssignImageResponse {
        image_id: image_id.unwrap_or_default(),
        target: Some(wire_target(&target)),
        append: r.append,
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
        for key in ["default", "mac:52:54:00:12:34:ab"] {
            assert_eq!(target_key(&wire_target(key)).as_deref(), Some(key));
        }
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
