//! The state one live node shares between its actor tasks, its connections
//! and its handle: the address book, the spawn counter, the links to peers.
//!
//! Everything here is reached through one `Arc`, so a driver, a connection
//! reader and the user's [`LiveNode`](super::LiveNode) handle all see the
//! same routes without a central router task in the message path.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use rustc_hash::FxBuildHasher;
use tokio::sync::mpsc::error::TrySendError;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::RuntimeError;
use crate::hosted::{BoxMsg, IdAlloc};
use crate::id::{ActorId, NodeId};
use crate::time::{Nanos, from_duration};

use super::config::LiveConfig;
use super::executor::Executor;
use super::frame::{Frame, WireFrame};
use super::links::{Links, OutLink};
use super::mailbox::{Envelope, Route, SlowDelivery};
use super::stats::{Counters, bump};
use super::supervise::Supervision;

/// The node's spawn counter: ids start at 1 and are never reused.
pub(crate) struct Ids(AtomicU64);

impl IdAlloc for Ids {
    fn alloc(&self, node: NodeId) -> ActorId {
        ActorId {
            node,
            local: self.0.fetch_add(1, Ordering::Relaxed),
        }
    }
}

pub(crate) struct NodeInner {
    pub cfg: LiveConfig,
    pub started: Instant,
    pub exec: Executor,
    pub ids: Ids,
    pub routes: DashMap<ActorId, Route, FxBuildHasher>,
    pub net_tasks: Mutex<Vec<JoinHandle<()>>>,
    pub links: Links,
    pub counters: Counters,
    pub supervision: Supervision,
    pub shutdown: CancellationToken,
    pub stopped: AtomicBool,
    pub local_addr: Option<SocketAddr>,
    next_conn: AtomicU64,
}

impl NodeInner {
    pub fn new(cfg: LiveConfig, exec: Executor, local_addr: Option<SocketAddr>) -> Self {
        let links = Links::new(cfg.peers.iter().map(|(n, _)| *n));
        Self {
            cfg,
            started: Instant::now(),
            exec,
            ids: Ids(AtomicU64::new(1)),
            routes: DashMap::default(),
            net_tasks: Mutex::new(Vec::new()),
            links,
            counters: Counters::default(),
            supervision: Supervision::default(),
            shutdown: CancellationToken::new(),
            stopped: AtomicBool::new(false),
            local_addr,
            next_conn: AtomicU64::new(1),
        }
    }

    pub fn node(&self) -> NodeId {
        self.cfg.node
    }

    /// Nanoseconds since the node started (monotonic).
    pub fn now(&self) -> Nanos {
        from_duration(self.started.elapsed())
    }

    /// The instant `now + after` nanoseconds on this node's clock; a deadline
    /// too far to represent becomes "in thirty years".
    pub fn deadline(&self, now: Nanos, after: Nanos) -> Instant {
        self.started
            .checked_add(Duration::from_nanos(now.saturating_add(after)))
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(30 * 365 * 86_400))
    }

    pub fn next_conn(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Encodes `msg` and queues it on the connection to `to`'s node, waiting
    /// for room when that queue is full. At most once: a message queued on a
    /// connection that then breaks is lost with it.
    pub async fn send_remote(
        &self,
        from: ActorId,
        to: ActorId,
        msg: BoxMsg,
    ) -> Result<(), RuntimeError> {
        let (link, frame) = self.encode_remote(from, to, msg)?;
        let sent = match link.tx.try_send(frame) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(frame)) => link.tx.send(frame).await.map_err(|_| ()),
            Err(TrySendError::Closed(_)) => Err(()),
        };
        sent.map_err(|()| {
            bump(&self.counters.dropped_unreachable);
            RuntimeError::NoRoute(to.node)
        })
    }

    /// Like [`send_remote`](Self::send_remote) without waiting: queues the
    /// message at once, or returns the wait for room in the connection's
    /// queue (which counts and logs a loss by itself).
    pub fn try_send_remote(
        self: &Arc<Self>,
        from: ActorId,
        to: ActorId,
        msg: BoxMsg,
    ) -> Result<Option<SlowDelivery>, RuntimeError> {
        let (link, frame) = self.encode_remote(from, to, msg)?;
        match link.tx.try_send(frame) {
            Ok(()) => Ok(None),
            Err(TrySendError::Full(frame)) => {
                let inner = Arc::clone(self);
                Ok(Some(Box::pin(async move {
                    if link.tx.send(frame).await.is_err() {
                        bump(&inner.counters.dropped_unreachable);
                        tracing::debug!(%from, %to, "remote message dropped: connection closed");
                    }
                    Ok(())
                })))
            }
            Err(TrySendError::Closed(_)) => {
                bump(&self.counters.dropped_unreachable);
                Err(RuntimeError::NoRoute(to.node))
            }
        }
    }

    /// The connection to `to`'s node and `msg` framed for it.
    fn encode_remote(
        &self,
        from: ActorId,
        to: ActorId,
        msg: BoxMsg,
    ) -> Result<(OutLink, Vec<u8>), RuntimeError> {
        let Some(link) = self.links.out(to.node) else {
            bump(&self.counters.dropped_unreachable);
            return Err(RuntimeError::NoRoute(to.node));
        };
        let encoded = msg
            .encode()
            .and_then(|payload| {
                let frame = Frame {
                    src: from,
                    dst: to,
                    payload,
                };
                match msg.tag() {
                    None => WireFrame::Msg(frame),
                    Some(key) => WireFrame::Tell { key, frame },
                }
                .encode()
            })
            .inspect_err(|_| bump(&self.counters.dropped_invalid))?;
        if encoded.len() > self.cfg.max_frame {
            bump(&self.counters.dropped_invalid);
            return Err(RuntimeError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "a {} from {from} to {to} encodes to {} bytes, over max_frame {}; \
                     send large data by handle",
                    msg.type_name(),
                    encoded.len(),
                    self.cfg.max_frame
                ),
            )));
        }
        Ok((link, encoded))
    }

    /// Tells every actor watching `node` that it went down.
    pub async fn peer_down(&self, node: NodeId) {
        bump(&self.counters.peer_downs);
        let watchers = self.links.watchers(node);
        if watchers.is_empty() {
            tracing::info!(peer = %node, "peer down");
        } else {
            tracing::warn!(peer = %node, watchers = watchers.len(), "peer down; notifying watchers");
        }
        for id in watchers {
            let route = self.routes.get(&id).map(|r| r.clone());
            if let Some(Route::Actor { inbox, .. }) = route {
                // A closed mailbox means the watcher stopped meanwhile.
                let _ = inbox.send(Envelope::PeerDown(node)).await;
            }
        }
    }
}
