//! The stream packer's messages.

use serde::{Deserialize, Serialize};

use crate::sched::ids::{ExecId, GroupId, MicroStepId, Step, Version};
use crate::sched::samples::Sample;
use crate::trajectory::TitoRecord;

#[derive(Debug, Serialize, Deserialize)]
pub enum PackerMsg {
    /// From the buffer: a group became ready.
    Ready { group: GroupId, v_d: Version },
    /// From the buffer: the group asked for.
    Taken {
        group: GroupId,
        v_d: Version,
        samples: Vec<Sample>,
    },
    /// From the buffer: the group asked for could not be handed over.
    NotReady { group: GroupId },
    /// From the queue: a training cell claimed this micro-step.
    Claimed { id: MicroStepId, group: GroupId },
    /// From the core: the update of `step` is done.
    Trained { step: Step },
    /// From the core, when it recovers from checkpoints: every update
    /// before `version` is durable, so the rows of those steps are never
    /// trained again (until then a restore to an earlier checkpoint
    /// trains them again, and they are kept).
    Durable { version: Version },
    /// From the proxy: one recorded model call of `exec`, for a recorded
    /// sample source. Records must arrive before the group is taken.
    Record {
        exec: ExecId,
        group: GroupId,
        record: Box<TitoRecord>,
    },
    /// From the buffer: surplus executions of a formed group (over-sampling).
    /// They never train: the source drops what it holds for them and
    /// releases their record handles.
    Discard { samples: Vec<Sample> },
}
