//! Swarm testing of the scheduling plane: small clusters under the fault
//! plan their seed draws (`FaultPlan::within`: loss, duplication,
//! reordering, latency shape, partitions), checked in two phases.
//!
//! - Safety: the plan's faults act for the first [`HORIZON`] of virtual
//!   time while every invariant of [`crate::checker`] is checked after
//!   every event.
//! - Liveness: then every link is healed and the network made reliable
//!   again, and the run must finish its steps within the event bound, with
//!   the end-of-run accounting exact (every call answered, every started
//!   execution closed, every group trained once, every micro-step granted
//!   once, one update per step).
//!
//! Backend requests are resent every [`RETRY`] until answered (see
//! `gyre_actors::sched::retry`). The plan's crashes are node crashes: each
//! takes down the node of a cell, or the pool's, and restarts it with fresh
//! backends after `lasts` (at the latest when the faults heal); the
//! scheduler watches those nodes (`watch_nodes`), so a crash, and a
//! partition between the scheduler's node and a cell's, is a lost node with
//! its defined outcome (`scheduler::loss`). Three seeds in four checkpoint
//! (every 1, 2 or 3 steps: [`checkpoint_every`]), and there the core's node
//! (cell 0's) is crashable too: its loss is a restore (`core::restore`).
//! The live cluster's settings ([`live_swarm_config`], [`live_plan`]) run
//! without resends over reliable links, with each restart announced to the
//! scheduler as the head does (`SchedMsg::NodeBack`).
//! What a plan does not touch yet: the harness link (the harness is placed
//! on the scheduler's node, its protocol having no acknowledgements), and
//! the nodes of the transfer engine and the evaluator backend.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use gyre_runtime::sim::{FaultPlan, LinkModel, SimError, fmt_nanos};
use gyre_runtime::{Nanos, NodeId, SECS};

use crate::checker::{Checker, check_end};
use crate::random::small_config;
use crate::run::RunError;
use crate::world::{ClusterConfig, build};
use gyre_actors::sched::scheduler::{SchedMsg, Scheduler};

/// How long a seed's faults act.
pub const HORIZON: Nanos = 600 * SECS;
/// The resend interval of unanswered backend requests.
pub const RETRY: Nanos = SECS;

/// The small cluster of `seed` made smaller (at most 3 cells, 2 pool
/// slots, 2 calls per execution, 2 bursts), configured to resend, with the
/// seed's checkpoint interval.
pub fn swarm_config(seed: u64) -> ClusterConfig {
    let mut cfg = small_config(seed);
    let full = cfg.clone();
    let s = &mut cfg.sched;
    s.cells = s.cells.min(3);
    s.pool_capacity = s.pool_capacity.min(2);
    if let gyre_actors::sched::Policy::Async { train_cells } = &mut s.policy {
        *train_cells = (*train_cells).min(s.cells);
        if *train_cells == s.cells && s.pool_capacity == 0 {
            s.pool_capacity = 1;
        }
    }
    s.target_steps = s.target_steps.min(2 * u64::from(s.mu));
    cfg.costs.trainer.slowdown.truncate(s.cells as usize);
    let calls = &mut cfg.costs.workload.calls;
    *calls = crate::costs::Span::new(calls.min.min(2), calls.max.min(2));
    if cfg.sched.validate().is_err() {
        cfg = full;
    }
    cfg.sched.retry = Some(RETRY);
    cfg.sched.watch_nodes = true;
    cfg.sched.checkpoint_every = checkpoint_every(seed);
    cfg.restartable = true;
    cfg.harness_local = true;
    cfg
}

/// The live cluster's settings for seed `seed` (`gyre train --cluster`):
/// no resend timer, a lost node found again only when its host says it is
/// back (`rejoin_notices`: the head sends `SchedMsg::NodeBack` once a
/// restarted agent has rebuilt its backends), as [`swarm_config`]
/// otherwise.
pub fn live_swarm_config(seed: u64) -> ClusterConfig {
    let mut cfg = swarm_config(seed);
    cfg.sched.retry = None;
    cfg.sched.rejoin_notices = true;
    cfg
}

/// The faults a live cluster's settings are built for: node crashes and
/// restarts over reliable, ordered links (its links are TCP; a lost one
/// is a lost node), no lost or failed I/O. The crashes, latency and
/// horizon are `seed`'s plan's.
pub fn live_plan(seed: u64) -> FaultPlan {
    let mut plan = FaultPlan::within(seed, HORIZON);
    plan.link.loss = 0.0;
    plan.link.duplicate = 0.0;
    plan.link.fifo = true;
    plan.io_fail = 0.0;
    plan.partitions.clear();
    plan
}

/// The checkpoint interval of swarm seed `seed`: none for one seed in
/// four, else every 1, 2 or 3 steps.
pub fn checkpoint_every(seed: u64) -> Option<u64> {
    match seed % 4 {
        0 => None,
        k => Some(k),
    }
}

/// The nodes a plan's crashes can take down: every cell's but the core's
/// (the core's too when it restores from checkpoints: `watch_nodes` and
/// `checkpoint_every`), and the pool's.
pub fn crashable(cfg: &ClusterConfig) -> Vec<NodeId> {
    let plan = gyre_actors::sched::plan::ClusterPlan::for_config(&cfg.sched);
    let s = &cfg.sched;
    let core_restores = s.watch_nodes && s.checkpoint_every.is_some();
    plan.cells
        .iter()
        .skip(usize::from(!core_restores))
        .copied()
        .chain(plan.pool)
        .collect()
}

/// The node crashes of `plan` for `cfg`: (crash at, restart at, node),
/// restarts at the latest at the [`HORIZON`].
pub fn node_crashes(cfg: &ClusterConfig, plan: &FaultPlan) -> Vec<(Nanos, Nanos, NodeId)> {
    let nodes = crashable(cfg);
    if nodes.is_empty() || !cfg.restartable {
        return Vec::new();
    }
    plan.crashes
        .iter()
        .filter(|c| c.at < HORIZON)
        .map(|c| {
            let node = nodes[(c.pick % nodes.len() as u64) as usize];
            (c.at, c.at.saturating_add(c.lasts).min(HORIZON), node)
        })
        .collect()
}

/// Runs the safety phase to [`HORIZON`], crashing and restarting nodes
/// on the way; with `notices`, each restart is announced to the
/// scheduler as the live cluster's head does (`SchedMsg::NodeBack`).
fn run_faults(
    sim: &mut gyre_runtime::sim::Sim,
    crashes: &[(Nanos, Nanos, NodeId)],
    notices: Option<gyre_runtime::Addr<Scheduler>>,
) -> Result<(), SimError> {
    let bring_back = |sim: &mut gyre_runtime::sim::Sim, node: NodeId| {
        if sim.restart_node(node) > 0
            && let Some(sched) = notices
        {
            sim.inject(sched.id(), sched, SchedMsg::NodeBack { node });
        }
    };
    // (time, restart?, node): at equal times, restarts first.
    let mut acts: Vec<(Nanos, bool, NodeId)> = Vec::new();
    for (at, until, node) in crashes {
        acts.push((*at, false, *node));
        acts.push((*until, true, *node));
    }
    acts.sort_by_key(|(t, restart, n)| (*t, !*restart, *n));
    for (t, restart, node) in acts {
        sim.run_until(t)?;
        if restart {
            bring_back(sim, node);
        } else {
            sim.crash_node(node);
        }
    }
    sim.run_until(HORIZON)?;
    // Every node is up again for the liveness phase.
    for (_, _, node) in crashes {
        bring_back(sim, *node);
    }
    Ok(())
}

/// What one swarm seed injected and how it ended.
#[derive(Debug)]
pub struct SwarmOutcome {
    pub seed: u64,
    pub plan: FaultPlan,
    pub dropped: u64,
    pub duplicated: u64,
    pub partitions: usize,
    /// Node crashes injected, and nodes the scheduler took out as lost
    /// (crashes and partitions from its node).
    pub crashes: usize,
    pub losses: usize,
    pub resent: u64,
    pub duplicate_answers: u64,
    pub steps: u64,
    pub events: u64,
    pub virtual_time: Nanos,
    /// For each partition that healed while steps remained: virtual time
    /// from its heal to the next optimizer update (recovery, including
    /// whatever of the step was still to do).
    pub heal_to_step: Vec<Nanos>,
    /// Harness calls that timed out while no engine could serve (C_R was 0
    /// for the whole call timeout: the checker's excused timeouts).
    pub unservable_timeouts: u64,
    /// `None`: every invariant held and the run finished. The error
    /// carries the seed, the settings and the `GYRE_SEED=` line.
    pub error: Option<Box<SimError>>,
}

impl SwarmOutcome {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// One table row.
    pub fn row(&self) -> String {
        format!(
            "{:>8} {:>5.1}% {:>5.1}% {:>4} {:>5} {:>5} {:>4} {:>7} {:>7} {:>6} {:>5} {:>10} {}",
            self.seed,
            self.plan.link.loss * 100.0,
            self.plan.link.duplicate * 100.0,
            if self.plan.link.fifo { "fifo" } else { "any" },
            self.partitions,
            self.crashes,
            self.losses,
            self.dropped,
            self.duplicated,
            self.resent,
            self.steps,
            fmt_nanos(self.virtual_time),
            match &self.error {
                None => "ok".to_owned(),
                Some(e) => format!("FAILED: {}", e.failure),
            }
        )
    }

    pub const HEADER: &'static str = "    seed   loss    dup link parts crash lost dropped  copies resent steps    virtual outcome";
}

impl fmt::Display for SwarmOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.row())
    }
}

/// Runs seed `seed` through both phases.
pub fn run_swarm_seed(seed: u64) -> Result<SwarmOutcome, RunError> {
    run_swarm(&swarm_config(seed), FaultPlan::within(seed, HORIZON))
}

/// Runs `cfg` under `plan` through both phases.
pub fn run_swarm(cfg: &ClusterConfig, plan: FaultPlan) -> Result<SwarmOutcome, RunError> {
    run_swarm_inspect(cfg, plan, &mut |_| {})
}

/// The longest one model call of `cfg` can take on an engine once it is
/// sent: the base cost, the largest prompt's prefill, the most output
/// tokens decoded, each at its maximum, slowed by a full engine's load,
/// and a second of messages around it. A call timeout is the serving
/// side's failure only if engines were up for at least this long within
/// it (see `Checker::with_service_bound`).
pub fn longest_call(cfg: &ClusterConfig) -> Nanos {
    let e = &cfg.costs.engine;
    let w = &cfg.costs.workload;
    let prompt = w.first_prompt.max.saturating_add(
        w.calls
            .max
            .saturating_mul(w.growth.max.saturating_add(e.output_tokens.max)),
    );
    let work = e
        .call_base
        .max
        .saturating_add(prompt.saturating_mul(e.prefill_per_token))
        .saturating_add(e.output_tokens.max.saturating_mul(e.decode_per_token));
    let load = 1.0 + e.load_slowdown.max(0.0);
    ((work as f64 * load) as Nanos).saturating_add(SECS)
}

/// [`run_swarm`], handing the cluster as it ended to `inspect` (a replay
/// printing the actors' states).
pub fn run_swarm_inspect(
    cfg: &ClusterConfig,
    plan: FaultPlan,
    inspect: &mut dyn FnMut(&crate::world::Cluster),
) -> Result<SwarmOutcome, RunError> {
    let mut cluster = build(cfg)?;
    let healthy: LinkModel = cfg.link;
    let checker = Rc::new(RefCell::new(
        Checker::new(&cluster).with_service_bound(longest_call(cfg)),
    ));
    let c = Rc::clone(&checker);
    cluster
        .sim
        .set_invariant(move |view| c.borrow_mut().check(view));
    let crashes = node_crashes(cfg, &plan);
    let mut applied = plan.clone();
    // The plan's crashes are the node crashes above, not actor crashes.
    applied.crashes.clear();
    cluster.sim.apply_faults(applied);
    let mut outcome = SwarmOutcome {
        seed: cfg.seed,
        plan: plan.clone(),
        dropped: 0,
        duplicated: 0,
        partitions: plan.partitions.len(),
        crashes: crashes.len(),
        losses: 0,
        resent: 0,
        duplicate_answers: 0,
        steps: 0,
        events: 0,
        virtual_time: 0,
        heal_to_step: Vec::new(),
        unservable_timeouts: 0,
        error: None,
    };
    // Phase 1, safety under faults.
    let notices = cfg.sched.rejoin_notices.then_some(cluster.sched);
    let first = run_faults(&mut cluster.sim, &crashes, notices);
    if let Err(e) = first {
        outcome.error = Some(Box::new(e));
    } else {
        // Phase 2: heal everything, then the run must finish.
        let nodes: Vec<NodeId> = node_ids(cfg);
        for (i, a) in nodes.iter().enumerate() {
            for b in &nodes[i + 1..] {
                cluster.sim.heal(*a, *b);
                cluster.sim.set_link(*a, *b, healthy);
            }
        }
        let failed = match cluster.sim.run() {
            Err(e) => Some(e),
            Ok(stats) if stats.limited => Some(cluster.sim.fail(format!(
                "liveness: still busy {} events after the faults healed; waiting: {}",
                stats.events,
                waiting(&cluster)
            ))),
            Ok(_) => check_end(&cluster)
                .err()
                .map(|e| cluster.sim.fail(format!("end of run: {e}"))),
        };
        outcome.error = failed.map(Box::new);
    }
    let sim = &cluster.sim;
    if let Some(t) = cluster
        .backends
        .trainers
        .first()
        .and_then(|t| sim.actor(*t))
    {
        let updates: Vec<Nanos> = t.updates().iter().map(|(_, at)| *at).collect();
        for p in &plan.partitions {
            let healed = p.at.saturating_add(p.lasts).min(HORIZON);
            if let Some(next) = updates.iter().find(|u| **u >= healed) {
                outcome.heal_to_step.push(next - healed);
            }
        }
    }
    outcome.unservable_timeouts = checker.borrow().excused_timeouts();
    let net = sim.stats();
    outcome.dropped = net.dropped_loss + net.dropped_partition;
    outcome.duplicated = net.duplicated;
    outcome.events = sim.events();
    outcome.virtual_time = sim.now();
    if let Some(s) = sim.actor(cluster.sched)
        && let Some(p) = s.peers()
    {
        let core = sim.actor(p.core);
        outcome.steps = core.map_or(0, |c| c.version());
        outcome.losses = s.log().losses.len();
        let mut boxes = Vec::new();
        boxes.extend(sim.actor(p.proxy).map(|x| x.outbox().stats()));
        boxes.extend(sim.actor(p.evaluator).map(|x| x.outbox().stats()));
        boxes.extend(core.map(|x| x.outbox().stats()));
        for cell in p.cells.iter().chain(p.pool.iter()) {
            boxes.extend(sim.actor(*cell).map(|x| x.outbox().stats()));
        }
        outcome.resent = boxes.iter().map(|b| b.resent).sum();
        outcome.duplicate_answers = boxes.iter().map(|b| b.duplicates).sum();
    }
    inspect(&cluster);
    Ok(outcome)
}

/// The requests each scheduling actor still waits on, for a liveness report.
fn waiting(cluster: &crate::world::Cluster) -> String {
    let sim = &cluster.sim;
    let Some(p) = sim.actor(cluster.sched).and_then(|s| s.peers()) else {
        return "nothing (no scheduler)".to_owned();
    };
    let mut parts = Vec::new();
    let mut note = |who: String, keys: Vec<gyre_actors::sched::retry::ReqKey>| {
        if !keys.is_empty() {
            parts.push(format!("{who} {keys:?}"));
        }
    };
    if let Some(x) = sim.actor(p.proxy) {
        note("proxy".into(), x.outbox().pending());
    }
    if let Some(x) = sim.actor(p.evaluator) {
        note("evaluator".into(), x.outbox().pending());
    }
    if let Some(x) = sim.actor(p.core) {
        note(format!("core ({:?})", x.phase()), x.outbox().pending());
    }
    for (i, cell) in p.cells.iter().chain(p.pool.iter()).enumerate() {
        if let Some(x) = sim.actor(*cell) {
            note(format!("cell {i} ({:?})", x.role()), x.outbox().pending());
        }
    }
    if parts.is_empty() {
        "no backend request".to_owned()
    } else {
        parts.join("; ")
    }
}

/// Every node the cluster of `cfg` uses.
fn node_ids(cfg: &ClusterConfig) -> Vec<NodeId> {
    let plan = gyre_actors::sched::plan::ClusterPlan::for_config(&cfg.sched);
    let mut nodes = vec![plan.sched, plan.transfer, plan.harness, plan.evaluator];
    nodes.extend(plan.cells);
    nodes.extend(plan.pool);
    nodes.sort();
    nodes.dedup();
    nodes
}

/// A swarm of `count` seeds from `base`, one table row per seed written to
/// `out` as it finishes, then a summary line; returns the failing seeds.
pub fn run_table(
    count: u64,
    base: u64,
    out: &mut dyn std::io::Write,
) -> std::io::Result<Vec<(u64, String)>> {
    writeln!(out, "{}", SwarmOutcome::HEADER)?;
    let mut failed = Vec::new();
    let (mut dropped, mut copies, mut resent, mut parts) = (0, 0, 0, 0);
    let (mut crashes, mut losses) = (0, 0);
    for seed in base..base.saturating_add(count) {
        let outcome = match run_swarm_seed(seed) {
            Ok(o) => o,
            Err(e) => {
                writeln!(out, "{seed:>8} could not run: {e}")?;
                failed.push((seed, e.to_string()));
                continue;
            }
        };
        writeln!(out, "{}", outcome.row())?;
        dropped += outcome.dropped;
        copies += outcome.duplicated;
        resent += outcome.resent;
        parts += outcome.partitions;
        crashes += outcome.crashes;
        losses += outcome.losses;
        if let Some(e) = outcome.error {
            failed.push((seed, e.to_string()));
        }
    }
    writeln!(
        out,
        "{count} seeds: {} ok, {} failed; injected {parts} partitions, {crashes} node crashes ({losses} nodes lost), {dropped} messages dropped, {copies} duplicated; {resent} requests resent",
        count as usize - failed.len(),
        failed.len()
    )?;
    Ok(failed)
}
