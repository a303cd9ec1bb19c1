//! The scheduler's messages: what executions, cells, the packer and the
//! core report.

use gyre_runtime::NodeId;
use serde::{Deserialize, Serialize};

use crate::sched::ids::{ExecId, Step, SwitchId, Version};
use crate::sched::msg::execution::ExecStatus;

#[derive(Debug, Serialize, Deserialize)]
pub enum SchedMsg {
    /// From an execution: it terminated (f += 1).
    Closed { exec: ExecId, status: ExecStatus },
    /// From a cell: training memory is resident.
    Switched { cell: u32, switch: SwitchId },
    /// From a cell: it holds the core's weights and trains; the transition
    /// is complete.
    Joined { cell: u32, switch: SwitchId },
    /// From a cell: its engine serves again.
    Returned { cell: u32, switch: SwitchId },
    /// From the packer: the supply of the batch being filled.
    Supply { step: Step, value: u64 },
    /// From the core: a non-final step of a burst is done.
    StepDone { step: Step },
    /// From the core: the final step of a burst is done and published.
    Published { step: Step, version: Version },
    /// From the buffer: these executions of a formed group are surplus
    /// (over-sampling); cancel those that are still queued or running.
    Surplus { execs: Vec<ExecId> },
    /// From an operator (a user's actor): accept no new executions until
    /// `ResumeDispatch`; what the dispatch rule releases meanwhile is held.
    /// Executions already accepted run on.
    PauseDispatch,
    /// From an operator: accept again, first everything held while paused.
    ResumeDispatch,
    /// From the host (a cluster's head): `node`, lost earlier, runs again
    /// with fresh backends at the addresses it had (a node agent the
    /// launcher restarted). With `SchedConfig::rejoin_notices` this is how
    /// a lost node is found again: its cells resend what they asked it.
    NodeBack { node: NodeId },
}
