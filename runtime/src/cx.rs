//! The context a handler records its effects in.
//!
//! Everything an actor may do to the world goes through [`Cx`]: typed sends,
//! timers, spawning, stopping, I/O requests and watching peers. It also
//! supplies the two inputs a deterministic actor needs from outside: the
//! current time and its own random stream.

use crate::actor::Actor;
use crate::actor::Message;
use crate::hosted::{Effect, IdAlloc, hosted, io_op};
use crate::id::{ActorId, Addr, NodeId};
use crate::io::{IoError, IoRequest};
use crate::recipient::{Recipient, Target};
use crate::rng::ActorRng;
use crate::time::{Clock, Nanos};
use crate::timers::TimerTable;

pub struct Cx<'a, A: Actor> {
    me: ActorId,
    now: &'a Clock<'a>,
    run_seed: u64,
    effects: &'a mut Vec<Effect>,
    ids: &'a dyn IdAlloc,
    rng: &'a mut ActorRng,
    timers: &'a mut TimerTable<A::Timer>,
}

impl<'a, A: Actor> Cx<'a, A> {
    pub(crate) fn new(
        me: ActorId,
        now: &'a Clock<'a>,
        run_seed: u64,
        effects: &'a mut Vec<Effect>,
        ids: &'a dyn IdAlloc,
        rng: &'a mut ActorRng,
        timers: &'a mut TimerTable<A::Timer>,
    ) -> Self {
        Self {
            me,
            now,
            run_seed,
            effects,
            ids,
            rng,
            timers,
        }
    }

    /// This actor's own typed address.
    pub fn me(&self) -> Addr<A> {
        Addr::new(self.me)
    }

    /// This actor as a [`Recipient`] of `M`, for reply fields: its message
    /// type converts from `M` (and lists it in [`crate::accepts!`]).
    pub fn recipient<M: Message>(&self) -> Recipient<M>
    where
        A::Msg: From<M>,
    {
        Recipient::of(self.me())
    }

    pub fn id(&self) -> ActorId {
        self.me
    }

    /// The host's time when this input arrived (virtual in the simulator).
    pub fn now(&self) -> Nanos {
        self.now.now()
    }

    /// This actor's random stream, derived from the run seed and its id.
    pub fn rng(&mut self) -> &mut ActorRng {
        self.rng
    }

    /// Sends `msg` to `to`. Delivery is asynchronous and, across nodes,
    /// at most once: protocols that need more retry with timers.
    /// `to` is a typed [`Addr`] or a [`crate::Recipient`] (any actor that
    /// accepts the message).
    pub fn send<T: Target>(&mut self, to: T, msg: impl Into<T::Msg>) {
        self.effects.push(Effect::Send {
            to: to.to(),
            msg: to.wrap(msg.into()),
        });
    }

    /// Sends to this actor itself, after everything already queued to it.
    pub fn send_self(&mut self, msg: impl Into<A::Msg>) {
        let me = self.me();
        self.send(me, msg);
    }

    /// Arms (or re-arms) `key` to fire after `after` nanoseconds.
    pub fn set_timer(&mut self, key: A::Timer, after: Nanos) {
        let (token, old) = self.timers.arm(key);
        if let Some(old) = old {
            self.effects.push(Effect::CancelTimer { token: old });
        }
        self.effects.push(Effect::SetTimer { token, after });
    }

    /// Disarms `key`; a no-op when it is not armed.
    pub fn cancel_timer(&mut self, key: &A::Timer) {
        if let Some(token) = self.timers.disarm(key) {
            self.effects.push(Effect::CancelTimer { token });
        }
    }

    pub fn timer_armed(&self, key: &A::Timer) -> bool {
        self.timers.is_armed(key)
    }

    /// Starts a new actor on this node. Its id comes from the node's spawn
    /// counter; it starts after the current handler returns.
    pub fn spawn<B: Actor>(&mut self, actor: B) -> Addr<B> {
        let id = self.ids.alloc(self.me.node);
        self.effects.push(Effect::Spawn {
            id,
            actor: hosted(actor, id, self.run_seed),
        });
        Addr::new(id)
    }

    /// Stops this actor once the current handler returns; effects recorded
    /// before still happen, later inputs are dropped.
    pub fn stop(&mut self) {
        self.effects.push(Effect::Stop);
    }

    /// Asks the host to run `req`; its result comes back as the message
    /// `map(result)` sent by this actor to itself.
    pub fn io<R, F>(&mut self, req: R, map: F)
    where
        R: IoRequest,
        F: FnOnce(Result<R::Output, IoError>) -> A::Msg + Send + 'static,
    {
        self.effects.push(Effect::Io {
            op: io_op::<R, A::Msg, F>(req, map),
        });
    }

    /// Asks to hear (through `on_peer_down`) when `node` becomes unreachable.
    pub fn watch_node(&mut self, node: NodeId) {
        self.effects.push(Effect::WatchNode(node));
    }
}
