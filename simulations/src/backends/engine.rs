//! A simulated inference engine: a service time per call from the prompt
//! tokens its KV cache does not already hold and the output it samples,
//! scaled by the engine's load when the call is admitted, and the control
//! operations a cell drives through a role change.
//!
//! The cache is one token count per execution, never tokens. A prompt
//! shorter than what is cached means the harness compacted its context:
//! only the shared prefix (the system prompt) still matches, and the rest is
//! prefilled again, as it is after a reroute whose KV blocks were not
//! migrated.
//!
//! It also polices the protocol from its side: unloading while calls are
//! still in flight counts as a violation. Unloading frees the cache, pins
//! included: a cell unloads only once every destination has read its
//! blocks, so pins still held then only mean a `ReleaseKv` was lost; they
//! are counted apart.
//!
//! Repeated requests (resends, the network's duplicates) change nothing
//! twice: an attempt already being served is ignored and the last answered
//! attempt of an execution is answered again; a released execution is not
//! pinned again; an unload or load under way is not restarted, and one
//! already done is answered at once.
//!
//! With `hold_for_kv` (a scenario's `inference.hold_for_kv`), a call whose
//! execution's blocks another engine is handing over (`ExpectKv`) is held
//! until they are adopted, or for at most `KV_WAIT`, as the embedded engine
//! holds it: it then starts from the adopted prefix instead of racing the
//! read. Without it the retried call is charged the prefix held when it
//! arrives.
//!
//! Replaying a record (`gyre simulate --replay`), each call takes its
//! recorded service time and each pin, cancel, unload and load its
//! recorded time from arrival to answer, in the order the recorded engine
//! ran them ([`crate::replay::ReplayWorkload::control`]); a pin pins the
//! executions the recorded one pinned. Without a record, pins and cancels
//! are answered at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use gyre_actors::sched::ids::{CallId, EngineIx, ExecId, Version};
use gyre_actors::sched::proto::engine::{CallEvent, EngineEvent, EngineReq, KV_WAIT, KvBlocks};
use gyre_runtime::{Actor, ActorId, BlobId, Cx, Recipient};
use rustc_hash::FxHashMap;

use crate::costs::EngineCosts;
use crate::replay::ReplayWorkload;
use crate::replay::workload::{ControlKind, ReplayControl};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EngineTimer {
    Call(CallId),
    Unload,
    Load,
    /// A replayed pin or cancel is answered (a record priced it).
    Pin,
    Cancel,
    /// The wait for an execution's blocks ends (`KV_WAIT`).
    KvWait(ExecId),
}

/// A call held for its execution's blocks ([`EngineReq::ExpectKv`]).
#[derive(Debug, Clone, Copy)]
struct Held {
    attempt: u32,
    prompt_tokens: u64,
    reply_to: Recipient<CallEvent>,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    attempt: u32,
    prompt: u64,
    output: u64,
    reply_to: Recipient<CallEvent>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub served: u64,
    pub cancelled: u64,
    pub rejected: u64,
    /// Prompt tokens found in the cache (own or adopted).
    pub cached_tokens: u64,
    pub adopted: u64,
    /// Prompt tokens prefilled (not found in the cache).
    pub prefilled_tokens: u64,
    pub violations: u64,
    /// Pins still held at an unload (a lost `ReleaseKv`), freed by it.
    pub pinned_at_unload: u64,
    /// Repeated requests answered again or ignored.
    pub repeats: u64,
    /// Calls held for their execution's blocks, and those of them served
    /// without the blocks because the wait ended first.
    pub held_for_kv: u64,
    pub kv_wait_expired: u64,
}

#[derive(Debug)]
pub struct SimEngine {
    ix: EngineIx,
    costs: EngineCosts,
    admitting: bool,
    loaded: bool,
    version: Version,
    /// Cached tokens per execution; looked up, never iterated, so a hash
    /// map keeps the run deterministic.
    kv: FxHashMap<ExecId, u64>,
    pinned: BTreeMap<ExecId, u64>,
    /// Executions whose pins were released since the last unload.
    released: std::collections::BTreeSet<ExecId>,
    /// The last answered attempt of each execution: (call, attempt,
    /// output tokens, version).
    last_done: FxHashMap<ExecId, (CallId, u32, u64, Version)>,
    /// Looked up by every call (hashed); a cancellation sorts it first,
    /// so its answers go in call order.
    inflight: FxHashMap<CallId, InFlight>,
    /// Every call this engine answered `Done` (the checker's "no answered
    /// call lost" reads it).
    answered: std::collections::BTreeSet<CallId>,
    /// Whether `answered` is kept (checked runs only).
    track_calls: bool,
    control: Option<(Recipient<EngineEvent>, Version)>,
    stats: EngineStats,
    /// The mutation check: an answered attempt is never answered again.
    ignore_repeats: bool,
    /// The mutation check: weight updates are acknowledged, not applied.
    skip_weights: bool,
    /// A recorded run: each call takes its recorded service time and
    /// output.
    replay: Option<Arc<ReplayWorkload>>,
    /// Replayed controls used so far, by kind (pin, cancel, unload, load).
    controls_used: [usize; 4],
    /// A replayed pin's answer, due at `EngineTimer::Pin`.
    pending_pin: Option<(Recipient<EngineEvent>, Vec<KvBlocks>)>,
    /// A replayed cancel, carried out at `EngineTimer::Cancel`.
    pending_cancel: Option<Recipient<EngineEvent>>,
    /// Executions whose blocks another engine is handing over; their calls
    /// wait in `held` until `AdoptKv` or `EngineTimer::KvWait`.
    expecting: std::collections::BTreeSet<ExecId>,
    held: BTreeMap<CallId, Held>,
}

impl SimEngine {
    /// An engine already serving version 0.
    pub fn new(ix: EngineIx, costs: EngineCosts) -> Self {
        Self {
            ix,
            costs,
            admitting: true,
            loaded: true,
            version: 0,
            kv: FxHashMap::default(),
            pinned: BTreeMap::new(),
            released: std::collections::BTreeSet::new(),
            last_done: FxHashMap::default(),
            inflight: FxHashMap::default(),
            answered: std::collections::BTreeSet::new(),
            track_calls: false,
            control: None,
            stats: EngineStats::default(),
            ignore_repeats: false,
            skip_weights: false,
            replay: None,
            controls_used: [0; 4],
            pending_pin: None,
            pending_cancel: None,
            expecting: std::collections::BTreeSet::new(),
            held: BTreeMap::new(),
        }
    }

    /// The next recorded control of `kind`, when replaying a record that
    /// holds one.
    fn next_control(&mut self, kind: ControlKind) -> Option<ReplayControl> {
        let slot = kind as usize;
        let c = self
            .replay
            .as_ref()?
            .control(self.ix, kind, self.controls_used[slot])?
            .clone();
        self.controls_used[slot] += 1;
        Some(c)
    }

    /// Cancels every call in flight, in call order, and answers `reply_to`.
    fn cancel_all(&mut self, reply_to: Recipient<EngineEvent>, cx: &mut Cx<'_, Self>) {
        let mut calls: Vec<_> = self
            .inflight
            .drain()
            .map(|(call, f)| (call, f.attempt, f.reply_to))
            .collect();
        calls.extend(self.drop_held(cx));
        calls.sort_unstable_by_key(|(call, ..)| *call);
        let cancelled = calls.len() as u32;
        for (call, attempt, to) in calls {
            cx.cancel_timer(&EngineTimer::Call(call));
            self.stats.cancelled += 1;
            cx.send(to, CallEvent::Cancelled { call, attempt });
        }
        cx.send(reply_to, EngineEvent::CancelComplete { cancelled });
    }

    /// Ends every wait for blocks (this engine leaves rollout): the held
    /// calls, to be answered by the caller.
    fn drop_held(&mut self, cx: &mut Cx<'_, Self>) -> Vec<(CallId, u32, Recipient<CallEvent>)> {
        for exec in std::mem::take(&mut self.expecting) {
            cx.cancel_timer(&EngineTimer::KvWait(exec));
        }
        std::mem::take(&mut self.held)
            .into_iter()
            .map(|(call, h)| (call, h.attempt, h.reply_to))
            .collect()
    }

    /// The wait for `exec`'s blocks is over: its held calls start, from
    /// whatever the cache holds now.
    fn release_held(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        if !self.expecting.remove(&exec) {
            return;
        }
        cx.cancel_timer(&EngineTimer::KvWait(exec));
        let calls: Vec<CallId> = self
            .held
            .keys()
            .filter(|c| c.exec == exec)
            .copied()
            .collect();
        for call in calls {
            if let Some(h) = self.held.remove(&call) {
                self.start(call, h.attempt, h.prompt_tokens, h.reply_to, cx);
            }
        }
    }

    /// Serves one call: its service time from the prompt tokens the cache
    /// does not hold and the output it samples.
    fn start(
        &mut self,
        call: CallId,
        attempt: u32,
        prompt_tokens: u64,
        reply_to: Recipient<CallEvent>,
        cx: &mut Cx<'_, Self>,
    ) {
        let held = self.kv.get(&call.exec).copied().unwrap_or(0);
        let cached = if prompt_tokens >= held {
            held
        } else {
            // Compacted: only the shared prefix still matches.
            self.costs.shared_prefix.min(prompt_tokens)
        };
        self.stats.cached_tokens += cached;
        self.stats.prefilled_tokens += prompt_tokens - cached;
        let (output, service) = match self.replay.as_ref().and_then(|r| r.call(call)) {
            Some(c) => (c.output_tokens, c.service),
            None => {
                let output = self.costs.output_tokens.draw(cx.rng());
                let base = self.costs.call_base.draw(cx.rng());
                let work = base
                    + (prompt_tokens - cached) * self.costs.prefill_per_token
                    + output * self.costs.decode_per_token;
                (output, self.loaded_time(work))
            }
        };
        self.inflight.insert(
            call,
            InFlight {
                attempt,
                prompt: prompt_tokens,
                output,
                reply_to,
            },
        );
        cx.set_timer(EngineTimer::Call(call), service);
    }

    /// Serves each call as the recorded run's engine did.
    pub fn replaying(mut self, replay: Arc<ReplayWorkload>) -> Self {
        self.replay = Some(replay);
        self
    }

    /// Breaks the resend path on purpose (the swarm's mutation check,
    /// `crate::world::Mutation::EngineIgnoresRepeats`).
    pub fn ignoring_repeats(mut self) -> Self {
        self.ignore_repeats = true;
        self
    }

    /// Keeps the id of every call answered, for the checker.
    pub fn tracking_calls(mut self) -> Self {
        self.track_calls = true;
        self
    }

    /// Breaks weight updates on purpose (the swarm's mutation check,
    /// `crate::world::Mutation::EngineAcksWithoutLoading`).
    pub fn acking_without_loading(mut self) -> Self {
        self.skip_weights = true;
        self
    }

    /// The version to serve after a weight update to `version`: the newer
    /// of the two, unless the update is skipped on purpose.
    fn updated(&self, version: Version) -> Version {
        if self.skip_weights {
            self.version
        } else {
            self.version.max(version)
        }
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Every call this engine answered `Done`, since it last started.
    pub fn answered(&self) -> &std::collections::BTreeSet<CallId> {
        &self.answered
    }

    pub fn is_serving(&self) -> bool {
        self.loaded && self.admitting
    }

    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// `work` stretched by the calls already in flight.
    fn loaded_time(&self, work: u64) -> u64 {
        let cap = self.costs.load_capacity;
        if cap == 0 || self.costs.load_slowdown <= 0.0 {
            return work;
        }
        let load = self.inflight.len() as f64 / f64::from(cap);
        (work as f64 * (1.0 + self.costs.load_slowdown * load)) as u64
    }
}

impl Actor for SimEngine {
    type Msg = EngineReq;
    type Timer = EngineTimer;

    fn on_msg(&mut self, _from: ActorId, msg: EngineReq, cx: &mut Cx<'_, Self>) {
        match msg {
            EngineReq::Serve {
                call,
                attempt,
                prompt_tokens,
                reply_to,
                ..
            } => {
                if self
                    .inflight
                    .get(&call)
                    .is_some_and(|f| f.attempt == attempt)
                {
                    self.stats.repeats += 1;
                    return;
                }
                if let Some(&(c, a, output_tokens, version)) = self.last_done.get(&call.exec)
                    && (c, a) == (call, attempt)
                {
                    self.stats.repeats += 1;
                    if self.ignore_repeats {
                        return;
                    }
                    let done = CallEvent::Done {
                        call,
                        attempt,
                        output_tokens,
                        version,
                        output: BlobId::NONE,
                    };
                    return cx.send(reply_to, done);
                }
                if !self.is_serving() {
                    self.stats.rejected += 1;
                    cx.send(reply_to, CallEvent::Rejected { call, attempt });
                    return;
                }
                if self.expecting.contains(&call.exec) {
                    if self.held.get(&call).is_some_and(|h| h.attempt == attempt) {
                        self.stats.repeats += 1;
                        return;
                    }
                    self.stats.held_for_kv += 1;
                    let h = Held {
                        attempt,
                        prompt_tokens,
                        reply_to,
                    };
                    self.held.insert(call, h);
                    return;
                }
                self.start(call, attempt, prompt_tokens, reply_to, cx);
            }
            EngineReq::StopAdmitting { reply_to } => {
                self.admitting = false;
                cx.send(reply_to, EngineEvent::AdmissionStopped);
            }
            EngineReq::PinKv { execs, reply_to } => {
                if cx.timer_armed(&EngineTimer::Pin) {
                    self.stats.repeats += 1;
                    return;
                }
                let recorded = self.next_control(ControlKind::Pin);
                let mut blocks = Vec::new();
                for exec in execs {
                    if self.released.contains(&exec) {
                        continue; // a repeated pin after the release
                    }
                    let cached = self.kv.get(&exec).copied();
                    let tokens = match &recorded {
                        // The recorded engine's choice: it had blocks for
                        // these (their calls were running there).
                        Some(c) => c
                            .execs
                            .contains(&exec.0)
                            .then(|| cached.unwrap_or(0).max(1)),
                        None => cached.filter(|t| *t > 0),
                    };
                    if let Some(tokens) = tokens {
                        self.pinned.insert(exec, tokens);
                        blocks.push(KvBlocks {
                            exec,
                            engine: self.ix,
                            tokens,
                        });
                    }
                }
                match recorded {
                    Some(c) => {
                        self.pending_pin = Some((reply_to, blocks));
                        cx.set_timer(EngineTimer::Pin, c.took);
                    }
                    None => cx.send(reply_to, EngineEvent::KvPinned { blocks }),
                }
            }
            EngineReq::CancelAll { reply_to } => {
                if cx.timer_armed(&EngineTimer::Cancel) {
                    self.stats.repeats += 1;
                    return;
                }
                match self.next_control(ControlKind::Cancel) {
                    Some(c) => {
                        self.pending_cancel = Some(reply_to);
                        cx.set_timer(EngineTimer::Cancel, c.took);
                    }
                    None => self.cancel_all(reply_to, cx),
                }
            }
            EngineReq::ExpectKv { exec } => {
                if self.costs.hold_for_kv && self.is_serving() && self.expecting.insert(exec) {
                    cx.set_timer(EngineTimer::KvWait(exec), KV_WAIT);
                }
            }
            EngineReq::AdoptKv { exec, tokens } => {
                if self.loaded {
                    self.stats.adopted += 1;
                    let e = self.kv.entry(exec).or_default();
                    *e = (*e).max(tokens);
                }
                self.release_held(exec, cx);
            }
            EngineReq::ReleaseKv { execs } => {
                for exec in execs {
                    self.pinned.remove(&exec);
                    self.released.insert(exec);
                }
            }
            EngineReq::Unload { reply_to } => {
                if cx.timer_armed(&EngineTimer::Unload) {
                    self.stats.repeats += 1;
                    return;
                }
                if !self.loaded && !cx.timer_armed(&EngineTimer::Load) {
                    self.stats.repeats += 1;
                    return cx.send(reply_to, EngineEvent::Unloaded);
                }
                if !self.inflight.is_empty() || !self.held.is_empty() {
                    self.stats.violations += 1;
                }
                if !self.pinned.is_empty() {
                    self.stats.pinned_at_unload += 1;
                }
                for (call, attempt, to) in self.drop_held(cx) {
                    cx.send(to, CallEvent::Cancelled { call, attempt });
                }
                self.admitting = false;
                self.loaded = false;
                self.kv.clear();
                self.pinned.clear();
                self.released.clear();
                self.control = Some((reply_to, self.version));
                let took = self
                    .next_control(ControlKind::Unload)
                    .map_or(self.costs.unload, |c| c.took);
                cx.set_timer(EngineTimer::Unload, took);
            }
            EngineReq::Load { version, reply_to } => {
                if cx.timer_armed(&EngineTimer::Load) {
                    self.stats.repeats += 1;
                    return;
                }
                if self.loaded && !cx.timer_armed(&EngineTimer::Unload) {
                    self.stats.repeats += 1;
                    // Loaded already (a repeat, or a node that rejoins
                    // after it stopped admitting): it serves again.
                    self.admitting = true;
                    let loaded = EngineEvent::Loaded {
                        version: self.version,
                    };
                    return cx.send(reply_to, loaded);
                }
                self.control = Some((reply_to, version));
                let took = self
                    .next_control(ControlKind::Load)
                    .map_or(self.costs.load, |c| c.took);
                cx.set_timer(EngineTimer::Load, took);
            }
            EngineReq::SetWeights { version } => {
                self.version = self.updated(version);
            }
            EngineReq::SetWeightsAcked { version, reply_to } => {
                self.version = self.updated(version);
                cx.send(reply_to, EngineEvent::WeightsSet { version });
            }
        }
    }

    fn on_timer(&mut self, timer: EngineTimer, cx: &mut Cx<'_, Self>) {
        match timer {
            EngineTimer::Call(call) => {
                let Some(f) = self.inflight.remove(&call) else {
                    return;
                };
                self.stats.served += 1;
                if self.track_calls {
                    self.answered.insert(call);
                }
                self.kv.insert(call.exec, f.prompt + f.output);
                self.last_done
                    .insert(call.exec, (call, f.attempt, f.output, self.version));
                cx.send(
                    f.reply_to,
                    CallEvent::Done {
                        call,
                        attempt: f.attempt,
                        output_tokens: f.output,
                        version: self.version,
                        output: BlobId::NONE,
                    },
                );
            }
            EngineTimer::KvWait(exec) => {
                if self.held.keys().any(|c| c.exec == exec) {
                    self.stats.kv_wait_expired += 1;
                }
                self.release_held(exec, cx);
            }
            EngineTimer::Pin => {
                if let Some((to, blocks)) = self.pending_pin.take() {
                    cx.send(to, EngineEvent::KvPinned { blocks });
                }
            }
            EngineTimer::Cancel => {
                if let Some(to) = self.pending_cancel.take() {
                    self.cancel_all(to, cx);
                }
            }
            EngineTimer::Unload => {
                if let Some((to, _)) = self.control.take() {
                    cx.send(to, EngineEvent::Unloaded);
                }
            }
            EngineTimer::Load => {
                if let Some((to, version)) = self.control.take() {
                    self.loaded = true;
                    self.admitting = true;
                    self.version = self.version.max(version);
                    cx.send(
                        to,
                        EngineEvent::Loaded {
                            version: self.version,
                        },
                    );
                }
            }
        }
    }
}
