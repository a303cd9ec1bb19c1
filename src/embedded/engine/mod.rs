//! The embedded inference engine as a backend of the engine protocol: the
//! real `gyre_gpu` engine (continuous batching, exact log-probs, paged KV
//! with pin/export/import, versioned weights) behind the same requests the
//! simulator's cost model answers.
//!
//! A cell (or the standalone pool) gets one [`EngineWorker`] actor: its
//! message enum accepts `EngineReq` (the scheduling plane holds a
//! `Recipient<EngineReq>` of it) and the completions of its own jobs. It owns
//! the protocol state and runs every engine operation as one I/O job at a
//! time, so it is a deterministic state machine under the simulator and a
//! non-blocking actor on the live host.

pub mod calls;
mod ops;
mod record;
pub mod tap;
mod worker;

#[cfg(test)]
mod tests;

pub use ops::CallKey;
pub use record::{call_seed, engine_name};
pub use tap::TokenTap;
pub use worker::{EngineWorker, EngineWorkerMsg};

/// What an engine worker did, for tests and the run summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Calls answered `Done` with a sampled output.
    pub served: u64,
    /// Calls answered `Rejected` (not admitting, not loaded, engine failure).
    pub rejected: u64,
    /// Calls answered `Cancelled` (cancel-all, unload).
    pub cancelled: u64,
    /// Calls whose prompt could not be read or that the engine refused as
    /// invalid: answered `Done` with an empty output.
    pub bad_prompts: u64,
    /// Executions whose prefix was pinned and exported.
    pub kv_pinned: u64,
    /// `AdoptKv` requests accepted.
    pub kv_adopted: u64,
    /// Calls held for their execution's blocks (`ExpectKv`) when their
    /// prompt arrived.
    pub kv_waits: u64,
    /// Held calls served by prefilling because their blocks did not come
    /// within `KV_WAIT`.
    pub kv_wait_expired: u64,
    /// Prompt tokens taken from adopted blocks instead of being prefilled.
    pub adopted_tokens: u64,
    /// Adopted blocks that could not be used (missing, stale, unrelated).
    pub kv_refused: u64,
    /// Prompt tokens the engine computed.
    pub prefilled_tokens: u64,
    /// Output tokens of served calls.
    pub output_tokens: u64,
    /// Engine iterations run.
    pub steps: u64,
    /// Weight versions applied by `Load` or `SetWeights`.
    pub weight_updates: u64,
    /// Protocol misuse seen from this side: unloading with calls in flight
    /// or pins held.
    pub violations: u64,
    /// Engine, board and blob errors (each also logged).
    pub errors: u64,
    /// Executions whose prefix was to be pinned for migration but could
    /// not be (an SGLang engine has no KV export): their destination
    /// recomputes it.
    pub kv_recomputed: u64,
}

pub use record::request;
