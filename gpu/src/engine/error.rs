//! Why the engine refused or failed a call. Bad requests are rejected on
//! their own; nothing here stops the engine serving others.

use super::request::ReqId;
use crate::error::ModelError;
use crate::memory::MemoryError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("request needs {need} KV blocks, the pool has {total}")]
    TooLarge { need: usize, total: usize },
    #[error("no request {0:?} in flight")]
    Unknown(ReqId),
    #[error("no pin {0}")]
    UnknownPin(u64),
    #[error(
        "not serving: weights resident = {weights}, KV cache resident = {kv_cache}; resume memory first"
    )]
    NotServing { weights: bool, kv_cache: bool },
    #[error("{running} running and {waiting} waiting requests: abort or finish them first")]
    Busy { running: usize, waiting: usize },
    #[error("{0} KV pins are held: release them first")]
    PinsHeld(usize),
    #[error("KV snapshot does not fit this engine: {0}")]
    KvMismatch(String),
    #[error("tag {0} is not an engine memory tag (weights, kv_cache)")]
    BadTag(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
}
