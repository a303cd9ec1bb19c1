//! The proxy router: every model call of every execution goes through it.
//!
//! It routes execution → engine, as the scheduler tells it. When a role
//! change cancels or refuses a call, the proxy retries the call on the
//! execution's new route, or holds it until the scheduler's reroute arrives,
//! so the harness never sees an error because of a role change (SPEC 2.5
//! step 3). Each call is answered to its execution exactly once, whatever
//! number of attempts it took. Reroutes are counted per execution.
//!
//! While a loss has left more running executions than slots, an
//! execution without a route (waiting for a slot) does not wait for its
//! calls too: the scheduler names the engines serving rollout
//! ([`ProxyMsg::Lend`]), and each such call goes to the one with the
//! fewest attempts of this proxy in flight, as a guest (its KV cache is
//! computed there afresh; the execution still waits for a slot of its
//! own). Without that, a call could wait for a whole execution of the
//! slot's holder, thinking between its calls on an idle engine, past the
//! harness's call timeout.
//!
//! Payloads pass by handle: a call's prompt handle is resent unchanged by
//! every attempt (the harness owns it), and an answer's record handle goes to
//! the execution. The record of an answer nobody waits for any more (a
//! cancelled attempt that finished anyway, a closed execution) would have no
//! owner, so the proxy releases it (a `PayloadRelease` effect) when it was
//! given the store.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use gyre_runtime::{Actor, ActorId, BlobId, BlobStore, Cx, Nanos, PayloadRelease, Recipient};

use crate::sched::execution::ExecMsg;
use crate::sched::ids::{CallId, EngineIx, ExecId};
use crate::sched::msg::cell::CellMsg;
pub use crate::sched::msg::proxy::ProxyMsg;
use crate::sched::proto::Port;
use crate::sched::proto::engine::{CallEvent, EngineReq};
use crate::sched::retry::{Outbox, ReqKey, Resend, RetryTick};

/// Same-engine retries of a `Rejected` call (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RejectRetry {
    /// Retries on the rejecting engine before the call is held.
    pub retries: u32,
    /// Wait before the first retry; each next one waits twice as long.
    pub backoff: Nanos,
}

impl RejectRetry {
    /// The wait before same-engine retry number `n` (1-based).
    pub fn delay(&self, n: u32) -> Nanos {
        self.backoff
            .saturating_mul(1u64 << n.saturating_sub(1).min(20))
            .max(1)
    }
}

/// The proxy's timers: the outbox's resend tick, and a rejected call's
/// backoff before it is retried on the same engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProxyTimer {
    Resend,
    Backoff { call: CallId, attempt: u32 },
}

impl From<RetryTick> for ProxyTimer {
    fn from(_: RetryTick) -> Self {
        ProxyTimer::Resend
    }
}

#[derive(Debug, Clone, Copy)]
struct PendingCall {
    reply_to: Recipient<ExecMsg>,
    prompt_tokens: u64,
    /// Resent as is by every attempt: the harness owns it until answered.
    prompt: BlobId,
    attempt: u32,
    /// The engine serving the current attempt; `None` while held.
    at: Option<EngineIx>,
    /// The engine of the latest attempt, even after it ended.
    last: Option<EngineIx>,
    /// Same-engine retries since the call last moved engine.
    same_engine: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    pub calls: u64,
    pub answered: u64,
    /// Attempts after the first (cancelled or refused by a role change).
    pub retries: u64,
    /// Times a call was held for lack of a usable route.
    pub held: u64,
    pub reroutes: u64,
    /// Rejected attempts retried on the same engine after a backoff.
    pub same_engine_retries: u64,
    /// Attempts lost with their engine's node, tried again from the
    /// prompt elsewhere: their KV cache is recomputed, not moved.
    pub lost_attempts: u64,
    /// Attempts of executions without a route, sent to a lending engine.
    pub lent: u64,
}

#[derive(Debug)]
pub struct Proxy {
    engines: BTreeMap<EngineIx, Port<EngineReq>>,
    /// Looked up by every call (hashed: nothing iterates them).
    routes: FxHashMap<ExecId, EngineIx>,
    /// Executions that closed; a late route for one is ignored.
    closed: FxHashSet<ExecId>,
    /// Every call passes through here (hashed); the rare walks over an
    /// execution's calls or all of them sort what they find, so they go in
    /// call order.
    calls: FxHashMap<CallId, PendingCall>,
    reroutes: BTreeMap<ExecId, u32>,
    /// Engines that serve calls of executions without a route (see the
    /// module doc), in the scheduler's preference order.
    lenders: Vec<EngineIx>,
    blobs: Option<Arc<dyn BlobStore>>,
    /// Attempts sent to engines and not yet answered.
    outbox: Outbox,
    reject_retry: RejectRetry,
    stats: ProxyStats,
}

impl Proxy {
    pub fn new(engines: BTreeMap<EngineIx, Port<EngineReq>>) -> Self {
        Self {
            engines,
            routes: FxHashMap::default(),
            closed: FxHashSet::default(),
            calls: FxHashMap::default(),
            reroutes: BTreeMap::new(),
            lenders: Vec::new(),
            blobs: None,
            outbox: Outbox::new(None),
            reject_retry: RejectRetry::default(),
            stats: ProxyStats::default(),
        }
    }

    /// Retries a rejected call on the same engine before holding it.
    pub fn with_reject_retry(mut self, r: RejectRetry) -> Self {
        self.reject_retry = r;
        self
    }

    /// Resends unanswered attempts every `after`.
    pub fn with_retry(mut self, after: Option<Nanos>) -> Self {
        self.outbox = Outbox::new(after);
        self
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Releases the records of answers that arrive too late to be used.
    pub fn with_blobs(mut self, blobs: Arc<dyn BlobStore>) -> Self {
        self.blobs = Some(blobs);
        self
    }

    pub fn stats(&self) -> ProxyStats {
        self.stats
    }

    /// How often each execution was rerouted.
    pub fn reroutes(&self) -> &BTreeMap<ExecId, u32> {
        &self.reroutes
    }

    pub fn route(&self, exec: ExecId) -> Option<EngineIx> {
        self.routes.get(&exec).copied()
    }

    /// Calls not yet answered.
    pub fn outstanding(&self) -> usize {
        self.calls.len()
    }

    /// Each unanswered call with the engine of its current attempt (`None`
    /// while held) and its attempt count.
    pub fn pending_calls(&self) -> Vec<(CallId, Option<EngineIx>, u32)> {
        let mut calls: Vec<_> = self
            .calls
            .iter()
            .map(|(c, p)| (*c, p.at, p.attempt))
            .collect();
        calls.sort_unstable_by_key(|(c, _, _)| *c);
        calls
    }

    /// The calls that satisfy `keep`, in call order.
    fn calls_where(&self, keep: impl Fn(&CallId, &PendingCall) -> bool) -> Vec<CallId> {
        let mut calls: Vec<CallId> = self
            .calls
            .iter()
            .filter(|(c, p)| keep(c, p))
            .map(|(c, _)| *c)
            .collect();
        calls.sort_unstable();
        calls
    }

    /// The lending engine for a call of an execution without a route:
    /// the one with the fewest attempts in flight from here (the first in
    /// preference order among equals), other than `avoid`.
    fn lender(&self, avoid: Option<EngineIx>) -> Option<EngineIx> {
        self.lenders
            .iter()
            .copied()
            .filter(|e| Some(*e) != avoid && self.engines.contains_key(e))
            .min_by_key(|e| self.calls.values().filter(|p| p.at == Some(*e)).count())
    }

    /// Sends a new attempt of `call` on its execution's route, or holds it.
    fn attempt(&mut self, call: CallId, cx: &mut Cx<'_, Self>) {
        self.attempt_avoiding(call, None, cx);
    }

    /// As [`Self::attempt`]; without a route, on a lending engine other
    /// than `avoid` if there is one.
    fn attempt_avoiding(&mut self, call: CallId, avoid: Option<EngineIx>, cx: &mut Cx<'_, Self>) {
        let route = self.routes.get(&call.exec).copied();
        let lent = route.is_none() && !self.closed.contains(&call.exec);
        let engine = if lent { self.lender(avoid) } else { route };
        let Some(p) = self.calls.get_mut(&call) else {
            return;
        };
        let Some((engine, port)) = engine.and_then(|e| Some((e, *self.engines.get(&e)?))) else {
            p.at = None;
            self.stats.held += 1;
            return;
        };
        if lent {
            self.stats.lent += 1;
        }
        if p.attempt > 0 {
            self.stats.retries += 1;
        }
        p.attempt += 1;
        p.at = Some(engine);
        if p.last != Some(engine) {
            p.same_engine = 0;
        }
        p.last = Some(engine);
        let reply_to = cx.recipient();
        let req = EngineReq::Serve {
            call,
            attempt: p.attempt,
            prompt_tokens: p.prompt_tokens,
            prompt: p.prompt,
            reply_to,
        };
        self.outbox.send(cx, Resend::Engine(port, req));
    }

    /// Sends held calls of `exec` on its (new) route.
    fn release_held(&mut self, exec: ExecId, cx: &mut Cx<'_, Self>) {
        let held = self.calls_where(|c, p| c.exec == exec && p.at.is_none());
        for call in held {
            self.attempt(call, cx);
        }
    }

    /// An attempt ended without an answer: retry where the execution is
    /// routed now; on the same engine, a rejected call may be retried
    /// after a backoff (`RejectRetry`); otherwise hold the call until its
    /// route changes.
    fn not_served(&mut self, call: CallId, attempt: u32, rejected: bool, cx: &mut Cx<'_, Self>) {
        let Some(p) = self.calls.get_mut(&call) else {
            return;
        };
        if p.attempt != attempt {
            return;
        }
        let failed_on = p.at.take();
        let route = self.routes.get(&call.exec).copied();
        if route.is_some() && route != failed_on {
            self.attempt(call, cx);
            return;
        }
        if route.is_none() && self.lender(failed_on).is_some() {
            self.attempt_avoiding(call, failed_on, cx);
            return;
        }
        let Some(p) = self.calls.get_mut(&call) else {
            return;
        };
        if rejected && route.is_some() && p.same_engine < self.reject_retry.retries {
            p.same_engine += 1;
            self.stats.same_engine_retries += 1;
            let after = self.reject_retry.delay(p.same_engine);
            cx.set_timer(ProxyTimer::Backoff { call, attempt }, after);
        } else {
            self.stats.held += 1;
        }
    }

    /// A backoff ended: retry unless a reroute already sent the call.
    fn backoff_over(&mut self, call: CallId, attempt: u32, cx: &mut Cx<'_, Self>) {
        if self
            .calls
            .get(&call)
            .is_some_and(|p| p.attempt == attempt && p.at.is_none())
        {
            self.attempt(call, cx);
        }
    }
}

impl Proxy {
    /// Every attempt on `engine` is given up (no answer will come), the
    /// executions that were served there get their new routes, and their
    /// calls are tried again there or held.
    fn engine_lost(
        &mut self,
        engine: EngineIx,
        moves: Vec<(ExecId, Option<EngineIx>)>,
        cx: &mut Cx<'_, Self>,
    ) {
        for (exec, to) in &moves {
            if self.closed.contains(exec) {
                continue;
            }
            match to {
                Some(to) => {
                    self.routes.insert(*exec, *to);
                    *self.reroutes.entry(*exec).or_default() += 1;
                    self.stats.reroutes += 1;
                }
                None => {
                    self.routes.remove(exec);
                }
            }
        }
        self.lenders.retain(|e| *e != engine);
        for call in self.calls_where(|_, p| p.at == Some(engine)) {
            if let Some(p) = self.calls.get_mut(&call) {
                self.outbox.forget(&ReqKey::Serve(call, p.attempt));
                self.stats.lost_attempts += 1;
                p.at = None;
            }
        }
        let mut execs: Vec<ExecId> = moves.iter().map(|(x, _)| *x).collect();
        execs.extend(
            self.calls
                .iter()
                .filter(|(_, p)| p.at.is_none())
                .map(|(c, _)| c.exec),
        );
        execs.sort();
        execs.dedup();
        for exec in execs {
            self.release_held(exec, cx);
        }
    }
}

impl Actor for Proxy {
    type Msg = ProxyMsg;
    type Timer = ProxyTimer;
    gyre_runtime::accepts!(CallEvent);

    fn on_timer(&mut self, t: ProxyTimer, cx: &mut Cx<'_, Self>) {
        match t {
            ProxyTimer::Resend => self.outbox.tick(cx),
            ProxyTimer::Backoff { call, attempt } => self.backoff_over(call, attempt, cx),
        }
    }

    fn on_msg(&mut self, _from: ActorId, msg: ProxyMsg, cx: &mut Cx<'_, Self>) {
        if let ProxyMsg::Engine(e) = &msg {
            // The attempt is answered; what the answer means is decided
            // below by attempt number, which already makes a duplicate or
            // a stale attempt's answer change nothing.
            self.outbox.ack(e);
        }
        match msg {
            ProxyMsg::Route { exec, engine } => {
                if self.closed.contains(&exec) {
                    return;
                }
                self.routes.insert(exec, engine);
                self.release_held(exec, cx);
            }
            ProxyMsg::Reroute {
                switch,
                moves,
                notify,
            } => {
                for (exec, engine) in moves {
                    if self.closed.contains(&exec) || !self.routes.contains_key(&exec) {
                        continue;
                    }
                    self.routes.insert(exec, engine);
                    *self.reroutes.entry(exec).or_default() += 1;
                    self.stats.reroutes += 1;
                    self.release_held(exec, cx);
                }
                cx.send(notify, CellMsg::RoutesMoved { switch });
            }
            ProxyMsg::Forget { exec } => {
                self.routes.remove(&exec);
                self.closed.insert(exec);
                for c in self.calls_where(|c, _| c.exec == exec) {
                    if let Some(p) = self.calls.remove(&c) {
                        self.outbox.forget(&ReqKey::Serve(c, p.attempt));
                    }
                }
            }
            ProxyMsg::Call {
                call,
                prompt_tokens,
                prompt,
                reply_to,
            } => {
                if self.closed.contains(&call.exec) || self.calls.contains_key(&call) {
                    return;
                }
                self.stats.calls += 1;
                self.calls.insert(
                    call,
                    PendingCall {
                        reply_to,
                        prompt_tokens,
                        prompt,
                        attempt: 0,
                        at: None,
                        last: None,
                        same_engine: 0,
                    },
                );
                self.attempt(call, cx);
            }
            ProxyMsg::Engine(CallEvent::Done {
                call,
                attempt,
                output_tokens,
                version,
                output,
            }) => {
                if self.calls.get(&call).is_none_or(|p| p.attempt != attempt) {
                    if let Some(store) = self.blobs.as_ref().filter(|_| output.is_some()) {
                        let release = PayloadRelease::new(store.clone(), output);
                        cx.io(release, |_| ProxyMsg::Released);
                    }
                    return;
                }
                if let Some(p) = self.calls.remove(&call) {
                    self.stats.answered += 1;
                    cx.send(
                        p.reply_to,
                        ExecMsg::Answer {
                            call,
                            output_tokens,
                            version,
                            output,
                        },
                    );
                }
            }
            ProxyMsg::Engine(CallEvent::Cancelled { call, attempt }) => {
                self.not_served(call, attempt, false, cx)
            }
            ProxyMsg::Engine(CallEvent::Rejected { call, attempt }) => {
                self.not_served(call, attempt, true, cx)
            }
            ProxyMsg::Released => {}
            ProxyMsg::EngineLost { engine, moves } => self.engine_lost(engine, moves, cx),
            ProxyMsg::Lend { engines } => {
                self.lenders = engines;
                if self.lenders.is_empty() {
                    return;
                }
                let waiting =
                    self.calls_where(|c, p| p.at.is_none() && !self.routes.contains_key(&c.exec));
                for call in waiting {
                    self.attempt(call, cx);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
