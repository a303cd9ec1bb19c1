//! A simulated harness: each run thinks, makes a model call, waits for the
//! answer, and repeats, then finishes with an outcome.
//!
//! Two workloads drive it. The simple one draws a call count and outcome
//! per run from [`Workload`]. The calibrated one ([`WorkloadModel`]) draws
//! each run's plan from its query's shared difficulty (derived from the
//! query id, so every execution of a group sees the same query whatever
//! order they start in), grows the context call by call with compaction,
//! stops at the harness timeout whatever the plan said (a loaded cluster can
//! push a run into it), and lets a hanging run sit until the execution's
//! overall timeout aborts it.
//!
//! It keeps the ledger the "no harness ever sees a role change" invariant
//! reads: every call it issued, every answer, every call left unanswered for
//! longer than its own timeout, and every answer it did not expect; and the
//! realised length and ending of every run, for the lab's reports.

use gyre_actors::sched::ids::{CallId, ExecId, GroupId};
use gyre_actors::sched::proto::harness::{HarnessEvent, HarnessOutcome, HarnessReq};
use gyre_runtime::rng::mix64;
use gyre_runtime::{Actor, ActorId, BlobId, Cx, MILLIS, Nanos, Recipient, SECS};
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::costs::Workload;
use crate::replay::{Outcome, ReplayWorkload};
use crate::workload::calls::Context;
use crate::workload::{Ending, WorkloadModel};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HarnessTimer {
    Think(ExecId),
    CallTimeout(CallId),
}

#[derive(Debug, Clone, Copy)]
struct Run {
    reply_to: Recipient<HarnessEvent>,
    group: GroupId,
    begun: Nanos,
    calls_left: u32,
    seq: u32,
    context: Context,
    think_scale: u64,
    /// Mean tool and think time (calibrated workload).
    gap: f64,
    /// The harness's own timeout (calibrated workload).
    deadline: Option<Nanos>,
    /// Out of calls, it hangs instead of finishing.
    hangs: bool,
    outcome: HarnessOutcome,
    outstanding: Option<(CallId, Nanos)>,
}

/// How a run ended, as the harness saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Finished(HarnessOutcome),
    /// Aborted by its execution (overall timeout or cancellation).
    Aborted,
}

/// One finished run: how long it took and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRecord {
    pub group: GroupId,
    pub took: Nanos,
    pub end: RunEnd,
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
    /// Runs stopped by the harness timeout of the calibrated workload.
    pub harness_timeouts: u64,
    /// Tokens that entered contexts (prompt growth and outputs).
    pub lifetime_tokens: u64,
    pub compactions: u64,
}

#[derive(Debug)]
enum Source {
    Simple(Workload),
    Model(Box<WorkloadModel>),
    /// A recorded run's executions, call for call.
    Replay(Arc<ReplayWorkload>),
}

#[derive(Debug)]
pub struct SimHarness {
    work: Workload,
    source: Source,
    query_seed: u64,
    /// Runs going on; looked up by execution, iterated only for counts.
    runs: FxHashMap<ExecId, Run>,
    stats: HarnessStats,
    records: Vec<RunRecord>,
    /// Every call answered, and every call left outstanding by an abort
    /// (the checker's "no answered call lost" reads them).
    answered: BTreeSet<CallId>,
    abandoned: BTreeSet<CallId>,
    /// Whether `answered`/`abandoned` are kept (checked runs only).
    track_calls: bool,
}

impl SimHarness {
    /// A harness following the simple workload.
    pub fn new(work: Workload) -> Self {
        Self {
            source: Source::Simple(work.clone()),
            work,
            query_seed: 0,
            runs: FxHashMap::default(),
            stats: HarnessStats::default(),
            records: Vec::new(),
            answered: BTreeSet::new(),
            abandoned: BTreeSet::new(),
            track_calls: false,
        }
    }

    /// A harness following the calibrated workload; `query_seed` decides
    /// every query's shared draws. `work` keeps only its call-timeout
    /// settings.
    pub fn calibrated(work: Workload, model: WorkloadModel, query_seed: u64) -> Self {
        Self {
            source: Source::Model(Box::new(model)),
            query_seed,
            ..Self::new(work)
        }
    }

    /// A harness making the recorded run's calls, with its gaps and
    /// endings; `work` keeps only its call-timeout settings.
    pub fn replaying(work: Workload, replay: Arc<ReplayWorkload>) -> Self {
        Self {
            source: Source::Replay(replay),
            ..Self::new(work)
        }
    }

    pub fn stats(&self) -> HarnessStats {
        self.stats
    }

    /// How long a call waits for its answer before the harness gives up.
    pub fn call_timeout(&self) -> gyre_runtime::Nanos {
        self.work.call_timeout
    }

    /// Keeps the id of every call answered or abandoned, for the checker.
    pub fn tracking_calls(mut self) -> Self {
        self.track_calls = true;
        self
    }

    /// Calls answered, and calls abandoned by an abort.
    pub fn calls_ended(&self) -> (&BTreeSet<CallId>, &BTreeSet<CallId>) {
        (&self.answered, &self.abandoned)
    }

    /// Every run that ended, in the order they ended.
    pub fn records(&self) -> &[RunRecord] {
        &self.records
    }

    /// Calls waiting for an answer, with when they were made, in call order.
    pub fn waiting(&self) -> Vec<(CallId, Nanos)> {
        let mut w: Vec<_> = self.runs.values().filter_map(|r| r.outstanding).collect();
        w.sort();
        w
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
        let t = match &self.source {
            Source::Simple(w) => w.think.draw(cx.rng()).saturating_mul(run.think_scale),
            Source::Model(_) => {
                // Exponential tool and think times around the run's mean.
                let u: f64 = 1.0 - cx.rng().random::<f64>();
                (-u.ln() * run.gap * SECS as f64) as Nanos
            }
            Source::Replay(r) => {
                let call = CallId { exec, seq: run.seq };
                let gap = r.call(call).map_or(0, |c| c.gap);
                // Nothing ran before the recorded run had started up.
                let up = r.first_start().saturating_sub(cx.now());
                if run.seq == 0 { gap.max(up) } else { gap }
            }
        };
        let t = match run.deadline {
            Some(d) if !run.hangs => t.min(d.saturating_sub(cx.now())),
            _ => t,
        };
        cx.set_timer(HarnessTimer::Think(exec), t);
    }

    fn finish(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        if let Some(run) = self.runs.remove(&exec) {
            self.stats.finished += 1;
            if run.outcome == HarnessOutcome::HarnessTimeout {
                self.stats.harness_timeouts += 1;
            }
            self.end(&run, RunEnd::Finished(run.outcome), cx.now());
            cx.send(
                run.reply_to,
                HarnessEvent::Finished {
                    outcome: run.outcome,
                },
            );
        }
    }

    fn end(&mut self, run: &Run, end: RunEnd, now: Nanos) {
        self.stats.lifetime_tokens += run.context.lifetime;
        self.stats.compactions += u64::from(run.context.compactions);
        self.records.push(RunRecord {
            group: run.group,
            took: now.saturating_sub(run.begun),
            end,
        });
    }

    /// The run's deadline has passed: the harness stops on its own.
    fn timed_out(run: &Run, now: Nanos) -> bool {
        !run.hangs && run.deadline.is_some_and(|d| now >= d)
    }

    fn begin(
        &mut self,
        exec: ExecId,
        group: GroupId,
        reply_to: Recipient<HarnessEvent>,
        cx: &mut Cx<'_, Self>,
    ) {
        let now = cx.now();
        let mut run = Run {
            reply_to,
            group,
            begun: now,
            calls_left: 0,
            seq: 0,
            context: Context::default(),
            think_scale: 1,
            gap: 0.0,
            deadline: None,
            hangs: false,
            outcome: HarnessOutcome::Completed,
            outstanding: None,
        };
        match &self.source {
            Source::Simple(w) => {
                let rng = cx.rng();
                let roll: f64 = rng.random();
                run.calls_left = w.calls.draw(rng) as u32;
                run.outcome = if roll < w.p_complete_failure {
                    run.calls_left = 0;
                    HarnessOutcome::Failed { complete: true }
                } else if roll < w.p_complete_failure + w.p_harness_timeout {
                    HarnessOutcome::HarnessTimeout
                } else if roll < w.p_complete_failure + w.p_harness_timeout + w.p_partial_failure {
                    HarnessOutcome::Failed { complete: false }
                } else {
                    if roll > 1.0 - w.p_too_long {
                        run.think_scale = 1_000_000;
                    }
                    HarnessOutcome::Completed
                };
                run.context.tokens = w.first_prompt.draw(rng);
            }
            Source::Model(m) => {
                let mut qrng =
                    rand_chacha::ChaCha8Rng::seed_from_u64(mix64(self.query_seed ^ mix64(group.0)));
                let query = m.draw_query(&mut qrng);
                let rng = cx.rng();
                let plan = m.draw_exec(&query, rng);
                run.gap = plan.gap_s;
                run.context = Context::start(m, rng);
                run.deadline =
                    Some(now.saturating_add((m.harness_timeout_s() * SECS as f64) as Nanos));
                (run.calls_left, run.outcome) = match plan.ending {
                    Ending::Completed => (plan.total_calls, HarnessOutcome::Completed),
                    // The deadline cuts it short.
                    Ending::HarnessTimeout => (plan.total_calls, HarnessOutcome::Completed),
                    Ending::PartialFailure => {
                        (plan.calls, HarnessOutcome::Failed { complete: false })
                    }
                    Ending::CompleteFailure => (0, HarnessOutcome::Failed { complete: true }),
                    Ending::Hang => {
                        run.hangs = true;
                        (plan.calls, HarnessOutcome::Completed)
                    }
                };
            }
            Source::Replay(r) => {
                let e = r.exec(exec);
                run.calls_left = e.calls.len() as u32;
                run.outcome = match e.outcome {
                    Outcome::Completed => HarnessOutcome::Completed,
                    Outcome::HarnessTimeout => HarnessOutcome::HarnessTimeout,
                    Outcome::Failed => HarnessOutcome::Failed { complete: false },
                    Outcome::FailedComplete => HarnessOutcome::Failed { complete: true },
                    Outcome::Aborted => {
                        // Its execution ended it: it waits to be aborted.
                        run.hangs = true;
                        HarnessOutcome::Completed
                    }
                };
            }
        }
        let calls = run.calls_left;
        self.runs.insert(exec, run);
        if calls == 0 {
            cx.set_timer(HarnessTimer::Think(exec), MILLIS);
        } else {
            self.think(exec, cx);
        }
    }

    fn call(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        let now = cx.now();
        let Some(run) = self.runs.get_mut(&exec) else {
            return;
        };
        if Self::timed_out(run, now) {
            run.outcome = HarnessOutcome::HarnessTimeout;
            return self.finish(exec, cx);
        }
        if run.calls_left == 0 {
            if run.hangs {
                return; // a tool call hangs; the overall timeout ends it
            }
            return self.finish(exec, cx);
        }
        run.calls_left -= 1;
        let call = CallId { exec, seq: run.seq };
        run.seq += 1;
        run.outstanding = Some((call, now));
        let prompt_tokens = match &self.source {
            Source::Model(m) => run.context.next_prompt(m, cx.rng()),
            Source::Simple(_) => {
                run.context.calls += 1;
                run.context.tokens
            }
            Source::Replay(r) => {
                run.context.calls += 1;
                r.call(call).map_or(run.context.tokens, |c| c.prompt_tokens)
            }
        };
        let to = run.reply_to;
        self.stats.calls += 1;
        if self.work.timer_per_call {
            cx.set_timer(HarnessTimer::CallTimeout(call), self.work.call_timeout);
        }
        cx.send(
            to,
            HarnessEvent::ModelCall {
                call,
                prompt_tokens,
                prompt: BlobId::NONE,
            },
        );
    }

    fn answer(&mut self, call: CallId, output_tokens: u64, cx: &mut Cx<'_, Self>) {
        let now = cx.now();
        let growth = match &self.source {
            Source::Simple(w) => w.growth.draw(cx.rng()),
            Source::Model(_) | Source::Replay(_) => 0,
        };
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
        if self.track_calls {
            self.answered.insert(call);
        }
        run.context.answered(output_tokens);
        run.context.tokens += growth;
        let wait = now - since;
        self.stats.answered += 1;
        self.stats.max_wait = self.stats.max_wait.max(wait);
        if self.work.timer_per_call {
            cx.cancel_timer(&HarnessTimer::CallTimeout(call));
        } else if wait > self.work.call_timeout {
            self.stats.call_timeouts += 1;
        }
        if Self::timed_out(run, now) {
            run.outcome = HarnessOutcome::HarnessTimeout;
            self.finish(call.exec, cx);
        } else if run.calls_left > 0 {
            self.think(call.exec, cx);
        } else if !run.hangs {
            self.finish(call.exec, cx);
        }
    }
}

impl Actor for SimHarness {
    type Msg = HarnessReq;
    type Timer = HarnessTimer;

    fn on_msg(&mut self, _from: ActorId, msg: HarnessReq, cx: &mut Cx<'_, Self>) {
        match msg {
            HarnessReq::Begin {
                exec,
                group,
                reply_to,
            } => {
                if self.runs.contains_key(&exec) {
                    return;
                }
                self.stats.runs += 1;
                self.begin(exec, group, reply_to, cx);
            }
            HarnessReq::Answer {
                call,
                output_tokens,
                ..
            } => self.answer(call, output_tokens, cx),
            HarnessReq::Abort { exec } | HarnessReq::TimedOut { exec } => {
                if let Some(run) = self.runs.remove(&exec) {
                    self.stats.aborted += 1;
                    cx.cancel_timer(&HarnessTimer::Think(exec));
                    if let Some((call, _)) = run.outstanding {
                        self.stats.abandoned += 1;
                        if self.track_calls {
                            self.abandoned.insert(call);
                        }
                        if self.work.timer_per_call {
                            cx.cancel_timer(&HarnessTimer::CallTimeout(call));
                        }
                    }
                    self.end(&run, RunEnd::Aborted, cx.now());
                }
            }
        }
    }

    fn on_timer(&mut self, timer: HarnessTimer, cx: &mut Cx<'_, Self>) {
        match timer {
            HarnessTimer::Think(exec) => self.call(exec, cx),
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
