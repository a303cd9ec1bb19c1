//! The transfer engine: a node's registered memory, its connections to
//! peers, and the batch bookkeeping that turns transport completions into
//! per-request statuses.
//!
//! The call shapes follow Mooncake's Transfer Engine: register local memory
//! as segments, open a remote segment by name, submit a batch of one-sided
//! requests, poll or await it, and send notifications. [`TransferEngine::submit_with`]
//! is the same machinery with one completion callback per request, the
//! shape an I/O-request effect needs.

use std::collections::HashMap;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;

use crate::batch::{BatchId, BatchState};
use crate::error::{RequestError, TransferError};
use crate::notify::{MAX_NOTIFICATION, Notification, NotificationHub};
use crate::request::{
    Completer, Completion, Op, PeerId, RequestStatus, SegmentRef, TransferRequest,
};
use crate::segment::{LocalSegment, MAX_SEGMENT_NAME, SegmentInfo, SegmentTable};
use crate::transport::Transport;
use crate::transport::local::LocalTransport;
use crate::transport::tcp::{ClusterSecret, TcpOptions, TcpPeer, TcpServer};

/// What remote peers reach on this node: its segments and its inbox.
pub(crate) struct NodeMemory {
    pub name: Arc<str>,
    pub segments: SegmentTable,
    pub hub: NotificationHub,
}

/// One node's transfer engine. Cloning shares it.
#[derive(Clone)]
pub struct TransferEngine {
    node: Arc<NodeMemory>,
    peers: Arc<RwLock<Vec<Arc<dyn Transport>>>>,
    batches: Arc<Mutex<HashMap<u64, Arc<BatchState>>>>,
    next_batch: Arc<AtomicU64>,
}

impl TransferEngine {
    /// `name` is how this node introduces itself to peers.
    pub fn new(name: &str) -> Self {
        Self {
            node: Arc::new(NodeMemory {
                name: name.into(),
                segments: SegmentTable::default(),
                hub: NotificationHub::default(),
            }),
            peers: Arc::default(),
            batches: Arc::default(),
            next_batch: Arc::new(AtomicU64::new(1)),
        }
    }

    pub fn name(&self) -> &str {
        &self.node.name
    }

    // ---- local memory --------------------------------------------------

    /// Registers immutable memory (a weight snapshot, pinned KV): peers read
    /// it without a copy on this side; writes to it are refused.
    pub fn register_frozen(&self, name: &str, bytes: Bytes) -> Result<SegmentInfo, TransferError> {
        self.node.segments.register_frozen(name, bytes)
    }

    /// Registers memory peers may write (an inbox, a gradient buffer).
    pub fn register_mutable(
        &self,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<SegmentInfo, TransferError> {
        self.node.segments.register_mutable(name, bytes)
    }

    pub fn register_zeroed(&self, name: &str, len: usize) -> Result<SegmentInfo, TransferError> {
        self.register_mutable(name, vec![0; len])
    }

    /// Withdraws a segment; requests naming it are refused from now on.
    pub fn unregister(&self, name: &str) -> bool {
        self.node.segments.unregister(name)
    }

    /// This node's own handle on one of its segments.
    pub fn local_segment(&self, name: &str) -> Result<LocalSegment, TransferError> {
        self.node
            .segments
            .get(name)
            .map(LocalSegment)
            .ok_or_else(|| TransferError::NoLocalSegment { name: name.into() })
    }

    // ---- peers ---------------------------------------------------------

    /// Adds a connection through any transport.
    pub fn add_peer(&self, transport: Arc<dyn Transport>) -> PeerId {
        let mut peers = self.peers.write().unwrap_or_else(|p| p.into_inner());
        peers.push(transport);
        PeerId((peers.len() - 1) as u32)
    }

    /// Connects to another engine in this process (zero-copy reads).
    pub fn connect_local(&self, other: &TransferEngine) -> PeerId {
        self.add_peer(Arc::new(LocalTransport::new(
            other.node.clone(),
            self.node.name.clone(),
        )))
    }

    /// Connects to a peer's [`TcpServer`], proving the cluster secret.
    pub fn connect_tcp(
        &self,
        addr: impl ToSocketAddrs,
        secret: &ClusterSecret,
        options: TcpOptions,
    ) -> Result<PeerId, TransferError> {
        let peer = TcpPeer::connect(addr, secret, &self.node.name, options)?;
        Ok(self.add_peer(Arc::new(peer)))
    }

    /// Serves this node's segments and inbox to peers holding `secret`.
    pub fn listen_tcp(
        &self,
        addr: impl ToSocketAddrs,
        secret: &ClusterSecret,
    ) -> Result<TcpServer, TransferError> {
        TcpServer::start(self.node.clone(), addr, secret.clone())
    }

    fn transport(&self, peer: PeerId) -> Result<Arc<dyn Transport>, RequestError> {
        let peers = self.peers.read().unwrap_or_else(|p| p.into_inner());
        peers
            .get(peer.0 as usize)
            .cloned()
            .ok_or(RequestError::UnknownPeer(peer.0))
    }

    pub fn peer_label(&self, peer: PeerId) -> Option<String> {
        self.transport(peer).ok().map(|t| t.label().to_string())
    }

    /// Looks a segment up on a peer; the handle carries the version it is at.
    pub fn open_segment(&self, peer: PeerId, name: &str) -> Result<SegmentRef, TransferError> {
        let transport = self.transport(peer)?;
        if name.len() > MAX_SEGMENT_NAME {
            // No peer registers such a name; asking would break the frame.
            return Err(RequestError::UnknownSegment {
                peer: transport.label().to_string(),
                name: name.chars().take(64).collect(),
            }
            .into());
        }
        let info = transport.describe(name)?;
        Ok(SegmentRef {
            peer,
            name: info.name,
            version: info.version,
            len: info.len,
        })
    }

    // ---- transfers -----------------------------------------------------

    /// Starts one request; `done` gets its completion exactly once.
    pub fn submit_with(&self, request: TransferRequest, done: Completer) {
        let transport = match self.transport(request.target.peer) {
            Ok(t) => t,
            Err(e) => return done(Err(e)),
        };
        let target = &request.target;
        let len = request.len();
        if let Op::Read {
            into: Some(buf),
            len,
        } = &request.op
            && buf.len() as u64 != *len
        {
            return done(Err(RequestError::BufferMismatch {
                len: *len,
                buffer: buf.len(),
            }));
        }
        if target.name.len() > MAX_SEGMENT_NAME {
            return done(Err(RequestError::UnknownSegment {
                peer: transport.label().to_string(),
                name: target.name.chars().take(64).collect(),
            }));
        }
        if request
            .offset
            .checked_add(len)
            .is_none_or(|end| end > target.len)
        {
            return done(Err(RequestError::OutOfBounds {
                peer: transport.label().to_string(),
                name: target.name.to_string(),
                offset: request.offset,
                len,
                segment_len: target.len,
            }));
        }
        transport.submit(request, done);
    }

    /// Submits a batch; poll it with [`Self::transfer_status`], collect it
    /// with [`Self::wait_batch`].
    pub fn submit_transfer(&self, requests: Vec<TransferRequest>) -> BatchId {
        let id = self.next_batch.fetch_add(1, Ordering::Relaxed);
        let state = BatchState::new(requests.len());
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, state.clone());
        for (index, request) in requests.into_iter().enumerate() {
            let state = state.clone();
            self.submit_with(request, Box::new(move |c| state.complete(index, c)));
        }
        BatchId(id)
    }

    fn batch(&self, batch: BatchId) -> Result<Arc<BatchState>, TransferError> {
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&batch.0)
            .cloned()
            .ok_or(TransferError::UnknownBatch(batch.0))
    }

    /// Each request's state, in submission order.
    pub fn transfer_status(&self, batch: BatchId) -> Result<Vec<RequestStatus>, TransferError> {
        Ok(self.batch(batch)?.status())
    }

    /// Blocks until the batch completed, then frees it and returns each
    /// request's completion in submission order.
    pub fn wait_batch(
        &self,
        batch: BatchId,
        timeout: Option<Duration>,
    ) -> Result<Vec<Completion>, TransferError> {
        let state = self.batch(batch)?;
        let completions = state.wait(timeout).ok_or(TransferError::Timeout {
            batch: batch.0,
            timeout: timeout.unwrap_or_default(),
        })?;
        self.free_batch(batch);
        Ok(completions)
    }

    /// Forgets a batch; its requests still run to completion.
    pub fn free_batch(&self, batch: BatchId) -> bool {
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&batch.0)
            .is_some()
    }

    /// Submits and waits: the blocking form an I/O-request worker runs.
    pub fn transfer(&self, requests: Vec<TransferRequest>) -> Vec<Completion> {
        let state = BatchState::new(requests.len());
        for (index, request) in requests.into_iter().enumerate() {
            let state = state.clone();
            self.submit_with(request, Box::new(move |c| state.complete(index, c)));
        }
        state.wait(None).unwrap_or_default()
    }

    // ---- notifications -------------------------------------------------

    /// Delivers `payload` to the peer's subscribers of `topic`, returning once
    /// the peer has queued it. Sent after a batch of writes was awaited, it
    /// arrives after those writes are in the peer's memory.
    pub fn send_notification(
        &self,
        peer: PeerId,
        topic: &str,
        payload: Bytes,
    ) -> Result<(), RequestError> {
        if payload.len() > MAX_NOTIFICATION {
            return Err(RequestError::NotificationTooLarge {
                len: payload.len(),
                max: MAX_NOTIFICATION,
            });
        }
        if topic.len() > MAX_SEGMENT_NAME {
            return Err(RequestError::TopicTooLong {
                len: topic.len(),
                max: MAX_SEGMENT_NAME,
            });
        }
        let transport = self.transport(peer)?;
        let (tx, rx) = sync_channel(1);
        transport.notify(topic, payload, Box::new(move |c| drop(tx.send(c))));
        match rx.recv() {
            Ok(c) => c.map(drop),
            Err(_) => Err(RequestError::PeerLost {
                peer: transport.label().to_string(),
                reason: "the transport dropped the notification".into(),
            }),
        }
    }

    /// Runs `requests` (writes, typically) and, only if every one succeeded,
    /// notifies `peer`: the receiver sees the message after the bytes are in
    /// its memory. Returns the completions, or the notification's failure.
    pub fn transfer_then_notify(
        &self,
        requests: Vec<TransferRequest>,
        peer: PeerId,
        topic: &str,
        payload: Bytes,
    ) -> Result<Vec<Completion>, RequestError> {
        let completions = self.transfer(requests);
        if let Some(Err(e)) = completions.iter().find(|c| c.is_err()) {
            return Err(e.clone());
        }
        self.send_notification(peer, topic, payload)?;
        Ok(completions)
    }

    /// Receives notifications sent to this node under `topic`.
    pub fn subscribe(&self, topic: &str) -> Receiver<Notification> {
        self.node.hub.subscribe(topic)
    }
}
