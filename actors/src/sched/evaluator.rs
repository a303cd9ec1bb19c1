//! The evaluator: turns a closed execution into a training outcome.
//!
//! SPEC 3.3's failure classes, as the buffer will count them:
//! - a complete failure (nothing was produced) becomes a zero-reward dummy,
//!   so group counts stay complete;
//! - an overall timeout or a cancellation leaves no time budget to evaluate
//!   in: the execution is excluded;
//! - everything else (completed, harness timeout, partial failure) is scored
//!   on its preserved state; a failed evaluation is pending, not a zero, and
//!   is retried on the same state while the execution's time budget lasts,
//!   after which the execution is excluded.
//!
//! The reward comes only from the evaluator backend, never from elapsed time,
//! length or termination status.

use std::collections::BTreeMap;

use gyre_runtime::{Actor, ActorId, Addr, Cx, Nanos};
use serde::{Deserialize, Serialize};

use crate::sched::buffer::{Buffer, BufferMsg, Resolution};
use crate::sched::execution::ExecStatus;
use crate::sched::ids::{ExecId, GroupId, Version};
use crate::sched::proto::Port;
use crate::sched::proto::evaluator::{EvalEvent, EvalReq};

/// A closed execution to evaluate.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct EvalJob {
    pub exec: ExecId,
    pub group: GroupId,
    pub v_d: Version,
    pub status: ExecStatus,
    pub tokens: u64,
    /// End of the execution's total time budget.
    pub deadline: Nanos,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum EvaluatorMsg {
    Evaluate(EvalJob),
    Backend(EvalEvent),
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EvalTimer {
    Retry(ExecId),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvalStats {
    pub scored: u64,
    pub failed_attempts: u64,
    pub dummies: u64,
    pub excluded: u64,
}

#[derive(Debug)]
pub struct Evaluator {
    backend: Port<EvalReq>,
    buffer: Addr<Buffer>,
    retry: Nanos,
    jobs: BTreeMap<ExecId, (EvalJob, u32)>,
    stats: EvalStats,
}

impl Evaluator {
    pub fn new(backend: Port<EvalReq>, buffer: Addr<Buffer>, retry: Nanos) -> Self {
        Self {
            backend,
            buffer,
            retry,
            jobs: BTreeMap::new(),
            stats: EvalStats::default(),
        }
    }

    pub fn stats(&self) -> EvalStats {
        self.stats
    }

    /// Evaluations in progress or waiting for a retry.
    pub fn in_progress(&self) -> usize {
        self.jobs.len()
    }

    fn resolve(&mut self, job: &EvalJob, resolution: Resolution, cx: &mut Cx<'_, Self>) {
        match resolution {
            Resolution::Valid { .. } => self.stats.scored += 1,
            Resolution::Dummy => self.stats.dummies += 1,
            Resolution::Excluded => self.stats.excluded += 1,
        }
        cx.send(
            self.buffer,
            BufferMsg::Resolved {
                exec: job.exec,
                group: job.group,
                v_d: job.v_d,
                resolution,
                tokens: job.tokens,
            },
        );
    }

    fn ask(&self, exec: ExecId, attempt: u32, cx: &mut Cx<'_, Self>) {
        let reply_to = cx.me();
        cx.send(
            self.backend,
            EvalReq::Score {
                exec,
                attempt,
                reply_to,
            },
        );
    }
}

impl Actor for Evaluator {
    type Msg = EvaluatorMsg;
    type Timer = EvalTimer;

    fn on_msg(&mut self, _from: ActorId, msg: EvaluatorMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            EvaluatorMsg::Evaluate(job) => match job.status {
                ExecStatus::Failed { complete: true } => self.resolve(&job, Resolution::Dummy, cx),
                ExecStatus::OverallTimeout | ExecStatus::Cancelled => {
                    self.resolve(&job, Resolution::Excluded, cx)
                }
                _ => {
                    if self.jobs.contains_key(&job.exec) {
                        return;
                    }
                    self.jobs.insert(job.exec, (job, 0));
                    self.ask(job.exec, 0, cx);
                }
            },
            EvaluatorMsg::Backend(EvalEvent::Scored {
                exec,
                attempt,
                reward,
            }) => {
                if self.jobs.get(&exec).is_none_or(|(_, a)| *a != attempt) {
                    return;
                }
                if let Some((job, _)) = self.jobs.remove(&exec) {
                    let partial = job.status != ExecStatus::Completed;
                    self.resolve(&job, Resolution::Valid { reward, partial }, cx);
                }
            }
            EvaluatorMsg::Backend(EvalEvent::Failed { exec, attempt }) => {
                let Some((job, a)) = self.jobs.get(&exec).copied() else {
                    return;
                };
                if a != attempt {
                    return;
                }
                self.stats.failed_attempts += 1;
                if cx.now().saturating_add(self.retry) <= job.deadline {
                    cx.send(
                        self.buffer,
                        BufferMsg::Pending {
                            exec,
                            group: job.group,
                            v_d: job.v_d,
                        },
                    );
                    cx.set_timer(EvalTimer::Retry(exec), self.retry);
                } else {
                    self.jobs.remove(&exec);
                    self.resolve(&job, Resolution::Excluded, cx);
                }
            }
        }
    }

    fn on_timer(&mut self, timer: EvalTimer, cx: &mut Cx<'_, Self>) {
        let EvalTimer::Retry(exec) = timer;
        if let Some((_, attempt)) = self.jobs.get_mut(&exec) {
            *attempt += 1;
            let a = *attempt;
            self.ask(exec, a, cx);
        }
    }
}
