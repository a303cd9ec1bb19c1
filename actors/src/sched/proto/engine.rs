//! The inference-engine protocol: model calls from the proxy, and the
//! lifecycle a cell drives through a role change (stop admitting, pin KV
//! blocks, cancel, hand blocks over, unload, load).

use serde::{Deserialize, Serialize};

use crate::sched::ids::{CallId, EngineIx, ExecId, Version};
use gyre_runtime::{BlobId, Nanos, Recipient};

/// Pinned KV-cache blocks of one execution's prefix, readable by another
/// engine through the transfer engine until released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvBlocks {
    pub exec: ExecId,
    pub engine: EngineIx,
    pub tokens: u64,
}

/// How long an engine holds a call whose execution's blocks are on their
/// way ([`EngineReq::ExpectKv`]) before serving it by prefilling instead.
/// The wait normally ends at [`EngineReq::AdoptKv`]: the source's cancel,
/// the hand-over and one read through the transfer engine. The bound only
/// matters when the hand-over was lost (the source's node died
/// mid-switch), and then costs the call this much latency once.
pub const KV_WAIT: Nanos = 5_000_000_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum EngineReq {
    /// Serve one model call (attempt `attempt` of it); answered with a
    /// [`CallEvent`] to `reply_to`.
    Serve {
        call: CallId,
        attempt: u32,
        prompt_tokens: u64,
        prompt: BlobId,
        reply_to: Recipient<CallEvent>,
    },
    /// Refuse new calls from now on (SPEC 2.5 step 1).
    StopAdmitting { reply_to: Recipient<EngineEvent> },
    /// Pin the cache blocks of these executions (step 4, before cancelling).
    PinKv {
        execs: Vec<ExecId>,
        reply_to: Recipient<EngineEvent>,
    },
    /// Cancel every unfinished call; cache writes stop (step 3).
    CancelAll { reply_to: Recipient<EngineEvent> },
    /// Another engine pinned this execution's prefix and its retried call
    /// is coming here: hold that call until [`EngineReq::AdoptKv`] (or a
    /// bounded wait), so it starts from the blocks instead of racing their
    /// read and prefilling the whole prefix again. A hint: an engine that
    /// cannot adopt blocks ignores it.
    ExpectKv { exec: ExecId },
    /// Blocks read from another engine now back this execution's prefix.
    AdoptKv { exec: ExecId, tokens: u64 },
    /// The destination acknowledged: drop the pins.
    ReleaseKv { execs: Vec<ExecId> },
    /// Unload rollout weights and free the KV cache (step 5).
    Unload { reply_to: Recipient<EngineEvent> },
    /// Load the published weights and serve again.
    Load {
        version: Version,
        reply_to: Recipient<EngineEvent>,
    },
    /// A publication: serve `version` from now on.
    SetWeights { version: Version },
    /// [`EngineReq::SetWeights`], acknowledged with
    /// [`EngineEvent::WeightsSet`]: what a cell sends when it resends
    /// unanswered requests (`SchedConfig::retry`), so a lost publication
    /// is sent again.
    SetWeightsAcked {
        version: Version,
        reply_to: Recipient<EngineEvent>,
    },
}

/// Answers to the cell that drives the engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum EngineEvent {
    AdmissionStopped,
    KvPinned {
        blocks: Vec<KvBlocks>,
    },
    CancelComplete {
        cancelled: u32,
    },
    Unloaded,
    Loaded {
        version: Version,
    },
    /// The answer to [`EngineReq::SetWeightsAcked`].
    WeightsSet {
        version: Version,
    },
}

/// Answers to the proxy about one attempt of one call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CallEvent {
    Done {
        call: CallId,
        attempt: u32,
        output_tokens: u64,
        version: Version,
        /// The call's TITO record (see [`super::payload`]).
        output: BlobId,
    },
    /// Cancelled by a role change; the proxy retries on the new route.
    Cancelled { call: CallId, attempt: u32 },
    /// Not admitted (the engine stopped admitting); retried likewise.
    Rejected { call: CallId, attempt: u32 },
}
