//! The transfer engine of one embedded cluster: one-sided reads of what the
//! boards hold (an execution's exported KV blocks, the core's published
//! weights) and weight publication, as the live counterpart of the
//! simulator's latency-and-bandwidth model.
//!
//! In one process a read is a real copy of the bytes the tag stands for,
//! run as a "transfer.read" I/O job so its cost lands where a transfer's
//! would. A read whose source is gone still completes (`ReadDone`): the
//! reader falls back on its own (the engine prefills, a satellite trainer
//! syncs to the board at warm-up), and the miss is counted. A publication
//! is answered once its version is on the weight board, re-checked on a
//! timer while the core's upload is still under way.

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_actors::sched::ids::Version;
use gyre_actors::sched::proto::transfer::{ReadTag, Segment, TransferEvent, TransferReq};
use gyre_runtime::{Actor, ActorId, Cx, IoError, MILLIS, Nanos, Recipient};
use serde::{Deserialize, Serialize};

use crate::embedded::journal::{Journal, op_line};
use crate::embedded::shared::{Shared, WeightStore};
use crate::embedded::work::{Serial, Work};

/// How often a publication re-checks the board, and for how long.
const PUBLISH_RETRY: Nanos = 5 * MILLIS;
const PUBLISH_TRIES: u32 = 2_000;

#[derive(Debug, Serialize, Deserialize)]
pub enum TransferWorkerMsg {
    Req(TransferReq),
    /// The job in flight finished: the bytes it found (and copied).
    Done(Result<u64, IoError>),
}

impl From<TransferReq> for TransferWorkerMsg {
    fn from(r: TransferReq) -> Self {
        TransferWorkerMsg::Req(r)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub exposes: u64,
    pub reads: u64,
    pub kv_bytes: u64,
    pub snapshot_bytes: u64,
    pub publishes: u64,
    /// Reads, exposes and publications whose data was not on a board.
    pub missing: u64,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Expose {
        version: Version,
        reply_to: Recipient<TransferEvent>,
    },
    Read {
        tag: ReadTag,
        reply_to: Recipient<TransferEvent>,
    },
    Publish {
        version: Version,
        reply_to: Recipient<TransferEvent>,
        tries: u32,
    },
}

#[derive(Debug)]
pub struct TransferWorker {
    shared: Shared,
    next_segment: u64,
    jobs: Serial<Op>,
    /// Publications waiting for their version, by retry timer.
    waiting: BTreeMap<u64, Op>,
    next_timer: u64,
    stats: TransferStats,
    /// `gyre train --record`: where each job is written, and when the one
    /// in flight began.
    journal: Option<Journal>,
    began: Nanos,
    /// When the running one arrived.
    arrived: Nanos,
}

/// `version`'s bytes on the board, or the newest ones when that version
/// was already dropped.
fn weights(board: &dyn WeightStore, version: Version) -> Option<Arc<[u8]>> {
    board.get(version).or_else(|| {
        board
            .latest()
            .filter(|(v, _)| *v >= version)
            .map(|(_, b)| b)
    })
}

impl TransferWorker {
    pub fn new(shared: Shared) -> Self {
        Self {
            shared,
            next_segment: 0,
            jobs: Serial::default(),
            waiting: BTreeMap::new(),
            next_timer: 0,
            stats: TransferStats::default(),
            journal: None,
            began: 0,
            arrived: 0,
        }
    }

    /// Writes every read, exposure and publication to `journal`.
    pub fn with_journal(mut self, journal: Option<Journal>) -> Self {
        self.journal = journal;
        self
    }

    pub fn stats(&self) -> TransferStats {
        self.stats
    }

    fn kick(&mut self, cx: &mut Cx<'_, Self>) {
        let Some(op) = self.jobs.take_next() else {
            return;
        };
        self.jobs.begin(op);
        self.began = cx.now();
        self.arrived = self.jobs.arrived();
        let s = self.shared.clone();
        let missing = |what: String| Err(format!("{what} is not on its board"));
        match op {
            Op::Expose { version, .. } | Op::Publish { version, .. } => {
                let kind = if matches!(op, Op::Expose { .. }) {
                    "transfer.expose"
                } else {
                    "transfer.publish"
                };
                let job = move || match weights(&*s.weights, version) {
                    Some(b) => Ok(b.len() as u64),
                    None => missing(format!("weights v{version}")),
                };
                cx.io(Work::new(kind, job), TransferWorkerMsg::Done);
            }
            Op::Read { tag, .. } => {
                let job = move || {
                    let (src, what) = match tag {
                        ReadTag::Kv { exec, .. } => (s.kv.get(exec), format!("KV of {exec:?}")),
                        ReadTag::Snapshot { version, .. } => {
                            (weights(&*s.weights, version), format!("weights v{version}"))
                        }
                    };
                    match src {
                        Some(b) => {
                            // The copy a one-sided read makes into the
                            // reader's memory.
                            let copy = std::hint::black_box(b.to_vec());
                            Ok(copy.len() as u64)
                        }
                        None => missing(what),
                    }
                };
                cx.io(Work::new("transfer.read", job), TransferWorkerMsg::Done);
            }
        }
    }

    fn done(&mut self, op: Op, result: Result<u64, IoError>, cx: &mut Cx<'_, Self>) {
        if let Some(j) = &self.journal {
            let kind = match op {
                Op::Expose { .. } => "transfer.expose",
                Op::Publish { .. } => "transfer.publish",
                Op::Read { .. } => "transfer.read",
            };
            j.op(op_line(None, kind, self.arrived, self.began, cx.now()));
        }
        if let Err(e) = &result {
            let retry = matches!(op, Op::Publish { tries, .. } if tries + 1 < PUBLISH_TRIES);
            if !retry {
                tracing::warn!(?op, error = %e, "transfer found nothing to move");
                self.stats.missing += 1;
            }
        }
        let bytes = result.as_ref().copied().unwrap_or(0);
        match op {
            Op::Expose { version, reply_to } => {
                self.stats.exposes += 1;
                self.next_segment += 1;
                let segment = Segment {
                    id: self.next_segment,
                    version,
                    bytes,
                };
                cx.send(reply_to, TransferEvent::Exposed { segment });
            }
            Op::Read { tag, reply_to } => {
                self.stats.reads += 1;
                match tag {
                    ReadTag::Kv { .. } => self.stats.kv_bytes += bytes,
                    ReadTag::Snapshot { .. } => self.stats.snapshot_bytes += bytes,
                }
                cx.send(reply_to, TransferEvent::ReadDone { tag });
            }
            Op::Publish {
                version,
                reply_to,
                tries,
            } => {
                if result.is_err() && tries + 1 < PUBLISH_TRIES {
                    self.next_timer += 1;
                    self.waiting.insert(
                        self.next_timer,
                        Op::Publish {
                            version,
                            reply_to,
                            tries: tries + 1,
                        },
                    );
                    cx.set_timer(self.next_timer, PUBLISH_RETRY);
                    return;
                }
                self.stats.publishes += 1;
                cx.send(reply_to, TransferEvent::Published { version });
            }
        }
    }
}

impl Actor for TransferWorker {
    type Msg = TransferWorkerMsg;
    type Timer = u64;
    gyre_runtime::accepts!(TransferReq);

    fn on_msg(&mut self, _from: ActorId, msg: TransferWorkerMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            TransferWorkerMsg::Req(r) => self.jobs.push(
                match r {
                    TransferReq::Expose { version, reply_to } => Op::Expose { version, reply_to },
                    TransferReq::Read { tag, reply_to, .. } => Op::Read { tag, reply_to },
                    TransferReq::Publish {
                        version, reply_to, ..
                    } => Op::Publish {
                        version,
                        reply_to,
                        tries: 0,
                    },
                },
                cx.now(),
            ),
            TransferWorkerMsg::Done(result) => match self.jobs.finish() {
                Some(op) => self.done(op, result, cx),
                None => tracing::error!("transfer job completion with no job in flight"),
            },
        }
        self.kick(cx);
    }

    fn on_timer(&mut self, timer: u64, cx: &mut Cx<'_, Self>) {
        if let Some(op) = self.waiting.remove(&timer) {
            self.jobs.push(op, cx.now());
            self.kick(cx);
        }
    }
}

#[cfg(test)]
mod tests {
    use gyre_actors::sched::cell::CellMsg;
    use gyre_actors::sched::ids::{ExecId, Step, SwitchId};
    use gyre_gpu::model::ModelConfig;
    use gyre_runtime::sim::{Sim, SimConfig};
    use gyre_runtime::{Addr, External, MemBlobs, NodeId};

    use super::*;

    const TESTER: ActorId = ActorId::new(9, 1);

    struct Rig {
        sim: Sim,
        tx: Addr<TransferWorker>,
        cell: Addr<External<TransferEvent>>,
        core: Addr<External<TransferEvent>>,
        shared: Shared,
    }

    fn rig() -> Rig {
        let shared = Shared::new(ModelConfig::tiny(), MemBlobs::shared());
        let mut sim = Sim::new(SimConfig::new(3));
        let tx = sim.spawn(NodeId(1), TransferWorker::new(shared.clone()));
        let cell = sim.probe::<TransferEvent>(NodeId(2));
        let core = sim.probe::<TransferEvent>(NodeId(3));
        Rig {
            sim,
            tx,
            cell,
            core,
            shared,
        }
    }

    impl Rig {
        fn stats(&self) -> TransferStats {
            self.sim.actor(self.tx).unwrap().stats()
        }

        fn cell_events(&mut self) -> Vec<TransferEvent> {
            self.sim.run().unwrap();
            let cell = self.cell;
            self.sim
                .take_probe(cell)
                .into_iter()
                .map(|r| r.msg)
                .collect()
        }

        /// What the core received so far (the caller runs the world).
        fn core_events(&mut self) -> Vec<(Nanos, TransferEvent)> {
            let core = self.core;
            self.sim
                .take_probe(core)
                .into_iter()
                .map(|r| (r.at, r.msg))
                .collect()
        }
    }

    #[test]
    fn reads_copy_what_the_boards_hold_and_misses_still_complete() {
        let mut r = rig();
        r.shared.kv.put(ExecId(4), vec![7u8; 100].into());
        r.shared.weights.publish(2, vec![1u8; 300].into());
        let kv = |exec| ReadTag::Kv {
            switch: SwitchId(1),
            exec: ExecId(exec),
            tokens: 10,
            source: Addr::<External<CellMsg>>::new(r.cell.id()).into(),
        };
        let snap = |step: Step, version| ReadTag::Snapshot { step, version };
        for tag in [kv(4), kv(5), snap(2, 2), snap(1, 1)] {
            r.sim.inject(
                TESTER,
                r.tx,
                TransferReq::Read {
                    tag,
                    bytes: 1,
                    reply_to: r.cell.into(),
                },
            );
        }
        let got = r.cell_events();
        assert_eq!(got.len(), 4);
        assert!(matches!(
            got[0],
            TransferEvent::ReadDone {
                tag: ReadTag::Kv {
                    exec: ExecId(4),
                    ..
                }
            }
        ));
        let s = r.stats();
        // v1 was dropped: the newest version (v2) stands in for it.
        assert_eq!(
            (s.reads, s.kv_bytes, s.snapshot_bytes, s.missing),
            (4, 100, 600, 1)
        );
        // A read copies; the blocks stay for the adopting engine.
        assert_eq!(r.shared.kv.len(), 1);
    }

    #[test]
    fn expose_sizes_the_segment_and_publish_waits_for_the_board() {
        let mut r = rig();
        r.shared.weights.publish(0, vec![0u8; 64].into());
        r.sim.inject(
            TESTER,
            r.tx,
            TransferReq::Expose {
                version: 0,
                reply_to: r.core.into(),
            },
        );
        r.sim.inject(
            TESTER,
            r.tx,
            TransferReq::Publish {
                version: 1,
                engines: 2,
                reply_to: r.core.into(),
            },
        );
        r.sim.run_until(20 * MILLIS).unwrap();
        let got = r.core_events();
        // Only the expose so far: v1 is not published.
        assert!(
            matches!(
                got[..],
                [(
                    _,
                    TransferEvent::Exposed {
                        segment: Segment {
                            id: 1,
                            version: 0,
                            bytes: 64
                        }
                    }
                )]
            ),
            "{got:?}"
        );
        r.shared.weights.publish(1, vec![0u8; 64].into());
        r.sim.run().unwrap();
        let got = r.core_events();
        assert!(
            matches!(got[..], [(at, TransferEvent::Published { version: 1 })] if at > 20 * MILLIS)
        );
        let s = r.stats();
        assert_eq!((s.exposes, s.publishes, s.missing), (1, 1, 0));
    }
}
