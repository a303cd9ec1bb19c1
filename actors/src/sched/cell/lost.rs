//! A cell whose node was lost, and how it rejoins.
//!
//! The scheduler took the cell out of the ledger when it heard the node was
//! down (a crash, or a partition the host cannot tell from one), so nothing
//! the cell was doing counts any more: its executions were moved, its share
//! of a batch went back to the queue. The cell forgets its outstanding
//! backend requests and runs its return to rollout (release training
//! memory, restore rollout memory, load the published weights; the pool
//! only loads), resent until the node answers. A restarted node answers
//! with fresh backends, a healed one with the ones it had; either way the
//! first `Loaded` is the node being back, and the cell reports `Returned`
//! under the rejoin's switch id. Until then, messages of the abandoned
//! phase (a late grant, a hand-over's acknowledgement) are counted and
//! ignored.
//!
//! Cell 0 on the training side is not taken out when its node (the core's)
//! goes down: the core restores instead, and the cell only hears that its
//! backends were lost (`CellMsg::BackendsLost`). A restarted node's device
//! memory holds rollout memory again, so a switch to training in progress
//! starts over (unload, release rollout memory, restore training memory),
//! each request resent until the node answers; every step is idempotent, so
//! a node that only was cut off answers them at once.
//!
//! Without resends (`SchedConfig::rejoin_notices`, a live cluster's
//! setting), the node is found again only when its host says it is back
//! (`CellMsg::NodeBack`, from the scheduler's `SchedMsg::NodeBack`): the
//! cell then resends what it had asked there. Cell 0 lost after its switch
//! to training had completed also makes the switch again on the fresh
//! backends (`Resync`: unload, release rollout memory, restore training
//! memory), holding a batch the core sends meanwhile, and a return to
//! rollout the scheduler asks for meanwhile, until it is done (a return
//! begun under it would release training memory while the resync
//! restores it, and each would take the other's answer for its own); a
//! resync a second loss interrupts starts over.

use gyre_runtime::{Cx, NodeId};

use super::{Cell, Phase, Stage};
use crate::sched::ids::{Step, SwitchId, Version};
use crate::sched::proto::engine::EngineReq;
use crate::sched::proto::memory::{MemRole, MemoryReq};
use crate::sched::proto::transfer::Segment;
use crate::sched::retry::{ReqKey, Resend};

/// Cell 0 switching its restarted backends to training again.
#[derive(Debug, Default)]
pub(super) struct Resync {
    /// Lost on the training side; done at the node's `NodeBack`.
    needed: bool,
    /// The stage under way (unload, free rollout memory, restore training
    /// memory).
    stage: Option<Stage>,
    /// A batch the core sent meanwhile, started once done.
    stashed: Option<(Step, Option<Segment>)>,
}

impl Resync {
    pub(super) fn busy(&self) -> bool {
        self.stage.is_some()
    }

    pub(super) fn stash(&mut self, step: Step, snapshot: Option<Segment>) {
        self.stashed = Some((step, snapshot));
    }
}

impl Cell {
    pub(super) fn on_lost(&mut self, switch: SwitchId, version: Version, cx: &mut Cx<'_, Self>) {
        self.stats.losses += 1;
        self.rejoining = true;
        self.backends_down = !self.outbox.resends();
        self.abandoned = self.training_step().or(self.abandoned);
        self.rejoined_as = Some(switch);
        self.pending_return = None;
        self.version = self.version.max(version);
        // Reads of another cell's KV hand-over go to the transfer engine,
        // not this node, and their source waits for the acknowledgement.
        for key in self.outbox.pending() {
            if !matches!(key, ReqKey::ReadKv(..)) {
                self.outbox.forget(&key);
            }
        }
        if self.index.is_some() {
            self.begin_return(switch, cx);
        } else {
            self.phase = Phase::Returning {
                switch,
                stage: Stage::Loading,
            };
            let reply_to = cx.recipient();
            let req = EngineReq::Load {
                version: self.version,
                reply_to,
            };
            self.request(Resend::Engine(self.links.engine, req), cx);
        }
    }

    /// Its host says `node` runs again (a restarted node agent, with the
    /// backends at the addresses they had): what was asked of the lost
    /// process is asked again. Only with `rejoin_notices`, where nothing
    /// is resent on a timer.
    pub(super) fn on_node_back(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        self.backends_down = false;
        let resync = std::mem::take(&mut self.resync.needed)
            && matches!(
                self.phase,
                Phase::Ready { .. } | Phase::Syncing { .. } | Phase::Training(_)
            );
        // A resync the node's loss interrupted starts over below: its
        // steps are not resent (a restore of training memory would reach
        // fresh backends that hold rollout memory).
        if resync && self.resync.stage.take().is_some() {
            for key in [
                ReqKey::Unload,
                ReqKey::Release(MemRole::Rollout),
                ReqKey::Restore(MemRole::Training),
            ] {
                self.outbox.forget(&key);
            }
        }
        let sent = self.outbox.resend_to(node, cx);
        tracing::info!(cell = ?self.index, %node, sent, "backends' node back; requests resent");
        if resync {
            tracing::info!(cell = ?self.index, "fresh backends: switching them to training again");
            self.resync.stage = Some(Stage::Unloading);
            let reply_to = cx.recipient();
            let req = EngineReq::Unload { reply_to };
            self.request(Resend::Engine(self.links.engine, req), cx);
        }
    }

    /// One step of a resync is answered: the next, or back to training
    /// (with the batch the core sent meanwhile).
    pub(super) fn resynced(&mut self, cx: &mut Cx<'_, Self>) {
        let role = match self.resync.stage {
            Some(Stage::Unloading) => {
                self.resync.stage = Some(Stage::FreeingRollout);
                Some((MemRole::Rollout, false))
            }
            Some(Stage::FreeingRollout) => {
                self.resync.stage = Some(Stage::RestoringTraining);
                Some((MemRole::Training, true))
            }
            _ => None,
        };
        match role {
            Some((role, true)) => {
                self.memory(|reply_to| MemoryReq::Restore { role, reply_to }, cx);
            }
            Some((role, false)) => {
                self.memory(|reply_to| MemoryReq::Release { role, reply_to }, cx);
            }
            None => {
                self.resync.stage = None;
                tracing::info!(cell = ?self.index, "backends in training again");
                if let Some((step, snapshot)) = self.resync.stashed.take() {
                    self.on_batch(step, snapshot, cx);
                }
                self.apply_pending_return(cx);
            }
        }
    }

    /// The rejoin is complete: the engine serves again.
    pub(super) fn rejoined(&mut self) {
        self.rejoining = false;
    }

    /// Its backends' node went down (see the module's note).
    pub(super) fn on_backends_lost(&mut self, cx: &mut Cx<'_, Self>) {
        // Already switched: only a host that says the node is back (with
        // fresh backends) has the switch made again.
        self.resync.needed = !matches!(self.phase, Phase::Switching { .. });
        let Phase::Switching { switch, .. } = self.phase else {
            return;
        };
        for key in [
            ReqKey::Unload,
            ReqKey::Release(MemRole::Rollout),
            ReqKey::Restore(MemRole::Training),
        ] {
            self.outbox.forget(&key);
        }
        self.phase = Phase::Switching {
            switch,
            stage: Stage::Unloading,
        };
        let reply_to = cx.recipient();
        let req = EngineReq::Unload { reply_to };
        self.request(Resend::Engine(self.links.engine, req), cx);
    }
}
