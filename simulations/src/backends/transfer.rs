//! A simulated transfer engine: a latency plus a bandwidth term per read,
//! registered weight buffers with their version, and a publication cost.
//! It remembers when each publication finished: the burst boundaries of the
//! lab's timeline. A repeated request is ignored while under way and
//! answered again once done (see [`super::answered`]).
//!
//! Replaying a record, the `n`-th read, exposure or publication takes the
//! recorded `n`-th one's time ([`crate::replay::workload::TimedReplay`]).

use std::collections::BTreeMap;

use gyre_actors::sched::proto::transfer::{Segment, TransferEvent, TransferReq};
use gyre_runtime::{Actor, ActorId, Cx, Nanos};

use gyre_actors::sched::retry::ReqKey;

use super::answered::Answered;
use crate::costs::TransferCosts;
use crate::replay::ReplayWorkload;
use crate::replay::workload::{TimedOp, TimedReplay};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub reads: u64,
    pub bytes_read: u64,
    pub exposes: u64,
    pub publishes: u64,
}

#[derive(Debug)]
pub struct SimTransfer {
    costs: TransferCosts,
    next_op: u64,
    next_segment: u64,
    ops: BTreeMap<u64, TransferReq>,
    stats: TransferStats,
    published_at: Vec<Nanos>,
    answered: Answered<TransferEvent>,
    /// `TransferCosts::serial`: operations waiting for the one in flight.
    queue: std::collections::VecDeque<(u64, Nanos)>,
    replay: Option<TimedReplay>,
}

impl SimTransfer {
    pub fn new(costs: TransferCosts) -> Self {
        Self {
            costs,
            next_op: 0,
            next_segment: 0,
            ops: BTreeMap::new(),
            stats: TransferStats::default(),
            published_at: Vec::new(),
            answered: Answered::default(),
            queue: std::collections::VecDeque::new(),
            replay: None,
        }
    }

    /// Prices operations as the recorded transfer worker did.
    pub fn replaying(mut self, replay: std::sync::Arc<ReplayWorkload>) -> Self {
        self.replay = Some(TimedReplay::new(replay, None));
        self
    }

    /// When each publication reached the rollout engines.
    pub fn published_at(&self) -> &[Nanos] {
        &self.published_at
    }

    /// A weight publication to the rollout engines is under way.
    pub fn is_publishing(&self) -> bool {
        self.ops
            .values()
            .any(|op| matches!(op, TransferReq::Publish { .. }))
    }

    pub fn stats(&self) -> TransferStats {
        self.stats
    }
}

/// Who asked for `req`.
fn reply_to(req: &TransferReq) -> gyre_runtime::ActorId {
    match req {
        TransferReq::Expose { reply_to, .. }
        | TransferReq::Read { reply_to, .. }
        | TransferReq::Publish { reply_to, .. } => reply_to.id(),
    }
}

impl Actor for SimTransfer {
    type Msg = TransferReq;
    type Timer = u64;

    fn on_msg(&mut self, _from: ActorId, msg: TransferReq, cx: &mut Cx<'_, Self>) {
        let key = (ReqKey::of_transfer(&msg), reply_to(&msg));
        if self
            .ops
            .values()
            .any(|op| (ReqKey::of_transfer(op), reply_to(op)) == key)
        {
            return; // under way: its answer will come
        }
        if let Some((to, event)) = self.answered.again(key.0, key.1) {
            return cx.send(to, event);
        }
        let cost = match &msg {
            TransferReq::Expose { .. } => self.costs.expose.unwrap_or(self.costs.latency),
            TransferReq::Read { bytes, .. } => {
                self.costs.latency + (bytes / 1024).saturating_mul(self.costs.ns_per_kib)
            }
            TransferReq::Publish { .. } => self.costs.publish.draw(cx.rng()),
        };
        let kind = match &msg {
            TransferReq::Expose { .. } => TimedOp::Expose,
            TransferReq::Read { .. } => TimedOp::Read,
            TransferReq::Publish { .. } => TimedOp::Publish,
        };
        let cost = self
            .replay
            .as_mut()
            .and_then(|r| r.next(kind))
            .unwrap_or(cost);
        self.next_op += 1;
        self.ops.insert(self.next_op, msg);
        if self.costs.serial {
            // One at a time: it starts when those before it are done.
            self.queue.push_back((self.next_op, cost));
            if self.queue.len() == 1 {
                cx.set_timer(self.next_op, cost);
            }
        } else {
            cx.set_timer(self.next_op, cost);
        }
    }

    fn on_timer(&mut self, op: u64, cx: &mut Cx<'_, Self>) {
        let Some(req) = self.ops.remove(&op) else {
            return;
        };
        if self.costs.serial {
            self.queue.pop_front();
            if let Some(&(next, cost)) = self.queue.front() {
                cx.set_timer(next, cost);
            }
        }
        let key = ReqKey::of_transfer(&req);
        let (to, event) = match req {
            TransferReq::Expose { version, reply_to } => {
                self.stats.exposes += 1;
                self.next_segment += 1;
                let segment = Segment {
                    id: self.next_segment,
                    version,
                    bytes: self.costs.weights_bytes,
                };
                (reply_to, TransferEvent::Exposed { segment })
            }
            TransferReq::Read {
                tag,
                bytes,
                reply_to,
            } => {
                self.stats.reads += 1;
                self.stats.bytes_read += bytes;
                (reply_to, TransferEvent::ReadDone { tag })
            }
            TransferReq::Publish {
                version, reply_to, ..
            } => {
                self.stats.publishes += 1;
                self.published_at.push(cx.now());
                (reply_to, TransferEvent::Published { version })
            }
        };
        self.answered.put(key, to, event.clone());
        cx.send(to, event);
    }
}
