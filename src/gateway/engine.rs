//! The narrow engine interface the gateway drives: prompt token ids and
//! sampling parameters in, a cancellable stream of output token ids with
//! their behaviour log-probs and a finish reason out.
//!
//! Everything about text (templates, tokenisers, tool-call formats) stays in
//! the gateway, so every engine behind it is recorded the same way. This is
//! the shape of a model call into the proxy-router actor: an implementation
//! that forwards `start` as a routed model call (and its events back) plugs
//! the gateway into the scheduling plane without touching the HTTP side.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Sampling parameters as the APIs give them; engines ignore what they lack.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingParams {
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub seed: Option<u64>,
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub execution: String,
    pub call_id: String,
    /// Calls this execution made before this one (0 for the first).
    pub call_index: u64,
    /// The context: the call's prompt, then (on a retry after a reroute or
    /// an engine failure) the output tokens already produced.
    pub prompt: Arc<[u32]>,
    /// How many trailing prompt tokens are that output so far (0 at first).
    pub resumed: usize,
    pub params: SamplingParams,
}

/// Why generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineFinish {
    /// The engine produced its end-of-turn token (included in the output).
    EndOfTurn,
    /// `max_tokens` reached.
    Length,
    /// The engine failed mid-way; the tokens already sent stay valid.
    Failed(String),
}

/// What an engine sends back, in order: tokens, then exactly one finish.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    Token {
        id: u32,
        logprob: f32,
    },
    Finish(EngineFinish),
    /// Who sampled the tokens that follow, for an engine that is several
    /// (the scheduling plane's cells and pool): the record names the
    /// engine and version of the first. Without it the record takes
    /// [`Engine::name`] and [`Engine::policy_version`].
    Served {
        engine: String,
        version: u64,
    },
}

/// A running generation. Dropping it or cancelling stops the engine.
pub struct Generation {
    pub events: mpsc::Receiver<EngineEvent>,
    pub cancel: CancellationToken,
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the engine is unavailable: {0}")]
    Unavailable(String),
    #[error("the request does not suit the engine: {0}")]
    Rejected(String),
}

/// An engine as the gateway sees it.
pub trait Engine: Send + Sync + 'static {
    /// Recorded as the record's `engine`.
    fn name(&self) -> &str;
    /// Policy version of the weights serving calls now.
    fn policy_version(&self) -> u64;
    /// Longest prompt plus output the engine takes, in tokens.
    fn context_window(&self) -> usize;
    /// Starts generating; tokens arrive as the engine produces them.
    fn start(&self, request: GenerateRequest) -> Result<Generation, EngineError>;
    /// Prompt tokens the engine computed vs took from its prefix cache,
    /// for engines that keep one.
    fn prefill_stats(&self) -> Option<PrefillStats> {
        None
    }
}

/// Totals since the engine started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillStats {
    pub prefilled: u64,
    pub reused: u64,
}

/// Hears every record once it is durable (the scheduling plane takes the
/// gateway's records for training through one).
pub trait RecordSink: Send + Sync + 'static {
    fn committed(&self, record: &gyre_actors::trajectory::TitoRecord);
}
