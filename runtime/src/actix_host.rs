//! The actix adapter: Gyre actors inside a user's actix system.
//!
//! Research code often already lives in actix. This adapter hosts any Gyre
//! [`Actor`] as an actix actor ([`GyreActix`]) so that it runs unchanged next
//! to the user's own actors: each Gyre actor gets an inbox its actix actor
//! drains from its own context (see [`inbox`]), its timers become
//! `run_later` futures,
//! its I/O runs on tokio's blocking pool, and its sends are routed by
//! [`ActorId`] through a shared table.
//!
//! Interop both ways:
//! - a user's actix actor sends to a Gyre actor with [`GyreHandle::tell`]
//!   (or by sending an [`Envelope`] to the actix address: that path is not
//!   ordered with the inbox's);
//! - a Gyre actor sends to a user's actix actor through an
//!   `Addr<External<M>>` obtained from [`ActixGyre::external`], which the
//!   adapter delivers as a [`Tell<M>`] to the user's `Recipient`.
//!
//! There is no network here: `watch_node` is accepted and never fires.

mod inbox;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Instant;

use actix::{
    Actor as ActixActor, ActorContext, ActorFuture, AsyncContext, Context, Handler, Recipient,
    SpawnHandle,
};
use dashmap::DashMap;
use rustc_hash::FxHashMap;

use crate::actor::{Actor, External, Message};
use crate::hosted::{BoxMsg, DynActor, Effect, Env, IdAlloc, hosted};
use crate::id::{ActorId, Addr, NodeId};
use crate::time::{Clock, Nanos, from_duration, to_duration};
use inbox::{Inbox, Receiver};

/// A typed message from `from`, as actix sees it.
#[derive(Debug)]
pub struct Tell<M> {
    pub from: ActorId,
    pub msg: M,
}

impl<M: Send + 'static> actix::Message for Tell<M> {
    type Result = ();
}

/// A type-erased message between Gyre actors hosted in actix.
#[derive(Debug)]
pub struct Envelope {
    pub from: ActorId,
    pub msg: BoxMsg,
}

impl actix::Message for Envelope {
    type Result = ();
}

/// Where messages to one id go.
#[derive(Clone)]
enum Route {
    /// A hosted Gyre actor's inbox.
    Hosted(Arc<Inbox>),
    /// A user's actix recipient; false when it is gone.
    External(Arc<dyn Fn(ActorId, BoxMsg) -> bool + Send + Sync>),
}

impl Route {
    /// Delivers `msg`; false when the destination is gone (the message is
    /// then dropped).
    fn deliver(&self, from: ActorId, msg: BoxMsg) -> bool {
        match self {
            Route::Hosted(inbox) => inbox.push((from, msg)),
            Route::External(tell) => tell(from, msg),
        }
    }
}

/// Routes a hosted actor remembers before it starts over.
const ROUTE_CACHE_LIMIT: usize = 1024;

struct Shared {
    node: NodeId,
    seed: u64,
    next_local: AtomicU64,
    routes: DashMap<ActorId, Route>,
    epoch: Instant,
    dropped: AtomicU64,
}

impl IdAlloc for Shared {
    fn alloc(&self, node: NodeId) -> ActorId {
        ActorId {
            node,
            local: self.next_local.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// One Gyre node inside an actix system: the id counter, the seed and the
/// routing table its actors share. Cheap to clone.
#[derive(Clone)]
pub struct ActixGyre {
    shared: Arc<Shared>,
}

impl ActixGyre {
    /// Ids start at 1 on `node`, as in the other hosts, so the same spawn
    /// order gives the same ids and the same per-actor random streams.
    pub fn new(node: NodeId, seed: u64) -> Self {
        Self {
            shared: Arc::new(Shared {
                node,
                seed,
                next_local: AtomicU64::new(1),
                routes: DashMap::new(),
                epoch: Instant::now(),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Starts `actor` in the current actix arbiter. Must be called from
    /// inside a running actix system.
    pub fn start<A: Actor>(&self, actor: A) -> GyreHandle<A> {
        let id = self.shared.alloc(self.shared.node);
        let (addr, inbox) = self.start_dyn(hosted(actor, id, self.shared.seed));
        GyreHandle {
            id: Addr::new(id),
            addr,
            inbox,
            gyre: self.clone(),
        }
    }

    fn start_dyn(&self, inner: Box<dyn DynActor>) -> (actix::Addr<GyreActix>, Arc<Inbox>) {
        let id = inner.id();
        let gyre = self.clone();
        let inbox = Arc::new(Inbox::default());
        // Register before the actor starts so on_start's sends to itself
        // (and anyone's sends to it) find the route.
        gyre.shared
            .routes
            .insert(id, Route::Hosted(Arc::clone(&inbox)));
        let drain = Drain(Receiver::new(Arc::clone(&inbox)));
        let mine = Arc::clone(&inbox);
        let addr = GyreActix::create(move |ctx| {
            ctx.spawn(drain);
            GyreActix {
                inner,
                inbox: mine,
                gyre,
                timers: FxHashMap::default(),
                routes: RouteCache::default(),
                effects: Vec::new(),
                stopped: false,
            }
        });
        (addr, inbox)
    }

    /// An address Gyre actors can send `M` to; the adapter hands each such
    /// message to `recipient` as a [`Tell<M>`].
    pub fn external<M: Message>(&self, recipient: Recipient<Tell<M>>) -> Addr<External<M>> {
        let id = self.shared.alloc(self.shared.node);
        let route = Route::External(Arc::new(move |from, msg: BoxMsg| {
            if !recipient.connected() {
                return false;
            }
            let got = msg.type_name();
            match msg.into_any().downcast::<M>() {
                Ok(msg) => recipient.do_send(Tell { from, msg: *msg }),
                Err(_) => tracing::warn!(
                    to = %id,
                    expected = std::any::type_name::<M>(),
                    got,
                    "mistyped message to an external actix recipient dropped"
                ),
            }
            true
        }));
        self.shared.routes.insert(id, route);
        Addr::new(id)
    }

    /// Sends from outside any actor (`from` is only informative).
    pub fn send<A: Actor>(&self, from: ActorId, to: Addr<A>, msg: impl Into<A::Msg>) {
        let msg: A::Msg = msg.into();
        self.route(from, to.id(), Box::new(msg));
    }

    /// Messages dropped because their destination was unknown or stopped.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    fn route(&self, from: ActorId, to: ActorId, msg: BoxMsg) {
        let route = self.shared.routes.get(&to).map(|r| r.value().clone());
        match route {
            Some(route) => {
                if !route.deliver(from, msg) {
                    self.count_dropped(from, to);
                }
            }
            None => self.count_dropped(from, to),
        }
    }

    /// Sends through `cache` (a hosted actor's).
    fn route_cached(&self, cache: &mut RouteCache, from: ActorId, to: ActorId, msg: BoxMsg) {
        // One comparison or one lookup on the hit path, the common case.
        let hit = match &cache.newest {
            Some((id, route)) if *id == to => Some(route),
            _ => cache.map.get(&to),
        };
        let delivered = match hit {
            Some(route) => route.deliver(from, msg),
            None => {
                let Some(route) = self.shared.routes.get(&to).map(|r| r.value().clone()) else {
                    self.count_dropped(from, to);
                    return;
                };
                if cache.map.len() >= ROUTE_CACHE_LIMIT {
                    cache.map.clear();
                }
                let delivered = route.deliver(from, msg);
                cache.newest = Some((to, route.clone()));
                cache.map.insert(to, route);
                delivered
            }
        };
        if !delivered {
            cache.map.remove(&to);
            if cache.newest.as_ref().is_some_and(|(id, _)| *id == to) {
                cache.newest = None;
            }
            self.count_dropped(from, to);
        }
    }

    fn count_dropped(&self, from: ActorId, to: ActorId) {
        self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%from, %to, "message to an unknown or stopped actor dropped");
    }

    fn now(&self) -> Nanos {
        from_duration(self.shared.epoch.elapsed())
    }
}

/// The routes one hosted actor has sent on, which saves the shared table's
/// lock and reference count on every send to a known address.
#[derive(Default)]
struct RouteCache {
    /// The route added last, compared before the map is looked up: an
    /// actor that talks to one peer (a worker to its hub, one side of a
    /// pair) pays no hash.
    newest: Option<(ActorId, Route)>,
    map: FxHashMap<ActorId, Route>,
}

/// A started Gyre actor: its Gyre address and its actix address.
pub struct GyreHandle<A: Actor> {
    pub id: Addr<A>,
    pub addr: actix::Addr<GyreActix>,
    inbox: Arc<Inbox>,
    gyre: ActixGyre,
}

impl<A: Actor> GyreHandle<A> {
    /// Delivers `msg` as if sent by `from` (an actix actor's chosen id),
    /// after everything already queued to the actor; counted as dropped once
    /// the actor stopped.
    pub fn tell(&self, from: ActorId, msg: impl Into<A::Msg>) {
        let msg: A::Msg = msg.into();
        if !self.inbox.push((from, Box::new(msg))) {
            self.gyre.count_dropped(from, self.id.id());
        }
    }
}

impl<A: Actor> Clone for GyreHandle<A> {
    fn clone(&self) -> Self {
        Self {
            id: self.id,
            addr: self.addr.clone(),
            inbox: Arc::clone(&self.inbox),
            gyre: self.gyre.clone(),
        }
    }
}

/// The actix actor that hosts one Gyre actor.
pub struct GyreActix {
    inner: Box<dyn DynActor>,
    inbox: Arc<Inbox>,
    gyre: ActixGyre,
    timers: FxHashMap<u64, SpawnHandle>,
    /// Routes this actor has sent on.
    routes: RouteCache,
    /// The effects of the handler that just ran (kept for its capacity).
    effects: Vec<Effect>,
    stopped: bool,
}

impl GyreActix {
    fn with_env(
        &mut self,
        ctx: &mut Context<Self>,
        f: impl FnOnce(&mut dyn DynActor, &mut Env<'_>),
    ) {
        if self.stopped {
            return;
        }
        let mut effects = std::mem::take(&mut self.effects);
        let gyre = &self.gyre;
        let read = || gyre.now();
        let mut env = Env {
            now: Clock::lazy(&read),
            run_seed: self.gyre.shared.seed,
            effects: &mut effects,
            ids: &*self.gyre.shared,
        };
        f(self.inner.as_mut(), &mut env);
        self.apply(&mut effects, ctx);
        self.effects = effects;
    }

    fn apply(&mut self, effects: &mut Vec<Effect>, ctx: &mut Context<Self>) {
        let me = self.inner.id();
        for effect in effects.drain(..) {
            match effect {
                Effect::Send { to, msg } => self.gyre.route_cached(&mut self.routes, me, to, msg),
                Effect::SetTimer { token, after } => {
                    let handle = ctx.run_later(to_duration(after), move |act, ctx| {
                        act.timers.remove(&token);
                        act.with_env(ctx, |inner, env| {
                            inner.fire(token, env);
                        });
                    });
                    self.timers.insert(token, handle);
                }
                Effect::CancelTimer { token } => {
                    if let Some(handle) = self.timers.remove(&token) {
                        ctx.cancel_future(handle);
                    }
                }
                Effect::Spawn { actor, .. } => {
                    let _started = self.gyre.start_dyn(actor);
                }
                Effect::Io { op } => {
                    let gyre = self.gyre.clone();
                    actix::spawn(async move {
                        let msg = match tokio::task::spawn_blocking(move || op.complete()).await {
                            Ok(msg) => msg,
                            Err(e) => {
                                tracing::error!(actor = %me, "I/O request panicked: {e}");
                                return;
                            }
                        };
                        gyre.route(me, me, msg);
                    });
                }
                Effect::WatchNode(node) => {
                    tracing::debug!(actor = %me, %node, "watch_node has no effect in the actix adapter");
                }
                Effect::Stop => {
                    self.stopped = true;
                    // Later sends count as dropped from now on, as they are
                    // never handled.
                    self.inbox.close();
                    ctx.stop();
                }
            }
        }
    }
}

impl ActixActor for GyreActix {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.with_env(ctx, |inner, env| inner.start(env));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.gyre.shared.routes.remove(&self.inner.id());
        self.inbox.close();
    }
}

impl GyreActix {
    fn deliver(&mut self, from: ActorId, msg: BoxMsg, ctx: &mut Context<Self>) {
        self.with_env(ctx, |inner, env| {
            if let Err(e) = inner.deliver(from, msg, env) {
                tracing::warn!("{e}");
            }
        });
    }
}

/// Letters a hosted actor handles in one turn before it lets its context
/// (timers, I/O completions) and the arbiter's other actors run.
const LETTERS_PER_TURN: usize = 256;

/// Delivers a hosted actor's inbox, as a future in its own actix context; it
/// never ends while the actor runs.
struct Drain(Receiver);

impl ActorFuture<GyreActix> for Drain {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut GyreActix,
        ctx: &mut Context<GyreActix>,
        task: &mut std::task::Context<'_>,
    ) -> Poll<()> {
        let receiver = &mut self.get_mut().0;
        for _ in 0..LETTERS_PER_TURN {
            if act.stopped {
                return Poll::Pending;
            }
            match receiver.poll_letter(task) {
                Poll::Ready((from, msg)) => act.deliver(from, msg, ctx),
                Poll::Pending => return Poll::Pending,
            }
        }
        task.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Handler<Envelope> for GyreActix {
    type Result = ();

    fn handle(&mut self, Envelope { from, msg }: Envelope, ctx: &mut Context<Self>) {
        self.deliver(from, msg, ctx);
    }
}
