//! The harness backend of external harness processes: the actor that
//! stands between the executions of the scheduling plane and the gateway's
//! front (which creates gateway executions, runs the processes and serves
//! their HTTP calls).
//!
//! It is the same protocol the built-in task answers, kept sans-IO: what
//! the front must do goes out as [`ToFront`] messages to its probe address,
//! and what the processes did comes back as [`BridgeMsg`]s (a call to route,
//! a record the gateway committed, an exit). Payload handles the front hands
//! over are released here, as effects, when nobody else will own them: a
//! prompt once its call is answered or its run is gone, a record whose
//! execution closed before it arrived.

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_actors::sched::ids::{CallId, ExecId, GroupId};
use gyre_actors::sched::proto::harness::{HarnessEvent, HarnessOutcome, HarnessReq};
use gyre_runtime::{Actor, ActorId, BlobId, BlobStore, Cx, PayloadRelease, Recipient};
use serde::{Deserialize, Serialize};

/// What the front is asked to do.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToFront {
    /// Create the gateway execution of `exec` and start its harness.
    Begin { exec: ExecId, group: GroupId },
    /// `call` was answered by the proxy: its stream is complete.
    Answered { call: CallId },
    /// Stop the run's harness (overall timeout, cancellation).
    Abort { exec: ExecId },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum BridgeMsg {
    Req(HarnessReq),
    /// The gateway serves an HTTP request of `call.exec` as this call.
    Call {
        call: CallId,
        prompt_tokens: u64,
        prompt: BlobId,
    },
    /// The gateway committed a call's record (durably); it goes to the
    /// execution for training.
    Recorded {
        call: CallId,
        record: BlobId,
    },
    /// The harness process of `exec` ended.
    Finished {
        exec: ExecId,
        outcome: HarnessOutcome,
    },
    /// A release effect completed.
    Released,
}

impl From<HarnessReq> for BridgeMsg {
    fn from(r: HarnessReq) -> Self {
        BridgeMsg::Req(r)
    }
}

#[derive(Debug)]
struct Run {
    reply_to: Recipient<HarnessEvent>,
    /// Prompt handle of each call not answered yet.
    outstanding: BTreeMap<CallId, BlobId>,
}

/// Counters, for tests and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BridgeStats {
    pub begun: u64,
    pub calls: u64,
    pub answered: u64,
    pub recorded: u64,
    pub finished: u64,
    pub aborted: u64,
    /// Calls, records or exits for a run that is gone (aborted, closed).
    pub late: u64,
}

/// The external harnesses' backend (`Msg` accepts `HarnessReq`).
#[derive(Debug)]
pub struct GatewayHarness {
    front: Recipient<ToFront>,
    blobs: Arc<dyn BlobStore>,
    runs: BTreeMap<ExecId, Run>,
    stats: BridgeStats,
}

impl GatewayHarness {
    pub fn new(front: Recipient<ToFront>, blobs: Arc<dyn BlobStore>) -> Self {
        Self {
            front,
            blobs,
            runs: BTreeMap::new(),
            stats: BridgeStats::default(),
        }
    }

    pub fn stats(&self) -> BridgeStats {
        self.stats
    }

    fn release(&self, blob: BlobId, cx: &mut Cx<'_, Self>) {
        if blob.is_some() {
            cx.io(PayloadRelease::new(self.blobs.clone(), blob), |_| {
                BridgeMsg::Released
            });
        }
    }

    fn end(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) -> Option<Run> {
        let run = self.runs.remove(&exec)?;
        for prompt in run.outstanding.values() {
            self.release(*prompt, cx);
        }
        Some(run)
    }

    fn request(&mut self, req: HarnessReq, cx: &mut Cx<'_, Self>) {
        match req {
            HarnessReq::Begin {
                exec,
                group,
                reply_to,
            } => {
                if self.runs.contains_key(&exec) {
                    return;
                }
                self.stats.begun += 1;
                self.runs.insert(
                    exec,
                    Run {
                        reply_to,
                        outstanding: BTreeMap::new(),
                    },
                );
                cx.send(self.front, ToFront::Begin { exec, group });
            }
            HarnessReq::Answer { call, .. } => {
                let prompt = self
                    .runs
                    .get_mut(&call.exec)
                    .and_then(|r| r.outstanding.remove(&call));
                if let Some(prompt) = prompt {
                    self.stats.answered += 1;
                    self.release(prompt, cx);
                    cx.send(self.front, ToFront::Answered { call });
                }
            }
            HarnessReq::Abort { exec } => {
                if self.end(exec, cx).is_some() {
                    self.stats.aborted += 1;
                    cx.send(self.front, ToFront::Abort { exec });
                }
            }
        }
    }
}

impl Actor for GatewayHarness {
    type Msg = BridgeMsg;
    type Timer = ();
    gyre_runtime::accepts!(HarnessReq);

    fn on_msg(&mut self, _from: ActorId, msg: BridgeMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            BridgeMsg::Req(req) => self.request(req, cx),
            BridgeMsg::Call {
                call,
                prompt_tokens,
                prompt,
            } => {
                let Some(run) = self.runs.get_mut(&call.exec) else {
                    self.stats.late += 1;
                    return self.release(prompt, cx);
                };
                if run.outstanding.contains_key(&call) {
                    return;
                }
                run.outstanding.insert(call, prompt);
                self.stats.calls += 1;
                cx.send(
                    run.reply_to,
                    HarnessEvent::ModelCall {
                        call,
                        prompt_tokens,
                        prompt,
                    },
                );
            }
            BridgeMsg::Recorded { call, record } => {
                let Some(run) = self.runs.get(&call.exec) else {
                    self.stats.late += 1;
                    return self.release(record, cx);
                };
                self.stats.recorded += 1;
                cx.send(run.reply_to, HarnessEvent::Recorded { call, record });
            }
            BridgeMsg::Finished { exec, outcome } => {
                let Some(run) = self.end(exec, cx) else {
                    self.stats.late += 1;
                    return;
                };
                self.stats.finished += 1;
                cx.send(run.reply_to, HarnessEvent::Finished { outcome });
            }
            BridgeMsg::Released => {}
        }
    }
}
