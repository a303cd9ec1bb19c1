//! The micro-step queue: one shared queue that training cells claim from.
//!
//! Claims are served one at a time by this actor, so every micro-step is
//! granted to exactly one cell, and cells receive disjoint work. A cell
//! claims again as soon as its compute is free, so earlier or faster cells
//! take more and all participants finish a batch at about the same time
//! (SPEC 2.6). A claim that finds the queue empty parks until the packer
//! pushes more or closes the stream; a claim on a closed, empty stream ends
//! the cell's batch.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gyre_runtime::{Actor, ActorId, Cx, Recipient};

use crate::sched::ids::{MicroStepId, Step};
use crate::sched::msg::cell::CellMsg;
use crate::sched::msg::packer::PackerMsg;
pub use crate::sched::msg::queue::{MicroStep, QueueMsg};

#[derive(Debug, Default)]
struct StepQueue {
    unclaimed: VecDeque<MicroStep>,
    pushed: u32,
    closed: bool,
    granted: BTreeSet<MicroStepId>,
    waiting: VecDeque<(u32, Recipient<CellMsg>)>,
    /// What each cell was granted, for a requeue.
    by_cell: BTreeMap<u32, Vec<MicroStep>>,
    /// Cells cut from this step's batch: granted nothing more.
    cut: BTreeSet<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Micro-steps granted to each cell.
    pub grants: BTreeMap<u32, u64>,
    /// Grants of an id already granted (must stay 0).
    pub double_grants: u64,
    /// A close whose total disagreed with what was pushed (must stay 0).
    pub bad_closes: u64,
    /// Micro-steps granted again after their cell left the batch.
    pub requeued: u64,
    /// Micro-steps put back by a rewind (the core's restore): trained
    /// again because the update they went into was lost.
    pub rewound: u64,
    /// Their tokens.
    pub rewound_tokens: u64,
}

#[derive(Debug, Default)]
pub struct MicroQueue {
    steps: BTreeMap<Step, StepQueue>,
    packer: Option<Recipient<PackerMsg>>,
    stats: QueueStats,
}

impl MicroQueue {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn stats(&self) -> &QueueStats {
        &self.stats
    }

    /// Micro-steps of `step` granted so far.
    pub fn granted(&self, step: Step) -> usize {
        self.steps.get(&step).map_or(0, |q| q.granted.len())
    }

    fn grant(
        &mut self,
        step: Step,
        cell: u32,
        to: Recipient<CellMsg>,
        cx: &mut Cx<'_, Self>,
    ) -> bool {
        let Some(q) = self.steps.get_mut(&step) else {
            return false;
        };
        if q.cut.contains(&cell) {
            return false;
        }
        let Some(m) = q.unclaimed.pop_front() else {
            return false;
        };
        if !q.granted.insert(m.id) {
            self.stats.double_grants += 1;
        }
        q.by_cell.entry(cell).or_default().push(m);
        *self.stats.grants.entry(cell).or_default() += 1;
        cx.send(to, CellMsg::Grant { mstep: m });
        if let Some(p) = self.packer {
            cx.send(
                p,
                PackerMsg::Claimed {
                    id: m.id,
                    group: m.group,
                },
            );
        }
        true
    }

    /// Serves parked claims of `step` while there is work or the stream ended.
    fn serve(&mut self, step: Step, cx: &mut Cx<'_, Self>) {
        loop {
            let Some(q) = self.steps.get_mut(&step) else {
                return;
            };
            let Some(&(cell, _)) = q.waiting.front() else {
                return;
            };
            if q.unclaimed.is_empty() && !q.closed && !q.cut.contains(&cell) {
                return;
            }
            let Some((cell, to)) = q.waiting.pop_front() else {
                return;
            };
            if !self.grant(step, cell, to, cx) {
                cx.send(to, CellMsg::StreamEnd { step });
            }
        }
    }
}

impl Actor for MicroQueue {
    type Msg = QueueMsg;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, msg: QueueMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            QueueMsg::Push {
                step,
                msteps,
                notify,
            } => {
                self.packer = Some(notify);
                let q = self.steps.entry(step).or_default();
                q.pushed += msteps.len() as u32;
                q.unclaimed.extend(msteps);
                self.serve(step, cx);
            }
            QueueMsg::Close { step, total } => {
                let q = self.steps.entry(step).or_default();
                q.closed = true;
                if q.pushed != total {
                    self.stats.bad_closes += 1;
                }
                self.serve(step, cx);
            }
            QueueMsg::Claim {
                step,
                cell,
                reply_to,
            } => {
                if self.grant(step, cell, reply_to, cx) {
                    return;
                }
                let q = self.steps.entry(step).or_default();
                if q.closed || q.cut.contains(&cell) {
                    cx.send(reply_to, CellMsg::StreamEnd { step });
                } else {
                    q.waiting.push_back((cell, reply_to));
                }
            }
            QueueMsg::Requeue { step, cells } => {
                let q = self.steps.entry(step).or_default();
                let mut back = Vec::new();
                for cell in cells {
                    if !q.cut.insert(cell) {
                        continue;
                    }
                    back.extend(q.by_cell.remove(&cell).unwrap_or_default());
                }
                back.sort_by_key(|m| m.id);
                for m in back.iter().rev() {
                    q.granted.remove(&m.id);
                    q.unclaimed.push_front(*m);
                }
                self.stats.requeued += back.len() as u64;
                // A parked claim of a cut cell ends now, wherever it waits
                // (behind a survivor's parked claim, it would wait for a
                // push that never serves it, or be dropped by a rewind);
                // the others may be served.
                let (ended, parked): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut q.waiting)
                    .into_iter()
                    .partition(|(cell, _)| q.cut.contains(cell));
                q.waiting = parked;
                for (_, to) in ended {
                    cx.send(to, CellMsg::StreamEnd { step });
                }
                self.serve(step, cx);
            }
            QueueMsg::Rewind { from } => {
                for q in self.steps.range_mut(from..).map(|(_, q)| q) {
                    let mut back: Vec<MicroStep> = std::mem::take(&mut q.by_cell)
                        .into_values()
                        .flatten()
                        .collect();
                    self.stats.rewound += back.len() as u64;
                    self.stats.rewound_tokens += back.iter().map(|m| m.tokens).sum::<u64>();
                    back.extend(q.unclaimed.drain(..));
                    back.sort_by_key(|m| m.id);
                    q.unclaimed = back.into();
                    q.granted.clear();
                    q.waiting.clear();
                }
            }
        }
    }
}
