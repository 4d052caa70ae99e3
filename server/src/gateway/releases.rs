//! Releases as a gateway hands them to a node, from the store: streamed
//! in chunks ([`stream_release`], `FetchReleaseChunks`), or whole up to
//! [`UNARY_MAX`] for nodes that predate the stream ([`whole_release`],
//! `FetchRelease`). The signed bytes need no key to hand out.

use bc_store::{GatewayStore, Refusal, ReleaseSeq};
use bcd_proto::v1::{FetchReleaseResponse, ReleaseChunk};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::api::status::{refusal, unavailable};

/// The bytes of a release binary in one `ReleaseChunk`.
pub const CHUNK: u32 = 256 << 10;

/// The largest release the deprecated whole-release call hands out.
pub const UNARY_MAX: u64 = 32 << 20;

/// Chunks read ahead of what the peer has taken: with the one being sent,
/// a download holds at most this many and one more in memory.
const AHEAD: usize = 2;

/// A release as a stream for `FetchReleaseChunks`: its signed manifest,
/// then its binary from `offset` in chunks of [`CHUNK`], each read from
/// the store only when the peer has taken the ones before (a download
/// holds a few chunks in memory, never the binary). A release that is not
/// registered is refused before the stream starts; a store failure
/// mid-stream ends it with UNAVAILABLE, and the node resumes from what it
/// has.
pub async fn stream_release(
    store: GatewayStore,
    sequence: ReleaseSeq,
    offset: u64,
) -> Result<ReceiverStream<Result<ReleaseChunk, Status>>, Status> {
    let head = store
        .release_head(sequence)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| not_found(sequence.get()))?;
    if offset > head.size {
        return Err(refusal(Refusal::BadRequest(format!(
            "release {sequence} is {} bytes: a download cannot resume at {offset}",
            head.size
        ))));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(AHEAD);
    tokio::spawn(async move {
        let first = ReleaseChunk {
            signed_manifest: head.signed_manifest,
            ..ReleaseChunk::default()
        };
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        send_chunks(
            &tx,
            offset,
            head.size,
            |at| store.release_chunk(sequence, at, CHUNK),
            |offset, data| ReleaseChunk {
                offset,
                data,
                ..ReleaseChunk::default()
            },
            || not_found(sequence.get()),
        )
        .await;
    });
    Ok(ReceiverStream::new(rx))
}

/// Sends bytes `at..size` of one stored file to `tx` in chunks of at most
/// [`CHUNK`], each read by `read(offset)` only when the peer has taken the
/// ones before and wrapped by `wrap(offset, data)`. A read that finds
/// nothing ends the stream with `missing()`, a store failure with
/// UNAVAILABLE. False when the stream ended early: the peer went away or
/// a read failed.
pub(super) async fn send_chunks<T, R>(
    tx: &tokio::sync::mpsc::Sender<Result<T, Status>>,
    mut at: u64,
    size: u64,
    mut read: impl FnMut(u64) -> R,
    wrap: impl Fn(u64, Vec<u8>) -> T,
    missing: impl Fn() -> Status,
) -> bool
where
    R: std::future::Future<Output = Result<Option<Vec<u8>>, bc_store::StoreError>>,
{
    while at < size {
        let next = match read(at).await {
            Ok(Some(data)) if !data.is_empty() => {
                let len = data.len() as u64;
                Ok((len, wrap(at, data)))
            }
            Ok(_) => Err(missing()),
            Err(e) => Err(unavailable(e)),
        };
        let (sent, failed) = match next {
            Ok((len, chunk)) => {
                at += len;
                (tx.send(Ok(chunk)).await, false)
            }
            Err(status) => (tx.send(Err(status)).await, true),
        };
        if sent.is_err() || failed {
            return false;
        }
    }
    true
}

/// A release whole, for nodes that predate [`stream_release`]: refused
/// past [`UNARY_MAX`], so one call cannot hold a large binary in memory.
pub async fn whole_release(
    store: &GatewayStore,
    sequence: ReleaseSeq,
) -> Result<FetchReleaseResponse, Status> {
    let head = store
        .release_head(sequence)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| not_found(sequence.get()))?;
    if head.size > UNARY_MAX {
        return Err(refusal(Refusal::Conflict(format!(
            "release {sequence} is {} MiB, more than the {} MiB this server hands out in one message: \
             upgrade this node in two steps, first to a release under {} MiB (it downloads releases \
             in chunks), then to release {sequence}",
            head.size >> 20,
            UNARY_MAX >> 20,
            UNARY_MAX >> 20,
        ))));
    }
    let files = store
        .release(sequence)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| not_found(sequence.get()))?;
    Ok(FetchReleaseResponse {
        signed_manifest: files.signed_manifest,
        binary: files.binary,
    })
}

fn not_found(sequence: u64) -> Status {
    refusal(Refusal::NotFound(format!(
        "no release with sequence {sequence}"
    )))
}
