//! Backends behind one trait. The engine routes each request to the
//! transport of its target's peer; a transport moves bytes and calls the
//! request's completer exactly once.
//!
//! - `local`: another engine in this process; frozen memory is handed over
//!   as zero-copy `Bytes` slices.
//! - `tcp`: the default across processes: an authenticated handshake, several
//!   connections per peer, large requests striped across them.
//! - `verbs` (feature `rdma`): libibverbs device discovery and memory
//!   registration through `sideway`.

pub mod local;
pub mod tcp;
#[cfg(feature = "rdma")]
pub mod verbs;

use bytes::Bytes;

use crate::error::RequestError;
use crate::request::{Completer, TransferRequest};
use crate::segment::SegmentInfo;

/// A connection to one peer's memory.
pub trait Transport: Send + Sync {
    /// How errors and logs name the peer.
    fn label(&self) -> &str;

    /// Looks a segment up on the peer: its current version and length.
    fn describe(&self, name: &str) -> Result<SegmentInfo, RequestError>;

    /// Starts one request; `done` receives its completion.
    fn submit(&self, request: TransferRequest, done: Completer);

    /// Delivers a small message to the peer's subscribers of `topic`; `done`
    /// completes once the peer has queued it.
    fn notify(&self, topic: &str, payload: Bytes, done: Completer);
}
