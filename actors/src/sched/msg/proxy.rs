//! The proxy router's messages: routes from the scheduler, model calls
//! from executions, answers from engines.

use gyre_runtime::{BlobId, Recipient};
use serde::{Deserialize, Serialize};

use crate::sched::ids::{CallId, EngineIx, ExecId, SwitchId};
use crate::sched::msg::cell::CellMsg;
use crate::sched::msg::execution::ExecMsg;
use crate::sched::proto::engine::CallEvent;

#[derive(Debug, Serialize, Deserialize)]
pub enum ProxyMsg {
    /// From the scheduler: a started execution is served by `engine`.
    Route {
        exec: ExecId,
        engine: EngineIx,
    },
    /// From the scheduler: these executions move (a cell is switching);
    /// acknowledged to `notify` once the routes are in place.
    Reroute {
        switch: SwitchId,
        moves: Vec<(ExecId, EngineIx)>,
        notify: Recipient<CellMsg>,
    },
    /// From an execution that closed.
    Forget {
        exec: ExecId,
    },
    /// From an execution: one model call.
    Call {
        call: CallId,
        prompt_tokens: u64,
        prompt: BlobId,
        reply_to: Recipient<ExecMsg>,
    },
    Engine(CallEvent),
    /// The record of a stale attempt was freed (the release is an effect,
    /// and this its completion); nothing follows from it.
    Released,
    /// From the scheduler: `engine`'s node is lost. Its attempts will not
    /// be answered: each is tried again from its prompt on the execution's
    /// new route (`Some`), or held until a route comes (`None`).
    EngineLost {
        engine: EngineIx,
        moves: Vec<(ExecId, Option<EngineIx>)>,
    },
    /// From the scheduler, while running executions outnumber the slots
    /// (a loss left some unplaced): the engines serving rollout, which
    /// lend themselves to the calls of executions without a route, one
    /// call at a time (empty: lend nothing). Sent only when it changes.
    Lend {
        engines: Vec<EngineIx>,
    },
}

impl From<CallEvent> for ProxyMsg {
    fn from(e: CallEvent) -> Self {
        ProxyMsg::Engine(e)
    }
}
