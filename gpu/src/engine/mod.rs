//! The embedded inference engine: the live counterpart of the engine
//! protocol, as a plain struct that an actor adapter drives.
//!
//! Continuous batching: every [`Engine::step`] admits waiting requests whose
//! KV blocks fit, then runs one ragged batch holding each running request's
//! uncached tokens (a whole or chunked prompt for a new request, one token
//! for a decoding one), samples where a request's context is complete, and
//! returns the requests that finished. Blocks for a request's whole budget
//! (prompt plus `max_new_tokens`, capped by the context) are taken at
//! admission, so a running request never stalls for memory.
//!
//! A request's state is just its tokens and how many of them are cached;
//! the uncached ones are recomputed. That one rule covers prefill, decode,
//! resuming from imported KV blocks and recomputing after a weight update.

mod error;
pub mod kv;
mod lifecycle;
mod migrate;
mod prefix;
pub mod request;
pub mod sampler;

use std::collections::{BTreeMap, VecDeque};

pub use error::EngineError;
pub use kv::{BlockPool, KvGeometry, KvSnapshot, Rows};
pub use lifecycle::{Health, Load, MemTag};
pub use migrate::PinId;
pub use request::{Completion, FinishReason, ReqId, Request, SamplingParams};

use crate::memory::{DeviceMemory, HostBackend, Tag};
use crate::model::forward::{Segment, forward_ragged};
use crate::model::{ModelConfig, ParamBuffer, ParamLayout, Weights};

/// Sizes of the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    pub model: ModelConfig,
    /// Token slots per KV block.
    pub block_size: usize,
    pub kv_blocks: usize,
    /// Requests decoding at once.
    pub max_running: usize,
    /// Tokens per iteration (prompts are chunked to fit).
    pub max_batch_tokens: usize,
    /// Finished requests whose keys and values are kept for later requests
    /// that start with the same tokens (0: off; see `prefix.rs`).
    pub prefix_cache: usize,
}

impl EngineConfig {
    /// Room for `max_running` full-context requests.
    pub fn for_model(model: ModelConfig, max_running: usize) -> Self {
        let block_size = 16;
        let kv_blocks = max_running * model.context.div_ceil(block_size);
        EngineConfig {
            max_batch_tokens: 4 * model.context.max(256),
            model,
            block_size,
            kv_blocks,
            max_running,
            prefix_cache: 0,
        }
    }

    pub fn geometry(&self) -> KvGeometry {
        KvGeometry {
            layers: self.model.layers,
            width: self.model.kv_width(),
            block_size: self.block_size,
        }
    }
}

/// One request inside the engine.
#[derive(Debug)]
struct Seq {
    id: ReqId,
    prompt_len: usize,
    /// Prompt then output.
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    params: SamplingParams,
    /// Output tokens allowed (after the context cap).
    budget: usize,
    /// Tokens whose keys and values are in the blocks.
    cached: usize,
    blocks: Vec<u32>,
    /// Keys and values to install at admission.
    import: Option<KvSnapshot>,
    versions: Option<(u64, u64)>,
    top_k: Option<u32>,
}

impl Seq {
    fn completion(self, finish: FinishReason, version: u64) -> Completion {
        Completion {
            id: self.id,
            prompt: self.tokens[..self.prompt_len].to_vec(),
            tokens: self.tokens[self.prompt_len..].to_vec(),
            logprobs: self.logprobs,
            finish,
            versions: self.versions.unwrap_or((version, version)),
        }
    }

    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

pub struct Engine {
    cfg: EngineConfig,
    layout: ParamLayout,
    memory: DeviceMemory<HostBackend>,
    weights: Option<Weights>,
    version: u64,
    pool: BlockPool,
    waiting: VecDeque<Seq>,
    running: BTreeMap<ReqId, Seq>,
    pins: BTreeMap<u64, migrate::Pin>,
    next_id: u64,
    next_pin: u64,
    generated: u64,
    prefixes: Vec<prefix::CachedPrefix>,
    next_prefix: u64,
    /// Prompt tokens whose keys and values came from the prefix cache.
    prefix_reused: u64,
    /// Prompt tokens computed at admission (not cached, not imported).
    prefilled: u64,
}

/// A summary: the state worth logging, not the caches.
impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("version", &self.version)
            .field("running", &self.running.len())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine serving `params` (their version is the serving version).
    pub fn new(cfg: EngineConfig, params: &ParamBuffer) -> Result<Self, EngineError> {
        let layout = ParamLayout::new(&cfg.model)?;
        params.check(&layout)?;
        if cfg.block_size == 0
            || cfg.kv_blocks == 0
            || cfg.max_running == 0
            || cfg.max_batch_tokens == 0
        {
            return Err(EngineError::Invalid(
                "block_size, kv_blocks, max_running and max_batch_tokens must be positive".into(),
            ));
        }
        let mut memory = DeviceMemory::new(HostBackend);
        memory.allocate(Tag::RolloutWeights, layout.total)?;
        memory.write(Tag::RolloutWeights, 0, &params.data)?;
        memory.allocate(Tag::KvCache, cfg.kv_blocks * cfg.geometry().block_floats())?;
        let weights = Weights::from_flat(&cfg.model, &params.data)?;
        Ok(Engine {
            pool: BlockPool::new(cfg.kv_blocks),
            cfg,
            layout,
            memory,
            weights: Some(weights),
            version: params.version,
            waiting: VecDeque::new(),
            running: BTreeMap::new(),
            pins: BTreeMap::new(),
            next_id: 1,
            next_pin: 1,
            generated: 0,
            prefixes: Vec::new(),
            next_prefix: 0,
            prefix_reused: 0,
            prefilled: 0,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    fn validate(&self, req: &Request) -> Result<usize, EngineError> {
        let m = &self.cfg.model;
        let p = &req.params;
        if req.prompt.is_empty() {
            return Err(EngineError::Invalid("empty prompt".into()));
        }
        if let Some((i, t)) = req
            .prompt
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= m.vocab)
        {
            return Err(EngineError::Invalid(format!(
                "prompt token {t} at {i} is outside the vocabulary of {}",
                m.vocab
            )));
        }
        if req.prompt.len() >= m.context {
            return Err(EngineError::Invalid(format!(
                "prompt of {} tokens leaves no room in the context of {}",
                req.prompt.len(),
                m.context
            )));
        }
        if !(p.temperature.is_finite() && p.temperature >= 0.0) {
            return Err(EngineError::Invalid(format!(
                "temperature {}",
                p.temperature
            )));
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return Err(EngineError::Invalid(format!(
                "top_p {} outside (0, 1]",
                p.top_p
            )));
        }
        if p.max_new_tokens == 0 {
            return Err(EngineError::Invalid(
                "max_new_tokens must be positive".into(),
            ));
        }
        let budget = (p.max_new_tokens as usize).min(m.context - req.prompt.len());
        let need = self.cfg.geometry().blocks_for(req.prompt.len() + budget);
        if need > self.pool.total() {
            return Err(EngineError::TooLarge {
                need,
                total: self.pool.total(),
            });
        }
        Ok(budget)
    }

    /// Queues a request.
    pub fn submit(&mut self, req: Request) -> Result<ReqId, EngineError> {
        self.enqueue(req, None)
    }

    /// Queues a request that samples only among its `top_k` most likely
    /// tokens (SGLang's `top_k`; the recorded log-probs stay the model's).
    pub fn submit_top_k(&mut self, req: Request, top_k: u32) -> Result<ReqId, EngineError> {
        let id = self.enqueue(req, None)?;
        if let Some(seq) = self.waiting.back_mut() {
            seq.top_k = Some(top_k).filter(|&k| k > 0);
        }
        Ok(id)
    }

    /// What a request in flight has generated so far (output tokens and
    /// their log-probs), for streaming; `None` once it finished.
    pub fn progress(&self, id: ReqId) -> Option<(&[u32], &[f32])> {
        let seq = self
            .running
            .get(&id)
            .or_else(|| self.waiting.iter().find(|s| s.id == id))?;
        Some((&seq.tokens[seq.prompt_len..], &seq.logprobs))
    }

    fn enqueue(&mut self, req: Request, import: Option<KvSnapshot>) -> Result<ReqId, EngineError> {
        let budget = self.validate(&req)?;
        let id = ReqId(self.next_id);
        self.next_id += 1;
        self.waiting.push_back(Seq {
            id,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            logprobs: Vec::new(),
            params: req.params,
            budget,
            cached: 0,
            blocks: Vec::new(),
            import,
            versions: None,
            top_k: None,
        });
        Ok(id)
    }

    /// Whether anything is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// First come, first served: stops at the first request that does not
    /// fit, so a large request is not starved by small ones.
    fn admit(&mut self) -> Result<(), EngineError> {
        let geo = self.cfg.geometry();
        while self.running.len() < self.cfg.max_running {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let need = geo.blocks_for(front.prompt_len + front.budget);
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            let Some(blocks) = self.blocks_with_prefix(&mut seq, need)? else {
                self.waiting.push_front(seq);
                break;
            };
            seq.blocks = blocks;
            if let Some(snap) = seq.import.take() {
                // Keep at least one token uncached: its logits start decoding.
                let n = snap.tokens.len().min(seq.tokens.len() - 1);
                let region = self.memory.host_mut(Tag::KvCache)?;
                for layer in 0..geo.layers {
                    for kv in 0..2 {
                        let at = snap.row_offset(layer, kv);
                        geo.write_rows(
                            region,
                            &seq.blocks,
                            Rows::new(layer, kv, 0, n),
                            &snap.data[at..at + n * geo.width],
                        );
                    }
                }
                seq.cached = n;
            }
            self.prefilled += (seq.tokens.len() - seq.cached) as u64;
            self.running.insert(seq.id, seq);
        }
        Ok(())
    }

    fn serving(&self) -> Result<&Weights, EngineError> {
        let kv = self.memory.is_resident(Tag::KvCache);
        match &self.weights {
            Some(w) if kv => Ok(w),
            w => Err(EngineError::NotServing {
                weights: w.is_some(),
                kv_cache: kv,
            }),
        }
    }

    /// Runs the uncached tokens of the listed requests (at most `budget`
    /// tokens in all, chunking a long prompt), caches them, and returns the logits
    /// after the last token of every request whose context is complete.
    fn forward(
        &mut self,
        ids: &[ReqId],
        budget: usize,
    ) -> Result<Vec<(ReqId, Vec<f32>)>, EngineError> {
        let weights = self.serving()?.clone();
        let mut tokens = Vec::new();
        let mut segs = Vec::new();
        let mut blocks = Vec::new();
        let mut want = Vec::new();
        let mut sampled = Vec::new();
        let mut taken = Vec::new();
        let mut left = budget;
        for id in ids {
            let Some(seq) = self.running.get(id) else {
                continue;
            };
            let take = (seq.tokens.len() - seq.cached).min(left);
            if take == 0 {
                continue;
            }
            left -= take;
            taken.push((*id, take));
            let start = tokens.len();
            tokens.extend_from_slice(&seq.tokens[seq.cached..seq.cached + take]);
            segs.push(Segment {
                start,
                len: take,
                past: seq.cached,
            });
            blocks.push(seq.blocks.clone());
            if seq.cached + take == seq.tokens.len() {
                want.push(start + take - 1);
                sampled.push(*id);
            }
        }
        let geo = self.cfg.geometry();
        let region = self.memory.host_mut(Tag::KvCache)?;
        let mut store = kv::PagedKv {
            geo,
            region,
            blocks,
            segs: &segs,
        };
        let mut pass = || forward_ragged(&weights, &tokens, &segs, &mut store, &want);
        // A single row's pass splits nothing over the pool: moving it onto
        // a pool thread and back would only add two wake-ups per token.
        let logits = if tokens.len() > 1 {
            crate::cpu::on_pool(pass)
        } else {
            pass()
        }?;
        for (id, take) in taken {
            if let Some(seq) = self.running.get_mut(&id) {
                seq.cached += take;
            }
        }
        Ok(sampled.into_iter().zip(logits).collect())
    }

    /// One continuous-batching iteration; returns the requests that
    /// finished in it.
    pub fn step(&mut self) -> Result<Vec<Completion>, EngineError> {
        if self.is_idle() {
            return Ok(Vec::new());
        }
        self.serving()?;
        self.admit()?;
        let ids: Vec<ReqId> = self.running.keys().copied().collect();
        let logits = self.forward(&ids, self.cfg.max_batch_tokens)?;
        let mut done = Vec::new();
        for (id, lg) in logits {
            let Some(seq) = self.running.get_mut(&id) else {
                continue;
            };
            let (token, lp) = sampler::sample_top_k(&lg, &seq.params, seq.top_k, seq.tokens.len());
            seq.tokens.push(token);
            seq.logprobs.push(lp);
            self.generated += 1;
            let v = self.version;
            seq.versions = Some(seq.versions.map_or((v, v), |(first, _)| (first, v)));
            let finish = if seq.params.stop_tokens.contains(&token) {
                Some(FinishReason::Stop)
            } else if seq.output_len() >= seq.budget {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(f) = finish {
                done.push((id, f));
            }
        }
        Ok(done
            .into_iter()
            .filter_map(|(id, f)| self.finish(id, f))
            .collect())
    }

    fn finish(&mut self, id: ReqId, f: FinishReason) -> Option<Completion> {
        let seq = self.running.remove(&id)?;
        self.retire(&seq);
        Some(seq.completion(f, self.version))
    }

    /// Steps until every request has finished.
    pub fn run_until_idle(&mut self) -> Result<Vec<Completion>, EngineError> {
        let mut out = Vec::new();
        while !self.is_idle() {
            out.extend(self.step()?);
        }
        Ok(out)
    }

    /// Submits one request and runs the engine until it finishes (other
    /// requests in flight progress too; their completions are dropped).
    pub fn generate(&mut self, req: Request) -> Result<Completion, EngineError> {
        let id = self.submit(req)?;
        loop {
            if let Some(c) = self.step()?.into_iter().find(|c| c.id == id) {
                return Ok(c);
            }
        }
    }

    /// Stops a request now: its partial output comes back marked aborted
    /// and its KV blocks are freed (unless pinned).
    pub fn abort(&mut self, id: ReqId) -> Result<Completion, EngineError> {
        if let Some(c) = self.finish(id, FinishReason::Aborted) {
            return Ok(c);
        }
        let at = self
            .waiting
            .iter()
            .position(|s| s.id == id)
            .ok_or(EngineError::Unknown(id))?;
        let seq = self.waiting.remove(at).ok_or(EngineError::Unknown(id))?;
        Ok(seq.completion(FinishReason::Aborted, self.version))
    }

    /// Output tokens and their log-probs of a running request so far, for
    /// callers that stream tokens as they are sampled.
    pub fn output_so_far(&self, id: ReqId) -> Option<(&[u32], &[f32])> {
        self.running
            .get(&id)
            .map(|s| (&s.tokens[s.prompt_len..], &s.logprobs[..]))
    }

    /// Aborts everything in flight, in id order (a cell's cancel-all).
    pub fn abort_all(&mut self) -> Vec<Completion> {
        let mut ids: Vec<ReqId> = self.running.keys().copied().collect();
        ids.extend(self.waiting.iter().map(|s| s.id));
        ids.sort();
        ids.into_iter()
            .filter_map(|id| self.abort(id).ok())
            .collect()
    }

    /// The next-token distribution (log-probs over the vocabulary) of a
    /// running request, without sampling: what the request would draw from
    /// at its next step.
    pub fn next_token_logprobs(&mut self, id: ReqId) -> Result<Vec<f32>, EngineError> {
        self.admit()?;
        if !self.running.contains_key(&id) {
            return Err(EngineError::Unknown(id));
        }
        let lg = self.forward(&[id], usize::MAX)?;
        let seq = self.running.get_mut(&id).ok_or(EngineError::Unknown(id))?;
        // The last token must stay uncached: the next step's logits come
        // from it (its slot is rewritten with the same values).
        seq.cached = seq.tokens.len() - 1;
        let (_, lg) = lg.into_iter().next().ok_or(EngineError::Unknown(id))?;
        Ok(sampler::log_probs(&lg)
            .into_iter()
            .map(|x| x as f32)
            .collect())
    }
}
