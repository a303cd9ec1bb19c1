//! SPEC 2's invariants, checked after every simulator event, and the checks
//! a finished run must pass.
//!
//! The checker reads actor states through the simulator's view and keeps
//! its own history, so it re-derives what it checks rather than trusting the
//! scheduler's bookkeeping: it watches the watermark across events, tracks
//! the supply clock from the values and resets it observes, and keeps its
//! own set of trained groups; the burst-end supply check counts ready
//! groups itself (from the buffer's ready groups and its own trained set),
//! not from the scheduler's last report.
//!
//! After every event:
//! - d ≥ p ≥ f, and the ledger's placements equal p − f and never exceed
//!   C_R or any engine's slots;
//! - under boundary dispatch, w never rises inside a burst;
//! - the training set is a prefix starting at the core, at most one cell is
//!   switching in under the elastic policy, and no cell leaves it inside a
//!   burst;
//! - a rollout→training transition happens only when rule (2) holds and the
//!   supply has held for τ since the last reset (Async's fixed partition is
//!   exempt: it is configuration, not a decision);
//! - exactly one optimizer update per step, in order; each step trains B
//!   distinct groups, none trained before; batch memberships are prefixes;
//! - rollout engines serve only published versions, and never go back to
//!   an older one (a restarted engine starts again from 0);
//! - no harness call timed out or got an answer it did not expect, and no
//!   actor or backend saw a protocol breach. A timeout is excused only
//!   when no engine could serve for the whole call timeout before it (C_R
//!   was 0 throughout: every rollout engine lost, the rest training): no
//!   schedule can answer a call then, and the harness giving up is the
//!   defined outcome.
//!
//! At the end, besides liveness and accounting: every call an engine
//! answered reached its run or found it aborted (no answered call lost),
//! and every engine serves the last published version.

use std::collections::BTreeSet;

use gyre_actors::sched::Policy;
use gyre_actors::sched::config::DispatchMode;
use gyre_actors::sched::core::Core;
use gyre_actors::sched::ids::{CallId, GroupId};
use gyre_actors::sched::maths::prefix::{is_prefix, training_set};
use gyre_actors::sched::maths::{Role, SupplyCheck};
use gyre_actors::sched::scheduler::Scheduler;
use gyre_runtime::sim::SimView;
use gyre_runtime::{Addr, Nanos};

use crate::backends::{SimEngine, SimHarness};
use crate::world::Cluster;

#[derive(Debug, Clone)]
struct Seen {
    published: u64,
    steps_done: u64,
    watermark: u64,
    roles: Vec<Role>,
}

/// Intervals of time during which something held (here: C_R > 0).
#[derive(Debug, Default)]
struct UpTime {
    /// Closed intervals, oldest first.
    past: std::collections::VecDeque<(Nanos, Nanos)>,
    /// The start of the interval still open.
    since: Option<Nanos>,
}

impl UpTime {
    fn observe(&mut self, now: Nanos, up: bool) {
        match (self.since, up) {
            (None, true) => self.since = Some(now),
            (Some(start), false) => {
                self.past.push_back((start, now));
                self.since = None;
            }
            _ => {}
        }
    }

    /// How long it held within [from, to].
    fn up_within(&self, from: Nanos, to: Nanos) -> Nanos {
        let overlap = |(a, b): (Nanos, Nanos)| b.min(to).saturating_sub(a.max(from));
        let open = self.since.map_or(0, |a| overlap((a, to)));
        self.past.iter().map(|i| overlap(*i)).sum::<Nanos>() + open
    }

    fn forget_before(&mut self, t: Nanos) {
        while self.past.front().is_some_and(|(_, end)| *end < t) {
            self.past.pop_front();
        }
    }
}

/// The per-event invariant checker of one cluster.
#[derive(Debug)]
pub struct Checker {
    sched: Addr<Scheduler>,
    harness: Addr<SimHarness>,
    engines: Vec<Addr<SimEngine>>,
    policy: Policy,
    boundary: bool,
    batch_groups: usize,
    /// The version the run started from (`SchedConfig::start_version`).
    start_version: u64,
    supply: Option<SupplyCheck>,
    prev: Option<Seen>,
    updates_seen: usize,
    records_seen: usize,
    memberships_seen: usize,
    /// Records the core rolled back (a restore), already taken out of
    /// `trained`.
    redone_seen: usize,
    trained: BTreeSet<GroupId>,
    /// The version each rollout engine served at the last event.
    served: Vec<u64>,
    /// When C_R was above 0 (some engine serving rollout).
    capacity: UpTime,
    /// A call timeout is excused when, over the call's whole timeout, C_R
    /// was above 0 for less than this: no engine was up long enough to
    /// serve it (see [`Checker::with_service_bound`]).
    service_bound: Nanos,
    /// Harness call timeouts seen, and those excused as unservable.
    timeouts_seen: u64,
    excused_timeouts: u64,
}

impl Checker {
    pub fn new(cluster: &Cluster) -> Self {
        let mut engines = cluster.backends.engines.clone();
        engines.extend(cluster.backends.pool);
        let n_engines = engines.len();
        Self {
            sched: cluster.sched,
            harness: cluster.backends.harness,
            engines,
            // Read from the scheduler's configuration at the first check.
            policy: Policy::Elastic,
            boundary: true,
            batch_groups: 0,
            start_version: 0,
            supply: None,
            prev: None,
            updates_seen: 0,
            records_seen: 0,
            memberships_seen: 0,
            redone_seen: 0,
            trained: BTreeSet::new(),
            served: vec![0; n_engines],
            capacity: UpTime::default(),
            service_bound: 1,
            timeouts_seen: 0,
            excused_timeouts: 0,
        }
    }

    /// Excuses a harness call timeout when C_R was above 0 for less than
    /// `bound` over the call's timeout (by default, only when it was 0
    /// throughout): a bound on one call's service, from the cluster's
    /// costs, makes an outage broken by windows too short to serve any
    /// call an outage too, while a call that waited through a window long
    /// enough is still a failure of the serving side.
    pub fn with_service_bound(mut self, bound: Nanos) -> Self {
        self.service_bound = bound.max(1);
        self
    }

    /// Harness call timeouts excused because no engine could serve.
    pub fn excused_timeouts(&self) -> u64 {
        self.excused_timeouts
    }

    /// Groups trained so far, as the checker counted them.
    pub fn trained(&self) -> usize {
        self.trained.len()
    }

    /// Checks every invariant against the state after one event.
    pub fn check(&mut self, view: &SimView<'_>) -> Result<(), String> {
        let Some(s) = view.actor(self.sched) else {
            return Err("the scheduler is gone".to_owned());
        };
        let Some(peers) = s.peers() else {
            return Ok(()); // not started yet
        };
        let now = view.now();
        if self.supply.is_none() {
            let cfg = s.config();
            self.policy = cfg.policy;
            self.boundary = cfg.dispatch == DispatchMode::Boundary;
            self.batch_groups = cfg.batch_groups as usize;
            self.start_version = cfg.start_version;
            self.supply = Some(SupplyCheck::new(
                u64::from(s.derived().supply_threshold),
                cfg.tau,
            ));
        }
        let c = s.counters();
        if !(c.dispatched() >= c.started() && c.started() >= c.finished()) {
            return Err(format!(
                "d ≥ p ≥ f broken: d={} p={} f={}",
                c.dispatched(),
                c.started(),
                c.finished()
            ));
        }
        let ledger = s.ledger();
        ledger.check()?;
        if ledger.running() != c.running() {
            return Err(format!(
                "ledger places {} executions, p − f = {}",
                ledger.running(),
                c.running()
            ));
        }
        let roles = ledger.roles().to_vec();
        let set = training_set(&roles);
        if !is_prefix(set.iter().copied()) {
            return Err(format!("training set {set:?} is not a prefix ({roles:?})"));
        }
        if self.policy == Policy::Elastic
            && roles.iter().filter(|r| **r == Role::ToTraining).count() > 1
        {
            return Err(format!("two cells switch at once: {roles:?}"));
        }
        if let Some(e) = s.log().errors.first() {
            return Err(format!("scheduler decision refused: {e}"));
        }

        let seen = Seen {
            published: s.published(),
            steps_done: s.steps_done(),
            watermark: c.watermark(),
            roles: roles.clone(),
        };
        let prev = self.prev.replace(seen).unwrap_or(Seen {
            published: 0,
            steps_done: 0,
            watermark: c.watermark(),
            roles: vec![Role::Rollout; roles.len()],
        });
        let same_burst = prev.published == s.published();
        if self.boundary && same_burst && c.watermark() > prev.watermark {
            return Err(format!(
                "w rose inside a burst: {} -> {}",
                prev.watermark,
                c.watermark()
            ));
        }
        if !same_burst && self.policy == Policy::Elastic && !s.is_done() {
            // The burst-end rule (SPEC 2.4): the core stays only with
            // ρ_min·B ready groups and w + μ·N·B ≤ C_s + (K − 1)·C_e, with
            // w as it was before this publication's dispatch.
            let cfg = s.config();
            let stays = roles.first().is_some_and(|r| r.is_training_side());
            let room = u64::from(cfg.pool_capacity)
                + u64::from(cfg.cells - 1) * u64::from(cfg.cell_capacity);
            let next = u64::from(cfg.mu) * cfg.batch_dispatch();
            // The supply, counted here rather than read from the
            // scheduler's last report: groups the buffer made ready and
            // training has not consumed yet, capped at B. It bounds the
            // packer's ready-unclaimed count from above (a ready group is
            // either still unclaimed, claimed, or trained), so a core that
            // stays below it stayed on supply that never existed.
            let ready = view
                .actor(peers.buffer)
                .ok_or("the buffer is gone")?
                .stats()
                .ready;
            let supply = own_supply(ready, self.trained.len(), self.batch_groups);
            let threshold = u64::from(s.derived().supply_threshold);
            if stays && (prev.watermark + next > room || supply < threshold) {
                return Err(format!(
                    "the core stayed with w = {}, μ·N·B = {next}, room {room}, supply {supply} < {threshold} ({ready} groups ready, {} trained)?",
                    prev.watermark,
                    self.trained.len()
                ));
            }
        }
        let joined = prev
            .roles
            .iter()
            .zip(&roles)
            .any(|(a, b)| *a == Role::ToTraining && *b == Role::Training);
        // A lost node cuts the prefix: the lost cell and those above it
        // leave training inside the burst, by design (`scheduler::loss`).
        let cut_by_loss = s.log().losses.iter().any(|l| l.burst == s.burst())
            || s.log().core_losses.iter().any(|(_, b)| *b == s.burst());
        for (i, (a, b)) in prev.roles.iter().zip(&roles).enumerate() {
            if same_burst && !cut_by_loss && a.is_training_side() && !b.is_training_side() {
                return Err(format!(
                    "cell {i} left training inside a burst ({a:?} -> {b:?})"
                ));
            }
        }

        // The supply clock, re-derived from what the scheduler saw.
        let supply = self.supply.as_mut().ok_or("no supply check")?;
        if joined || !same_burst || prev.steps_done != s.steps_done() {
            supply.reset(now);
        }
        if s.supply().value() != supply.value() {
            supply.observe(now, s.supply().value());
        }
        let entered: Vec<usize> = prev
            .roles
            .iter()
            .zip(&roles)
            .enumerate()
            .filter(|(_, (a, b))| **a == Role::Rollout && **b == Role::ToTraining)
            .map(|(i, _)| i)
            .collect();
        if !entered.is_empty() && !matches!(self.policy, Policy::Async { .. }) {
            if c.watermark() > ledger.rollout_capacity() {
                return Err(format!(
                    "cells {entered:?} left rollout with w = {} > C_R − moved = {} (rule 2)",
                    c.watermark(),
                    ledger.rollout_capacity()
                ));
            }
            if !supply.passes(now) {
                return Err(format!(
                    "cells {entered:?} left rollout without the supply check: value {} since {:?}, now {now}",
                    supply.value(),
                    supply.since()
                ));
            }
        }

        let published = self.check_core(view, peers.core)?;

        let h = view.actor(self.harness).ok_or("the harness is gone")?;
        let hs = h.stats();
        self.capacity.observe(now, ledger.rollout_capacity() > 0);
        if hs.call_timeouts > self.timeouts_seen {
            let new = hs.call_timeouts - self.timeouts_seen;
            self.timeouts_seen = hs.call_timeouts;
            let window = h.call_timeout();
            let up = self.capacity.up_within(now.saturating_sub(window), now);
            if up < self.service_bound {
                self.excused_timeouts += new;
            }
            self.capacity.forget_before(now.saturating_sub(window));
        }
        let failed_calls = hs.call_timeouts - self.excused_timeouts;
        if failed_calls > 0 || hs.stray_answers > 0 {
            return Err(format!(
                "a harness saw the serving side fail: {failed_calls} call timeouts, {} stray answers",
                hs.stray_answers
            ));
        }
        for addr in peers.cells.iter().chain(peers.pool.iter()) {
            let Some(cell) = view.actor(*addr) else {
                return Err(format!("cell {addr:?} is gone"));
            };
            let st = cell.stats();
            if st.unexpected > 0 || st.faults > 0 || st.stale_snapshots > 0 {
                return Err(format!("cell {:?} in trouble: {st:?}", cell.index()));
            }
        }
        // Rollout engines serve only published versions, and an engine's
        // version never goes back (a restarted one starts again from 0).
        for (e, last) in self.engines.iter().zip(&mut self.served) {
            let Some(engine) = view.actor(*e) else {
                continue;
            };
            if engine.stats().violations > 0 {
                return Err(format!(
                    "engine {e:?} unloaded with pinned blocks or calls in flight"
                ));
            }
            let v = engine.version();
            if v > published {
                return Err(format!(
                    "engine {e:?} serves version {v}, only {published} was published"
                ));
            }
            if v < *last && v != 0 {
                return Err(format!("engine {e:?} went back from version {last} to {v}"));
            }
            *last = v;
        }
        if let Some(q) = view.actor(peers.queue) {
            let qs = q.stats();
            if qs.double_grants > 0 || qs.bad_closes > 0 {
                return Err(format!("micro-step queue: {qs:?}"));
            }
        }
        if let Some(b) = view.actor(peers.buffer)
            && b.stats().violations > 0
        {
            return Err(format!("trajectory buffer: {:?}", b.stats()));
        }
        Ok(())
    }

    /// Checks the core's log; returns the published policy version.
    fn check_core(&mut self, view: &SimView<'_>, core: Addr<Core>) -> Result<u64, String> {
        let Some(core) = view.actor(core) else {
            return Err("the core is gone".to_owned());
        };
        let log = core.log();
        if let Some(v) = log.violations.first() {
            return Err(format!("core: {v}"));
        }
        // A restore rolled the history back: what it dropped leaves the
        // trained set (those groups are trained again), and the checks go
        // on over the history that is left.
        if log.redone.len() > self.redone_seen {
            for r in &log.redone[self.redone_seen..] {
                for g in &r.groups {
                    if !self.trained.remove(&g.group) {
                        return Err(format!(
                            "group {:?} of rolled-back step {} was not trained",
                            g.group, r.step
                        ));
                    }
                }
            }
            self.redone_seen = log.redone.len();
            self.updates_seen = self.updates_seen.min(log.updates.len());
            self.records_seen = self.records_seen.min(log.records.len());
        }
        let start = self.start_version;
        for (i, step) in log.updates.iter().enumerate().skip(self.updates_seen) {
            if *step != start + i as u64 {
                return Err(format!("update #{i} was for step {step}: not one per step"));
            }
        }
        self.updates_seen = log.updates.len();
        // The policy version moves by exactly one per optimizer update.
        if core.version() != start + log.updates.len() as u64 {
            return Err(format!(
                "policy version {} after {} updates from version {start}",
                core.version(),
                log.updates.len()
            ));
        }
        for r in log.records.iter().skip(self.records_seen) {
            if r.groups.len() != self.batch_groups {
                return Err(format!(
                    "step {} trained {} groups, B = {}",
                    r.step,
                    r.groups.len(),
                    self.batch_groups
                ));
            }
            for g in &r.groups {
                if !self.trained.insert(g.group) {
                    return Err(format!(
                        "group {:?} trained twice (step {})",
                        g.group, r.step
                    ));
                }
                if g.v_d > r.step {
                    return Err(format!("group {:?} dispatched after its step", g.group));
                }
            }
        }
        self.records_seen = log.records.len();
        for m in log.memberships.iter().skip(self.memberships_seen) {
            if m.first() != Some(&0) || !is_prefix(m.iter().copied()) {
                return Err(format!(
                    "batch membership {m:?} is not a prefix from the core"
                ));
            }
        }
        self.memberships_seen = log.memberships.len();
        Ok(core.version())
    }
}

/// The supply as the checker counts it: groups made ready and not yet
/// trained, capped at a batch of `batch_groups`.
fn own_supply(ready: u64, trained: usize, batch_groups: usize) -> u64 {
    ready
        .saturating_sub(trained as u64)
        .min(batch_groups as u64)
}

/// The first call answered by an engine that its run neither got nor
/// abandoned.
fn lost_answer(
    by_engine: &BTreeSet<CallId>,
    answered: &BTreeSet<CallId>,
    abandoned: &BTreeSet<CallId>,
) -> Option<CallId> {
    by_engine
        .iter()
        .find(|c| !answered.contains(c) && !abandoned.contains(c))
        .copied()
}

/// The checks of a run that has quiesced: liveness and exact accounting.
pub fn check_end(cluster: &Cluster) -> Result<(), String> {
    let sim = &cluster.sim;
    let s = sim.actor(cluster.sched).ok_or("the scheduler is gone")?;
    let peers = s.peers().ok_or("the scheduler never started")?;
    let cfg = s.config();
    let core = sim.actor(peers.core).ok_or("the core is gone")?;
    if core.version() != cfg.target_steps || !s.is_done() {
        return Err(format!(
            "liveness: {} of {} steps done",
            core.version(),
            cfg.target_steps
        ));
    }
    let c = s.counters();
    if c.started() != c.finished() {
        return Err(format!(
            "{} started executions never closed",
            c.started() - c.finished()
        ));
    }
    let h = sim
        .actor(cluster.backends.harness)
        .ok_or("the harness is gone")?;
    let hs = h.stats();
    // Every call ended once: answered, abandoned with its run, or timed
    // out (the per-event check fails a run on any timeout it does not
    // excuse).
    if h.live().0 > 0 || hs.calls != hs.answered + hs.abandoned + hs.call_timeouts {
        return Err(format!(
            "harness calls unanswered: {hs:?}, {} runs still live",
            h.live().0
        ));
    }
    let proxy = sim.actor(peers.proxy).ok_or("the proxy is gone")?;
    if proxy.outstanding() > 0 {
        return Err(format!(
            "{} calls still held by the proxy",
            proxy.outstanding()
        ));
    }
    let evaluator = sim.actor(peers.evaluator).ok_or("the evaluator is gone")?;
    if evaluator.in_progress() > 0 {
        return Err("evaluations never finished".to_owned());
    }
    for addr in peers.cells.iter().chain(peers.pool.iter()) {
        let cell = sim.actor(*addr).ok_or("a cell is gone")?;
        let st = cell.stats();
        if cell.role() != gyre_actors::sched::cell::CellRole::Rollout {
            return Err(format!(
                "cell {:?} ended in {:?}",
                cell.index(),
                cell.role()
            ));
        }
        // A batch abandoned with its node may have warmed up and not drained.
        let abandoned = st.warmups.saturating_sub(st.drains);
        if abandoned > st.losses || st.drains != st.batches {
            return Err(format!(
                "cell {:?}: {} warm-ups, {} drains, {} batches with work",
                cell.index(),
                st.warmups,
                st.drains,
                st.batches
            ));
        }
    }
    let queue = sim.actor(peers.queue).ok_or("the queue is gone")?;
    let mut trained = BTreeSet::new();
    for r in &core.log().records {
        if queue.granted(r.step) != r.micro_steps as usize {
            return Err(format!(
                "step {}: {} micro-steps granted, {} sealed",
                r.step,
                queue.granted(r.step),
                r.micro_steps
            ));
        }
        trained.extend(r.groups.iter().map(|g| g.group));
    }
    // Over-sampling: every surplus execution of a formed group ended either
    // withdrawn from the queue or with its result discarded untrained.
    let buffer = sim.actor(peers.buffer).ok_or("the buffer is gone")?;
    let bs = buffer.stats();
    let surplus = u64::from(cfg.oversample) * bs.ready;
    if bs.surplus_discarded + s.log().surplus_withdrawn != surplus {
        return Err(format!(
            "over-sampling: {} discarded + {} withdrawn surplus, want M·groups = {surplus}",
            bs.surplus_discarded,
            s.log().surplus_withdrawn
        ));
    }
    // Every micro-step granted was computed exactly once by a trainer (the
    // backends' own count: a repeated request done twice shows here).
    let granted: usize = core
        .log()
        .records
        .iter()
        .map(|r| queue.granted(r.step))
        .sum();
    let computed: u64 = cluster
        .backends
        .trainers
        .iter()
        .filter_map(|t| sim.actor(*t))
        .map(|t| t.stats().micro_steps)
        .sum();
    // After a satellite's loss its grants were granted again (requeued):
    // a lost trainer's count went with its node, a cut survivor's stays.
    // A restore grants the rolled-back steps' micro-steps again (rewound),
    // and the lost trainer's count went with its node.
    let requeued = queue.stats().requeued + queue.stats().rewound;
    let lost_nodes = !s.log().losses.is_empty() || !s.log().core_losses.is_empty();
    if (!lost_nodes && computed != granted as u64) || computed > granted as u64 + requeued {
        return Err(format!(
            "trainers computed {computed} micro-steps, {granted} were granted ({requeued} again)"
        ));
    }
    // Every loss ended in a rejoin (the liveness phase restarts nodes).
    if let Some(l) = s.log().losses.iter().find(|l| l.rejoined_at.is_none()) {
        return Err(format!(
            "{:?} was lost at {} and never rejoined",
            l.engine, l.at
        ));
    }
    if s.ledger().unplaced() > 0 {
        return Err(format!(
            "{} executions never got a slot back",
            s.ledger().unplaced()
        ));
    }
    // Every published version is what the rollout engines serve at the end;
    // and no answered call is lost: every call an engine answered reached
    // its run (answered there, once: a second answer is a stray one), or
    // found the run aborted with the call outstanding.
    let (answered, abandoned) = h.calls_ended();
    let rollout = cluster
        .backends
        .engines
        .iter()
        .chain(&cluster.backends.pool);
    for (e, engine) in rollout.filter_map(|e| Some((e, sim.actor(*e)?))) {
        if engine.version() != core.version() {
            return Err(format!(
                "engine {e:?} serves version {} at the end, {} was published",
                engine.version(),
                core.version()
            ));
        }
        if let Some(call) = lost_answer(engine.answered(), answered, abandoned) {
            return Err(format!(
                "engine {e:?} answered {call:?}, which never reached its run"
            ));
        }
    }
    let steps = cfg.target_steps - cfg.start_version;
    let want = steps as usize * cfg.batch_groups as usize;
    if trained.len() != want || core.log().updates.len() != steps as usize {
        return Err(format!(
            "{} groups trained in {} updates, want {want} in {steps}",
            trained.len(),
            core.log().updates.len(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_actors::sched::ids::ExecId;

    fn call(exec: u64, seq: u32) -> CallId {
        CallId {
            exec: ExecId(exec),
            seq,
        }
    }

    #[test]
    fn an_answer_that_reached_no_run_is_lost() {
        let by_engine: BTreeSet<_> = [call(1, 0), call(1, 1), call(2, 0)].into();
        let answered: BTreeSet<_> = [call(1, 0), call(1, 1)].into();
        let abandoned: BTreeSet<_> = [call(2, 0)].into();
        assert_eq!(lost_answer(&by_engine, &answered, &abandoned), None);
        let answered_less: BTreeSet<_> = [call(1, 0)].into();
        assert_eq!(
            lost_answer(&by_engine, &answered_less, &abandoned),
            Some(call(1, 1))
        );
    }

    #[test]
    fn the_own_supply_bounds_ready_minus_trained_by_a_batch() {
        assert_eq!(own_supply(10, 4, 4), 4);
        assert_eq!(own_supply(6, 4, 4), 2);
        assert_eq!(own_supply(3, 4, 4), 0);
    }
}
