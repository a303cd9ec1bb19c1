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
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::anthropic;
use super::fields::{Obj, parse_body};
use super::openai;
use super::service::{CallError, Gateway, now_ns};
use super::turn::{self, Delta};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Anthropic,
    OpenAi,
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
        Api::OpenAi => json_response(openai::status(e), &openai::error_body(e)),
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
        let bytes = read_body(&gw, body).await?;
        let obj = parse_body(&bytes)?;
        let default_max = gw.engine.context_window() as u32;
        let req = match api {
            Api::Anthropic => anthropic::parse(&obj, default_max, true)?,
            Api::OpenAi => openai::parse(&obj, default_max)?,
        };
        let opts = openai::options(&obj)?;
        let gw2 = gw.clone();
        let (p, req) =
            tokio::task::spawn_blocking(move || gw2.prepare(&execution, &req).map(|p| (p, req)))
                .await
                .map_err(|e| CallError::Internal(format!("prepare task: {e}")))??;
        Ok::<_, CallError>((p, req, opts))
    }
    .await;
    let (p, req, opts) = match prepared {
        Ok(x) => x,
        Err(e) => return error_response(&gw, api, &e),
    };
    let created = now_ns() / 1_000_000_000;
    let model = req.model.clone();
    let (id, id_prefix) = match api {
        Api::Anthropic => (anthropic::message_id(&p.execution, p.call_index), "toolu_"),
        Api::OpenAi => (
            format!("chatcmpl-{}-{}", p.execution, p.call_index),
            "call_",
        ),
    };
    if !req.stream {
        let outcome =
            match turn::run(&gw, &p, &req.stop, id_prefix, None, &mut |_| Vec::new()).await {
                Ok(o) => o,
                Err(e) => return error_response(&gw, api, &e),
            };
        if let Err(e) = turn::commit(&gw, p, &outcome).await {
            return error_response(&gw, api, &e);
        }
        let body = match api {
            Api::Anthropic => anthropic::response(&id, &model, &outcome),
            Api::OpenAi => openai::response(
                &id,
                &model,
                created,
                &outcome,
                &opts,
                &gw.renderer.tokenizer,
            ),
        };
        return json_response(200, &body);
    }
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let gw2 = gw.clone();
    tokio::spawn(async move {
        let _permit = permit;
        stream_call(gw2, api, p, req, opts, id, id_prefix, created, tx).await;
    });
    sse(rx)
}

#[allow(clippy::too_many_arguments)]
async fn stream_call(
    gw: Arc<Gateway>,
    api: Api,
    p: super::service::Prepared,
    req: super::chat::ChatRequest,
    opts: openai::ChatOptions,
    id: String,
    id_prefix: &'static str,
    created: u64,
    tx: mpsc::Sender<Bytes>,
) {
    let input_tokens = p.prompt.len();
    let mut anth = None;
    let mut oai = None;
    let first = match api {
        Api::Anthropic => {
            let (w, f) = anthropic::StreamWriter::start(&id, &req.model, input_tokens);
            anth = Some(w);
            f
        }
        Api::OpenAi => {
            let (w, f) = openai::ChunkWriter::start(&id, &req.model, created);
            oai = Some(w);
            f
        }
    };
    for f in first {
        if tx.send(f).await.is_err() {
            return;
        }
    }
    let mut frames = |d: &Delta| match (&mut anth, &mut oai) {
        (Some(w), _) => w.delta(d),
        (_, Some(w)) => w.delta(d),
        _ => Vec::new(),
    };
    let result = turn::run(&gw, &p, &req.stop, id_prefix, Some(&tx), &mut frames).await;
    let result = match result {
        Ok(o) => turn::commit(&gw, p, &o).await.map(|_| o),
        Err(e) => Err(e),
    };
    let last = match (result, api) {
        (Ok(o), Api::Anthropic) => anth.as_mut().map(|w| w.finish(&o)).unwrap_or_default(),
        (Ok(o), Api::OpenAi) => oai
            .as_ref()
            .map(|w| w.finish(&o, opts.include_usage))
            .unwrap_or_default(),
        (Err(e), Api::Anthropic) => {
            gw.metrics.errors.fetch_add(1, Ordering::Relaxed);
            vec![anthropic::frame("error", &anthropic::error_body(&e))]
        }
        (Err(e), Api::OpenAi) => {
            gw.metrics.errors.fetch_add(1, Ordering::Relaxed);
            vec![openai::data(&openai::error_body(&e))]
        }
    };
    for f in last {
        if tx.send(f).await.is_err() {
            return;
        }
    }
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
