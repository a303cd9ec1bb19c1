//! One lab run: build the cluster of a scenario's run, step virtual time
//! tick by tick until the target step count is trained, sample the
//! timeline, and read the result back from the actors and backends.
//!
//! The run stops as soon as the last step is done: executions still running
//! then belong to steps that will never be trained. The invariant checker of
//! SPEC 2 can ride along (`check`), at a large cost in speed.

use std::cell::RefCell;
use std::rc::Rc;

use gyre_actors::sched::Policy;
use gyre_actors::sched::cell::CellRole;
use gyre_actors::sched::ids::EngineIx;
use gyre_actors::sched::maths::staleness::expected_staleness;
use gyre_runtime::sim::SimError;
use gyre_runtime::{Nanos, SECS};
use serde::Serialize;

use crate::backends::harness::RunEnd;
use crate::checker::Checker;
use crate::run::staleness;
use crate::scenario::{RunSpec, Scenario, cluster_config};
use crate::world::{Cluster, build};

use super::breakdown::{Breakdown, GpuHours, StepPath};
use super::timeline::{CellState, Shares, Timeline, tenths};

/// How to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOptions {
    pub steps: u64,
    pub seed: u64,
    /// Timeline sampling tick.
    pub tick: Nanos,
    /// Check SPEC 2's invariants after every event (slow).
    pub check: bool,
    /// Give up past this much virtual time.
    pub horizon: Nanos,
    /// Integrate the GPU-time breakdown after every event (on by default;
    /// off leaves `gpu_hours` and the fractions at zero, for timing the
    /// simulator alone).
    pub breakdown: bool,
}

impl RunOptions {
    pub fn new(steps: u64, seed: u64) -> Self {
        Self {
            steps,
            seed,
            tick: 5 * SECS,
            check: false,
            horizon: 100_000 * 3_600 * SECS,
            breakdown: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{run}: invalid cluster: {error}")]
    Config { run: String, error: String },
    #[error("{run}: {error}")]
    Sim { run: String, error: Box<SimError> },
    #[error("{run}: stalled after {done} of {steps} steps at {hours:.2} h of virtual time")]
    Stalled {
        run: String,
        done: u64,
        steps: u64,
        hours: f64,
    },
    #[error("{run}: {message}")]
    Broken { run: String, message: String },
}

/// What one run did: the numbers of the report and `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// The policy (`elastic`, `colocate`, `async`) or the variant id.
    pub name: String,
    pub policy: String,
    pub phi: f64,
    pub mu: u32,
    pub streaming: bool,
    pub cells: u32,
    pub nodes_per_cell: u32,
    pub cell_capacity: u32,
    pub pool_nodes: u32,
    pub pool_capacity: u32,
    pub steps: u64,
    /// Virtual time when the last step's optimizer update finished.
    pub total_hours: f64,
    pub median_step_hours: f64,
    pub mean_step_hours: f64,
    /// When each step's update finished, hours from the start.
    pub step_end_hours: Vec<f64>,
    /// E[d] = φ + (μ − 1)/2, the configured target.
    pub target_staleness: f64,
    /// Group-weighted mean staleness over the steady state (the identity's
    /// quantity), measured from the trained groups.
    pub mean_staleness: f64,
    /// The same over every step, warm-up included.
    pub mean_staleness_all_steps: f64,
    pub max_staleness: u64,
    pub token_weighted_staleness: f64,
    /// First step counted as steady state.
    pub steady_from: u64,
    /// GPU-hours by role and phase, integrated from the run's events
    /// (`lab::breakdown`); the fractions below are its shares.
    pub gpu_hours: GpuHours,
    /// Each step's critical path: batch complete, update, publication.
    pub step_paths: Vec<StepPath>,
    pub gpu_rollout_fraction: f64,
    pub gpu_training_fraction: f64,
    pub gpu_switching_fraction: f64,
    pub gpu_idle_fraction: f64,
    pub executions_started: u64,
    pub executions_finished: u64,
    pub reroutes_per_execution: f64,
    pub max_reroutes_per_execution: u32,
    /// Cells moved to training, per burst.
    pub transitions_per_burst: f64,
    pub bursts: u64,
    pub model_calls: u64,
    pub kv_handovers: u64,
    /// Over-sampling: surplus executions cancelled while running and
    /// withdrawn from the queue (0 when `oversample` is off).
    pub surplus_cancelled: u64,
    pub surplus_withdrawn: u64,
    /// Realised (in-cluster) length of the executions that ended, hours.
    pub mean_execution_hours: f64,
    pub harness_timeout_share: f64,
    pub overall_timeout_share: f64,
    /// Mean tokens that entered an ended execution's context.
    pub mean_lifetime_tokens: f64,
    /// Simulator events processed.
    pub events: u64,
    /// Publication times (burst boundaries), hours.
    #[serde(skip)]
    pub publications_hours: Vec<f64>,
    /// Realised execution lengths, hours.
    #[serde(skip)]
    pub execution_hours: Vec<f64>,
    #[serde(skip)]
    pub timeline: Timeline,
}

impl RunResult {
    pub fn shares(&self) -> Shares {
        Shares {
            rollout: self.gpu_rollout_fraction,
            training: self.gpu_training_fraction,
            switching: self.gpu_switching_fraction,
            idle: self.gpu_idle_fraction,
        }
    }
}

fn hours(t: Nanos) -> f64 {
    t as f64 / (3_600.0 * SECS as f64)
}

/// The policy's name.
pub fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Elastic => "elastic",
        Policy::Colocate => "colocate",
        Policy::Async { .. } => "async",
    }
}

/// Runs `run` of `scenario`; `progress` hears the number of steps done.
pub fn run(
    scenario: &Scenario,
    run: &RunSpec,
    opts: &RunOptions,
    progress: &dyn Fn(u64),
) -> Result<RunResult, LabError> {
    let cfg = cluster_config(scenario, run, opts.steps, opts.seed);
    let name = run.name.clone();
    let mut cluster = build(&cfg).map_err(|e| LabError::Config {
        run: name.clone(),
        error: e.to_string(),
    })?;
    let breakdown = Rc::new(RefCell::new(Breakdown::new(
        run.cells,
        run.nodes_per_cell,
        run.cell_capacity,
        Some((run.pool_nodes, run.pool_capacity)),
        scenario.cluster.gpus_per_node,
        opts.steps,
    )));
    if opts.breakdown {
        cluster
            .sim
            .set_invariant(Breakdown::hook(Rc::clone(&breakdown), &cluster));
    }
    if opts.check {
        let checker = Rc::new(RefCell::new(Checker::new(&cluster)));
        cluster
            .sim
            .set_invariant(move |view| checker.borrow_mut().check(view));
    }
    let mut rows: Vec<(String, u32)> = (0..run.cells)
        .map(|c| {
            let label = if c == 0 {
                "cell 0 (core)".to_owned()
            } else {
                format!("cell {c}")
            };
            (label, run.nodes_per_cell)
        })
        .collect();
    if run.pool_capacity > 0 {
        rows.push(("pool".to_owned(), run.pool_nodes));
    }
    let mut timeline = Timeline::new(opts.tick.max(1), rows);
    let sim_err = |e: SimError| LabError::Sim {
        run: name.clone(),
        error: Box::new(e),
    };
    let mut reported = u64::MAX;
    loop {
        let until = cluster.sim.now() + timeline.tick;
        cluster.sim.run_until(until).map_err(sim_err)?;
        sample(&cluster, run, &mut timeline, until);
        let s = cluster
            .sim
            .actor(cluster.sched)
            .ok_or_else(|| broken(&name, "the scheduler is gone"))?;
        let done = s.steps_done();
        if done != reported {
            reported = done;
            progress(done);
        }
        if s.is_done() {
            break;
        }
        if cluster.sim.pending() == 0 || until > opts.horizon {
            return Err(LabError::Stalled {
                run: name,
                done,
                steps: opts.steps,
                hours: hours(until),
            });
        }
    }
    let breakdown = breakdown.borrow();
    result(&cluster, run, opts, timeline, &breakdown)
}

fn broken(run: &str, message: &str) -> LabError {
    LabError::Broken {
        run: run.to_owned(),
        message: message.to_owned(),
    }
}

fn sample(cluster: &Cluster, run: &RunSpec, timeline: &mut Timeline, at: Nanos) {
    let sim = &cluster.sim;
    let Some(s) = sim.actor(cluster.sched) else {
        return;
    };
    let Some(peers) = s.peers() else {
        return;
    };
    let ledger = s.ledger();
    for (c, addr) in peers.cells.iter().enumerate() {
        let Some(cell) = sim.actor(*addr) else {
            continue;
        };
        let (occupancy, state) = match cell.role() {
            CellRole::Rollout => {
                let u = f64::from(ledger.used_of(EngineIx::Cell(c as u32)))
                    / f64::from(run.cell_capacity.max(1));
                (u, CellState::Rollout(tenths(u)))
            }
            CellRole::Draining | CellRole::Switching | CellRole::Returning => {
                (0.0, CellState::Switching)
            }
            CellRole::Training => {
                let busy = cluster
                    .backends
                    .trainers
                    .get(c)
                    .and_then(|t| sim.actor(*t))
                    .is_some_and(|t| t.is_busy());
                (
                    0.0,
                    if busy {
                        CellState::Training
                    } else {
                        CellState::Idle
                    },
                )
            }
        };
        timeline.record(c, at, occupancy, state);
    }
    if run.pool_capacity > 0 {
        let u = f64::from(ledger.used_of(EngineIx::Pool)) / f64::from(run.pool_capacity);
        timeline.record(peers.cells.len(), at, u, CellState::Rollout(tenths(u)));
    }
}

fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn result(
    cluster: &Cluster,
    run: &RunSpec,
    opts: &RunOptions,
    timeline: Timeline,
    breakdown: &Breakdown,
) -> Result<RunResult, LabError> {
    let sim = &cluster.sim;
    let name = &run.name;
    let s = sim
        .actor(cluster.sched)
        .ok_or_else(|| broken(name, "the scheduler is gone"))?;
    let peers = s.peers().ok_or_else(|| broken(name, "never started"))?;
    let core = sim
        .actor(peers.core)
        .ok_or_else(|| broken(name, "the core is gone"))?;
    let proxy = sim
        .actor(peers.proxy)
        .ok_or_else(|| broken(name, "the proxy is gone"))?;
    let trainer0 = cluster
        .backends
        .trainers
        .first()
        .and_then(|t| sim.actor(*t))
        .ok_or_else(|| broken(name, "no core trainer"))?;
    let harness = sim
        .actor(cluster.backends.harness)
        .ok_or_else(|| broken(name, "the harness is gone"))?;
    let hs = harness.stats();
    if hs.call_timeouts > 0 || hs.stray_answers > 0 {
        return Err(broken(
            name,
            &format!(
                "a harness saw the serving side fail: {} late answers, {} stray",
                hs.call_timeouts, hs.stray_answers
            ),
        ));
    }
    let mut ends: Vec<f64> = trainer0
        .updates()
        .iter()
        .map(|(_, at)| hours(*at))
        .collect();
    ends.truncate(opts.steps as usize);
    let mut prev = 0.0;
    let step_hours: Vec<f64> = ends
        .iter()
        .map(|e| {
            let d = e - prev;
            prev = *e;
            d
        })
        .collect();
    let total = ends.last().copied().unwrap_or(0.0);
    let steady_from = (run.phi.ceil() as u64) + u64::from(run.mu);
    let st = staleness(&core.log().records, steady_from);
    let steady = if st.steady.groups > 0 {
        st.steady
    } else {
        st.all
    };
    let gpu_hours = breakdown.gpu_hours();
    let shares = shares_of(&gpu_hours);
    let publications: Vec<f64> = sim
        .actor(cluster.backends.transfer)
        .map(|t| t.published_at().iter().map(|p| hours(*p)).collect())
        .unwrap_or_default();
    let step_paths = step_paths(&ends, breakdown.batch_complete_at(), &publications);
    let c = s.counters();
    let started = c.started();
    let cells: Vec<_> = peers.cells.iter().filter_map(|a| sim.actor(*a)).collect();
    let bursts = opts.steps.div_ceil(u64::from(run.mu.max(1)));
    let moved: usize = s.log().transitions.iter().map(|t| t.cells.len()).sum();
    let records = harness.records();
    let execution_hours: Vec<f64> = records.iter().map(|r| hours(r.took)).collect();
    let ended = records.len().max(1) as f64;
    let count = |f: &dyn Fn(&RunEnd) -> bool| records.iter().filter(|r| f(&r.end)).count() as f64;
    let harness_timeouts = count(&|e| {
        matches!(
            e,
            RunEnd::Finished(gyre_actors::sched::proto::harness::HarnessOutcome::HarnessTimeout)
        )
    });
    // A run aborted by its execution is an overall timeout unless it was an
    // over-sampling surplus, cancelled.
    let overall =
        (count(&|e| matches!(e, RunEnd::Aborted)) - s.log().surplus_cancelled as f64).max(0.0);
    Ok(RunResult {
        name: name.clone(),
        policy: policy_name(run.policy).to_owned(),
        phi: run.phi,
        mu: run.mu,
        streaming: run.streaming,
        cells: run.cells,
        nodes_per_cell: run.nodes_per_cell,
        cell_capacity: run.cell_capacity,
        pool_nodes: run.pool_nodes,
        pool_capacity: run.pool_capacity,
        steps: ends.len() as u64,
        total_hours: total,
        median_step_hours: median(&step_hours),
        mean_step_hours: if step_hours.is_empty() {
            0.0
        } else {
            total / step_hours.len() as f64
        },
        step_end_hours: ends,
        target_staleness: expected_staleness(run.phi, run.mu),
        mean_staleness: steady.mean(),
        mean_staleness_all_steps: st.all.mean(),
        max_staleness: st.all.max,
        token_weighted_staleness: steady.token_mean(),
        steady_from,
        gpu_hours,
        step_paths,
        gpu_rollout_fraction: shares.rollout,
        gpu_training_fraction: shares.training,
        gpu_switching_fraction: shares.switching,
        gpu_idle_fraction: shares.idle,
        executions_started: started,
        executions_finished: c.finished(),
        reroutes_per_execution: proxy.stats().reroutes as f64 / started.max(1) as f64,
        max_reroutes_per_execution: proxy.reroutes().values().max().copied().unwrap_or(0),
        transitions_per_burst: moved as f64 / bursts.max(1) as f64,
        bursts,
        model_calls: proxy.stats().calls,
        kv_handovers: cells.iter().map(|c| c.stats().kv_handed).sum(),
        surplus_cancelled: s.log().surplus_cancelled,
        surplus_withdrawn: s.log().surplus_withdrawn,
        mean_execution_hours: execution_hours.iter().sum::<f64>() / ended,
        harness_timeout_share: harness_timeouts / ended,
        overall_timeout_share: overall / ended,
        mean_lifetime_tokens: hs.lifetime_tokens as f64 / ended,
        events: sim.events(),
        publications_hours: publications,
        execution_hours,
        timeline,
    })
}

/// The role shares of a breakdown: rollout is busy slots, training the
/// trainers' computing (warm-up and drain included), switching both
/// directions, idle everything else.
fn shares_of(g: &GpuHours) -> Shares {
    if g.total <= 0.0 {
        return Shares::default();
    }
    let training = g.warmup_drain + g.training + g.optimizer;
    let switching = g.switching_to_training + g.switching_to_rollout;
    Shares {
        rollout: g.rollout_busy / g.total,
        training: training / g.total,
        switching: switching / g.total,
        idle: (g.total - g.rollout_busy - training - switching).max(0.0) / g.total,
    }
}

/// Each step's critical path from the update times, the times its batch
/// became complete, and the publications (a publication belongs to the
/// last step whose update precedes it).
fn step_paths(ends: &[f64], complete: &[Nanos], publications: &[f64]) -> Vec<StepPath> {
    let mut prev = 0.0;
    ends.iter()
        .enumerate()
        .map(|(i, &update)| {
            let next = ends.get(i + 1).copied().unwrap_or(f64::INFINITY);
            let published = publications
                .iter()
                .copied()
                .find(|p| *p >= update && *p <= next);
            let path = StepPath {
                from: prev,
                batch_complete: complete
                    .get(i)
                    .map_or(update, |t| hours(*t))
                    .clamp(prev, update),
                update,
                published,
            };
            prev = update;
            path
        })
        .collect()
}
