//! Why a connection was closed, and how each reason is counted.
//!
//! Every reason names what the peer did and what was expected, so the one
//! log line written when a connection is dropped is enough to act on.

use std::time::Duration;

use super::frame::{FrameError, MAGIC};
use super::stats::{Counters, bump};
use crate::codec::CodecError;
use crate::id::{ActorId, NodeId};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("undecodable frame: {0}")]
    Decode(CodecError),
    #[error("message from {src} to {dst} does not decode: {source}")]
    Payload {
        src: ActorId,
        dst: ActorId,
        #[source]
        source: CodecError,
    },
    #[error("protocol version mismatch: this node speaks version {ours}, the peer speaks {theirs}")]
    Version { ours: u32, theirs: u32 },
    #[error("bad magic {got:#010x} in hello (expected {MAGIC:#010x}): not a Gyre peer")]
    Magic { got: u32 },
    #[error("expected {expected}, got a {got} frame")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
    #[error("peer introduced itself as node {got}, but {expected} was dialed")]
    WrongNode { expected: NodeId, got: NodeId },
    #[error("peer introduced itself with this node's own id {0}")]
    SelfConnect(NodeId),
    #[error("frame from {src} claims a node other than the peer's ({peer})")]
    Spoofed { src: ActorId, peer: NodeId },
    #[error("authentication failed: {0}")]
    Auth(&'static str),
    #[error("no hello within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("connection closed before the handshake completed")]
    ClosedInHandshake,
    #[error("peer silent for {0:?} (no frame, not even a heartbeat)")]
    PeerTimeout(Duration),
    #[error("peer not reading: a write made no progress for {0:?}")]
    WriteStalled(Duration),
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

impl ConnError {
    /// True when the peer sent something no correct peer sends.
    pub fn is_bad_input(&self) -> bool {
        match self {
            ConnError::Frame(FrameError::Io(_))
            | ConnError::Io(_)
            | ConnError::PeerTimeout(_)
            | ConnError::WriteStalled(_)
            | ConnError::ClosedInHandshake => false,
            ConnError::Frame(_)
            | ConnError::Decode(_)
            | ConnError::Payload { .. }
            | ConnError::Version { .. }
            | ConnError::Magic { .. }
            | ConnError::Unexpected { .. }
            | ConnError::WrongNode { .. }
            | ConnError::SelfConnect(_)
            | ConnError::Spoofed { .. }
            | ConnError::Auth(_)
            | ConnError::HandshakeTimeout(_) => true,
        }
    }

    pub fn count(&self, c: &Counters) {
        match self {
            ConnError::Frame(FrameError::TooLarge { .. }) => bump(&c.oversized_frames),
            ConnError::Frame(FrameError::Truncated { .. }) => bump(&c.truncated_frames),
            ConnError::Decode(_) | ConnError::Payload { .. } => bump(&c.decode_errors),
            ConnError::Version { .. }
            | ConnError::Magic { .. }
            | ConnError::WrongNode { .. }
            | ConnError::SelfConnect(_)
            | ConnError::Auth(_)
            | ConnError::HandshakeTimeout(_)
            | ConnError::ClosedInHandshake => bump(&c.handshake_errors),
            ConnError::Unexpected { expected, .. } if expected.starts_with("Hello") => {
                bump(&c.handshake_errors)
            }
            ConnError::PeerTimeout(_) | ConnError::WriteStalled(_) => bump(&c.peer_timeouts),
            ConnError::Frame(FrameError::Io(_))
            | ConnError::Io(_)
            | ConnError::Unexpected { .. }
            | ConnError::Spoofed { .. } => {}
        }
        if self.is_bad_input() {
            bump(&c.closed_bad_input);
        }
    }
}
