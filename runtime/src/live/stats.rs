//! Counters a live node keeps about its traffic and about what it refused.
//!
//! The hot in-process path counts nothing (a shared counter per local send
//! would cost more than the send); everything that crosses a socket or is
//! dropped is counted, so tests and operators can see bad input being turned
//! away without reading logs.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a node's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveStats {
    /// Message frames received and sent over TCP (heartbeats excluded).
    pub frames_in: u64,
    pub frames_out: u64,
    /// Connections that completed the handshake, either direction.
    pub handshakes: u64,
    /// Connections closed because the peer sent something invalid.
    pub closed_bad_input: u64,
    /// Of those: a frame cut short by end of stream.
    pub truncated_frames: u64,
    /// Of those: a length prefix over `max_frame`.
    pub oversized_frames: u64,
    /// Of those: a frame or payload that did not decode (corrupt bytes,
    /// unknown variant tag, trailing bytes).
    pub decode_errors: u64,
    /// Of those: a bad hello (wrong magic, wrong protocol version, wrong
    /// node, or something other than a hello first).
    pub handshake_errors: u64,
    /// Connections closed because the peer went silent past `peer_timeout`.
    pub peer_timeouts: u64,
    /// Transitions of a peer node from reachable to unreachable.
    pub peer_downs: u64,
    /// Messages dropped: no such actor here (unknown or stopped).
    pub dropped_no_actor: u64,
    /// Messages dropped: the destination node is not connected.
    pub dropped_unreachable: u64,
    /// Messages dropped: the destination expects another message type, the
    /// message would not encode, or the encoded frame is over `max_frame`.
    pub dropped_invalid: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub frames_in: AtomicU64,
    pub frames_out: AtomicU64,
    pub handshakes: AtomicU64,
    pub closed_bad_input: AtomicU64,
    pub truncated_frames: AtomicU64,
    pub oversized_frames: AtomicU64,
    pub decode_errors: AtomicU64,
    pub handshake_errors: AtomicU64,
    pub peer_timeouts: AtomicU64,
    pub peer_downs: AtomicU64,
    pub dropped_no_actor: AtomicU64,
    pub dropped_unreachable: AtomicU64,
    pub dropped_invalid: AtomicU64,
}

/// Adds one; relaxed because counters order nothing.
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub fn snapshot(&self) -> LiveStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LiveStats {
            frames_in: get(&self.frames_in),
            frames_out: get(&self.frames_out),
            handshakes: get(&self.handshakes),
            closed_bad_input: get(&self.closed_bad_input),
            truncated_frames: get(&self.truncated_frames),
            oversized_frames: get(&self.oversized_frames),
            decode_errors: get(&self.decode_errors),
            handshake_errors: get(&self.handshake_errors),
            peer_timeouts: get(&self.peer_timeouts),
            peer_downs: get(&self.peer_downs),
            dropped_no_actor: get(&self.dropped_no_actor),
            dropped_unreachable: get(&self.dropped_unreachable),
            dropped_invalid: get(&self.dropped_invalid),
        }
    }
}
