//! Requests to backends on other nodes, resent until answered.
//!
//! Delivery between nodes is at most once, and the simulator's fault plans
//! lose, duplicate and reorder messages and cut links for a while. A
//! scheduling actor therefore files every backend request it needs an
//! answer to in an [`Outbox`] under a key derived from the request itself
//! (a switch's stage, a step, a micro-step, a call attempt), never from a
//! counter of sends. With a retry interval configured
//! ([`crate::sched::SchedConfig::retry`]), one timer per actor resends every
//! request older than the interval until its answer arrives; the backends
//! answer a repeated request again without doing its work twice.
//!
//! The answer side is the other half of idempotency: an answer is acted on
//! only if [`Outbox::ack`] finds its request outstanding, so a duplicate
//! (the network's copy, or the answer to a resend) changes nothing twice.
//! Without a retry interval the outbox only keeps that bookkeeping and sets
//! no timer, so a fault-free simulation runs exactly as before.

use rustc_hash::FxHashMap;

use gyre_runtime::{Actor, Cx, Nanos, NodeId};

use crate::sched::ids::{CallId, ExecId, MicroStepId, Step, SwitchId, Version};
use crate::sched::proto::Port;
use crate::sched::proto::engine::{CallEvent, EngineEvent, EngineReq};
use crate::sched::proto::evaluator::{EvalEvent, EvalReq};
use crate::sched::proto::memory::{MemRole, MemoryEvent, MemoryReq};
use crate::sched::proto::trainer::{TrainerEvent, TrainerReq};
use crate::sched::proto::transfer::{ReadTag, TransferEvent, TransferReq};

/// What identifies one outstanding request of one actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReqKey {
    StopAdmitting,
    PinKv,
    CancelAll,
    Unload,
    Load,
    SetWeights(Version),
    Release(MemRole),
    Restore(MemRole),
    /// A KV read of one execution's prefix, for one switch's hand-over
    /// (an execution can be handed over again by a later switch while a
    /// rejoined destination still resends the earlier read).
    ReadKv(SwitchId, ExecId),
    /// The read of the core's weights before training a step.
    ReadSnapshot(Step),
    Warmup(Step),
    FwdBwd(MicroStepId),
    Drain(Step),
    BuildGroups,
    Reduce(Step),
    Update(Step),
    Broadcast(Step),
    Expose(Version),
    Publish(Version),
    Serve(CallId, u32),
    Score(ExecId, u32),
    Checkpoint(Version),
    /// The core's trainer restore of one epoch.
    RestoreCore(u64),
}

impl ReqKey {
    /// The key of an engine request (`None` for the unanswered hints).
    pub fn of_engine(r: &EngineReq) -> Option<ReqKey> {
        Some(match r {
            EngineReq::Serve { call, attempt, .. } => ReqKey::Serve(*call, *attempt),
            EngineReq::StopAdmitting { .. } => ReqKey::StopAdmitting,
            EngineReq::PinKv { .. } => ReqKey::PinKv,
            EngineReq::CancelAll { .. } => ReqKey::CancelAll,
            EngineReq::Unload { .. } => ReqKey::Unload,
            EngineReq::Load { .. } => ReqKey::Load,
            EngineReq::SetWeightsAcked { version, .. } => ReqKey::SetWeights(*version),
            EngineReq::ExpectKv { .. }
            | EngineReq::AdoptKv { .. }
            | EngineReq::ReleaseKv { .. }
            | EngineReq::SetWeights { .. } => {
                return None;
            }
        })
    }

    pub fn of_memory(r: &MemoryReq) -> ReqKey {
        match r {
            MemoryReq::Release { role, .. } => ReqKey::Release(*role),
            MemoryReq::Restore { role, .. } => ReqKey::Restore(*role),
        }
    }

    pub fn of_trainer(r: &TrainerReq) -> ReqKey {
        match r {
            TrainerReq::Warmup { step, .. } => ReqKey::Warmup(*step),
            TrainerReq::FwdBwd { mstep, .. } => ReqKey::FwdBwd(*mstep),
            TrainerReq::Drain { step, .. } => ReqKey::Drain(*step),
            TrainerReq::BuildGroups { .. } => ReqKey::BuildGroups,
            TrainerReq::Reduce { step, .. } => ReqKey::Reduce(*step),
            TrainerReq::Update { step, .. } => ReqKey::Update(*step),
            TrainerReq::Broadcast { step, .. } => ReqKey::Broadcast(*step),
            TrainerReq::Checkpoint { version, .. } => ReqKey::Checkpoint(*version),
            TrainerReq::Restore { epoch, .. } => ReqKey::RestoreCore(*epoch),
        }
    }

    pub fn of_transfer(r: &TransferReq) -> ReqKey {
        match r {
            TransferReq::Expose { version, .. } => ReqKey::Expose(*version),
            TransferReq::Read { tag, .. } => read_key(tag),
            TransferReq::Publish { version, .. } => ReqKey::Publish(*version),
        }
    }

    pub fn of_eval(r: &EvalReq) -> ReqKey {
        let EvalReq::Score { exec, attempt, .. } = r;
        ReqKey::Score(*exec, *attempt)
    }
}

/// A request as it is resent.
#[derive(Debug, Clone)]
pub enum Resend {
    Engine(Port<EngineReq>, EngineReq),
    Memory(Port<MemoryReq>, MemoryReq),
    Trainer(Port<TrainerReq>, TrainerReq),
    Transfer(Port<TransferReq>, TransferReq),
    Eval(Port<EvalReq>, EvalReq),
}

impl Resend {
    /// The key the request is filed under; `None` for the hints no answer
    /// follows (`ExpectKv`, `AdoptKv`, `ReleaseKv`, `SetWeights`), which are sent once.
    pub fn key(&self) -> Option<ReqKey> {
        match self {
            Resend::Engine(_, r) => ReqKey::of_engine(r),
            Resend::Memory(_, r) => Some(ReqKey::of_memory(r)),
            Resend::Trainer(_, r) => Some(ReqKey::of_trainer(r)),
            Resend::Transfer(_, r) => Some(ReqKey::of_transfer(r)),
            Resend::Eval(_, r) => Some(ReqKey::of_eval(r)),
        }
    }

    /// The node of the backend the request goes to.
    pub fn node(&self) -> NodeId {
        match self {
            Resend::Engine(p, _) => p.id().node,
            Resend::Memory(p, _) => p.id().node,
            Resend::Trainer(p, _) => p.id().node,
            Resend::Transfer(p, _) => p.id().node,
            Resend::Eval(p, _) => p.id().node,
        }
    }

    fn send<A: Actor>(&self, cx: &mut Cx<'_, A>) {
        match self {
            Resend::Engine(p, r) => cx.send(*p, r.clone()),
            Resend::Memory(p, r) => cx.send(*p, r.clone()),
            Resend::Trainer(p, r) => cx.send(*p, r.clone()),
            Resend::Transfer(p, r) => cx.send(*p, r.clone()),
            Resend::Eval(p, r) => cx.send(*p, r.clone()),
        }
    }
}

fn read_key(tag: &ReadTag) -> ReqKey {
    match tag {
        ReadTag::Kv { switch, exec, .. } => ReqKey::ReadKv(*switch, *exec),
        ReadTag::Snapshot { step, .. } => ReqKey::ReadSnapshot(*step),
    }
}

/// An answer, and the request it answers.
pub trait Answer {
    fn answers(&self) -> ReqKey;
}

impl Answer for EngineEvent {
    fn answers(&self) -> ReqKey {
        match self {
            EngineEvent::AdmissionStopped => ReqKey::StopAdmitting,
            EngineEvent::KvPinned { .. } => ReqKey::PinKv,
            EngineEvent::CancelComplete { .. } => ReqKey::CancelAll,
            EngineEvent::Unloaded => ReqKey::Unload,
            EngineEvent::Loaded { .. } => ReqKey::Load,
            EngineEvent::WeightsSet { version } => ReqKey::SetWeights(*version),
        }
    }
}

impl Answer for CallEvent {
    fn answers(&self) -> ReqKey {
        match self {
            CallEvent::Done { call, attempt, .. }
            | CallEvent::Cancelled { call, attempt }
            | CallEvent::Rejected { call, attempt } => ReqKey::Serve(*call, *attempt),
        }
    }
}

impl Answer for MemoryEvent {
    fn answers(&self) -> ReqKey {
        match self {
            MemoryEvent::Released { role } => ReqKey::Release(*role),
            // A refusal names no request; the cell ends both of the role's
            // (see `Cell::on_msg`), this key is the usual one (a restore
            // the device could not hold).
            MemoryEvent::Restored { role } | MemoryEvent::Refused { role, .. } => {
                ReqKey::Restore(*role)
            }
        }
    }
}

impl Answer for TrainerEvent {
    fn answers(&self) -> ReqKey {
        match self {
            TrainerEvent::Warm { step, .. } => ReqKey::Warmup(*step),
            TrainerEvent::Computed { mstep, .. } => ReqKey::FwdBwd(*mstep),
            TrainerEvent::Drained { step, .. } => ReqKey::Drain(*step),
            TrainerEvent::GroupsBuilt { .. } => ReqKey::BuildGroups,
            TrainerEvent::Reduced { step, .. } => ReqKey::Reduce(*step),
            TrainerEvent::Updated { step, .. } => ReqKey::Update(*step),
            TrainerEvent::Broadcasted { step, .. } => ReqKey::Broadcast(*step),
            TrainerEvent::Checkpointed { version, .. } => ReqKey::Checkpoint(*version),
            TrainerEvent::Restored { epoch, .. } => ReqKey::RestoreCore(*epoch),
        }
    }
}

impl Answer for TransferEvent {
    fn answers(&self) -> ReqKey {
        match self {
            TransferEvent::Exposed { segment } => ReqKey::Expose(segment.version),
            TransferEvent::ReadDone { tag } => read_key(tag),
            TransferEvent::Published { version } => ReqKey::Publish(*version),
        }
    }
}

impl Answer for EvalEvent {
    fn answers(&self) -> ReqKey {
        match self {
            EvalEvent::Scored { exec, attempt, .. } | EvalEvent::Failed { exec, attempt } => {
                ReqKey::Score(*exec, *attempt)
            }
        }
    }
}

/// The timer key of an outbox's resend tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RetryTick;

#[derive(Debug)]
struct Pending {
    sent: Nanos,
    req: Resend,
}

/// How many requests were resent, and how many answers were duplicates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    pub resent: u64,
    pub duplicates: u64,
}

/// One actor's outstanding backend requests.
///
/// Filed in a hash map (every model call passes through the proxy's
/// outbox, so filing and acknowledging are on the simulator's hot path);
/// whatever reads them in order (resends, [`Outbox::pending`]) sorts the
/// keys first, so the order stays the keys' order.
#[derive(Debug)]
pub struct Outbox {
    after: Option<Nanos>,
    pending: FxHashMap<ReqKey, Pending>,
    stats: OutboxStats,
}

impl Outbox {
    /// Resends after `after` without an answer; `None`: never.
    pub fn new(after: Option<Nanos>) -> Self {
        Self {
            after: after.filter(|a| *a > 0),
            pending: FxHashMap::default(),
            stats: OutboxStats::default(),
        }
    }

    /// Whether unanswered requests are resent.
    pub fn resends(&self) -> bool {
        self.after.is_some()
    }

    pub fn stats(&self) -> OutboxStats {
        self.stats
    }

    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// The keys still waiting for an answer, in key order.
    pub fn pending(&self) -> Vec<ReqKey> {
        let mut keys: Vec<ReqKey> = self.pending.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    pub fn is_pending(&self, key: &ReqKey) -> bool {
        self.pending.contains_key(key)
    }

    /// Sends `req` now and, unless it is a hint nothing answers, files it
    /// under its key (replacing what was filed there).
    pub fn send<A: Actor>(&mut self, cx: &mut Cx<'_, A>, req: Resend)
    where
        A::Timer: From<RetryTick>,
    {
        req.send(cx);
        let Some(key) = req.key() else {
            return;
        };
        self.pending.insert(
            key,
            Pending {
                sent: cx.now(),
                req,
            },
        );
        if let Some(after) = self.after
            && !cx.timer_armed(&RetryTick.into())
        {
            cx.set_timer(RetryTick.into(), after);
        }
    }

    /// `answer` arrived: true if its request was outstanding (act on it),
    /// false for a duplicate (ignore it).
    pub fn ack(&mut self, answer: &impl Answer) -> bool {
        if self.pending.remove(&answer.answers()).is_some() {
            true
        } else {
            self.stats.duplicates += 1;
            false
        }
    }

    /// Forgets `key` without an answer (the request no longer matters).
    pub fn forget(&mut self, key: &ReqKey) {
        self.pending.remove(key);
    }

    /// Resends now every outstanding request to `node` (its host says it
    /// runs again, so whatever reached it before is gone); the count.
    pub fn resend_to<A: Actor>(&mut self, node: NodeId, cx: &mut Cx<'_, A>) -> usize {
        let now = cx.now();
        let mut sent = 0;
        for key in self.pending() {
            let Some(p) = self.pending.get_mut(&key) else {
                continue;
            };
            if p.req.node() == node {
                p.req.send(cx);
                p.sent = now;
                self.stats.resent += 1;
                sent += 1;
            }
        }
        sent
    }

    /// The resend tick: resends what has waited `after` or longer, and
    /// re-arms while anything is outstanding.
    pub fn tick<A: Actor>(&mut self, cx: &mut Cx<'_, A>)
    where
        A::Timer: From<RetryTick>,
    {
        let Some(after) = self.after else {
            return;
        };
        let now = cx.now();
        for key in self.pending() {
            let Some(p) = self.pending.get_mut(&key) else {
                continue;
            };
            if now.saturating_sub(p.sent) >= after {
                p.req.send(cx);
                p.sent = now;
                self.stats.resent += 1;
            }
        }
        if !self.pending.is_empty() {
            cx.set_timer(RetryTick.into(), after);
        }
    }
}
