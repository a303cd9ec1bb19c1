//! `gyre bench gateway`: what the gateway adds over a direct engine call,
//! side by side with the LiteLLM proxy in front of an HTTP upstream of the
//! same fixed latency, and the tokenisation saved by token-exact history.
//!
//! Gyre's direct call is the engine trait itself (its engines are in
//! process); LiteLLM's is an HTTP call to the upstream it proxies. Both
//! proxies answer the same OpenAI chat request; the load generator keeps
//! one keep-alive connection per client and runs on the same cores.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::chat::{Message, Role};
use super::engine::{
    Engine, EngineError, EngineEvent, EngineFinish, GenerateRequest, Generation, SamplingParams,
};
use super::render::{PriorCall, Renderer};

/// An engine that answers after a fixed latency with a fixed output.
pub struct FixedEngine {
    pub latency: Duration,
    pub output: Vec<u32>,
}

impl Engine for FixedEngine {
    fn name(&self) -> &str {
        "fixed"
    }
    fn policy_version(&self) -> u64 {
        0
    }
    fn context_window(&self) -> usize {
        1 << 20
    }
    fn start(&self, _request: GenerateRequest) -> Result<Generation, EngineError> {
        let (tx, rx) = mpsc::channel(self.output.len() + 1);
        let output = self.output.clone();
        let latency = self.latency;
        let cancel = CancellationToken::new();
        tokio::spawn(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            for id in output {
                let _ = tx.send(EngineEvent::Token { id, logprob: -0.5 }).await;
            }
            let _ = tx.send(EngineEvent::Finish(EngineFinish::EndOfTurn)).await;
        });
        Ok(Generation { events: rx, cancel })
    }
}

/// Latency percentiles and throughput of one load cell.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Cell {
    pub clients: usize,
    pub requests: usize,
    pub errors: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub req_per_s: f64,
}

fn summarise(clients: usize, mut lat: Vec<Duration>, errors: usize, wall: Duration) -> Cell {
    lat.sort();
    let pct = |q: f64| {
        if lat.is_empty() {
            return f64::NAN;
        }
        let i = ((lat.len() as f64 - 1.0) * q).round() as usize;
        lat[i].as_secs_f64() * 1e3
    };
    Cell {
        clients,
        requests: lat.len(),
        errors,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        req_per_s: lat.len() as f64 / wall.as_secs_f64(),
    }
}

/// Direct engine calls from `clients` concurrent tasks for `duration`.
pub async fn direct_engine(engine: Arc<dyn Engine>, clients: usize, duration: Duration) -> Cell {
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let prompt: Arc<[u32]> = vec![1u32; 32].into();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let req = GenerateRequest {
                        execution: format!("bench-{c}"),
                        call_id: String::new(),
                        call_index: 0,
                        prompt: prompt.clone(),
                        resumed: 0,
                        params: SamplingParams {
                            max_tokens: 64,
                            ..SamplingParams::default()
                        },
                    };
                    let Ok(mut g) = engine.start(req) else {
                        continue;
                    };
                    while let Some(e) = g.events.recv().await {
                        if matches!(e, EngineEvent::Finish(_)) {
                            break;
                        }
                    }
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    summarise(clients, all, 0, start.elapsed())
}

/// HTTP POSTs of `body` to `addr` `path` with `auth`, one keep-alive
/// connection per client.
pub async fn http_load(
    addr: SocketAddr,
    path: &str,
    auth: &str,
    body: Bytes,
    clients: usize,
    duration: Duration,
) -> Cell {
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (path, auth, body) = (path.to_string(), auth.to_string(), body.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0usize;
                'connect: while Instant::now() < deadline {
                    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let Ok((mut send, conn)) = hyper::client::conn::http1::handshake(io).await
                    else {
                        errors += 1;
                        continue;
                    };
                    tokio::spawn(conn);
                    while Instant::now() < deadline {
                        let req = hyper::Request::post(path.as_str())
                            .header("host", addr.to_string())
                            .header("content-type", "application/json")
                            .header("authorization", format!("Bearer {auth}"))
                            .body(Full::new(body.clone()));
                        let Ok(req) = req else { break 'connect };
                        let t = Instant::now();
                        match send.send_request(req).await {
                            Ok(resp) => {
                                let ok = resp.status().is_success();
                                let collected = resp.into_body().collect().await;
                                if ok && collected.is_ok() {
                                    lat.push(t.elapsed());
                                } else {
                                    errors += 1;
                                }
                            }
                            Err(_) => {
                                errors += 1;
                                continue 'connect;
                            }
                        }
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap_or_default();
        all.extend(l);
        errors += e;
    }
    summarise(clients, all, errors, start.elapsed())
}

/// A fixed-latency OpenAI-compatible upstream (for LiteLLM and its direct
/// baseline): one chat completion, always the same.
pub fn upstream_router(latency: Duration) -> axum::Router {
    let body = json!({"id": "chatcmpl-up", "object": "chat.completion", "created": 0, "model": "up",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "a fixed reply of about twenty tokens from the upstream server, always the same"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}})
    .to_string();
    let handler = move || {
        let body = body.clone();
        async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            ([("content-type", "application/json")], body)
        }
    };
    axum::Router::new().route("/v1/chat/completions", axum::routing::post(handler))
}

/// Tokenisation cost of extending a `context`-token conversation by about
/// `added` tokens: (suffix-only seconds, whole re-tokenisation seconds).
pub fn tokenisation_ratio(
    r: &Renderer,
    context: usize,
    added: usize,
) -> Result<(f64, f64, usize, usize), super::render::RenderError> {
    let turn = "x".repeat(1000);
    let mut messages = vec![Message::text(Role::System, "bench")];
    let mut rendered = 0;
    while rendered < context {
        messages.push(Message::text(Role::User, turn.clone()));
        messages.push(Message::text(Role::Assistant, turn.clone()));
        rendered += 2 * 1000 + 10;
    }
    let prior = r.full(&messages[..messages.len() - 1], &[])?;
    let output = r
        .tokenizer
        .encode(&format!("{turn}{}", r.tokenizer.eos_text()))?;
    messages.push(Message::text(Role::User, "y".repeat(added)));
    let t = Instant::now();
    let extended = r.prompt(
        &messages,
        &[],
        Some(PriorCall {
            input_ids: &prior.ids,
            output_ids: &output,
            matched: messages.len() - 1,
        }),
    )?;
    let suffix_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let full = r.full(&messages, &[])?;
    let full_s = t.elapsed().as_secs_f64();
    Ok((suffix_s, full_s, extended.ids.len(), full.ids.len()))
}
