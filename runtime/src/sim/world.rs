//! The simulator itself: its state, and the calls a test makes to build a
//! world (spawn actors and probes, inject messages) and to read it back.
//!
//! Running it lives in `dispatch`, faults in `control`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use rustc_hash::FxHashMap;

use crate::actor::{Actor, External, Message};
use crate::hosted::{DynActor, Effect, decoder_of, hosted};
use crate::id::{ActorId, Addr, NodeId};
use crate::rng::mix64;
use crate::time::Nanos;

use super::config::SimConfig;
use super::draw::Draw;
use super::error::{SimError, SimFailure};
use super::event::{Agenda, EventKind, Incarnation};
use super::faults::FaultPlan;
use super::net::{NetStats, Network};
use super::slot::{Body, Factory, Inbox, NodeCounters, Received, Slot};
use super::trace::TraceHash;
use super::view::SimView;

pub(crate) type Invariant = Box<dyn FnMut(&SimView<'_>) -> Result<(), String>>;

/// A deterministic world of actors on modelled nodes.
pub struct Sim {
    pub(crate) cfg: SimConfig,
    pub(crate) now: Nanos,
    pub(crate) agenda: Agenda,
    pub(crate) slots: FxHashMap<ActorId, Slot>,
    /// Hosted actors (not probes), alive or crashed, in id order.
    pub(crate) index: BTreeSet<ActorId>,
    /// Every node that ever hosted an actor or a probe.
    pub(crate) nodes: BTreeSet<NodeId>,
    pub(crate) watchers: FxHashMap<NodeId, BTreeSet<ActorId>>,
    pub(crate) ids: NodeCounters,
    pub(crate) net: Network,
    pub(crate) draw: Draw,
    pub(crate) stats: NetStats,
    pub(crate) trace: TraceHash,
    pub(crate) events: u64,
    /// Reused for every handler call, so effects cost no allocation.
    pub(crate) effects: Vec<Effect>,
    pub(crate) invariants: Vec<Invariant>,
    /// The actor whose handler the last event ran (see [`SimView::handled`]).
    pub(crate) handled: Option<ActorId>,
    /// Changes to actors made outside the handler of the event being
    /// processed (see [`SimView::outside_changes`]).
    pub(crate) outside_changes: u64,
    pub(crate) failure: Option<SimError>,
    pub(crate) plans: Vec<FaultPlan>,
}

/// What one `run` call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunStats {
    /// Events processed by this call.
    pub events: u64,
    /// Virtual time when it returned.
    pub now: Nanos,
    /// It stopped at `max_events` with events still pending.
    pub limited: bool,
}

impl Sim {
    pub fn new(cfg: SimConfig) -> Sim {
        Sim {
            draw: Draw::new(cfg.seed),
            cfg,
            now: 0,
            agenda: Agenda::default(),
            slots: FxHashMap::default(),
            index: BTreeSet::new(),
            nodes: BTreeSet::new(),
            watchers: FxHashMap::default(),
            ids: NodeCounters::default(),
            net: Network::default(),
            stats: NetStats::default(),
            trace: TraceHash::default(),
            events: 0,
            effects: Vec::with_capacity(16),
            invariants: Vec::new(),
            handled: None,
            outside_changes: 0,
            failure: None,
            plans: Vec::new(),
        }
    }

    /// Hosts `actor` on `node`. Its id comes from the node's spawn counter;
    /// `on_start` runs as an event at the current time.
    pub fn spawn<A: Actor>(&mut self, node: NodeId, actor: A) -> Addr<A> {
        let id = crate::hosted::IdAlloc::alloc(&self.ids, node);
        self.install(id, hosted(actor, id, self.cfg.seed), None);
        Addr::new(id)
    }

    /// Like [`Sim::spawn`], but `factory` builds the actor, again on each
    /// [`Sim::restart`]; only such actors can come back after a crash.
    pub fn spawn_restartable<A: Actor>(
        &mut self,
        node: NodeId,
        mut factory: impl FnMut() -> A + 'static,
    ) -> Addr<A> {
        let id = crate::hosted::IdAlloc::alloc(&self.ids, node);
        let seed = self.cfg.seed;
        let first = hosted(factory(), id, seed);
        let rebuild: Factory = Box::new(move |inc: Incarnation| {
            // A restarted process draws fresh randomness, as a real one would.
            hosted(factory(), id, seed ^ mix64(u64::from(inc)))
        });
        self.install(id, first, Some(rebuild));
        Addr::new(id)
    }

    /// An endpoint on `node` that records what it receives; read it with
    /// [`Sim::take_probe`].
    pub fn probe<M: Message>(&mut self, node: NodeId) -> Addr<External<M>> {
        let id = crate::hosted::IdAlloc::alloc(&self.ids, node);
        self.nodes.insert(node);
        let inbox: Inbox<M> = Inbox(Vec::new());
        self.slots.insert(
            id,
            Slot::new(
                Body::Probe(Box::new(inbox)),
                decoder_of::<External<M>>(),
                None,
            ),
        );
        Addr::new(id)
    }

    /// Everything `probe` received since the last call, oldest first.
    pub fn take_probe<M: Message>(&mut self, probe: Addr<External<M>>) -> Vec<Received<M>> {
        match self.slots.get_mut(&probe.id()).map(|s| &mut s.body) {
            Some(Body::Probe(sink)) => sink
                .as_any_mut()
                .downcast_mut::<Inbox<M>>()
                .map(|inbox| std::mem::take(&mut inbox.0))
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Sends `msg` to `to` as if `from` sent it now, through the network
    /// model (and the codec check, when on).
    pub fn inject<A: Actor>(&mut self, from: ActorId, to: Addr<A>, msg: impl Into<A::Msg>) {
        let msg: A::Msg = msg.into();
        self.send(from, to.id(), Box::new(msg));
    }

    pub(crate) fn install(
        &mut self,
        id: ActorId,
        actor: Box<dyn DynActor>,
        factory: Option<Factory>,
    ) {
        if self.slots.contains_key(&id) {
            tracing::warn!(%id, "spawn of an id already in use ignored");
            return;
        }
        let decoder = actor.decoder();
        self.outside_changes += 1;
        self.nodes.insert(id.node);
        self.index.insert(id);
        self.slots
            .insert(id, Slot::new(Body::Actor(actor), decoder, factory));
        self.agenda.push(self.now, EventKind::Start { id, inc: 0 });
    }

    /// Checks `f` after every event; the first `Err` stops the run with a
    /// [`SimError`]. Several invariants may be set; all are checked.
    pub fn set_invariant(&mut self, f: impl FnMut(&SimView<'_>) -> Result<(), String> + 'static) {
        self.invariants.push(Box::new(f));
    }

    /// A read-only view, as invariants get it.
    pub fn view(&self) -> SimView<'_> {
        SimView::new(self)
    }

    pub fn now(&self) -> Nanos {
        self.now
    }

    /// The running hash of every event so far: equal for equal schedules.
    pub fn trace_hash(&self) -> u64 {
        self.trace.value()
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn seed(&self) -> u64 {
        self.cfg.seed
    }

    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// Events scheduled and not yet processed (stale timers included).
    pub fn pending(&self) -> usize {
        self.agenda.len()
    }

    /// The state of a live actor (`None` if unknown, crashed, stopped, or of
    /// another type).
    pub fn actor<A: Actor>(&self, addr: Addr<A>) -> Option<&A> {
        match &self.slots.get(&addr.id())?.body {
            Body::Actor(a) => a.state().downcast_ref::<A>(),
            _ => None,
        }
    }

    /// Mutable state of a live actor, for tests that set up a scenario.
    pub fn actor_mut<A: Actor>(&mut self, addr: Addr<A>) -> Option<&mut A> {
        self.outside_changes += 1;
        match &mut self.slots.get_mut(&addr.id())?.body {
            Body::Actor(a) => a.state_mut().downcast_mut::<A>(),
            _ => None,
        }
    }

    /// Whether `id` hosts a live actor (probes count as live).
    pub fn is_alive(&self, id: ActorId) -> bool {
        self.slots
            .get(&id)
            .is_some_and(|s| !matches!(s.body, Body::Down))
    }

    /// The seed, configuration and fault plans of this run, in words.
    pub fn settings(&self) -> String {
        let mut s = self.cfg.to_string();
        for plan in &self.plans {
            let _ = write!(s, "; {plan}");
        }
        s
    }

    /// An error for a check a test makes itself, carrying what replaying it
    /// takes (for seed sweeps: `return Err(sim.fail("..."))`).
    pub fn fail(&self, message: impl Into<String>) -> SimError {
        self.error(SimFailure::Check {
            at: self.now,
            message: message.into(),
        })
    }

    pub(crate) fn error(&self, failure: SimFailure) -> SimError {
        SimError {
            seed: self.cfg.seed,
            settings: self.settings(),
            failure,
        }
    }

    /// The failure that stopped `step`, if any (`run` returns it itself).
    pub fn take_failure(&mut self) -> Option<SimError> {
        self.failure.take()
    }
}
