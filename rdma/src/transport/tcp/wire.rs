//! Frame headers, fixed-size and little-endian. A request is a header, the
//! segment name (or notification topic), then the payload of a WRITE or a
//! notification; a response is a header, then the bytes of a READ.

use std::io::{self, BufRead, BufReader, IoSlice, Read, Write};
use std::net::TcpStream;

pub const REQUEST_HEADER: usize = 35;
pub const RESPONSE_HEADER: usize = 33;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Describe = 1,
    Read = 2,
    Write = 3,
    Notify = 4,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Describe,
            2 => Self::Read,
            3 => Self::Write,
            4 => Self::Notify,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub kind: Kind,
    pub name_len: u16,
    pub id: u64,
    pub version: u64,
    pub offset: u64,
    pub len: u64,
}

impl RequestHeader {
    pub fn encode(&self, name: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(REQUEST_HEADER + name.len());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.name_len.to_le_bytes());
        for v in [self.id, self.version, self.offset, self.len] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(name);
        out
    }

    /// `Ok(None)` on a clean end of stream before a header.
    pub fn read(r: &mut impl Read) -> io::Result<Option<Self>> {
        let mut b = [0u8; REQUEST_HEADER];
        if !read_or_eof(r, &mut b)? {
            return Ok(None);
        }
        let kind = Kind::from_u8(b[0]).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown request kind {}", b[0]),
            )
        })?;
        Ok(Some(Self {
            kind,
            name_len: u16::from_le_bytes([b[1], b[2]]),
            id: u64_at(&b, 3),
            version: u64_at(&b, 11),
            offset: u64_at(&b, 19),
            len: u64_at(&b, 27),
        }))
    }
}

/// Response status codes; `a` and `b` carry the numbers each one needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Describe: a = version, b = length, with writability in `len` (0/1).
    Ok = 0,
    UnknownSegment = 1,
    /// a = current version.
    StaleVersion = 2,
    /// a = segment length.
    OutOfBounds = 3,
    ReadOnly = 4,
    /// The request itself was unacceptable (an oversized notification).
    Refused = 5,
}

impl Status {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Ok,
            1 => Self::UnknownSegment,
            2 => Self::StaleVersion,
            3 => Self::OutOfBounds,
            4 => Self::ReadOnly,
            5 => Self::Refused,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHeader {
    pub id: u64,
    pub status: u8,
    pub a: u64,
    pub b: u64,
    pub len: u64,
}

impl ResponseHeader {
    pub fn encode(&self) -> [u8; RESPONSE_HEADER] {
        let mut out = [0u8; RESPONSE_HEADER];
        out[..8].copy_from_slice(&self.id.to_le_bytes());
        out[8] = self.status;
        out[9..17].copy_from_slice(&self.a.to_le_bytes());
        out[17..25].copy_from_slice(&self.b.to_le_bytes());
        out[25..33].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    pub fn read(r: &mut impl Read) -> io::Result<Option<Self>> {
        let mut b = [0u8; RESPONSE_HEADER];
        if !read_or_eof(r, &mut b)? {
            return Ok(None);
        }
        Ok(Some(Self {
            id: u64_at(&b, 0),
            status: b[8],
            a: u64_at(&b, 9),
            b: u64_at(&b, 17),
            len: u64_at(&b, 25),
        }))
    }
}

/// Payloads at least this large skip the userspace buffers both ways.
pub const DIRECT: usize = 32 * 1024;

/// Fills `dst` from what `rd` already buffered, then straight from the
/// socket: a large payload lands in its destination without a staging copy.
pub fn read_direct(rd: &mut BufReader<TcpStream>, dst: &mut [u8]) -> io::Result<()> {
    if dst.len() < DIRECT {
        return rd.read_exact(dst);
    }
    let buffered = rd.buffer().len().min(dst.len());
    dst[..buffered].copy_from_slice(&rd.buffer()[..buffered]);
    rd.consume(buffered);
    rd.get_mut().read_exact(&mut dst[buffered..])
}

/// Header and payload in one `writev`, looping over partial writes.
pub fn write_all_vectored(stream: &mut TcpStream, head: &[u8], body: &[u8]) -> io::Result<()> {
    let mut slices = [IoSlice::new(head), IoSlice::new(body)];
    let mut slices: &mut [IoSlice<'_>] = &mut slices;
    while !slices.is_empty() {
        match stream.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes a header and payload: small ones through the buffer, large ones
/// (after flushing it) in one vectored write from the payload's memory.
pub fn write_framed(wr: &mut io::BufWriter<TcpStream>, head: &[u8], body: &[u8]) -> io::Result<()> {
    if body.len() >= DIRECT {
        wr.flush()?;
        write_all_vectored(wr.get_mut(), head, body)
    } else {
        wr.write_all(head)?;
        wr.write_all(body)
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// Fills `buf`, or reports `false` if the stream ended before its first byte.
fn read_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_unknown_kinds_are_refused() {
        let h = RequestHeader {
            kind: Kind::Write,
            name_len: 3,
            id: 7,
            version: 2,
            offset: u64::MAX,
            len: 9,
        };
        let bytes = h.encode(b"abc");
        assert_eq!(bytes.len(), REQUEST_HEADER + 3);
        assert_eq!(RequestHeader::read(&mut &bytes[..]).unwrap(), Some(h));
        let r = ResponseHeader {
            id: 1,
            status: 3,
            a: 4,
            b: 5,
            len: 6,
        };
        assert_eq!(ResponseHeader::read(&mut &r.encode()[..]).unwrap(), Some(r));
        let mut bad = bytes.clone();
        bad[0] = 99;
        assert!(RequestHeader::read(&mut &bad[..]).is_err());
        assert_eq!(RequestHeader::read(&mut &[][..]).unwrap(), None);
        assert!(RequestHeader::read(&mut &bytes[..5]).is_err());
    }
}
