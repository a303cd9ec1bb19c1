//! Faults and topology changes: crashes and restarts, node failures,
//! partitions, link models, and seed-derived fault plans.
//!
//! A crash loses the actor's state, timers and pending I/O (they belong to
//! its incarnation, which the crash ends); messages to it are dropped and
//! counted until a restart. Watchers learn of a node's loss through
//! `on_peer_down`: when the node crashes, and when a partition cuts them off
//! from it (a live host sees both as a broken connection).

use crate::id::{ActorId, NodeId};

use super::config::LinkModel;
use super::event::EventKind;
use super::faults::{FaultAction, FaultPlan, pick_pair};
use super::slot::Body;
use super::trace::Mark;
use super::world::Sim;

impl Sim {
    /// Crashes `id`: its state and timers are lost, messages to it are
    /// dropped until [`Sim::restart`]. False if it was not a live actor.
    pub fn crash(&mut self, id: ActorId) -> bool {
        let Some(slot) = self.slots.get_mut(&id) else {
            return false;
        };
        if !matches!(slot.body, Body::Actor(_)) {
            return false;
        }
        slot.body = Body::Down;
        slot.inc += 1;
        self.outside_changes += 1;
        let watching = std::mem::take(&mut slot.watching);
        self.unwatch(id, &watching);
        true
    }

    /// Rebuilds a restartable actor with its factory under the same id, with
    /// fresh timers; `on_start` runs as an event now. A live actor is crashed
    /// first. False if `id` was not spawned restartable (or was stopped).
    pub fn restart(&mut self, id: ActorId) -> bool {
        if self.slots.get(&id).is_none_or(|s| s.factory.is_none()) {
            return false;
        }
        self.crash(id);
        let Some(slot) = self.slots.get_mut(&id) else {
            return false;
        };
        let inc = slot.inc;
        let Some(factory) = slot.factory.as_mut() else {
            return false;
        };
        slot.body = Body::Actor(factory(inc));
        self.outside_changes += 1;
        self.agenda.push(self.now, EventKind::Start { id, inc });
        true
    }

    /// Crashes every actor on `node` and tells the actors watching it.
    /// Returns how many actors crashed.
    pub fn crash_node(&mut self, node: NodeId) -> usize {
        let crashed = self
            .actors_on(node)
            .into_iter()
            .filter(|id| self.crash(*id))
            .count();
        self.notify_down(node, |_| true);
        crashed
    }

    /// Restarts every crashed restartable actor on `node`; returns how many.
    pub fn restart_node(&mut self, node: NodeId) -> usize {
        let down: Vec<ActorId> = self
            .actors_on(node)
            .into_iter()
            .filter(|id| {
                self.slots
                    .get(id)
                    .is_some_and(|s| matches!(s.body, Body::Down))
            })
            .collect();
        down.into_iter().filter(|id| self.restart(*id)).count()
    }

    /// Cuts `a` from `b` in both directions, including messages in flight;
    /// actors on each side watching the other hear `on_peer_down`.
    pub fn partition(&mut self, a: NodeId, b: NodeId) {
        if a == b || !self.net.partition(a, b) {
            return;
        }
        self.notify_down(b, |w| w.node == a);
        self.notify_down(a, |w| w.node == b);
    }

    pub fn heal(&mut self, a: NodeId, b: NodeId) {
        self.net.heal(a, b);
    }

    /// Sets the model of both directions between `a` and `b` (`a == b`: the
    /// links within one node).
    pub fn set_link(&mut self, a: NodeId, b: NodeId, model: LinkModel) {
        self.net.set_link(a, b, model);
    }

    /// Applies `plan`: its link model between nodes and I/O failure rate
    /// from now on, its partitions and crashes at their times from now.
    pub fn apply_faults(&mut self, plan: FaultPlan) {
        self.cfg.default_link = plan.link;
        let io = &mut self.cfg.io;
        io.default.fail = io.default.fail.max(plan.io_fail);
        for kind in io.kinds.values_mut() {
            kind.fail = kind.fail.max(plan.io_fail);
        }
        for p in &plan.partitions {
            let action = FaultAction::Partition {
                lasts: p.lasts,
                pick: p.pick,
            };
            self.agenda
                .push(self.now.saturating_add(p.at), EventKind::Fault(action));
        }
        for c in &plan.crashes {
            let action = FaultAction::Crash {
                lasts: c.lasts,
                pick: c.pick,
            };
            self.agenda
                .push(self.now.saturating_add(c.at), EventKind::Fault(action));
        }
        self.plans.push(plan);
    }

    /// [`Sim::apply_faults`], builder style.
    pub fn with_faults(mut self, plan: FaultPlan) -> Self {
        self.apply_faults(plan);
        self
    }

    /// Carries out a planned fault that is due now.
    pub(crate) fn fault(&mut self, seq: u64, action: FaultAction) {
        let (code, a, b) = match action {
            FaultAction::Partition { lasts, pick } => {
                let nodes: Vec<NodeId> = self.nodes.iter().copied().collect();
                match pick_pair(&nodes, pick) {
                    Some((a, b)) => {
                        tracing::debug!(%a, %b, at = self.now, "planned partition");
                        self.partition(a, b);
                        self.agenda.push(
                            self.now.saturating_add(lasts),
                            EventKind::Fault(FaultAction::Heal { a, b }),
                        );
                        (1, node_id(a), node_id(b))
                    }
                    None => (0, ActorId::new(0, 0), ActorId::new(0, 0)),
                }
            }
            FaultAction::Heal { a, b } => {
                self.heal(a, b);
                (2, node_id(a), node_id(b))
            }
            FaultAction::Crash { lasts, pick } => {
                let candidates: Vec<ActorId> = self
                    .index
                    .iter()
                    .copied()
                    .filter(|id| {
                        self.slots.get(id).is_some_and(|s| {
                            s.factory.is_some() && matches!(s.body, Body::Actor(_))
                        })
                    })
                    .collect();
                if candidates.is_empty() {
                    (0, ActorId::new(0, 0), ActorId::new(0, 0))
                } else {
                    let id = candidates[(pick % candidates.len() as u64) as usize];
                    tracing::debug!(%id, at = self.now, "planned crash");
                    self.crash(id);
                    self.agenda.push(
                        self.now.saturating_add(lasts),
                        EventKind::Fault(FaultAction::Restart { id }),
                    );
                    (3, id, id)
                }
            }
            FaultAction::Restart { id } => {
                // Someone may have restarted it already; then leave it be.
                if self
                    .slots
                    .get(&id)
                    .is_some_and(|s| matches!(s.body, Body::Down))
                {
                    self.restart(id);
                }
                (4, id, id)
            }
        };
        self.trace.record(self.now, seq, Mark::Fault, a, b, code);
    }

    /// Stops `id` for good (its own `Effect::Stop`).
    pub(crate) fn remove(&mut self, id: ActorId) {
        if let Some(slot) = self.slots.remove(&id) {
            self.outside_changes += 1;
            self.unwatch(id, &slot.watching);
        }
        self.index.remove(&id);
    }

    fn unwatch(&mut self, id: ActorId, nodes: &[NodeId]) {
        for node in nodes {
            if let Some(set) = self.watchers.get_mut(node) {
                set.remove(&id);
            }
        }
    }

    /// Hosted actors on `node`, in id order.
    fn actors_on(&self, node: NodeId) -> Vec<ActorId> {
        self.index
            .range(
                ActorId { node, local: 0 }..=ActorId {
                    node,
                    local: u64::MAX,
                },
            )
            .copied()
            .collect()
    }

    /// Schedules `on_peer_down(node)`, now, for the watchers of `node` that
    /// `which` selects, in id order.
    fn notify_down(&mut self, node: NodeId, which: impl Fn(ActorId) -> bool) {
        let Some(set) = self.watchers.get(&node) else {
            return;
        };
        let targets: Vec<ActorId> = set.iter().copied().filter(|w| which(*w)).collect();
        for id in targets {
            self.agenda.push(self.now, EventKind::PeerDown { id, node });
        }
    }
}

/// A node as an id for the trace hash.
fn node_id(node: NodeId) -> ActorId {
    ActorId { node, local: 0 }
}
