//! The run journal behind `gyre train --record`: what the backends saw,
//! each event with the host's clock, turned into the run record of
//! `gyre_simulations::replay::schema` at the end.
//!
//! It is a write-only sink, like a log: handlers append to it and nothing
//! in the run ever reads it, so a recorded run takes exactly the schedule
//! of an unrecorded one (same events, same trace hash). The backends are
//! where both hosts can see the work (the live host offers no view into
//! the scheduling plane's actors): the harness sees executions and calls,
//! the engines each attempt's service time and their unloads and loads,
//! the trainers and device memories their operations, the evaluator its
//! attempts. On the simulator host the scheduling plane is also observed
//! from outside (`replay::observe`: dispatches and exact role changes);
//! on the live host role changes are read from the device memories'
//! releases and restores instead.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gyre_actors::sched::cell::CellRole;
use gyre_actors::sched::ids::{CallId, EngineIx, ExecId, GroupId};
use gyre_actors::sched::proto::harness::HarnessOutcome;
use gyre_runtime::Nanos;
use gyre_simulations::replay::observe::{RoleChange, switches};
use gyre_simulations::replay::schema::{
    Call, EvalAttempt, Execution, Header, MicroStep, Op, Outcome, Recording, Step as StepLine,
};

use super::shared::lock;

#[derive(Debug, Default)]
struct CallLog {
    prompt_tokens: u64,
    issued: Nanos,
    answered: Option<Nanos>,
    output_tokens: u64,
    attempts: u32,
    service: Option<Nanos>,
    engine: Option<EngineIx>,
}

#[derive(Debug, Default)]
struct ExecLog {
    group: u64,
    start: Nanos,
    end: Option<(Nanos, Outcome)>,
    calls: BTreeMap<u32, CallLog>,
    eval: Vec<EvalAttempt>,
}

#[derive(Debug, Default)]
struct Log {
    execs: BTreeMap<ExecId, ExecLog>,
    ops: Vec<Op>,
}

/// A backend operation of `kind` that arrived at `arrived`, began at
/// `began` and ended at `end` (step, tokens and executions unset).
pub fn op_line(cell: Option<u32>, kind: &str, arrived: Nanos, began: Nanos, end: Nanos) -> Op {
    Op {
        cell,
        op: kind.to_owned(),
        start_ns: began,
        end_ns: end,
        step: None,
        tokens: None,
        queued_ns: Some(began.saturating_sub(arrived)),
        execs: None,
    }
}

/// The sink every recording backend appends to (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Journal(Arc<Mutex<Log>>);

fn engine_name(e: EngineIx) -> String {
    match e {
        EngineIx::Pool => "pool".to_owned(),
        EngineIx::Cell(c) => format!("cell {c}"),
    }
}

impl Journal {
    pub fn new() -> Self {
        Self::default()
    }

    fn with(&self, f: impl FnOnce(&mut Log)) {
        f(&mut lock(&self.0));
    }

    pub fn begun(&self, exec: ExecId, group: GroupId, at: Nanos) {
        self.with(|l| {
            l.execs.entry(exec).or_insert(ExecLog {
                group: group.0,
                start: at,
                ..ExecLog::default()
            });
        });
    }

    pub fn called(&self, call: CallId, prompt_tokens: u64, at: Nanos) {
        self.with(|l| {
            if let Some(e) = l.execs.get_mut(&call.exec) {
                e.calls.entry(call.seq).or_default().prompt_tokens = prompt_tokens;
                e.calls.entry(call.seq).or_default().issued = at;
            }
        });
    }

    pub fn answered(&self, call: CallId, output_tokens: u64, at: Nanos) {
        self.with(|l| {
            if let Some(c) = l
                .execs
                .get_mut(&call.exec)
                .and_then(|e| e.calls.get_mut(&call.seq))
            {
                c.answered = Some(at);
                c.output_tokens = output_tokens;
            }
        });
    }

    /// An engine accepted an attempt of `call`.
    pub fn attempt(&self, call: CallId) {
        self.with(|l| {
            if let Some(c) = l
                .execs
                .get_mut(&call.exec)
                .and_then(|e| e.calls.get_mut(&call.seq))
            {
                c.attempts += 1;
            }
        });
    }

    /// `engine` answered an attempt of `call` it accepted at `start`.
    pub fn served(&self, call: CallId, engine: EngineIx, start: Nanos, end: Nanos) {
        self.with(|l| {
            if let Some(c) = l
                .execs
                .get_mut(&call.exec)
                .and_then(|e| e.calls.get_mut(&call.seq))
            {
                c.service = Some(end.saturating_sub(start));
                c.engine = Some(engine);
            }
        });
    }

    pub fn finished(&self, exec: ExecId, outcome: HarnessOutcome, at: Nanos) {
        let o = match outcome {
            HarnessOutcome::Completed => Outcome::Completed,
            HarnessOutcome::HarnessTimeout => Outcome::HarnessTimeout,
            HarnessOutcome::Failed { complete: false } => Outcome::Failed,
            HarnessOutcome::Failed { complete: true } => Outcome::FailedComplete,
        };
        self.ended(exec, o, at);
    }

    pub fn aborted(&self, exec: ExecId, at: Nanos) {
        self.ended(exec, Outcome::Aborted, at);
    }

    fn ended(&self, exec: ExecId, outcome: Outcome, at: Nanos) {
        self.with(|l| {
            if let Some(e) = l.execs.get_mut(&exec) {
                e.end.get_or_insert((at, outcome));
            }
        });
    }

    pub fn evaluated(&self, exec: ExecId, at: Nanos, took: Nanos, ok: bool) {
        self.with(|l| {
            if let Some(e) = l.execs.get_mut(&exec) {
                e.eval.push(EvalAttempt {
                    at_ns: at,
                    took_ns: took,
                    ok,
                });
            }
        });
    }

    /// One backend operation (kinds: `replay::schema::OP_KINDS`).
    pub fn op(&self, op: Op) {
        self.with(|l| l.ops.push(op));
    }

    /// The record: `header`, what the backends saw, and (simulator host)
    /// the observed dispatches and role changes; without those, role
    /// changes come from the device memories' operations.
    pub fn recording(
        &self,
        header: Header,
        observed: Option<(&[Nanos], &[RoleChange])>,
    ) -> Recording {
        let l = lock(&self.0);
        let mu = header.sched.mu;
        let mut ops = l.ops.clone();
        ops.sort_by_key(|o| (o.start_ns, o.end_ns));
        let steps = steps(&ops, header.sched.target_steps);
        let ends: Vec<Nanos> = steps.iter().map(|s| s.end_ns).collect();
        let changes = match observed {
            Some((_, changes)) => changes.to_vec(),
            None => changes_from_memory(&ops),
        };
        let executions = l
            .execs
            .iter()
            .map(|(id, e)| Execution {
                exec: id.0,
                group: e.group,
                dispatch_ns: observed
                    .and_then(|(d, _)| d.get(id.0 as usize).copied())
                    .filter(|d| *d <= e.start),
                start_ns: e.start,
                end_ns: e.end.map(|(t, _)| t),
                outcome: e.end.map(|(_, o)| o),
                calls: calls(e),
                eval: e.eval.clone(),
            })
            .collect();
        Recording {
            switches: switches(&changes, &ends, mu, &ops),
            header,
            executions,
            ops,
            steps,
        }
    }
}

fn calls(e: &ExecLog) -> Vec<Call> {
    let mut prev = e.start;
    e.calls
        .iter()
        .map(|(seq, c)| {
            let gap = c.issued.saturating_sub(prev);
            prev = c.answered.unwrap_or(c.issued);
            Call {
                seq: *seq,
                gap_ns: gap,
                prompt_tokens: c.prompt_tokens,
                output_tokens: c.output_tokens,
                issued_ns: c.issued,
                answered_ns: c.answered,
                service_ns: c.service,
                attempts: c.attempts.max(1),
                engine: c.engine.map(engine_name),
            }
        })
        .collect()
}

/// Steps from the trainers' operations: the core's update ends a step,
/// micro-steps belong to the step they name (operations name steps from 0,
/// step lines from 1).
fn steps(ops: &[Op], target: u64) -> Vec<StepLine> {
    let mut out: BTreeMap<u64, StepLine> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.op == "trainer.update") {
        let Some(step) = o.step.map(|s| s + 1).filter(|s| (1..=target).contains(s)) else {
            continue;
        };
        out.entry(step).or_insert(StepLine {
            step,
            micro_steps: Vec::new(),
            train_ns: 0,
            update_ns: o.end_ns - o.start_ns,
            end_ns: o.end_ns,
        });
    }
    for o in ops.iter().filter(|o| o.op == "trainer.fwd_bwd") {
        if let Some(s) = o.step.and_then(|s| out.get_mut(&(s + 1))) {
            let took = o.end_ns - o.start_ns;
            s.train_ns += took;
            s.micro_steps.push(MicroStep {
                cell: o.cell.unwrap_or(0),
                tokens: o.tokens.unwrap_or(0),
                took_ns: took,
            });
        }
    }
    out.into_values().collect()
}

/// Role changes as the device memories saw them: releasing rollout memory
/// leaves rollout (the cell is switching) and restoring training memory
/// enters training; releasing training memory leaves training, restoring
/// rollout memory serves again.
fn changes_from_memory(ops: &[Op]) -> Vec<RoleChange> {
    use CellRole::*;
    let mut out = Vec::new();
    for o in ops {
        let Some(cell) = o.cell else { continue };
        let (from, to, at) = match o.op.as_str() {
            "memory.release_rollout" => (Rollout, Switching, o.start_ns),
            "memory.restore_training" => (Switching, Training, o.end_ns),
            "memory.release_training" => (Training, Returning, o.start_ns),
            "memory.restore_rollout" => (Returning, Rollout, o.end_ns),
            _ => continue,
        };
        out.push(RoleChange { cell, from, to, at });
    }
    out.sort_by_key(|c| c.at);
    out
}
