//! The evaluator actor's messages: closed executions to score, and the
//! evaluation backend's answers.

use gyre_runtime::{BlobId, Nanos};
use serde::{Deserialize, Serialize};

use crate::sched::ids::{ExecId, GroupId, Version};
use crate::sched::msg::execution::ExecStatus;
use crate::sched::proto::evaluator::{EvalEvent, EvalState};

/// A closed execution to evaluate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalJob {
    pub exec: ExecId,
    pub group: GroupId,
    pub v_d: Version,
    pub status: ExecStatus,
    pub tokens: u64,
    /// End of the execution's total time budget.
    pub deadline: Nanos,
    /// Handles of the execution's TITO records, in call-answer order
    /// (empty in the simulator); passed through to the buffer unread.
    pub records: Vec<BlobId>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum EvaluatorMsg {
    Evaluate(EvalJob),
    Backend(EvalEvent),
    /// The state an attempt evaluated, before its score.
    State(EvalState),
}

impl From<EvalState> for EvaluatorMsg {
    fn from(s: EvalState) -> Self {
        EvaluatorMsg::State(s)
    }
}

impl From<EvalJob> for EvaluatorMsg {
    fn from(j: EvalJob) -> Self {
        EvaluatorMsg::Evaluate(j)
    }
}

impl From<EvalEvent> for EvaluatorMsg {
    fn from(e: EvalEvent) -> Self {
        EvaluatorMsg::Backend(e)
    }
}
