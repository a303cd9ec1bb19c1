//! The recorded workload as the simulated backends read it: per execution
//! its calls (gap, prompt and output tokens, the engine's service time),
//! its ending and its evaluation attempts.
//!
//! Executions are looked up by id: the scheduler numbers them in dispatch
//! order in both worlds, so a replay's execution `e` is the recorded `e`.
//! One the recorded run never started (the replay dispatched further
//! before its last step) borrows the recorded execution `e mod n`, so the
//! replay is still driven only by what was recorded.

use gyre_actors::sched::ids::{CallId, ExecId};
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayWorkload {
    execs: Vec<ReplayExec>,
    index: FxHashMap<u64, usize>,
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
        (!execs.is_empty()).then_some(Self { execs, index })
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
