//! Errors the hosts report to their callers.

use crate::codec::CodecError;
use crate::id::{ActorId, NodeId};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("no actor {0} on this host")]
    NoSuchActor(ActorId),
    #[error("actor {to} expects {expected}, got a {got}")]
    WrongMessageType {
        to: ActorId,
        expected: &'static str,
        got: &'static str,
    },
    #[error("actor id {0} is already in use")]
    DuplicateActor(ActorId),
    #[error("no route to node {0}")]
    NoRoute(NodeId),
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("host is shut down")]
    ShutDown,
    #[error("{0}")]
    Config(String),
}
