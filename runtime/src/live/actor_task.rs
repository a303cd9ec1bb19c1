//! One tokio task per actor: it owns the actor, its mailbox receiver and its
//! timers, and carries out the effects of each handler before taking the
//! next input.
//!
//! Effects are applied in the order the handler recorded them. A send to a
//! full mailbox or a full connection queue waits for room, so a busy actor
//! slows its senders down instead of growing a buffer. Sends to itself never
//! wait (the actor would wait on itself): when its own mailbox is full they
//! go to a local overflow queue that is served between mailbox inputs.

use std::collections::VecDeque;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::hosted::{BoxMsg, DynActor, Effect, Env};
use crate::id::{ActorId, NodeId};
use crate::time::{Clock, Nanos};

use super::channel::{self, Rx, TrySend, Tx};
use super::lock;
use super::mailbox::{Envelope, Route, Undelivered};
use super::node::NodeInner;
use super::stats::bump;
use super::timers::TimerQueue;

/// Routes an actor task remembers before it starts over; bounds the cache
/// of an actor that talks to many short-lived actors.
const ROUTE_CACHE_LIMIT: usize = 4096;

enum Input {
    Start,
    Msg { from: ActorId, msg: BoxMsg },
    Timer(u64),
    PeerDown(NodeId),
}

/// Registers `actor` and starts its task; a no-op (logged) after shutdown
/// or for an id already in use.
pub(crate) fn spawn_actor(inner: &Arc<NodeInner>, actor: Box<dyn DynActor>) {
    let id = actor.id();
    let mut tasks = lock(&inner.tasks);
    let Some(tasks) = tasks.as_mut() else {
        tracing::warn!(actor = %id, ty = actor.type_name(), "spawn after shutdown ignored");
        return;
    };
    if inner.routes.contains_key(&id) {
        tracing::error!(actor = %id, ty = actor.type_name(), "actor id already in use; spawn ignored");
        return;
    }
    let (tx, rx) = channel::bounded(inner.cfg.mailbox_capacity);
    inner.routes.insert(
        id,
        Route::Actor {
            tx: tx.clone(),
            decoder: actor.decoder(),
        },
    );
    let task = ActorTask {
        inner: Arc::clone(inner),
        actor,
        me: id,
        self_tx: tx,
        overflow: VecDeque::new(),
        cache: FxHashMap::default(),
        timers: TimerQueue::new(),
        effects: Vec::new(),
        stopping: false,
    };
    // Spawned under the lock so the task's exit guard always finds its handle.
    tasks.insert(id, inner.exec.for_actor(id).spawn(task.run(rx)));
}

struct ActorTask {
    inner: Arc<NodeInner>,
    actor: Box<dyn DynActor>,
    me: ActorId,
    self_tx: Tx<Envelope>,
    overflow: VecDeque<BoxMsg>,
    cache: FxHashMap<ActorId, Route>,
    timers: TimerQueue,
    effects: Vec<Effect>,
    stopping: bool,
}

/// Unregisters the actor however its task ends: stop, panic or abort.
struct ExitGuard {
    inner: Arc<NodeInner>,
    id: ActorId,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.inner.routes.remove(&self.id);
        self.inner.links.unwatch_all(self.id);
        if let Some(tasks) = lock(&self.inner.tasks).as_mut() {
            tasks.remove(&self.id);
        }
    }
}

impl ActorTask {
    async fn run(mut self, mut rx: Rx<Envelope>) {
        let _guard = ExitGuard {
            inner: Arc::clone(&self.inner),
            id: self.me,
        };
        self.handle(Input::Start).await;
        while !self.stopping {
            let env = if self.timers.is_empty() {
                rx.recv().await
            } else {
                tokio::select! {
                    biased;
                    token = self.timers.next() => {
                        self.handle(Input::Timer(token)).await;
                        continue;
                    }
                    env = rx.recv() => env,
                }
            };
            let input = match env {
                Some(Envelope::Msg { from, msg }) => Input::Msg { from, msg },
                Some(Envelope::PeerDown(node)) => Input::PeerDown(node),
                None => break,
            };
            self.handle(input).await;
            if !self.stopping
                && let Some(msg) = self.overflow.pop_front()
            {
                let from = self.me;
                self.handle(Input::Msg { from, msg }).await;
            }
        }
        tracing::debug!(actor = %self.me, ty = self.actor.type_name(), "actor stopped");
    }

    async fn handle(&mut self, input: Input) {
        let now = self.call(input);
        self.apply(now).await;
    }

    /// Runs one handler; its effects land in `self.effects`. Returns the
    /// time the handler saw, if it looked (the clock is read lazily).
    fn call(&mut self, input: Input) -> Option<Nanos> {
        let inner = &*self.inner;
        let read = || inner.now();
        let mut env = Env {
            now: Clock::lazy(&read),
            run_seed: inner.cfg.seed,
            effects: &mut self.effects,
            ids: &inner.ids,
        };
        match input {
            Input::Start => self.actor.start(&mut env),
            Input::Msg { from, msg } => {
                if let Err(err) = self.actor.deliver(from, msg, &mut env) {
                    bump(&self.inner.counters.dropped_invalid);
                    tracing::warn!(%from, "message dropped: {err}");
                }
            }
            Input::Timer(token) => {
                // A token re-armed or cancelled after it was queued is stale.
                self.actor.fire(token, &mut env);
            }
            Input::PeerDown(node) => self.actor.peer_down(node, &mut env),
        }
        env.now.if_read()
    }

    async fn apply(&mut self, mut now: Option<Nanos>) {
        let mut effects = std::mem::take(&mut self.effects);
        for effect in effects.drain(..) {
            match effect {
                Effect::Send { to, msg } => {
                    if let Some(msg) = self.try_send_cached(to, msg) {
                        self.send(to, msg).await;
                    }
                }
                Effect::SetTimer { token, after } => {
                    // Relative to the handler's own `now` when it read one.
                    let base = *now.get_or_insert_with(|| self.inner.now());
                    let at = self.inner.deadline(base, after);
                    self.timers.insert(token, at);
                }
                Effect::CancelTimer { token } => self.timers.remove(token),
                Effect::Spawn { actor, .. } => spawn_actor(&self.inner, actor),
                Effect::Io { op } => {
                    let tx = self.self_tx.clone();
                    let me = self.me;
                    tokio::task::spawn_blocking(move || {
                        let msg = op.complete();
                        // The actor may have stopped, or the node shut down:
                        // then the completion has nobody to go to.
                        let _ =
                            futures::executor::block_on(tx.send(Envelope::Msg { from: me, msg }));
                    });
                }
                Effect::WatchNode(node) => {
                    if node != self.me.node {
                        self.inner.links.watch(node, self.me);
                    }
                }
                Effect::Stop => self.stopping = true,
            }
        }
        self.effects = effects;
    }

    /// The common case without an await: a local actor already in the
    /// cache, with room in its mailbox. Hands `msg` back otherwise.
    fn try_send_cached(&mut self, to: ActorId, msg: BoxMsg) -> Option<BoxMsg> {
        let Some(Route::Actor { tx, .. }) = self.cache.get(&to) else {
            return Some(msg);
        };
        match tx.try_send(Envelope::Msg { from: self.me, msg }) {
            Ok(()) => None,
            Err(TrySend::Full(env) | TrySend::Closed(env)) => match env {
                Envelope::Msg { msg, .. } => Some(msg),
                Envelope::PeerDown(_) => None,
            },
        }
    }

    async fn send(&mut self, to: ActorId, msg: BoxMsg) {
        if to.node != self.me.node {
            if let Err(err) = self.inner.send_remote(self.me, to, msg).await {
                tracing::debug!(from = %self.me, %to, "remote message dropped: {err}");
            }
            return;
        }
        if to == self.me {
            self.send_self(msg);
            return;
        }
        if self.cache.len() >= ROUTE_CACHE_LIMIT && !self.cache.contains_key(&to) {
            self.cache.clear();
        }
        let route = match self.cache.entry(to) {
            Entry::Occupied(cached) => cached.into_mut(),
            Entry::Vacant(slot) => {
                let Some(route) = self.inner.routes.get(&to).map(|r| r.clone()) else {
                    bump(&self.inner.counters.dropped_no_actor);
                    tracing::debug!(from = %self.me, %to, "message dropped: no such actor");
                    return;
                };
                slot.insert(route)
            }
        };
        match route.deliver(self.me, to, msg).await {
            Ok(()) => {}
            Err(Undelivered::Closed) => {
                self.cache.remove(&to);
                bump(&self.inner.counters.dropped_no_actor);
                tracing::debug!(from = %self.me, %to, "message dropped: actor stopped");
            }
            Err(err @ Undelivered::WrongType { .. }) => {
                bump(&self.inner.counters.dropped_invalid);
                tracing::warn!(from = %self.me, %to, "message dropped: {err:?}");
            }
        }
    }

    fn send_self(&mut self, msg: BoxMsg) {
        if !self.overflow.is_empty() {
            self.overflow.push_back(msg);
            return;
        }
        let env = Envelope::Msg { from: self.me, msg };
        match self.self_tx.try_send(env) {
            Ok(()) => {}
            Err(TrySend::Full(Envelope::Msg { msg, .. })) => self.overflow.push_back(msg),
            Err(_) => {}
        }
    }
}
