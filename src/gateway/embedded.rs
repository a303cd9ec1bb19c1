//! The embedded engine behind the gateway: the gpu crate's continuous-
//! batching [`Engine`](gyre_gpu::engine::Engine) on a thread of its own,
//! streaming each sampled token (with its log-prob under the serving
//! weights) as the batch steps. Its tokeniser is the model's byte
//! vocabulary as an HF tokenizer.json (byte b is id b, then the model's
//! special tokens), and its template is the model's own chat format.
//!
//! `--engine embedded[=CONFIG.toml]`: the TOML may set `layers`, `heads`,
//! `width`, `ffn`, `context`, `seed` and `max_running`; weights are the
//! seeded initial ones (a trained checkpoint is not loaded yet).

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc as std_mpsc;

use gyre_gpu::engine::{
    Engine as GpuEngine, EngineConfig, FinishReason, ReqId, Request, SamplingParams as GpuParams,
};
use gyre_gpu::model::vocab::Special;
use gyre_gpu::model::{ModelConfig, ParamBuffer};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::engine::{Engine, EngineError, EngineEvent, EngineFinish, GenerateRequest, Generation};
use super::render::Renderer;
use super::template::ChatTemplate;
use super::tokenizer::{Tokenizer, byte_tokenizer_json};

/// The embedded model's chat format: `<|bos|>`, then per message its role
/// marker, content and `<|end|>`; tool calls in hermes tags inside the
/// assistant's content, tool results as `<|tool_result|>` turns.
pub const EMBEDDED_TEMPLATE: &str = r#"<|bos|>
{%- if tools %}<|system|>Tools:{% for tool in tools %}{{ "\n" }}{{ tool | tojson }}{% endfor %}
{{ "\n" }}Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|end|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}<|system|>{{ m.content }}<|end|>
{%- elif m.role == 'user' %}<|user|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' %}<|assistant|>{{ m.content }}
{%- for tc in m.tool_calls %}<tool_call>{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson }}}</tool_call>{% endfor %}<|end|>
{%- elif m.role == 'tool' %}<|tool_result|>{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"#;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedConfig {
    pub layers: Option<usize>,
    pub heads: Option<usize>,
    pub width: Option<usize>,
    pub ffn: Option<usize>,
    pub context: Option<usize>,
    pub seed: Option<u64>,
    pub max_running: Option<usize>,
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
    let specials: Vec<&str> = Special::ALL.iter().map(|s| s.text()).collect();
    let json = byte_tokenizer_json(&specials).to_string();
    let end = Special::EndTurn.text();
    let tokenizer = Tokenizer::from_json(&json, end, "embedded")
        .map_err(|e| EmbeddedError::Model(e.to_string()))?;
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
}

pub struct EmbeddedEngine {
    jobs: std_mpsc::Sender<Job>,
    context: usize,
    version: u64,
}

struct Live {
    events: mpsc::Sender<EngineEvent>,
    cancel: CancellationToken,
    sent: usize,
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

fn serve(mut engine: GpuEngine, jobs: std_mpsc::Receiver<Job>) {
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
                FinishReason::Length => EngineFinish::Length,
                FinishReason::Aborted => EngineFinish::Failed("aborted".into()),
            };
            let _ = l.events.try_send(EngineEvent::Finish(finish));
        }
    }
}

impl EmbeddedEngine {
    pub fn start(config: Option<&Path>) -> Result<EmbeddedEngine, EmbeddedError> {
        let cfg: EmbeddedConfig = match config {
            None => EmbeddedConfig::default(),
            Some(p) => {
                let err = |message: String| EmbeddedError::Config {
                    path: p.display().to_string(),
                    message,
                };
                let text = std::fs::read_to_string(p).map_err(|e| err(e.to_string()))?;
                toml::from_str(&text).map_err(|e| err(e.to_string()))?
            }
        };
        let d = ModelConfig::default();
        let model = ModelConfig {
            vocab: d.vocab,
            layers: cfg.layers.unwrap_or(d.layers),
            heads: cfg.heads.unwrap_or(d.heads),
            width: cfg.width.unwrap_or(d.width),
            ffn: cfg.ffn.unwrap_or(d.ffn),
            context: cfg.context.unwrap_or(4096),
            ..d
        };
        model
            .validate()
            .map_err(|e| EmbeddedError::Model(e.to_string()))?;
        let params = ParamBuffer::init(&model, cfg.seed.unwrap_or(0))
            .map_err(|e| EmbeddedError::Model(e.to_string()))?;
        let context = model.context;
        let engine_cfg = EngineConfig::for_model(model, cfg.max_running.unwrap_or(4).max(1));
        let engine =
            GpuEngine::new(engine_cfg, &params).map_err(|e| EmbeddedError::Model(e.to_string()))?;
        let version = engine.version();
        let (tx, rx) = std_mpsc::channel();
        std::thread::Builder::new()
            .name("gateway-embedded-engine".into())
            .spawn(move || serve(engine, rx))
            .map_err(|e| EmbeddedError::Model(format!("engine thread: {e}")))?;
        Ok(EmbeddedEngine {
            jobs: tx,
            context,
            version,
        })
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

    fn start(&self, request: GenerateRequest) -> Result<Generation, EngineError> {
        let p = &request.params;
        let params = GpuParams {
            temperature: p.temperature.unwrap_or(1.0),
            top_p: p.top_p.unwrap_or(1.0),
            max_new_tokens: p.max_tokens,
            stop_tokens: vec![Special::EndTurn.id(), Special::Eos.id()],
            seed: p.seed.unwrap_or(request.call_index),
        };
        // Capacity for a whole output: the engine thread never blocks.
        let (tx, rx) = mpsc::channel(p.max_tokens as usize + 2);
        let cancel = CancellationToken::new();
        self.jobs
            .send(Job {
                request: Request {
                    prompt: request.prompt.to_vec(),
                    params,
                },
                events: tx,
                cancel: cancel.clone(),
            })
            .map_err(|_| {
                EngineError::Unavailable("the embedded engine thread has stopped".into())
            })?;
        Ok(Generation { events: rx, cancel })
    }
}
