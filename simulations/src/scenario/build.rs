//! One run of a scenario as a cluster configuration: every constant of the
//! file lands in a cost model here.
//!
//! The measured switch costs (SPEC 2.5: 8.52 s rollout → training, 3.46 s
//! back) are split over the steps a switching cell waits on: unloading the
//! engine, freeing rollout memory and restoring training memory one way;
//! freeing training memory, restoring rollout memory and loading (resharding)
//! the published weights the other. Training throughput and collective
//! bandwidth scale with the nodes of a cell; rollout capacity is the cell's
//! C_e; device memory is the cell's GPUs.

use gyre_actors::sched::{DispatchMode, Policy, SampleMode, SchedConfig};
use gyre_runtime::sim::{Latency, PayloadCost};
use gyre_runtime::{MILLIS, Nanos, SECS};

use crate::costs::{Costs, Span};
use crate::world::ClusterConfig;

use super::spec::{ModelSpec, Scenario, TransferSpec};

/// Shares of the rollout → training switch: unload, free rollout memory,
/// restore training memory.
pub const TO_TRAINING_SPLIT: [f64; 3] = [0.15, 0.15, 0.70];
/// Shares of the training → rollout switch: free training memory, restore
/// rollout memory, load the weights.
pub const TO_ROLLOUT_SPLIT: [f64; 3] = [0.2, 0.3, 0.5];

/// One run: a policy (or variant) and the layout it runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// `elastic`, `colocate`, `async` or a variant id.
    pub name: String,
    pub policy: Policy,
    pub phi: f64,
    pub mu: u32,
    pub streaming: bool,
    pub cells: u32,
    pub nodes_per_cell: u32,
    pub cell_capacity: u32,
    pub pool_nodes: u32,
    pub pool_capacity: u32,
}

impl RunSpec {
    /// GPU nodes the run uses: the cells and the standalone pool.
    pub fn nodes(&self) -> u32 {
        self.cells * self.nodes_per_cell + self.pool_nodes
    }
}

fn secs(s: f64) -> Nanos {
    (s * SECS as f64).round().max(0.0) as Nanos
}

/// Nanoseconds per KiB at `gbps` GB/s.
fn ns_per_kib(gbps: f64) -> Nanos {
    (1024.0 / gbps).round().max(1.0) as Nanos
}

const GIB: f64 = (1u64 << 30) as f64;

/// Training state of the whole model, GiB.
pub fn training_gib(m: &ModelSpec) -> f64 {
    m.params_billion * 1e9 * m.training_bytes_per_param / GIB
}

/// Rollout weights plus the KV cache of `gpus` GPUs, GiB.
pub fn rollout_gib(m: &ModelSpec, gpus: f64) -> f64 {
    m.params_billion * 1e9 * m.rollout_bytes_per_param / GIB + m.kv_cache_gib_per_gpu * gpus
}

/// The cluster of run `run` of scenario `s`, `steps` steps, seeded `seed`.
pub fn cluster_config(s: &Scenario, run: &RunSpec, steps: u64, seed: u64) -> ClusterConfig {
    let w = &s.workload;
    let sched = SchedConfig {
        cells: run.cells,
        cell_capacity: run.cell_capacity,
        pool_capacity: run.pool_capacity,
        group_size: s.cluster.group_size,
        oversample: s.policies.oversample_for(run.policy),
        batch_groups: s.cluster.batch_groups,
        phi: run.phi,
        mu: run.mu,
        policy: run.policy,
        streaming: run.streaming,
        dispatch: if s.policies.dispatch == "continuous" {
            DispatchMode::Continuous
        } else {
            DispatchMode::Boundary
        },
        rho_min: s.policies.rho_min,
        tau: secs(s.policies.tau_s),
        target_steps: steps,
        micro_tokens: s.training.micro_step_tokens,
        short_micro_steps: s.training.short_micro_steps,
        overall_timeout: secs(w.overall_timeout_s()),
        eval_retry: secs(s.evaluator.retry_s),
        samples: SampleMode::Counted,
        retry: None,
        checkpoint_every: None,
        watch_nodes: false,
        rejoin_notices: false,
        reduce_needs_members: false,
        start_version: 0,
    };
    let mut cfg = ClusterConfig::new(sched, seed);
    // Scenario runs are long: the per-call ids the checker's end
    // accounting reads would grow with every call.
    cfg.track_calls = false;
    cfg.costs = costs(s, run);
    cfg.max_events = u64::MAX;
    cfg.payload = payload_cost(&s.transfer);
    cfg
}

/// The simulator's price of a payload-transfer effect, from `[transfer]`.
pub fn payload_cost(t: &TransferSpec) -> PayloadCost {
    PayloadCost {
        latency: Latency::Const((t.payload_latency_us * 1e3).round() as Nanos),
        bytes_per_sec: (t.payload_gbps * 1e9).round() as u64,
        fail: 0.0,
    }
}

fn costs(s: &Scenario, run: &RunSpec) -> Costs {
    let mut c = Costs::default();
    let m = &s.model;
    let i = &s.inference;
    let t = &s.training;
    let to_t = s.switch.to_training_s;
    let to_r = s.switch.to_rollout_s;
    let nodes = f64::from(run.nodes_per_cell);
    let gpus = nodes * f64::from(s.cluster.gpus_per_node);

    c.engine.call_base = Span::new(
        i.call_overhead_ms[0] * MILLIS,
        i.call_overhead_ms[1] * MILLIS,
    );
    c.engine.prefill_per_token = (i.prefill_us_per_token * 1e3).round() as Nanos;
    c.engine.decode_per_token = (i.decode_ms_per_token * 1e6).round() as Nanos;
    c.engine.output_tokens = Span::new(s.workload.output_tokens[0], s.workload.output_tokens[1]);
    c.engine.unload = secs(to_t * TO_TRAINING_SPLIT[0]);
    c.engine.load = secs(to_r * TO_ROLLOUT_SPLIT[2]);
    c.engine.load_capacity = 0;
    c.engine.load_slowdown = i.slowdown_at_capacity;
    c.engine.shared_prefix = i.shared_prefix_tokens;
    c.engine.hold_for_kv = i.hold_for_kv;

    // Device memory in MiB.
    let mib = |gib: f64| (gib * 1024.0).round() as u64;
    c.memory.capacity = mib(gpus * s.cluster.gpu_memory_gib);
    c.memory.rollout_bytes = mib(rollout_gib(m, gpus));
    c.memory.training_bytes = mib(training_gib(m));
    c.memory.release = Span::fixed(secs(to_t * TO_TRAINING_SPLIT[1]));
    c.memory.restore = Span::fixed(secs(to_t * TO_TRAINING_SPLIT[2]));
    c.memory.release_training = Some(Span::fixed(secs(to_r * TO_ROLLOUT_SPLIT[0])));
    c.memory.restore_rollout = Some(Span::fixed(secs(to_r * TO_ROLLOUT_SPLIT[1])));

    let weights = (m.params_billion * 1e9 * m.rollout_bytes_per_param) as u64;
    let tr = &s.transfer;
    c.transfer.latency = secs(tr.latency_ms / 1e3);
    c.transfer.ns_per_kib = ns_per_kib(tr.read_gbps);
    c.transfer.weights_bytes = weights;
    c.transfer.publish = Span::fixed(
        c.transfer
            .latency
            .saturating_add((weights as f64 / tr.publish_gbps) as Nanos),
    );

    c.trainer.per_token = (t.node_ms_per_token * 1e6 / nodes).round() as Nanos;
    c.trainer.per_micro_step = secs(t.micro_step_overhead_ms / 1e3);
    c.trainer.warmup = secs(t.warmup_s);
    c.trainer.drain = secs(t.drain_s);
    c.trainer.build_groups = secs(t.build_groups_s);
    c.trainer.reduce = secs(t.reduce_s);
    c.trainer.update = secs(t.optimizer_s);
    c.trainer.broadcast = secs(t.broadcast_s);
    // bf16 gradients and parameters.
    c.trainer.collective_bytes = (m.params_billion * 1e9 * 2.0) as u64;
    c.trainer.collective_ns_per_kib = ns_per_kib(t.interconnect_gbps_per_node * nodes);

    let e = &s.evaluator;
    c.eval.latency = Span::new(secs(e.latency_min[0] * 60.0), secs(e.latency_min[1] * 60.0));
    c.eval.p_fail = e.failure_share;

    c.kv_bytes_per_token = (m.kv_kib_per_token * 1024.0) as u64;
    // A model call unanswered for half an hour would be a serving failure;
    // counted on each answer rather than timed, to halve the events.
    c.workload.call_timeout = 1_800 * SECS;
    c.workload.timer_per_call = false;
    c.model = Some(s.workload.clone());
    c
}
