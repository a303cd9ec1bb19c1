//! The evaluator-backend protocol: score the preserved state of one closed
//! execution under its task's rubric. An attempt may fail; the evaluator
//! actor retries on the same state within the execution's time budget.
//! A backend that identifies the state it evaluated (a workspace's content
//! hash and branch) sends [`EvalState`] before that attempt's `Scored`, so
//! the score is bound to that state (SPEC 3.3).

use serde::{Deserialize, Serialize};

use crate::sched::ids::ExecId;
use crate::trajectory::scoring::ArtifactRef;
use gyre_runtime::Recipient;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum EvalReq {
    Score {
        exec: ExecId,
        attempt: u32,
        reply_to: Recipient<EvalEvent>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum EvalEvent {
    Scored {
        exec: ExecId,
        attempt: u32,
        reward: f64,
    },
    Failed {
        exec: ExecId,
        attempt: u32,
    },
}

/// The state one attempt evaluated, named by the backend (sent to the same
/// evaluator actor as `reply_to`, before the attempt's `Scored`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalState {
    pub exec: ExecId,
    pub attempt: u32,
    pub artifact: ArtifactRef,
}
