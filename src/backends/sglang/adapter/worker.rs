//! The adapter's state machine: the engine protocol over one server.
//!
//! Each accepted call reads its prompt, then becomes one `/generate` HTTP
//! call (its own I/O request, so calls run concurrently and the server
//! batches them); its answer is written as the call's TITO record and
//! answered `Done`. Controls (the start-up sync, cancel, unload, load, new
//! weights) run one at a time in arrival order, each one HTTP job.
//!
//! Failure policy, as the embedded engine's: a call the server refuses as
//! malformed (4xx) will never get better and is answered `Done` with an
//! empty output; a dead, slow or failing server, an unreadable answer or an
//! abort the adapter did not ask for is answered `Rejected`, the engine
//! protocol's "serve it elsewhere", which the proxy retries on the next
//! route. A control whose HTTP call fails is still answered (the cell must
//! move on), counted as an error.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gyre_actors::sched::ids::{EngineIx, Version};
use gyre_actors::sched::proto::engine::{CallEvent, EngineEvent, EngineReq};
use gyre_actors::sched::proto::payload::Prompt;
use gyre_runtime::{Actor, ActorId, BlobId, Cx, IoError, Recipient};
use serde::{Deserialize, Serialize};

use super::http::{FailureKind, HttpCall, HttpFailure};
use super::publish::{Publish, prune, write_version};
use super::{AdapterConfig, AdapterStats};
use crate::backends::sglang::wire::{TAG_KV_CACHE, TAG_WEIGHTS};
use crate::backends::sglang::{Finish, GenerateRequest, Sampling, SglangClient};
use crate::embedded::engine::calls::{self, CallBook, PromptRead, Recorded};
use crate::embedded::engine::{CallKey, EngineStats, call_seed};
use crate::embedded::shared::{Shared, WeightStore};

/// A finished `/generate`, as a message carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Generated {
    pub output_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// The server aborted it.
    pub aborted: bool,
    /// The server's `weight_version`, when it is an integer.
    pub version: Option<Version>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ControlOut {
    Synced { version: Version },
    Aborted,
    Released,
    Loaded { version: Version },
    WeightsSet { version: Version },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum SglangEngineMsg {
    Req(EngineReq),
    Prompt {
        key: CallKey,
        prompt: Result<Prompt, IoError>,
    },
    Generated {
        key: CallKey,
        result: Result<Generated, HttpFailure>,
    },
    /// The control job in flight finished.
    Control(Result<ControlOut, HttpFailure>),
    Recorded(Recorded),
}

impl From<EngineReq> for SglangEngineMsg {
    fn from(r: EngineReq) -> Self {
        SglangEngineMsg::Req(r)
    }
}

fn flatten<T>(r: Result<Result<T, HttpFailure>, IoError>) -> Result<T, HttpFailure> {
    r.unwrap_or_else(|e| {
        Err(HttpFailure {
            kind: FailureKind::Retryable,
            message: e.to_string(),
        })
    })
}

/// The adapter's side of an accepted call: its `/generate` is on the way.
#[derive(Debug, Default)]
struct Sent(bool);

type Live = calls::Live<Sent>;

#[derive(Debug)]
enum Control {
    Sync,
    Cancel {
        reply_to: Recipient<EngineEvent>,
    },
    Unload {
        reply_to: Recipient<EngineEvent>,
    },
    Load {
        version: Version,
        reply_to: Recipient<EngineEvent>,
    },
    SetWeights {
        version: Version,
    },
}

/// The engine protocol answered by an SGLang server (or `gyre serve`).
#[derive(Debug)]
pub struct SglangEngine {
    ix: EngineIx,
    client: SglangClient,
    cfg: AdapterConfig,
    shared: Shared,
    seed: u64,
    /// The start-up sync is done: calls go to the server.
    ready: bool,
    admitting: bool,
    loaded: bool,
    version: Version,
    announced: Version,
    calls: CallBook<Sent>,
    /// Calls whose prompt is read, waiting for the start-up sync.
    waiting: VecDeque<CallKey>,
    /// Rids aborted whose `/generate` has not answered yet: an unload
    /// aborts them again before releasing memory.
    aborting: BTreeSet<CallKey>,
    controls: VecDeque<Control>,
    running: Option<(Control, Vec<CallKey>)>,
    stats: EngineStats,
    http: AdapterStats,
}

impl SglangEngine {
    /// An adapter for engine `ix` over `client`; `seed` is the run's base
    /// for every call's sampling seed (as the embedded engine's).
    pub fn new(
        ix: EngineIx,
        client: SglangClient,
        mut cfg: AdapterConfig,
        shared: Shared,
        seed: u64,
    ) -> Self {
        // Each server gets its own directory of versions: pruning one
        // never removes a version another server is about to load.
        if let Publish::Disk(d) = &mut cfg.publish {
            d.dir = d.dir.join(crate::embedded::engine::engine_name(ix));
        }
        Self {
            ix,
            client,
            cfg,
            shared,
            seed,
            ready: false,
            admitting: true,
            loaded: true,
            version: 0,
            announced: 0,
            calls: CallBook::default(),
            waiting: VecDeque::new(),
            aborting: BTreeSet::new(),
            controls: VecDeque::new(),
            running: None,
            stats: EngineStats::default(),
            http: AdapterStats::default(),
        }
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    pub fn http_stats(&self) -> AdapterStats {
        self.http
    }

    pub fn ix(&self) -> EngineIx {
        self.ix
    }

    pub fn url(&self) -> &str {
        self.client.url()
    }

    /// The version the server serves (as of the last control).
    pub fn version(&self) -> Version {
        self.version
    }

    pub fn is_serving(&self) -> bool {
        self.loaded && self.admitting
    }

    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    fn rid(&self, key: CallKey) -> String {
        format!(
            "gyre-{}-{}-{}-{}",
            crate::embedded::engine::engine_name(self.ix),
            key.call.exec.0,
            key.call.seq,
            key.attempt
        )
    }

    fn serve(
        &mut self,
        key: CallKey,
        prompt: BlobId,
        reply_to: Recipient<CallEvent>,
        cx: &mut Cx<'_, Self>,
    ) {
        let (serving, blobs) = (self.is_serving(), self.shared.blobs.clone());
        let read = move |prompt| SglangEngineMsg::Prompt { key, prompt };
        let stats = &mut self.stats;
        self.calls.accept(
            serving,
            key,
            prompt,
            reply_to,
            Sent(false),
            blobs,
            stats,
            cx,
            read,
        );
    }

    fn prompt_read(
        &mut self,
        key: CallKey,
        prompt: Result<Prompt, IoError>,
        cx: &mut Cx<'_, Self>,
    ) {
        match self.calls.prompt_read(key, prompt, &mut self.stats) {
            PromptRead::Ready if self.ready => self.generate(key, cx),
            PromptRead::Ready => self.waiting.push_back(key),
            PromptRead::Ignored => {}
            PromptRead::Unreadable(live) => {
                self.answer(key, live, Vec::new(), Vec::new(), self.version, cx)
            }
        }
    }

    /// Sends the call's `/generate`.
    fn generate(&mut self, key: CallKey, cx: &mut Cx<'_, Self>) {
        let rid = self.rid(key);
        let seed = call_seed(self.seed, key.call);
        let Some(live) = self.calls.get_mut(&key) else {
            return;
        };
        let Some(p) = live.prompt.as_ref() else {
            return;
        };
        live.ext = Sent(true);
        let req = GenerateRequest {
            input_ids: Some(p.input_ids.clone()),
            sampling_params: Sampling {
                max_new_tokens: Some(p.max_new_tokens),
                temperature: Some(p.temperature),
                top_p: Some(p.top_p),
                top_k: None,
                stop_token_ids: p.stop_tokens.clone(),
                // The prompt's stop tokens are the whole stopping rule, as
                // in the embedded engine.
                ignore_eos: true,
                seed: Some(seed),
                stop: None,
            },
            rid: Some(rid),
            return_logprob: true,
            ..GenerateRequest::default()
        };
        let client = self.client.clone();
        let call = HttpCall::new("sglang.generate", async move {
            let g = client.generate(&req).await?;
            Ok(Generated {
                aborted: matches!(g.finish, Some(Finish::Abort { .. })),
                version: g.weight_version.as_deref().and_then(|v| v.parse().ok()),
                output_ids: g.output_ids,
                logprobs: g.logprobs,
            })
        });
        cx.io(call, move |r| SglangEngineMsg::Generated {
            key,
            result: flatten(r),
        });
    }

    fn generated(
        &mut self,
        key: CallKey,
        result: Result<Generated, HttpFailure>,
        cx: &mut Cx<'_, Self>,
    ) {
        self.aborting.remove(&key);
        let Some(live) = self.calls.remove(&key) else {
            return; // cancelled meanwhile
        };
        let why = match result {
            Ok(g) if g.aborted => "the server aborted the call".to_string(),
            Ok(g) if g.logprobs.len() != g.output_ids.len() => {
                self.stats.errors += 1;
                format!(
                    "{} output tokens but {} log-probs",
                    g.output_ids.len(),
                    g.logprobs.len()
                )
            }
            Ok(g) => {
                self.stats.served += 1;
                self.stats.output_tokens += g.output_ids.len() as u64;
                let version = g.version.unwrap_or(self.version);
                return self.answer(key, live, g.output_ids, g.logprobs, version, cx);
            }
            Err(f) => {
                self.note_failure(&f);
                if f.kind == FailureKind::Refused {
                    tracing::warn!(call = ?key.call, error = %f.message, "the server refused the prompt: answered empty");
                    self.stats.bad_prompts += 1;
                    return self.answer(key, live, Vec::new(), Vec::new(), self.version, cx);
                }
                f.message
            }
        };
        tracing::warn!(engine = ?self.ix, call = ?key.call, %why, "call rejected: retried elsewhere");
        self.reject(key, live.reply_to, cx);
    }

    /// The engine protocol's "serve it elsewhere": the proxy retries the
    /// call on its next route.
    fn reject(&mut self, key: CallKey, reply_to: Recipient<CallEvent>, cx: &mut Cx<'_, Self>) {
        calls::reject(key, reply_to, &mut self.stats, cx);
    }

    fn note_failure(&mut self, f: &HttpFailure) {
        self.http.failures += 1;
        match f.kind {
            FailureKind::Timeout => self.http.timeouts += 1,
            FailureKind::Refused => self.http.refused += 1,
            FailureKind::Retryable | FailureKind::Other => {}
        }
    }

    fn answer(
        &mut self,
        key: CallKey,
        live: Live,
        output: Vec<u32>,
        logprobs: Vec<f32>,
        version: Version,
        cx: &mut Cx<'_, Self>,
    ) {
        let blobs = self.shared.blobs.clone();
        calls::write_answer(
            cx,
            blobs,
            self.ix,
            key,
            live,
            output,
            logprobs,
            version,
            SglangEngineMsg::Recorded,
        );
    }

    /// Answers `Cancelled` for `keys` still live; their `/generate`
    /// answers, when they come, are dropped.
    fn cancel(&mut self, keys: &[CallKey], cx: &mut Cx<'_, Self>) -> u32 {
        let (waiting, aborting) = (&mut self.waiting, &mut self.aborting);
        self.calls.cancel(keys, &mut self.stats, cx, |key, live| {
            waiting.retain(|k| *k != key);
            if live.ext.0 {
                aborting.insert(key);
            }
        })
    }

    fn control(&mut self, op: Control, cx: &mut Cx<'_, Self>) {
        self.controls.push_back(op);
        self.kick(cx);
    }

    fn kick(&mut self, cx: &mut Cx<'_, Self>) {
        while self.running.is_none() {
            let Some(op) = self.controls.pop_front() else {
                return;
            };
            self.issue(op, cx);
        }
    }

    fn issue(&mut self, op: Control, cx: &mut Cx<'_, Self>) {
        let client = self.client.clone();
        let board: Arc<dyn WeightStore> = self.shared.weights.clone();
        let publish = self.cfg.publish.clone();
        let mut calls = Vec::new();
        let job: HttpCall<ControlOut> = match &op {
            Control::Sync => {
                let startup = self.cfg.startup;
                HttpCall::new("sglang.sync", async move {
                    client.wait_serving(startup).await?;
                    let version = push(&client, &*board, None, &publish).await?;
                    Ok(ControlOut::Synced { version })
                })
            }
            Control::Cancel { .. } => {
                calls = self.calls.keys();
                let rids = self.rids(calls.iter().chain(&self.aborting));
                self.http.aborts += rids.len() as u64;
                HttpCall::new("sglang.abort", async move {
                    for rid in rids {
                        client.abort(&rid).await?;
                    }
                    Ok(ControlOut::Aborted)
                })
            }
            Control::Unload { .. } => {
                calls = self.calls.keys();
                let rids = self.rids(calls.iter().chain(&self.aborting));
                let patience = self.cfg.release_patience;
                HttpCall::new("sglang.release", async move {
                    release(&client, &rids, patience).await?;
                    Ok(ControlOut::Released)
                })
            }
            Control::Load { version, .. } => {
                let want = (*version).max(self.announced);
                let current = self.version;
                HttpCall::new("sglang.resume", async move {
                    client.resume_memory(&[]).await?;
                    let version = if want > current {
                        push(&client, &*board, Some(want), &publish).await?
                    } else {
                        current
                    };
                    Ok(ControlOut::Loaded { version })
                })
            }
            Control::SetWeights { version } => {
                // An unloaded server picks the announced version up at Load.
                if !self.loaded || *version <= self.version {
                    return;
                }
                let want = *version;
                HttpCall::new("sglang.update_weights", async move {
                    let version = push(&client, &*board, Some(want), &publish).await?;
                    Ok(ControlOut::WeightsSet { version })
                })
            }
        };
        self.running = Some((op, calls));
        cx.io(job, |r| SglangEngineMsg::Control(flatten(r)));
    }

    fn rids<'a>(&self, keys: impl Iterator<Item = &'a CallKey>) -> Vec<String> {
        keys.copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|k| self.calls.get(k).is_none_or(|l| l.ext.0))
            .map(|k| self.rid(k))
            .collect()
    }

    fn controlled(
        &mut self,
        op: Control,
        calls: Vec<CallKey>,
        out: Result<ControlOut, HttpFailure>,
        cx: &mut Cx<'_, Self>,
    ) {
        if let Err(f) = &out {
            tracing::error!(engine = ?self.ix, url = self.client.url(), ?op, error = %f.message, "control failed");
            self.note_failure(f);
            self.stats.errors += 1;
        }
        match op {
            Control::Sync => {
                self.ready = true;
                match out {
                    Ok(ControlOut::Synced { version }) => self.version = version,
                    _ => {
                        // Not serving: every call is refused until a Load.
                        self.loaded = false;
                        self.admitting = false;
                    }
                }
                let waiting: Vec<CallKey> = self.waiting.drain(..).collect();
                for key in waiting {
                    if self.is_serving() {
                        self.generate(key, cx);
                    } else if let Some(live) = self.calls.remove(&key) {
                        self.reject(key, live.reply_to, cx);
                    }
                }
            }
            Control::Cancel { reply_to } => {
                let cancelled = self.cancel(&calls, cx);
                cx.send(reply_to, EngineEvent::CancelComplete { cancelled });
            }
            Control::Unload { reply_to } => {
                if !calls.is_empty() {
                    tracing::warn!(calls = calls.len(), "unloaded with calls in flight");
                    self.stats.violations += 1;
                }
                self.cancel(&calls, cx);
                cx.send(reply_to, EngineEvent::Unloaded);
            }
            Control::Load { reply_to, .. } => {
                if let Ok(ControlOut::Loaded { version }) = out {
                    if version != self.version {
                        self.stats.weight_updates += 1;
                    }
                    self.version = version;
                    self.loaded = true;
                    self.admitting = true;
                }
                cx.send(
                    reply_to,
                    EngineEvent::Loaded {
                        version: self.version,
                    },
                );
            }
            Control::SetWeights { .. } => {
                if let Ok(ControlOut::WeightsSet { version }) = out {
                    self.stats.weight_updates += 1;
                    self.version = version;
                }
            }
        }
    }
}

/// Pushes a published version (`None`: the newest) to the server,
/// labelled with its version: as Gyre's flat parameter buffer, or as a
/// checkpoint directory the server loads from disk (see [`Publish`]).
async fn push(
    client: &SglangClient,
    board: &dyn WeightStore,
    want: Option<Version>,
    publish: &Publish,
) -> Result<Version, HttpFailure> {
    let found = match want {
        Some(v) => board
            .get(v)
            .map(|b| (v, b))
            .or_else(|| board.latest().filter(|(l, _)| *l >= v)),
        None => board.latest(),
    };
    let (version, bytes) = found.ok_or_else(|| {
        HttpFailure::other(format!("version {want:?} is not on the weight board"))
    })?;
    let label = version.to_string();
    match publish {
        Publish::Tensor => {
            client
                .update_weights_from_tensor(&bytes, Some(&label))
                .await?
        }
        Publish::Disk(d) => {
            let disk = d.clone();
            let path = tokio::task::spawn_blocking(move || write_version(&disk, version, &bytes))
                .await
                .map_err(|e| HttpFailure::other(format!("writing version {version}: {e}")))?
                .map_err(HttpFailure::other)?;
            let path = path
                .to_str()
                .ok_or_else(|| HttpFailure::other(format!("{} is not UTF-8", path.display())))?;
            client.update_weights_from_disk(path, Some(&label)).await?;
            let dir = d.dir.clone();
            let _ = tokio::task::spawn_blocking(move || prune(&dir, version)).await;
        }
    }
    Ok(version)
}

/// Aborts `rids` and releases the server's weights and KV cache; a server
/// still finishing aborted requests refuses the release, so it is retried
/// for up to `patience`.
async fn release(
    client: &SglangClient,
    rids: &[String],
    patience: Duration,
) -> Result<(), HttpFailure> {
    let start = Instant::now();
    loop {
        for rid in rids {
            client.abort(rid).await?;
        }
        match client.release_memory(&[TAG_WEIGHTS, TAG_KV_CACHE]).await {
            Ok(()) => return Ok(()),
            Err(e) if !e.is_retryable() && start.elapsed() < patience => {
                tracing::debug!(error = %e, "release refused; retrying");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

impl Actor for SglangEngine {
    type Msg = SglangEngineMsg;
    type Timer = ();
    gyre_runtime::accepts!(EngineReq);

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        self.control(Control::Sync, cx);
    }

    fn on_msg(&mut self, _from: ActorId, msg: SglangEngineMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            SglangEngineMsg::Req(req) => match req {
                EngineReq::Serve {
                    call,
                    attempt,
                    prompt,
                    reply_to,
                    ..
                } => self.serve(CallKey { call, attempt }, prompt, reply_to, cx),
                EngineReq::StopAdmitting { reply_to } => {
                    self.admitting = false;
                    cx.send(reply_to, EngineEvent::AdmissionStopped);
                }
                EngineReq::PinKv { execs, reply_to } => {
                    // SGLang has no public API to export KV blocks: nothing
                    // is pinned, and each execution's destination recomputes
                    // its prefix.
                    self.stats.kv_recomputed += execs.len() as u64;
                    cx.send(reply_to, EngineEvent::KvPinned { blocks: Vec::new() });
                }
                EngineReq::CancelAll { reply_to } => self.control(Control::Cancel { reply_to }, cx),
                // It cannot adopt another engine's blocks: nothing to wait
                // for, the retried call recomputes its prefix.
                EngineReq::ExpectKv { .. } => {}
                EngineReq::AdoptKv { exec, tokens } => {
                    // Only handed-over pins are adopted, and this engine
                    // pins none; another engine's blocks cannot be imported.
                    tracing::warn!(
                        ?exec,
                        tokens,
                        "AdoptKv on an SGLang engine: prefix recomputed"
                    );
                    self.stats.kv_refused += 1;
                }
                EngineReq::ReleaseKv { .. } => {}
                EngineReq::Unload { reply_to } => {
                    self.admitting = false;
                    self.loaded = false;
                    self.control(Control::Unload { reply_to }, cx);
                }
                EngineReq::Load { version, reply_to } => {
                    self.control(Control::Load { version, reply_to }, cx)
                }
                EngineReq::SetWeights { version } => {
                    self.announced = self.announced.max(version);
                    self.control(Control::SetWeights { version }, cx);
                }
                EngineReq::SetWeightsAcked { version, reply_to } => {
                    // Acknowledged once queued, as the embedded engine does:
                    // the push itself is retried by the control queue.
                    self.announced = self.announced.max(version);
                    self.control(Control::SetWeights { version }, cx);
                    cx.send(reply_to, EngineEvent::WeightsSet { version });
                }
            },
            SglangEngineMsg::Prompt { key, prompt } => self.prompt_read(key, prompt, cx),
            SglangEngineMsg::Generated { key, result } => self.generated(key, result, cx),
            SglangEngineMsg::Control(out) => {
                let Some((op, calls)) = self.running.take() else {
                    tracing::error!("control completion with no control in flight");
                    self.stats.errors += 1;
                    return;
                };
                self.controlled(op, calls, out, cx);
                self.kick(cx);
            }
            SglangEngineMsg::Recorded(r) => CallBook::<Sent>::recorded(r, &mut self.stats, cx),
        }
    }
}
