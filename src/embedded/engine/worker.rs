//! The engine worker: the engine protocol's state machine over one real
//! engine.
//!
//! Calls queue until the next "engine.step" job submits them; steps chain
//! while anything runs, so calls arriving during a step join the batch at
//! the next one (continuous batching). Control requests (pin, cancel,
//! release, unload, load, new weights) run as their own jobs, before the
//! next step, in arrival order. Exactly one job is in flight at a time:
//! its results are applied in order and nothing races on the engine lock.
//!
//! Failure policy: a prompt that cannot be read or that the engine refuses
//! as invalid will never get better, so the call is answered `Done` with an
//! empty output (its record still names the call) and counted; refusals a
//! retry can fix (not admitting, not loaded, an engine failure mid-step)
//! are answered `Rejected`, which the proxy retries on the next route.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use gyre_actors::sched::ids::{EngineIx, ExecId, Version};
use gyre_actors::sched::proto::engine::{CallEvent, EngineEvent, EngineReq, KV_WAIT, KvBlocks};
use gyre_actors::sched::proto::payload::Prompt;
use gyre_gpu::engine::{Engine, PinId, ReqId};
use gyre_runtime::{Actor, ActorId, BlobId, Cx, IoError, Nanos, Recipient};
use serde::{Deserialize, Serialize};

use super::EngineStats;
use super::calls::{self, CallBook, PromptRead, Recorded};
use super::ops::{self, CallKey, JobOut, Stepped, Submit, Submitted, WeightsOutcome};
use super::record;
use super::tap::{Tapping, TokenTap};
use crate::embedded::journal::{Journal, op_line};
use crate::embedded::shared::{EngineHandle, Shared, lock};
use crate::embedded::work::Work;
use gyre_simulations::replay::schema::Op;

/// A control job is tried this many times when its I/O fails before it
/// ran (injected faults, shutdown); then it is answered as best it can be.
const MAX_TRIES: u32 = 3;

#[derive(Debug, Serialize, Deserialize)]
pub enum EngineWorkerMsg {
    Req(EngineReq),
    /// The one job in flight finished.
    Job(Result<JobOut, IoError>),
    /// The prompt of an accepted call, read from its payload.
    Prompt {
        key: CallKey,
        prompt: Result<Prompt, IoError>,
    },
    /// A served call's record is written: answer `Done`.
    Recorded(Recorded),
}

impl From<EngineReq> for EngineWorkerMsg {
    fn from(r: EngineReq) -> Self {
        EngineWorkerMsg::Req(r)
    }
}

/// The engine's side of an accepted call attempt.
#[derive(Debug, Default)]
struct InEngine {
    /// Its engine request, once submitted.
    req: Option<ReqId>,
    /// Output tokens of earlier attempts this one continues after (with a
    /// token tap).
    resumed: usize,
}

type Live = calls::Live<InEngine>;

#[derive(Debug, Clone)]
enum Control {
    Pin {
        execs: Vec<ExecId>,
        reply_to: Recipient<EngineEvent>,
    },
    Cancel {
        reply_to: Recipient<EngineEvent>,
    },
    ReleaseKv {
        execs: Vec<ExecId>,
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

#[derive(Debug, Clone)]
struct Queued {
    op: Control,
    tries: u32,
    /// When the request arrived (a record's `queued_ns` is measured from
    /// it).
    at: Nanos,
}

/// The job in flight and what its completion needs to know.
#[derive(Debug)]
enum Running {
    Step {
        keys: Vec<CallKey>,
        adopted: Vec<ExecId>,
    },
    Control {
        q: Queued,
        /// The calls a cancel or an unload answers.
        calls: Vec<CallKey>,
    },
}

#[derive(Debug)]
pub struct EngineWorker {
    ix: EngineIx,
    engine: EngineHandle,
    shared: Shared,
    seed: u64,
    admitting: bool,
    loaded: bool,
    version: Version,
    /// The newest version a publication announced.
    announced: Version,
    /// A publication that arrived while pins were held.
    deferred: Option<Version>,
    calls: CallBook<InEngine>,
    to_submit: VecDeque<CallKey>,
    by_req: BTreeMap<ReqId, CallKey>,
    /// Executions whose next call starts from adopted blocks.
    adopt: BTreeSet<ExecId>,
    /// Executions whose blocks another engine is handing over, with when
    /// their calls stop waiting for them: their queued calls are held.
    expecting: BTreeMap<ExecId, Nanos>,
    pins: BTreeMap<ExecId, (PinId, u64)>,
    controls: VecDeque<Queued>,
    running: Option<Running>,
    /// Where sampled tokens stream to; with one, calls continue after
    /// their earlier attempts and the client's side writes the records.
    tap: Option<Arc<dyn TokenTap>>,
    stats: EngineStats,
    /// `gyre train --record`: where attempts and unloads and loads are
    /// written, and when the job in flight began.
    journal: Option<Journal>,
    began: Nanos,
}

impl EngineWorker {
    /// A worker over `engine`, serving if the engine is; `seed` is the
    /// run's base for every call's sampling seed.
    pub fn new(ix: EngineIx, engine: EngineHandle, shared: Shared, seed: u64) -> Self {
        let (serving, version) = {
            let e = lock(&engine);
            (e.health().serving, e.version())
        };
        Self {
            ix,
            engine,
            shared,
            seed,
            admitting: serving,
            loaded: serving,
            version,
            announced: version,
            deferred: None,
            calls: CallBook::default(),
            to_submit: VecDeque::new(),
            by_req: BTreeMap::new(),
            adopt: BTreeSet::new(),
            expecting: BTreeMap::new(),
            pins: BTreeMap::new(),
            controls: VecDeque::new(),
            running: None,
            tap: None,
            stats: EngineStats::default(),
            journal: None,
            began: 0,
        }
    }

    /// Writes every call attempt it serves and every unload and load to
    /// `journal` (`gyre train --record`).
    pub fn with_journal(mut self, journal: Option<Journal>) -> Self {
        self.journal = journal;
        self
    }

    /// Streams every sampled token to `tap` (see [`super::tap`]). The
    /// calls are then recorded where they are streamed to: `Done` carries
    /// no record of the engine's.
    pub fn with_tap(mut self, tap: Arc<dyn TokenTap>) -> Self {
        self.tap = Some(tap);
        self
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    pub fn ix(&self) -> EngineIx {
        self.ix
    }

    pub fn is_serving(&self) -> bool {
        self.loaded && self.admitting
    }

    /// The version the engine serves (as of the last job).
    pub fn version(&self) -> Version {
        self.version
    }

    /// Call attempts accepted and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Executions whose blocks are pinned.
    pub fn pinned(&self) -> Vec<ExecId> {
        self.pins.keys().copied().collect()
    }

    fn serve(
        &mut self,
        key: CallKey,
        prompt: BlobId,
        reply_to: Recipient<CallEvent>,
        cx: &mut Cx<'_, Self>,
    ) {
        let (serving, blobs) = (self.is_serving(), self.shared.blobs.clone());
        let fresh = serving && self.calls.get(&key).is_none();
        if let (true, Some(j)) = (fresh, &self.journal) {
            j.attempt(key.call);
        }
        let ext = InEngine::default();
        let read = move |prompt| EngineWorkerMsg::Prompt { key, prompt };
        let stats = &mut self.stats;
        self.calls
            .accept(serving, key, prompt, reply_to, ext, blobs, stats, cx, read);
    }

    /// A call's prompt arrived: it queues for the next step, or, unreadable,
    /// is answered empty. A call cancelled meanwhile is gone already.
    fn prompt_read(
        &mut self,
        key: CallKey,
        prompt: Result<Prompt, IoError>,
        cx: &mut Cx<'_, Self>,
    ) {
        match self.calls.prompt_read(key, prompt, &mut self.stats) {
            PromptRead::Ready => {
                if self.expecting.contains_key(&key.call.exec) {
                    self.stats.kv_waits += 1;
                }
                self.to_submit.push_back(key);
                self.kick(cx);
            }
            PromptRead::Ignored => {}
            PromptRead::Unreadable(live) => {
                self.answer(key, live, Vec::new(), Vec::new(), self.version, cx)
            }
        }
    }

    /// Writes the call's record, then answers `Done`. A call whose prompt
    /// could not be read has a record without input.
    fn answer(
        &mut self,
        key: CallKey,
        live: Live,
        output: Vec<u32>,
        logprobs: Vec<f32>,
        version: Version,
        cx: &mut Cx<'_, Self>,
    ) {
        if let Some(j) = &self.journal {
            j.served(key.call, self.ix, live.start_ns, cx.now());
        }
        if self.tap.is_some() {
            // The tap's owner records the call (every token went there).
            let output_tokens = (live.ext.resumed + output.len()) as u64;
            let r = Recorded {
                key,
                reply_to: live.reply_to,
                output_tokens,
                version,
                output: Ok(BlobId::NONE),
            };
            return CallBook::<InEngine>::recorded(r, &mut self.stats, cx);
        }
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
            EngineWorkerMsg::Recorded,
        );
    }

    fn reject(&mut self, key: CallKey, live: Live, cx: &mut Cx<'_, Self>) {
        if let Some(req) = live.ext.req {
            self.by_req.remove(&req);
        }
        calls::reject(key, live.reply_to, &mut self.stats, cx);
    }

    fn cancel(&mut self, keys: &[CallKey], cx: &mut Cx<'_, Self>) -> u32 {
        // This engine is leaving rollout: no hand-over is adopted here now.
        self.expecting.clear();
        let (by_req, to_submit) = (&mut self.by_req, &mut self.to_submit);
        self.calls.cancel(keys, &mut self.stats, cx, |key, live| {
            if let Some(req) = live.ext.req {
                by_req.remove(&req);
            }
            to_submit.retain(|k| *k != key);
        })
    }

    /// Starts the next job if none is in flight: control requests first,
    /// then a step while calls are running or queued and not held for
    /// their blocks; with only held calls left, a timer ends their wait.
    fn kick(&mut self, cx: &mut Cx<'_, Self>) {
        while self.running.is_none() {
            if let Some(q) = self.controls.pop_front() {
                self.issue_control(q, cx);
                continue;
            }
            let now = cx.now();
            self.end_expired_waits(now);
            let ready = self.to_submit.iter().any(|k| !self.held(k));
            if ready || !self.by_req.is_empty() {
                self.issue_step(cx);
            } else if let Some(until) = self
                .to_submit
                .iter()
                .filter_map(|k| self.expecting.get(&k.call.exec))
                .min()
            {
                cx.set_timer((), until.saturating_sub(now).max(1));
            }
            break;
        }
    }

    /// A queued call waits while its execution's blocks are expected.
    fn held(&self, key: &CallKey) -> bool {
        self.expecting.contains_key(&key.call.exec)
    }

    fn end_expired_waits(&mut self, now: Nanos) {
        let expired: Vec<ExecId> = self
            .expecting
            .iter()
            .filter(|&(_, until)| *until <= now)
            .map(|(e, _)| *e)
            .collect();
        for exec in expired {
            self.expecting.remove(&exec);
            if self.to_submit.iter().any(|k| k.call.exec == exec) {
                tracing::debug!(engine = ?self.ix, ?exec, "KV hand-over not adopted in time: prefilling");
                self.stats.kv_wait_expired += 1;
            }
        }
    }

    fn run(
        &mut self,
        kind: &'static str,
        running: Running,
        cx: &mut Cx<'_, Self>,
        job: impl FnOnce(&mut Engine, &Shared) -> JobOut + Send + 'static,
    ) {
        let engine = self.engine.clone();
        let shared = self.shared.clone();
        self.running = Some(running);
        self.began = cx.now();
        cx.io(
            Work::new(kind, move || Ok(job(&mut lock(&engine), &shared))),
            EngineWorkerMsg::Job,
        );
    }

    /// A control operation of this engine, for the record: its kind, how
    /// long it queued behind the jobs before it, and for a pin the
    /// executions it pinned.
    fn journal_control(&self, running: &Running, out: Option<&JobOut>, now: Nanos) {
        let Some(j) = &self.journal else {
            return;
        };
        let Running::Control { q, .. } = running else {
            return;
        };
        let kind = match q.op {
            Control::Pin { .. } => "engine.pin",
            Control::Cancel { .. } => "engine.cancel",
            Control::ReleaseKv { .. } => "engine.release_kv",
            Control::Unload { .. } => "engine.unload",
            Control::Load { .. } => "engine.load",
            Control::SetWeights { .. } => "engine.set_weights",
        };
        let cell = match self.ix {
            EngineIx::Cell(c) => Some(c),
            EngineIx::Pool => None,
        };
        let execs = match out {
            Some(JobOut::Pinned { pins, .. }) => Some(pins.iter().map(|p| p.exec.0).collect()),
            _ => None,
        };
        j.op(Op {
            execs,
            ..op_line(cell, kind, q.at, self.began, now)
        });
    }

    fn issue_step(&mut self, cx: &mut Cx<'_, Self>) {
        let mut keys = Vec::with_capacity(self.to_submit.len());
        let mut held = VecDeque::new();
        for key in self.to_submit.drain(..) {
            if self.expecting.contains_key(&key.call.exec) {
                held.push_back(key);
            } else {
                keys.push(key);
            }
        }
        self.to_submit = held;
        let tapping = self.tap.clone().map(|tap| Tapping {
            tap,
            engine: self.ix,
            running: self
                .calls
                .iter()
                .filter_map(|(k, l)| Some((l.ext.req?, k.call, l.ext.resumed)))
                .collect(),
        });
        let mut adopted = Vec::new();
        let mut submits = Vec::new();
        for key in &keys {
            // Only calls whose prompt is read are ever queued to submit.
            let Some(prompt) = self.calls.get(key).and_then(|l| l.prompt.as_ref()) else {
                continue;
            };
            let adopt = self.adopt.remove(&key.call.exec);
            if adopt {
                adopted.push(key.call.exec);
            }
            submits.push(Submit {
                key: *key,
                request: record::request(prompt, record::call_seed(self.seed, key.call)),
                adopt,
            });
        }
        self.run(
            "engine.step",
            Running::Step { keys, adopted },
            cx,
            move |e, s| JobOut::Stepped(ops::step(e, &*s.kv, submits, tapping.as_ref())),
        );
    }

    fn issue_control(&mut self, q: Queued, cx: &mut Cx<'_, Self>) {
        let mut calls = Vec::new();
        match &q.op {
            Control::Pin { execs, .. } => {
                let wanted: Vec<(ExecId, Vec<ReqId>)> = execs
                    .iter()
                    .filter(|e| !self.pins.contains_key(e))
                    .map(|&exec| {
                        let reqs = self
                            .calls
                            .iter()
                            .filter(|(k, _)| k.call.exec == exec)
                            .filter_map(|(_, l)| l.ext.req)
                            .collect();
                        (exec, reqs)
                    })
                    .collect();
                self.run(
                    "engine.pin",
                    Running::Control { q, calls },
                    cx,
                    move |e, s| ops::pin(e, &*s.kv, wanted),
                );
            }
            Control::Cancel { .. } => {
                calls = self.calls.keys();
                self.run(
                    "engine.cancel",
                    Running::Control { q, calls },
                    cx,
                    |e, _| ops::cancel_all(e),
                );
            }
            Control::ReleaseKv { execs } => {
                let pins: Vec<PinId> = execs
                    .iter()
                    .filter_map(|e| self.pins.get(e).map(|p| p.0))
                    .collect();
                if pins.is_empty() {
                    return;
                }
                self.run(
                    "engine.release_kv",
                    Running::Control { q, calls },
                    cx,
                    |e, _| ops::release_pins(e, pins),
                );
            }
            Control::Unload { .. } => {
                calls = self.calls.keys();
                let pins: Vec<PinId> = self.pins.values().map(|p| p.0).collect();
                self.run(
                    "engine.unload",
                    Running::Control { q, calls },
                    cx,
                    |e, s| {
                        s.unloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        ops::unload(e, pins)
                    },
                );
            }
            Control::Load { version, .. } => {
                let version = (*version).max(self.announced);
                self.run(
                    "engine.load",
                    Running::Control { q, calls },
                    cx,
                    move |e, s| ops::load(e, &*s.weights, version),
                );
            }
            Control::SetWeights { version } => {
                let version = *version;
                // An unloaded engine picks the announced version up at Load.
                if !self.loaded || version <= self.version {
                    return;
                }
                self.run(
                    "engine.set_weights",
                    Running::Control { q, calls },
                    cx,
                    move |e, s| ops::set_weights(e, &*s.weights, version),
                );
            }
        }
    }

    fn stepped(&mut self, s: Stepped, cx: &mut Cx<'_, Self>) {
        self.stats.steps += 1;
        for (key, sub) in s.submitted {
            match sub {
                Submitted::Queued {
                    req,
                    prefill,
                    reused,
                    kv_refused,
                    resumed,
                } => {
                    let Some(live) = self.calls.get_mut(&key) else {
                        continue;
                    };
                    live.ext.req = Some(req);
                    live.ext.resumed = resumed;
                    self.by_req.insert(req, key);
                    self.stats.prefilled_tokens += prefill;
                    self.stats.adopted_tokens += reused;
                    if let Some(why) = kv_refused {
                        tracing::debug!(call = ?key.call, %why, "adopted blocks not used");
                        self.stats.kv_refused += 1;
                    }
                }
                Submitted::Invalid(why) => {
                    let Some(live) = self.calls.remove(&key) else {
                        continue;
                    };
                    tracing::warn!(call = ?key.call, %why, "engine refused the prompt: answered empty");
                    self.stats.bad_prompts += 1;
                    self.answer(key, live, Vec::new(), Vec::new(), self.version, cx);
                }
            }
        }
        for f in s.finished {
            let Some(key) = self.by_req.remove(&f.req) else {
                continue;
            };
            let Some(live) = self.calls.remove(&key) else {
                continue;
            };
            self.stats.served += 1;
            self.stats.output_tokens += f.output.len() as u64;
            self.answer(key, live, f.output, f.logprobs, f.versions.0, cx);
        }
        if let Some(why) = s.failed {
            tracing::error!(engine = ?self.ix, %why, "engine step failed: running calls rejected");
            self.stats.errors += 1;
        }
        let mut orphans: Vec<ReqId> = s.aborted;
        if !s.busy {
            // The engine holds nothing more: any call we still think runs
            // was lost, and must not wait forever.
            orphans.extend(self.by_req.keys().copied());
        }
        for req in orphans {
            let Some(key) = self.by_req.remove(&req) else {
                continue;
            };
            if let Some(live) = self.calls.remove(&key) {
                self.reject(key, live, cx);
            }
        }
    }

    fn controlled(&mut self, q: Queued, calls: Vec<CallKey>, out: JobOut, cx: &mut Cx<'_, Self>) {
        match (q.op, out) {
            (Control::Pin { execs, reply_to }, JobOut::Pinned { pins, errors }) => {
                self.note_errors("pin", &errors);
                self.stats.kv_pinned += pins.len() as u64;
                for p in pins {
                    self.pins.insert(p.exec, (p.pin, p.tokens));
                }
                let blocks = execs
                    .iter()
                    .filter_map(|exec| {
                        self.pins.get(exec).map(|&(_, tokens)| KvBlocks {
                            exec: *exec,
                            engine: self.ix,
                            tokens,
                        })
                    })
                    .collect();
                cx.send(reply_to, EngineEvent::KvPinned { blocks });
            }
            (Control::Cancel { reply_to }, JobOut::Cancelled { .. }) => {
                let cancelled = self.cancel(&calls, cx);
                cx.send(reply_to, EngineEvent::CancelComplete { cancelled });
            }
            (Control::ReleaseKv { execs }, JobOut::PinsReleased { errors }) => {
                self.note_errors("release pins", &errors);
                for e in execs {
                    self.pins.remove(&e);
                }
                self.after_pins_released(cx.now());
            }
            (Control::Unload { reply_to }, JobOut::Unloaded { errors, .. }) => {
                self.note_errors("unload", &errors);
                if !calls.is_empty() || !self.pins.is_empty() {
                    tracing::warn!(
                        calls = calls.len(),
                        pins = self.pins.len(),
                        "unloaded with calls in flight or pins held"
                    );
                    self.stats.violations += 1;
                }
                self.cancel(&calls, cx);
                self.pins.clear();
                self.adopt.clear();
                self.after_pins_released(cx.now());
                cx.send(reply_to, EngineEvent::Unloaded);
            }
            (
                Control::Load { reply_to, .. },
                JobOut::Loaded {
                    version,
                    serving,
                    error,
                },
            ) => {
                if let Some(e) = error {
                    tracing::error!(engine = ?self.ix, error = %e, "load");
                    self.stats.errors += 1;
                }
                if version != self.version {
                    self.stats.weight_updates += 1;
                }
                self.version = version;
                self.loaded = serving;
                self.admitting = serving;
                cx.send(reply_to, EngineEvent::Loaded { version });
            }
            (Control::SetWeights { version: asked }, JobOut::WeightsSet { version, outcome }) => {
                self.version = version;
                match outcome {
                    WeightsOutcome::Applied => self.stats.weight_updates += 1,
                    WeightsOutcome::Current => {}
                    WeightsOutcome::Deferred => {
                        self.deferred = Some(self.deferred.unwrap_or(0).max(asked));
                    }
                    WeightsOutcome::Failed(e) => {
                        tracing::error!(engine = ?self.ix, version = asked, error = %e, "set weights");
                        self.stats.errors += 1;
                    }
                }
            }
            (op, out) => {
                tracing::error!(?op, ?out, "engine job answered another job");
                self.stats.errors += 1;
            }
        }
    }

    fn after_pins_released(&mut self, now: Nanos) {
        if self.pins.is_empty()
            && let Some(version) = self.deferred.take()
        {
            self.controls.push_back(Queued {
                op: Control::SetWeights { version },
                tries: 0,
                at: now,
            });
        }
    }

    fn note_errors(&mut self, what: &str, errors: &[String]) {
        for e in errors {
            tracing::warn!(engine = ?self.ix, error = %e, "{what}");
        }
        self.stats.errors += errors.len() as u64;
    }

    /// A job's I/O failed before it ran: steps are simply retried with the
    /// same calls; a control is retried a few times, then answered as if
    /// nothing could be done.
    fn job_failed(&mut self, running: Running, err: IoError, cx: &mut Cx<'_, Self>) {
        tracing::warn!(engine = ?self.ix, error = %err, "engine job failed");
        self.stats.errors += 1;
        match running {
            Running::Step { keys, adopted } => {
                for key in keys.into_iter().rev() {
                    self.to_submit.push_front(key);
                }
                self.adopt.extend(adopted);
            }
            Running::Control { mut q, calls } => {
                q.tries += 1;
                if q.tries < MAX_TRIES {
                    self.controls.push_front(q);
                    return;
                }
                match q.op {
                    Control::Pin { reply_to, .. } => {
                        cx.send(reply_to, EngineEvent::KvPinned { blocks: Vec::new() })
                    }
                    Control::Cancel { reply_to } => {
                        let cancelled = self.cancel(&calls, cx);
                        cx.send(reply_to, EngineEvent::CancelComplete { cancelled });
                    }
                    Control::Unload { reply_to } => {
                        self.cancel(&calls, cx);
                        cx.send(reply_to, EngineEvent::Unloaded);
                    }
                    Control::Load { reply_to, .. } => {
                        cx.send(
                            reply_to,
                            EngineEvent::Loaded {
                                version: self.version,
                            },
                        );
                    }
                    Control::ReleaseKv { .. } | Control::SetWeights { .. } => {}
                }
            }
        }
    }

    fn control(&mut self, op: Control, cx: &mut Cx<'_, Self>) {
        self.controls.push_back(Queued {
            op,
            tries: 0,
            at: cx.now(),
        });
        self.kick(cx);
    }
}

impl Actor for EngineWorker {
    type Msg = EngineWorkerMsg;
    type Timer = ();
    gyre_runtime::accepts!(EngineReq);

    /// The wait of held calls ended (`KV_WAIT`).
    fn on_timer(&mut self, _: (), cx: &mut Cx<'_, Self>) {
        self.kick(cx);
    }

    fn on_msg(&mut self, _from: ActorId, msg: EngineWorkerMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            EngineWorkerMsg::Req(req) => match req {
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
                    self.control(Control::Pin { execs, reply_to }, cx)
                }
                EngineReq::CancelAll { reply_to } => self.control(Control::Cancel { reply_to }, cx),
                EngineReq::ExpectKv { exec } => {
                    if self.is_serving() {
                        self.expecting
                            .insert(exec, cx.now().saturating_add(KV_WAIT));
                    }
                }
                EngineReq::AdoptKv { exec, tokens } => {
                    self.expecting.remove(&exec);
                    if self.loaded {
                        self.stats.kv_adopted += 1;
                        self.adopt.insert(exec);
                    } else {
                        tracing::warn!(?exec, tokens, "AdoptKv on an unloaded engine ignored");
                    }
                    self.kick(cx);
                }
                EngineReq::ReleaseKv { execs } => self.control(Control::ReleaseKv { execs }, cx),
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
                    self.announced = self.announced.max(version);
                    self.control(Control::SetWeights { version }, cx);
                    cx.send(reply_to, EngineEvent::WeightsSet { version });
                }
            },
            EngineWorkerMsg::Job(result) => {
                let Some(running) = self.running.take() else {
                    tracing::error!("engine job completion with no job in flight");
                    self.stats.errors += 1;
                    return;
                };
                self.journal_control(&running, result.as_ref().ok(), cx.now());
                match (running, result) {
                    (Running::Step { .. }, Ok(JobOut::Stepped(s))) => self.stepped(s, cx),
                    (Running::Control { q, calls }, Ok(out)) => self.controlled(q, calls, out, cx),
                    (running, Err(e)) => self.job_failed(running, e, cx),
                    (running, Ok(out)) => {
                        tracing::error!(?running, ?out, "engine job answered another job");
                        self.stats.errors += 1;
                    }
                }
                self.kick(cx);
            }
            EngineWorkerMsg::Prompt { key, prompt } => self.prompt_read(key, prompt, cx),
            EngineWorkerMsg::Recorded(r) => CallBook::<InEngine>::recorded(r, &mut self.stats, cx),
        }
    }
}
