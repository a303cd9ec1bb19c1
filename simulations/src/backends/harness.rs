//! A simulated harness: each run thinks, makes a model call, waits for the
//! answer, and repeats a drawn number of times, then finishes with a drawn
//! outcome. It keeps the ledger the "no harness ever sees a role change"
//! invariant reads: every call it issued, every answer, every call left
//! unanswered for longer than its own timeout, and every answer it did not
//! expect.

use std::collections::BTreeMap;

use gyre_actors::sched::execution::{ExecMsg, Execution};
use gyre_actors::sched::ids::{CallId, ExecId};
use gyre_actors::sched::proto::harness::{HarnessEvent, HarnessOutcome, HarnessReq};
use gyre_runtime::{Actor, ActorId, Addr, Cx, MILLIS, Nanos};
use rand::Rng;

use crate::costs::Workload;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HarnessTimer {
    Think(ExecId),
    CallTimeout(CallId),
}

#[derive(Debug, Clone, Copy)]
struct Run {
    reply_to: Addr<Execution>,
    calls_left: u32,
    seq: u32,
    context: u64,
    think_scale: u64,
    outcome: HarnessOutcome,
    outstanding: Option<(CallId, Nanos)>,
}

/// The harness-side ledger of model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HarnessStats {
    pub runs: u64,
    pub finished: u64,
    pub aborted: u64,
    pub calls: u64,
    pub answered: u64,
    /// Calls outstanding when the run was aborted (overall timeout).
    pub abandoned: u64,
    /// Calls that waited past the harness's own timeout (must stay 0).
    pub call_timeouts: u64,
    /// Answers to calls that were not outstanding (must stay 0).
    pub stray_answers: u64,
    /// Longest wait for an answer.
    pub max_wait: Nanos,
}

#[derive(Debug)]
pub struct SimHarness {
    work: Workload,
    runs: BTreeMap<ExecId, Run>,
    stats: HarnessStats,
}

impl SimHarness {
    pub fn new(work: Workload) -> Self {
        Self {
            work,
            runs: BTreeMap::new(),
            stats: HarnessStats::default(),
        }
    }

    pub fn stats(&self) -> HarnessStats {
        self.stats
    }

    /// Calls waiting for an answer, with when they were made.
    pub fn waiting(&self) -> Vec<(CallId, Nanos)> {
        self.runs.values().filter_map(|r| r.outstanding).collect()
    }

    /// Runs still going, and of those the ones waiting for an answer.
    pub fn live(&self) -> (usize, usize) {
        let waiting = self
            .runs
            .values()
            .filter(|r| r.outstanding.is_some())
            .count();
        (self.runs.len(), waiting)
    }

    fn think(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        let Some(run) = self.runs.get(&exec) else {
            return;
        };
        let t = self
            .work
            .think
            .draw(cx.rng())
            .saturating_mul(run.think_scale);
        cx.set_timer(HarnessTimer::Think(exec), t);
    }

    fn finish(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        if let Some(run) = self.runs.remove(&exec) {
            self.stats.finished += 1;
            cx.send(
                run.reply_to,
                ExecMsg::Harness(HarnessEvent::Finished {
                    outcome: run.outcome,
                }),
            );
        }
    }
}

impl Actor for SimHarness {
    type Msg = HarnessReq;
    type Timer = HarnessTimer;

    fn on_msg(&mut self, _from: ActorId, msg: HarnessReq, cx: &mut Cx<'_, Self>) {
        match msg {
            HarnessReq::Begin { exec, reply_to, .. } => {
                if self.runs.contains_key(&exec) {
                    return;
                }
                self.stats.runs += 1;
                let w = &self.work;
                let rng = cx.rng();
                let roll: f64 = rng.random();
                let mut calls = w.calls.draw(rng) as u32;
                let mut think_scale = 1;
                let outcome = if roll < w.p_complete_failure {
                    calls = 0;
                    HarnessOutcome::Failed { complete: true }
                } else if roll < w.p_complete_failure + w.p_harness_timeout {
                    HarnessOutcome::HarnessTimeout
                } else if roll < w.p_complete_failure + w.p_harness_timeout + w.p_partial_failure {
                    HarnessOutcome::Failed { complete: false }
                } else {
                    if roll > 1.0 - w.p_too_long {
                        think_scale = 1_000_000;
                    }
                    HarnessOutcome::Completed
                };
                let context = w.first_prompt.draw(rng);
                self.runs.insert(
                    exec,
                    Run {
                        reply_to,
                        calls_left: calls,
                        seq: 0,
                        context,
                        think_scale,
                        outcome,
                        outstanding: None,
                    },
                );
                if calls == 0 {
                    cx.set_timer(HarnessTimer::Think(exec), MILLIS);
                } else {
                    self.think(exec, cx);
                }
            }
            HarnessReq::Answer {
                call,
                output_tokens,
            } => {
                let now = cx.now();
                let growth = self.work.growth.draw(cx.rng());
                let Some(run) = self.runs.get_mut(&call.exec) else {
                    self.stats.stray_answers += 1;
                    return;
                };
                let Some((expected, since)) = run.outstanding else {
                    self.stats.stray_answers += 1;
                    return;
                };
                if expected != call {
                    self.stats.stray_answers += 1;
                    return;
                }
                run.outstanding = None;
                run.context += output_tokens + growth;
                self.stats.answered += 1;
                self.stats.max_wait = self.stats.max_wait.max(now - since);
                cx.cancel_timer(&HarnessTimer::CallTimeout(call));
                let more = run.calls_left > 0;
                if more {
                    self.think(call.exec, cx);
                } else {
                    self.finish(call.exec, cx);
                }
            }
            HarnessReq::Abort { exec } => {
                if let Some(run) = self.runs.remove(&exec) {
                    self.stats.aborted += 1;
                    cx.cancel_timer(&HarnessTimer::Think(exec));
                    if let Some((call, _)) = run.outstanding {
                        self.stats.abandoned += 1;
                        cx.cancel_timer(&HarnessTimer::CallTimeout(call));
                    }
                }
            }
        }
    }

    fn on_timer(&mut self, timer: HarnessTimer, cx: &mut Cx<'_, Self>) {
        match timer {
            HarnessTimer::Think(exec) => {
                let now = cx.now();
                let Some(run) = self.runs.get_mut(&exec) else {
                    return;
                };
                if run.calls_left == 0 {
                    self.finish(exec, cx);
                    return;
                }
                run.calls_left -= 1;
                let call = CallId { exec, seq: run.seq };
                run.seq += 1;
                run.outstanding = Some((call, now));
                let prompt_tokens = run.context;
                let to = run.reply_to;
                self.stats.calls += 1;
                cx.set_timer(HarnessTimer::CallTimeout(call), self.work.call_timeout);
                cx.send(
                    to,
                    ExecMsg::Harness(HarnessEvent::ModelCall {
                        call,
                        prompt_tokens,
                    }),
                );
            }
            HarnessTimer::CallTimeout(call) => {
                // The serving side left a call unanswered: the harness gives
                // up, which is precisely what a role change must never cause.
                self.stats.call_timeouts += 1;
                if let Some(run) = self.runs.get_mut(&call.exec) {
                    run.outcome = HarnessOutcome::Failed { complete: false };
                    run.outstanding = None;
                }
                cx.cancel_timer(&HarnessTimer::Think(call.exec));
                self.finish(call.exec, cx);
            }
        }
    }
}
