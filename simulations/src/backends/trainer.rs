//! A simulated trainer: one operation at a time, each with a fixed cost
//! scaled by the cell's slowdown factor (micro-steps also by their tokens).

use std::collections::VecDeque;

use gyre_actors::sched::proto::trainer::{TrainerEvent, TrainerReq};
use gyre_runtime::{Actor, ActorId, Cx, Nanos};

use crate::costs::TrainerCosts;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrainerStats {
    pub warmups: u64,
    pub micro_steps: u64,
    pub tokens: u64,
    pub drains: u64,
    pub updates: u64,
}

#[derive(Debug)]
pub struct SimTrainer {
    costs: TrainerCosts,
    slowdown: f64,
    queue: VecDeque<TrainerReq>,
    busy: bool,
    stats: TrainerStats,
}

impl SimTrainer {
    pub fn new(costs: TrainerCosts, cell: u32) -> Self {
        let slowdown = costs
            .slowdown
            .get(cell as usize)
            .copied()
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(1.0);
        Self {
            costs,
            slowdown,
            queue: VecDeque::new(),
            busy: false,
            stats: TrainerStats::default(),
        }
    }

    pub fn stats(&self) -> TrainerStats {
        self.stats
    }

    fn cost(&self, req: &TrainerReq) -> Nanos {
        let c = &self.costs;
        let base = match req {
            TrainerReq::Warmup { .. } => c.warmup,
            TrainerReq::FwdBwd { tokens, .. } => tokens.saturating_mul(c.per_token),
            TrainerReq::Drain { .. } => c.drain,
            TrainerReq::BuildGroups { .. } => c.build_groups,
            TrainerReq::Reduce { members, .. } => c.reduce * u64::from((*members).max(1)),
            TrainerReq::Update { .. } => c.update,
            TrainerReq::Broadcast { .. } => c.broadcast,
        };
        (base as f64 * self.slowdown) as Nanos
    }

    fn next(&mut self, cx: &mut Cx<'_, Self>) {
        if self.busy {
            return;
        }
        if let Some(req) = self.queue.front() {
            self.busy = true;
            let cost = self.cost(req);
            cx.set_timer((), cost);
        }
    }
}

impl Actor for SimTrainer {
    type Msg = TrainerReq;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, msg: TrainerReq, cx: &mut Cx<'_, Self>) {
        self.queue.push_back(msg);
        self.next(cx);
    }

    fn on_timer(&mut self, _t: (), cx: &mut Cx<'_, Self>) {
        self.busy = false;
        let Some(req) = self.queue.pop_front() else {
            return;
        };
        match req {
            TrainerReq::Warmup { step, reply_to } => {
                self.stats.warmups += 1;
                cx.send(reply_to, TrainerEvent::Warm { step });
            }
            TrainerReq::FwdBwd {
                mstep,
                tokens,
                reply_to,
            } => {
                self.stats.micro_steps += 1;
                self.stats.tokens += tokens;
                cx.send(reply_to, TrainerEvent::Computed { mstep });
            }
            TrainerReq::Drain { step, reply_to } => {
                self.stats.drains += 1;
                cx.send(reply_to, TrainerEvent::Drained { step });
            }
            TrainerReq::BuildGroups { prefixes, reply_to } => {
                cx.send(
                    reply_to,
                    TrainerEvent::GroupsBuilt {
                        groups: prefixes.len() as u32,
                    },
                );
            }
            TrainerReq::Reduce { step, reply_to, .. } => {
                cx.send(
                    reply_to,
                    TrainerEvent::Reduced {
                        step,
                        grad_norm: 1.0,
                    },
                );
            }
            TrainerReq::Update { step, reply_to } => {
                self.stats.updates += 1;
                cx.send(reply_to, TrainerEvent::Updated { step });
            }
            TrainerReq::Broadcast { step, reply_to, .. } => {
                cx.send(reply_to, TrainerEvent::Broadcasted { step });
            }
        }
        self.next(cx);
    }
}
