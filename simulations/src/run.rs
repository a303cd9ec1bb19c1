//! Runs a cluster to quiescence under the invariant checker and reports
//! what happened, staleness included.

use std::cell::RefCell;
use std::rc::Rc;

use gyre_actors::sched::ConfigError;
use gyre_actors::sched::core::StepRecord;
use gyre_actors::sched::maths::Staleness;
use gyre_runtime::Nanos;
use gyre_runtime::sim::{SimError, SimView};
use serde::Serialize;

use crate::checker::{Checker, check_end};
use crate::world::{ClusterConfig, build};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid cluster configuration: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Sim(#[from] Box<SimError>),
}

/// Staleness of the trained groups, over all steps and over the steady
/// state (steps after the initial dispatch has been consumed).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StalenessReport {
    pub all: Staleness,
    pub steady: Staleness,
    /// First step counted as steady state.
    pub steady_from: u64,
}

/// Measures staleness v_t − v_d from the core's step records.
pub fn staleness(records: &[StepRecord], steady_from: u64) -> StalenessReport {
    let mut r = StalenessReport {
        steady_from,
        ..StalenessReport::default()
    };
    for rec in records {
        for g in &rec.groups {
            let d = rec.step.saturating_sub(g.v_d);
            r.all.add(d, g.tokens);
            if rec.step >= steady_from {
                r.steady.add(d, g.tokens);
            }
        }
    }
    r
}

/// What one checked run did.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub seed: u64,
    pub events: u64,
    pub virtual_time: Nanos,
    pub trace_hash: u64,
    pub steps: u64,
    pub dispatched: u64,
    pub transitions: usize,
    pub core_stays: usize,
    pub core_returns: usize,
    pub reroutes: u64,
    pub max_reroutes_per_exec: u32,
    pub retries: u64,
    pub kv_handovers: u64,
    pub calls: u64,
    pub staleness: StalenessReport,
    /// The largest training prefix that reduced one step.
    pub max_members: u32,
    /// Micro-steps computed by each cell.
    pub micro_steps_by_cell: Vec<u64>,
    /// Over-sampling: surplus executions cancelled while running, withdrawn
    /// from the queue, and surplus results discarded untrained.
    pub surplus_cancelled: u64,
    pub surplus_withdrawn: u64,
    pub surplus_discarded: u64,
    /// f: executions that terminated, surplus included.
    pub finished: u64,
}

/// Builds `cfg`, runs it to quiescence with every invariant checked after
/// every event, then checks liveness and exact accounting.
pub fn run_checked(cfg: &ClusterConfig) -> Result<RunReport, RunError> {
    run_checked_with(cfg, |_| Ok(()))
}

/// [`run_checked`] with one more invariant of the caller's, checked after
/// every event too.
pub fn run_checked_with(
    cfg: &ClusterConfig,
    extra: impl FnMut(&SimView<'_>) -> Result<(), String> + 'static,
) -> Result<RunReport, RunError> {
    let cfg = &ClusterConfig {
        track_calls: true,
        ..cfg.clone()
    };
    let mut cluster = build(cfg)?;
    let checker = Rc::new(RefCell::new(Checker::new(&cluster)));
    let c = Rc::clone(&checker);
    cluster
        .sim
        .set_invariant(move |view| c.borrow_mut().check(view));
    cluster.sim.set_invariant(extra);
    let stats = cluster.sim.run().map_err(Box::new)?;
    if stats.limited {
        return Err(Box::new(cluster.sim.fail(format!(
            "liveness: still busy after {} events",
            cluster.sim.events()
        )))
        .into());
    }
    if let Err(message) = check_end(&cluster) {
        return Err(Box::new(cluster.sim.fail(message)).into());
    }
    Ok(report(&cluster, cfg))
}

fn report(cluster: &crate::world::Cluster, cfg: &ClusterConfig) -> RunReport {
    let sim = &cluster.sim;
    let s = sim.actor(cluster.sched);
    let peers = s.and_then(|s| s.peers());
    let core = peers.and_then(|p| sim.actor(p.core));
    let proxy = peers.and_then(|p| sim.actor(p.proxy));
    let records = core.map(|c| c.log().records.clone()).unwrap_or_default();
    let k = &cfg.sched;
    let steady_from = (k.phi.ceil() as u64) + u64::from(k.mu);
    let cells: Vec<_> = peers
        .map(|p| p.cells.iter().filter_map(|a| sim.actor(*a)).collect())
        .unwrap_or_default();
    let bursts = s.map(|s| s.log().bursts.clone()).unwrap_or_default();
    RunReport {
        seed: cfg.seed,
        events: sim.events(),
        virtual_time: sim.now(),
        trace_hash: sim.trace_hash(),
        steps: core.map_or(0, |c| c.version()),
        dispatched: s.map_or(0, |s| s.counters().dispatched()),
        transitions: s.map_or(0, |s| s.log().transitions.len()),
        core_stays: bursts.iter().filter(|b| b.core_stays).count(),
        core_returns: bursts.iter().filter(|b| !b.core_stays).count(),
        reroutes: proxy.map_or(0, |p| p.stats().reroutes),
        max_reroutes_per_exec: proxy
            .and_then(|p| p.reroutes().values().max().copied())
            .unwrap_or(0),
        retries: proxy.map_or(0, |p| p.stats().retries),
        kv_handovers: cells.iter().map(|c| c.stats().kv_handed).sum(),
        calls: proxy.map_or(0, |p| p.stats().calls),
        staleness: staleness(&records, steady_from),
        max_members: records.iter().map(|r| r.members).max().unwrap_or(0),
        micro_steps_by_cell: cells.iter().map(|c| c.stats().micro_steps).collect(),
        surplus_cancelled: s.map_or(0, |s| s.log().surplus_cancelled),
        surplus_withdrawn: s.map_or(0, |s| s.log().surplus_withdrawn),
        surplus_discarded: peers
            .and_then(|p| sim.actor(p.buffer))
            .map_or(0, |b| b.stats().surplus_discarded),
        finished: s.map_or(0, |s| s.counters().finished()),
    }
}
