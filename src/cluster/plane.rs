//! The payload plane of a multi-process cluster: the embedded backends'
//! boards (weights, gradients, KV) and payload store (prompts, TITO
//! records, micro-step rows) as segments of each process's transfer engine,
//! moved between processes by one-sided reads over gyre-rdma's TCP backend.
//!
//! Whoever writes keeps the bytes: a put registers a frozen segment in the
//! writer's own engine, and a reader in another process opens it and READs
//! it. So the core's published weights live on the core's node and every
//! engine and satellite pulls them; a cell's drained gradients live on the
//! cell and the core reads each member's (a reduce to the core over the
//! transfer engine); an engine's pinned KV lives on the source engine and
//! the adopting engine reads it; a prompt lives on the head. A TITO record
//! is written on the engine's node and then *homed* at the head (the head
//! pulls it and answers with a handle of its own before the write
//! completes), so a node that dies takes no answered call's record with
//! it. Small notifications say what exists where
//! (a new weight version, an export's owner) and ask an owner to free what
//! its reader consumed. Every call runs inside an I/O job, never a handler,
//! so blocking on the network is allowed here.
//!
//! Handles encode their owner: a [`BlobId`] carries its node in its top
//! bits; weights are named by version, gradients by (step, cell), KV by
//! execution, each found on the node the [`Directory`] names.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use gyre_actors::sched::ids::{ExecId, Step, Version};
use gyre_gpu::model::{ModelConfig, ParamLayout};
use gyre_gpu::trainer::GradBuffer;
use gyre_rdma::{
    ClusterSecret, Notification, PeerId, RequestError, TcpOptions, TcpServer, TransferEngine,
    TransferError, TransferRequest,
};
use gyre_runtime::{BlobId, BlobStore, NodeId};
use serde::{Deserialize, Serialize};

use super::prefix::{Collectives, PrefixGrads, PrefixWeights};
use crate::embedded::shared::{GradStore, KvStore, Shared, WeightStore, at_least_now, lock};

/// Where each process's transfer engine listens, and which process holds
/// what: sent by the head to every node before anything moves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Directory {
    /// Every process (the head first) and its transfer-engine address.
    pub endpoints: Vec<(NodeId, SocketAddr)>,
    /// The process hosting cell 0, whose trainer is the core.
    pub core: NodeId,
    /// The process hosting each cell, in cell order.
    pub cells: Vec<NodeId>,
}

/// Bytes this process read from other processes, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BytesMoved {
    pub weights: u64,
    pub kv: u64,
    pub gradients: u64,
    /// Token payloads: prompts, TITO records and packed micro-step rows.
    pub rows: u64,
}

impl std::ops::AddAssign for BytesMoved {
    fn add_assign(&mut self, o: Self) {
        self.weights += o.weights;
        self.kv += o.kv;
        self.gradients += o.gradients;
        self.rows += o.rows;
    }
}

#[derive(Debug, Default)]
struct Counters {
    weights: AtomicU64,
    kv: AtomicU64,
    gradients: AtomicU64,
    rows: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    #[error("transfer engine: {0}")]
    Transfer(#[from] TransferError),
    #[error("node {0} is not in the directory")]
    NoPeer(NodeId),
    #[error("connecting the plane: {0}")]
    Join(String),
}

const TOPIC_BLOB_RELEASE: &str = "gyre.blob.release";
/// To the home: pull my segment `h{ticket}` (ticket, then my node id).
const TOPIC_BLOB_HOME: &str = "gyre.blob.home";
/// From the home: the ticket, then the blob id it registered (0: failed).
const TOPIC_BLOB_HOMED: &str = "gyre.blob.homed";
/// How long a node agent's put waits for its home before keeping the
/// bytes itself.
pub const HOME_WAIT: Duration = Duration::from_secs(10);
const TOPIC_KV_AT: &str = "gyre.kv.at";
const TOPIC_KV_RELEASE: &str = "gyre.kv.release";
const TOPIC_WEIGHTS: &str = "gyre.weights.published";
/// The ninth byte of a weights notification that voids the versions
/// after the one it names (a new core restored a checkpoint).
const ROLLED_BACK: u8 = 1;
/// How long a load waits for weights its owner does not hold yet.
const WEIGHTS_WAIT: Duration = Duration::from_secs(30);
/// Weight versions the core keeps registered.
const KEEP_WEIGHTS: usize = 4;
/// Bits of a blob id below its owner's node id.
const BLOB_OWNER_SHIFT: u32 = 40;

/// The links to each peer: two connections.
fn link_options() -> TcpOptions {
    TcpOptions {
        connections: 2,
        ..TcpOptions::default()
    }
}

/// One process's side of the plane.
pub struct Plane {
    me: NodeId,
    engine: TransferEngine,
    server: Mutex<Option<TcpServer>>,
    secret: ClusterSecret,
    peers: RwLock<BTreeMap<NodeId, PeerId>>,
    directory: RwLock<Option<Directory>>,
    moved: Counters,
    next_blob: AtomicU64,
    /// Sizes of the blobs this process holds.
    blobs: Mutex<BTreeMap<u64, u64>>,
    /// Which process holds each execution's KV export, as announced.
    kv_at: Mutex<(Receiver<Notification>, BTreeMap<ExecId, NodeId>)>,
    kv_local: Mutex<BTreeSet<ExecId>>,
    /// Weight versions announced by the core.
    versions: Mutex<(Receiver<Notification>, BTreeSet<Version>)>,
    /// The last weights read from the core, so engines of one process that
    /// load the same version read it once.
    weight_cache: Mutex<Option<(Version, Arc<[u8]>)>>,
    grads_local: Mutex<BTreeSet<(Step, u32)>>,
    /// The newest weights published here (the core's), for a broadcast.
    published: Mutex<Option<(Version, Bytes)>>,
    /// Where this process's payload writes are homed (the head), if not
    /// here.
    home: RwLock<Option<(NodeId, Duration)>>,
    /// Puts waiting for their home's answer, by ticket.
    homing: Mutex<BTreeMap<u64, std::sync::mpsc::Sender<u64>>>,
    next_ticket: AtomicU64,
    /// The prefix collectives over this plane, told when a peer restarts.
    collectives: Mutex<Vec<std::sync::Weak<Collectives>>>,
}

impl std::fmt::Debug for Plane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plane")
            .field("me", &self.me)
            .field("moved", &self.moved())
            .finish_non_exhaustive()
    }
}

fn blob_name(id: u64) -> String {
    format!("b{id}")
}

fn weights_name(v: Version) -> String {
    format!("w{v}")
}

fn grads_name(step: Step, cell: u32) -> String {
    format!("g{step}.{cell}")
}

fn ticket_name(ticket: u64) -> String {
    format!("h{ticket}")
}

fn kv_name(exec: ExecId) -> String {
    format!("kv{}", exec.0)
}

pub(super) fn u64_of(p: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(p.get(..8)?.try_into().ok()?))
}

impl Plane {
    /// Starts this process's transfer engine and its TCP server on `listen`
    /// (peers must prove `secret`).
    pub fn start(
        me: NodeId,
        listen: SocketAddr,
        secret: ClusterSecret,
    ) -> Result<Arc<Plane>, PlaneError> {
        let engine = TransferEngine::new(&format!("node-{}", me.0));
        let server = engine.listen_tcp(listen, &secret)?;
        let kv_rx = engine.subscribe(TOPIC_KV_AT);
        let v_rx = engine.subscribe(TOPIC_WEIGHTS);
        let plane = Arc::new(Plane {
            me,
            engine,
            server: Mutex::new(Some(server)),
            secret,
            peers: RwLock::default(),
            directory: RwLock::default(),
            moved: Counters::default(),
            next_blob: AtomicU64::new(1),
            blobs: Mutex::default(),
            kv_at: Mutex::new((kv_rx, BTreeMap::new())),
            kv_local: Mutex::default(),
            versions: Mutex::new((v_rx, BTreeSet::from([0]))),
            weight_cache: Mutex::default(),
            grads_local: Mutex::default(),
            published: Mutex::default(),
            home: RwLock::default(),
            homing: Mutex::default(),
            next_ticket: AtomicU64::new(1),
            collectives: Mutex::default(),
        });
        plane.serve_releases();
        Ok(plane)
    }

    /// Where peers reach this process's segments.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        lock(&self.server).as_ref().map(TcpServer::local_addr)
    }

    /// Opens authenticated connections to every other process in `dir`.
    pub fn connect(&self, dir: &Directory) -> Result<(), PlaneError> {
        let mut peers = BTreeMap::new();
        for &(node, addr) in &dir.endpoints {
            if node != self.me {
                peers.insert(
                    node,
                    self.engine
                        .connect_tcp(addr, &self.secret, link_options())?,
                );
            }
        }
        *self.peers.write().unwrap_or_else(|p| p.into_inner()) = peers;
        *self.directory.write().unwrap_or_else(|p| p.into_inner()) = Some(dir.clone());
        Ok(())
    }

    /// `node`'s process was restarted and listens at `addr` now: connect to
    /// it, name it in the directory, and have the prefix collectives drop
    /// every ring it was a rank of (their inboxes are withdrawn at once, so
    /// no member rebuilding later opens a stale one). The old connection's
    /// reads fail already; what the lost process held is gone.
    pub fn reconnect(&self, node: NodeId, addr: SocketAddr) -> Result<(), PlaneError> {
        if node == self.me {
            return Ok(());
        }
        let peer = self
            .engine
            .connect_tcp(addr, &self.secret, link_options())?;
        self.peers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node, peer);
        if let Some(dir) = self
            .directory
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            match dir.endpoints.iter_mut().find(|(n, _)| *n == node) {
                Some(e) => e.1 = addr,
                None => dir.endpoints.push((node, addr)),
            }
        }
        lock(&self.collectives).retain(|c| match c.upgrade() {
            Some(c) => {
                c.forget_rings_with(node);
                true
            }
            None => false,
        });
        tracing::info!(%node, %addr, "plane reconnected to a restarted process");
        Ok(())
    }

    /// What this process read from the others so far.
    pub fn moved(&self) -> BytesMoved {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BytesMoved {
            weights: g(&self.moved.weights),
            kv: g(&self.moved.kv),
            gradients: g(&self.moved.gradients),
            rows: g(&self.moved.rows),
        }
    }

    fn peer(&self, node: NodeId) -> Result<PeerId, PlaneError> {
        self.peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)
            .copied()
            .ok_or(PlaneError::NoPeer(node))
    }

    fn dir<T>(&self, f: impl FnOnce(&Directory) -> T) -> Option<T> {
        self.directory
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(f)
    }

    /// Reads all of segment `name` from `owner` (its own memory when that is
    /// this process), counting the bytes under `counter` when they crossed.
    fn read(&self, owner: NodeId, name: &str, counter: &AtomicU64) -> Result<Bytes, String> {
        if owner == self.me {
            return self
                .engine
                .local_segment(name)
                .map(|s| s.to_bytes())
                .map_err(|e| e.to_string());
        }
        let peer = self.peer(owner).map_err(|e| e.to_string())?;
        let seg = self
            .engine
            .open_segment(peer, name)
            .map_err(|e| e.to_string())?;
        let done = self
            .engine
            .transfer(vec![TransferRequest::read(&seg, 0, seg.len)]);
        match done.into_iter().next() {
            Some(Ok(t)) => {
                counter.fetch_add(t.bytes, Ordering::Relaxed);
                Ok(t.data.unwrap_or_default())
            }
            Some(Err(e)) => Err(e.to_string()),
            None => Err(format!("no completion for reading {name} from {owner}")),
        }
    }

    fn register(&self, name: &str, bytes: Bytes) -> bool {
        match self.engine.register_frozen(name, bytes) {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(segment = name, error = %e, "registering a payload failed");
                false
            }
        }
    }

    fn notify(&self, node: NodeId, topic: &str, payload: Vec<u8>) -> Result<(), String> {
        let peer = self.peer(node).map_err(|e| e.to_string())?;
        self.engine
            .send_notification(peer, topic, payload.into())
            .map_err(|e: RequestError| {
                if matches!(e, RequestError::PeerLost { .. }) {
                    // A lost process hears nothing more; reads of what it
                    // held fail as `NoPeer`.
                    let known = self
                        .peers
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&node)
                        .is_some();
                    if known {
                        tracing::warn!(%node, error = %e, "peer lost; the plane forgets it");
                    }
                }
                e.to_string()
            })
    }

    fn notify_all(&self, topic: &str, payload: &[u8]) {
        let peers: Vec<NodeId> = self
            .peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        for node in peers {
            if let Err(e) = self.notify(node, topic, payload.to_vec()) {
                tracing::debug!(%node, topic, error = %e, "notification not delivered");
            }
        }
    }

    /// Frees, on request of their readers, the blobs and KV exports this
    /// process owns (one thread per topic, for the process's lifetime).
    fn serve_releases(self: &Arc<Self>) {
        for topic in [TOPIC_BLOB_RELEASE, TOPIC_KV_RELEASE] {
            let rx = self.engine.subscribe(topic);
            let plane = Arc::downgrade(self);
            std::thread::Builder::new()
                .name(format!("plane-{topic}"))
                .spawn(move || {
                    while let Ok(note) = rx.recv() {
                        let (Some(plane), Some(id)) = (plane.upgrade(), u64_of(&note.payload))
                        else {
                            break;
                        };
                        if topic == TOPIC_BLOB_RELEASE {
                            plane.release_local_blob(id);
                        } else {
                            plane.release_local_kv(ExecId(id));
                        }
                    }
                })
                .map_err(|e| tracing::error!(error = %e, "release thread did not start"))
                .ok();
        }
    }

    /// Homes this process's payload writes at `home` (a node agent's at
    /// the head): a put completes once `home` holds the bytes.
    /// The home has `wait` to answer each put.
    pub fn home_blobs_at(self: &Arc<Self>, home: NodeId, wait: Duration) {
        if home == self.me {
            return;
        }
        *self.home.write().unwrap_or_else(|p| p.into_inner()) = Some((home, wait));
        let rx = self.engine.subscribe(TOPIC_BLOB_HOMED);
        let plane = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("plane-homed".into())
            .spawn(move || {
                while let Ok(note) = rx.recv() {
                    let Some(plane) = plane.upgrade() else { break };
                    let (Some(ticket), Some(id)) = (
                        u64_of(&note.payload),
                        note.payload.get(8..).and_then(u64_of),
                    ) else {
                        continue;
                    };
                    if let Some(tx) = lock(&plane.homing).remove(&ticket) {
                        let _ = tx.send(id);
                    }
                }
            })
            .map_err(|e| tracing::error!(error = %e, "homing thread did not start"))
            .ok();
    }

    /// Takes in the payload writes other processes home here: pulls each,
    /// registers it as a blob of this process and answers its handle.
    pub fn serve_homing(self: &Arc<Self>) {
        let rx = self.engine.subscribe(TOPIC_BLOB_HOME);
        let plane = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("plane-home".into())
            .spawn(move || {
                while let Ok(note) = rx.recv() {
                    let Some(plane) = plane.upgrade() else { break };
                    let (Some(ticket), Some(node)) = (
                        u64_of(&note.payload),
                        note.payload
                            .get(8..12)
                            .and_then(|b| <[u8; 4]>::try_from(b).ok())
                            .map(|b| NodeId(u32::from_le_bytes(b))),
                    ) else {
                        tracing::warn!(from = %note.from, "malformed homing request ignored");
                        continue;
                    };
                    let id = match plane.read(node, &ticket_name(ticket), &plane.moved.rows) {
                        Ok(bytes) => plane.put_local(bytes),
                        Err(e) => {
                            tracing::warn!(%node, ticket, error = %e, "a homed payload could not be read");
                            0
                        }
                    };
                    let mut answer = ticket.to_le_bytes().to_vec();
                    answer.extend_from_slice(&id.to_le_bytes());
                    if let Err(e) = plane.notify(node, TOPIC_BLOB_HOMED, answer) {
                        tracing::warn!(%node, ticket, error = %e, "homing answer not delivered");
                    }
                }
            })
            .map_err(|e| tracing::error!(error = %e, "home thread did not start"))
            .ok();
    }

    /// Registers `bytes` as a blob of this process.
    fn put_local(&self, bytes: Bytes) -> u64 {
        let id = (u64::from(self.me.0) << BLOB_OWNER_SHIFT)
            | self.next_blob.fetch_add(1, Ordering::Relaxed);
        let len = bytes.len() as u64;
        if self.register(&blob_name(id), bytes) {
            lock(&self.blobs).insert(id, len);
        }
        id
    }

    /// Puts `bytes` at `home`: registers them under a ticket, asks the home
    /// to pull them, and waits for its handle. `None` when the home did
    /// not answer in time (the caller keeps the bytes itself).
    fn put_home(&self, (home, wait): (NodeId, Duration), bytes: &Bytes) -> Option<u64> {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let name = ticket_name(ticket);
        if !self.register(&name, bytes.clone()) {
            return None;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        lock(&self.homing).insert(ticket, tx);
        let mut ask = ticket.to_le_bytes().to_vec();
        ask.extend_from_slice(&self.me.0.to_le_bytes());
        let id = match self.notify(home, TOPIC_BLOB_HOME, ask) {
            Ok(()) => rx.recv_timeout(wait).ok().filter(|id| *id != 0),
            Err(e) => {
                tracing::warn!(%home, error = %e, "payload not homed");
                None
            }
        };
        lock(&self.homing).remove(&ticket);
        self.engine.unregister(&name);
        id
    }

    fn release_local_blob(&self, id: u64) -> bool {
        let known = lock(&self.blobs).remove(&id).is_some();
        self.engine.unregister(&blob_name(id)) && known
    }

    fn release_local_kv(&self, exec: ExecId) {
        lock(&self.kv_local).remove(&exec);
        self.engine.unregister(&kv_name(exec));
    }

    pub(super) fn me(&self) -> NodeId {
        self.me
    }

    pub(super) fn engine(&self) -> &TransferEngine {
        &self.engine
    }

    pub(super) fn peer_of(&self, node: NodeId) -> Result<PeerId, PlaneError> {
        self.peer(node)
    }

    /// The process hosting each cell, in cell order (empty before the
    /// directory arrived).
    pub(super) fn directory_cells(&self) -> Vec<NodeId> {
        self.dir(|d| d.cells.clone()).unwrap_or_default()
    }

    pub(super) fn notify_node(
        &self,
        node: NodeId,
        topic: &str,
        payload: Vec<u8>,
    ) -> Result<(), String> {
        self.notify(node, topic, payload)
    }

    /// Gradient bytes this process sent to another (a collective's writes).
    pub(super) fn count_gradients(&self, bytes: u64) {
        self.moved.gradients.fetch_add(bytes, Ordering::Relaxed);
    }

    /// What cell `cell` of this process drained for `step`, if it did.
    pub(super) fn local_grads(&self, step: Step, cell: u32) -> Option<GradBuffer> {
        let seg = self.engine.local_segment(&grads_name(step, cell)).ok()?;
        GradBuffer::decode(&seg.to_bytes())
            .map_err(|e| tracing::warn!(step, cell, error = %e, "drained gradients unreadable"))
            .ok()
    }

    /// Parameters a broadcast delivered: counted, and kept where the next
    /// load of that version finds them without reading again.
    pub(super) fn received_weights(&self, version: Version, bytes: &Bytes) {
        self.moved
            .weights
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        lock(&self.versions).1.insert(version);
        *lock(&self.weight_cache) = Some((version, Arc::from(&bytes[..])));
    }

    /// Stops serving segments (peers' reads fail from now on).
    pub fn stop(&self) {
        lock(&self.server).take();
    }
}

/// What the embedded backends of one process share, when that process is
/// one of a cluster's: every board and the payload store over `plane`.
pub fn shared_over(plane: &Arc<Plane>, model: ModelConfig) -> Shared {
    let len = ParamLayout::new(&model)
        .map(|l| l.total)
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "no parameter layout: collectives carry nothing");
            0
        });
    let prefix = Collectives::start(plane.clone(), len);
    lock(&plane.collectives).push(Arc::downgrade(&prefix));
    Shared {
        model,
        blobs: Arc::new(PlaneBlobs(plane.clone())),
        weights: Arc::new(PrefixWeights {
            store: PlaneWeights(plane.clone()),
            prefix: prefix.clone(),
        }),
        grads: Arc::new(PrefixGrads {
            store: PlaneGrads(plane.clone()),
            prefix,
        }),
        kv: Arc::new(PlaneKv(plane.clone())),
        updates: Arc::default(),
        unloads: Arc::default(),
    }
}

/// The payload store over the plane.
#[derive(Debug, Clone)]
pub struct PlaneBlobs(pub Arc<Plane>);

impl BlobStore for PlaneBlobs {
    fn put(&self, bytes: Vec<u8>) -> BlobId {
        let p = &self.0;
        let bytes = Bytes::from(bytes);
        let home = *p.home.read().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = home.and_then(|h| p.put_home(h, &bytes)) {
            return BlobId(id);
        }
        BlobId(p.put_local(bytes))
    }

    fn get(&self, id: BlobId) -> Option<Arc<[u8]>> {
        let owner = NodeId((id.0 >> BLOB_OWNER_SHIFT) as u32);
        match self.0.read(owner, &blob_name(id.0), &self.0.moved.rows) {
            Ok(b) => Some(Arc::from(&b[..])),
            Err(e) => {
                tracing::debug!(%id, error = %e, "payload not readable");
                None
            }
        }
    }

    fn release(&self, id: BlobId) -> bool {
        let owner = NodeId((id.0 >> BLOB_OWNER_SHIFT) as u32);
        if owner == self.0.me {
            return self.0.release_local_blob(id.0);
        }
        self.0
            .notify(owner, TOPIC_BLOB_RELEASE, id.0.to_le_bytes().to_vec())
            .is_ok()
    }

    fn live(&self) -> usize {
        lock(&self.0.blobs).len()
    }

    fn bytes(&self) -> u64 {
        lock(&self.0.blobs).values().sum()
    }
}

/// Published weights: registered on the core's process, read by the others.
#[derive(Debug, Clone)]
pub struct PlaneWeights(pub Arc<Plane>);

impl PlaneWeights {
    /// The newest weights published on this process (the core's).
    pub(super) fn published(&self) -> Option<(Version, Bytes)> {
        lock(&self.0.published).clone()
    }

    fn core(&self) -> Option<NodeId> {
        self.0.dir(|d| d.core)
    }

    /// The newest version announced (or published here).
    pub fn newest(&self) -> Version {
        let mut g = lock(&self.0.versions);
        let (rx, known) = &mut *g;
        for note in rx.try_iter() {
            match (u64_of(&note.payload), note.payload.get(8)) {
                (Some(v), None) => {
                    known.insert(v);
                }
                (Some(to), Some(&ROLLED_BACK)) => {
                    known.retain(|v| *v <= to);
                    let mut cache = lock(&self.0.weight_cache);
                    if cache.as_ref().is_some_and(|(v, _)| *v > to) {
                        *cache = None;
                    }
                }
                _ => tracing::warn!(len = note.payload.len(), "malformed weights notification"),
            }
        }
        known.last().copied().unwrap_or(0)
    }
}

impl WeightStore for PlaneWeights {
    fn publish(&self, version: Version, bytes: Arc<[u8]>) {
        let p = &self.0;
        let bytes = Bytes::from(bytes.to_vec());
        if !p.register(&weights_name(version), bytes.clone()) {
            return;
        }
        *lock(&p.published) = Some((version, bytes));
        let stale: Vec<Version> = {
            let mut g = lock(&p.versions);
            g.1.insert(version);
            let over = g.1.len().saturating_sub(KEEP_WEIGHTS);
            let stale: Vec<Version> = g.1.iter().take(over).copied().collect();
            for v in &stale {
                g.1.remove(v);
            }
            stale
        };
        for v in stale {
            p.engine.unregister(&weights_name(v));
        }
        p.notify_all(TOPIC_WEIGHTS, &version.to_le_bytes());
    }

    fn get(&self, version: Version) -> Option<Arc<[u8]>> {
        let p = &self.0;
        // A rollback announced drops cached versions it voids.
        self.newest();
        if let Some((v, b)) = lock(&p.weight_cache).as_ref()
            && *v == version
        {
            return Some(b.clone());
        }
        let core = self.core()?;
        match p.read(core, &weights_name(version), &p.moved.weights) {
            Ok(b) => {
                let b: Arc<[u8]> = Arc::from(&b[..]);
                if core != p.me {
                    *lock(&p.weight_cache) = Some((version, b.clone()));
                }
                Some(b)
            }
            Err(e) => {
                tracing::debug!(version, error = %e, "weights not readable");
                None
            }
        }
    }

    fn latest(&self) -> Option<(Version, Arc<[u8]>)> {
        let v = self.newest();
        self.get(v).map(|b| (v, b))
    }

    /// Waits up to [`WEIGHTS_WAIT`] for the version: across processes it can
    /// be asked for before its owner holds it again (a restarted core
    /// publishes its checkpoint's weights only once it has loaded them,
    /// while the engines of its node are already told to load).
    fn at_least(&self, version: Version) -> Option<Arc<[u8]>> {
        let started = std::time::Instant::now();
        loop {
            if let Some(b) = at_least_now(self, version) {
                return Some(b);
            }
            if started.elapsed() >= WEIGHTS_WAIT {
                tracing::warn!(
                    version,
                    secs = WEIGHTS_WAIT.as_secs(),
                    "weights never appeared"
                );
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn roll_back(&self, to: Version) {
        let p = &self.0;
        let voided: Vec<Version> = {
            let mut g = lock(&p.versions);
            let voided = g.1.iter().copied().filter(|v| *v > to).collect();
            g.1.retain(|v| *v <= to);
            voided
        };
        for v in voided {
            p.engine.unregister(&weights_name(v));
        }
        *lock(&p.weight_cache) = None;
        let mut note = to.to_le_bytes().to_vec();
        note.push(ROLLED_BACK);
        p.notify_all(TOPIC_WEIGHTS, &note);
        tracing::info!(to, "weights after this version voided on every process");
    }
}

/// Drained gradients: registered on the cell that drained them, read by
/// the core's reduce.
#[derive(Debug, Clone)]
pub struct PlaneGrads(pub Arc<Plane>);

impl GradStore for PlaneGrads {
    fn deposit(&self, step: Step, cell: u32, grads: GradBuffer) {
        let p = &self.0;
        let grads = crate::embedded::shared::merge(p.local_grads(step, cell), grads);
        if p.register(&grads_name(step, cell), Bytes::from(grads.encode())) {
            let mut local = lock(&p.grads_local);
            local.insert((step, cell));
            // A step's gradients are read once, before the next step drains;
            // one step of slack covers a satellite that drains early.
            let old: Vec<_> = local
                .iter()
                .filter(|(s, _)| s + 1 < step)
                .copied()
                .collect();
            for (s, c) in old {
                local.remove(&(s, c));
                p.engine.unregister(&grads_name(s, c));
            }
        }
    }

    fn take(&self, step: Step, members: u32) -> (Vec<GradBuffer>, Vec<u32>) {
        let p = &self.0;
        let cells = p.dir(|d| d.cells.clone()).unwrap_or_default();
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for cell in 0..members {
            let got = cells
                .get(cell as usize)
                .ok_or_else(|| format!("cell {cell} is not in the directory"))
                .and_then(|&owner| p.read(owner, &grads_name(step, cell), &p.moved.gradients))
                .and_then(|b| GradBuffer::decode(&b).map_err(|e| e.to_string()));
            match got {
                Ok(g) => found.push(g),
                Err(e) => {
                    tracing::debug!(step, cell, error = %e, "no gradients");
                    missing.push(cell);
                }
            }
        }
        (found, missing)
    }
}

/// Pinned KV exports: registered on the source engine's process and
/// announced to all; read by whoever adopts or moves them.
#[derive(Debug, Clone)]
pub struct PlaneKv(pub Arc<Plane>);

impl PlaneKv {
    fn owner(&self, exec: ExecId) -> Option<NodeId> {
        let p = &self.0;
        if lock(&p.kv_local).contains(&exec) {
            return Some(p.me);
        }
        let mut g = lock(&p.kv_at);
        let (rx, at) = &mut *g;
        for note in rx.try_iter() {
            let b = &note.payload;
            if let (Some(e), Some(n)) = (u64_of(b), b.get(8..12)) {
                let node = u32::from_le_bytes(n.try_into().unwrap_or_default());
                at.insert(ExecId(e), NodeId(node));
            }
        }
        at.get(&exec).copied()
    }
}

impl KvStore for PlaneKv {
    fn put(&self, exec: ExecId, bytes: Arc<[u8]>) {
        let p = &self.0;
        if p.register(&kv_name(exec), Bytes::from(bytes.to_vec())) {
            lock(&p.kv_local).insert(exec);
            let mut note = exec.0.to_le_bytes().to_vec();
            note.extend_from_slice(&p.me.0.to_le_bytes());
            p.notify_all(TOPIC_KV_AT, &note);
        }
    }

    fn get(&self, exec: ExecId) -> Option<Arc<[u8]>> {
        let owner = self.owner(exec)?;
        match self.0.read(owner, &kv_name(exec), &self.0.moved.kv) {
            Ok(b) => Some(Arc::from(&b[..])),
            Err(e) => {
                tracing::debug!(?exec, error = %e, "KV export not readable");
                None
            }
        }
    }

    fn remove(&self, exec: ExecId) -> Option<Arc<[u8]>> {
        let owner = self.owner(exec)?;
        let bytes = self.get(exec);
        let p = &self.0;
        lock(&p.kv_at).1.remove(&exec);
        if owner == p.me {
            p.release_local_kv(exec);
        } else if let Err(e) = p.notify(owner, TOPIC_KV_RELEASE, exec.0.to_le_bytes().to_vec()) {
            tracing::warn!(?exec, %owner, error = %e, "KV release not delivered");
        }
        bytes
    }

    fn len(&self) -> usize {
        lock(&self.0.kv_local).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> ClusterSecret {
        ClusterSecret::new([3u8; 32]).unwrap()
    }

    /// Three planes on loopback (as three processes would be), connected
    /// by one directory: node 0 the head, 10 the core's cell, 11 a cell.
    fn three() -> Vec<Arc<Plane>> {
        let nodes = [NodeId(0), NodeId(10), NodeId(11)];
        let planes: Vec<_> = nodes
            .iter()
            .map(|&n| Plane::start(n, "127.0.0.1:0".parse().unwrap(), secret()).unwrap())
            .collect();
        let dir = Directory {
            endpoints: planes
                .iter()
                .map(|p| (p.me, p.local_addr().unwrap()))
                .collect(),
            core: NodeId(10),
            cells: vec![NodeId(10), NodeId(11)],
        };
        for p in &planes {
            p.connect(&dir).unwrap();
        }
        planes
    }

    #[test]
    fn blobs_are_read_across_planes_counted_and_released_at_their_owner() {
        let p = three();
        let (head, cell) = (PlaneBlobs(p[0].clone()), PlaneBlobs(p[2].clone()));
        let id = head.put(vec![5u8; 1000]);
        assert_eq!(id.0 >> BLOB_OWNER_SHIFT, 0);
        assert_eq!(cell.get(id).as_deref(), Some(&[5u8; 1000][..]));
        assert_eq!(p[2].moved().rows, 1000);
        assert_eq!(head.live(), 1);
        let rec = cell.put(vec![9u8; 10]);
        assert_eq!(head.get(rec).as_deref(), Some(&[9u8; 10][..]));
        assert!(cell.release(id), "release is asked of the owner");
        for _ in 0..200 {
            if head.live() == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(head.live(), 0);
        assert_eq!(cell.get(id), None, "a released blob is gone");
    }

    #[test]
    fn a_homed_record_outlives_the_process_that_wrote_it() {
        let p = three();
        p[0].serve_homing();
        p[2].home_blobs_at(NodeId(0), HOME_WAIT);
        let (head, cell) = (PlaneBlobs(p[0].clone()), PlaneBlobs(p[2].clone()));
        // Larger than one notification: the head pulls it.
        let rec = cell.put(vec![7u8; 200_000]);
        assert_eq!(rec.0 >> BLOB_OWNER_SHIFT, 0, "the head owns a homed record");
        assert_eq!(head.live(), 1);
        assert_eq!(cell.live(), 0, "the writer keeps nothing");
        assert_eq!(p[0].moved().rows, 200_000, "the head pulled the bytes");
        p[2].stop();
        drop(cell);
        assert_eq!(head.get(rec).as_deref().map(<[u8]>::len), Some(200_000));
        assert!(head.release(rec));
        assert_eq!(head.live(), 0);
    }

    #[test]
    fn a_put_whose_home_never_answers_stays_with_its_writer() {
        let p = three();
        // Node 11 homes at the head, which does not serve homing.
        let wait = Duration::from_millis(200);
        p[2].home_blobs_at(NodeId(0), wait);
        let cell = PlaneBlobs(p[2].clone());
        let started = std::time::Instant::now();
        let rec = cell.put(vec![1u8; 10]);
        assert!(started.elapsed() >= wait);
        assert_eq!(rec.0 >> BLOB_OWNER_SHIFT, 11, "kept by its writer");
        assert_eq!(
            PlaneBlobs(p[0].clone()).get(rec).as_deref(),
            Some(&[1u8; 10][..])
        );
    }

    #[test]
    fn a_load_waits_for_weights_their_owner_publishes_later() {
        let p = three();
        let core = PlaneWeights(p[1].clone());
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            core.publish(5, Arc::from(vec![5u8; 64]));
        });
        let got = PlaneWeights(p[2].clone()).at_least(5);
        late.join().unwrap();
        assert_eq!(got.as_deref(), Some(&[5u8; 64][..]));
    }

    #[test]
    fn a_rollback_voids_the_later_versions_on_every_process() {
        let p = three();
        let (core, cell) = (PlaneWeights(p[1].clone()), PlaneWeights(p[2].clone()));
        for v in 1..=3u8 {
            core.publish(u64::from(v), Arc::from(vec![v; 8]));
        }
        assert_eq!(
            cell.get(3).as_deref(),
            Some(&[3u8; 8][..]),
            "read and cached"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while cell.newest() < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        core.roll_back(2);
        while cell.newest() > 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(cell.newest(), 2, "the rollback was announced");
        assert_eq!(
            cell.get(3),
            None,
            "neither cached nor registered at the core"
        );
        assert_eq!(cell.get(2).as_deref(), Some(&[2u8; 8][..]));
    }

    #[test]
    fn a_restarted_process_is_reached_at_its_new_address() {
        let p = three();
        p[2].stop();
        let again = Plane::start(NodeId(11), "127.0.0.1:0".parse().unwrap(), secret()).unwrap();
        let addr = again.local_addr().unwrap();
        let mut dir = p[0].dir(Clone::clone).unwrap();
        dir.endpoints.retain(|(n, _)| *n != NodeId(11));
        dir.endpoints.push((NodeId(11), addr));
        again.connect(&dir).unwrap();
        let rec = PlaneBlobs(again.clone()).put(vec![4u8; 100]);
        assert_eq!(
            PlaneBlobs(p[0].clone()).get(rec),
            None,
            "the old link is dead"
        );
        p[0].reconnect(NodeId(11), addr).unwrap();
        assert_eq!(
            PlaneBlobs(p[0].clone()).get(rec).as_deref(),
            Some(&[4u8; 100][..])
        );
        assert!(
            p[0].dir(|d| d.endpoints.contains(&(NodeId(11), addr)))
                .unwrap()
        );
    }

    #[test]
    fn a_second_deposit_of_a_step_adds_to_the_first() {
        let p = three();
        let g = |x: f32| GradBuffer {
            version: 2,
            fingerprint: 1,
            cells: 1,
            micro_steps: 1,
            targets: 3,
            loss: 0.5,
            data: vec![x; 4],
        };
        let grads = PlaneGrads(p[2].clone());
        grads.deposit(4, 1, g(1.0));
        grads.deposit(4, 1, g(2.0));
        let (found, missing) = PlaneGrads(p[1].clone()).take(4, 2);
        assert_eq!(missing, [0]);
        assert_eq!(found[0].data, [3.0; 4]);
        assert_eq!(
            (found[0].cells, found[0].micro_steps, found[0].targets),
            (1, 2, 6)
        );
    }

    #[test]
    fn weights_grads_and_kv_move_between_planes() {
        let p = three();
        let core = PlaneWeights(p[1].clone());
        core.publish(3, vec![1u8; 64].into());
        let reader = PlaneWeights(p[2].clone());
        let (v, b) = reader.latest().unwrap();
        assert_eq!((v, b.len()), (3, 64));
        assert_eq!(p[2].moved().weights, 64);
        for v in 4..10 {
            core.publish(v, vec![v as u8; 8].into());
        }
        assert_eq!(reader.get(4), None, "old versions are withdrawn");
        assert_eq!(reader.latest().unwrap().1.as_ref(), &[9u8; 8]);

        let g = GradBuffer {
            version: 9,
            fingerprint: 1,
            cells: 1,
            micro_steps: 2,
            targets: 5,
            loss: 0.25,
            data: vec![0.5; 16],
        };
        PlaneGrads(p[2].clone()).deposit(7, 1, g.clone());
        PlaneGrads(p[1].clone()).deposit(7, 0, g.clone());
        let (found, missing) = PlaneGrads(p[1].clone()).take(7, 3);
        assert_eq!(found.len(), 2);
        assert_eq!(found[1].data, g.data);
        assert_eq!(missing, vec![2]);
        assert!(p[1].moved().gradients > 0);

        let src = PlaneKv(p[1].clone());
        src.put(ExecId(42), vec![7u8; 300].into());
        let dst = PlaneKv(p[2].clone());
        assert_eq!(dst.remove(ExecId(42)).map(|b| b.len()), Some(300));
        assert_eq!(p[2].moved().kv, 300);
        for _ in 0..200 {
            if src.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(src.is_empty(), "the source freed the adopted export");
    }
}
