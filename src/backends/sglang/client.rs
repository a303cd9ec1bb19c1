//! An async client for one SGLang server (or `gyre serve`): every endpoint
//! the engine protocol needs, with timeouts, and failures mapped to
//! [`SglangError`]. Weight-version updates always send
//! `abort_all_requests: false`: SGLang's default aborts every request in
//! flight (radixark/miles#2372), which would cut executions that Gyre
//! keeps running across publications.

use std::collections::VecDeque;
use std::time::Duration;

use base64::Engine as _;
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};

use super::error::SglangError;
use super::sse::{DONE, SseFramer};
use super::wire::{GYRE_PARAM_BUFFER, GenerateRequest, Generation, parse_generation};

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Longest wait for a whole non-streamed answer (or, streaming, for the
    /// next chunk).
    pub timeout: Duration,
    pub connect_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// The server's health as `/health` and `/health_generate` report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Up and able to generate.
    Serving,
    /// Up, but not generating now (starting, or memory released).
    NotServing { status: u16, message: String },
}

/// How busy the server is (`/get_load`), for routing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Load {
    pub running: usize,
    pub waiting: usize,
    /// Tokens held in the KV cache, when the server reports them.
    pub tokens: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct SglangClient {
    base: String,
    http: Client,
    cfg: ClientConfig,
}

impl SglangClient {
    pub fn new(base: &str, cfg: ClientConfig) -> Result<Self, SglangError> {
        let base = base.trim_end_matches('/').to_string();
        let bad = |m: String| SglangError::BadUrl {
            url: base.clone(),
            message: m,
        };
        let url = reqwest::Url::parse(&base).map_err(|e| bad(e.to_string()))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(bad(format!("scheme {} is not http(s)", url.scheme())));
        }
        let http = Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(SglangClient { base, http, cfg })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    fn send_error(&self, endpoint: &'static str, e: reqwest::Error) -> SglangError {
        if e.is_timeout() {
            SglangError::Timeout {
                url: self.base.clone(),
                endpoint,
                after: self.cfg.timeout,
            }
        } else {
            SglangError::Unreachable {
                url: self.base.clone(),
                message: format!("{endpoint}: {e}"),
            }
        }
    }

    async fn post(
        &self,
        endpoint: &'static str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<Response, SglangError> {
        let mut req = self
            .http
            .post(format!("{}{endpoint}", self.base))
            .json(body);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        let resp = req.send().await.map_err(|e| self.send_error(endpoint, e))?;
        check_status(endpoint, resp).await
    }

    async fn get(&self, endpoint: &'static str) -> Result<Response, SglangError> {
        self.http
            .get(format!("{}{endpoint}", self.base))
            .timeout(self.cfg.timeout)
            .send()
            .await
            .map_err(|e| self.send_error(endpoint, e))
    }

    async fn json(&self, endpoint: &'static str, resp: Response) -> Result<Value, SglangError> {
        let text = resp
            .text()
            .await
            .map_err(|e| self.send_error(endpoint, e))?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| SglangError::Malformed {
            endpoint,
            message: format!("{e}: {}", clip(&text)),
        })
    }

    /// A control call whose answer may carry `success: false`.
    pub(crate) async fn control(
        &self,
        endpoint: &'static str,
        body: Value,
    ) -> Result<Value, SglangError> {
        let resp = self.post(endpoint, &body, Some(self.cfg.timeout)).await?;
        let status = resp.status().as_u16();
        let v = self.json(endpoint, resp).await?;
        if v.get("success").and_then(Value::as_bool) == Some(false) {
            return Err(SglangError::Unsuccessful {
                endpoint,
                status,
                message: message_of(&v),
            });
        }
        Ok(v)
    }

    /// One generation, whole. `stream` in `req` is ignored.
    pub async fn generate(&self, req: &GenerateRequest) -> Result<Generation, SglangError> {
        let mut body = serde_json::to_value(req).map_err(|e| SglangError::Malformed {
            endpoint: "/generate",
            message: e.to_string(),
        })?;
        body["stream"] = json!(false);
        let resp = self
            .post("/generate", &body, Some(self.cfg.timeout))
            .await?;
        let v = self.json("/generate", resp).await?;
        // Some SGLang versions answer a one-prompt request with a list.
        let v = match v {
            Value::Array(mut a) if a.len() == 1 => a.remove(0),
            v => v,
        };
        parse_generation(&v).map_err(|message| SglangError::Malformed {
            endpoint: "/generate",
            message,
        })
    }

    /// One generation, streamed: each item is the generation so far
    /// (cumulative, as SGLang streams by default), the last one finished.
    pub async fn generate_stream(
        &self,
        req: &GenerateRequest,
    ) -> Result<GenerateStream, SglangError> {
        let mut body = serde_json::to_value(req).map_err(|e| SglangError::Malformed {
            endpoint: "/generate",
            message: e.to_string(),
        })?;
        body["stream"] = json!(true);
        let resp = self.post("/generate", &body, None).await?;
        Ok(GenerateStream {
            resp,
            framer: SseFramer::default(),
            ready: VecDeque::new(),
            done: false,
            chunk_timeout: self.cfg.timeout,
            url: self.base.clone(),
        })
    }

    /// Aborts a request by `rid`; it finishes with reason `abort` and its
    /// partial output. Unknown rids are not an error (it may have just
    /// finished).
    pub async fn abort(&self, rid: &str) -> Result<(), SglangError> {
        self.post(
            "/abort_request",
            &json!({"rid": rid, "abort_all": false}),
            Some(self.cfg.timeout),
        )
        .await?;
        Ok(())
    }

    /// Frees the memory of `tags` (`weights`, `kv_cache`; all when empty).
    pub async fn release_memory(&self, tags: &[&str]) -> Result<(), SglangError> {
        self.control("/release_memory_occupation", tags_body(tags))
            .await
            .map(drop)
    }

    pub async fn resume_memory(&self, tags: &[&str]) -> Result<(), SglangError> {
        self.control("/resume_memory_occupation", tags_body(tags))
            .await
            .map(drop)
    }

    /// Loads weights from a checkpoint the server can read.
    pub async fn update_weights_from_disk(
        &self,
        model_path: &str,
        weight_version: Option<&str>,
    ) -> Result<(), SglangError> {
        self.control(
            "/update_weights_from_disk",
            json!({
                "model_path": model_path,
                "abort_all_requests": false,
                "weight_version": weight_version,
            }),
        )
        .await
        .map(drop)
    }

    /// Sends Gyre's flat parameter buffer (`ParamBuffer::encode` bytes).
    /// Only `gyre serve` reads this format; SGLang's own tensors are
    /// pickled torch tensors, which Gyre does not produce.
    pub async fn update_weights_from_tensor(
        &self,
        param_buffer: &[u8],
        weight_version: Option<&str>,
    ) -> Result<(), SglangError> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(param_buffer);
        self.control(
            "/update_weights_from_tensor",
            json!({
                "serialized_named_tensors": [b64],
                "load_format": GYRE_PARAM_BUFFER,
                "flush_cache": true,
                "abort_all_requests": false,
                "weight_version": weight_version,
            }),
        )
        .await
        .map(drop)
    }

    /// Relabels the serving weights; requests in flight keep running.
    pub async fn update_weight_version(&self, version: &str) -> Result<(), SglangError> {
        self.control(
            "/update_weight_version",
            json!({"new_version": version, "abort_all_requests": false}),
        )
        .await
        .map(drop)
    }

    pub async fn get_weight_version(&self) -> Result<String, SglangError> {
        let endpoint = "/get_weight_version";
        let resp = check_status(endpoint, self.get(endpoint).await?).await?;
        let v = self.json(endpoint, resp).await?;
        match v.get("weight_version") {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            _ => Err(SglangError::Malformed {
                endpoint,
                message: format!("no weight_version in {v}"),
            }),
        }
    }

    pub async fn get_server_info(&self) -> Result<Value, SglangError> {
        let endpoint = "/get_server_info";
        let resp = check_status(endpoint, self.get(endpoint).await?).await?;
        self.json(endpoint, resp).await
    }

    pub async fn get_model_info(&self) -> Result<Value, SglangError> {
        let endpoint = "/get_model_info";
        let resp = check_status(endpoint, self.get(endpoint).await?).await?;
        self.json(endpoint, resp).await
    }

    /// Running and waiting requests (`/get_load`; SGLang answers one entry
    /// per data-parallel rank, which are summed).
    pub async fn get_load(&self) -> Result<Load, SglangError> {
        let endpoint = "/get_load";
        let resp = check_status(endpoint, self.get(endpoint).await?).await?;
        let v = self.json(endpoint, resp).await?;
        let ranks = match v {
            Value::Array(a) => a,
            v @ Value::Object(_) => vec![v],
            v => {
                return Err(SglangError::Malformed {
                    endpoint,
                    message: format!("expected a list of ranks, got {v}"),
                });
            }
        };
        let n = |r: &Value, k: &str| r.get(k).and_then(Value::as_u64).map(|x| x as usize);
        let mut load = Load::default();
        for r in &ranks {
            let waiting = n(r, "num_waiting_reqs").unwrap_or(0);
            load.waiting += waiting;
            load.running += n(r, "num_reqs").unwrap_or(0).saturating_sub(waiting);
            if let Some(t) = n(r, "num_tokens") {
                *load.tokens.get_or_insert(0) += t;
            }
        }
        Ok(load)
    }

    /// `/health_generate` (falling back to `/health` on servers without
    /// it): serving, up but not serving, or an error when unreachable.
    pub async fn health(&self) -> Result<Health, SglangError> {
        let mut resp = self.get("/health_generate").await?;
        if resp.status() == StatusCode::NOT_FOUND {
            resp = self.get("/health").await?;
        }
        let status = resp.status();
        if status.is_success() {
            return Ok(Health::Serving);
        }
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .map(|v| message_of(&v))
            .unwrap_or(text);
        Ok(Health::NotServing {
            status: status.as_u16(),
            message,
        })
    }

    /// Polls health until serving or `within` has passed.
    pub async fn wait_serving(&self, within: Duration) -> Result<(), SglangError> {
        let start = std::time::Instant::now();
        loop {
            let last = self.health().await;
            if matches!(last, Ok(Health::Serving)) {
                return Ok(());
            }
            if start.elapsed() >= within {
                return Err(match last {
                    Err(e) => e,
                    Ok(_) => SglangError::Timeout {
                        url: self.base.clone(),
                        endpoint: "/health_generate",
                        after: within,
                    },
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn tags_body(tags: &[&str]) -> Value {
    if tags.is_empty() {
        json!({})
    } else {
        json!({ "tags": tags })
    }
}

fn clip(s: &str) -> String {
    s.chars().take(300).collect()
}

/// SGLang's error bodies: `{"error": {"message"}}`, `{"message"}`,
/// `{"detail"}` (FastAPI), or text.
fn message_of(v: &Value) -> String {
    v.pointer("/error/message")
        .or_else(|| v.get("message"))
        .or_else(|| v.get("detail"))
        .or_else(|| v.get("error"))
        .map(|m| match m {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| clip(&v.to_string()))
}

async fn check_status(endpoint: &'static str, resp: Response) -> Result<Response, SglangError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let text = resp.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text)
        .map(|v| message_of(&v))
        .unwrap_or_else(|_| clip(&text));
    let code = status.as_u16();
    Err(if status.is_client_error() {
        SglangError::Refused {
            endpoint,
            status: code,
            message,
        }
    } else {
        SglangError::Server {
            endpoint,
            status: code,
            message,
        }
    })
}

/// A streamed generation in progress.
pub struct GenerateStream {
    resp: Response,
    framer: SseFramer,
    ready: VecDeque<String>,
    done: bool,
    chunk_timeout: Duration,
    url: String,
}

impl GenerateStream {
    /// The next chunk; `None` after `[DONE]`. A stream that ends without
    /// `[DONE]` (the server died) is an error.
    pub async fn next(&mut self) -> Option<Result<Generation, SglangError>> {
        let endpoint = "/generate";
        loop {
            if let Some(payload) = self.ready.pop_front() {
                if payload.trim() == DONE {
                    self.done = true;
                    return None;
                }
                let parsed = serde_json::from_str::<Value>(&payload)
                    .map_err(|e| e.to_string())
                    .and_then(|v| {
                        if let Some(err) = v.get("error") {
                            return Err(format!("server error in stream: {err}"));
                        }
                        parse_generation(&v)
                    });
                return Some(
                    parsed.map_err(|message| SglangError::Malformed { endpoint, message }),
                );
            }
            if self.done {
                return None;
            }
            let chunk = tokio::time::timeout(self.chunk_timeout, self.resp.chunk()).await;
            let broken = |message: String| SglangError::StreamBroken { endpoint, message };
            match chunk {
                Err(_) => {
                    self.done = true;
                    return Some(Err(SglangError::Timeout {
                        url: self.url.clone(),
                        endpoint,
                        after: self.chunk_timeout,
                    }));
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Some(Err(broken(e.to_string())));
                }
                Ok(Ok(None)) => {
                    self.done = true;
                    return Some(Err(broken("the stream ended without [DONE]".into())));
                }
                Ok(Ok(Some(bytes))) => match self.framer.push(&bytes) {
                    Ok(events) => self.ready.extend(events),
                    Err(m) => {
                        self.done = true;
                        return Some(Err(broken(m)));
                    }
                },
            }
        }
    }

    /// Reads to the end; the finished generation.
    pub async fn finish(mut self) -> Result<Generation, SglangError> {
        let mut last = None;
        while let Some(g) = self.next().await {
            last = Some(g?);
        }
        last.ok_or(SglangError::StreamBroken {
            endpoint: "/generate",
            message: "no chunk before [DONE]".into(),
        })
    }
}
