//! A driver runs every actor of one executor thread: one logical task per
//! actor, scheduled by a plain ready queue instead of a tokio task each.
//!
//! Messages between actors are tiny and handlers short, so the cost of a
//! message is dominated by its wake-up. Between two actors of the same
//! driver a send is a hash lookup, a place at the destination's gate
//! (usually a credit the driver already holds, so no atomic at all) and a
//! push onto a queue the driver owns; waking the destination is a push onto
//! the ready queue. No task, waker, lock or channel is involved.
//! Everything that comes from elsewhere (another driver, a connection, an
//! I/O worker, the node handle, a spawn) arrives through one unbounded
//! inject queue, whose length the destination gates already bound.
//!
//! Each actor still has its own bounded mailbox, handlers of one actor never
//! overlap, and an actor whose send waits for room takes no new input until
//! that send and the effects after it are done. A driver takes a few inputs
//! per actor before it moves on, and a round of them before it looks at the
//! clock, its inject queue and the runtime again.

use std::collections::VecDeque;
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use rustc_hash::FxHashMap;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;

use crate::hosted::{DynActor, Effect, Env};
use crate::id::ActorId;
use crate::time::{Clock, Nanos};

use super::gate::Gate;
use super::mailbox::{Envelope, Inbox, Route};
use super::node::NodeInner;
use super::slot::{Input, Key, Slot};
use super::stats::bump;

/// Inputs one actor takes in a row before the others get a turn.
const ACTOR_BUDGET: usize = 64;
/// Inputs a driver handles before it checks timers and its inject queue
/// and yields to the runtime.
const ROUND_BUDGET: usize = 1024;

/// What reaches a driver from outside it.
pub(crate) enum Inject {
    /// A message whose place at the destination's gate is claimed.
    Deliver { to: ActorId, env: Envelope },
    /// A new actor for this driver (its route is already registered).
    Spawn {
        actor: Box<dyn DynActor>,
        gate: Arc<Gate>,
    },
    /// A send this actor was blocked on may go on.
    Wake(Key),
}

pub(crate) type DriverTx = UnboundedSender<Inject>;

/// A handler panicked: the others carry on (as they did when each actor
/// was a task of its own); the actor is rebuilt if supervised, else taken
/// out, and the panic filed with the node's supervision.
struct Panicked {
    input: String,
    panic: String,
}

struct Place {
    generation: u32,
    slot: Option<Slot>,
}

pub(crate) struct Driver {
    pub(super) inner: Arc<NodeInner>,
    /// This driver's number in the executor.
    pub(super) num: usize,
    pub(super) tx: DriverTx,
    rx: UnboundedReceiver<Inject>,
    slab: Vec<Place>,
    free: Vec<u32>,
    /// The actors of this driver.
    pub(super) index: FxHashMap<ActorId, Key>,
    pub(super) ready: VecDeque<Key>,
    /// Slots that may hold credits (places claimed but unused), all handed
    /// back at the end of each round.
    pub(super) pooled: Vec<Key>,
    /// The effects of the handler that just ran (kept for its capacity).
    effects: Vec<Effect>,
    /// Routes to destinations elsewhere (other drivers, probes).
    pub(super) routes: FxHashMap<ActorId, Route>,
    pub(super) timers: super::timers::TimerQueue,
}

/// Registers `actor` and hands it to its driver; a no-op (logged) after
/// shutdown or for an id already in use. Callable from any thread.
pub(crate) fn spawn_actor(inner: &Arc<NodeInner>, actor: Box<dyn DynActor>) {
    let id = actor.id();
    if inner.is_stopped() {
        tracing::warn!(actor = %id, ty = actor.type_name(), "spawn after shutdown ignored");
        return;
    }
    let driver = inner.exec.driver(id).clone();
    let gate = Gate::new(inner.cfg.mailbox_capacity);
    match inner.routes.entry(id) {
        Entry::Occupied(_) => {
            tracing::error!(actor = %id, ty = actor.type_name(), "actor id already in use; spawn ignored");
        }
        Entry::Vacant(vacant) => {
            let route = Route::Actor {
                inbox: Inbox {
                    to: id,
                    gate: Arc::clone(&gate),
                    driver: driver.clone(),
                },
                decoder: actor.decoder(),
            };
            // Queued before the route is visible (the entry is locked until
            // the insert), so no message can overtake the spawn.
            if driver.send(Inject::Spawn { actor, gate }).is_err() {
                tracing::warn!(actor = %id, "spawn during shutdown ignored");
                return;
            }
            vacant.insert(route);
        }
    }
}

impl Driver {
    pub fn new(
        inner: Arc<NodeInner>,
        num: usize,
        tx: DriverTx,
        rx: UnboundedReceiver<Inject>,
    ) -> Self {
        Self {
            inner,
            num,
            tx,
            rx,
            slab: Vec::new(),
            free: Vec::new(),
            index: FxHashMap::default(),
            ready: VecDeque::new(),
            pooled: Vec::new(),
            effects: Vec::new(),
            routes: FxHashMap::default(),
            timers: super::timers::TimerQueue::new(),
        }
    }

    /// Runs until the node shuts down; dropping the driver then drops
    /// every actor it held.
    pub async fn run(mut self) {
        let shutdown = self.inner.shutdown.clone();
        loop {
            while let Ok(inject) = self.rx.try_recv() {
                self.inject(inject);
            }
            if shutdown.is_cancelled() {
                break;
            }
            if self.ready.is_empty() {
                let woke = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break,
                    () = self.timers.wait() => None,
                    inject = self.rx.recv() => Some(inject),
                };
                match woke {
                    None => self.fire_due(),
                    Some(Some(inject)) => self.inject(inject),
                    Some(None) => break,
                }
                continue;
            }
            let mut budget = ROUND_BUDGET;
            while budget > 0
                && let Some(key) = self.ready.pop_front()
            {
                budget = budget.saturating_sub(self.run_slot(key).max(1));
            }
            self.return_credits();
            if !self.timers.is_empty() {
                self.fire_due();
            }
            if !self.ready.is_empty() {
                // Lets the runtime run its timers and I/O, and whatever
                // else shares it (when idle, the wait above does that).
                tokio::task::yield_now().await;
            }
        }
        tracing::debug!(node = %self.inner.node(), driver = self.num, "actor driver stopped");
    }

    fn inject(&mut self, inject: Inject) {
        match inject {
            Inject::Deliver { to, env } => match self.index.get(&to) {
                Some(&key) => {
                    if let Some(slot) = self.slot_mut(key) {
                        slot.queue.push_back(env);
                    }
                    self.schedule(key);
                }
                // The actor stopped after the sender claimed its place.
                None => {
                    bump(&self.inner.counters.dropped_no_actor);
                    tracing::debug!(actor = %to, "message dropped: actor stopped");
                }
            },
            Inject::Spawn { actor, gate } => self.insert(actor, gate),
            Inject::Wake(key) => self.schedule(key),
        }
    }

    /// Takes an actor whose route is registered.
    pub(super) fn insert(&mut self, actor: Box<dyn DynActor>, gate: Arc<Gate>) {
        let slot = Slot::new(actor, gate);
        let id = slot.id;
        let key = match self.free.pop() {
            Some(idx) => {
                let entry = &mut self.slab[idx as usize];
                entry.slot = Some(slot);
                Key {
                    idx,
                    generation: entry.generation,
                }
            }
            None => {
                let Ok(idx) = u32::try_from(self.slab.len()) else {
                    tracing::error!(actor = %id, "over 2^32 actors on one driver; spawn ignored");
                    self.inner.routes.remove(&id);
                    return;
                };
                self.slab.push(Place {
                    generation: 0,
                    slot: Some(slot),
                });
                Key { idx, generation: 0 }
            }
        };
        self.index.insert(id, key);
        self.schedule(key);
    }

    /// Starts an actor spawned by one of this driver's actors: here if it
    /// belongs here (reachable by the very next effect), else on its driver.
    pub(super) fn spawn(&mut self, actor: Box<dyn DynActor>) {
        let id = actor.id();
        if self.inner.exec.driver_num(id) != self.num {
            spawn_actor(&self.inner, actor);
            return;
        }
        let gate = Gate::new(self.inner.cfg.mailbox_capacity);
        match self.inner.routes.entry(id) {
            Entry::Occupied(_) => {
                tracing::error!(actor = %id, ty = actor.type_name(), "actor id already in use; spawn ignored");
                return;
            }
            Entry::Vacant(vacant) => {
                vacant.insert(Route::Actor {
                    inbox: Inbox {
                        to: id,
                        gate: Arc::clone(&gate),
                        driver: self.tx.clone(),
                    },
                    decoder: actor.decoder(),
                });
            }
        }
        self.insert(actor, gate);
    }

    pub(super) fn slot_mut(&mut self, key: Key) -> Option<&mut Slot> {
        let entry = self.slab.get_mut(key.idx as usize)?;
        if entry.generation != key.generation {
            return None;
        }
        entry.slot.as_mut()
    }

    /// Puts an actor on the ready queue unless it is there (or running).
    pub(super) fn schedule(&mut self, key: Key) {
        if let Some(slot) = self.slot_mut(key)
            && !slot.scheduled
        {
            slot.scheduled = true;
            self.ready.push_back(key);
        }
    }

    /// Remembers that the slot at `key` may hold credits.
    pub(super) fn note_credits(&mut self, key: Key) {
        if let Some(slot) = self.slot_mut(key)
            && slot.credits > 0
            && !slot.pooled
        {
            slot.pooled = true;
            self.pooled.push(key);
        }
    }

    /// Hands every held place back to its gate, so that senders from
    /// elsewhere see all the room there is.
    fn return_credits(&mut self) {
        let mut pooled = std::mem::take(&mut self.pooled);
        for key in pooled.drain(..) {
            if let Some(slot) = self.slot_mut(key) {
                slot.pooled = false;
                slot.return_credits();
            }
        }
        self.pooled = pooled;
    }

    /// Moves every timer that is due into its actor's inputs.
    fn fire_due(&mut self) {
        let now = Instant::now();
        while let Some((key, token)) = self.timers.pop_due(now) {
            if let Some(slot) = self.slot_mut(key) {
                slot.due.push_back(token);
                self.schedule(key);
            }
        }
    }

    /// Gives one actor its turn; returns how many handlers ran.
    fn run_slot(&mut self, key: Key) -> usize {
        let mut ran = 0;
        loop {
            let Some(slot) = self.slot_mut(key) else {
                return ran;
            };
            if slot.blocked.is_some() {
                if !self.resume(key) {
                    // Still waiting: its waker schedules it again.
                    if let Some(slot) = self.slot_mut(key) {
                        slot.scheduled = false;
                    }
                    return ran;
                }
            } else if slot.stopping {
                self.remove(key);
                return ran;
            } else if ran >= ACTOR_BUDGET || !slot.has_input() {
                if ran >= ACTOR_BUDGET && slot.has_input() {
                    self.ready.push_back(key);
                } else {
                    slot.scheduled = false;
                }
                return ran;
            } else if let Some(input) = slot.next_input() {
                ran += 1;
                if slot.credits > 0 && !std::mem::replace(&mut slot.pooled, true) {
                    self.pooled.push(key);
                }
                match self.call(key, input) {
                    Ok(now) => self.apply_effects(key, now),
                    Err(p) => {
                        self.effects.clear();
                        self.panicked(key, p);
                        return ran;
                    }
                }
            }
        }
    }

    /// Runs one handler of the actor at `key`; its effects land in
    /// `self.effects`. Returns the time the handler saw, if it looked.
    fn call(&mut self, key: Key, input: Input) -> Result<Option<Nanos>, Panicked> {
        let Self {
            inner,
            slab,
            effects,
            ..
        } = self;
        let Some(slot) = slab
            .get_mut(key.idx as usize)
            .filter(|e| e.generation == key.generation)
            .and_then(|e| e.slot.as_mut())
        else {
            return Ok(None);
        };
        let inner = &**inner;
        let read = || inner.now();
        let mut env = Env {
            now: Clock::lazy(&read),
            run_seed: inner.cfg.seed,
            effects,
            ids: &inner.ids,
        };
        let actor = &mut slot.actor;
        let what = match &input {
            Input::Start => Err("start"),
            Input::Msg { msg, .. } => Ok(msg.type_name()),
            Input::Timer(_) => Err("timer"),
            Input::PeerDown(_) => Err("peer down"),
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match input {
            Input::Start => actor.start(&mut env),
            Input::Msg { from, msg } => {
                if let Err(err) = actor.deliver(from, msg, &mut env) {
                    bump(&inner.counters.dropped_invalid);
                    tracing::warn!(%from, "message dropped: {err}");
                }
            }
            // A token re-armed or cancelled after it fired is stale.
            Input::Timer(token) => {
                actor.fire(token, &mut env);
            }
            Input::PeerDown(node) => actor.peer_down(node, &mut env),
        }));
        match outcome {
            Ok(()) => Ok(env.now.if_read()),
            Err(payload) => Err(Panicked {
                input: match what {
                    Ok(ty) => format!("message {ty}"),
                    Err(kind) => kind.to_owned(),
                },
                panic: super::supervise::panic_text(payload.as_ref()),
            }),
        }
    }

    fn apply_effects(&mut self, key: Key, now: Option<Nanos>) {
        let mut effects = std::mem::take(&mut self.effects);
        let mut drain = effects.drain(..);
        self.apply(key, &mut drain, now);
        drop(drain);
        self.effects = effects;
    }

    /// Files the panic of the actor at `key`, then rebuilds it in place (a
    /// fresh incarnation starts next; its old timers are dropped) or takes
    /// it out.
    fn panicked(&mut self, key: Key, p: Panicked) {
        let Some(slot) = self.slot_mut(key) else {
            return;
        };
        let (id, actor_type) = (slot.id, slot.actor.type_name());
        let fresh = self.inner.supervision.rebuild(id);
        let restarted = fresh.is_some();
        self.inner.supervision.file(super::supervise::PanicReport {
            node: self.inner.node(),
            actor: id,
            actor_type,
            input: p.input,
            panic: p.panic,
            restarted,
        });
        match fresh {
            Some(actor) => {
                self.timers.remove_actor(key);
                if let Some(slot) = self.slot_mut(key) {
                    slot.actor = actor;
                    slot.started = false;
                    slot.due.clear();
                }
                self.ready.push_back(key);
            }
            None => self.remove(key),
        }
    }

    /// Takes an actor out: it stopped, panicked, or the node shuts down.
    fn remove(&mut self, key: Key) {
        let Some(entry) = self.slab.get_mut(key.idx as usize) else {
            return;
        };
        if entry.generation != key.generation {
            return;
        }
        let Some(slot) = entry.slot.take() else {
            return;
        };
        entry.generation = entry.generation.wrapping_add(1);
        self.free.push(key.idx);
        self.index.remove(&slot.id);
        self.timers.remove_actor(key);
        self.inner.routes.remove(&slot.id);
        self.inner.links.unwatch_all(slot.id);
        self.inner.supervision.forget(slot.id);
        slot.gate.close();
        tracing::debug!(actor = %slot.id, ty = slot.actor.type_name(), "actor stopped");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let keys: Vec<Key> = self.index.values().copied().collect();
        for key in keys {
            self.remove(key);
        }
    }
}
