//! The destination side of a KV-cache migration (SPEC 2.5 step 4): read the
//! pinned blocks of an execution that moves here with a one-sided read
//! through the transfer engine, give them to the local engine so the retried
//! call reuses the prefix instead of recomputing it, and acknowledge, which
//! lets the source release its pins. A destination always acknowledges, so
//! a source never waits forever, even if this cell has since left rollout
//! (then the blocks are simply not adopted).

use gyre_runtime::{Cx, Recipient};

use super::{Cell, CellMsg, Phase};
use crate::sched::ids::{ExecId, SwitchId};
use crate::sched::proto::engine::{EngineReq, KvBlocks};
use crate::sched::proto::transfer::{ReadTag, TransferReq};
use crate::sched::retry::Resend;

impl Cell {
    /// A source warns that `exec`'s blocks follow: the engine holds the
    /// execution's retried call for them (see `drain::announce`). A cell
    /// out of rollout has no engine serving and ignores it.
    pub(super) fn on_kv_coming(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        if matches!(self.phase, Phase::Rollout) {
            cx.send(self.links.engine, EngineReq::ExpectKv { exec });
        }
    }

    pub(super) fn on_take_over(
        &mut self,
        switch: SwitchId,
        kv: KvBlocks,
        source: Recipient<CellMsg>,
        cx: &mut Cx<'_, Self>,
    ) {
        let reply_to = cx.recipient();
        let transfer = self.links.transfer;
        self.request(
            Resend::Transfer(
                transfer,
                TransferReq::Read {
                    tag: ReadTag::Kv {
                        switch,
                        exec: kv.exec,
                        tokens: kv.tokens,
                        source,
                    },
                    bytes: kv.tokens.saturating_mul(self.kv_bytes_per_token),
                    reply_to,
                },
            ),
            cx,
        );
    }

    pub(super) fn on_read_done(&mut self, tag: ReadTag, cx: &mut Cx<'_, Self>) {
        match tag {
            ReadTag::Kv {
                switch,
                exec,
                tokens,
                source,
            } => {
                if matches!(self.phase, Phase::Rollout) {
                    cx.send(self.links.engine, EngineReq::AdoptKv { exec, tokens });
                    self.stats.kv_taken += 1;
                }
                cx.send(source, CellMsg::TakenOver { switch, exec });
            }
            ReadTag::Snapshot { step, version } => self.snapshot_read(step, version, cx),
        }
    }
}
