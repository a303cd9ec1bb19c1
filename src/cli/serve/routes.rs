//! The HTTP routes of `gyre serve`: SGLang's native API over the engine
//! thread. Bodies are parsed here, so a malformed one gets a 400 that
//! names the problem (`{"error": {"message"}}`, as SGLang answers), never a
//! panic; a request whose client goes away is aborted, as SGLang does.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use futures::Stream;
use gyre_gpu::engine::{FinishReason, MemTag, Request, SamplingParams};
use gyre_gpu::model::{Arch, ModelConfig, ParamBuffer, vocab};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::engine_loop::{Cmd, Done, EngineHandle, Failure, Progress, Status};
use super::model::read_params;
use crate::backends::sglang::wire::{
    Finish, GYRE_PARAM_BUFFER, GenerateRequest, MetaOut, TAG_KV_CACHE, TAG_WEIGHTS, response_json,
};

/// SGLang's default `max_new_tokens`.
const DEFAULT_MAX_NEW_TOKENS: u32 = 128;

/// What the routes know of the served model.
pub struct Served {
    pub engine: EngineHandle,
    pub model_path: String,
    pub served_model_name: String,
    pub model: ModelConfig,
    pub eos_token_ids: Vec<u32>,
    pub max_context: Option<usize>,
    pub max_running: usize,
    pub block_size: usize,
}

/// Shared by every handler; the model arrives after the listener is up.
pub struct AppState {
    pub served: OnceLock<Served>,
    pub startup_error: OnceLock<String>,
    next_rid: AtomicU64,
}

impl AppState {
    pub fn new() -> Arc<Self> {
        Arc::new(AppState {
            served: OnceLock::new(),
            startup_error: OnceLock::new(),
            next_rid: AtomicU64::new(1),
        })
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/generate", post(generate))
        .route("/abort_request", post(abort_request))
        .route("/release_memory_occupation", post(release_memory))
        .route("/resume_memory_occupation", post(resume_memory))
        .route("/update_weights_from_disk", post(update_from_disk))
        .route("/update_weights_from_tensor", post(update_from_tensor))
        .route("/update_weight_version", post(update_weight_version))
        .route("/init_weights_update_group", post(no_distributed))
        .route("/update_weights_from_distributed", post(no_distributed))
        .route("/health", get(health))
        .route("/health_generate", get(health_generate))
        .route("/get_server_info", get(server_info))
        .route("/get_model_info", get(model_info))
        .route("/get_weight_version", get(weight_version))
        .route("/get_load", get(load))
        // Weight uploads carry whole parameter buffers.
        .layer(DefaultBodyLimit::max(4 << 30))
        .with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    (
        status,
        axum::Json(json!({"error": {"message": message, "code": status.as_u16()}})),
    )
        .into_response()
}

/// An answer other than success, small enough to pass around by value.
struct ApiError(Box<(StatusCode, String)>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = *self.0;
        error(status, message)
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(Box::new((StatusCode::BAD_REQUEST, message.into())))
}

fn unavailable(message: impl Into<String>) -> ApiError {
    ApiError(Box::new((StatusCode::SERVICE_UNAVAILABLE, message.into())))
}

fn fail(f: Failure) -> ApiError {
    match f {
        Failure::Bad(m) => bad(m),
        Failure::Unavailable(m) => unavailable(m),
    }
}

fn failure(f: Failure) -> Response {
    fail(f).into_response()
}

/// A control endpoint's answer: `{success, message}`, 400 when it failed.
fn control(r: Result<String, Failure>) -> Response {
    match r {
        Ok(message) => axum::Json(json!({"success": true, "message": message})).into_response(),
        Err(f) => {
            let (status, message) = match f {
                Failure::Bad(m) => (StatusCode::BAD_REQUEST, m),
                Failure::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
            };
            (
                status,
                axum::Json(json!({"success": false, "message": message})),
            )
                .into_response()
        }
    }
}

fn served(s: &AppState) -> Result<&Served, ApiError> {
    s.served.get().ok_or_else(|| {
        unavailable(match s.startup_error.get() {
            Some(e) => format!("the model failed to load: {e}"),
            None => "the model is still loading".to_string(),
        })
    })
}

/// Parses a JSON body (an empty body reads as `{}`), naming what is wrong.
fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes, endpoint: &str) -> Result<T, ApiError> {
    let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(text).map_err(|e| bad(format!("{endpoint}: invalid request body: {e}")))
}

/// Aborts the request when dropped armed: the client hung up.
struct AbortOnDrop {
    engine: EngineHandle,
    rid: String,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let (reply, _) = oneshot::channel();
            let _ = self.engine.send(Cmd::Abort {
                rid: Some(self.rid.clone()),
                reply,
            });
        }
    }
}

/// A validated `/generate` call.
struct Call {
    rid: String,
    req: Request,
    top_k: Option<u32>,
    return_logprob: bool,
    text_in_logprobs: bool,
    byte_vocab: bool,
}

fn to_call(s: &AppState, m: &Served, g: GenerateRequest) -> Result<Call, ApiError> {
    let byte_vocab = m.model.arch == Arch::Gyre;
    let prompt = match (g.input_ids, g.text) {
        (Some(ids), None) => ids,
        (None, Some(text)) if byte_vocab => vocab::encode(&text),
        (None, Some(_)) => {
            return Err(bad(
                "this server takes input_ids: it loads no tokenizer for text prompts",
            ));
        }
        (Some(_), Some(_)) => return Err(bad("give either input_ids or text, not both")),
        (None, None) => return Err(bad("the request has neither input_ids nor text")),
    };
    let sp = g.sampling_params;
    if sp.stop.as_ref().is_some_and(|v| match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => true,
    }) {
        return Err(bad(
            "sampling_params.stop (strings) needs a tokenizer; use stop_token_ids",
        ));
    }
    let top_k = match sp.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k > 0 => Some(u32::try_from(k).unwrap_or(u32::MAX)),
        Some(k) => {
            return Err(bad(format!(
                "sampling_params.top_k {k}: use -1 or a positive k"
            )));
        }
    };
    let rid = g
        .rid
        .unwrap_or_else(|| format!("gyre-{:x}", s.next_rid.fetch_add(1, Ordering::Relaxed)));
    let mut stop_tokens = sp.stop_token_ids;
    if !sp.ignore_eos {
        stop_tokens.extend(m.eos_token_ids.iter().copied());
    }
    // Without a seed the stream is still reproducible per request id.
    let seed = sp
        .seed
        .unwrap_or_else(|| gyre_runtime::rng::mix64(fnv(rid.as_bytes())));
    Ok(Call {
        req: Request {
            prompt,
            params: SamplingParams {
                temperature: sp.temperature.unwrap_or(1.0),
                top_p: sp.top_p.unwrap_or(1.0),
                max_new_tokens: sp.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS),
                stop_tokens,
                seed,
            },
        },
        rid,
        top_k,
        return_logprob: g.return_logprob,
        text_in_logprobs: g.return_text_in_logprobs,
        byte_vocab,
    })
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Call {
    fn text(&self, ids: &[u32]) -> String {
        if self.byte_vocab {
            vocab::decode(ids)
        } else {
            String::new()
        }
    }

    fn body(
        &self,
        tokens: &[u32],
        logprobs: &[f32],
        weight_version: &str,
        finish: Option<&Finish>,
        started: Instant,
    ) -> Value {
        let lp = self.return_logprob.then(|| {
            tokens
                .iter()
                .zip(logprobs)
                .map(|(&t, &l)| (l, t, self.text_in_logprobs.then(|| self.text(&[t]))))
                .collect()
        });
        response_json(
            &self.text(tokens),
            tokens,
            &MetaOut {
                rid: &self.rid,
                prompt_tokens: self.req.prompt.len(),
                cached_tokens: 0,
                weight_version,
                finish,
                logprobs: lp,
                e2e_latency: finish.map(|_| started.elapsed().as_secs_f64()),
            },
        )
    }

    fn final_body(&self, d: &Done, started: Instant) -> Value {
        let c = &d.completion;
        let finish = match c.finish {
            FinishReason::Stop => Finish::Stop {
                matched: c.tokens.last().copied(),
            },
            FinishReason::Length => Finish::Length,
            FinishReason::Aborted => Finish::Abort {
                message: d.abort_message.clone(),
            },
        };
        self.body(
            &c.tokens,
            &c.logprobs,
            &d.weight_version,
            Some(&finish),
            started,
        )
    }
}

async fn generate(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let m = match served(&s) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let v: Value = match parse(&body, "/generate") {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let batched = v.get("text").is_some_and(Value::is_array)
        || v.pointer("/input_ids/0").is_some_and(Value::is_array);
    if batched {
        let why =
            "batched /generate (a list of prompts) is not supported: send one request per prompt";
        return bad(why).into_response();
    }
    let g: GenerateRequest = match serde_json::from_value(v) {
        Ok(g) => g,
        Err(e) => return bad(format!("/generate: invalid request body: {e}")).into_response(),
    };
    let stream = g.stream;
    let call = match to_call(&s, m, g) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let (done_tx, done_rx) = oneshot::channel();
    let (prog_tx, prog_rx) = mpsc::unbounded_channel();
    let cmd = Cmd::Generate {
        rid: call.rid.clone(),
        req: call.req.clone(),
        top_k: call.top_k,
        stream: stream.then_some(prog_tx),
        done: done_tx,
    };
    if let Err(f) = m.engine.send(cmd) {
        return failure(f);
    }
    let guard = AbortOnDrop {
        engine: m.engine.clone(),
        rid: call.rid.clone(),
        armed: true,
    };
    if stream {
        return Sse::new(sse_stream(call, prog_rx, done_rx, guard, started))
            .keep_alive(KeepAlive::default())
            .into_response();
    }
    let mut guard = guard;
    let r = done_rx.await;
    guard.armed = false;
    match r {
        Ok(Ok(d)) => axum::Json(call.final_body(&d, started)).into_response(),
        Ok(Err(f)) => failure(f),
        Err(_) => failure(Failure::Unavailable("the engine thread stopped".into())),
    }
}

enum Sending {
    Running {
        call: Call,
        prog: mpsc::UnboundedReceiver<Progress>,
        done: oneshot::Receiver<Result<Done, Failure>>,
        guard: AbortOnDrop,
        started: Instant,
    },
    Last,
    End,
}

fn event(v: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(v.to_string()))
}

/// SGLang's stream: cumulative chunks, the last with its finish reason,
/// then `[DONE]`.
fn sse_stream(
    call: Call,
    prog: mpsc::UnboundedReceiver<Progress>,
    done: oneshot::Receiver<Result<Done, Failure>>,
    guard: AbortOnDrop,
    started: Instant,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let first = Sending::Running {
        call,
        prog,
        done,
        guard,
        started,
    };
    futures::stream::unfold(first, |st| async move {
        match st {
            Sending::Running {
                call,
                mut prog,
                mut done,
                mut guard,
                started,
            } => {
                tokio::select! {
                    biased;
                    Some(p) = prog.recv() => {
                        let v = call.body(&p.tokens, &p.logprobs, &p.weight_version, None, started);
                        Some((event(&v), Sending::Running { call, prog, done, guard, started }))
                    }
                    r = &mut done => {
                        guard.armed = false;
                        let v = match r {
                            Ok(Ok(d)) => call.final_body(&d, started),
                            Ok(Err(Failure::Bad(m) | Failure::Unavailable(m))) => {
                                json!({"error": {"message": m}})
                            }
                            Err(_) => json!({"error": {"message": "the engine thread stopped"}}),
                        };
                        Some((event(&v), Sending::Last))
                    }
                }
            }
            Sending::Last => Some((Ok(Event::default().data("[DONE]")), Sending::End)),
            Sending::End => None,
        }
    })
}

#[derive(Deserialize)]
struct AbortReq {
    #[serde(default)]
    rid: Option<String>,
    #[serde(default)]
    abort_all: bool,
}

async fn abort_request(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let m = match served(&s) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let a: AbortReq = match parse(&body, "/abort_request") {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let rid = match (a.rid.filter(|r| !r.is_empty()), a.abort_all) {
        (_, true) => None,
        (Some(r), false) => Some(r),
        (None, false) => {
            return bad("/abort_request needs a rid or abort_all: true").into_response();
        }
    };
    match m.engine.call(|reply| Cmd::Abort { rid, reply }).await {
        Ok(n) => axum::Json(json!({"success": true, "num_aborted": n})).into_response(),
        Err(f) => failure(f),
    }
}

#[derive(Deserialize)]
struct TagsReq {
    #[serde(default)]
    tags: Option<Vec<String>>,
}

fn tags(body: &Bytes, endpoint: &str) -> Result<Vec<MemTag>, ApiError> {
    let t: TagsReq = parse(body, endpoint)?;
    match t.tags {
        None => Ok(vec![MemTag::Weights, MemTag::KvCache]),
        Some(list) => list
            .iter()
            .map(|s| {
                MemTag::parse(s).map_err(|_| {
                    bad(format!(
                        "{endpoint}: unknown tag {s:?} (tags: {TAG_WEIGHTS}, {TAG_KV_CACHE})"
                    ))
                })
            })
            .collect(),
    }
}

async fn release_memory(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    memory(s, body, "/release_memory_occupation", true).await
}

async fn resume_memory(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    memory(s, body, "/resume_memory_occupation", false).await
}

async fn memory(s: Arc<AppState>, body: Bytes, endpoint: &str, release: bool) -> Response {
    let m = match served(&s) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let tags = match tags(&body, endpoint) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    let r = m
        .engine
        .call(|reply| {
            if release {
                Cmd::Release { tags, reply }
            } else {
                Cmd::Resume { tags, reply }
            }
        })
        .await
        .and_then(|r| r);
    control(r.map(|()| format!("{endpoint} done")))
}

#[derive(Deserialize)]
struct DiskReq {
    model_path: String,
    #[serde(default)]
    abort_all_requests: bool,
    #[serde(default)]
    weight_version: Option<String>,
}

async fn update_from_disk(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let m = match served(&s) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let d: DiskReq = match parse(&body, "/update_weights_from_disk") {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    let (model, ctx) = (m.model.clone(), m.max_context);
    let path = PathBuf::from(&d.model_path);
    let read = tokio::task::spawn_blocking(move || read_params(&path, &model, ctx)).await;
    let params = match read {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return control(Err(Failure::Bad(e))),
        Err(e) => return control(Err(Failure::Unavailable(e.to_string()))),
    };
    update(m, params, d.weight_version, false, d.abort_all_requests).await
}

async fn update(
    m: &Served,
    params: ParamBuffer,
    label: Option<String>,
    keep_version: bool,
    abort_all: bool,
) -> Response {
    let r = m
        .engine
        .call(|reply| Cmd::UpdateWeights {
            params: Box::new(params),
            label,
            keep_version,
            abort_all,
            reply,
        })
        .await
        .and_then(|r| r);
    control(r.map(|v| format!("serving weight version {v}")))
}

#[derive(Deserialize)]
struct TensorReq {
    serialized_named_tensors: Vec<String>,
    #[serde(default)]
    load_format: Option<String>,
    #[serde(default)]
    abort_all_requests: bool,
    #[serde(default)]
    weight_version: Option<String>,
}

async fn update_from_tensor(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let m = match served(&s) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let t: TensorReq = match parse(&body, "/update_weights_from_tensor") {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    if t.load_format.as_deref() != Some(GYRE_PARAM_BUFFER) {
        return control(Err(Failure::Bad(format!(
            "load_format {:?} is not readable here: gyre serve takes load_format \
             {GYRE_PARAM_BUFFER:?} (one base64 GYREPRM1 buffer), not pickled torch tensors",
            t.load_format
        ))));
    }
    let [b64] = t.serialized_named_tensors.as_slice() else {
        return control(Err(Failure::Bad(format!(
            "{GYRE_PARAM_BUFFER} takes exactly one serialized buffer, got {}",
            t.serialized_named_tensors.len()
        ))));
    };
    let params = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("serialized_named_tensors[0] is not base64: {e}"))
        .and_then(|b| ParamBuffer::decode(&b).map_err(|e| e.to_string()));
    match params {
        Ok(p) => update(m, p, t.weight_version, true, t.abort_all_requests).await,
        Err(e) => control(Err(Failure::Bad(e))),
    }
}

#[derive(Deserialize)]
struct VersionReq {
    new_version: String,
    /// SGLang's default aborts everything in flight.
    #[serde(default = "yes")]
    abort_all_requests: bool,
}

fn yes() -> bool {
    true
}

async fn update_weight_version(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let m = match served(&s) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let v: VersionReq = match parse(&body, "/update_weight_version") {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let label = v.new_version.clone();
    let r = m
        .engine
        .call(|reply| Cmd::SetVersion {
            label,
            abort_all: v.abort_all_requests,
            reply,
        })
        .await
        .and_then(|r| r);
    control(r.map(|()| format!("weight version is now {}", v.new_version)))
}

async fn no_distributed() -> Response {
    control(Err(Failure::Bad(
        "gyre serve runs on CPU without an NCCL group: publish weights with \
         /update_weights_from_tensor or /update_weights_from_disk"
            .into(),
    )))
}

async fn status(s: &AppState) -> Result<Status, ApiError> {
    let m = served(s)?;
    m.engine
        .call(|reply| Cmd::Status { reply })
        .await
        .map_err(fail)
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    match status(&s).await {
        Ok(st) => axum::Json(json!({"status": "ok", "serving": st.serving})).into_response(),
        Err(r) => r.into_response(),
    }
}

/// 200 only when a generation would run now.
async fn health_generate(State(s): State<Arc<AppState>>) -> Response {
    match status(&s).await {
        Ok(st) if st.serving => axum::Json(json!({"status": "ok"})).into_response(),
        Ok(st) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "memory released: weights resident = {}, kv_cache resident = {}",
                st.weights_resident, st.kv_resident
            ),
        ),
        Err(r) => r.into_response(),
    }
}

async fn server_info(State(s): State<Arc<AppState>>) -> Response {
    let st = match status(&s).await {
        Ok(st) => st,
        Err(r) => return r.into_response(),
    };
    let Some(m) = s.served.get() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "loading");
    };
    let l = &st.load;
    axum::Json(json!({
        "version": format!("gyre {}", env!("CARGO_PKG_VERSION")),
        "engine": "gyre-embedded",
        "model_path": m.model_path,
        "served_model_name": m.served_model_name,
        "weight_version": st.weight_version,
        "context_length": m.model.context,
        "max_running_requests": m.max_running,
        "kv_migration": false,
        "internal_states": [{
            "num_running_reqs": l.running,
            "num_waiting_reqs": l.waiting,
            "kv_blocks_used": l.kv_blocks_used,
            "kv_blocks_total": l.kv_blocks_total,
            "generated_tokens": l.generated,
            "serving": st.serving,
            "weights_resident": st.weights_resident,
            "kv_cache_resident": st.kv_resident,
        }],
    }))
    .into_response()
}

async fn model_info(State(s): State<Arc<AppState>>) -> Response {
    match served(&s) {
        Ok(m) => axum::Json(json!({
            "model_path": m.model_path,
            "served_model_name": m.served_model_name,
            "tokenizer_path": Value::Null,
            "is_generation": true,
            "architecture": match &m.model.arch {
                Arch::Gyre => "gyre",
                Arch::Decoder(d) => d.family.name(),
            },
            "vocab_size": m.model.vocab,
            "eos_token_ids": m.eos_token_ids,
        }))
        .into_response(),
        Err(r) => r.into_response(),
    }
}

async fn weight_version(State(s): State<Arc<AppState>>) -> Response {
    match status(&s).await {
        Ok(st) => axum::Json(json!({"weight_version": st.weight_version})).into_response(),
        Err(r) => r.into_response(),
    }
}

/// SGLang's `/get_load`: one entry per data-parallel rank (here one).
async fn load(State(s): State<Arc<AppState>>) -> Response {
    match status(&s).await {
        Ok(st) => {
            let l = st.load;
            let Some(m) = s.served.get() else {
                return error(StatusCode::SERVICE_UNAVAILABLE, "loading");
            };
            axum::Json(json!([{
                "dp_rank": 0,
                "num_reqs": l.running + l.waiting,
                "num_waiting_reqs": l.waiting,
                "num_tokens": l.kv_blocks_used * m.block_size,
            }]))
            .into_response()
        }
        Err(r) => r.into_response(),
    }
}
