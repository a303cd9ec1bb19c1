//! The read-only window invariants look through after every event.

use crate::actor::Actor;
use crate::id::{ActorId, Addr, NodeId};
use crate::time::Nanos;

use super::net::NetStats;
use super::slot::Body;
use super::world::Sim;

/// What an invariant may read: state, time, counters; never mutate, so a
/// check cannot change the run it checks.
pub struct SimView<'a> {
    sim: &'a Sim,
}

impl<'a> SimView<'a> {
    pub(crate) fn new(sim: &'a Sim) -> Self {
        Self { sim }
    }

    pub fn now(&self) -> Nanos {
        self.sim.now
    }

    /// Events processed so far, the current one included.
    pub fn events(&self) -> u64 {
        self.sim.events
    }

    /// The actor whose handler the last event ran: the receiver of a
    /// delivery (also of one that was dropped), the owner of a timer, an
    /// I/O completion, a start or a peer-down notice; `None` after a fault.
    /// Within one event only that actor's state changes, unless
    /// [`SimView::outside_changes`] moved.
    pub fn handled(&self) -> Option<ActorId> {
        self.sim.handled
    }

    /// A count of the changes to actors that no handler made of its own
    /// state: spawns (also a handler's), crashes, restarts, stops and
    /// [`Sim::actor_mut`](super::Sim::actor_mut). An observer that reads a
    /// few actors may skip re-reading them after an event that
    /// [`SimView::handled`] none of them while this count stayed the same:
    /// their state is what it read last.
    pub fn outside_changes(&self) -> u64 {
        self.sim.outside_changes
    }

    pub fn seed(&self) -> u64 {
        self.sim.cfg.seed
    }

    pub fn stats(&self) -> &'a NetStats {
        &self.sim.stats
    }

    /// The state of a live actor; `None` if unknown, crashed, stopped or of
    /// another type.
    pub fn actor<A: Actor>(&self, addr: Addr<A>) -> Option<&'a A> {
        self.sim.actor(addr)
    }

    /// Live hosted actors (probes excluded), in id order.
    pub fn ids(&self) -> impl Iterator<Item = ActorId> + 'a {
        let sim = self.sim;
        sim.index.iter().copied().filter(move |id| {
            sim.slots
                .get(id)
                .is_some_and(|s| matches!(s.body, Body::Actor(_)))
        })
    }

    /// Every live actor of type `A`, in id order.
    pub fn actors<A: Actor>(&self) -> impl Iterator<Item = (ActorId, &'a A)> + 'a {
        let sim = self.sim;
        self.ids()
            .filter_map(move |id| Some((id, sim.actor(Addr::<A>::new(id))?)))
    }

    pub fn is_alive(&self, id: ActorId) -> bool {
        self.sim.is_alive(id)
    }

    pub fn is_partitioned(&self, a: NodeId, b: NodeId) -> bool {
        self.sim.net.is_partitioned(a, b)
    }
}
