//! Carrying out a handler's effects on its driver, in the order recorded.
//!
//! A send goes the cheapest way its destination allows: to itself into its
//! own queue (or overflow, never waiting); to an actor of the same driver
//! straight into that actor's queue; to an actor elsewhere on this node
//! through its inbox; to another node over that node's connection. When the
//! destination has no room, the actor parks: the wait for room and every
//! effect after the send are kept in its slot, and the driver picks them up
//! when the wait's waker says so. Nothing after a waiting send happens
//! before it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::hosted::{BoxMsg, Effect};
use crate::id::ActorId;
use crate::time::Nanos;

use super::driver::{Driver, DriverTx, Inject};
use super::mailbox::{Envelope, Inbox, SlowDelivery, Undelivered, warn_if_slow};
use super::slot::{Blocked, Key};
use super::stats::bump;

/// Routes a driver remembers before it starts over; bounds the cache of
/// actors that talk to many short-lived actors elsewhere.
const ROUTE_CACHE_LIMIT: usize = 4096;

/// Wakes a parked actor by asking its driver to schedule it.
struct WakeSlot {
    driver: DriverTx,
    key: Key,
}

impl Wake for WakeSlot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        // A driver that is gone has nobody left to wake.
        let _ = self.driver.send(Inject::Wake(self.key));
    }
}

/// A send that has to wait: the wait, and for a destination on this
/// driver, the message to push once the wait has claimed its place.
type Parked = (SlowDelivery, Option<(ActorId, BoxMsg)>);

impl Driver {
    /// Applies `effects` for the actor at `me`; stops early, parking the
    /// actor with the remaining effects, when a send has to wait.
    pub(super) fn apply<I: Iterator<Item = Effect>>(
        &mut self,
        me: Key,
        effects: &mut I,
        mut now: Option<Nanos>,
    ) {
        let Some(id) = self.slot_mut(me).map(|s| s.id) else {
            return;
        };
        while let Some(effect) = effects.next() {
            match effect {
                Effect::Send { to, msg } => {
                    if let Some((wait, then_push)) = self.send(me, id, to, msg) {
                        let waker = Waker::from(Arc::new(WakeSlot {
                            driver: self.tx.clone(),
                            key: me,
                        }));
                        let rest: VecDeque<Effect> = effects.collect();
                        if let Some(slot) = self.slot_mut(me) {
                            slot.blocked = Some(Box::new(Blocked {
                                wait,
                                waker,
                                then_push,
                                rest,
                                now,
                            }));
                        }
                        return;
                    }
                }
                Effect::SetTimer { token, after } => {
                    // Relative to the handler's own `now` when it read one.
                    let base = *now.get_or_insert_with(|| self.inner.now());
                    let at = self.inner.deadline(base, after);
                    self.timers.insert(me, token, at);
                }
                Effect::CancelTimer { token } => self.timers.remove(me, token),
                Effect::Spawn { actor, .. } => self.spawn(actor),
                Effect::Io { op } => {
                    let Some(slot) = self.slot_mut(me) else {
                        continue;
                    };
                    let inbox = Inbox {
                        to: id,
                        gate: Arc::clone(&slot.gate),
                        driver: self.tx.clone(),
                    };
                    tokio::task::spawn_blocking(move || {
                        let msg = op.complete();
                        // The actor may have stopped, or the node shut down:
                        // then the completion has nobody to go to.
                        let env = Envelope::Msg { from: id, msg };
                        let _ = futures::executor::block_on(inbox.send(env));
                    });
                }
                Effect::WatchNode(node) => {
                    if node != id.node {
                        self.inner.links.watch(node, id);
                    }
                }
                Effect::Stop => {
                    if let Some(slot) = self.slot_mut(me) {
                        slot.stopping = true;
                    }
                }
            }
        }
    }

    /// Sends `msg` from `id` (at `me`) to `to`; returns the wait when the
    /// destination has no room.
    fn send(&mut self, me: Key, id: ActorId, to: ActorId, msg: BoxMsg) -> Option<Parked> {
        if to == id {
            if let Some(slot) = self.slot_mut(me) {
                slot.send_self(msg);
            }
            self.note_credits(me);
            return None;
        }
        if let Some(&key) = self.index.get(&to) {
            let slot = self.slot_mut(key)?;
            if slot.take_place() {
                slot.queue.push_back(Envelope::Msg { from: id, msg });
                // `note_credits` and `schedule` in one look at the slot.
                let pool = slot.credits > 0 && !std::mem::replace(&mut slot.pooled, true);
                let wake = !std::mem::replace(&mut slot.scheduled, true);
                if pool {
                    self.pooled.push(key);
                }
                if wake {
                    self.ready.push_back(key);
                }
                return None;
            }
            let gate = Arc::clone(&slot.gate);
            let wait: SlowDelivery = Box::pin(async move {
                warn_if_slow(gate.claim(), id, to)
                    .await
                    .map_err(|_| Undelivered::Closed)
            });
            return Some((wait, Some((to, msg))));
        }
        if to.node != self.inner.node() {
            return match self.inner.try_send_remote(id, to, msg) {
                Ok(None) => None,
                Ok(Some(wait)) => Some((wait, None)),
                Err(err) => {
                    tracing::debug!(from = %id, %to, "remote message dropped: {err}");
                    None
                }
            };
        }
        self.send_elsewhere(id, to, msg).map(|wait| (wait, None))
    }

    /// A send to a probe or to an actor of another driver of this node.
    fn send_elsewhere(&mut self, id: ActorId, to: ActorId, msg: BoxMsg) -> Option<SlowDelivery> {
        if self.routes.len() >= ROUTE_CACHE_LIMIT && !self.routes.contains_key(&to) {
            self.routes.clear();
        }
        let route = match self.routes.get(&to) {
            Some(route) => route,
            None => {
                let Some(route) = self.inner.routes.get(&to).map(|r| r.clone()) else {
                    bump(&self.inner.counters.dropped_no_actor);
                    tracing::debug!(from = %id, %to, "message dropped: no such actor");
                    return None;
                };
                self.routes.entry(to).or_insert(route)
            }
        };
        match route.try_deliver(id, to, msg) {
            Ok(wait) => wait,
            Err(Undelivered::Closed) => {
                self.routes.remove(&to);
                bump(&self.inner.counters.dropped_no_actor);
                tracing::debug!(from = %id, %to, "message dropped: actor stopped");
                None
            }
            Err(err @ Undelivered::WrongType { .. }) => {
                bump(&self.inner.counters.dropped_invalid);
                tracing::warn!(from = %id, %to, "message dropped: {err:?}");
                None
            }
        }
    }

    /// Polls the send the actor at `key` is parked on; once it is done,
    /// applies the effects that waited behind it, until one of them parks
    /// the actor again (and is polled, so that its waker is registered) or
    /// all are done. True when the actor is no longer parked.
    pub(super) fn resume(&mut self, key: Key) -> bool {
        loop {
            let Some(slot) = self.slot_mut(key) else {
                return false;
            };
            let id = slot.id;
            let Some(blocked) = slot.blocked.as_mut() else {
                return true;
            };
            let mut cx = Context::from_waker(&blocked.waker);
            let Poll::Ready(outcome) = blocked.wait.as_mut().poll(&mut cx) else {
                return false;
            };
            let Some(blocked) = slot.blocked.take() else {
                return true;
            };
            let Blocked {
                then_push,
                rest,
                now,
                ..
            } = *blocked;
            match (outcome, then_push) {
                (Ok(()), Some((to, msg))) => self.push_claimed(id, to, msg),
                (Ok(()), None) => {}
                (Err(Undelivered::Closed), _) => {
                    bump(&self.inner.counters.dropped_no_actor);
                    tracing::debug!(from = %id, "message dropped: actor stopped");
                }
                (Err(err @ Undelivered::WrongType { .. }), _) => {
                    bump(&self.inner.counters.dropped_invalid);
                    tracing::warn!(from = %id, "message dropped: {err:?}");
                }
            }
            let mut rest = rest.into_iter();
            self.apply(key, &mut rest, now);
        }
    }

    /// Pushes a message whose place at a same-driver destination is claimed.
    fn push_claimed(&mut self, from: ActorId, to: ActorId, msg: BoxMsg) {
        let target = self.index.get(&to).copied();
        match target.and_then(|key| self.slot_mut(key).map(|slot| (key, slot))) {
            Some((key, slot)) => {
                slot.queue.push_back(Envelope::Msg { from, msg });
                self.schedule(key);
            }
            None => {
                bump(&self.inner.counters.dropped_no_actor);
                tracing::debug!(%from, %to, "message dropped: actor stopped");
            }
        }
    }
}
