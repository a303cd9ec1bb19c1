//! The harness protocol: a black-box agent run that makes model calls and
//! eventually finishes. Its sandbox, workspace and tool state stay where
//! they are for its whole life; it only ever sees answers, never a role
//! change.

use serde::{Deserialize, Serialize};

use crate::sched::ids::{CallId, ExecId, GroupId};
use gyre_runtime::{BlobId, Recipient};

#[derive(Debug, Serialize, Deserialize)]
pub enum HarnessReq {
    /// Run the harness for `exec` on the query of `group`.
    Begin {
        exec: ExecId,
        group: GroupId,
        reply_to: Recipient<HarnessEvent>,
    },
    /// The answer to one model call; `output` holds its TITO record
    /// (see [`super::payload`]).
    Answer {
        call: CallId,
        output_tokens: u64,
        output: BlobId,
    },
    /// Stop the run: the scheduler cancelled it (an over-sampled group's
    /// surplus).
    Abort { exec: ExecId },
    /// Stop the run: its overall timeout ended it. Backends stop it as for
    /// [`HarnessReq::Abort`]; a live runner reports it as an overall
    /// timeout, which a cancellation is not.
    TimedOut { exec: ExecId },
}

/// How the harness itself ended a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HarnessOutcome {
    Completed,
    /// The harness's own timeout: the preserved work is still scored.
    HarnessTimeout,
    /// `complete`: nothing to evaluate (e.g. the image could not be pulled).
    Failed {
        complete: bool,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum HarnessEvent {
    /// One model call; `prompt` holds its [`super::payload::Prompt`].
    ModelCall {
        call: CallId,
        prompt_tokens: u64,
        prompt: BlobId,
    },
    Finished {
        outcome: HarnessOutcome,
    },
    /// The TITO record of `call`, written by the harness's side itself: a
    /// gateway in front of an external harness records every call it
    /// streams, and its engines' answers then carry no record (`output` is
    /// `BlobId::NONE`). The execution keeps it as it keeps an engine's
    /// record (see [`super::payload`]); sent before `Finished`.
    Recorded {
        call: CallId,
        record: BlobId,
    },
}
