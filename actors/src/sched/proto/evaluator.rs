//! The evaluator-backend protocol: score the preserved state of one closed
//! execution under its task's rubric. An attempt may fail; the evaluator
//! actor retries on the same state within the execution's time budget.

use serde::{Deserialize, Serialize};

use crate::sched::ids::ExecId;
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
