//! A simulated trainer: one operation at a time, each with a fixed cost
//! scaled by the cell's slowdown factor (micro-steps also by their tokens).
//!
//! Collectives, when given their size, cost what a ring moves between the
//! cells of the prefix: an all-reduce over k members sends 2(k − 1)/k of
//! the gradient bytes over each link, a broadcast the parameter bytes once.
//! It also keeps the exact busy time and the time of every optimizer
//! update, which the lab's reports read. A repeated request is ignored
//! while queued and answered again once done (see [`super::answered`]).
//!
//! The core's trainer also keeps its state's version and writes its
//! checkpoints to a [`CheckpointDisk`]. Rebuilt after its node restarts
//! ([`SimTrainer::fresh`]) it holds no state: it ignores every request
//! until a `Restore` has it load the last durable checkpoint. A restore
//! also forgets every answer given before it.
//!
//! Replaying a record, each warm-up, micro-step, drain, reduce and update
//! takes the time its recorded counterpart took: the `n`-th of its kind in
//! its step on this cell the recorded `n`-th
//! ([`crate::replay::workload::TimedReplay::next_in`]); one the record's
//! cell did not run costs the kind's mean (the costs).

use std::collections::VecDeque;
use std::sync::Arc;

use gyre_actors::sched::proto::trainer::{TrainerEvent, TrainerReq};
use gyre_runtime::{Actor, ActorId, Cx, Nanos};

use gyre_actors::sched::ids::{Step, Version};
use gyre_actors::sched::retry::ReqKey;

use super::answered::Answered;
use super::disk::CheckpointDisk;

use crate::costs::TrainerCosts;
use crate::replay::ReplayWorkload;
use crate::replay::workload::{TimedOp, TimedReplay};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrainerStats {
    pub warmups: u64,
    pub micro_steps: u64,
    pub tokens: u64,
    pub drains: u64,
    pub updates: u64,
    /// Durable checkpoints written.
    pub checkpoints: u64,
    /// Restores answered, and requests ignored for want of a state.
    pub restores: u64,
    pub ignored: u64,
    /// Requests of an older restore epoch than the newest seen, ignored.
    pub stale: u64,
    /// Time spent on operations.
    pub busy: Nanos,
}

/// What a trainer is computing, by kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainerOp {
    Warmup,
    FwdBwd,
    Drain,
    BuildGroups,
    Reduce,
    Update,
    Broadcast,
    /// Writing a durable checkpoint (the core, every S steps).
    Checkpoint,
    /// Loading the last checkpoint (or nothing, if the state was kept).
    Restore,
}

#[derive(Debug)]
pub struct SimTrainer {
    costs: TrainerCosts,
    slowdown: f64,
    queue: VecDeque<TrainerReq>,
    busy: bool,
    busy_since: Nanos,
    stats: TrainerStats,
    /// When each optimizer update finished, by step.
    updated_at: Vec<(Step, Nanos)>,
    answered: Answered<TrainerEvent>,
    /// The newest restore epoch of the core seen in a request: requests of
    /// an older one belong to a state rolled back and are ignored.
    epoch: u64,
    /// The mutation check: repeated requests are done again.
    repeat_work: bool,
    /// Where the core's trainer writes its checkpoints.
    disk: Option<CheckpointDisk>,
    /// The version of the weights and optimizer state held; `None` for a
    /// rebuilt process that has not restored yet.
    state: Option<Version>,
    cell: u32,
    /// A record whose operations this trainer replays.
    replay: Option<TimedReplay>,
}

impl SimTrainer {
    pub fn new(costs: TrainerCosts, cell: u32) -> Self {
        let slowdown = costs
            .slowdown
            .get(cell as usize)
            .copied()
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(1.0);
        Self {
            costs,
            slowdown,
            queue: VecDeque::new(),
            busy: false,
            busy_since: 0,
            stats: TrainerStats::default(),
            updated_at: Vec::new(),
            answered: Answered::default(),
            epoch: 0,
            repeat_work: false,
            disk: None,
            state: Some(0),
            cell,
            replay: None,
        }
    }

    /// Prices operations as `replay` recorded them (see the module's note).
    pub fn replaying(mut self, replay: Arc<ReplayWorkload>) -> Self {
        self.replay = Some(TimedReplay::new(replay, Some(self.cell)));
        self
    }

    /// The core's trainer: its checkpoints go to `disk`.
    pub fn with_disk(mut self, disk: CheckpointDisk) -> Self {
        self.disk = Some(disk);
        self
    }

    /// A rebuilt process: no state until restored.
    pub fn fresh(mut self) -> Self {
        self.state = None;
        self
    }

    /// The version of the state held (`None`: not restored yet).
    pub fn state(&self) -> Option<Version> {
        self.state
    }

    /// Breaks the idempotency guard on purpose (the swarm's mutation check,
    /// `crate::world::Mutation::TrainerRepeatsWork`).
    pub fn repeating_work(mut self) -> Self {
        self.repeat_work = true;
        self
    }

    pub fn stats(&self) -> TrainerStats {
        self.stats
    }

    /// An operation is running now.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// The operation running now, if any (the lab's GPU-time breakdown
    /// reads it after every event).
    pub fn current(&self) -> Option<TrainerOp> {
        if !self.busy {
            return None;
        }
        self.queue.front().map(|req| match req {
            TrainerReq::Warmup { .. } => TrainerOp::Warmup,
            TrainerReq::FwdBwd { .. } => TrainerOp::FwdBwd,
            TrainerReq::Drain { .. } => TrainerOp::Drain,
            TrainerReq::BuildGroups { .. } => TrainerOp::BuildGroups,
            TrainerReq::Reduce { .. } => TrainerOp::Reduce,
            TrainerReq::Update { .. } => TrainerOp::Update,
            TrainerReq::Broadcast { .. } => TrainerOp::Broadcast,
            TrainerReq::Checkpoint { .. } => TrainerOp::Checkpoint,
            TrainerReq::Restore { .. } => TrainerOp::Restore,
        })
    }

    /// Each optimizer update this trainer made, with when it finished.
    pub fn updates(&self) -> &[(Step, Nanos)] {
        &self.updated_at
    }

    /// Moving `bytes` over one inter-cell link.
    fn link_time(&self, bytes: f64) -> f64 {
        bytes / 1024.0 * self.costs.collective_ns_per_kib as f64
    }

    fn cost(&self, req: &TrainerReq) -> Nanos {
        let c = &self.costs;
        let base = match req {
            TrainerReq::Warmup { .. } => c.warmup,
            TrainerReq::FwdBwd { tokens, .. } => tokens
                .saturating_mul(c.per_token)
                .saturating_add(c.per_micro_step),
            TrainerReq::Drain { .. } => c.drain,
            TrainerReq::BuildGroups { .. } => c.build_groups,
            TrainerReq::Reduce { members, .. } => {
                let k = f64::from((*members).max(1));
                let ring = self.link_time(2.0 * (k - 1.0) / k * c.collective_bytes as f64);
                let per = if c.reduce_once {
                    1
                } else {
                    u64::from((*members).max(1))
                };
                c.reduce * per + ring as Nanos
            }
            TrainerReq::Update { .. } => c.update,
            TrainerReq::Broadcast { members, .. } => {
                let to_send = if *members > 1 { c.collective_bytes } else { 0 };
                c.broadcast + self.link_time(to_send as f64) as Nanos
            }
            TrainerReq::Checkpoint { .. } => c.checkpoint,
            // Reading the checkpoint back costs what writing it did.
            TrainerReq::Restore { .. } if self.state.is_none() => c.checkpoint,
            TrainerReq::Restore { .. } => 0,
        };
        (base as f64 * self.slowdown) as Nanos
    }

    fn next(&mut self, cx: &mut Cx<'_, Self>) {
        if self.busy {
            return;
        }
        if let Some(req) = self.queue.front() {
            self.busy = true;
            let kind = match req {
                TrainerReq::Warmup { step, .. } => Some((TimedOp::Warmup, *step)),
                TrainerReq::FwdBwd { mstep, .. } => Some((TimedOp::FwdBwd, mstep.step)),
                TrainerReq::Drain { step, .. } => Some((TimedOp::Drain, *step)),
                TrainerReq::Reduce { step, .. } => Some((TimedOp::Reduce, *step)),
                TrainerReq::Update { step, .. } => Some((TimedOp::Update, *step)),
                _ => None,
            };
            let mean = self.cost(req);
            let replayed = self
                .replay
                .as_mut()
                .zip(kind)
                .and_then(|(r, (k, step))| r.next_in(k, step));
            let cost = replayed.unwrap_or(mean);
            self.busy_since = cx.now();
            cx.set_timer((), cost);
        }
    }
}

/// Who asked for `req`.
fn reply_to(req: &TrainerReq) -> gyre_runtime::ActorId {
    req.reply_to().id()
}

impl SimTrainer {
    fn reply(
        &mut self,
        key: ReqKey,
        to: gyre_runtime::Recipient<TrainerEvent>,
        event: TrainerEvent,
        cx: &mut Cx<'_, Self>,
    ) {
        self.answered.put(key, to, event.clone());
        cx.send(to, event);
    }
}

impl Actor for SimTrainer {
    type Msg = TrainerReq;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, msg: TrainerReq, cx: &mut Cx<'_, Self>) {
        let key = (ReqKey::of_trainer(&msg), reply_to(&msg));
        let epoch = msg.epoch();
        if epoch < self.epoch {
            self.stats.stale += 1;
            return;
        }
        if epoch > self.epoch {
            // Answers of the earlier epoch answer nothing asked now.
            self.epoch = epoch;
            self.answered = Answered::default();
        }
        if self.state.is_none() && !matches!(msg, TrainerReq::Restore { .. }) {
            self.stats.ignored += 1;
            return;
        }
        if self.repeat_work {
            self.queue.push_back(msg);
            return self.next(cx);
        }
        if self
            .queue
            .iter()
            .any(|q| (ReqKey::of_trainer(q), reply_to(q)) == key && q.epoch() == epoch)
        {
            return; // queued or running: its answer will come
        }
        if let Some((to, event)) = self.answered.again(key.0, key.1) {
            return cx.send(to, event);
        }
        self.queue.push_back(msg);
        self.next(cx);
    }

    fn on_timer(&mut self, _t: (), cx: &mut Cx<'_, Self>) {
        self.busy = false;
        let now = cx.now();
        self.stats.busy += now.saturating_sub(self.busy_since);
        let Some(req) = self.queue.pop_front() else {
            return;
        };
        let key = ReqKey::of_trainer(&req);
        let epoch = req.epoch();
        if epoch < self.epoch {
            // Queued before a request of a newer epoch: not done, not
            // answered.
            self.stats.stale += 1;
            return self.next(cx);
        }
        match req {
            TrainerReq::Warmup { step, reply_to, .. } => {
                self.stats.warmups += 1;
                self.reply(key, reply_to, TrainerEvent::Warm { epoch, step }, cx);
            }
            TrainerReq::FwdBwd {
                mstep,
                tokens,
                reply_to,
                ..
            } => {
                self.stats.micro_steps += 1;
                self.stats.tokens += tokens;
                self.reply(key, reply_to, TrainerEvent::Computed { epoch, mstep }, cx);
            }
            TrainerReq::Drain { step, reply_to, .. } => {
                self.stats.drains += 1;
                self.reply(key, reply_to, TrainerEvent::Drained { epoch, step }, cx);
            }
            TrainerReq::BuildGroups {
                prefixes, reply_to, ..
            } => {
                self.reply(
                    key,
                    reply_to,
                    TrainerEvent::GroupsBuilt {
                        epoch,
                        groups: prefixes.len() as u32,
                    },
                    cx,
                );
            }
            TrainerReq::Reduce { step, reply_to, .. } => {
                self.reply(
                    key,
                    reply_to,
                    TrainerEvent::Reduced {
                        epoch,
                        step,
                        grad_norm: 1.0,
                    },
                    cx,
                );
            }
            TrainerReq::Update { step, reply_to, .. } => {
                self.stats.updates += 1;
                self.state = self.state.map(|v| v + 1);
                self.updated_at.push((step, now));
                self.reply(key, reply_to, TrainerEvent::Updated { epoch, step }, cx);
            }
            TrainerReq::Broadcast { step, reply_to, .. } => {
                self.reply(key, reply_to, TrainerEvent::Broadcasted { epoch, step }, cx);
            }
            TrainerReq::Checkpoint {
                version, reply_to, ..
            } => {
                self.stats.checkpoints += 1;
                if let Some(disk) = &self.disk {
                    disk.write(version);
                }
                self.reply(
                    key,
                    reply_to,
                    TrainerEvent::Checkpointed {
                        epoch,
                        version,
                        durable: true,
                    },
                    cx,
                );
            }
            TrainerReq::Restore { reply_to, .. } => {
                self.stats.restores += 1;
                let kept = self.state.is_some();
                let version = match self.state {
                    Some(v) => v,
                    None => self.disk.as_ref().and_then(|d| d.last()).unwrap_or(0),
                };
                self.state = Some(version);
                // Answers given before belong to the state before.
                self.answered = Answered::default();
                let event = TrainerEvent::Restored {
                    epoch,
                    version,
                    kept,
                };
                self.reply(key, reply_to, event, cx);
            }
        }
        self.next(cx);
    }
}
