//! Big-endian reading and writing of TPM structures: the few primitives the
//! parsers of peer input and the key templates need. The reader never
//! panics: every read checks its bounds and reports where it stopped.

use std::fmt;

/// A structure from a peer (or a TPM) that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// What was being read ("TPMT_PUBLIC", "TPMS_ATTEST", ...).
    pub what: &'static str,
    /// Byte offset in the input where the problem was found.
    pub offset: usize,
    /// What is wrong there.
    pub reason: String,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}: {}", self.what, self.offset, self.reason)
    }
}

impl std::error::Error for Malformed {}

/// A cursor over bytes from outside the process.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    what: &'static str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(what: &'static str, buf: &'a [u8]) -> Self {
        Reader { what, buf, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn error(&self, reason: impl Into<String>) -> Malformed {
        Malformed {
            what: self.what,
            offset: self.pos,
            reason: reason.into(),
        }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(self.error(format!("needs {n} more bytes, has {left}")));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Malformed> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Malformed> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Malformed> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A TPM2B: a 16-bit size, then that many bytes, at most `max`.
    pub(crate) fn tpm2b(&mut self, max: usize) -> Result<&'a [u8], Malformed> {
        let size = usize::from(self.u16()?);
        if size > max {
            self.pos -= 2;
            return Err(self.error(format!("size {size} is over the limit of {max}")));
        }
        self.bytes(size)
    }

    /// Fails unless every byte was read.
    pub(crate) fn finish(&self) -> Result<(), Malformed> {
        let left = self.buf.len() - self.pos;
        if left != 0 {
            return Err(self.error(format!("{left} bytes after the end")));
        }
        Ok(())
    }
}

/// Appends big-endian values to a byte vector.
pub(crate) trait Put {
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_tpm2b(&mut self, data: &[u8]);
}

impl Put for Vec<u8> {
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_be_bytes());
    }

    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_be_bytes());
    }

    fn put_tpm2b(&mut self, data: &[u8]) {
        let size = u16::try_from(data.len()).unwrap_or(u16::MAX);
        self.put_u16(size);
        self.extend_from_slice(&data[..usize::from(size)]);
    }
}

/// Wraps `inner` in a TPM2B (16-bit size prefix).
pub(crate) fn tpm2b(inner: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(inner.len() + 2);
    out.put_tpm2b(inner);
    out
}

/// The payload of a TPM2B that must span all of `buf`.
pub(crate) fn tpm2b_payload<'a>(
    what: &'static str,
    buf: &'a [u8],
    max: usize,
) -> Result<&'a [u8], Malformed> {
    let mut r = Reader::new(what, buf);
    let inner = r.tpm2b(max)?;
    r.finish()?;
    Ok(inner)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_reports_where_it_stopped() {
        let mut r = Reader::new("T", &[0, 5, 1, 2]);
        let err = r.tpm2b(64).unwrap_err();
        assert_eq!(err.offset, 2);
        assert!(err.reason.contains("needs 5 more bytes"), "{err}");

        let mut r = Reader::new("T", &[0, 70]);
        let err = r.tpm2b(64).unwrap_err();
        assert_eq!(err.offset, 0);
        assert!(err.reason.contains("over the limit"), "{err}");

        let mut r = Reader::new("T", &[0, 1, 9, 4]);
        assert_eq!(r.tpm2b(64).unwrap(), &[9]);
        assert_eq!(r.finish().unwrap_err().reason, "1 bytes after the end");
    }

    #[test]
    fn tpm2b_round_trip() {
        let wrapped = tpm2b(b"abc");
        assert_eq!(wrapped, [0, 3, b'a', b'b', b'c']);
        assert_eq!(tpm2b_payload("T", &wrapped, 8).unwrap(), b"abc");
        assert!(tpm2b_payload("T", &wrapped[..4], 8).is_err());
    }
}
