//! What the embedded backends of one process share: the device state of
//! each cell and the in-process stand-ins for the transfer engine and the
//! collectives.
//!
//! Each board is a trait: across processes (`gyre train --cluster`) the
//! implementations are the transfer engine's registered segments
//! (`crate::cluster::plane`); in one process they are shared memory, reached only from I/O work (never from a
//! handler), so the actors stay the same state machines they are under the
//! simulator. Every board is keyed by something the protocols carry
//! (version, step and cell, execution), which is what keeps a run
//! deterministic when the simulator hosts it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gyre_actors::sched::ids::{ExecId, Step, Version};
use gyre_gpu::engine::Engine;
use gyre_gpu::model::ModelConfig;
use gyre_gpu::trainer::{GradBuffer, Trainer};
use gyre_runtime::BlobStore;

use super::trainer::UpdateSummary;

/// Locks ignoring poison: a panic in one job must not take every later job
/// of the run down with it; the job that panicked already reported failure.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A cell's inference engine, shared by its engine worker and its
/// device-memory manager.
pub type EngineHandle = Arc<Mutex<Engine>>;
/// A cell's trainer, shared by its trainer worker and its device-memory
/// manager.
pub type TrainerHandle = Arc<Mutex<Trainer>>;

/// Where published parameter buffers live: the core writes after each
/// update, joining satellites and rollout engines read. In one process a
/// [`WeightBoard`]; across processes the core's registered segments
/// (`crate::cluster::plane`).
pub trait WeightStore: Send + Sync + fmt::Debug {
    fn publish(&self, version: Version, bytes: Arc<[u8]>);
    fn get(&self, version: Version) -> Option<Arc<[u8]>>;
    /// The newest version published.
    fn latest(&self) -> Option<(Version, Arc<[u8]>)>;
    /// The weights of `version`, or the newest ones when it was already
    /// dropped from the board, for an engine told to serve it. Across
    /// processes this waits a while for the version to appear (see
    /// `PlaneWeights`).
    fn at_least(&self, version: Version) -> Option<Arc<[u8]>> {
        at_least_now(self, version)
    }
    /// Whether a broadcast to a prefix's satellites moves parameters
    /// (across processes). In one process satellites read the board at
    /// their next warm-up, so a broadcast has nothing to do.
    fn broadcasts(&self) -> bool {
        false
    }
    /// Sends the newest published parameters to the other members of the
    /// prefix of `members`; the version sent, if any.
    fn broadcast(&self, members: u32) -> Result<Option<Version>, String> {
        let _ = members;
        Ok(None)
    }
    /// A new core restored version `to` from its checkpoint: the versions
    /// after it were never published and will be made again with other
    /// parameters, so no process may keep or serve them under their
    /// numbers. (In one process the core never restarts: nothing to do.)
    fn roll_back(&self, to: Version) {
        let _ = to;
    }
}

/// [`WeightStore::at_least`] without waiting.
pub fn at_least_now<W: WeightStore + ?Sized>(board: &W, version: Version) -> Option<Arc<[u8]>> {
    board.get(version).or_else(|| {
        board
            .latest()
            .filter(|(v, _)| *v >= version)
            .map(|(_, b)| b)
    })
}

/// Where each training cell's drained gradients wait for the core's reduce.
pub trait GradStore: Send + Sync + fmt::Debug {
    fn deposit(&self, step: Step, cell: u32, grads: GradBuffer);
    /// Takes the gradients of `step` from cells `0..members`, in cell
    /// order, and forgets anything older. A member that deposited nothing
    /// is reported by index.
    fn take(&self, step: Step, members: u32) -> (Vec<GradBuffer>, Vec<u32>);
    /// The sum of the gradients of `step` over cells `0..members` (`None`
    /// when none drained any) and the members that drained nothing. Here
    /// the parts are added in cell order; across processes a ring
    /// all-reduce over the prefix does it (`crate::cluster::prefix`).
    fn reduce(&self, step: Step, members: u32) -> Result<(Option<GradBuffer>, Vec<u32>), String> {
        let (parts, missing) = self.take(step, members);
        if parts.is_empty() {
            return Ok((None, missing));
        }
        GradBuffer::sum(&parts)
            .map(|s| (Some(s), missing))
            .map_err(|e| e.to_string())
    }
    /// Steps reduced over more than one cell (a satellite joined), where
    /// the store counts them.
    fn shared_steps(&self) -> u64 {
        0
    }
}

/// Where an execution's exported KV blocks wait for the engine adopting it.
pub trait KvStore: Send + Sync + fmt::Debug {
    fn put(&self, exec: ExecId, bytes: Arc<[u8]>);
    fn get(&self, exec: ExecId) -> Option<Arc<[u8]>>;
    fn remove(&self, exec: ExecId) -> Option<Arc<[u8]>>;
    /// Exports held by this store's own memory.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Prefixes exported and taken by an adopting engine, where the store
    /// counts them (what a live run reports of KV migration).
    fn migrations(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// Published parameter buffers by version: the core writes after each
/// update, joining satellites and rollout engines read. A few recent
/// versions are kept so a reader that is one publication behind still
/// finds what it asked for.
#[derive(Default)]
pub struct WeightBoard {
    versions: Mutex<BTreeMap<Version, Arc<[u8]>>>,
}

impl fmt::Debug for WeightBoard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = lock(&self.versions);
        f.debug_struct("WeightBoard")
            .field("versions", &v.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl WeightBoard {
    const KEEP: usize = 4;
}

impl WeightStore for WeightBoard {
    fn publish(&self, version: Version, bytes: Arc<[u8]>) {
        let mut v = lock(&self.versions);
        v.insert(version, bytes);
        while v.len() > Self::KEEP {
            v.pop_first();
        }
    }

    fn get(&self, version: Version) -> Option<Arc<[u8]>> {
        lock(&self.versions).get(&version).cloned()
    }

    fn latest(&self) -> Option<(Version, Arc<[u8]>)> {
        lock(&self.versions)
            .last_key_value()
            .map(|(v, b)| (*v, b.clone()))
    }
}

/// Gradients each training cell drained, by step: the host stand-in for the
/// all-reduce over a training prefix.
#[derive(Debug, Default)]
pub struct GradBoard {
    deposits: Mutex<BTreeMap<(Step, u32), GradBuffer>>,
    /// Steps reduced over more than one cell (a satellite joined).
    pub shared_steps: AtomicU64,
}

/// A cell's second drain of one step (it claimed again the share of a
/// member lost mid-batch) adds to its first: a deposit holds everything the
/// cell computed for the step, and still counts as one cell.
pub fn merge(earlier: Option<GradBuffer>, grads: GradBuffer) -> GradBuffer {
    let Some(mut sum) = earlier else {
        return grads;
    };
    let cells = sum.cells.max(grads.cells);
    match sum.add(&grads) {
        Ok(()) => {
            sum.cells = cells;
            sum
        }
        Err(e) => {
            // Different weights: the earlier deposit belongs to another
            // history (a restore); the new one stands alone.
            tracing::warn!(error = %e, "an earlier deposit of the step was replaced");
            grads
        }
    }
}

impl GradStore for GradBoard {
    fn deposit(&self, step: Step, cell: u32, grads: GradBuffer) {
        let mut d = lock(&self.deposits);
        let earlier = d.remove(&(step, cell));
        d.insert((step, cell), merge(earlier, grads));
    }

    fn take(&self, step: Step, members: u32) -> (Vec<GradBuffer>, Vec<u32>) {
        let mut d = lock(&self.deposits);
        let mut found = Vec::new();
        let mut missing = Vec::new();
        for cell in 0..members {
            match d.remove(&(step, cell)) {
                Some(g) => found.push(g),
                None => missing.push(cell),
            }
        }
        d.retain(|(s, _), _| *s > step);
        if found.len() > 1 {
            self.shared_steps.fetch_add(1, Ordering::Relaxed);
        }
        (found, missing)
    }

    fn shared_steps(&self) -> u64 {
        self.shared_steps.load(Ordering::Relaxed)
    }
}

/// KV blocks in flight between engines during a role change: the source
/// writes an execution's pinned prefix, the destination takes it when it
/// adopts the execution.
#[derive(Debug, Default)]
pub struct KvBoard {
    blocks: Mutex<BTreeMap<ExecId, Arc<[u8]>>>,
    /// Prefixes exported, and taken by an adopting engine: what a live run
    /// reports of KV migration (its engines' counters are not visible).
    pub exported: AtomicU64,
    pub taken: AtomicU64,
}

impl KvStore for KvBoard {
    fn put(&self, exec: ExecId, bytes: Arc<[u8]>) {
        self.exported.fetch_add(1, Ordering::Relaxed);
        lock(&self.blocks).insert(exec, bytes);
    }

    fn get(&self, exec: ExecId) -> Option<Arc<[u8]>> {
        lock(&self.blocks).get(&exec).cloned()
    }

    fn remove(&self, exec: ExecId) -> Option<Arc<[u8]>> {
        let taken = lock(&self.blocks).remove(&exec);
        if taken.is_some() {
            self.taken.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    fn len(&self) -> usize {
        lock(&self.blocks).len()
    }

    fn migrations(&self) -> (u64, u64) {
        (
            self.exported.load(Ordering::Relaxed),
            self.taken.load(Ordering::Relaxed),
        )
    }
}

/// Everything the backends of one embedded cluster share.
#[derive(Debug, Clone)]
pub struct Shared {
    pub model: ModelConfig,
    pub blobs: Arc<dyn BlobStore>,
    pub weights: Arc<dyn WeightStore>,
    pub grads: Arc<dyn GradStore>,
    pub kv: Arc<dyn KvStore>,
    /// Every optimizer update the core made, in order: what a live run
    /// reports (its actors' state is not visible from outside).
    pub updates: Arc<Mutex<Vec<UpdateSummary>>>,
    /// Rollout engines unloaded for training (role changes to training),
    /// counted by the unload job.
    pub unloads: Arc<AtomicU64>,
}

impl Shared {
    /// In-process boards for everything.
    pub fn new(model: ModelConfig, blobs: Arc<dyn BlobStore>) -> Self {
        Self {
            model,
            blobs,
            weights: Arc::new(WeightBoard::default()),
            grads: Arc::new(GradBoard::default()),
            kv: Arc::new(KvBoard::default()),
            updates: Arc::default(),
            unloads: Arc::default(),
        }
    }
}
