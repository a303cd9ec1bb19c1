//! What a cell hears: the scheduler's role changes, the proxy's and other
//! cells' hand-over steps, the core's batches, the queue's grants and its
//! backends' events.

use gyre_runtime::{NodeId, Recipient};
use serde::{Deserialize, Serialize};

use crate::sched::ids::{EngineIx, ExecId, Step, SwitchId, Version};
use crate::sched::msg::queue::MicroStep;
use crate::sched::proto::engine::{EngineEvent, KvBlocks};
use crate::sched::proto::memory::MemoryEvent;
use crate::sched::proto::trainer::TrainerEvent;
use crate::sched::proto::transfer::{Segment, TransferEvent};

/// An execution leaving a switching cell, and the cell that takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub exec: ExecId,
    pub dest: EngineIx,
    pub dest_cell: Recipient<CellMsg>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum CellMsg {
    /// From the scheduler: go to training; these executions leave.
    Switch {
        switch: SwitchId,
        moves: Vec<Move>,
    },
    /// From the scheduler: go back to rollout serving `version`.
    Return {
        switch: SwitchId,
        version: Version,
    },
    /// From the scheduler: a publication.
    Weights {
        version: Version,
    },
    /// From the proxy: the reroutes of `switch` are in place.
    RoutesMoved {
        switch: SwitchId,
    },
    /// From a switching cell, before it cancels: `exec`'s prefix is pinned
    /// and its call will be retried here; the [`CellMsg::TakeOver`]
    /// follows once the cancel has completed.
    KvComing {
        switch: SwitchId,
        exec: ExecId,
    },
    /// From a switching cell: take over `kv` of an execution moving here.
    TakeOver {
        switch: SwitchId,
        kv: KvBlocks,
        source: Recipient<CellMsg>,
    },
    /// From a destination cell: it holds the blocks now.
    TakenOver {
        switch: SwitchId,
        exec: ExecId,
    },
    /// From the core: train `step` (reading `snapshot` first if given),
    /// in the core's restore `epoch`, which the batch's trainer requests
    /// carry.
    Batch {
        epoch: u64,
        step: Step,
        snapshot: Option<Segment>,
    },
    /// From the queue.
    Grant {
        mstep: MicroStep,
    },
    StreamEnd {
        step: Step,
    },
    Engine(EngineEvent),
    Memory(MemoryEvent),
    Trainer(TrainerEvent),
    Transfer(TransferEvent),
    /// From the scheduler: this cell's node was lost. Whatever it was
    /// doing is abandoned; it rejoins as `switch`, serving `version`, by
    /// returning to rollout against its backends until they answer.
    Lost {
        switch: SwitchId,
        version: Version,
    },
    /// From the core, whose trainer's node went down: the batch of `step`
    /// is void (its gradients were accumulated there). Forget it, answer
    /// `CoreMsg::Aborted`, and wait for the next batch.
    Abort {
        step: Step,
    },
    /// From the scheduler: the node of this cell's backends went down
    /// while the cell was on the training side (cell 0: the core's node).
    /// What they held (device memory, the loaded engine) may be gone: a
    /// switch in progress runs again from its start against them.
    BackendsLost,
    /// From the scheduler: `node`, which hosts some of this cell's
    /// backends, runs again after a loss (`SchedMsg::NodeBack`): resend
    /// what is outstanding there.
    NodeBack {
        node: NodeId,
    },
}

macro_rules! from_event {
    ($($t:ident => $v:ident),*) => {$(
        impl From<$t> for CellMsg {
            fn from(e: $t) -> Self {
                CellMsg::$v(e)
            }
        }
    )*};
}
from_event!(EngineEvent => Engine, MemoryEvent => Memory, TrainerEvent => Trainer, TransferEvent => Transfer);
