//! The gateway's core, below HTTP: executions and keys, preparing a call
//! (tool-call restore, history match, rendering, window check) and
//! committing it (TITO record durable first, then the in-memory tree).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gyre_actors::trajectory::{CallPurpose, TitoRecord};
use rand::Rng;
use tokio::sync::Semaphore;

use super::chat::{ChatRequest, Message, ToolCall};
use super::engine::{Engine, RecordSink, SamplingParams};
use super::execution::{Execution, ExecutionMeta, StoredCall, chain_hashes, chain_start};
use super::parse::ToolFormat;
use super::render::{PriorCall, Renderer};
use super::store::{Committer, Store};

/// What went wrong, independent of the API that reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    InvalidRequest(String),
    Authentication(String),
    Permission(String),
    NotFound(String),
    TooLarge(String),
    Overloaded(String),
    Timeout(String),
    Internal(String),
}

impl CallError {
    pub fn status(&self) -> u16 {
        match self {
            CallError::InvalidRequest(_) => 400,
            CallError::Authentication(_) => 401,
            CallError::Permission(_) => 403,
            CallError::NotFound(_) => 404,
            CallError::TooLarge(_) => 413,
            CallError::Overloaded(_) => 529,
            CallError::Timeout(_) => 504,
            CallError::Internal(_) => 500,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            CallError::InvalidRequest(m)
            | CallError::Authentication(m)
            | CallError::Permission(m)
            | CallError::NotFound(m)
            | CallError::TooLarge(m)
            | CallError::Overloaded(m)
            | CallError::Timeout(m)
            | CallError::Internal(m) => m,
        }
    }
}

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub model: String,
    pub tool_format: ToolFormat,
    pub max_body_bytes: usize,
    pub max_concurrency: usize,
    pub request_timeout: Duration,
}

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub calls_committed: AtomicU64,
    pub input_tokens: AtomicU64,
    pub output_tokens: AtomicU64,
    pub reused_tokens: AtomicU64,
    pub tokenized_tokens: AtomicU64,
    pub in_flight: AtomicU64,
    pub reroutes: AtomicU64,
}

pub struct Gateway {
    pub engine: Arc<dyn Engine>,
    pub renderer: Renderer,
    pub store: Arc<Store>,
    committer: Committer,
    pub config: GatewayConfig,
    pub metrics: Metrics,
    pub permits: Arc<Semaphore>,
    executions: RwLock<HashMap<String, Arc<Mutex<Execution>>>>,
    keys: RwLock<HashMap<String, String>>,
    sink: Option<Arc<dyn RecordSink>>,
}

/// A call ready for the engine.
pub struct Prepared {
    pub execution: String,
    pub call_id: String,
    pub call_index: u64,
    pub prompt: Arc<[u32]>,
    pub params: SamplingParams,
    pub request_hash: u64,
    pub start_ns: u64,
    /// Text the proxy wrote at the start of the assistant's turn (its ids
    /// end `prompt`): a tool call's opening forced by `tool_choice`.
    pub forced: String,
    /// What the harness said the call is for (`x-gyre-purpose`): a
    /// critique's output is never a training target (SPEC 3.3).
    pub purpose: CallPurpose,
}

/// What the engine produced for a call, as it will be recorded.
pub struct Produced {
    pub output_ids: Vec<u32>,
    pub output_logprobs: Vec<f32>,
    pub reply: Message,
    /// Engine and policy version of the first token, when the engine
    /// reported them; else the engine's name and current version.
    pub served: Option<(String, u64)>,
}

fn random_hex(bytes: usize) -> String {
    let mut rng = rand::rng();
    (0..bytes)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gateway {
    /// Builds the gateway and reads the store back.
    pub fn new(
        engine: Arc<dyn Engine>,
        renderer: Renderer,
        store: Store,
        config: GatewayConfig,
    ) -> Result<Gateway, super::store::StoreError> {
        let loaded = store.load()?;
        let store = Arc::new(store);
        let committer = Committer::start(store.clone(), loaded.next_seq)?;
        let vocab = renderer.tokenizer.vocab_size();
        let mut executions = HashMap::new();
        let mut keys = HashMap::new();
        for meta in loaded.executions {
            keys.insert(meta.key.clone(), meta.id.clone());
            executions.insert(meta.id.clone(), Execution::new(meta, vocab));
        }
        for (id, call) in &loaded.calls {
            if let Some(e) = executions.get_mut(id) {
                e.apply(call);
            }
        }
        for (exec, id, conversation) in loaded.responses {
            if let Some(e) = executions.get_mut(&exec) {
                e.responses.insert(id, conversation);
            }
        }
        let executions = executions
            .into_iter()
            .map(|(k, v)| (k, Arc::new(Mutex::new(v))))
            .collect();
        Ok(Gateway {
            engine,
            renderer,
            store,
            committer,
            permits: Arc::new(Semaphore::new(config.max_concurrency)),
            config,
            metrics: Metrics::default(),
            executions: RwLock::new(executions),
            keys: RwLock::new(keys),
            sink: None,
        })
    }

    /// Every committed record is also handed to `sink`.
    pub fn with_record_sink(mut self, sink: Arc<dyn RecordSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    pub fn create_execution(
        &self,
        query: Option<serde_json::Value>,
        group: Option<String>,
    ) -> Result<ExecutionMeta, CallError> {
        let meta = ExecutionMeta {
            id: format!("ex-{}", random_hex(8)),
            key: format!("gyre-{}", random_hex(24)),
            query,
            group,
            closed: false,
        };
        self.store
            .put_execution(&meta)
            .map_err(|e| CallError::Internal(e.to_string()))?;
        let exec = Execution::new(meta.clone(), self.renderer.tokenizer.vocab_size());
        self.keys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(meta.key.clone(), meta.id.clone());
        self.executions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(meta.id.clone(), Arc::new(Mutex::new(exec)));
        Ok(meta)
    }

    pub fn execution(&self, id: &str) -> Option<Arc<Mutex<Execution>>> {
        self.executions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    pub fn list_executions(&self) -> Vec<(ExecutionMeta, usize)> {
        let map = self.executions.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = map
            .values()
            .map(|e| {
                let e = lock(e);
                (e.meta.clone(), e.records.len())
            })
            .collect();
        out.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        out
    }

    /// Replaces what the execution's row says of its query (durably): a
    /// resumed head relabels the executions it adopts.
    pub fn describe_execution(
        &self,
        id: &str,
        query: serde_json::Value,
    ) -> Result<ExecutionMeta, CallError> {
        let exec = self
            .execution(id)
            .ok_or_else(|| CallError::NotFound(format!("no execution {id}")))?;
        let mut e = lock(&exec);
        let mut meta = e.meta.clone();
        meta.query = Some(query);
        self.store
            .put_execution(&meta)
            .map_err(|e| CallError::Internal(e.to_string()))?;
        e.meta = meta.clone();
        Ok(meta)
    }

    pub fn close_execution(&self, id: &str) -> Result<ExecutionMeta, CallError> {
        let exec = self
            .execution(id)
            .ok_or_else(|| CallError::NotFound(format!("no execution {id}")))?;
        let mut e = lock(&exec);
        let mut meta = e.meta.clone();
        meta.closed = true;
        self.store
            .put_execution(&meta)
            .map_err(|e| CallError::Internal(e.to_string()))?;
        e.meta.closed = true;
        Ok(meta)
    }

    /// The execution a key stands for; closed executions' keys are refused.
    pub fn authenticate(&self, key: Option<&str>) -> Result<String, CallError> {
        let key = key.ok_or_else(|| {
            CallError::Authentication("no API key: send x-api-key or Authorization: Bearer".into())
        })?;
        let id = self
            .keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
            .ok_or_else(|| CallError::Authentication("invalid API key".into()))?;
        let exec = self
            .execution(&id)
            .ok_or_else(|| CallError::Authentication("invalid API key".into()))?;
        if lock(&exec).meta.closed {
            return Err(CallError::Authentication(format!(
                "execution {id} is closed; its key no longer works"
            )));
        }
        Ok(id)
    }

    /// Restores tool calls, matches history, renders, checks the window.
    pub fn prepare(&self, execution: &str, req: &ChatRequest) -> Result<Prepared, CallError> {
        let start_ns = now_ns();
        let exec = self
            .execution(execution)
            .ok_or_else(|| CallError::NotFound(format!("no execution {execution}")))?;
        let mut e = lock(&exec);
        let mut messages = req.messages.clone();
        e.restore(&mut messages)
            .map_err(|err| CallError::InvalidRequest(err.to_string()))?;
        let hashes = chain_hashes(&messages, chain_start());
        let prior = e
            .find_prior(&hashes, &messages)
            .map(|(rec, matched)| PriorCall {
                input_ids: &rec.input_ids,
                output_ids: &rec.output_ids,
                matched,
            });
        let enforced = super::choice::enforce(
            &req.tool_choice,
            &req.tools,
            &self.renderer.template,
            self.config.tool_format,
        )?;
        let tools = if enforced.hide_tools {
            &[]
        } else {
            &req.tools[..]
        };
        let mut prompt = self
            .renderer
            .prompt(&messages, tools, prior)
            .map_err(|err| CallError::InvalidRequest(err.to_string()))?;
        if !enforced.forced.is_empty() {
            let forced = self
                .renderer
                .tokenizer
                .encode(&enforced.forced)
                .map_err(|err| CallError::Internal(err.to_string()))?;
            prompt.tokenized += forced.len();
            prompt.ids.extend(forced);
        }
        let window = self.engine.context_window();
        if prompt.ids.len() >= window {
            return Err(CallError::InvalidRequest(format!(
                "prompt is too long: {} tokens > {} maximum (the model's context window)",
                prompt.ids.len(),
                window - 1
            )));
        }
        self.metrics
            .reused_tokens
            .fetch_add(prompt.reused as u64, Ordering::Relaxed);
        self.metrics
            .tokenized_tokens
            .fetch_add(prompt.tokenized as u64, Ordering::Relaxed);
        let mut params = req.params.clone();
        params.max_tokens = params
            .max_tokens
            .min((window - prompt.ids.len()) as u32)
            .max(1);
        let call_index = e.next_call;
        e.next_call += 1;
        Ok(Prepared {
            execution: execution.to_string(),
            call_id: format!("call-{call_index}"),
            call_index,
            prompt: prompt.ids.into(),
            params,
            request_hash: hashes.last().copied().unwrap_or_else(chain_start),
            start_ns,
            forced: enforced.forced,
            purpose: CallPurpose::Policy,
        })
    }

    /// Makes the call durable (group-committed), then visible.
    pub async fn commit(&self, p: &Prepared, produced: Produced) -> Result<(), CallError> {
        let record = TitoRecord {
            execution: p.execution.clone(),
            call_id: p.call_id.clone(),
            thread: None,
            parent_call: None,
            role: None,
            purpose: p.purpose,
            policy_version: produced
                .served
                .as_ref()
                .map_or_else(|| self.engine.policy_version(), |s| s.1),
            engine: Some(
                produced
                    .served
                    .map_or_else(|| self.engine.name().to_string(), |s| s.0),
            ),
            start_ns: p.start_ns,
            end_ns: now_ns().max(p.start_ns),
            input_ids: p.prompt.to_vec(),
            input_message_ends: Vec::new(),
            output_ids: produced.output_ids,
            output_logprobs: produced.output_logprobs,
            output_sources: Vec::new(),
        };
        record
            .validate()
            .map_err(|e| CallError::Internal(format!("engine output not recordable: {e}")))?;
        let history_hash = chain_hashes(std::slice::from_ref(&produced.reply), p.request_hash)[0];
        let stored = StoredCall {
            history_hash,
            tool_calls: produced
                .reply
                .tool_calls
                .iter()
                .map(|c: &ToolCall| (c.id.clone(), c.name.clone(), c.arguments.clone()))
                .collect(),
            record,
        };
        let exec = self
            .execution(&p.execution)
            .ok_or_else(|| CallError::NotFound(format!("no execution {}", p.execution)))?;
        let stored = self
            .committer
            .commit(stored)
            .await
            .map_err(|err| CallError::Internal(err.to_string()))?;
        lock(&exec).apply(&stored);
        if let Some(sink) = &self.sink {
            sink.committed(&stored.record);
        }
        self.metrics.calls_committed.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .input_tokens
            .fetch_add(stored.record.input_ids.len() as u64, Ordering::Relaxed);
        self.metrics
            .output_tokens
            .fetch_add(stored.record.output_ids.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// A conversation stored by the Responses API in this execution.
    pub fn previous_conversation(
        &self,
        execution: &str,
        id: &str,
    ) -> Result<Vec<Message>, CallError> {
        let exec = self
            .execution(execution)
            .ok_or_else(|| CallError::NotFound(format!("no execution {execution}")))?;
        let e = lock(&exec);
        e.responses.get(id).cloned().ok_or_else(|| {
            CallError::NotFound(format!(
                "previous_response_id {id}: no stored response of this execution has that id"
            ))
        })
    }

    /// Keeps a Responses conversation, durably, for `previous_response_id`.
    pub fn store_response(
        &self,
        execution: &str,
        id: String,
        conversation: Vec<Message>,
    ) -> Result<(), CallError> {
        let exec = self
            .execution(execution)
            .ok_or_else(|| CallError::NotFound(format!("no execution {execution}")))?;
        self.store
            .put_response(execution, &id, &conversation)
            .map_err(|e| CallError::Internal(e.to_string()))?;
        lock(&exec).responses.insert(id, conversation);
        Ok(())
    }

    /// The execution's records as `gyre trace` JSONL.
    pub fn trace_jsonl(&self, id: &str) -> Result<String, CallError> {
        let exec = self
            .execution(id)
            .ok_or_else(|| CallError::NotFound(format!("no execution {id}")))?;
        let e = lock(&exec);
        let mut out = String::new();
        for r in &e.records {
            out.push_str(
                &serde_json::to_string(r).map_err(|err| CallError::Internal(err.to_string()))?,
            );
            out.push('\n');
        }
        Ok(out)
    }

    pub fn metrics_text(&self) -> String {
        let m = &self.metrics;
        let executions = self.list_executions();
        let open = executions.iter().filter(|(e, _)| !e.closed).count();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let prefill = self.engine.prefill_stats();
        for (name, help, value) in [
            (
                "gyre_gateway_requests_total",
                "API requests received",
                g(&m.requests),
            ),
            (
                "gyre_gateway_errors_total",
                "API requests answered with an error",
                g(&m.errors),
            ),
            (
                "gyre_gateway_calls_committed_total",
                "model calls recorded durably",
                g(&m.calls_committed),
            ),
            (
                "gyre_gateway_input_tokens_total",
                "prompt tokens of recorded calls",
                g(&m.input_tokens),
            ),
            (
                "gyre_gateway_output_tokens_total",
                "output tokens of recorded calls",
                g(&m.output_tokens),
            ),
            (
                "gyre_gateway_reused_tokens_total",
                "prompt tokens reused from records",
                g(&m.reused_tokens),
            ),
            (
                "gyre_gateway_tokenized_tokens_total",
                "prompt tokens produced by the tokeniser",
                g(&m.tokenized_tokens),
            ),
            (
                "gyre_gateway_reroutes_total",
                "engine failures retried from the output so far",
                g(&m.reroutes),
            ),
            (
                "gyre_gateway_in_flight",
                "API requests in progress",
                g(&m.in_flight),
            ),
            (
                "gyre_gateway_executions_open",
                "open executions",
                open as u64,
            ),
        ] {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        if let Some(p) = prefill {
            for (name, help, value) in [
                (
                    "gyre_gateway_engine_prefilled_tokens_total",
                    "prompt tokens the engine computed",
                    p.prefilled,
                ),
                (
                    "gyre_gateway_engine_prefix_reused_tokens_total",
                    "prompt tokens whose KV the engine reused from an earlier call",
                    p.reused,
                ),
            ] {
                out.push_str(&format!(
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
                ));
            }
        }
        out
    }
}
