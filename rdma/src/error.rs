//! The two kinds of failure the engine reports: a [`RequestError`] is the
//! status of one transfer request (it travels in that request's completion
//! and never disturbs its neighbours); a [`TransferError`] is a failure of an
//! engine-level call (connecting, handshaking, registering, waiting).

use std::time::Duration;

/// Why one READ, WRITE or notification did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("segment `{name}` is not registered on {peer}")]
    UnknownSegment { peer: String, name: String },
    #[error(
        "segment `{name}` on {peer} is at version {current}; the request named stale version {requested} (open the segment again)"
    )]
    StaleVersion {
        peer: String,
        name: String,
        requested: u64,
        current: u64,
    },
    #[error(
        "bytes [{offset}, {offset}+{len}) lie outside segment `{name}` on {peer}, which holds {segment_len} bytes"
    )]
    OutOfBounds {
        peer: String,
        name: String,
        offset: u64,
        len: u64,
        segment_len: u64,
    },
    #[error("segment `{name}` on {peer} was registered read-only; writes to it are refused")]
    ReadOnly { peer: String, name: String },
    #[error("peer {peer} was lost while this request was in flight: {reason}")]
    PeerLost { peer: String, reason: String },
    #[error("peer {peer} broke the transfer protocol: {detail}")]
    Protocol { peer: String, detail: String },
    #[error("no peer with id {0} is connected to this engine")]
    UnknownPeer(u32),
    #[error("notification topic of {len} bytes exceeds the limit of {max} bytes")]
    TopicTooLong { len: usize, max: usize },
    #[error("READ of {len} bytes was given a destination buffer of {buffer} bytes")]
    BufferMismatch { len: u64, buffer: usize },
    #[error("notification of {len} bytes exceeds the limit of {max} bytes")]
    NotificationTooLarge { len: usize, max: usize },
}

/// Why an engine-level call failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("peer {peer} refused this node: it does not hold the same cluster secret")]
    AuthRefused { peer: String },
    #[error("peer {peer} could not prove it holds the cluster secret; connection dropped")]
    PeerNotAuthenticated { peer: String },
    #[error("handshake with {peer} failed: {detail}")]
    Handshake { peer: String, detail: String },
    #[error("cluster secret must be at least {min} bytes, got {len}")]
    WeakSecret { len: usize, min: usize },
    #[error("segment name `{name}` is invalid: {why}")]
    InvalidSegmentName { name: String, why: &'static str },
    #[error("no segment `{name}` is registered on this node")]
    NoLocalSegment { name: String },
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("no batch with id {0} is open on this engine (already waited on or freed?)")]
    UnknownBatch(u64),
    #[error("batch {batch} did not complete within {timeout:?}")]
    Timeout { batch: u64, timeout: Duration },
    #[error("no RDMA device found: {detail}")]
    NoRdmaDevice { detail: String },
    #[error("RDMA verbs call failed: {0}")]
    Rdma(String),
}

impl TransferError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
