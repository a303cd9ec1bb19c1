//! The live host: actors on tokio, nodes connected over TCP.
//!
//! A node runs its actors on drivers: one scheduler loop per executor thread
//! (`actor_threads`, default 1, each a single-threaded runtime of its own;
//! with `actor_threads = 0`, one per worker of the caller's runtime). Each
//! actor keeps its own bounded mailbox and is never run concurrently with
//! itself; its timers are real deadlines, and its I/O requests run on
//! tokio's blocking pool, their completions pushed back into its mailbox.
//! A send between actors of one driver is a queue push and a ready-queue
//! push, with no encoding, task wake-up or lock; from elsewhere it goes
//! through the destination's inbox. When the destination is full the sender
//! waits for room. That wait is the backpressure: nothing is buffered past a
//! configured bound. Bounded mailboxes can deadlock a cycle of actors that
//! all wait on each other's full mailboxes; a sender blocked for long logs a
//! warning.
//!
//! Nodes (OS processes) talk over TCP in length-delimited bincode frames
//! ([`WireFrame`]), opened by a handshake that checks the protocol version
//! and the node ids. One connection carries our messages to a given node, fed
//! by one bounded queue and read by one task, so messages from one sender to
//! one receiver arrive in the order sent. Delivery across nodes is **at most
//! once**: messages queued on a connection that breaks are lost, sends while
//! a peer is unreachable are dropped and counted, and the dialer reconnects
//! with exponential backoff. Heartbeats and `peer_timeout` catch a silent
//! peer, end of stream or a reset a killed one; either way every actor that
//! called `watch_node` hears `on_peer_down` once per loss. Bad input from a
//! peer (a truncated, oversized or undecodable frame, a wrong version) is
//! logged with both sides named and closes that connection only. With a
//! cluster secret configured (`LiveConfig::secret`), both ends of every
//! connection prove they hold it in the handshake (see `auth`).

mod auth;
mod config;
mod driver;
mod effects;
mod error;
mod executor;
mod frame;
mod gate;
mod handshake;
mod links;
mod mailbox;
mod net;
mod node;
mod peer;
mod slot;
mod stats;
mod supervise;
mod timers;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::actor::{Actor, External, Message};
use crate::error::RuntimeError;
use crate::hosted::{IdAlloc, decoder_of, hosted};
use crate::id::{ActorId, Addr, NodeId};

pub use auth::LinkSecret;
pub use config::LiveConfig;
pub use frame::{Frame, FrameError, LENGTH_PREFIX, MAGIC, WireCodec, WireFrame};
pub use stats::LiveStats;
pub use supervise::PanicReport;

use mailbox::{Route, TypedSink, Undelivered};
use node::NodeInner;

/// Locks a mutex, recovering from poisoning: the data guarded here (maps of
/// handles and watchers) stays consistent even if a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A handle to a running live node; clones share the node.
#[derive(Clone)]
pub struct LiveNode {
    inner: Arc<NodeInner>,
}

impl LiveNode {
    /// Starts the node on the current tokio runtime: binds the listener (if
    /// any) and starts dialing the configured peers.
    pub async fn start(cfg: LiveConfig) -> Result<LiveNode, RuntimeError> {
        cfg.validate()?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            RuntimeError::Config("LiveNode::start must be called inside a tokio runtime".into())
        })?;
        let listener = match cfg.listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let local_addr = listener.as_ref().map(TcpListener::local_addr).transpose()?;
        let peers = cfg.peers.clone();
        let exec = executor::Executor::new(rt.clone(), cfg.actor_threads, cfg.node)?;
        let inner = Arc::new(NodeInner::new(cfg, exec, local_addr));
        if let Err(err) = inner.exec.launch(&inner) {
            inner.shutdown.cancel();
            inner.exec.stop().await;
            return Err(err.into());
        }
        let mut net = lock(&inner.net_tasks);
        if let Some(listener) = listener {
            net.push(rt.spawn(net::accept_loop(Arc::clone(&inner), listener)));
        }
        for (peer, addr) in peers {
            net.push(rt.spawn(net::dial_loop(Arc::clone(&inner), peer, addr)));
        }
        drop(net);
        tracing::info!(node = %inner.node(), listen = ?local_addr, "live node started");
        Ok(LiveNode { inner })
    }

    pub fn node(&self) -> NodeId {
        self.inner.node()
    }

    /// The address the listener is bound to (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.local_addr
    }

    /// Starts `actor` under the next id from this node's counter (the first
    /// is 1), the same sequence the simulator hands out.
    pub fn spawn<A: Actor>(&self, actor: A) -> Addr<A> {
        let id = self.inner.ids.alloc(self.inner.node());
        driver::spawn_actor(&self.inner, hosted(actor, id, self.inner.cfg.seed));
        Addr::new(id)
    }

    /// [`LiveNode::spawn`] under supervision: when a handler panics, the
    /// actor is rebuilt by `make` under the same id and mailbox (its state
    /// and timers are lost, `on_start` runs again), at most `restarts`
    /// times; every panic is filed as a [`PanicReport`] either way.
    pub fn spawn_supervised<A: Actor>(
        &self,
        restarts: u32,
        mut make: impl FnMut() -> A + Send + 'static,
    ) -> Addr<A> {
        let id = self.inner.ids.alloc(self.inner.node());
        let seed = self.inner.cfg.seed;
        let first = hosted(make(), id, seed);
        self.inner
            .supervision
            .register(id, restarts, Box::new(move || hosted(make(), id, seed)));
        driver::spawn_actor(&self.inner, first);
        Addr::new(id)
    }

    /// Every handler panic caught on this node so far, oldest first.
    pub fn panics(&self) -> Vec<PanicReport> {
        self.inner.supervision.reports()
    }

    /// Waits for the panic report after the first `seen` (0: the first).
    pub async fn next_panic(&self, seen: usize) -> PanicReport {
        self.inner.supervision.next(seen).await
    }

    /// An endpoint outside the actor world: messages sent to the returned
    /// address (locally or from other nodes) arrive on the receiver, with
    /// their sender, at most `capacity` of them queued.
    pub fn probe<M: Message>(
        &self,
        capacity: usize,
    ) -> (Addr<External<M>>, mpsc::Receiver<(ActorId, M)>) {
        let id = self.inner.ids.alloc(self.inner.node());
        let (tx, rx) = mpsc::channel(capacity.max(1));
        if !self.inner.is_stopped() {
            self.inner.routes.insert(
                id,
                Route::Probe {
                    sink: Arc::new(TypedSink(tx)),
                    decoder: decoder_of::<External<M>>(),
                },
            );
        }
        (Addr::new(id), rx)
    }

    /// Sends from outside the actors (a test, a gateway), waiting for room
    /// like an actor would. `from` should be an address of this node (a
    /// probe, say): that is where replies go.
    pub async fn send<A: Actor>(
        &self,
        from: ActorId,
        to: Addr<A>,
        msg: impl Into<A::Msg>,
    ) -> Result<(), RuntimeError> {
        if self.inner.is_stopped() {
            return Err(RuntimeError::ShutDown);
        }
        let msg: A::Msg = msg.into();
        let to = to.id();
        if to.node != self.inner.node() {
            if from.node != self.inner.node() {
                return Err(RuntimeError::Config(format!(
                    "a message for {to} on another node must come from an address of this node \
                     ({}), not {from}: the peer would reject it as spoofed",
                    self.inner.node()
                )));
            }
            return self.inner.send_remote(from, to, Box::new(msg)).await;
        }
        let route = self
            .inner
            .routes
            .get(&to)
            .map(|r| r.clone())
            .ok_or(RuntimeError::NoSuchActor(to))?;
        route
            .deliver(from, to, Box::new(msg))
            .await
            .map_err(|err| match err {
                Undelivered::Closed => RuntimeError::NoSuchActor(to),
                Undelivered::WrongType { expected, got } => {
                    RuntimeError::WrongMessageType { to, expected, got }
                }
            })
    }

    /// Waits until messages to `peer` have a connection to go over (the
    /// handshake completed); false if that did not happen within `timeout`.
    pub async fn connected(&self, peer: NodeId, timeout: Duration) -> bool {
        let mut changed = self.inner.links.subscribe();
        let wait = async {
            loop {
                if self.inner.links.can_send(peer) {
                    return true;
                }
                if changed.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(false)
    }

    pub fn stats(&self) -> LiveStats {
        self.inner.counters.snapshot()
    }

    /// Stops every actor (their pending I/O completions are dropped; I/O
    /// already running on the blocking pool finishes there, unobserved),
    /// says goodbye on and closes every connection, and joins every task.
    pub async fn shutdown(self) {
        let inner = self.inner;
        if inner.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        inner.shutdown.cancel();
        inner.exec.stop().await;
        let net = std::mem::take(&mut *lock(&inner.net_tasks));
        for handle in net {
            if let Err(err) = handle.await
                && err.is_panic()
            {
                tracing::error!("network task had panicked");
            }
        }
        inner.routes.clear();
        tracing::info!(node = %inner.node(), "live node shut down");
    }
}
