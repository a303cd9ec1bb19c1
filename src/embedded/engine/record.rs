//! What the engine writes behind `CallEvent::Done.output`: the call's TITO
//! record, and the sampling parameters a call's prompt asks for.
//!
//! The sampling seed comes from the call's identity alone (never the
//! attempt or the engine), so a call retried elsewhere after a role change
//! draws exactly the same token stream it would have drawn where it began.

use std::sync::Arc;

use gyre_actors::sched::ids::{CallId, EngineIx, Version};
use gyre_actors::sched::proto::engine::CallEvent;
use gyre_actors::sched::proto::payload::Prompt;
use gyre_actors::trajectory::TitoRecord;
use gyre_gpu::engine::{Request, SamplingParams};
use gyre_runtime::rng::mix64;
use gyre_runtime::{Actor, BlobId, BlobStore, Cx, IoError, Nanos, PayloadWrite};

use super::CallKey;

/// The seed of every draw of `call`, under a run's `base` seed.
pub fn call_seed(base: u64, call: CallId) -> u64 {
    mix64(base ^ mix64(call.exec.0 ^ mix64(u64::from(call.seq).wrapping_add(0x5eed))))
}

/// The engine request a prompt stands for.
pub fn request(prompt: &Prompt, seed: u64) -> Request {
    Request {
        prompt: prompt.input_ids.clone(),
        params: SamplingParams {
            temperature: prompt.temperature,
            top_p: prompt.top_p,
            max_new_tokens: prompt.max_new_tokens,
            stop_tokens: prompt.stop_tokens.clone(),
            seed,
        },
    }
}

/// The engine's name in records.
pub fn engine_name(ix: EngineIx) -> String {
    format!("{ix:?}")
}

/// What a record needs besides the prompt and the output.
#[derive(Clone, Debug)]
pub struct Served {
    pub call: CallId,
    pub engine: EngineIx,
    pub version: Version,
    pub start_ns: Nanos,
    pub end_ns: Nanos,
}

/// The record of a served call. `prompt` is `None` when the prompt could
/// not be read: the record then has no input and fails validation, so no
/// consumer ever trains on it.
pub fn tito(
    served: &Served,
    prompt: Option<&Prompt>,
    output_ids: Vec<u32>,
    output_logprobs: Vec<f32>,
) -> TitoRecord {
    TitoRecord {
        execution: served.call.exec.0.to_string(),
        call_id: served.call.seq.to_string(),
        thread: prompt.and_then(|p| p.thread.clone()),
        parent_call: prompt.and_then(|p| p.parent_call.clone()),
        role: prompt.and_then(|p| p.role.clone()),
        purpose: prompt.map(|p| p.purpose).unwrap_or_default(),
        policy_version: served.version,
        engine: Some(engine_name(served.engine)),
        start_ns: served.start_ns,
        end_ns: served.end_ns.max(served.start_ns),
        input_ids: prompt.map(|p| p.input_ids.clone()).unwrap_or_default(),
        input_message_ends: prompt.map(|p| p.message_ends.clone()).unwrap_or_default(),
        output_ids,
        output_logprobs,
        output_sources: Vec::new(),
    }
}

/// Writes `rec` as a payload; `written` turns the handle (or the failure)
/// into the actor's message, which answers the call with [`done`].
pub fn write<A: Actor>(
    cx: &mut Cx<'_, A>,
    blobs: Arc<dyn BlobStore>,
    rec: &TitoRecord,
    written: impl FnOnce(Result<BlobId, IoError>) -> A::Msg + Send + 'static,
) {
    match PayloadWrite::encoded(blobs, rec) {
        Ok(write) => cx.io(write, written),
        Err(e) => cx.send_self(written(Err(IoError::Failed(e.to_string())))),
    }
}

/// A call's `Done` once its record is written; a record that could not be
/// written still answers the call, without a payload, and counts in
/// `errors`.
pub fn done(
    key: CallKey,
    output_tokens: u64,
    version: Version,
    output: Result<BlobId, IoError>,
    errors: &mut u64,
) -> CallEvent {
    let output = output.unwrap_or_else(|e| {
        tracing::error!(call = ?key.call, error = %e, "record not written");
        *errors += 1;
        BlobId::NONE
    });
    CallEvent::Done {
        call: key.call,
        attempt: key.attempt,
        output_tokens,
        version,
        output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_actors::sched::ids::ExecId;
    use gyre_actors::trajectory::CallPurpose;

    fn call(exec: u64, seq: u32) -> CallId {
        CallId {
            exec: ExecId(exec),
            seq,
        }
    }

    #[test]
    fn seeds_depend_on_the_call_and_the_base_only() {
        let a = call_seed(1, call(3, 2));
        assert_eq!(a, call_seed(1, call(3, 2)));
        assert_ne!(a, call_seed(2, call(3, 2)));
        assert_ne!(a, call_seed(1, call(2, 3)));
        assert_ne!(a, call_seed(1, call(3, 3)));
    }

    #[test]
    fn a_record_carries_the_prompt_and_validates() {
        let prompt = Prompt {
            input_ids: vec![1, 2, 3],
            message_ends: vec![1, 3],
            max_new_tokens: 4,
            stop_tokens: vec![],
            temperature: 1.0,
            top_p: 1.0,
            thread: Some("main".into()),
            parent_call: Some("0".into()),
            role: Some("main".into()),
            purpose: CallPurpose::Critique,
        };
        let served = Served {
            call: call(7, 1),
            engine: EngineIx::Cell(2),
            version: 5,
            start_ns: 10,
            end_ns: 30,
        };
        let r = tito(&served, Some(&prompt), vec![4, 5], vec![-0.5, -1.0]);
        r.validate().unwrap();
        assert_eq!((r.execution.as_str(), r.call_id.as_str()), ("7", "1"));
        assert_eq!(r.engine.as_deref(), Some("cell2"));
        assert_eq!(r.input_message_ends, vec![1, 3]);
        assert_eq!(r.purpose, CallPurpose::Critique);
        assert_eq!(r.policy_version, 5);
        let req = request(&prompt, 9);
        assert_eq!(req.prompt, vec![1, 2, 3]);
        assert_eq!((req.params.max_new_tokens, req.params.seed), (4, 9));
        // Without a prompt the record is kept (it owns a blob) but unusable.
        assert!(tito(&served, None, vec![], vec![]).validate().is_err());
    }
}
