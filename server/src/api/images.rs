//! Netboot images: `RegisterImage` (only an image whose manifest verifies
//! against one of the server's image keys, `serve --image-pubkey`, and
//! whose kernel and initrd match it), `ListImages`, `AssignImage` (what a
//! MAC address boots, or the fleet by default, with an optional addition
//! to the kernel command line), `ListBoots`. The boot endpoint that serves
//! them is `boot`; what goes into an image is the `image` crate's.

use bc_store::images::{BootRow, ImageRow, NewImage};
use bcd_proto::v1::{
    AssignImageRequest, AssignImageResponse, BootInfo, ImageInfo, ListBootsRequest,
    ListBootsResponse, ListImagesResponse, RegisterImageRequest,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{status, unavailable};

/// The most an assignment may append to the kernel command line.
const MAX_APPEND: usize = 2048;

/// An assignment target: the fleet default or one MAC address.
pub fn parse_target(t: &str) -> Option<String> {
    if t == "default" {
        return Some(t.to_string());
    }
    let mac = crate::boot::parse::parse_mac(t.strip_prefix("mac:")?)?;
    Some(format!("mac:{mac}"))
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
        assigned_to: i.assigned_to,
    }
}

fn boot_info(b: BootRow) -> BootInfo {
    BootInfo {
        mac: b.mac,
        image_id: b.image_id,
        at_ms: b.at_ms,
        remote: b.remote,
        outcome: b.outcome,
    }
}

pub async fn register(svc: &AdminService, r: RegisterImageRequest) -> Result<ImageInfo, Status> {
    if svc.image_keys.is_empty() {
        return Err(Status::failed_precondition(
            "this server has no image key: start it with --image-pubkey HEX (from images keygen)",
        ));
    }
    let signed = image::SignedManifest::parse(&r.signed_manifest)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let manifest = signed
        .verify(&svc.image_keys)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    for (part, bytes) in [(&manifest.kernel, &r.kernel), (&manifest.initrd, &r.initrd)] {
        part.check(bytes)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    let id = signed
        .id()
        .map_err(|e| Status::invalid_argument(e.to_string()))?
        .0;
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
        .ok_or_else(|| Status::internal("the image just registered is not listed"))
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
    let target = parse_target(&r.target).ok_or_else(|| {
        Status::invalid_argument(format!(
            "{:?} is not a target: use default or mac:52:54:00:12:34:56",
            r.target
        ))
    })?;
    if r.append.len() > MAX_APPEND || r.append.contains(['\n', '\r', '\0']) {
        return Err(Status::invalid_argument(format!(
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
        target,
        append: r.append,
    })
}

pub async fn boots(svc: &AdminService, r: ListBootsRequest) -> Result<ListBootsResponse, Status> {
    let mac =
        if r.mac.is_empty() {
            None
        } else {
            Some(crate::boot::parse::parse_mac(&r.mac).ok_or_else(|| {
                Status::invalid_argument(format!("{:?} is not a MAC address", r.mac))
            })?)
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

    #[test]
    fn targets() {
        assert_eq!(parse_target("default").as_deref(), Some("default"));
        assert_eq!(
            parse_target("mac:52-54-00-12-34-AB").as_deref(),
            Some("mac:52:54:00:12:34:ab")
        );
        assert_eq!(parse_target("52:54:00:12:34:ab"), None);
        assert_eq!(parse_target("node:x"), None);
    }
}
