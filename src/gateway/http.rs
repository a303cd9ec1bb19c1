//! The HTTP side: the API listener (Anthropic and OpenAI routes, keys,
//! body-size and concurrency limits, streaming bodies fed as tokens
//! arrive) and the admin listener (executions, traces, metrics) behind the
//! admin bearer token.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use gyre_actors::trajectory::CallPurpose;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::anthropic;
use super::chat::{ChatRequest, Message};
use super::fields::{Obj, parse_body};
use super::openai;
use super::responses;
use super::service::{CallError, Gateway, now_ns};
use super::turn::{self, Delta};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Anthropic,
    OpenAi,
    Responses,
}

fn json_response(status: u16, v: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn error_response(gw: &Gateway, api: Api, e: &CallError) -> Response {
    gw.metrics.errors.fetch_add(1, Ordering::Relaxed);
    match api {
        Api::Anthropic => json_response(e.status(), &anthropic::error_body(e)),
        Api::OpenAi | Api::Responses => json_response(openai::status(e), &openai::error_body(e)),
    }
}

fn api_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(k) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(k.trim());
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

async fn read_body(gw: &Gateway, body: Body) -> Result<Bytes, CallError> {
    axum::body::to_bytes(body, gw.config.max_body_bytes)
        .await
        .map_err(|_| {
            CallError::TooLarge(format!(
                "the request body is larger than the gateway's limit of {} bytes (or was cut off)",
                gw.config.max_body_bytes
            ))
        })
}

/// `x-gyre-purpose`: a harness may mark a call as a critique (its output
/// is fed back as input later and must not be trained on, SPEC 3.3); a
/// call without the header is a policy turn.
fn purpose(headers: &HeaderMap) -> Result<CallPurpose, CallError> {
    let Some(v) = headers.get("x-gyre-purpose") else {
        return Ok(CallPurpose::Policy);
    };
    match v.to_str().map(str::trim) {
        Ok("policy") => Ok(CallPurpose::Policy),
        Ok("critique") => Ok(CallPurpose::Critique),
        _ => Err(CallError::InvalidRequest(format!(
            "header x-gyre-purpose: {:?} is neither \"policy\" nor \"critique\"",
            String::from_utf8_lossy(v.as_bytes())
        ))),
    }
}

/// Key → execution; `x-gyre-execution`, when sent, must be the key's own.
fn authorize(gw: &Gateway, headers: &HeaderMap) -> Result<String, CallError> {
    let execution = gw.authenticate(api_key(headers))?;
    if let Some(named) = headers
        .get("x-gyre-execution")
        .and_then(|v| v.to_str().ok())
        && named != execution
    {
        return Err(CallError::Permission(format!(
            "this key belongs to another execution than {named}; a key appends only to its own execution"
        )));
    }
    Ok(execution)
}

struct InFlight<'a>(&'a Gateway);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn sse(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The API-specific half of a call: ids, stream frames, final body.
enum Front {
    Anthropic(anthropic::StreamWriter),
    Chat(openai::ChunkWriter, openai::ChatOptions),
    Responses(responses::EventWriter),
}

struct CallInfo {
    id: String,
    model: String,
    created: u64,
    store: Option<Vec<Message>>,
}

impl Front {
    fn start(&mut self, input_tokens: usize) -> Vec<Bytes> {
        match self {
            Front::Anthropic(w) => w.start(input_tokens),
            Front::Chat(w, _) => w.start(),
            Front::Responses(w) => w.start(),
        }
    }

    fn delta(&mut self, d: &Delta) -> Vec<Bytes> {
        match self {
            Front::Anthropic(w) => w.delta(d),
            Front::Chat(w, _) => w.delta(d),
            Front::Responses(w) => w.delta(d),
        }
    }

    fn finish(&mut self, o: &turn::Outcome) -> Vec<Bytes> {
        match self {
            Front::Anthropic(w) => w.finish(o),
            Front::Chat(w, opts) => w.finish(o, opts.include_usage),
            Front::Responses(w) => w.finish(o),
        }
    }

    fn error(&mut self, e: &CallError) -> Vec<Bytes> {
        match self {
            Front::Anthropic(_) => vec![anthropic::frame("error", &anthropic::error_body(e))],
            Front::Chat(..) => vec![openai::data(&openai::error_body(e))],
            Front::Responses(w) => w.error(e),
        }
    }

    fn id_prefix(&self) -> &'static str {
        match self {
            Front::Anthropic(_) => "toolu_",
            _ => "call_",
        }
    }
}

/// What a parsed request needs to build its front once the call has a number.
enum Spec {
    Anthropic,
    Chat(openai::ChatOptions),
    Responses(responses::ResponsesOptions),
}

/// Parses the body for `api` into the neutral request.
fn parse_call(
    gw: &Gateway,
    api: Api,
    execution: &str,
    obj: &Obj,
) -> Result<(ChatRequest, Spec), CallError> {
    let default_max = gw.engine.context_window() as u32;
    Ok(match api {
        Api::Anthropic => (anthropic::parse(obj, default_max, true)?, Spec::Anthropic),
        Api::OpenAi => (
            openai::parse(obj, default_max)?,
            Spec::Chat(openai::options(obj)?),
        ),
        Api::Responses => {
            let previous = |id: &str| gw.previous_conversation(execution, id);
            let (req, opts) = responses::parse(obj, default_max, &previous)?;
            (req, Spec::Responses(opts))
        }
    })
}

impl Spec {
    fn build(self, req: &ChatRequest, execution: &str, call_index: u64) -> (Front, CallInfo) {
        let created = now_ns() / 1_000_000_000;
        let short = execution.trim_start_matches("ex-");
        let model = req.model.clone();
        let (front, id, store) = match self {
            Spec::Anthropic => {
                let id = anthropic::message_id(execution, call_index);
                (
                    Front::Anthropic(anthropic::StreamWriter::new(&id, &model)),
                    id,
                    None,
                )
            }
            Spec::Chat(opts) => {
                let id = format!("chatcmpl-{short}-{call_index}");
                (
                    Front::Chat(
                        openai::ChunkWriter::new(&id, &model, created, opts.logprobs),
                        opts,
                    ),
                    id,
                    None,
                )
            }
            Spec::Responses(opts) => {
                let id = format!("resp_{short}_{call_index}");
                let store = opts.store.then(|| req.messages.clone());
                let w =
                    responses::EventWriter::new(&id, &model, created, opts.previous_response_id);
                (Front::Responses(w), id, store)
            }
        };
        (
            front,
            CallInfo {
                id,
                model,
                created,
                store,
            },
        )
    }
}

fn final_body(gw: &Gateway, api: Api, front: &Front, info: &CallInfo, o: &turn::Outcome) -> Value {
    match (api, front) {
        (Api::Anthropic, _) => anthropic::response(&info.id, &info.model, o),
        (_, Front::Chat(_, opts)) => openai::response(
            &info.id,
            &info.model,
            info.created,
            o,
            opts,
            &gw.renderer.tokenizer,
        ),
        _ => {
            let previous = match front {
                Front::Responses(w) => w.previous().clone(),
                _ => None,
            };
            responses::response_object(&info.id, &info.model, info.created, &previous, Some(o))
        }
    }
}

/// Keeps a Responses conversation for `previous_response_id` (durable
/// before the response's last byte, like the call's record).
fn remember(
    gw: &Gateway,
    execution: &str,
    info: &mut CallInfo,
    o: &turn::Outcome,
) -> Result<(), CallError> {
    match info.store.take() {
        Some(mut conversation) => {
            conversation.push(o.reply.clone());
            gw.store_response(execution, info.id.clone(), conversation)
        }
        None => Ok(()),
    }
}

async fn call(gw: Arc<Gateway>, api: Api, headers: HeaderMap, body: Body) -> Response {
    gw.metrics.requests.fetch_add(1, Ordering::Relaxed);
    gw.metrics.in_flight.fetch_add(1, Ordering::Relaxed);
    let _guard = InFlight(&gw);
    let Ok(permit) = gw.permits.clone().try_acquire_owned() else {
        let e = CallError::Overloaded("the gateway is at its concurrency limit; retry".into());
        return error_response(&gw, api, &e);
    };
    let prepared = async {
        let execution = authorize(&gw, &headers)?;
        let purpose = purpose(&headers)?;
        let bytes = read_body(&gw, body).await?;
        let obj = parse_body(&bytes)?;
        // Rendering is proportional to what is new (history is reused),
        // so it runs inline.
        let (req, spec) = parse_call(&gw, api, &execution, &obj)?;
        super::fields::check_sampling(&req.params)?;
        let mut p = gw.prepare(&execution, &req)?;
        p.purpose = purpose;
        let (front, info) = spec.build(&req, &execution, p.call_index);
        Ok::<_, CallError>((p, req, front, info))
    }
    .await;
    let (p, req, mut front, mut info) = match prepared {
        Ok(x) => x,
        Err(e) => return error_response(&gw, api, &e),
    };
    if !req.stream {
        let prefix = front.id_prefix();
        let outcome = match turn::run(&gw, &p, &req.stop, prefix, None, &mut |_| Vec::new()).await {
            Ok(o) => o,
            Err(e) => return error_response(&gw, api, &e),
        };
        let execution = p.execution.clone();
        if let Err(e) = turn::commit(&gw, p, &outcome).await {
            return error_response(&gw, api, &e);
        }
        if let Err(e) = remember(&gw, &execution, &mut info, &outcome) {
            return error_response(&gw, api, &e);
        }
        return json_response(200, &final_body(&gw, api, &front, &info, &outcome));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let gw2 = gw.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let first = front.start(p.prompt.len());
        for f in first {
            if tx.send(f).await.is_err() {
                return;
            }
        }
        let prefix = front.id_prefix();
        let execution = p.execution.clone();
        let result = turn::run(&gw2, &p, &req.stop, prefix, Some(&tx), &mut |d| {
            front.delta(d)
        })
        .await;
        let result = match result {
            Ok(o) => turn::commit(&gw2, p, &o).await.map(|_| o),
            Err(e) => Err(e),
        };
        let result = result.and_then(|o| remember(&gw2, &execution, &mut info, &o).map(|_| o));
        let last = match result {
            Ok(o) => front.finish(&o),
            Err(e) => {
                gw2.metrics.errors.fetch_add(1, Ordering::Relaxed);
                front.error(&e)
            }
        };
        for f in last {
            if tx.send(f).await.is_err() {
                return;
            }
        }
    });
    sse(rx)
}

async fn messages(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    call(gw, Api::Anthropic, headers, body).await
}

async fn chat_completions(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    call(gw, Api::OpenAi, headers, body).await
}

async fn responses_create(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    call(gw, Api::Responses, headers, body).await
}

async fn count_tokens(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    gw.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let r = async {
        authorize(&gw, &headers)?;
        let bytes = read_body(&gw, body).await?;
        let obj: Obj = parse_body(&bytes)?;
        let req = anthropic::parse(&obj, 1, false)?;
        let prompt = gw
            .renderer
            .full(&req.messages, &req.tools)
            .map_err(|e| CallError::InvalidRequest(e.to_string()))?;
        Ok::<_, CallError>(prompt.ids.len())
    }
    .await;
    match r {
        Ok(n) => json_response(200, &json!({"input_tokens": n})),
        Err(e) => error_response(&gw, Api::Anthropic, &e),
    }
}

async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&gw, &headers) {
        return error_response(&gw, Api::OpenAi, &e);
    }
    json_response(
        200,
        &json!({"object": "list", "data": [{"id": gw.config.model,
        "object": "model", "created": 0, "owned_by": "gyre"}]}),
    )
}

async fn fallback(State(gw): State<Arc<Gateway>>) -> Response {
    error_response(
        &gw,
        Api::OpenAi,
        &CallError::NotFound("no such route".into()),
    )
}

pub fn api_router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses_create))
        .route("/v1/models", get(models))
        .fallback(fallback)
        .with_state(gw)
}

#[derive(Clone)]
struct Admin {
    gw: Arc<Gateway>,
    token: Arc<str>,
}

fn admin_error(e: &CallError) -> Response {
    json_response(
        e.status(),
        &json!({"error": {"type": "admin_error", "message": e.message()}}),
    )
}

fn admin_check(a: &Admin, headers: &HeaderMap) -> Result<(), Box<Response>> {
    let sent = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if sent == Some(&*a.token) {
        Ok(())
    } else {
        Err(Box::new(admin_error(&CallError::Authentication(
            "admin API: wrong or missing bearer token".into(),
        ))))
    }
}

async fn create_execution(State(a): State<Admin>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(r) = admin_check(&a, &headers) {
        return *r;
    }
    let (query, group) = if body.iter().all(u8::is_ascii_whitespace) {
        (None, None)
    } else {
        match parse_body(&body).and_then(|o| {
            let group = super::fields::opt_str(&o, "group", "group")?.map(str::to_string);
            Ok((o.get("query").cloned(), group))
        }) {
            Ok(x) => x,
            Err(e) => return admin_error(&e),
        }
    };
    match a.gw.create_execution(query, group) {
        Ok(m) => json_response(200, &json!({"execution": m.id, "key": m.key})),
        Err(e) => admin_error(&e),
    }
}

async fn close_execution(
    State(a): State<Admin>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = admin_check(&a, &headers) {
        return *r;
    }
    match a.gw.close_execution(&id) {
        Ok(m) => json_response(200, &json!({"execution": m.id, "closed": true})),
        Err(e) => admin_error(&e),
    }
}

async fn trace(State(a): State<Admin>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Err(r) = admin_check(&a, &headers) {
        return *r;
    }
    match a.gw.trace_jsonl(&id) {
        Ok(t) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            t,
        )
            .into_response(),
        Err(e) => admin_error(&e),
    }
}

async fn list(State(a): State<Admin>, headers: HeaderMap) -> Response {
    if let Err(r) = admin_check(&a, &headers) {
        return *r;
    }
    let list: Vec<Value> =
        a.gw.list_executions()
            .into_iter()
            .map(|(m, calls)| {
                json!({"execution": m.id, "closed": m.closed, "calls": calls,
                                 "group": m.group, "query": m.query})
            })
            .collect();
    json_response(200, &json!({"executions": list}))
}

async fn metrics(State(a): State<Admin>, headers: HeaderMap) -> Response {
    if let Err(r) = admin_check(&a, &headers) {
        return *r;
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        a.gw.metrics_text(),
    )
        .into_response()
}

pub fn admin_router(gw: Arc<Gateway>, token: &str) -> Router {
    Router::new()
        .route("/admin/executions", post(create_execution).get(list))
        .route("/admin/executions/{id}/close", post(close_execution))
        .route("/admin/executions/{id}/trace", get(trace))
        .route("/metrics", get(metrics))
        .with_state(Admin {
            gw,
            token: token.into(),
        })
}
