//! The embedded engine behind the gateway: the gpu crate's continuous-
//! batching [`Engine`](gyre_gpu::engine::Engine) on a thread of its own,
//! streaming each sampled token (with its log-prob under the serving
//! weights) as the batch steps. Its tokeniser is the shipped byte-level
//! BPE ([`super::bpe`]: bytes and the model's special tokens at the byte
//! game's ids, then 7,928 merges), and its template is the model's own chat
//! format.
//!
//! The default model is sized for a harness like Claude Code, whose every
//! call carries 60–80 KB of system prompt and tool schemas (about 20K
//! tokens of this vocabulary): a 32,768-token context, prompts prefilled in
//! chunks of 1,024 tokens (attention memory stays at heads × 1,024 × context
//! floats), outputs capped at 256 tokens (the cap ends the turn), and a
//! prefix cache, so the next
//! call of a conversation (its previous prompt, the reply, then what is
//! new) prefills only what is new.
//!
//! `--engine embedded[=CONFIG.toml]`: the TOML may set `layers`, `heads`,
//! `width`, `ffn`, `context`, `seed`, `max_running`, `max_new_tokens`,
//! `prefill_chunk` and `prefix_cache` for Gyre's own model with seeded
//! weights, or name a Hugging Face Llama/Qwen3 `checkpoint` directory
//! (relative to the TOML; `max_context` caps its context): its weights,
//! its `tokenizer.json`, its chat template and its stop tokens are then
//! what the gateway serves and renders with.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;

use gyre_gpu::engine::{
    Engine as GpuEngine, EngineConfig, FinishReason, ReqId, Request, SamplingParams as GpuParams,
};
use gyre_gpu::model::hf::{self, LoadOptions};
use gyre_gpu::model::vocab::Special;
use gyre_gpu::model::{ModelConfig, ParamBuffer};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::bpe::{SHIPPED, SHIPPED_VOCAB};
use super::engine::{
    Engine, EngineError, EngineEvent, EngineFinish, GenerateRequest, Generation, PrefillStats,
};
use super::render::Renderer;
use super::template::ChatTemplate;
use super::tokenizer::Tokenizer;

/// The embedded model's chat format: `<|bos|>`, then per message its role
/// marker, content and `<|end|>`; tool calls in hermes tags inside the
/// assistant's content, tool results as `<|tool_result|>` turns.
pub const EMBEDDED_TEMPLATE: &str = r#"<|bos|>
{%- if tools %}<|system|>Tools:{% for tool in tools %}{{ "\n" }}{{ tool | tojson }}{% endfor %}
{{ "\n" }}Call a tool as <tool_call>
{"name": ..., "arguments": {...}}
</tool_call><|end|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}<|system|>{{ m.content }}<|end|>
{%- elif m.role == 'user' %}<|user|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' %}<|assistant|>{{ m.content }}
{%- for tc in m.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|end|>
{%- elif m.role == 'tool' %}<|tool_result|>{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"#;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedConfig {
    /// A Hugging Face checkpoint directory (`LlamaForCausalLM`,
    /// `Qwen3ForCausalLM`) with its `tokenizer.json` and chat template;
    /// the Gyre model's sizes below do not apply to it.
    pub checkpoint: Option<PathBuf>,
    /// Caps a checkpoint's context (default: the checkpoint's, at most
    /// `DEFAULT_CONTEXT`).
    pub max_context: Option<usize>,
    pub layers: Option<usize>,
    pub heads: Option<usize>,
    pub width: Option<usize>,
    pub ffn: Option<usize>,
    pub context: Option<usize>,
    pub seed: Option<u64>,
    pub max_running: Option<usize>,
    /// Most output tokens of one call, whatever the request asks.
    pub max_new_tokens: Option<u32>,
    /// Prompt tokens computed per engine step.
    pub prefill_chunk: Option<usize>,
    /// Finished calls whose keys and values are kept for the next call.
    pub prefix_cache: Option<usize>,
}

/// The gateway's default embedded model (see the module doc).
pub const DEFAULT_CONTEXT: usize = 32_768;
pub const DEFAULT_MAX_NEW_TOKENS: u32 = 256;
pub const DEFAULT_PREFILL_CHUNK: usize = 1024;
pub const DEFAULT_PREFIX_CACHE: usize = 8;

impl EmbeddedConfig {
    /// The TOML at `path`, or the defaults.
    pub fn read(path: Option<&Path>) -> Result<EmbeddedConfig, EmbeddedError> {
        let Some(p) = path else {
            return Ok(EmbeddedConfig::default());
        };
        let err = |message: String| EmbeddedError::Config {
            path: p.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(p).map_err(|e| err(e.to_string()))?;
        let mut cfg: EmbeddedConfig = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        if let Some(dir) = cfg.checkpoint.as_mut().filter(|d| d.is_relative()) {
            *dir = p.parent().unwrap_or(Path::new(".")).join(&*dir);
        }
        if cfg.checkpoint.is_some() {
            let gyre_sizes = [cfg.layers, cfg.heads, cfg.width, cfg.ffn, cfg.context];
            if gyre_sizes.iter().any(Option::is_some) {
                return Err(err(
                    "layers, heads, width, ffn and context size Gyre's own model; a checkpoint \
                     has its own (cap its context with max_context)"
                        .into(),
                ));
            }
        }
        Ok(cfg)
    }

    /// The engine, its stop tokens and the renderer of its vocabulary:
    /// the checkpoint's when one is named, else Gyre's model with the
    /// shipped tokenizer and format.
    pub fn load(&self) -> Result<Loaded, EmbeddedError> {
        let Some(dir) = &self.checkpoint else {
            return Ok(Loaded {
                engine: self.engine()?,
                stop_tokens: vec![Special::EndTurn.id(), Special::Eos.id()],
                renderer: renderer()?,
            });
        };
        let model_err = |e: &dyn std::fmt::Display| {
            EmbeddedError::Model(format!("checkpoint {}: {e}", dir.display()))
        };
        let ck = hf::load(
            dir,
            &LoadOptions {
                max_context: Some(self.max_context.unwrap_or(DEFAULT_CONTEXT)),
            },
        )
        .map_err(|e| model_err(&e))?;
        let renderer = Renderer::from_dir(dir).map_err(|e| model_err(&e))?;
        let mut stop_tokens = ck.eos_token_ids.clone();
        let eos = renderer.tokenizer.eos();
        if !stop_tokens.contains(&eos) {
            stop_tokens.push(eos);
        }
        let cfg = self.engine_config(ck.config.model.clone());
        let engine = GpuEngine::new(cfg, &ck.params).map_err(|e| model_err(&e))?;
        Ok(Loaded {
            engine,
            stop_tokens,
            renderer,
        })
    }

    fn engine_config(&self, model: ModelConfig) -> EngineConfig {
        let mut cfg = EngineConfig::for_model(model, self.max_running.unwrap_or(2).max(1));
        cfg.max_batch_tokens = self.prefill_chunk.unwrap_or(DEFAULT_PREFILL_CHUNK).max(1);
        cfg.prefix_cache = self.prefix_cache.unwrap_or(DEFAULT_PREFIX_CACHE);
        cfg
    }

    /// The gpu crate's engine this configuration describes, with its
    /// seeded initial weights.
    pub fn engine(&self) -> Result<GpuEngine, EmbeddedError> {
        let d = ModelConfig::default();
        let model = ModelConfig {
            vocab: SHIPPED_VOCAB,
            layers: self.layers.unwrap_or(d.layers),
            heads: self.heads.unwrap_or(d.heads),
            width: self.width.unwrap_or(d.width),
            ffn: self.ffn.unwrap_or(d.ffn),
            context: self.context.unwrap_or(DEFAULT_CONTEXT),
            ..d
        };
        let model_err = |e: &dyn std::fmt::Display| EmbeddedError::Model(e.to_string());
        model.validate().map_err(|e| model_err(&e))?;
        let params =
            ParamBuffer::init(&model, self.seed.unwrap_or(0)).map_err(|e| model_err(&e))?;
        GpuEngine::new(self.engine_config(model), &params).map_err(|e| model_err(&e))
    }
}

/// What [`EmbeddedConfig::load`] builds.
pub struct Loaded {
    pub engine: GpuEngine,
    /// Sampling one of these ends the turn.
    pub stop_tokens: Vec<u32>,
    pub renderer: Renderer,
}

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot read {path}: {message}")]
    Config { path: String, message: String },
    #[error("the embedded model: {0}")]
    Model(String),
}

/// The renderer matching the embedded model's vocabulary and format.
pub fn renderer() -> Result<Renderer, EmbeddedError> {
    let end = Special::EndTurn.text();
    let tokenizer = Tokenizer::from_json(SHIPPED, end, "the shipped embedded tokenizer")
        .map_err(|e| EmbeddedError::Model(e.to_string()))?;
    embedded_format(tokenizer)
}

/// The renderer for a Gyre model of `vocab` ids: the shipped BPE when it
/// fits, else the byte vocabulary (byte b is id b, then the specials) that
/// `gyre train`'s byte game uses. Unknown: the shipped BPE.
pub fn renderer_for_vocab(vocab: Option<usize>) -> Result<Renderer, EmbeddedError> {
    let bytes = 256 + Special::ALL.len();
    match vocab {
        Some(v) if v < SHIPPED_VOCAB => {
            if v < bytes {
                return Err(EmbeddedError::Model(format!(
                    "a vocabulary of {v} ids is smaller than the {bytes} of bytes and specials"
                )));
            }
            let specials: Vec<&str> = Special::ALL.iter().map(|s| s.text()).collect();
            let json = super::tokenizer::byte_tokenizer_json(&specials).to_string();
            let tokenizer = Tokenizer::from_json(&json, Special::EndTurn.text(), "embedded bytes")
                .map_err(|e| EmbeddedError::Model(e.to_string()))?;
            embedded_format(tokenizer)
        }
        _ => renderer(),
    }
}

fn embedded_format(tokenizer: Tokenizer) -> Result<Renderer, EmbeddedError> {
    let end = Special::EndTurn.text();
    let template = ChatTemplate::new(EMBEDDED_TEMPLATE, Special::Bos.text(), end)
        .map_err(|e| EmbeddedError::Model(e.to_string()))?;
    Ok(Renderer {
        tokenizer,
        template,
    })
}

struct Job {
    request: Request,
    events: mpsc::Sender<EngineEvent>,
    cancel: CancellationToken,
    /// The engine's own output cap, not the client's max_tokens, bounds
    /// this call: reaching it ends the turn (a client asking 64,000
    /// tokens is not told its limit was hit).
    capped: bool,
}

pub struct EmbeddedEngine {
    jobs: std_mpsc::Sender<Job>,
    stop_tokens: Vec<u32>,
    context: usize,
    version: u64,
    max_new_tokens: u32,
    stats: Arc<Counters>,
}

/// The engine thread's prefill counters, read by the gateway's metrics.
#[derive(Default)]
struct Counters {
    prefilled: AtomicU64,
    reused: AtomicU64,
}

struct Live {
    events: mpsc::Sender<EngineEvent>,
    cancel: CancellationToken,
    sent: usize,
    capped: bool,
}

/// Sends newly sampled tokens of every live request; drops cancelled ones.
fn stream_progress(engine: &mut GpuEngine, live: &mut HashMap<ReqId, Live>) {
    let mut gone = Vec::new();
    for (id, l) in live.iter_mut() {
        if l.cancel.is_cancelled() || l.events.is_closed() {
            gone.push(*id);
            continue;
        }
        if let Some((tokens, logprobs)) = engine.output_so_far(*id) {
            for i in l.sent..tokens.len() {
                let _ = l.events.try_send(EngineEvent::Token {
                    id: tokens[i],
                    logprob: logprobs[i],
                });
            }
            l.sent = tokens.len();
        }
    }
    for id in gone {
        live.remove(&id);
        let _ = engine.abort(id);
    }
}

fn serve(mut engine: GpuEngine, jobs: std_mpsc::Receiver<Job>, stats: Arc<Counters>) {
    let mut live: HashMap<ReqId, Live> = HashMap::new();
    loop {
        let next = if engine.is_idle() {
            jobs.recv().ok()
        } else {
            jobs.try_recv().ok()
        };
        if engine.is_idle() && next.is_none() && live.is_empty() {
            return;
        }
        if let Some(job) = next {
            match engine.submit(job.request) {
                Ok(id) => {
                    live.insert(
                        id,
                        Live {
                            events: job.events,
                            cancel: job.cancel,
                            capped: job.capped,
                            sent: 0,
                        },
                    );
                }
                Err(e) => {
                    let _ = job
                        .events
                        .try_send(EngineEvent::Finish(EngineFinish::Failed(e.to_string())));
                }
            }
            continue;
        }
        let done = match engine.step() {
            Ok(done) => done,
            Err(e) => {
                for (_, l) in live.drain() {
                    let _ = l
                        .events
                        .try_send(EngineEvent::Finish(EngineFinish::Failed(e.to_string())));
                }
                engine.abort_all();
                continue;
            }
        };
        // Before any finish is sent: a client that saw its answer sees its counts.
        let load = engine.load();
        stats.prefilled.store(load.prefilled, Ordering::Relaxed);
        stats.reused.store(load.prefix_reused, Ordering::Relaxed);
        stream_progress(&mut engine, &mut live);
        for c in done {
            let Some(l) = live.remove(&c.id) else {
                continue;
            };
            for i in l.sent..c.tokens.len() {
                let _ = l.events.try_send(EngineEvent::Token {
                    id: c.tokens[i],
                    logprob: c.logprobs[i],
                });
            }
            let finish = match c.finish {
                FinishReason::Stop => EngineFinish::EndOfTurn,
                FinishReason::Length if l.capped => EngineFinish::EndOfTurn,
                FinishReason::Length => EngineFinish::Length,
                FinishReason::Aborted => EngineFinish::Failed("aborted".into()),
            };
            let _ = l.events.try_send(EngineEvent::Finish(finish));
        }
    }
}

impl EmbeddedEngine {
    /// The engine `config` describes on a thread of its own, with the
    /// renderer of its vocabulary.
    pub fn start(config: Option<&Path>) -> Result<(EmbeddedEngine, Renderer), EmbeddedError> {
        let cfg = EmbeddedConfig::read(config)?;
        let Loaded {
            engine,
            stop_tokens,
            renderer,
        } = cfg.load()?;
        let context = engine.config().model.context;
        let version = engine.version();
        let (tx, rx) = std_mpsc::channel();
        let stats = Arc::new(Counters::default());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("gateway-embedded-engine".into())
            .spawn(move || serve(engine, rx, thread_stats))
            .map_err(|e| EmbeddedError::Model(format!("engine thread: {e}")))?;
        let engine = EmbeddedEngine {
            jobs: tx,
            stop_tokens,
            context,
            version,
            max_new_tokens: cfg.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS).max(1),
            stats,
        };
        Ok((engine, renderer))
    }
}

impl Engine for EmbeddedEngine {
    fn name(&self) -> &str {
        "embedded"
    }

    fn policy_version(&self) -> u64 {
        self.version
    }

    fn context_window(&self) -> usize {
        self.context
    }

    fn prefill_stats(&self) -> Option<PrefillStats> {
        Some(PrefillStats {
            prefilled: self.stats.prefilled.load(Ordering::Relaxed),
            reused: self.stats.reused.load(Ordering::Relaxed),
        })
    }

    fn start(&self, request: GenerateRequest) -> Result<Generation, EngineError> {
        let p = &request.params;
        let params = GpuParams {
            temperature: p.temperature.unwrap_or(1.0),
            top_p: p.top_p.unwrap_or(1.0),
            max_new_tokens: p.max_tokens.min(self.max_new_tokens),
            stop_tokens: self.stop_tokens.clone(),
            seed: p.seed.unwrap_or(request.call_index),
        };
        // Capacity for a whole output: the engine thread never blocks.
        let (tx, rx) = mpsc::channel(p.max_tokens.min(self.max_new_tokens) as usize + 2);
        let cancel = CancellationToken::new();
        self.jobs
            .send(Job {
                request: Request {
                    prompt: request.prompt.to_vec(),
                    params,
                },
                events: tx,
                cancel: cancel.clone(),
                capped: p.max_tokens > self.max_new_tokens,
            })
            .map_err(|_| {
                EngineError::Unavailable("the embedded engine thread has stopped".into())
            })?;
        Ok(Generation { events: rx, cancel })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_vocabulary_picks_the_tokenizer() {
        let bytes = 256 + Special::ALL.len();
        let small = renderer_for_vocab(Some(bytes)).unwrap();
        assert_eq!(small.tokenizer.encode("hi").unwrap(), vec![104, 105]);
        assert!(small.tokenizer.vocab_size() as usize <= bytes);
        for vocab in [None, Some(SHIPPED_VOCAB)] {
            let bpe = renderer_for_vocab(vocab).unwrap();
            assert_eq!(bpe.tokenizer.vocab_size() as usize, SHIPPED_VOCAB);
        }
        let err = renderer_for_vocab(Some(100)).err().unwrap().to_string();
        assert!(err.contains("100 ids"), "{err}");
    }
}
