//! The per-token path out of an engine worker: every output token goes to
//! a [`TokenTap`] in the step job that sampled it, so a client streaming the
//! call (the gateway) sees it while the batch is still decoding, not when the
//! call's answer has gone round the proxy.
//!
//! The tap is also how a retried call continues instead of starting over:
//! the proxy resends the same prompt after a role change, and the step job
//! that submits the new attempt asks the tap for the tokens the earlier
//! attempts produced and decodes after them. So the stream a client saw and
//! the output of the call are one sequence whatever number of engines it
//! took, each token with the log-prob of the engine that sampled it.
//!
//! Only jobs touch the tap (the worker's handlers never do): it is shared
//! memory written from the blocking pool, like the KV and weight boards. A
//! worker without a tap behaves exactly as before (the built-in task's runs
//! and their trace hash do not change).

use std::fmt::Debug;
use std::sync::Arc;

use gyre_actors::sched::ids::{CallId, EngineIx, Version};
use gyre_gpu::engine::{Engine, ReqId, Request};

/// Where sampled tokens go, per call.
pub trait TokenTap: Send + Sync + Debug {
    /// Output tokens of `call` its earlier attempts produced: a new attempt
    /// continues after them.
    fn resume(&self, call: CallId) -> Vec<u32>;
    /// `ids[i]`, with log-prob `logprobs[i]`, is output token `at + i` of
    /// `call`, sampled by `engine` serving `version`. Positions the tap has
    /// already seen are resent each step; it keeps the first of each.
    fn sampled(
        &self,
        call: CallId,
        at: usize,
        ids: &[u32],
        logprobs: &[f32],
        engine: EngineIx,
        version: Version,
    );
    /// `call`'s attempt on this engine ended (answered, aborted or
    /// cancelled): nothing more of it follows from here.
    fn finished(&self, _call: CallId) {}
}

/// What a step job needs to feed the tap: the tap, who is sampling, and
/// the requests already running with the output offset of each.
#[derive(Debug, Clone)]
pub struct Tapping {
    pub tap: Arc<dyn TokenTap>,
    pub engine: EngineIx,
    pub running: Vec<(ReqId, CallId, usize)>,
}

impl Tapping {
    /// Extends a new attempt's request by what earlier attempts produced;
    /// returns the output offset its own tokens start at.
    pub fn resume(&self, call: CallId, request: &mut Request) -> usize {
        let prior = self.tap.resume(call);
        let n = prior.len();
        if n > 0 {
            request.prompt.extend_from_slice(&prior);
            request.params.max_new_tokens = request
                .params
                .max_new_tokens
                .saturating_sub(n as u32)
                .max(1);
        }
        n
    }

    /// Sends what each running request has produced so far.
    pub fn progress(&self, engine: &Engine, requests: &[(ReqId, CallId, usize)]) {
        let version = engine.version();
        for &(req, call, at) in requests {
            if let Some((ids, logprobs)) = engine.progress(req) {
                self.tap
                    .sampled(call, at, ids, logprobs, self.engine, version);
            }
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// One streamed token: id, log-prob, the engine that sampled it.
    pub type Streamed = (u32, f32, EngineIx);

    /// A test double of the gateway's streams: the tokens of each call.
    #[derive(Debug, Default)]
    pub struct RecordingTap {
        pub calls: Mutex<BTreeMap<CallId, Vec<Streamed>>>,
    }

    impl TokenTap for RecordingTap {
        fn resume(&self, call: CallId) -> Vec<u32> {
            let calls = self.calls.lock().unwrap();
            calls
                .get(&call)
                .map(|t| t.iter().map(|x| x.0).collect())
                .unwrap_or_default()
        }

        fn sampled(
            &self,
            call: CallId,
            at: usize,
            ids: &[u32],
            logprobs: &[f32],
            engine: EngineIx,
            _version: Version,
        ) {
            let mut calls = self.calls.lock().unwrap();
            let seen = calls.entry(call).or_default();
            for (i, (id, lp)) in ids.iter().zip(logprobs).enumerate() {
                if at + i == seen.len() {
                    seen.push((*id, *lp, engine));
                }
            }
        }
    }
}
