//! The transfer-engine protocol: one-sided reads of registered memory (KV
//! blocks between engines, the core's weights for a joining satellite) and
//! the weight publication to rollout engines.

use serde::{Deserialize, Serialize};

use crate::sched::ids::{ExecId, Step, SwitchId, Version};
use gyre_runtime::Recipient;

use crate::sched::msg::cell::CellMsg;

/// A registered buffer another party may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub id: u64,
    /// The weights version it holds (0 for KV blocks).
    pub version: Version,
    pub bytes: u64,
}

/// What a read is for; echoed back so the reader keeps no state for it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum ReadTag {
    /// KV blocks of `exec` taken over from `source` during `switch`.
    Kv {
        switch: SwitchId,
        exec: ExecId,
        tokens: u64,
        source: Recipient<CellMsg>,
    },
    /// The core's weights, to train step `step`.
    Snapshot { step: Step, version: Version },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TransferReq {
    /// Register the buffer holding the authoritative weights.
    Expose {
        version: Version,
        reply_to: Recipient<TransferEvent>,
    },
    /// Read `bytes` from a segment into the reader's memory.
    Read {
        tag: ReadTag,
        bytes: u64,
        reply_to: Recipient<TransferEvent>,
    },
    /// Push `version` to `engines` rollout engines.
    Publish {
        version: Version,
        engines: u32,
        reply_to: Recipient<TransferEvent>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TransferEvent {
    Exposed { segment: Segment },
    ReadDone { tag: ReadTag },
    Published { version: Version },
}
