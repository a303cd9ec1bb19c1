//! The trajectory buffer's messages: results from the evaluator, requests
//! from the packer.

use gyre_runtime::{BlobId, Recipient};
use serde::{Deserialize, Serialize};

use crate::sched::ids::{ExecId, GroupId, Version};
use crate::sched::msg::packer::PackerMsg;
use crate::trajectory::scoring::Outcome;

#[derive(Debug, Serialize, Deserialize)]
pub enum BufferMsg {
    /// The stream packer asks to hear about ready groups.
    Subscribe { packer: Recipient<PackerMsg> },
    /// An evaluation failed and will be retried: one more failed attempt.
    Pending {
        exec: ExecId,
        group: GroupId,
        v_d: Version,
    },
    /// The evaluator's result for one execution; `tokens` are the output
    /// tokens the policy sampled (what a count-only source trains).
    Resolved {
        exec: ExecId,
        group: GroupId,
        v_d: Version,
        outcome: Outcome,
        tokens: u64,
        /// The execution's TITO record handles, kept with its sample.
        records: Vec<BlobId>,
    },
    /// Hand a ready group to the packer.
    Take {
        group: GroupId,
        reply_to: Recipient<PackerMsg>,
    },
}
