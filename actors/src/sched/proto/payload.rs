//! What lies behind the payload handles ([`BlobId`]) of the scheduling-plane
//! protocols.
//!
//! Messages carry counts and handles only; the data sits in a
//! [`gyre_runtime::BlobStore`], bincode-encoded. The contract per handle:
//! - `HarnessEvent::ModelCall.prompt` / `ProxyMsg::Call.prompt` /
//!   `EngineReq::Serve.prompt`: a [`Prompt`], written by the harness. The
//!   harness releases it when the call is answered (a retry on another
//!   engine resends the same handle, so nobody else may free it).
//! - `CallEvent::Done.output` / `ExecMsg::Answer.output` /
//!   `HarnessReq::Answer.output` / `EvalJob.records` /
//!   `BufferMsg::Resolved.records` / `Sample.records`: a bincode-encoded
//!   [`TitoRecord`] of that call (SPEC 3.1), written by the engine, or by the
//!   gateway (`HarnessEvent::Recorded.record`, when the engine streams its
//!   tokens there and answers with `BlobId::NONE`). The
//!   recorded sample source releases each once inserted into its tree, or
//!   when the execution does not train.
//! - `MicroStep.rows` / `TrainerReq::FwdBwd.rows`: a [`MicroStepRows`],
//!   written by the packer; the trainer releases it after computing it.
//!
//! [`BlobId::NONE`] means "no payload": the simulator, which keeps counts
//! only, sends it everywhere.
//!
//! [`BlobId`]: gyre_runtime::BlobId
//! [`BlobId::NONE`]: gyre_runtime::BlobId::NONE
//! [`TitoRecord`]: crate::trajectory::TitoRecord

use serde::{Deserialize, Serialize};

pub use crate::trajectory::packing::MicroStepRows;
use crate::trajectory::tito::CallPurpose;

/// What a harness puts behind `HarnessEvent::ModelCall.prompt`: one model
/// call as the engine must serve it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    pub input_ids: Vec<u32>,
    /// Offsets into input_ids where each message ends (exclusive); may be empty.
    pub message_ends: Vec<u32>,
    pub max_new_tokens: u32,
    pub stop_tokens: Vec<u32>,
    pub temperature: f32,
    pub top_p: f32,
    /// TITO metadata copied into the record (see trajectory::TitoRecord).
    pub thread: Option<String>,
    pub parent_call: Option<String>,
    pub role: Option<String>,
    pub purpose: CallPurpose,
}

impl Prompt {
    /// A main-agent policy call over one message, sampled at temperature
    /// 1 over the whole distribution with no stop tokens (tests, benches).
    pub fn main_turn(input_ids: Vec<u32>, max_new_tokens: u32) -> Self {
        Prompt {
            message_ends: vec![input_ids.len() as u32],
            input_ids,
            max_new_tokens,
            stop_tokens: Vec::new(),
            temperature: 1.0,
            top_p: 1.0,
            thread: Some("main".into()),
            parent_call: None,
            role: Some("main".into()),
            purpose: CallPurpose::Policy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_runtime::{MemBlobs, get_decoded, put_encoded};

    #[test]
    fn a_prompt_survives_the_store() {
        let store = MemBlobs::new();
        let p = Prompt {
            input_ids: vec![1, 2, 3],
            message_ends: vec![2, 3],
            max_new_tokens: 16,
            stop_tokens: vec![0],
            temperature: 0.7,
            top_p: 0.9,
            thread: Some("main".into()),
            parent_call: None,
            role: Some("sub-agent".into()),
            purpose: CallPurpose::Critique,
        };
        let id = put_encoded(&store, &p).unwrap();
        assert_eq!(get_decoded::<Prompt>(&store, id).unwrap(), p);
    }
}
