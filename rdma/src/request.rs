//! What a caller asks for and what it gets back: one-sided requests against
//! an opened remote segment, and one completion per request.
//!
//! A completion is self-contained (status, bytes moved, the bytes read), so a
//! host can map each one straight into a message for the actor that asked —
//! the shape of an I/O-request effect.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::error::RequestError;

/// Which engine-local connection a segment lives behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// A handle to a remote segment, as returned by opening it: requests name
/// the version they were opened at, so memory re-registered since is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRef {
    pub peer: PeerId,
    pub name: Arc<str>,
    pub version: u64,
    pub len: u64,
}

/// The operation and its local buffer.
#[derive(Debug)]
pub enum Op {
    /// Read `len` bytes into `into` (a buffer the caller recycles) or, when
    /// `None`, into a fresh buffer filled straight from the wire.
    Read { len: u64, into: Option<BytesMut> },
    /// Write `data` (shared, never copied before the wire).
    Write { data: Bytes },
}

/// One READ or WRITE of a byte range of a remote segment.
#[derive(Debug)]
pub struct TransferRequest {
    pub target: SegmentRef,
    pub offset: u64,
    pub op: Op,
}

impl TransferRequest {
    pub fn read(target: &SegmentRef, offset: u64, len: u64) -> Self {
        Self {
            target: target.clone(),
            offset,
            op: Op::Read { len, into: None },
        }
    }

    /// Reads `buf.len()` bytes into `buf`, reusing its allocation.
    pub fn read_into(target: &SegmentRef, offset: u64, buf: BytesMut) -> Self {
        Self {
            target: target.clone(),
            offset,
            op: Op::Read {
                len: buf.len() as u64,
                into: Some(buf),
            },
        }
    }

    pub fn write(target: &SegmentRef, offset: u64, data: Bytes) -> Self {
        Self {
            target: target.clone(),
            offset,
            op: Op::Write { data },
        }
    }

    pub fn len(&self) -> u64 {
        match &self.op {
            Op::Read { len, .. } => *len,
            Op::Write { data } => data.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_write(&self) -> bool {
        matches!(self.op, Op::Write { .. })
    }
}

/// A request that finished: how many bytes moved and, for a READ, the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transferred {
    pub bytes: u64,
    pub data: Option<Bytes>,
}

/// The outcome of one request.
pub type Completion = Result<Transferred, RequestError>;

/// A request's state as seen by polling its batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestStatus {
    Pending,
    Completed { bytes: u64 },
    Failed(RequestError),
}

/// Called exactly once with a request's completion, on whatever thread
/// finished it; it must not block for long.
pub type Completer = Box<dyn FnOnce(Completion) + Send + 'static>;
