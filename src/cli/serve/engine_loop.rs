//! The engine's own thread. `Engine` is a synchronous struct, so one
//! thread owns it: it takes commands from the HTTP handlers over a channel,
//! steps the running batch while anything is in flight (continuous
//! batching across every open HTTP request), streams progress and answers
//! each request when it finishes. Handlers never touch the engine.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use gyre_gpu::engine::{Completion, Engine, Load, MemTag, ReqId, Request};
use gyre_gpu::model::ParamBuffer;
use tokio::sync::{mpsc, oneshot};

/// A request's output so far (cumulative), for streaming.
#[derive(Clone, Debug)]
pub struct Progress {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub weight_version: String,
}

/// A finished request with the weight version label that served its end.
#[derive(Debug)]
pub struct Done {
    pub completion: Completion,
    pub weight_version: String,
    pub abort_message: Option<String>,
}

/// Why the engine did not do what was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The request itself is wrong (HTTP 400).
    Bad(String),
    /// The engine cannot serve now: memory released, or stopped (503).
    Unavailable(String),
}

impl Failure {
    fn engine(e: gyre_gpu::engine::EngineError) -> Failure {
        match e {
            gyre_gpu::engine::EngineError::NotServing { .. } => Failure::Unavailable(e.to_string()),
            e => Failure::Bad(e.to_string()),
        }
    }
}

pub type Reply<T> = oneshot::Sender<Result<T, Failure>>;

/// What the engine reports besides generations.
#[derive(Clone, Debug)]
pub struct Status {
    pub serving: bool,
    pub weights_resident: bool,
    pub kv_resident: bool,
    pub weight_version: String,
    pub load: Load,
}

pub enum Cmd {
    Generate {
        rid: String,
        req: Request,
        top_k: Option<u32>,
        stream: Option<mpsc::UnboundedSender<Progress>>,
        done: Reply<Done>,
    },
    /// Abort by rid (`None`: everything); answers how many were aborted.
    Abort {
        rid: Option<String>,
        reply: oneshot::Sender<usize>,
    },
    Release {
        tags: Vec<MemTag>,
        reply: Reply<()>,
    },
    Resume {
        tags: Vec<MemTag>,
        reply: Reply<()>,
    },
    /// New weights. With a numeric `label` that is their version; without
    /// one, the buffer's own version when `keep_version`, else the serving
    /// version + 1. Answers the label now served.
    UpdateWeights {
        params: Box<ParamBuffer>,
        label: Option<String>,
        keep_version: bool,
        abort_all: bool,
        reply: Reply<String>,
    },
    SetVersion {
        label: String,
        abort_all: bool,
        reply: Reply<()>,
    },
    Status {
        reply: oneshot::Sender<Status>,
    },
}

struct InFlight {
    rid: String,
    stream: Option<mpsc::UnboundedSender<Progress>>,
    sent: usize,
    done: Reply<Done>,
}

struct Loop {
    engine: Engine,
    label: String,
    by_id: BTreeMap<ReqId, InFlight>,
    by_rid: BTreeMap<String, ReqId>,
}

/// Runs the engine until every command sender is gone.
pub fn run(engine: Engine, label: String, rx: Receiver<Cmd>) {
    let mut l = Loop {
        engine,
        label,
        by_id: BTreeMap::new(),
        by_rid: BTreeMap::new(),
    };
    loop {
        // Block for work when idle; otherwise take what has arrived and step.
        if l.engine.is_idle() {
            match rx.recv() {
                Ok(cmd) => l.handle(cmd),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => l.handle(cmd),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    l.abort(None, "server shutting down");
                    return;
                }
            }
        }
        if !l.engine.is_idle() {
            l.step();
        }
    }
}

impl Loop {
    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Generate {
                rid,
                req,
                top_k,
                stream,
                done,
            } => {
                if self.by_rid.contains_key(&rid) {
                    let _ = done.send(Err(Failure::Bad(format!(
                        "request id {rid} is already in flight"
                    ))));
                    return;
                }
                let h = self.engine.health();
                if !h.serving {
                    let _ = done.send(Err(Failure::Unavailable(format!(
                        "not serving: weights resident = {}, kv_cache resident = {}; \
                         call /resume_memory_occupation first",
                        h.weights_resident, h.kv_resident
                    ))));
                    return;
                }
                let submitted = match top_k {
                    Some(k) => self.engine.submit_top_k(req, k),
                    None => self.engine.submit(req),
                };
                match submitted {
                    Ok(id) => {
                        self.by_rid.insert(rid.clone(), id);
                        self.by_id.insert(
                            id,
                            InFlight {
                                rid,
                                stream,
                                sent: 0,
                                done,
                            },
                        );
                    }
                    Err(e) => {
                        let _ = done.send(Err(Failure::engine(e)));
                    }
                }
            }
            Cmd::Abort { rid, reply } => {
                let n = self.abort(rid.as_deref(), "aborted by /abort_request");
                let _ = reply.send(n);
            }
            Cmd::Release { tags, reply } => {
                let r = self.engine.release_memory(&tags).map(drop);
                let _ = reply.send(r.map_err(Failure::engine));
            }
            Cmd::Resume { tags, reply } => {
                let r = self.engine.resume_memory(&tags);
                let _ = reply.send(r.map_err(Failure::engine));
            }
            Cmd::UpdateWeights {
                mut params,
                label,
                keep_version,
                abort_all,
                reply,
            } => {
                match label.as_deref().map(str::parse::<u64>) {
                    Some(Ok(v)) => params.version = v,
                    Some(Err(_)) | None if !keep_version => {
                        params.version = self.engine.version() + 1;
                    }
                    _ => {}
                }
                if abort_all {
                    self.abort(None, "aborted by a weight update");
                }
                let label = label.unwrap_or_else(|| params.version.to_string());
                let r = self.engine.update_weights(&params).map(|()| {
                    self.label = label.clone();
                    label
                });
                let _ = reply.send(r.map_err(Failure::engine));
            }
            Cmd::SetVersion {
                label,
                abort_all,
                reply,
            } => {
                if abort_all {
                    self.abort(None, "aborted by a weight version update");
                }
                self.label = label;
                let _ = reply.send(Ok(()));
            }
            Cmd::Status { reply } => {
                let h = self.engine.health();
                let _ = reply.send(Status {
                    serving: h.serving,
                    weights_resident: h.weights_resident,
                    kv_resident: h.kv_resident,
                    weight_version: self.label.clone(),
                    load: self.engine.load(),
                });
            }
        }
    }

    /// Aborts one request by rid, or all; each answers with its partial
    /// output and finish reason abort.
    fn abort(&mut self, rid: Option<&str>, why: &str) -> usize {
        let ids: Vec<ReqId> = match rid {
            Some(r) => self.by_rid.get(r).copied().into_iter().collect(),
            None => self.by_id.keys().copied().collect(),
        };
        let mut n = 0;
        for id in ids {
            if let Ok(c) = self.engine.abort(id) {
                self.deliver(c, Some(why.to_string()));
                n += 1;
            }
        }
        n
    }

    fn deliver(&mut self, completion: Completion, abort_message: Option<String>) {
        let Some(f) = self.by_id.remove(&completion.id) else {
            return;
        };
        self.by_rid.remove(&f.rid);
        let _ = f.done.send(Ok(Done {
            completion,
            weight_version: self.label.clone(),
            abort_message,
        }));
    }

    fn step(&mut self) {
        match self.engine.step() {
            Ok(done) => {
                for c in done {
                    self.deliver(c, None);
                }
            }
            Err(e) => {
                // A failed step fails what is in flight, not the server.
                tracing::warn!(error = %e, "engine step failed; aborting requests in flight");
                let msg = format!("engine step failed: {e}");
                for c in self.engine.abort_all() {
                    self.deliver(c, Some(msg.clone()));
                }
            }
        }
        for (id, f) in self.by_id.iter_mut() {
            let Some(tx) = &f.stream else { continue };
            let Some((tokens, logprobs)) = self.engine.progress(*id) else {
                continue;
            };
            if tokens.len() > f.sent {
                f.sent = tokens.len();
                let _ = tx.send(Progress {
                    tokens: tokens.to_vec(),
                    logprobs: logprobs.to_vec(),
                    weight_version: self.label.clone(),
                });
            }
        }
    }
}

/// The handlers' side of the channel.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Cmd>,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn spawn(engine: Engine, label: String) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("gyre-serve-engine".into())
            .spawn(move || run(engine, label, rx))?;
        Ok(EngineHandle { tx })
    }

    pub fn send(&self, cmd: Cmd) -> Result<(), Failure> {
        self.tx
            .send(cmd)
            .map_err(|_| Failure::Unavailable("the engine thread has stopped".into()))
    }

    /// Sends a command built around a reply channel and awaits the reply.
    pub async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Cmd,
    ) -> Result<T, Failure> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await
            .map_err(|_| Failure::Unavailable("the engine thread dropped the request".into()))
    }
}
