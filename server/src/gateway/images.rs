//! Netboot images as a gateway hands them to a node for `boot.kexec` by
//! image id (`FetchImage`), from the store: the signed manifest as it was
//! registered, then the kernel and the initrd in chunks. The gateway holds
//! no key and vouches for nothing: the node verifies the manifest against
//! the image keys it learned at join, and both files against the manifest.

use bc_store::{GatewayStore, ImageId, Refusal};
use bcd_proto::v1::{ImageChunk, ImagePart};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::releases::{CHUNK, send_chunks};
use crate::api::status::{refusal, unavailable};

/// Chunks read ahead of what the peer has taken.
const AHEAD: usize = 2;

/// Image `image_id` (a whole id) as a stream for `FetchImage`: its signed
/// manifest, then its kernel and its initrd, each in chunks of [`CHUNK`]
/// read from the store only when the peer has taken the ones before. An
/// image that is not registered is refused before the stream starts; a
/// store failure mid-stream ends it with UNAVAILABLE.
pub async fn stream_image(
    store: GatewayStore,
    image_id: &str,
) -> Result<ReceiverStream<Result<ImageChunk, Status>>, Status> {
    if !bc_store::images::valid_sha256(image_id) {
        return Err(refusal(Refusal::BadRequest(format!(
            "{image_id:?} is not an image id (64 lowercase hex digits)"
        ))));
    }
    let (row, signed_manifest) = store
        .image(&ImageId::from(image_id))
        .await
        .map_err(unavailable)?
        .ok_or_else(|| not_found(image_id))?;
    let parts = [
        (ImagePart::Kernel, row.kernel_sha256, row.kernel_size),
        (ImagePart::Initrd, row.initrd_sha256, row.initrd_size),
    ];
    let id = image_id.to_string();
    let (tx, rx) = tokio::sync::mpsc::channel(AHEAD);
    tokio::spawn(async move {
        let first = ImageChunk {
            signed_manifest,
            ..ImageChunk::default()
        };
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        for (part, sha256, size) in parts {
            let whole = send_chunks(
                &tx,
                0,
                size,
                |at| store.image_artifact_chunk(&sha256, at, CHUNK),
                |offset, data| ImageChunk {
                    part: part as i32,
                    offset,
                    data,
                    ..ImageChunk::default()
                },
                || not_found(&id),
            )
            .await;
            if !whole {
                return;
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

fn not_found(image_id: &str) -> Status {
    refusal(Refusal::NotFound(format!(
        "no image {image_id}: see better-compute images list"
    )))
}
