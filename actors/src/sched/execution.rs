//! One execution: a harness run on one query, from acceptance to close.
//!
//! queued → running → closed(completed | failed | harness-timeout |
//! overall-timeout | cancelled). The execution drives its harness backend and
//! forwards every model call to the proxy, which decides where it is served;
//! so the harness, its workspace and its tool state never move when a cell
//! changes role, and the harness only ever receives answers.
//!
//! Closing moves f (SPEC 2.2) and hands the run to the evaluator; the actor
//! then stops.

use gyre_runtime::{Actor, ActorId, Addr, BlobId, Cx, Nanos};

use crate::sched::evaluator::{EvalJob, Evaluator};
use crate::sched::ids::{ExecId, GroupId, Version};
pub use crate::sched::msg::execution::{ExecMsg, ExecState, ExecStatus};
use crate::sched::proto::Port;
use crate::sched::proto::harness::{HarnessEvent, HarnessOutcome, HarnessReq};
use crate::sched::proxy::{Proxy, ProxyMsg};
use crate::sched::scheduler::{SchedMsg, Scheduler};

/// Where an execution sends things.
#[derive(Debug, Clone, Copy)]
pub struct ExecLinks {
    pub sched: Addr<Scheduler>,
    pub proxy: Addr<Proxy>,
    pub evaluator: Addr<Evaluator>,
    pub harness: Port<HarnessReq>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExecTimer {
    Overall,
}

#[derive(Debug)]
pub struct Execution {
    id: ExecId,
    group: GroupId,
    /// v_d: the published version when it was dispatched.
    v_d: Version,
    links: ExecLinks,
    overall_timeout: Nanos,
    state: ExecState,
    started_at: Nanos,
    calls: u32,
    answered: u32,
    /// Output tokens sampled by the policy: the trainable targets.
    tokens: u64,
    /// Record handles of the answered calls, in answer order; handed on to
    /// the evaluator, never read here.
    records: Vec<BlobId>,
}

impl Execution {
    pub fn new(
        id: ExecId,
        group: GroupId,
        v_d: Version,
        links: ExecLinks,
        overall_timeout: Nanos,
    ) -> Self {
        Self {
            id,
            group,
            v_d,
            links,
            overall_timeout,
            state: ExecState::Queued,
            started_at: 0,
            calls: 0,
            answered: 0,
            tokens: 0,
            records: Vec::new(),
        }
    }

    pub fn id(&self) -> ExecId {
        self.id
    }

    pub fn state(&self) -> ExecState {
        self.state
    }

    fn close(&mut self, status: ExecStatus, abort_harness: bool, cx: &mut Cx<'_, Self>) {
        if !matches!(self.state, ExecState::Running) {
            return;
        }
        self.state = ExecState::Closed(status);
        cx.cancel_timer(&ExecTimer::Overall);
        if abort_harness {
            let exec = self.id;
            let stop = if status == ExecStatus::OverallTimeout {
                HarnessReq::TimedOut { exec }
            } else {
                HarnessReq::Abort { exec }
            };
            cx.send(self.links.harness, stop);
        }
        tracing::debug!(exec = ?self.id, ?status, calls = self.calls, "execution closed");
        cx.send(
            self.links.sched,
            SchedMsg::Closed {
                exec: self.id,
                status,
            },
        );
        cx.send(self.links.proxy, ProxyMsg::Forget { exec: self.id });
        cx.send(
            self.links.evaluator,
            EvalJob {
                exec: self.id,
                group: self.group,
                v_d: self.v_d,
                status,
                tokens: self.tokens,
                deadline: self.started_at.saturating_add(self.overall_timeout),
                records: std::mem::take(&mut self.records),
            },
        );
        cx.stop();
    }
}

impl Actor for Execution {
    type Msg = ExecMsg;
    type Timer = ExecTimer;
    gyre_runtime::accepts!(HarnessEvent);

    fn on_msg(&mut self, _from: ActorId, msg: ExecMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            ExecMsg::Start => {
                if self.state != ExecState::Queued {
                    return;
                }
                self.state = ExecState::Running;
                self.started_at = cx.now();
                cx.set_timer(ExecTimer::Overall, self.overall_timeout);
                let reply_to = cx.recipient();
                cx.send(
                    self.links.harness,
                    HarnessReq::Begin {
                        exec: self.id,
                        group: self.group,
                        reply_to,
                    },
                );
            }
            // A surplus of over-sampling: a queued one never began, so
            // there is no harness to end, nothing to score and nothing to
            // report (the scheduler counted it when it withdrew it).
            ExecMsg::Cancel if self.state == ExecState::Queued => {
                self.state = ExecState::Closed(ExecStatus::Cancelled);
                cx.stop();
            }
            ExecMsg::Cancel => self.close(ExecStatus::Cancelled, true, cx),
            ExecMsg::Harness(HarnessEvent::ModelCall {
                call,
                prompt_tokens,
                prompt,
            }) => {
                if self.state != ExecState::Running || call.exec != self.id {
                    return;
                }
                self.calls += 1;
                let reply_to = cx.recipient();
                cx.send(
                    self.links.proxy,
                    ProxyMsg::Call {
                        call,
                        prompt_tokens,
                        prompt,
                        reply_to,
                    },
                );
            }
            ExecMsg::Harness(HarnessEvent::Finished { outcome }) => {
                let status = match outcome {
                    HarnessOutcome::Completed => ExecStatus::Completed,
                    HarnessOutcome::HarnessTimeout => ExecStatus::HarnessTimeout,
                    HarnessOutcome::Failed { complete } => ExecStatus::Failed { complete },
                };
                self.close(status, false, cx);
            }
            ExecMsg::Harness(HarnessEvent::Recorded { call, record }) => {
                if self.state == ExecState::Running && call.exec == self.id && record.is_some() {
                    self.records.push(record);
                }
            }
            ExecMsg::Answer {
                call,
                output_tokens,
                output,
                ..
            } => {
                if self.state != ExecState::Running {
                    return;
                }
                self.answered += 1;
                self.tokens += output_tokens;
                if output.is_some() {
                    self.records.push(output);
                }
                cx.send(
                    self.links.harness,
                    HarnessReq::Answer {
                        call,
                        output_tokens,
                        output,
                    },
                );
            }
        }
    }

    fn on_timer(&mut self, _timer: ExecTimer, cx: &mut Cx<'_, Self>) {
        self.close(ExecStatus::OverallTimeout, true, cx);
    }
}
