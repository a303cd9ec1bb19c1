//! A simulated device-memory manager: releasing or restoring one role's
//! memory takes a drawn time, and the device refuses to restore a role while
//! the other is still resident if both do not fit, which is exactly the
//! ordering SPEC 2.5 step 5 relies on.
//!
//! A repeated request (a resend, or the network's duplicate) does its work
//! once: while the same operation is under way it is ignored, and once it
//! is done the answer is given again at once.
//!
//! Replaying a record, the `n`-th release or restore of a role takes the
//! recorded `n`-th one's time on the same cell
//! ([`crate::replay::workload::TimedReplay`]).

use std::collections::{BTreeMap, BTreeSet};

use gyre_actors::sched::proto::memory::{MemRole, MemoryEvent, MemoryReq};
use gyre_runtime::{Actor, ActorId, Cx, Recipient};

use crate::costs::MemoryCosts;
use crate::replay::ReplayWorkload;
use crate::replay::workload::{TimedOp, TimedReplay};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub releases: u64,
    pub restores: u64,
    pub refusals: u64,
    pub peak: u64,
}

#[derive(Debug)]
pub struct SimMemory {
    costs: MemoryCosts,
    resident: BTreeSet<MemRole>,
    next_op: u64,
    ops: BTreeMap<u64, (MemoryReq, Recipient<MemoryEvent>)>,
    stats: MemoryStats,
    replay: Option<TimedReplay>,
}

impl SimMemory {
    /// A device with rollout memory resident (its engine is up).
    pub fn new(costs: MemoryCosts) -> Self {
        let mut s = Self {
            costs,
            resident: BTreeSet::from([MemRole::Rollout]),
            next_op: 0,
            ops: BTreeMap::new(),
            stats: MemoryStats::default(),
            replay: None,
        };
        s.stats.peak = s.used();
        s
    }

    /// Prices operations as `cell`'s device memory did in `replay`.
    pub fn replaying(mut self, replay: std::sync::Arc<ReplayWorkload>, cell: u32) -> Self {
        self.replay = Some(TimedReplay::new(replay, Some(cell)));
        self
    }

    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    pub fn resident(&self) -> Vec<MemRole> {
        self.resident.iter().copied().collect()
    }

    fn bytes(&self, role: MemRole) -> u64 {
        match role {
            MemRole::Rollout => self.costs.rollout_bytes,
            MemRole::Training => self.costs.training_bytes,
        }
    }

    fn used(&self) -> u64 {
        self.resident.iter().map(|r| self.bytes(*r)).sum()
    }
}

fn role_of(req: &MemoryReq) -> MemRole {
    match req {
        MemoryReq::Release { role, .. } | MemoryReq::Restore { role, .. } => *role,
    }
}

impl Actor for SimMemory {
    type Msg = MemoryReq;
    type Timer = u64;

    fn on_msg(&mut self, _from: ActorId, msg: MemoryReq, cx: &mut Cx<'_, Self>) {
        let same = |a: &MemoryReq, b: &MemoryReq| {
            matches!((a, b), (MemoryReq::Release { role: x, .. }, MemoryReq::Release { role: y, .. })
                | (MemoryReq::Restore { role: x, .. }, MemoryReq::Restore { role: y, .. }) if x == y)
        };
        if self.ops.values().any(|(op, _)| same(op, &msg)) {
            return; // under way; its answer will come
        }
        match &msg {
            MemoryReq::Release { role, reply_to } if !self.resident.contains(role) => {
                return cx.send(*reply_to, MemoryEvent::Released { role: *role });
            }
            MemoryReq::Restore { role, reply_to } if self.resident.contains(role) => {
                return cx.send(*reply_to, MemoryEvent::Restored { role: *role });
            }
            _ => {}
        }
        let (drawn, reply_to) = match &msg {
            MemoryReq::Release { role, reply_to } => {
                let span = match role {
                    MemRole::Training => self.costs.release_training.unwrap_or(self.costs.release),
                    MemRole::Rollout => self.costs.release,
                };
                (span.draw(cx.rng()), *reply_to)
            }
            MemoryReq::Restore { role, reply_to } => {
                let need = self.used() + self.bytes(*role);
                if !self.resident.contains(role) && need > self.costs.capacity {
                    self.stats.refusals += 1;
                    cx.send(
                        *reply_to,
                        MemoryEvent::Refused {
                            role: *role,
                            reason: format!(
                                "{need} units needed, device holds {}",
                                self.costs.capacity
                            ),
                        },
                    );
                    return;
                }
                let span = match role {
                    MemRole::Rollout => self.costs.restore_rollout.unwrap_or(self.costs.restore),
                    MemRole::Training => self.costs.restore,
                };
                (span.draw(cx.rng()), *reply_to)
            }
        };
        let kind = match (&msg, role_of(&msg)) {
            (MemoryReq::Release { .. }, MemRole::Rollout) => TimedOp::ReleaseRollout,
            (MemoryReq::Release { .. }, MemRole::Training) => TimedOp::ReleaseTraining,
            (MemoryReq::Restore { .. }, MemRole::Rollout) => TimedOp::RestoreRollout,
            (MemoryReq::Restore { .. }, MemRole::Training) => TimedOp::RestoreTraining,
        };
        let cost = self
            .replay
            .as_mut()
            .and_then(|r| r.next(kind))
            .unwrap_or(drawn);
        self.next_op += 1;
        self.ops.insert(self.next_op, (msg, reply_to));
        cx.set_timer(self.next_op, cost);
    }

    fn on_timer(&mut self, op: u64, cx: &mut Cx<'_, Self>) {
        let Some((req, reply_to)) = self.ops.remove(&op) else {
            return;
        };
        match req {
            MemoryReq::Release { role, .. } => {
                self.resident.remove(&role);
                self.stats.releases += 1;
                cx.send(reply_to, MemoryEvent::Released { role });
            }
            MemoryReq::Restore { role, .. } => {
                self.resident.insert(role);
                self.stats.restores += 1;
                self.stats.peak = self.stats.peak.max(self.used());
                cx.send(reply_to, MemoryEvent::Restored { role });
            }
        }
    }
}
