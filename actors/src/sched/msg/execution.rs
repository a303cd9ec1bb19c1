//! An execution's messages and how it ends.

use gyre_runtime::BlobId;
use serde::{Deserialize, Serialize};

use crate::sched::ids::{CallId, Version};
use crate::sched::proto::harness::HarnessEvent;

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecStatus {
    Completed,
    /// `complete`: nothing was produced that could be evaluated.
    Failed {
        complete: bool,
    },
    HarnessTimeout,
    OverallTimeout,
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecState {
    Queued,
    Running,
    Closed(ExecStatus),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ExecMsg {
    /// From the scheduler: a slot is placed, start the harness.
    Start,
    /// From the scheduler: stop a running execution.
    Cancel,
    Harness(HarnessEvent),
    /// From the proxy: the answer to one model call; `output` holds its
    /// TITO record (see [`crate::sched::proto::payload`]).
    Answer {
        call: CallId,
        output_tokens: u64,
        version: Version,
        output: BlobId,
    },
}

impl From<HarnessEvent> for ExecMsg {
    fn from(e: HarnessEvent) -> Self {
        ExecMsg::Harness(e)
    }
}
