//! Lost nodes: a rollout cell, a satellite or the pool's engine dies.
//!
//! With `SchedConfig::watch_nodes` the scheduler watches the nodes of every
//! cell's backends but the core's (cell 0's trainer is the core: its loss
//! is a checkpoint/resume, not handled here) and of the pool's engine. A
//! node it hears is down (a crash, or a partition it cannot tell from one)
//! is taken out of the ledger at once, whatever the cell was doing:
//! - its capacity leaves C_R (role `Lost`), so the launch rule and the
//!   watermark rules (2) and (3) use the capacity that is left;
//! - each execution placed on it moves to the preferred engine with a
//!   free slot, or waits unplaced until one frees (counted as running);
//!   the proxy gives up the attempts served there and tries each call
//!   again from its prompt on the new route (the KV cache is recomputed,
//!   counted as `lost_attempts`), so the harness only sees a slower answer;
//! - a satellite on the training side leaves the batch: the core cuts the
//!   prefix below it and returns the cut members' grants to the queue; the
//!   cut survivors above it go back to rollout;
//! - the cell rejoins by returning to rollout (see `cell::lost`); its
//!   `Returned` under the rejoin's switch puts its slots back.
//!
//! With checkpoints on as well (`SchedConfig::checkpoint_every`), cell 0's
//! nodes are watched too: their loss is the core's (its trainer holds the
//! weights and optimizer state). The satellites on the training side go
//! back to rollout (their weights and gradients belong to a history the
//! core may roll back) and the core restores (see `core::restore`).

use gyre_runtime::{Cx, NodeId};

use super::{LossRecord, Scheduler};
use crate::sched::cell::CellMsg;
use crate::sched::core::CoreMsg;
use crate::sched::ids::{EngineIx, SwitchId};
use crate::sched::maths::Role;
use crate::sched::proxy::ProxyMsg;

impl Scheduler {
    /// The nodes a loss of which the scheduler handles, with what is there.
    fn watched(&self) -> Vec<(NodeId, EngineIx)> {
        let b = &self.backends;
        let mut out = Vec::new();
        for c in 1..self.cfg.cells as usize {
            let mut nodes = vec![b.engines[c].id().node];
            nodes.push(b.trainers[c].id().node);
            nodes.push(b.memories[c].id().node);
            for n in nodes {
                out.push((n, EngineIx::Cell(c as u32)));
            }
        }
        if let Some(p) = b.pool_engine {
            out.push((p.id().node, EngineIx::Pool));
        }
        out.sort();
        out.dedup();
        out
    }

    /// Cell 0's nodes, when the core restores from checkpoints after losing
    /// them (empty otherwise).
    fn core_nodes(&self) -> Vec<NodeId> {
        if !self.cfg.watch_nodes || self.cfg.checkpoint_every.is_none() {
            return Vec::new();
        }
        let b = &self.backends;
        let mut nodes = vec![
            b.engines[0].id().node,
            b.trainers[0].id().node,
            b.memories[0].id().node,
        ];
        nodes.sort();
        nodes.dedup();
        nodes
    }

    pub(super) fn watch_backends(&mut self, cx: &mut Cx<'_, Self>) {
        if !self.cfg.watch_nodes {
            return;
        }
        let sched = cx.me().id().node;
        let mut nodes: Vec<NodeId> = self.watched().into_iter().map(|(n, _)| n).collect();
        nodes.extend(self.core_nodes());
        nodes.sort();
        nodes.dedup();
        for n in nodes.into_iter().filter(|n| *n != sched) {
            cx.watch_node(n);
        }
    }

    pub(super) fn on_node_down(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        if !self.cfg.watch_nodes {
            return;
        }
        let lost: Vec<EngineIx> = self
            .watched()
            .into_iter()
            .filter(|(n, _)| *n == node)
            .map(|(_, e)| e)
            .collect();
        for engine in lost {
            self.lose(engine, cx);
        }
        if self.core_nodes().contains(&node) {
            self.core_lost(cx);
        }
        self.launch(cx);
        self.try_transition(cx);
    }

    fn lose(&mut self, engine: EngineIx, cx: &mut Cx<'_, Self>) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let role = match engine {
            EngineIx::Cell(c) => self.ledger.role(c),
            EngineIx::Pool => None,
        };
        let Some(moves) = self.ledger.lose(engine) else {
            self.lost_again(engine, cx);
            return;
        };
        let switch = self.new_switch();
        let unplaced = moves.iter().filter(|(_, to)| to.is_none()).count();
        self.log.losses.push(LossRecord {
            at: cx.now(),
            burst: self.burst,
            engine,
            role,
            displaced: moves.len(),
            unplaced,
            rejoined_at: None,
        });
        tracing::warn!(
            ?engine,
            ?role,
            displaced = moves.len(),
            unplaced,
            "node lost"
        );
        cx.send(peers.proxy, ProxyMsg::EngineLost { engine, moves });
        let version = self.published;
        let EngineIx::Cell(cell) = engine else {
            self.pool_switch = Some(switch);
            if let Some(pool) = peers.pool {
                cx.send(pool, CellMsg::Lost { switch, version });
            }
            return;
        };
        self.switches[cell as usize] = Some(switch);
        cx.send(
            peers.cells[cell as usize],
            CellMsg::Lost { switch, version },
        );
        if role.is_some_and(Role::is_training_side) {
            cx.send(
                peers.core,
                CoreMsg::MemberLost {
                    cell,
                    queue: peers.queue.into(),
                },
            );
            // The survivors above it are cut from the prefix: back to rollout.
            for c in cell + 1..self.cfg.cells {
                if self.ledger.role(c).is_some_and(Role::is_training_side) {
                    self.begin_return(c, cx);
                }
            }
        }
        // An all-at-once switch goes on with the cells below the lost one.
        let had_group = !self.group.is_empty();
        self.group.retain(|c| *c < cell);
        self.group_switched.retain(|c| *c < cell);
        if had_group {
            self.activate_group(cx);
        }
    }

    /// A lost engine's node went down again while it rejoined (a restart
    /// that died, or was cut off, before the rejoin was through): the
    /// rejoin starts over under a new switch, so that an answer the dying
    /// process sent for the old one (a `Loaded` on its way) does not put
    /// back slots whose node is gone.
    fn lost_again(&mut self, engine: EngineIx, cx: &mut Cx<'_, Self>) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let to = match engine {
            EngineIx::Cell(c) if self.ledger.role(c) == Some(Role::Lost) => peers.cells[c as usize],
            EngineIx::Pool if self.pool_switch.is_some() => match peers.pool {
                Some(p) => p,
                None => return,
            },
            _ => return,
        };
        let switch = self.new_switch();
        match engine {
            EngineIx::Cell(c) => self.switches[c as usize] = Some(switch),
            EngineIx::Pool => self.pool_switch = Some(switch),
        }
        tracing::warn!(?engine, "lost again while it rejoined");
        let version = self.published;
        cx.send(to, CellMsg::Lost { switch, version });
    }

    /// The core's node is down: the satellites return to rollout and the
    /// core restores its trainer.
    fn core_lost(&mut self, cx: &mut Cx<'_, Self>) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        tracing::warn!(role = ?self.ledger.role(0), "the core's node lost");
        self.log.core_losses.push((cx.now(), self.burst));
        // Serving or on its way back to serving, cell 0 is a rollout cell
        // lost like any other (and, rejoining, lost again): its return
        // starts over under a new switch, so a `Loaded` the dying process
        // sent does not count.
        if matches!(
            self.ledger.role(0),
            Some(Role::Rollout | Role::Returning | Role::Lost)
        ) {
            self.lose(EngineIx::Cell(0), cx);
        } else {
            // On the training side, its backends' state may be gone. Its
            // executions moved at the switch, but attempts the engine had
            // not yet answered would be resent to it for ever, and a
            // restarted engine serves them, mid-switch: the proxy gives
            // them up and tries them again on their routes.
            cx.send(peers.cells[0], CellMsg::BackendsLost);
            cx.send(
                peers.proxy,
                ProxyMsg::EngineLost {
                    engine: EngineIx::Cell(0),
                    moves: Vec::new(),
                },
            );
        }
        let had_group = !self.group.is_empty();
        for c in 1..self.cfg.cells {
            if self.ledger.role(c).is_some_and(Role::is_training_side) {
                self.begin_return(c, cx);
            }
        }
        cx.send(
            peers.core,
            CoreMsg::MemberLost {
                cell: 0,
                queue: peers.queue.into(),
            },
        );
        // An all-at-once switch goes on with cell 0 alone: if it had
        // switched already, nothing else would activate the core (which
        // holds the activation until its restore is over).
        if had_group {
            self.activate_group(cx);
        }
    }

    /// The host says `node` runs again (`SchedMsg::NodeBack`): the cells
    /// lost with it resend their return to rollout there; its `Returned`
    /// under the rejoin's switch then puts the slots back.
    pub(super) fn on_node_back(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        for (n, engine) in self.watched() {
            if n != node {
                continue;
            }
            let lost = match engine {
                EngineIx::Cell(c) => self.ledger.role(c) == Some(Role::Lost),
                EngineIx::Pool => self.pool_switch.is_some(),
            };
            if !lost {
                continue;
            }
            tracing::info!(?engine, %node, "lost node back");
            let to = match engine {
                EngineIx::Cell(c) => peers.cells[c as usize],
                EngineIx::Pool => match peers.pool {
                    Some(p) => p,
                    None => continue,
                },
            };
            cx.send(to, CellMsg::NodeBack { node });
        }
        // The core's node (with checkpoints): the core resends its
        // restore, cell 0 its switch or return.
        if self.core_nodes().contains(&node) {
            tracing::info!(%node, "the core's node back");
            cx.send(peers.cells[0], CellMsg::NodeBack { node });
            cx.send(peers.core, CoreMsg::NodeBack { node });
        }
    }

    /// A lost cell (`Some`) or the pool (`None`) reports its rejoin.
    pub(super) fn rejoined(&mut self, cell: Option<u32>, switch: SwitchId, cx: &mut Cx<'_, Self>) {
        let engine = match cell {
            Some(c) if self.current(c, switch) => EngineIx::Cell(c),
            None if self.pool_switch == Some(switch) => EngineIx::Pool,
            _ => return,
        };
        if !self.ledger.rejoin(engine) {
            return;
        }
        if engine == EngineIx::Pool {
            self.pool_switch = None;
        }
        if let Some(r) = self
            .log
            .losses
            .iter_mut()
            .rev()
            .find(|r| r.engine == engine && r.rejoined_at.is_none())
        {
            r.rejoined_at = Some(cx.now());
        }
        tracing::info!(?engine, "node rejoined");
        self.launch(cx);
        self.try_transition(cx);
    }

    /// Places executions a lost engine left without a slot, as slots free.
    pub(super) fn place_unplaced(&mut self, cx: &mut Cx<'_, Self>) {
        if self.ledger.unplaced() == 0 {
            return;
        }
        let Some(proxy) = self.peers.as_ref().map(|p| p.proxy) else {
            return;
        };
        for (exec, engine) in self.ledger.place_unplaced() {
            cx.send(proxy, ProxyMsg::Route { exec, engine });
        }
    }
}
