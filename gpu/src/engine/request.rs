//! What a caller asks of the engine and what it gets back: exact token ids
//! and, for every sampled token, its log-probability under the serving
//! weights (TITO, SPEC 3.1).

use serde::{Deserialize, Serialize};

/// An engine-local request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ReqId(pub u64);

/// Per-request sampling. The recorded log-probabilities are those of the
/// model's own distribution (temperature 1, no nucleus cut); they are the
/// behaviour probabilities of training only for requests sampled at
/// temperature 1 and top-p 1, which is how rollouts sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 picks the most likely token.
    pub temperature: f32,
    /// Nucleus: keep the smallest set of tokens whose probability reaches
    /// this mass.
    pub top_p: f32,
    pub max_new_tokens: u32,
    /// Sampling one of these ends the request; the token is part of the
    /// output.
    pub stop_tokens: Vec<u32>,
    /// With the position of the token, fixes every random draw: the same
    /// request on any engine instance samples the same tokens, and a
    /// request resumed elsewhere continues the same stream.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 16,
            stop_tokens: Vec::new(),
            seed: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    /// Sampled a stop token (the last output token).
    Stop,
    /// Reached `max_new_tokens` or the context length.
    Length,
    /// Aborted by the caller; the output is what was generated so far.
    Aborted,
}

/// A finished (or aborted) request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub id: ReqId,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    /// log π(token | context) of each output token under the weights that
    /// sampled it.
    pub logprobs: Vec<f32>,
    pub finish: FinishReason,
    /// Weight versions that served the first and the last output token
    /// (equal unless weights were updated mid-request).
    pub versions: (u64, u64),
}
