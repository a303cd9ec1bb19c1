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
//!
//! And every trainer, device-memory and transfer operation in the order
//! they ran, each with its own duration: on the live host a micro-step's
//! time varies several-fold with the machine's load and its tokens, so the
//! `n`-th operation of a kind on a cell's simulated backend (or the
//! transfer engine's) takes the recorded `n`-th one's time rather than the
//! mean. The queueing before it is not part of it: each simulated backend
//! queues as the recorded one did (the trainers and the transfer worker
//! run one operation at a time in both worlds).

use std::collections::BTreeMap;
use std::sync::Arc;

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

/// The trainer, device-memory and transfer operations a record prices one
/// by one, each by its own duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimedOp {
    Warmup,
    FwdBwd,
    Drain,
    Reduce,
    Update,
    ReleaseRollout,
    ReleaseTraining,
    RestoreRollout,
    RestoreTraining,
    Read,
    Expose,
    Publish,
}

impl TimedOp {
    fn of(op: &str) -> Option<Self> {
        Some(match op {
            "trainer.warmup" => TimedOp::Warmup,
            "trainer.fwd_bwd" => TimedOp::FwdBwd,
            "trainer.drain" => TimedOp::Drain,
            "trainer.reduce" => TimedOp::Reduce,
            "trainer.update" => TimedOp::Update,
            "memory.release_rollout" => TimedOp::ReleaseRollout,
            "memory.release_training" => TimedOp::ReleaseTraining,
            "memory.restore_rollout" => TimedOp::RestoreRollout,
            "memory.restore_training" => TimedOp::RestoreTraining,
            "transfer.read" => TimedOp::Read,
            "transfer.expose" => TimedOp::Expose,
            "transfer.publish" => TimedOp::Publish,
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
    /// By cell (`None`: the transfer engine) and kind, each operation's
    /// duration in the order they ran.
    timed: BTreeMap<(Option<u32>, TimedOp), Vec<Nanos>>,
    /// The same for operations of a step (the trainers'), by step.
    by_step: BTreeMap<(Option<u32>, TimedOp, u64), Vec<Nanos>>,
    first_start: Nanos,
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
        // A live record's links cost nothing in the replay (it measures
        // none), and its engine's service time leaves out what else the
        // call waited for: admission into the running batch and the hops
        // through the proxy (a median 0.9 ms a call on the tiny model,
        // whose calls are served in about 6 ms). A call answered at its
        // first attempt is priced at its whole recorded latency; a retried
        // one keeps the answering attempt's service, the replay making its
        // earlier attempts itself.
        let live = rec.header.host == "live";
        let priced = |c: &super::schema::Call| match (live, c.attempts, c.answered_ns) {
            (true, 1, Some(answered)) => Some(answered.saturating_sub(c.issued_ns)),
            _ => c.service_ns,
        };
        for e in &rec.executions {
            let calls = e
                .calls
                .iter()
                .map(|c| ReplayCall {
                    gap: c.gap_ns,
                    prompt_tokens: c.prompt_tokens,
                    output_tokens: c.output_tokens,
                    service: priced(c).unwrap_or(mean_service),
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
        let mut timed: BTreeMap<_, Vec<Nanos>> = BTreeMap::new();
        let mut by_step: BTreeMap<_, Vec<Nanos>> = BTreeMap::new();
        for o in ops {
            if let Some(kind) = TimedOp::of(&o.op) {
                let took = o.end_ns - o.start_ns;
                timed.entry((o.cell, kind)).or_default().push(took);
                if let Some(step) = o.step {
                    by_step.entry((o.cell, kind, step)).or_default().push(took);
                }
                continue;
            }
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
            timed,
            by_step,
            first_start: rec.executions.iter().map(|e| e.start_ns).min().unwrap_or(0),
        })
    }

    /// The duration of the `nth` (from 0) recorded operation of `kind` on
    /// `cell`'s backend (`None`: the transfer engine's).
    pub fn timed(&self, cell: Option<u32>, kind: TimedOp, nth: usize) -> Option<Nanos> {
        self.timed.get(&(cell, kind))?.get(nth).copied()
    }

    /// The duration of the `nth` recorded operation of `kind` of `step` on
    /// `cell`'s backend.
    pub fn timed_in(
        &self,
        cell: Option<u32>,
        kind: TimedOp,
        step: u64,
        nth: usize,
    ) -> Option<Nanos> {
        self.by_step.get(&(cell, kind, step))?.get(nth).copied()
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

    /// When the recorded run's first execution started: the live host's
    /// start-up (its backends and harness runners coming up) before any
    /// call, which a replay waits out before its first call.
    pub fn first_start(&self) -> Nanos {
        self.first_start
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

/// One simulated backend's place in a record's timed operations: how many
/// of each kind it has begun.
#[derive(Debug, Clone)]
pub struct TimedReplay {
    replay: Arc<ReplayWorkload>,
    cell: Option<u32>,
    begun: BTreeMap<TimedOp, usize>,
    begun_in: BTreeMap<(TimedOp, u64), usize>,
}

impl TimedReplay {
    /// The backend of `cell` (`None`: the transfer engine).
    pub fn new(replay: Arc<ReplayWorkload>, cell: Option<u32>) -> Self {
        Self {
            replay,
            cell,
            begun: BTreeMap::new(),
            begun_in: BTreeMap::new(),
        }
    }

    /// The recorded time of the next operation of `kind` in `step`
    /// (counted begun): the `n`-th of the step the recorded `n`-th of that
    /// step on this cell, so a replay whose schedule drifted from the
    /// record's (a satellite that joined one step earlier) still prices
    /// each step's work as it was. `None` if the record's cell did not
    /// run that many of the step.
    pub fn next_in(&mut self, kind: TimedOp, step: u64) -> Option<Nanos> {
        let nth = self.begun_in.entry((kind, step)).or_default();
        let took = self.replay.timed_in(self.cell, kind, step, *nth);
        *nth += 1;
        took
    }

    /// The recorded time of the next operation of `kind` (counted begun);
    /// `None` past the record's last one.
    pub fn next(&mut self, kind: TimedOp) -> Option<Nanos> {
        let nth = self.begun.entry(kind).or_default();
        let took = self.replay.timed(self.cell, kind, *nth);
        *nth += 1;
        took
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::schema::{Call, Execution, Header, Op, SCHEMA_VERSION};
    use gyre_actors::sched::SchedConfig;

    fn op(cell: Option<u32>, name: &str, start: Nanos, took: Nanos, step: Option<u64>) -> Op {
        Op {
            cell,
            op: name.into(),
            start_ns: start,
            end_ns: start + took,
            step,
            tokens: None,
            queued_ns: Some(0),
            execs: None,
        }
    }

    fn recording(ops: Vec<Op>) -> Recording {
        Recording {
            header: Header {
                schema: SCHEMA_VERSION,
                host: "live".into(),
                seed: 1,
                sched: SchedConfig::default(),
                link_ns: 1,
                local_link_ns: 1,
            },
            executions: vec![Execution {
                exec: 0,
                group: 0,
                dispatch_ns: None,
                start_ns: 0,
                end_ns: None,
                outcome: None,
                calls: Vec::new(),
                eval: Vec::new(),
            }],
            ops,
            switches: Vec::new(),
            steps: Vec::new(),
        }
    }

    #[test]
    fn each_step_prices_its_own_operations_in_their_order() {
        let rec = recording(vec![
            // Out of order in the file: read in the order they ran.
            op(Some(0), "trainer.fwd_bwd", 20, 7, Some(0)),
            op(Some(0), "trainer.fwd_bwd", 10, 5, Some(0)),
            op(Some(1), "trainer.fwd_bwd", 12, 9, Some(0)),
            op(Some(0), "trainer.fwd_bwd", 40, 3, Some(1)),
            op(None, "transfer.read", 15, 2, None),
            op(None, "transfer.read", 30, 4, None),
        ]);
        let w = Arc::new(ReplayWorkload::from_recording(&rec).expect("a workload"));
        let mut cell0 = TimedReplay::new(w.clone(), Some(0));
        // Step 1 first: a replay whose cell 0 ran step 0's second
        // micro-step elsewhere still prices step 1's as recorded.
        assert_eq!(cell0.next_in(TimedOp::FwdBwd, 1), Some(3));
        assert_eq!(cell0.next_in(TimedOp::FwdBwd, 0), Some(5));
        assert_eq!(cell0.next_in(TimedOp::FwdBwd, 0), Some(7));
        assert_eq!(cell0.next_in(TimedOp::FwdBwd, 0), None, "past the record");
        let mut cell1 = TimedReplay::new(w.clone(), Some(1));
        assert_eq!(cell1.next_in(TimedOp::FwdBwd, 0), Some(9));
        assert_eq!(cell1.next_in(TimedOp::FwdBwd, 1), None, "cell 1 ran none");
        let mut transfer = TimedReplay::new(w, None);
        assert_eq!(transfer.next(TimedOp::Read), Some(2));
        assert_eq!(transfer.next(TimedOp::Read), Some(4));
        assert_eq!(transfer.next(TimedOp::Read), None);
    }

    #[test]
    fn a_live_call_answered_at_once_costs_its_whole_latency() {
        let call = |seq, attempts| Call {
            seq,
            gap_ns: 0,
            prompt_tokens: 10,
            output_tokens: 4,
            issued_ns: 100,
            answered_ns: Some(1_100),
            service_ns: Some(800),
            attempts,
            engine: None,
        };
        let mut rec = recording(Vec::new());
        rec.executions[0].calls = vec![call(0, 1), call(1, 2)];
        rec.executions[0].start_ns = 29;
        let w = ReplayWorkload::from_recording(&rec).expect("a workload");
        assert_eq!(w.first_start(), 29, "the live host's start-up");
        let service = |rec: &Recording, seq| {
            let w = ReplayWorkload::from_recording(rec).expect("a workload");
            w.call(CallId {
                exec: ExecId(0),
                seq,
            })
            .expect("recorded")
            .service
        };
        // Live: admission and hops are in the latency, not the service.
        assert_eq!(service(&rec, 0), 1_000);
        // A retried call: the replay makes the earlier attempts itself.
        assert_eq!(service(&rec, 1), 800);
        // On the simulator host the links are replayed: the service only.
        rec.header.host = "sim".into();
        assert_eq!(service(&rec, 0), 800);
    }
}
