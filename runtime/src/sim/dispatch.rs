//! Running the world: one event at a time, effects applied in the order the
//! handler recorded them, invariants checked after each event.
//!
//! This is the hot path (millions of events per second): no formatting, no
//! encoding unless the codec check is on, one map lookup per event.

use crate::hosted::{BoxMsg, DynActor, Effect, Env, ErasedIo};
use crate::id::{ActorId, NodeId};
use crate::io::IoError;
use crate::time::{Clock, Nanos};

use super::error::{SimError, SimFailure};
use super::event::{Event, EventKind, Incarnation};
use super::slot::Body;
use super::trace::Mark;
use super::view::SimView;
use super::world::{RunStats, Sim};

impl Sim {
    /// Processes one event; false when none is left or the run has failed
    /// (see [`Sim::take_failure`]).
    pub fn step(&mut self) -> bool {
        self.failure.is_none() && self.step_within(Nanos::MAX)
    }

    /// Runs until no event is left, or `max_events` have run in total.
    pub fn run(&mut self) -> Result<RunStats, SimError> {
        self.run_within(Nanos::MAX)
    }

    /// Runs every event due at or before `t`, then moves the clock to `t`.
    pub fn run_until(&mut self, t: Nanos) -> Result<RunStats, SimError> {
        let mut stats = self.run_within(t)?;
        if !stats.limited && self.now < t {
            self.now = t;
            stats.now = t;
        }
        Ok(stats)
    }

    fn run_within(&mut self, limit: Nanos) -> Result<RunStats, SimError> {
        if let Some(err) = self.failure.take() {
            return Err(err);
        }
        let start = self.events;
        let mut limited = false;
        loop {
            if let Some(max) = self.cfg.max_events
                && self.events >= max
            {
                limited = self.agenda.peek_time().is_some_and(|t| t <= limit);
                break;
            }
            if !self.step_within(limit) || self.failure.is_some() {
                break;
            }
        }
        if let Some(err) = self.failure.take() {
            return Err(err);
        }
        Ok(RunStats {
            events: self.events - start,
            now: self.now,
            limited,
        })
    }

    /// Processes the next event due at or before `limit`, skipping stale
    /// ones (timers of a cancelled key or an older incarnation), which
    /// neither count nor move the clock.
    fn step_within(&mut self, limit: Nanos) -> bool {
        while let Some(ev) = self.agenda.pop_due(limit) {
            if self.dispatch(ev) {
                self.events += 1;
                if !self.invariants.is_empty() {
                    self.check_invariants();
                }
                return true;
            }
        }
        false
    }

    fn check_invariants(&mut self) {
        let mut invariants = std::mem::take(&mut self.invariants);
        let mut broken = None;
        {
            let view = SimView::new(self);
            for f in invariants.iter_mut() {
                if let Err(message) = f(&view) {
                    broken = Some(message);
                    break;
                }
            }
        }
        self.invariants = invariants;
        if let Some(message) = broken {
            self.failure = Some(self.error(SimFailure::Invariant {
                at: self.now,
                event: self.events,
                message,
            }));
        }
    }

    /// Carries out one event; false if it was stale and skipped.
    fn dispatch(&mut self, ev: Event) -> bool {
        let Event { at, seq, kind } = ev;
        self.handled = kind.actor();
        match kind {
            EventKind::Deliver { from, to, msg } => {
                self.now = at;
                if self.net.is_partitioned(from.node, to.node) {
                    self.stats.dropped_partition += 1;
                    self.trace.record(at, seq, Mark::DropPartition, from, to, 0);
                } else {
                    self.hand(at, seq, from, to, msg);
                }
                true
            }
            EventKind::Timer { id, inc, token } => self.fire(at, seq, id, inc, token),
            EventKind::Start { id, inc } => self.start(at, seq, id, inc),
            EventKind::Io { id, inc, op, fail } => {
                self.now = at;
                self.complete_io(at, seq, id, inc, op, fail);
                true
            }
            EventKind::PeerDown { id, node } => self.peer_down(at, seq, id, node),
            EventKind::Fault(action) => {
                self.now = at;
                self.fault(seq, action);
                true
            }
        }
    }

    /// Hands a message to a live endpoint, or counts why it could not.
    fn hand(&mut self, at: Nanos, seq: u64, from: ActorId, to: ActorId, msg: BoxMsg) {
        let Some(slot) = self.slots.get_mut(&to) else {
            self.stats.dropped_dead += 1;
            self.trace.record(at, seq, Mark::DropDead, from, to, 0);
            return;
        };
        let inc = slot.inc;
        let delivered = match &mut slot.body {
            Body::Actor(actor) => {
                let mut env = Env {
                    now: Clock::fixed(at),
                    run_seed: self.cfg.seed,
                    effects: &mut self.effects,
                    ids: &self.ids,
                };
                actor.deliver(from, msg, &mut env).map_err(|err| {
                    tracing::warn!(%err, %from, "mistyped message dropped");
                })
            }
            Body::Probe(sink) => sink.accept(at, from, msg).map_err(|got| {
                tracing::warn!(%to, %from, got, "probe dropped a message of another type");
            }),
            Body::Down => {
                self.stats.dropped_dead += 1;
                self.trace.record(at, seq, Mark::DropDead, from, to, 0);
                return;
            }
        };
        match delivered {
            Ok(()) => {
                self.stats.delivered += 1;
                self.trace.record(at, seq, Mark::Deliver, from, to, 0);
                if !self.effects.is_empty() {
                    self.apply_effects(to, inc);
                }
            }
            Err(()) => {
                self.stats.mistyped += 1;
                self.trace.record(at, seq, Mark::Mistyped, from, to, 0);
            }
        }
    }

    /// Runs `f` on the live actor hosted as `id` (only in incarnation `inc`
    /// when one is given) with the environment of an event at `at`. Returns
    /// the incarnation it ran in, or `None` when there was no such actor or
    /// `f` found nothing to do.
    fn run_actor(
        &mut self,
        at: Nanos,
        id: ActorId,
        inc: Option<Incarnation>,
        f: impl FnOnce(&mut dyn DynActor, &mut Env<'_>) -> bool,
    ) -> Option<Incarnation> {
        let slot = self.slots.get_mut(&id)?;
        let Body::Actor(actor) = &mut slot.body else {
            return None;
        };
        if inc.is_some_and(|inc| inc != slot.inc) {
            return None;
        }
        let mut env = Env {
            now: Clock::fixed(at),
            run_seed: self.cfg.seed,
            effects: &mut self.effects,
            ids: &self.ids,
        };
        f(actor.as_mut(), &mut env).then_some(slot.inc)
    }

    fn fire(&mut self, at: Nanos, seq: u64, id: ActorId, inc: Incarnation, token: u64) -> bool {
        let Some(inc) = self.run_actor(at, id, Some(inc), |a, env| a.fire(token, env)) else {
            return false;
        };
        self.now = at;
        self.trace.record(at, seq, Mark::Timer, id, id, token);
        self.apply_effects(id, inc);
        true
    }

    fn start(&mut self, at: Nanos, seq: u64, id: ActorId, inc: Incarnation) -> bool {
        let started = self.run_actor(at, id, Some(inc), |a, env| {
            a.start(env);
            true
        });
        let Some(inc) = started else {
            return false;
        };
        self.now = at;
        self.trace
            .record(at, seq, Mark::Start, id, id, u64::from(inc));
        self.apply_effects(id, inc);
        true
    }

    fn peer_down(&mut self, at: Nanos, seq: u64, id: ActorId, node: NodeId) -> bool {
        let told = self.run_actor(at, id, None, |a, env| {
            a.peer_down(node, env);
            true
        });
        let Some(inc) = told else {
            return false;
        };
        self.now = at;
        self.trace
            .record(at, seq, Mark::PeerDown, id, id, u64::from(node.0));
        self.apply_effects(id, inc);
        true
    }

    fn complete_io(
        &mut self,
        at: Nanos,
        seq: u64,
        id: ActorId,
        inc: Incarnation,
        op: Box<dyn ErasedIo>,
        fail: bool,
    ) {
        let live = self
            .slots
            .get(&id)
            .is_some_and(|s| s.inc == inc && matches!(s.body, Body::Actor(_)));
        if !live {
            // The issuer is gone: the work is lost with it, never run.
            self.stats.io_dropped += 1;
            self.trace.record(at, seq, Mark::IoDropped, id, id, 0);
            return;
        }
        let msg = if fail {
            self.stats.io_failed += 1;
            self.trace.record(at, seq, Mark::IoFailed, id, id, 0);
            let kind = op.kind().to_owned();
            op.fail(IoError::Injected { kind })
        } else {
            self.trace.record(at, seq, Mark::Io, id, id, 0);
            op.complete()
        };
        self.hand(at, seq, id, id, msg);
    }

    /// Applies the effects the last handler of `me` recorded, in order.
    fn apply_effects(&mut self, me: ActorId, inc: Incarnation) {
        let mut effects = std::mem::take(&mut self.effects);
        let mut stop = false;
        for effect in effects.drain(..) {
            match effect {
                Effect::Send { to, msg } => self.send(me, to, msg),
                Effect::SetTimer { token, after } => self.agenda.push(
                    self.now.saturating_add(after),
                    EventKind::Timer { id: me, inc, token },
                ),
                // The actor's timer table already made the token stale.
                Effect::CancelTimer { .. } => {}
                Effect::Spawn { id, actor } => self.install(id, actor, None),
                Effect::Io { op } => self.start_io(me, inc, op),
                Effect::WatchNode(node) => self.watch(me, node),
                Effect::Stop => stop = true,
            }
        }
        self.effects = effects;
        if stop {
            self.remove(me);
        }
    }

    fn start_io(&mut self, me: ActorId, inc: Incarnation, op: Box<dyn ErasedIo>) {
        let (latency, fail) = match op.payload_bytes() {
            Some(bytes) => {
                let cost = self.cfg.payload;
                let base = self.draw.latency(&cost.latency);
                (
                    base.saturating_add(cost.transfer_time(bytes)),
                    self.draw.chance(cost.fail),
                )
            }
            None => {
                let model = *self.cfg.io.get(op.kind());
                (
                    self.draw.latency(&model.latency),
                    self.draw.chance(model.fail),
                )
            }
        };
        self.stats.io_started += 1;
        self.agenda.push(
            self.now.saturating_add(latency),
            EventKind::Io {
                id: me,
                inc,
                op,
                fail,
            },
        );
    }

    fn watch(&mut self, me: ActorId, node: NodeId) {
        if self.watchers.entry(node).or_default().insert(me)
            && let Some(slot) = self.slots.get_mut(&me)
        {
            slot.watching.push(node);
        }
    }
}
