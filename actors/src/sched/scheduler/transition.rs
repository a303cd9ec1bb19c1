//! Launches, dispatch and rollout→training decisions.
//!
//! A cell moves to training only when rule (2) says the rollout capacity
//! left afterwards still covers every unfinished execution, and the supply
//! check has held for τ (SPEC 2.3). The decision and the reservations are
//! one step: the ledger evacuates the cell, reserving a slot for each of its
//! executions in destination preference order, and the proxy and the cell
//! are told in the same handler (SPEC 2.5 step 2).

use gyre_runtime::Cx;

use super::{SchedTimer, Scheduler, TransitionRecord};
use crate::sched::Policy;
use crate::sched::cell::{CellMsg, Move};
use crate::sched::core::CoreMsg;
use crate::sched::execution::{ExecLinks, ExecMsg, Execution};
use crate::sched::ids::{ExecId, SwitchId};
use crate::sched::maths::Role;
use crate::sched::maths::prefix::next_to_switch;
use crate::sched::maths::watermark::may_move;
use crate::sched::proxy::ProxyMsg;

impl Scheduler {
    /// Accepts `n` executions into the rollout queue (d += n).
    pub(super) fn dispatch(&mut self, n: u64, cx: &mut Cx<'_, Self>) {
        if let Some(held) = &mut self.held {
            *held += n;
            return;
        }
        let Some(peers) = &self.peers else {
            return;
        };
        let links = ExecLinks {
            sched: cx.me(),
            proxy: peers.proxy,
            evaluator: peers.evaluator,
            harness: self.backends.harness,
        };
        for _ in 0..n {
            let id = ExecId(self.counters.dispatched());
            let group = id.group(self.cfg.dispatched_per_group());
            let exec = Execution::new(id, group, self.published, links, self.cfg.overall_timeout);
            let addr = cx.spawn(exec);
            self.counters.dispatch(1);
            self.queue.push_back(id);
            self.execs.insert(id, addr);
        }
    }

    /// The launch rule: start min{d − p, C_R − (p − f)} queued executions,
    /// each on the preferred engine with a free slot.
    pub(super) fn launch(&mut self, cx: &mut Cx<'_, Self>) {
        self.place_unplaced(cx);
        if self.done {
            return;
        }
        let Some(proxy) = self.peers.as_ref().map(|p| p.proxy) else {
            return;
        };
        let n = self.counters.launchable(self.ledger.rollout_capacity());
        for _ in 0..n {
            let Some(exec) = self.queue.pop_front() else {
                break;
            };
            let Some(engine) = self.ledger.place(exec) else {
                self.queue.push_front(exec);
                break;
            };
            self.counters.start();
            cx.send(proxy, ProxyMsg::Route { exec, engine });
            if let Some(addr) = self.execs.get(&exec) {
                cx.send(*addr, ExecMsg::Start);
            }
        }
    }

    /// Over-sampling: the surplus of a formed group ends. A running one is
    /// cancelled (its harness aborted; f moves when it reports closed, so it
    /// counts in w until then); a queued one leaves the queue and counts as
    /// started and finished at once, so d − p stays the queue length and
    /// every dispatched execution is counted in f. Executions already
    /// closed are not in `execs` and are skipped.
    pub(super) fn cancel_surplus(&mut self, execs: &[ExecId], cx: &mut Cx<'_, Self>) {
        for exec in execs {
            let Some(addr) = self.execs.get(exec).copied() else {
                continue;
            };
            if let Some(at) = self.queue.iter().position(|q| q == exec) {
                self.queue.remove(at);
                self.execs.remove(exec);
                self.counters.withdraw();
                self.log.surplus_withdrawn += 1;
            }
            cx.send(addr, ExecMsg::Cancel);
        }
        self.launch(cx);
        self.try_transition(cx);
    }

    /// Moves the next cell(s) to training if the policy's rule allows it.
    pub(super) fn try_transition(&mut self, cx: &mut Cx<'_, Self>) {
        if self.done {
            return;
        }
        let w = self.counters.watermark();
        let c_r = self.ledger.rollout_capacity();
        let c_e = self.cfg.cell_capacity;
        let cells: Vec<u32> = match self.cfg.policy {
            Policy::Async { .. } => return,
            Policy::Elastic => match next_to_switch(self.ledger.roles()) {
                Some(next) if may_move(w, c_r, c_e, 1) => vec![next],
                _ => return,
            },
            Policy::Colocate => {
                // Every cell, or, while some are lost, the ones before the
                // first lost cell (the training set is a prefix).
                let roles = self.ledger.roles();
                let busy = roles
                    .iter()
                    .any(|r| !matches!(r, Role::Rollout | Role::Lost));
                let n = roles.iter().take_while(|r| **r == Role::Rollout).count() as u32;
                if busy || n == 0 || !may_move(w, c_r, c_e, n) {
                    return;
                }
                (0..n).collect()
            }
        };
        if !self.supply.passes(cx.now()) {
            self.arm_supply_timer(cx);
            return;
        }
        self.start_switch(&cells, cx);
    }

    fn arm_supply_timer(&mut self, cx: &mut Cx<'_, Self>) {
        let Some(due) = self.supply.due() else {
            return;
        };
        if due > cx.now() && self.supply_timer != Some(due) {
            self.supply_timer = Some(due);
            cx.set_timer(SchedTimer::Supply, due - cx.now());
        }
    }

    /// Takes `cells` out of rollout: reserve destinations, reroute, switch.
    pub(super) fn start_switch(&mut self, cells: &[u32], cx: &mut Cx<'_, Self>) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let watermark = self.counters.watermark();
        let moves = match self.ledger.evacuate(cells) {
            Ok(m) => m,
            Err(e) => {
                self.refused(e.to_string());
                return;
            }
        };
        self.log.transitions.push(TransitionRecord {
            at: cx.now(),
            cells: cells.to_vec(),
            watermark,
            capacity_after: self.ledger.rollout_capacity(),
            supply: self.supply.value(),
            supply_since: self.supply.since(),
            displaced: moves.len(),
        });
        tracing::debug!(
            ?cells,
            watermark,
            displaced = moves.len(),
            "cells move to training"
        );
        for &c in cells {
            let switch = self.new_switch();
            self.switches[c as usize] = Some(switch);
            self.switch_began[c as usize] = cx.now();
            let mine: Vec<_> = moves.iter().filter(|m| m.from == c).collect();
            let reroutes = mine.iter().map(|m| (m.exec, m.to)).collect();
            let cell_moves = mine
                .iter()
                .filter_map(|m| {
                    Some(Move {
                        exec: m.exec,
                        dest: m.to,
                        dest_cell: peers.cell_of(m.to)?.into(),
                    })
                })
                .collect();
            let addr = peers.cells[c as usize];
            cx.send(
                peers.proxy,
                ProxyMsg::Reroute {
                    switch,
                    moves: reroutes,
                    notify: addr.into(),
                },
            );
            cx.send(
                addr,
                CellMsg::Switch {
                    switch,
                    moves: cell_moves,
                },
            );
        }
        if cells.len() > 1 || !matches!(self.cfg.policy, Policy::Elastic) {
            self.group = cells.iter().copied().collect();
            self.group_switched.clear();
        }
    }

    /// A cell's training memory is resident: it joins the core's batch.
    pub(super) fn on_switched(&mut self, cell: u32, switch: SwitchId, cx: &mut Cx<'_, Self>) {
        if !self.current(cell, switch) || self.ledger.role(cell) != Some(Role::ToTraining) {
            return; // superseded by a return
        }
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let burst = self.burst;
        let step = self.steps_done;
        if self.group.contains(&cell) {
            self.group_switched.insert(cell);
            self.activate_group(cx);
        } else if cell == 0 {
            cx.send(
                peers.core,
                CoreMsg::Activate {
                    step,
                    burst,
                    members: vec![(0, peers.cells[0].into())],
                },
            );
        } else {
            cx.send(
                peers.core,
                CoreMsg::Join {
                    cell,
                    addr: peers.cells[cell as usize].into(),
                    burst,
                },
            );
        }
    }

    /// An all-at-once switch whose every cell is resident activates the
    /// core with them.
    pub(super) fn activate_group(&mut self, cx: &mut Cx<'_, Self>) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        if self.group.is_empty() || self.group_switched.len() != self.group.len() {
            return;
        }
        let members = self
            .group
            .iter()
            .map(|c| (*c, peers.cells[*c as usize].into()))
            .collect();
        self.group.clear();
        self.group_switched.clear();
        cx.send(
            peers.core,
            CoreMsg::Activate {
                step: self.steps_done,
                burst: self.burst,
                members,
            },
        );
    }

    /// Sends `cell` back to rollout.
    pub(super) fn begin_return(&mut self, cell: u32, cx: &mut Cx<'_, Self>) {
        let Some(addr) = self.peers.as_ref().map(|p| p.cells[cell as usize]) else {
            return;
        };
        if let Err(e) = self.ledger.set_role(cell, Role::Returning) {
            self.refused(e.to_string());
            return;
        }
        self.group.remove(&cell);
        self.group_switched.remove(&cell);
        let switch = self.new_switch();
        self.switches[cell as usize] = Some(switch);
        self.switch_began[cell as usize] = cx.now();
        cx.send(
            addr,
            CellMsg::Return {
                switch,
                version: self.published,
            },
        );
    }
}
