//! The evaluator: turns a closed execution into a training outcome.
//!
//! Each job is the trajectory plane's [`ExecutionScoring`] driven by
//! messages, so SPEC 3.3 has one implementation:
//! - a complete failure (nothing was produced) becomes a zero-reward dummy,
//!   so group counts stay complete;
//! - everything else is scored on its preserved state, also after a
//!   timeout or a cancellation (a valid score then carries `partial`); a
//!   failed evaluation is pending, not a zero, and is retried on the same
//!   state while the execution's total time budget lasts;
//! - when the budget runs out with no valid score (an overall timeout
//!   leaves none at all; a score that arrives late counts as none) the
//!   execution is excluded.
//!
//! - a cancelled execution is the surplus of an over-sampled group that has
//!   formed without it (the only cancellation the scheduler sends): it is
//!   not scored, and goes to the buffer as excluded, to be discarded there
//!   with its records.
//!
//! The reward comes only from the evaluator backend, never from elapsed time,
//! length or termination status.

use std::collections::BTreeMap;

use gyre_runtime::{Actor, ActorId, Addr, Cx, Nanos};

use crate::sched::buffer::{Buffer, BufferMsg};
use crate::sched::execution::ExecStatus;
use crate::sched::ids::ExecId;
pub use crate::sched::msg::evaluator::{EvalJob, EvaluatorMsg};
use crate::sched::proto::Port;
use crate::sched::proto::evaluator::{EvalEvent, EvalReq, EvalState};
use crate::sched::retry::{Outbox, ReqKey, Resend, RetryTick};
use crate::trajectory::scoring::{
    ArtifactRef, EvalBinding, EvalResult, Evaluation, ExecutionScoring, Outcome, Termination,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EvalTimer {
    Retry(ExecId),
    /// The outbox's resend tick (lost requests, not failed evaluations).
    Resend,
}

impl From<RetryTick> for EvalTimer {
    fn from(_: RetryTick) -> Self {
        EvalTimer::Resend
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvalStats {
    pub scored: u64,
    pub failed_attempts: u64,
    pub dummies: u64,
    pub excluded: u64,
    /// Cancelled surplus executions passed on unscored.
    pub surplus: u64,
}

/// One execution being evaluated.
#[derive(Debug)]
struct Job {
    job: EvalJob,
    scoring: ExecutionScoring,
    attempt: u32,
    /// The state the current attempt evaluated, as its backend named it.
    state: Option<ArtifactRef>,
}

/// How an execution ended, in the scoring module's terms (recorded, never
/// a reward).
fn termination(status: ExecStatus) -> Termination {
    match status {
        ExecStatus::Completed => Termination::Completed,
        ExecStatus::Failed { .. } => Termination::Failed,
        ExecStatus::HarnessTimeout | ExecStatus::OverallTimeout => Termination::TimedOut,
        ExecStatus::Cancelled => Termination::Cancelled,
    }
}

/// The preserved state to evaluate: the execution's final workspace, or
/// nothing after a complete failure.
fn artifact(status: ExecStatus) -> Option<ArtifactRef> {
    match status {
        ExecStatus::Failed { complete: true } => None,
        _ => Some(ArtifactRef::unnamed()),
    }
}

#[derive(Debug)]
pub struct Evaluator {
    backend: Port<EvalReq>,
    buffer: Addr<Buffer>,
    retry: Nanos,
    jobs: BTreeMap<ExecId, Job>,
    outbox: Outbox,
    stats: EvalStats,
    /// Every score bound to a state a backend named (execution, artifact
    /// with its content hash and branch, score), in order; never
    /// overwritten (SPEC 3.3).
    bound: Vec<EvalBinding>,
}

impl Evaluator {
    pub fn new(backend: Port<EvalReq>, buffer: Addr<Buffer>, retry: Nanos) -> Self {
        Self {
            backend,
            buffer,
            retry,
            jobs: BTreeMap::new(),
            outbox: Outbox::new(None),
            stats: EvalStats::default(),
            bound: Vec::new(),
        }
    }

    /// Resends unanswered score requests every `after` (a lost request or
    /// answer; a failed evaluation is retried after `retry` as before).
    pub fn with_resend(mut self, after: Option<Nanos>) -> Self {
        self.outbox = Outbox::new(after);
        self
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    pub fn stats(&self) -> EvalStats {
        self.stats
    }

    /// The scores bound to states their backend named.
    pub fn bindings(&self) -> &[EvalBinding] {
        &self.bound
    }

    /// Evaluations in progress or waiting for a retry.
    pub fn in_progress(&self) -> usize {
        self.jobs.len()
    }

    fn resolve(&mut self, job: EvalJob, outcome: Outcome, cx: &mut Cx<'_, Self>) {
        match outcome {
            Outcome::Valid { .. } => self.stats.scored += 1,
            Outcome::Dummy => self.stats.dummies += 1,
            Outcome::Excluded { .. } => self.stats.excluded += 1,
            Outcome::Open | Outcome::Pending { .. } => return,
        }
        self.send_result(job, outcome, cx);
    }

    fn send_result(&mut self, job: EvalJob, outcome: Outcome, cx: &mut Cx<'_, Self>) {
        cx.send(
            self.buffer,
            BufferMsg::Resolved {
                exec: job.exec,
                group: job.group,
                v_d: job.v_d,
                outcome,
                tokens: job.tokens,
                records: job.records,
            },
        );
    }

    fn ask(&mut self, exec: ExecId, attempt: u32, cx: &mut Cx<'_, Self>) {
        let reply_to = cx.recipient();
        let req = EvalReq::Score {
            exec,
            attempt,
            reply_to,
        };
        self.outbox.send(cx, Resend::Eval(self.backend, req));
    }

    fn evaluate(&mut self, job: EvalJob, cx: &mut Cx<'_, Self>) {
        if self.jobs.contains_key(&job.exec) {
            return;
        }
        if job.status == ExecStatus::Cancelled {
            self.stats.surplus += 1;
            self.send_result(job, Outcome::Excluded { attempts: 0 }, cx);
            return;
        }
        let now = cx.now();
        let mut scoring = ExecutionScoring::new(format!("{:?}", job.exec), job.deadline);
        if scoring
            .close(termination(job.status), artifact(job.status))
            .is_err()
        {
            return;
        }
        // Closed at (or past) the end of its budget: nothing left to score in.
        scoring.expire(now);
        if scoring.wants_evaluation(now) {
            let exec = job.exec;
            self.jobs.insert(
                exec,
                Job {
                    job,
                    scoring,
                    attempt: 0,
                    state: None,
                },
            );
            self.ask(exec, 0, cx);
        } else {
            let outcome = scoring.outcome().clone();
            self.resolve(job, outcome, cx);
        }
    }

    /// Feeds one backend answer to the job's scoring; a final outcome goes
    /// to the buffer, a pending one is retried while the budget lasts.
    fn answer(&mut self, exec: ExecId, attempt: u32, result: EvalResult, cx: &mut Cx<'_, Self>) {
        let now = cx.now();
        let Some(j) = self.jobs.get_mut(&exec) else {
            return;
        };
        if j.attempt != attempt {
            return;
        }
        // A state the backend named is what this attempt is bound to; the
        // first one names the execution's (until then unnamed) final state.
        let named = j.state.take();
        if let Some(state) = &named {
            j.scoring.identify(state.clone());
        }
        let Some(artifact) = named.or_else(|| j.scoring.designated().cloned()) else {
            return;
        };
        let mut failed = matches!(result, EvalResult::EvaluatorFailed { .. });
        let eval = |result| Evaluation {
            artifact: artifact.clone(),
            result,
            at_ns: now,
        };
        let outcome = match j.scoring.on_evaluation(eval(result)) {
            Ok(o) => o.clone(),
            Err(error) => {
                // A score the scoring refuses (not finite) is no score: the
                // attempt failed.
                tracing::warn!(?exec, %error, "evaluation refused");
                failed = true;
                let failure = EvalResult::EvaluatorFailed {
                    reason: error.to_string(),
                };
                match j.scoring.on_evaluation(eval(failure)) {
                    Ok(o) => o.clone(),
                    Err(_) => return,
                }
            }
        };
        if failed {
            self.stats.failed_attempts += 1;
        }
        // A score just bound to a named state (a refused one counted as
        // failed above).
        if !failed
            && !artifact.digest.is_empty()
            && let Some(b) = j.scoring.bindings().find(|b| b.artifact == artifact)
        {
            self.bound.push(b.clone());
        }
        if outcome.is_final() {
            if let Some(j) = self.jobs.remove(&exec) {
                self.resolve(j.job, outcome, cx);
            }
            return;
        }
        let (group, v_d, left) = (j.job.group, j.job.v_d, j.job.deadline.saturating_sub(now));
        cx.send(self.buffer, BufferMsg::Pending { exec, group, v_d });
        cx.set_timer(EvalTimer::Retry(exec), self.retry.min(left));
    }
}

impl Actor for Evaluator {
    type Msg = EvaluatorMsg;
    type Timer = EvalTimer;
    gyre_runtime::accepts!(EvalJob, EvalEvent, EvalState);

    fn on_msg(&mut self, _from: ActorId, msg: EvaluatorMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            EvaluatorMsg::Evaluate(job) => self.evaluate(job, cx),
            // An answer counts once (see `crate::sched::retry`).
            EvaluatorMsg::Backend(e) if !self.outbox.ack(&e) => {}
            EvaluatorMsg::Backend(EvalEvent::Scored {
                exec,
                attempt,
                reward,
            }) => {
                let result = EvalResult::Scored {
                    score: reward as f32,
                };
                self.answer(exec, attempt, result, cx);
            }
            EvaluatorMsg::State(s) => {
                if let Some(j) = self.jobs.get_mut(&s.exec)
                    && j.attempt == s.attempt
                {
                    j.state = Some(s.artifact);
                }
            }
            EvaluatorMsg::Backend(EvalEvent::Failed { exec, attempt }) => {
                let result = EvalResult::EvaluatorFailed {
                    reason: "evaluator backend failed".to_owned(),
                };
                self.answer(exec, attempt, result, cx);
            }
        }
    }

    fn on_timer(&mut self, timer: EvalTimer, cx: &mut Cx<'_, Self>) {
        let exec = match timer {
            EvalTimer::Retry(exec) => exec,
            EvalTimer::Resend => return self.outbox.tick(cx),
        };
        let now = cx.now();
        let Some(j) = self.jobs.get_mut(&exec) else {
            return;
        };
        if j.scoring.wants_evaluation(now) {
            j.attempt += 1;
            let a = j.attempt;
            self.ask(exec, a, cx);
            return;
        }
        let outcome = j.scoring.expire(now).clone();
        let attempt = j.attempt;
        self.outbox.forget(&ReqKey::Score(exec, attempt));
        if let Some(j) = self.jobs.remove(&exec) {
            self.resolve(j.job, outcome, cx);
        }
    }
}
