//! The core optimizer owner's messages, and the record of what a step
//! consumed.

use gyre_runtime::Recipient;
use serde::{Deserialize, Serialize};

use crate::sched::ids::{GroupId, MicroStepId, Step, Version};
use crate::sched::msg::cell::CellMsg;
use crate::sched::msg::packer::PackerMsg;
use crate::sched::proto::trainer::TrainerEvent;
use crate::sched::proto::transfer::TransferEvent;

/// One group as a training step consumed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainedGroup {
    pub group: GroupId,
    /// v_d: the published version when the group was dispatched.
    pub v_d: Version,
    pub tokens: u64,
    pub micro_steps: u32,
}

/// What one optimizer update consumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: Step,
    /// Size of the training prefix that reduced gradients.
    pub members: u32,
    pub groups: Vec<TrainedGroup>,
    pub micro_steps: u32,
}

/// The groups the packer sealed into one step's batch, told to an
/// observer: a cluster's head journals them, so that a head resumed from a
/// checkpoint holding that step knows those groups are trained for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedBatch {
    pub step: Step,
    pub groups: Vec<GroupId>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum CoreMsg {
    /// From the scheduler: cell 0 entered training; train `step` with
    /// `members` (cell 0 first; the others join once they hold the weights).
    Activate {
        step: Step,
        burst: u64,
        members: Vec<(u32, Recipient<CellMsg>)>,
    },
    /// From the scheduler: a satellite switched and wants to join.
    Join {
        cell: u32,
        addr: Recipient<CellMsg>,
        burst: u64,
    },
    /// From the scheduler, after a publication: stay and train `burst`.
    Continue {
        burst: u64,
    },
    /// From the scheduler: the core returns to rollout.
    Leave,
    /// From the packer: the batch's groups and micro-steps, all enqueued.
    BatchSealed {
        step: Step,
        groups: Vec<TrainedGroup>,
        micro_steps: Vec<MicroStepId>,
        packer: Recipient<PackerMsg>,
    },
    /// From a member: its share of the batch is computed and drained.
    BatchDone {
        step: Step,
        cell: u32,
        consumed: Vec<MicroStepId>,
    },
    Trainer(TrainerEvent),
    Transfer(TransferEvent),
    /// From the scheduler: satellite `cell`'s node is lost. The prefix is
    /// cut below it; what the cut members were granted of the batch being
    /// collected goes back to `queue`.
    MemberLost {
        cell: u32,
        queue: Recipient<crate::sched::msg::queue::QueueMsg>,
    },
    /// From the scheduler: the trainer's node runs again after a loss
    /// (`SchedMsg::NodeBack`): resend what is outstanding there (the
    /// restore). Only with `rejoin_notices`, where nothing is resent on a
    /// timer.
    NodeBack {
        node: gyre_runtime::NodeId,
    },
    /// From cell 0: it dropped its share of `step`'s batch (the answer to
    /// `CellMsg::Abort`); it sends its trainer nothing more of it.
    Aborted {
        step: Step,
    },
}

impl From<TrainerEvent> for CoreMsg {
    fn from(e: TrainerEvent) -> Self {
        CoreMsg::Trainer(e)
    }
}

impl From<TransferEvent> for CoreMsg {
    fn from(e: TransferEvent) -> Self {
        CoreMsg::Transfer(e)
    }
}
