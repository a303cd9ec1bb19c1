//! The micro-step queue's messages: the packer pushes and closes a step's
//! stream, training cells claim from it.

use gyre_runtime::{BlobId, Recipient};
use serde::{Deserialize, Serialize};

use crate::sched::ids::{GroupId, MicroStepId, Step};
use crate::sched::msg::cell::CellMsg;
use crate::sched::msg::packer::PackerMsg;

/// One unit of training input: packed token rows of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicroStep {
    pub id: MicroStepId,
    pub group: GroupId,
    pub tokens: u64,
    /// Its [`crate::trajectory::packing::MicroStepRows`], or
    /// [`BlobId::NONE`] when the packer keeps counts only or has no store.
    pub rows: BlobId,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum QueueMsg {
    Push {
        step: Step,
        msteps: Vec<MicroStep>,
        notify: Recipient<PackerMsg>,
    },
    /// Every micro-step of `step` is enqueued: `total` of them.
    Close { step: Step, total: u32 },
    Claim {
        step: Step,
        cell: u32,
        reply_to: Recipient<CellMsg>,
    },
    /// From the core: `cells` left `step`'s batch (a member's node was
    /// lost, and the prefix was cut there). What they were granted goes
    /// back to the queue, their gradients being gone or unusable, and
    /// they are granted nothing more of `step`.
    Requeue { step: Step, cells: Vec<u32> },
    /// From the core, restored to version `from` after its trainer's loss:
    /// the steps from `from` on are trained again, so every micro-step
    /// granted of them goes back to the queue (claims parked for them
    /// belong to batches that were abandoned and are dropped). Cells cut
    /// from a step stay cut.
    Rewind { from: Step },
}
