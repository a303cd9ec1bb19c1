//! The SGLang adapter: an SGLang server (or `gyre serve`) as a live
//! backend of the scheduling plane.
//!
//! One [`SglangEngine`] actor per server answers the engine protocol
//! (`EngineReq`) with HTTP calls, each an I/O request whose completion
//! comes back as the actor's own message, so the adapter is the same kind
//! of deterministic state machine as the embedded engine worker and runs
//! on every host:
//!
//! | request | HTTP |
//! |---|---|
//! | `Serve` | read the prompt, `POST /generate` (input ids, the prompt's sampling, a seed from the call, `return_logprob`, `rid`), write the TITO record from the answer's ids, log-probs and `weight_version` |
//! | `StopAdmitting` | none: later calls are answered `Rejected` |
//! | `PinKv` | none: KV export is not in SGLang's public API; no blocks are pinned, the destination recomputes the prefix, `EngineStats::kv_recomputed` counts it |
//! | `CancelAll` | `POST /abort_request` by rid for every call in flight |
//! | `Unload` | abort what is left, `POST /release_memory_occupation` (weights, kv_cache) |
//! | `Load` | `POST /resume_memory_occupation`, then the published version by `/update_weights_from_tensor` with its `weight_version` |
//! | `SetWeights` | `/update_weights_from_tensor` with `weight_version` (the server keeps its requests running), or in disk mode the version written as a checkpoint directory and `/update_weights_from_disk` ([`publish`]) |
//!
//! On start the adapter waits for the server's health and pushes the
//! newest published weights, so the server samples from the trainer's
//! policy from the first call. Errors, timeouts and a dead server answer a
//! call `Rejected`, which the proxy retries on the next route.

mod http;
pub mod publish;
mod worker;

#[cfg(test)]
mod tests;

use std::time::Duration;

pub use http::{FailureKind, HttpCall, HttpFailure};
pub use publish::{DiskPublish, Publish};
pub use worker::{ControlOut, Generated, SglangEngine, SglangEngineMsg};

/// How patient an adapter is with its server.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    /// How long start-up waits for the server's health.
    pub startup: Duration,
    /// How long an unload retries a release the server refuses because
    /// aborted requests are still finishing.
    pub release_patience: Duration,
    /// How a published version reaches the server.
    pub publish: Publish,
}

impl Default for AdapterConfig {
    fn default() -> Self {
        Self {
            startup: Duration::from_secs(120),
            release_patience: Duration::from_secs(30),
            publish: Publish::Tensor,
        }
    }
}

/// The adapter's HTTP side, beside the engine protocol's [`EngineStats`].
///
/// [`EngineStats`]: crate::embedded::engine::EngineStats
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterStats {
    /// HTTP calls that failed (each also logged).
    pub failures: u64,
    pub timeouts: u64,
    /// Requests the server refused as malformed (4xx).
    pub refused: u64,
    /// `/abort_request` calls sent.
    pub aborts: u64,
}
