//! Where a run's GPU time went, by role and phase, integrated exactly from
//! the simulation's own events rather than sampled.
//!
//! The simulator calls [`Breakdown::hook`] after every event (through its
//! invariant hook, which only reads); the hook re-reads the cluster only
//! after events on the actors it reads. Every quantity it reads — a cell's
//! role, the ledger's slot occupancy, the dispatch queue, what a trainer is
//! computing, whether a publication is under way — changes only at events,
//! so the state seen after the last event at time t holds until the next
//! event, and integrating it over that interval is exact. Integration stops
//! at the last step's optimizer update, the run's end, so the phases of a
//! run add up to its GPU-hours: total hours × nodes × GPUs per node.
//!
//! The phases answer SPEC 5's question of where each policy loses time
//! (SPEC 2.2–2.6 name the losses):
//! - a rollout cell's GPUs are *busy* in proportion to its occupied slots
//!   (executions placed / C_e); its free slots are *waiting for the last
//!   groups* when nothing is queued and the batch in training still lacks
//!   groups (boundary dispatch: the burst waits for its long tail), *waiting
//!   on training* when nothing is queued and the batch is complete (training
//!   and publication exposed on the critical path), and *idle* otherwise;
//! - a cell leaving rollout (draining, switching) or returning to it is
//!   *switching* (SPEC 2.5);
//! - a training cell is in *warm-up/drain* (pipeline fill and drain, the
//!   prefix groups built once, SPEC 2.6), *training* (micro-steps),
//!   *optimizer* (gradient gather, update, parameter broadcast), waiting on
//!   a *publication*, or *idle* (no micro-step to claim: the batch is still
//!   rolling out, as Async's fixed training cells wait).
//!
//! Per step it also records when the batch became complete (the packer
//! moved past it), when the update finished and the publication that ended
//! a burst: the critical path of a step.

use std::cell::RefCell;
use std::rc::Rc;

use gyre_actors::sched::Policy;
use gyre_actors::sched::cell::CellRole;
use gyre_actors::sched::core::CorePhase;
use gyre_actors::sched::ids::EngineIx;
use gyre_actors::sched::maths::ledger::Role;
use gyre_actors::sched::maths::prefix::next_to_switch;
use gyre_actors::sched::maths::watermark::may_move;
use gyre_runtime::sim::SimView;
use gyre_runtime::{ActorId, Nanos, SECS};
use serde::Serialize;

use crate::backends::trainer::TrainerOp;
use crate::world::Cluster;

/// A phase of GPU time (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    RolloutBusy,
    WaitingLastGroups,
    WaitingOnTraining,
    RolloutIdle,
    Switching,
    Returning,
    WarmupDrain,
    Training,
    Optimizer,
    Publication,
    TrainingIdle,
}

impl Phase {
    pub const ALL: [Phase; 11] = [
        Phase::RolloutBusy,
        Phase::WaitingLastGroups,
        Phase::WaitingOnTraining,
        Phase::RolloutIdle,
        Phase::Switching,
        Phase::Returning,
        Phase::WarmupDrain,
        Phase::Training,
        Phase::Optimizer,
        Phase::Publication,
        Phase::TrainingIdle,
    ];

    /// The name in `--json` and the tables.
    pub fn name(self) -> &'static str {
        match self {
            Phase::RolloutBusy => "rollout_busy",
            Phase::WaitingLastGroups => "waiting_last_groups",
            Phase::WaitingOnTraining => "waiting_on_training",
            Phase::RolloutIdle => "rollout_idle",
            Phase::Switching => "switching_to_training",
            Phase::Returning => "switching_to_rollout",
            Phase::WarmupDrain => "warmup_drain",
            Phase::Training => "training",
            Phase::Optimizer => "optimizer",
            Phase::Publication => "publication",
            Phase::TrainingIdle => "training_idle",
        }
    }

    /// GPU time in the rollout role.
    pub fn is_rollout(self) -> bool {
        matches!(
            self,
            Phase::RolloutBusy
                | Phase::WaitingLastGroups
                | Phase::WaitingOnTraining
                | Phase::RolloutIdle
        )
    }

    fn ix(self) -> usize {
        self as usize
    }
}

/// GPU-hours by role and phase, one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuHours {
    pub total: f64,
    pub rollout_busy: f64,
    pub waiting_last_groups: f64,
    pub waiting_on_training: f64,
    pub rollout_idle: f64,
    pub switching_to_training: f64,
    pub switching_to_rollout: f64,
    pub warmup_drain: f64,
    pub training: f64,
    pub optimizer: f64,
    pub publication: f64,
    pub training_idle: f64,
    /// The part of `waiting_last_groups` during which the watermark rule
    /// (SPEC 2.3, (2)) would already let the next cell (Colocate: every
    /// cell) leave rollout, so the supply check or a switch under way held
    /// it back; the rest waited on the watermark. Not a phase of its own.
    pub waiting_last_groups_movable: f64,
}

impl GpuHours {
    pub fn get(&self, p: Phase) -> f64 {
        match p {
            Phase::RolloutBusy => self.rollout_busy,
            Phase::WaitingLastGroups => self.waiting_last_groups,
            Phase::WaitingOnTraining => self.waiting_on_training,
            Phase::RolloutIdle => self.rollout_idle,
            Phase::Switching => self.switching_to_training,
            Phase::Returning => self.switching_to_rollout,
            Phase::WarmupDrain => self.warmup_drain,
            Phase::Training => self.training,
            Phase::Optimizer => self.optimizer,
            Phase::Publication => self.publication,
            Phase::TrainingIdle => self.training_idle,
        }
    }

    /// The phases' sum (equals `total` up to rounding).
    pub fn sum(&self) -> f64 {
        Phase::ALL.iter().map(|p| self.get(*p)).sum()
    }
}

/// One step's critical path, hours from the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepPath {
    /// The previous step's update (0 for the first).
    pub from: f64,
    /// The batch's last group was taken by the packer.
    pub batch_complete: f64,
    /// The optimizer update finished.
    pub update: f64,
    /// The publication that ended the burst, if this step ended one.
    pub published: Option<f64>,
}

/// The integrator the simulator's hook drives.
#[derive(Debug)]
pub struct Breakdown {
    /// Nodes per row: cells in order, then the pool.
    nodes: Vec<f64>,
    capacity: Vec<f64>,
    steps: u64,
    /// Node-nanoseconds by phase.
    acc: [f64; 11],
    /// Node weight of each phase in the state seen after the last event.
    now_weights: [f64; 11],
    /// Node-nanoseconds of the tail while a move was allowed, and its
    /// current weight.
    movable: f64,
    now_movable: f64,
    last: Nanos,
    end: Option<Nanos>,
    /// Batch-complete and update times per step, and publications.
    complete_at: Vec<Nanos>,
    updates: usize,
    gpus_per_node: f64,
    /// The actors the hook read last time (empty: read on every event),
    /// and the simulator's count of outside changes then: events on other
    /// actors leave what it read unchanged (the simulation's actors share
    /// no state), so the hook skips them.
    watched: Vec<ActorId>,
    seen_changes: u64,
}

impl Breakdown {
    pub fn new(
        cells: u32,
        nodes_per_cell: u32,
        cell_capacity: u32,
        pool: Option<(u32, u32)>,
        gpus_per_node: u32,
        steps: u64,
    ) -> Self {
        let mut nodes = vec![f64::from(nodes_per_cell); cells as usize];
        let mut capacity = vec![f64::from(cell_capacity.max(1)); cells as usize];
        if let Some((n, c)) = pool.filter(|(_, c)| *c > 0) {
            nodes.push(f64::from(n));
            capacity.push(f64::from(c));
        }
        Self {
            nodes,
            capacity,
            steps,
            acc: [0.0; 11],
            now_weights: [0.0; 11],
            movable: 0.0,
            now_movable: 0.0,
            last: 0,
            end: None,
            complete_at: Vec::new(),
            updates: 0,
            gpus_per_node: f64::from(gpus_per_node.max(1)),
            watched: Vec::new(),
            seen_changes: 0,
        }
    }

    /// A hook for `Sim::set_invariant` that feeds `this` (never fails).
    pub fn hook(
        this: Rc<RefCell<Breakdown>>,
        cluster: &Cluster,
    ) -> impl FnMut(&SimView<'_>) -> Result<(), String> + 'static {
        let sched = cluster.sched;
        let trainers = cluster.backends.trainers.clone();
        let transfer = cluster.backends.transfer;
        move |view| {
            let mut b = this.borrow_mut();
            let now = view.now();
            b.advance(now);
            if b.end.is_some() || !b.must_read(view) {
                return Ok(());
            }
            b.watched.clear();
            b.seen_changes = view.outside_changes();
            let Some(s) = view.actor(sched) else {
                return Ok(());
            };
            let Some(peers) = s.peers() else {
                return Ok(());
            };
            b.watched.extend(
                [
                    sched.id(),
                    peers.packer.id(),
                    peers.core.id(),
                    transfer.id(),
                ]
                .into_iter()
                .chain(peers.cells.iter().map(|c| c.id()))
                .chain(trainers.iter().map(|t| t.id())),
            );
            let updates = trainers
                .first()
                .and_then(|t| view.actor(*t))
                .map_or(0, |t| t.updates().len());
            if updates as u64 >= b.steps {
                b.end = Some(now);
                return Ok(());
            }
            b.updates = updates;
            let packer_step = view.actor(peers.packer).map_or(0, |p| p.step());
            while (b.complete_at.len() as u64) < packer_step {
                b.complete_at.push(now);
            }
            let core_phase = view.actor(peers.core).map(|c| c.phase());
            let publishing = view.actor(transfer).is_some_and(|t| t.is_publishing());
            // The batch in training has all its groups, or the core is past
            // collecting it: free rollout slots wait on training.
            let batch_complete = packer_step > updates as u64
                || matches!(
                    core_phase,
                    Some(
                        CorePhase::Reducing
                            | CorePhase::Updating
                            | CorePhase::Broadcasting
                            | CorePhase::Publishing
                            | CorePhase::AwaitDecision
                    )
                )
                || publishing;
            let c = s.counters();
            let queue_empty = c.dispatched() <= c.started();
            let ledger = s.ledger();
            let (wm, c_r, c_e) = (
                c.watermark(),
                ledger.rollout_capacity(),
                s.config().cell_capacity,
            );
            let movable = match s.config().policy {
                Policy::Elastic => {
                    next_to_switch(ledger.roles()).is_some() && may_move(wm, c_r, c_e, 1)
                }
                Policy::Colocate => {
                    ledger.roles().iter().all(|r| *r == Role::Rollout)
                        && may_move(wm, c_r, c_e, ledger.cells())
                }
                Policy::Async { .. } => false,
            };
            let mut w = [0.0; 11];
            let rollout = |w: &mut [f64; 11], nodes: f64, used: f64, cap: f64| {
                let u = (used / cap).clamp(0.0, 1.0);
                w[Phase::RolloutBusy.ix()] += nodes * u;
                let idle = if !queue_empty {
                    Phase::RolloutIdle
                } else if batch_complete {
                    Phase::WaitingOnTraining
                } else {
                    Phase::WaitingLastGroups
                };
                w[idle.ix()] += nodes * (1.0 - u);
            };
            for (i, addr) in peers.cells.iter().enumerate() {
                let (Some(cell), Some(&nodes)) = (view.actor(*addr), b.nodes.get(i)) else {
                    continue;
                };
                let phase = match cell.role() {
                    CellRole::Rollout => {
                        let used = f64::from(ledger.used_of(EngineIx::Cell(i as u32)));
                        rollout(&mut w, nodes, used, b.capacity[i]);
                        continue;
                    }
                    CellRole::Draining | CellRole::Switching => Phase::Switching,
                    CellRole::Returning => Phase::Returning,
                    CellRole::Training => {
                        match trainers
                            .get(i)
                            .and_then(|t| view.actor(*t))
                            .and_then(|t| t.current())
                        {
                            Some(TrainerOp::Warmup | TrainerOp::Drain | TrainerOp::BuildGroups) => {
                                Phase::WarmupDrain
                            }
                            Some(TrainerOp::FwdBwd) => Phase::Training,
                            Some(
                                TrainerOp::Reduce
                                | TrainerOp::Update
                                | TrainerOp::Broadcast
                                | TrainerOp::Checkpoint
                                | TrainerOp::Restore,
                            ) => Phase::Optimizer,
                            None if publishing => Phase::Publication,
                            None => Phase::TrainingIdle,
                        }
                    }
                };
                w[phase.ix()] += nodes;
            }
            let k = peers.cells.len();
            if let (Some(&nodes), Some(&cap)) = (b.nodes.get(k), b.capacity.get(k)) {
                let used = f64::from(ledger.used_of(EngineIx::Pool));
                rollout(&mut w, nodes, used, cap);
            }
            b.now_movable = if movable {
                w[Phase::WaitingLastGroups.ix()]
            } else {
                0.0
            };
            b.now_weights = w;
            Ok(())
        }
    }

    /// Whether the last event may have changed what the hook reads: it ran
    /// on one of the actors read (or none is known yet), or actors changed
    /// outside their handlers. Otherwise the weights still hold.
    fn must_read(&self, view: &SimView<'_>) -> bool {
        self.watched.is_empty()
            || view.outside_changes() != self.seen_changes
            || view.handled().is_none_or(|id| self.watched.contains(&id))
    }

    /// Integrates the current state up to `now` (never past the end).
    fn advance(&mut self, now: Nanos) {
        let until = self.end.map_or(now, |e| e.min(now));
        if until > self.last {
            let dt = (until - self.last) as f64;
            for (a, w) in self.acc.iter_mut().zip(self.now_weights) {
                *a += w * dt;
            }
            self.movable += self.now_movable * dt;
            self.last = until;
        }
    }

    /// GPU-hours by phase up to the end.
    pub fn gpu_hours(&self) -> GpuHours {
        let h = |p: Phase| self.acc[p.ix()] * self.gpus_per_node / (3_600.0 * SECS as f64);
        let total_nodes: f64 = self.nodes.iter().sum();
        GpuHours {
            total: total_nodes * self.gpus_per_node * self.last as f64 / (3_600.0 * SECS as f64),
            rollout_busy: h(Phase::RolloutBusy),
            waiting_last_groups: h(Phase::WaitingLastGroups),
            waiting_on_training: h(Phase::WaitingOnTraining),
            rollout_idle: h(Phase::RolloutIdle),
            switching_to_training: h(Phase::Switching),
            switching_to_rollout: h(Phase::Returning),
            warmup_drain: h(Phase::WarmupDrain),
            training: h(Phase::Training),
            optimizer: h(Phase::Optimizer),
            publication: h(Phase::Publication),
            training_idle: h(Phase::TrainingIdle),
            waiting_last_groups_movable: self.movable * self.gpus_per_node
                / (3_600.0 * SECS as f64),
        }
    }

    /// When each step's batch became complete, by step.
    pub fn batch_complete_at(&self) -> &[Nanos] {
        &self.complete_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integration_is_exact_and_stops_at_the_end() {
        let mut b = Breakdown::new(2, 4, 10, Some((1, 5)), 8, 3);
        b.now_weights[Phase::RolloutBusy.ix()] = 6.0;
        b.now_weights[Phase::Training.ix()] = 3.0;
        b.advance(10 * SECS);
        b.now_weights = [0.0; 11];
        b.now_weights[Phase::Switching.ix()] = 9.0;
        b.end = Some(15 * SECS);
        b.advance(100 * SECS);
        let g = b.gpu_hours();
        let hours = |node_secs: f64| node_secs * 8.0 / 3_600.0;
        assert!((g.rollout_busy - hours(60.0)).abs() < 1e-12);
        assert!((g.training - hours(30.0)).abs() < 1e-12);
        assert!((g.switching_to_training - hours(45.0)).abs() < 1e-12);
        assert!((g.total - hours(9.0 * 15.0)).abs() < 1e-12);
        assert!((g.sum() - g.total).abs() < 1e-12);
    }
}
