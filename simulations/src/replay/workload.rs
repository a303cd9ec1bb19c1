//! The recorded workload as the simulated backends read it: per execution
//! its calls (gap, prompt and output tokens, the engine's service time),
//! its ending and its evaluation attempts.
//!
//! Executions are looked up by id: the scheduler numbers them in dispatch
//! order in both worlds, so a replay's execution `e` is the recorded `e`.
//! One the recorded run never started (the replay dispatched further
//! before its last step) borrows the recorded execution `e mod n`, so the
//! replay is still driven only by what was recorded.
//!
//! It also holds each engine's control operations (pin, cancel, unload,
//! load) in the order they ran, each with the time from its arrival to its
//! answer: an embedded engine runs one job at a time, so a control waits
//! behind the decode step in flight and the jobs queued before it, and the
//! simulated engine, which has no decode steps, answers its `n`-th control
//! of a kind after the recorded `n`-th one's time. A pin pins the
//! executions the recorded one did (the embedded engine pins only calls it
//! holds running, the simulated one whatever it has cached).

use std::collections::BTreeMap;

use gyre_actors::sched::ids::{CallId, EngineIx, ExecId};
use gyre_runtime::Nanos;
use rustc_hash::FxHashMap;

use super::schema::{Outcome, Recording};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayCall {
    pub gap: Nanos,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub service: Nanos,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayExec {
    pub calls: Vec<ReplayCall>,
    pub outcome: Outcome,
    /// Whether evaluation attempt `i` failed.
    pub eval_failed: Vec<bool>,
    pub eval_latency: Nanos,
}

/// The engine control operations a record prices one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ControlKind {
    Pin,
    Cancel,
    Unload,
    Load,
}

impl ControlKind {
    fn of(op: &str) -> Option<Self> {
        Some(match op {
            "engine.pin" => ControlKind::Pin,
            "engine.cancel" => ControlKind::Cancel,
            "engine.unload" => ControlKind::Unload,
            "engine.load" => ControlKind::Load,
            _ => return None,
        })
    }
}

/// One recorded control operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayControl {
    /// From its arrival at the engine to its answer: queued, then run.
    pub took: Nanos,
    /// A pin: the executions it pinned.
    pub execs: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayWorkload {
    execs: Vec<ReplayExec>,
    index: FxHashMap<u64, usize>,
    /// By engine (`None`: the pool) and kind, in the order they ran.
    controls: BTreeMap<(Option<u32>, ControlKind), Vec<ReplayControl>>,
}

impl ReplayWorkload {
    /// The workload of `rec`; `None` if it recorded no execution.
    pub fn from_recording(rec: &Recording) -> Option<Self> {
        let served: Vec<Nanos> = rec
            .executions
            .iter()
            .flat_map(|e| e.calls.iter().filter_map(|c| c.service_ns))
            .collect();
        let mean_service = if served.is_empty() {
            0
        } else {
            served.iter().sum::<Nanos>() / served.len() as Nanos
        };
        let mut execs = Vec::new();
        let mut index = FxHashMap::default();
        for e in &rec.executions {
            let calls = e
                .calls
                .iter()
                .map(|c| ReplayCall {
                    gap: c.gap_ns,
                    prompt_tokens: c.prompt_tokens,
                    output_tokens: c.output_tokens,
                    service: c.service_ns.unwrap_or(mean_service),
                })
                .collect();
            index.insert(e.exec, execs.len());
            execs.push(ReplayExec {
                calls,
                // Still running at the end: it would have gone on, as a
                // run cut short by its execution does.
                outcome: e.outcome.unwrap_or(Outcome::Aborted),
                eval_failed: e.eval.iter().map(|a| !a.ok).collect(),
                eval_latency: e.eval.first().map_or(0, |a| a.took_ns),
            });
        }
        let mut controls: BTreeMap<_, Vec<ReplayControl>> = BTreeMap::new();
        let mut ops: Vec<_> = rec.ops.iter().collect();
        ops.sort_by_key(|o| (o.start_ns, o.end_ns));
        for o in ops {
            // Only a record that says how long it queued prices it.
            let (Some(kind), Some(queued)) = (ControlKind::of(&o.op), o.queued_ns) else {
                continue;
            };
            controls
                .entry((o.cell, kind))
                .or_default()
                .push(ReplayControl {
                    took: queued + (o.end_ns - o.start_ns),
                    execs: o.execs.clone().unwrap_or_default(),
                });
        }
        (!execs.is_empty()).then_some(Self {
            execs,
            index,
            controls,
        })
    }

    /// The `nth` (from 0) recorded control of `kind` on `engine`.
    pub fn control(
        &self,
        engine: EngineIx,
        kind: ControlKind,
        nth: usize,
    ) -> Option<&ReplayControl> {
        let cell = match engine {
            EngineIx::Cell(c) => Some(c),
            EngineIx::Pool => None,
        };
        self.controls.get(&(cell, kind))?.get(nth)
    }

    /// The recorded execution `exec`, or the one it borrows.
    pub fn exec(&self, exec: ExecId) -> &ReplayExec {
        let i = self
            .index
            .get(&exec.0)
            .copied()
            .unwrap_or((exec.0 % self.execs.len() as u64) as usize);
        &self.execs[i]
    }

    /// The recorded call, if the execution made that many.
    pub fn call(&self, call: CallId) -> Option<&ReplayCall> {
        self.exec(call.exec).calls.get(call.seq as usize)
    }

    pub fn len(&self) -> usize {
        self.execs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.execs.is_empty()
    }
}
