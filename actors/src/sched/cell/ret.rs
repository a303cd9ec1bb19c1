//! Training → rollout: release training memory, restore rollout memory,
//! load the published weights, serve again. A return that arrives while the
//! cell is still switching in or computing its share of a batch waits until
//! the cell is idle, so a batch's members always finish what they claimed.

use gyre_runtime::Cx;

use super::{Cell, Phase, Stage};
use crate::sched::ids::{SwitchId, Version};
use crate::sched::proto::memory::{MemRole, MemoryReq};
use crate::sched::retry::Resend;

impl Cell {
    pub(super) fn on_return(&mut self, switch: SwitchId, version: Version, cx: &mut Cx<'_, Self>) {
        self.version = self.version.max(version);
        match self.phase {
            _ if self.index.is_none() => self.unexpected("return of the standalone pool"),
            Phase::Rollout | Phase::Returning { .. } => self.unexpected("return"),
            // A resync of fresh backends under way finishes first: its
            // memory answers and the return's would be taken for each
            // other (see `lost`).
            Phase::Ready { .. } if !self.resync.busy() => self.begin_return(switch, cx),
            _ => self.pending_return = Some((switch, version)),
        }
    }

    pub(super) fn apply_pending_return(&mut self, cx: &mut Cx<'_, Self>) {
        if matches!(self.phase, Phase::Ready { .. })
            && let Some((switch, _)) = self.pending_return.take()
        {
            self.begin_return(switch, cx);
        }
    }

    pub(super) fn begin_return(&mut self, switch: SwitchId, cx: &mut Cx<'_, Self>) {
        self.phase = Phase::Returning {
            switch,
            stage: Stage::FreeingTraining,
        };
        let reply_to = cx.recipient();
        match self.links.memory {
            Some(port) => {
                let req = MemoryReq::Release {
                    role: MemRole::Training,
                    reply_to,
                };
                self.request(Resend::Memory(port, req), cx);
            }
            None => self.unexpected("memory without a device"),
        }
    }
}
