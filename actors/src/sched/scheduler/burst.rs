//! Step completions and publications (SPEC 2.2, 2.4).
//!
//! At each publication: boundary dispatch adds μ·N·B executions; every
//! satellite returns to rollout; the core stays in training only if the
//! next batch already has ρ_min·B ready groups and rule (3)
//! w + μ·N·B ≤ C_s + (K − 1)·C_e holds (checked before the new dispatch);
//! the supply timer restarts with the new batch. Under over-sampling every
//! N in these counts is N + M: d counts the surplus too. Colocate sends every cell
//! back; Async keeps its fixed partition.

use gyre_runtime::Cx;

use super::{BurstRecord, Publication, SchedTimer, Scheduler};
use crate::sched::Policy;
use crate::sched::cell::CellMsg;
use crate::sched::core::CoreMsg;
use crate::sched::ids::{Step, Version};
use crate::sched::maths::Role;
use crate::sched::maths::watermark::{BurstEnd, core_stays};

impl Scheduler {
    pub(super) fn on_step_done(&mut self, step: Step, cx: &mut Cx<'_, Self>) {
        self.steps_done = self.steps_done.max(step + 1);
        self.supply.reset(cx.now());
        let n = self.dispatcher.at_step();
        self.dispatch(n, cx);
        self.launch(cx);
        self.try_transition(cx);
    }

    pub(super) fn on_published(&mut self, step: Step, version: Version, cx: &mut Cx<'_, Self>) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        self.steps_done = self.steps_done.max(step + 1);
        self.published = version;
        self.burst += 1;
        let training: Vec<u32> = (0..self.cfg.cells)
            .filter(|c| self.ledger.role(*c).is_some_and(Role::is_training_side))
            .collect();
        if self.steps_done >= self.cfg.target_steps {
            self.done = true;
            cx.cancel_timer(&SchedTimer::Supply);
            self.supply_timer = None;
            for c in training {
                self.begin_return(c, cx);
            }
            cx.send(peers.core, CoreMsg::Leave);
            self.publish_to_rollout(version, cx);
            self.tell_publication(step, version, false, cx);
            return;
        }
        let n = self.dispatcher.at_step();
        self.dispatch(n, cx);
        let watermark = self.counters.watermark();
        let ready = self.supply.value();
        let stays = match self.cfg.policy {
            Policy::Elastic => core_stays(&BurstEnd {
                ready,
                threshold: u64::from(self.derived.supply_threshold),
                watermark,
                next_dispatch: u64::from(self.cfg.mu) * self.cfg.batch_dispatch(),
                // The capacity left: lost nodes offer none.
                pool_capacity: self.ledger.pool_offer(),
                cells: self.cfg.cells - self.ledger.lost_cells(),
                cell_capacity: self.cfg.cell_capacity,
            }),
            Policy::Colocate => false,
            Policy::Async { .. } => true,
        };
        self.log.bursts.push(BurstRecord {
            step,
            core_stays: stays,
            ready,
            watermark,
        });
        let n = self.dispatcher.at_publication();
        self.dispatch(n, cx);
        if !matches!(self.cfg.policy, Policy::Async { .. }) {
            for c in training {
                if c != 0 || !stays {
                    self.begin_return(c, cx);
                }
            }
        }
        if stays {
            cx.send(peers.core, CoreMsg::Continue { burst: self.burst });
        } else {
            cx.send(peers.core, CoreMsg::Leave);
        }
        self.supply.reset(cx.now());
        self.publish_to_rollout(version, cx);
        self.tell_publication(step, version, stays, cx);
        self.launch(cx);
        self.try_transition(cx);
    }

    fn tell_publication(
        &self,
        step: Step,
        version: Version,
        core_stays: bool,
        cx: &mut Cx<'_, Self>,
    ) {
        if let Some(observer) = self.publications {
            cx.send(
                observer,
                Publication {
                    step,
                    version,
                    dispatched: self.counters.dispatched(),
                    started: self.counters.started(),
                    finished: self.counters.finished(),
                    core_stays,
                },
            );
        }
    }

    /// The new weights reach every engine that is serving or about to
    /// serve again: a returning cell was told an older version when its
    /// return began, and would otherwise serve it until the next
    /// publication (the swarm's "every published version served" check
    /// found this). A lost cell loads it when it rejoins.
    fn publish_to_rollout(&mut self, version: Version, cx: &mut Cx<'_, Self>) {
        let Some(peers) = &self.peers else {
            return;
        };
        for (c, addr) in peers.cells.iter().enumerate() {
            if matches!(
                self.ledger.role(c as u32),
                Some(Role::Rollout | Role::Returning | Role::Lost)
            ) {
                cx.send(*addr, CellMsg::Weights { version });
            }
        }
        if let Some(pool) = peers.pool {
            cx.send(pool, CellMsg::Weights { version });
        }
    }
}
