//! The device-memory protocol: a cell releases one role's memory and
//! restores the other's, keeping processes and communication groups alive,
//! which is why a switch costs seconds (SPEC 2.5 step 5).

use serde::{Deserialize, Serialize};

use gyre_runtime::Recipient;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MemRole {
    /// Rollout weights, KV cache and temporary buffers.
    Rollout,
    /// Training parameters, optimizer state and buffers.
    Training,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MemoryReq {
    Release {
        role: MemRole,
        reply_to: Recipient<MemoryEvent>,
    },
    Restore {
        role: MemRole,
        reply_to: Recipient<MemoryEvent>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MemoryEvent {
    Released {
        role: MemRole,
    },
    Restored {
        role: MemRole,
    },
    /// The device could not hold it (the other role is still resident).
    Refused {
        role: MemRole,
        reason: String,
    },
}
