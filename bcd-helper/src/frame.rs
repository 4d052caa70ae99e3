//! Frames: a 4-byte big-endian length, then that many bytes of one
//! protobuf message.
//!
//! A length over the limit is refused before anything is allocated; a
//! connection that ends inside a frame is an error, one that ends between
//! frames is [`FrameError::Closed`]. The async functions serve the server
//! and [`crate::Client`], the blocking ones [`crate::TpmSession`].

use std::io::{self, Read, Write};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest frame body: room for a CDI spec, never a binary (files the
/// helper installs are staged and named, not sent).
pub const MAX_FRAME: usize = 4 * 1024 * 1024;

/// The largest handshake frame: a Hello is a version and a short name.
pub const MAX_HELLO: usize = 4096;

/// The length prefix.
pub const HEADER: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("the connection ended inside a frame")]
    Truncated,
    #[error("a frame of {len} bytes is over the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("the rest of a frame did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("{what} does not decode")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("socket I/O")]
    Io(#[from] io::Error),
}

/// The length a header announces, refused when over `max`.
pub fn length(header: [u8; HEADER], max: usize) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(len)
}

/// One message in a frame.
pub fn encode<M: prost::Message>(message: &M) -> Result<Vec<u8>, FrameError> {
    let len = message.encoded_len();
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge {
            len,
            max: MAX_FRAME,
        });
    }
    let mut out = Vec::with_capacity(HEADER + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    message
        .encode(&mut out)
        .expect("a Vec grows to hold the message");
    Ok(out)
}

/// Decodes a frame's body as `M`.
pub fn decode<M: prost::Message + Default>(
    what: &'static str,
    body: &[u8],
) -> Result<M, FrameError> {
    M::decode(body).map_err(|source| FrameError::Decode { what, source })
}

/// The first frame in `buf`: its body and the bytes it took, or `None`
/// when `buf` does not hold a whole frame yet.
pub fn split(buf: &[u8], max: usize) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(header) = buf.get(..HEADER) else {
        return Ok(None);
    };
    let len = length([header[0], header[1], header[2], header[3]], max)?;
    Ok(buf
        .get(HEADER..HEADER + len)
        .map(|body| (body, HEADER + len)))
}

/// Reads one frame. Waiting for its first byte is not bounded here (the
/// caller bounds it: a handshake, an idle connection, a reply); the rest
/// must arrive within `rest_within`.
pub async fn read<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    rest_within: Duration,
) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; HEADER];
    let n = r.read(&mut header).await?;
    if n == 0 {
        return Err(FrameError::Closed);
    }
    let body = tokio::time::timeout(rest_within, async {
        if n < HEADER {
            read_exact(r, &mut header[n..]).await?;
        }
        let len = length(header, max)?;
        let mut body = vec![0u8; len];
        read_exact(r, &mut body).await?;
        Ok::<_, FrameError>(body)
    })
    .await
    .map_err(|_| FrameError::Timeout(rest_within))??;
    Ok(body)
}

async fn read_exact<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<(), FrameError> {
    match r.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(FrameError::Truncated),
        Err(e) => Err(FrameError::Io(e)),
    }
}

/// Writes one encoded frame (from [`encode`]) and flushes it.
pub async fn write<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> Result<(), FrameError> {
    w.write_all(frame).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame from a blocking stream (its read timeout bounds each
/// read).
pub fn read_blocking<R: Read>(r: &mut R, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; HEADER];
    let n = loop {
        match r.read(&mut header) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FrameError::Io(e)),
        }
    };
    if n == 0 {
        return Err(FrameError::Closed);
    }
    let exact = |r: &mut R, buf: &mut [u8]| match r.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(FrameError::Truncated),
        Err(e) => Err(FrameError::Io(e)),
    };
    if n < HEADER {
        exact(r, &mut header[n..])?;
    }
    let len = length(header, max)?;
    let mut body = vec![0u8; len];
    exact(r, &mut body)?;
    Ok(body)
}

/// Writes one encoded frame to a blocking stream.
pub fn write_blocking<W: Write>(w: &mut W, frame: &[u8]) -> Result<(), FrameError> {
    w.write_all(frame)?;
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;

    #[test]
    fn a_frame_is_a_length_and_the_message() {
        let hello = wire::Hello {
            version: 7,
            software: "bcd 0.1.0".into(),
        };
        let f = encode(&hello).unwrap();
        assert_eq!(&f[..4], &((f.len() - 4) as u32).to_be_bytes());
        let (body, used) = split(&f, MAX_FRAME).unwrap().unwrap();
        assert_eq!(used, f.len());
        assert_eq!(decode::<wire::Hello>("Hello", body).unwrap(), hello);
        // Not whole yet.
        assert!(split(&f[..f.len() - 1], MAX_FRAME).unwrap().is_none());
        assert!(split(&f[..3], MAX_FRAME).unwrap().is_none());
    }

    #[test]
    fn an_oversized_length_is_refused_before_reading_the_body() {
        let header = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(matches!(
            split(&header, MAX_FRAME),
            Err(FrameError::TooLarge { len, max: MAX_FRAME }) if len == MAX_FRAME + 1
        ));
        assert!(matches!(
            length(u32::MAX.to_be_bytes(), MAX_HELLO),
            Err(FrameError::TooLarge { .. })
        ));
        let big = wire::WriteCdiSpec {
            json: vec![b' '; MAX_FRAME],
        };
        assert!(matches!(encode(&big), Err(FrameError::TooLarge { .. })));
    }

    #[tokio::test]
    async fn reads_frames_split_anywhere_and_tells_closed_from_truncated() {
        let f = encode(&wire::Hello {
            version: 1,
            software: "x".into(),
        })
        .unwrap();
        let (mut a, mut b) = tokio::io::duplex(64);
        let bytes = f.clone();
        let writer = tokio::spawn(async move {
            for chunk in bytes.chunks(1) {
                a.write_all(chunk).await.unwrap();
                a.flush().await.unwrap();
            }
            a.write_all(&bytes[..6]).await.unwrap();
            drop(a);
        });
        let body = read(&mut b, MAX_FRAME, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(body, f[4..]);
        assert!(matches!(
            read(&mut b, MAX_FRAME, Duration::from_secs(5)).await,
            Err(FrameError::Truncated)
        ));
        assert!(matches!(
            read(&mut b, MAX_FRAME, Duration::from_secs(5)).await,
            Err(FrameError::Closed)
        ));
        writer.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_rest_of_a_frame_is_bounded_in_time() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[0, 0, 0, 9, 1]).await.unwrap();
        let r = read(&mut b, MAX_FRAME, Duration::from_secs(10)).await;
        assert!(matches!(r, Err(FrameError::Timeout(d)) if d == Duration::from_secs(10)));
        drop(a);
    }

    #[test]
    fn blocking_reads_agree() {
        let f = encode(&wire::Hello {
            version: 3,
            software: String::new(),
        })
        .unwrap();
        let mut two = f.clone();
        two.extend_from_slice(&f[..5]);
        let mut r = std::io::Cursor::new(two);
        assert_eq!(read_blocking(&mut r, MAX_HELLO).unwrap(), f[4..]);
        assert!(matches!(
            read_blocking(&mut r, MAX_HELLO),
            Err(FrameError::Truncated)
        ));
        assert!(matches!(
            read_blocking(&mut r, MAX_HELLO),
            Err(FrameError::Closed)
        ));
        let mut r = std::io::Cursor::new(vec![0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            read_blocking(&mut r, MAX_HELLO),
            Err(FrameError::TooLarge { .. })
        ));
    }
}
