//! `--engine sglang=URL[,URL…]`: SGLang servers (or `gyre serve`
//! processes) behind the gateway's engine trait.
//!
//! Each call streams one `/generate` (the prompt ids, `return_logprob`, a
//! rid) from the server with the fewest calls this gateway has in flight,
//! ties going round-robin, so a retry after a failure lands on the next
//! server; the cumulative chunks SGLang streams become one token event per
//! new id with its behaviour log-prob. Cancelling (or dropping) the
//! generation aborts it on the server by rid. The server's EOS ids end the
//! turn; its `weight_version` becomes the policy version the gateway
//! records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::engine::{
    Engine, EngineError, EngineEvent, EngineFinish, GenerateRequest, Generation, SamplingParams,
};
use crate::backends::sglang::{
    ClientConfig, Finish, GenerateRequest as Wire, Sampling, SglangClient, SglangError,
};

/// What the servers said when the gateway connected.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerInfo {
    pub url: String,
    pub context: usize,
    /// `/get_model_info`'s `architecture` (`gyre` for Gyre's byte model).
    pub architecture: Option<String>,
    /// `/get_model_info`'s `vocab_size`, where the server reports it.
    pub vocab_size: Option<usize>,
    pub weight_version: Option<u64>,
}

struct Server {
    client: SglangClient,
    in_flight: Arc<AtomicUsize>,
}

pub struct SglangEngine {
    name: String,
    servers: Vec<Server>,
    next: AtomicUsize,
    rids: AtomicU64,
    version: Arc<AtomicU64>,
    context: usize,
}

fn as_usize(v: &Value, k: &str) -> Option<usize> {
    v.get(k).and_then(Value::as_u64).map(|x| x as usize)
}

/// Asks each server for its context and model; the smallest context bounds
/// every call.
pub async fn probe(urls: &[String], within: Duration) -> Result<Vec<ServerInfo>, SglangError> {
    let mut out = Vec::new();
    for url in urls {
        let c = SglangClient::new(url, ClientConfig::default())?;
        c.wait_serving(within).await?;
        let info = c.get_server_info().await?;
        let context = as_usize(&info, "context_length")
            .or_else(|| as_usize(&info, "max_total_num_tokens"))
            .ok_or_else(|| SglangError::Malformed {
                endpoint: "/get_server_info",
                message: format!("no context_length in {info}"),
            })?;
        let (architecture, vocab_size) = match c.get_model_info().await {
            Ok(m) => (
                m.get("architecture")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                as_usize(&m, "vocab_size"),
            ),
            Err(_) => (None, None),
        };
        let weight_version = c
            .get_weight_version()
            .await
            .ok()
            .and_then(|v| v.parse().ok());
        out.push(ServerInfo {
            url: url.clone(),
            context,
            architecture,
            vocab_size,
            weight_version,
        });
    }
    Ok(out)
}

impl SglangEngine {
    /// An engine over the probed servers (fresh clients: the probe's ran
    /// on another runtime).
    pub fn new(servers: &[ServerInfo], cfg: ClientConfig) -> Result<Self, SglangError> {
        let clients = servers
            .iter()
            .map(|s| {
                Ok(Server {
                    client: SglangClient::new(&s.url, cfg.clone())?,
                    in_flight: Arc::default(),
                })
            })
            .collect::<Result<Vec<_>, SglangError>>()?;
        if clients.is_empty() {
            return Err(SglangError::BadUrl {
                url: String::new(),
                message: "no server URL given".into(),
            });
        }
        Ok(Self {
            name: "sglang".into(),
            servers: clients,
            next: AtomicUsize::new(0),
            rids: AtomicU64::new(1),
            version: Arc::new(AtomicU64::new(
                servers
                    .iter()
                    .filter_map(|s| s.weight_version)
                    .max()
                    .unwrap_or(0),
            )),
            context: servers.iter().map(|s| s.context).min().unwrap_or(0),
        })
    }

    /// The server with the fewest calls in flight, ties round-robin.
    fn pick(&self) -> usize {
        let n = self.servers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&i| self.servers[i].in_flight.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Calls in flight on each server, in URL order.
    pub fn in_flight(&self) -> Vec<usize> {
        self.servers
            .iter()
            .map(|s| s.in_flight.load(Ordering::Relaxed))
            .collect()
    }
}

fn wire(request: &GenerateRequest, rid: String) -> Wire {
    let p: &SamplingParams = &request.params;
    Wire {
        input_ids: Some(request.prompt.to_vec()),
        sampling_params: Sampling {
            max_new_tokens: Some(p.max_tokens),
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k.map(i64::from),
            seed: p.seed,
            ..Sampling::default()
        },
        rid: Some(rid),
        return_logprob: true,
        ..Wire::default()
    }
}

/// Counts a call in flight on a server until it ends, however it ends.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn stream(
    client: &SglangClient,
    req: &Wire,
    events: &mpsc::Sender<EngineEvent>,
    version: &AtomicU64,
) -> Result<EngineFinish, SglangError> {
    let mut s = client.generate_stream(req).await?;
    let mut sent = 0;
    while let Some(chunk) = s.next().await {
        let g = chunk?;
        if g.logprobs.len() < g.output_ids.len() {
            return Err(SglangError::Malformed {
                endpoint: "/generate",
                message: format!(
                    "{} output ids but {} log-probs",
                    g.output_ids.len(),
                    g.logprobs.len()
                ),
            });
        }
        for i in sent..g.output_ids.len() {
            let token = EngineEvent::Token {
                id: g.output_ids[i],
                logprob: g.logprobs[i],
            };
            if events.send(token).await.is_err() {
                return Ok(EngineFinish::Failed("the client went away".into()));
            }
        }
        sent = sent.max(g.output_ids.len());
        if let Some(v) = g.weight_version.as_deref().and_then(|v| v.parse().ok()) {
            version.fetch_max(v, Ordering::Relaxed);
        }
        match g.finish {
            None => {}
            Some(Finish::Stop { .. }) => return Ok(EngineFinish::EndOfTurn),
            Some(Finish::Length) => return Ok(EngineFinish::Length),
            Some(Finish::Abort { message }) => {
                return Ok(EngineFinish::Failed(format!(
                    "the server aborted the call: {}",
                    message.unwrap_or_default()
                )));
            }
        }
    }
    Err(SglangError::StreamBroken {
        endpoint: "/generate",
        message: "no finished chunk before [DONE]".into(),
    })
}

impl Engine for SglangEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn policy_version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    fn context_window(&self) -> usize {
        self.context
    }

    fn start(&self, request: GenerateRequest) -> Result<Generation, EngineError> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|e| EngineError::Unavailable(format!("no async runtime: {e}")))?;
        let ix = self.pick();
        let server = &self.servers[ix];
        let in_flight = InFlight::new(&server.in_flight);
        let rid = format!(
            "gw-{}-{}-{}",
            request.execution,
            request.call_id,
            self.rids.fetch_add(1, Ordering::Relaxed)
        );
        let req = wire(&request, rid.clone());
        let client = server.client.clone();
        let (tx, rx) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let version = self.version.clone();
        rt.spawn(async move {
            let _in_flight = in_flight;
            let finish = tokio::select! {
                r = stream(&client, &req, &tx, &version) => match r {
                    Ok(f) => f,
                    Err(e) => EngineFinish::Failed(e.to_string()),
                },
                () = stop.cancelled() => {
                    if let Err(e) = client.abort(&rid).await {
                        tracing::warn!(%rid, error = %e, "abort after cancel");
                    }
                    return;
                }
            };
            let _ = tx.send(EngineEvent::Finish(finish)).await;
        });
        Ok(Generation { events: rx, cancel })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("--engine sglang: {0}")]
    Server(#[from] SglangError),
    #[error("--engine sglang: {0}")]
    Renderer(String),
    #[error("--engine sglang: cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// How long start-up waits for each server to be healthy.
const STARTUP: Duration = Duration::from_secs(120);

/// `--engine sglang=URL[,URL…]`: probes the servers and picks the
/// renderer: `tokenizer_dir` when given, the embedded model's own when
/// every server serves Gyre's byte model, else the built-in one.
pub fn connect(
    urls: &str,
    tokenizer_dir: Option<&std::path::Path>,
) -> Result<(Arc<dyn Engine>, super::render::Renderer), ConnectError> {
    let urls: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ConnectError::Runtime)?;
    let infos = rt.block_on(probe(&urls, STARTUP))?;
    let engine = SglangEngine::new(&infos, ClientConfig::default())?;
    let gyre = infos
        .iter()
        .all(|i| i.architecture.as_deref() == Some("gyre"));
    // Gyre's model comes with the byte vocabulary (the byte game's) or
    // with the shipped BPE; the smallest vocabulary served decides.
    let vocab = infos.iter().filter_map(|i| i.vocab_size).min();
    let renderer = match tokenizer_dir {
        Some(dir) => super::render::Renderer::from_dir(dir).map_err(|e| e.to_string()),
        None if gyre => super::embedded::renderer_for_vocab(vocab).map_err(|e| e.to_string()),
        None => super::render::Renderer::builtin().map_err(|e| e.to_string()),
    }
    .map_err(ConnectError::Renderer)?;
    tracing::info!(servers = ?urls, context = engine.context, "SGLang engine");
    Ok((Arc::new(engine), renderer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(url: &str, context: usize, v: Option<u64>) -> ServerInfo {
        ServerInfo {
            url: url.into(),
            context,
            architecture: None,
            vocab_size: None,
            weight_version: v,
        }
    }

    #[test]
    fn calls_go_to_the_least_loaded_server_ties_in_turn() {
        let e = SglangEngine::new(
            &[
                info("http://127.0.0.1:1", 512, Some(3)),
                info("http://127.0.0.1:2", 256, None),
            ],
            ClientConfig::default(),
        )
        .unwrap();
        assert_eq!((e.context_window(), e.policy_version()), (256, 3));
        let a = e.pick();
        let b = e.pick();
        assert_ne!(a, b, "ties alternate");
        let _busy = InFlight::new(&e.servers[0].in_flight);
        assert_eq!((e.pick(), e.pick()), (1, 1), "the idle one first");
        assert_eq!(e.in_flight(), vec![1, 0]);
        assert!(SglangEngine::new(&[], ClientConfig::default()).is_err());
    }
}
