//! Costs of the simulated backends: fixed values and uniform ranges drawn
//! from each backend's own seeded stream.
//!
//! The defaults are not calibrated; they only need to make every protocol
//! path happen in a small run, and echo the reference system's orders of
//! magnitude (a switch costs seconds, a model call a few seconds, an
//! execution minutes). The calibrated models of a scenario
//! ([`crate::scenario`]) fill the same structures, using the fields that
//! default to "off" here: engine load, shared prefixes, per-role memory
//! costs, collective sizes and the calibrated workload.

use gyre_runtime::{MILLIS, Nanos, SECS};
use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::replay::ReplayWorkload;
use crate::workload::WorkloadModel;

/// An inclusive range to draw from uniformly (bounds swapped if reversed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub min: u64,
    pub max: u64,
}

impl Span {
    pub const fn new(min: u64, max: u64) -> Self {
        Self { min, max }
    }

    pub const fn fixed(v: u64) -> Self {
        Self { min: v, max: v }
    }

    pub fn draw(&self, rng: &mut impl rand::Rng) -> u64 {
        let (lo, hi) = (self.min.min(self.max), self.min.max(self.max));
        rng.random_range(lo..=hi)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineCosts {
    pub call_base: Span,
    /// Per prompt token not found in the KV cache.
    pub prefill_per_token: Nanos,
    pub decode_per_token: Nanos,
    pub output_tokens: Span,
    pub unload: Nanos,
    pub load: Nanos,
    /// Executions the engine is sized for; 0: its own slots, C_e for a
    /// cell's engine and C_s for the pool's.
    #[serde(default)]
    pub load_capacity: u32,
    /// Extra service time, as a share, when the calls in flight equal
    /// `load_capacity`: a call's time is scaled by 1 + s·inflight/capacity,
    /// measured when it is admitted. 0 turns the load model off.
    #[serde(default)]
    pub load_slowdown: f64,
    /// Prefix (system prompt) still cached after the harness compacts its
    /// context; the rest of a compacted prompt is computed afresh.
    #[serde(default)]
    pub shared_prefix: u64,
    /// Hold a call whose execution's blocks are being handed over until
    /// they are adopted (`inference.hold_for_kv` in a scenario file).
    #[serde(default)]
    pub hold_for_kv: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryCosts {
    pub release: Span,
    pub restore: Span,
    pub capacity: u64,
    pub rollout_bytes: u64,
    pub training_bytes: u64,
    /// Releasing training memory, if it costs other than `release` (which
    /// then prices releasing rollout memory only).
    #[serde(default)]
    pub release_training: Option<Span>,
    /// Restoring rollout memory, if it costs other than `restore`.
    #[serde(default)]
    pub restore_rollout: Option<Span>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferCosts {
    pub latency: Nanos,
    /// Nanoseconds per KiB moved.
    pub ns_per_kib: Nanos,
    pub weights_bytes: u64,
    pub publish: Span,
    /// One operation at a time, in arrival order, as the embedded transfer
    /// worker runs them (`src/embedded/transfer.rs`: one device, one job in
    /// flight); a replay of its record queues them as it did. Off (every
    /// operation at once, as RDMA reads of a real cluster) by default.
    #[serde(default)]
    pub serial: bool,
    /// What exposing a buffer costs, when it is not `latency` (a replay
    /// prices it as recorded).
    #[serde(default)]
    pub expose: Option<Nanos>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerCosts {
    pub warmup: Nanos,
    pub drain: Nanos,
    pub per_token: Nanos,
    /// Cost multiplier of each cell's trainer (missing: 1.0); a slower
    /// cell has a larger factor.
    pub slowdown: Vec<f64>,
    pub build_groups: Nanos,
    pub reduce: Nanos,
    pub update: Nanos,
    pub broadcast: Nanos,
    /// Fixed cost of each micro-step on top of its tokens.
    #[serde(default)]
    pub per_micro_step: Nanos,
    /// Gradient (and parameter) bytes a collective moves; 0: collectives
    /// cost only `reduce` per member and `broadcast`.
    #[serde(default)]
    pub collective_bytes: u64,
    /// Nanoseconds per KiB over the links between cells.
    #[serde(default)]
    pub collective_ns_per_kib: Nanos,
    /// Writing one durable checkpoint of the core (weights and optimizer
    /// state to stable storage, fsync, rename): the modelled I/O effect.
    #[serde(default)]
    pub checkpoint: Nanos,
    /// The reduce costs `reduce` once, whatever the members (a recorded
    /// run's, whose reduce summed the deposited gradients in one place);
    /// off, `reduce` per member.
    #[serde(default)]
    pub reduce_once: bool,
}

/// What the simulated harness does with each execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Model calls per execution.
    pub calls: Span,
    /// Think and tool time before each call.
    pub think: Span,
    pub first_prompt: Span,
    /// Prompt growth between calls (tool results, new instructions).
    pub growth: Span,
    /// Nothing could be run (image pull failed): a dummy.
    pub p_complete_failure: f64,
    /// The harness stopped on its own timeout: scored as partial.
    pub p_harness_timeout: f64,
    /// The harness crashed after doing some work: scored as partial.
    pub p_partial_failure: f64,
    /// The run is so slow it hits the overall timeout.
    pub p_too_long: f64,
    /// A call unanswered this long makes the harness give up: a failure
    /// caused by the serving side, which must never happen.
    pub call_timeout: Nanos,
    /// Arm a timer per call for `call_timeout` (the harness gives up at
    /// once). Off, a late answer is only counted: the same check at half
    /// the simulator's events, for long runs.
    #[serde(default = "yes")]
    pub timer_per_call: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalCosts {
    pub latency: Span,
    pub p_fail: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    pub engine: EngineCosts,
    pub memory: MemoryCosts,
    pub transfer: TransferCosts,
    pub trainer: TrainerCosts,
    pub workload: Workload,
    pub eval: EvalCosts,
    pub kv_bytes_per_token: u64,
    /// The calibrated workload; when set the harness follows it instead of
    /// `workload` (whose call-timeout settings still apply).
    #[serde(default)]
    pub model: Option<WorkloadModel>,
    /// A recorded run's workload (`gyre simulate --replay`); when set the
    /// harness, the engines and the evaluator follow it.
    #[serde(skip)]
    pub replay: Option<Arc<ReplayWorkload>>,
}

impl Default for Costs {
    fn default() -> Self {
        Self {
            engine: EngineCosts {
                call_base: Span::new(200 * MILLIS, 2 * SECS),
                prefill_per_token: 20_000,
                decode_per_token: 2 * MILLIS,
                output_tokens: Span::new(50, 800),
                unload: 500 * MILLIS,
                load: 1_500 * MILLIS,
                load_capacity: 0,
                load_slowdown: 0.0,
                shared_prefix: 0,
                hold_for_kv: false,
            },
            memory: MemoryCosts {
                release: Span::new(500 * MILLIS, 2 * SECS),
                restore: Span::new(2 * SECS, 6 * SECS),
                capacity: 100,
                rollout_bytes: 60,
                training_bytes: 80,
                release_training: None,
                restore_rollout: None,
            },
            transfer: TransferCosts {
                latency: 5 * MILLIS,
                ns_per_kib: 100,
                weights_bytes: 8 << 30,
                publish: Span::new(SECS, 3 * SECS),
                serial: false,
                expose: None,
            },
            trainer: TrainerCosts {
                warmup: 2 * SECS,
                drain: 2 * SECS,
                per_token: 500_000,
                slowdown: Vec::new(),
                build_groups: SECS,
                reduce: SECS,
                update: 2 * SECS,
                broadcast: SECS,
                per_micro_step: 0,
                collective_bytes: 0,
                collective_ns_per_kib: 0,
                // 8 GiB of weights and 16 GiB of Adam moments at ~2 GB/s.
                checkpoint: 12 * SECS,
                reduce_once: false,
            },
            workload: Workload {
                calls: Span::new(1, 4),
                think: Span::new(SECS, 60 * SECS),
                first_prompt: Span::new(1_000, 8_000),
                growth: Span::new(100, 2_000),
                p_complete_failure: 0.03,
                p_harness_timeout: 0.05,
                p_partial_failure: 0.03,
                p_too_long: 0.01,
                call_timeout: 300 * SECS,
                timer_per_call: true,
            },
            eval: EvalCosts {
                latency: Span::new(SECS, 10 * SECS),
                p_fail: 0.05,
            },
            kv_bytes_per_token: 64 << 10,
            model: None,
            replay: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn spans_draw_within_bounds_either_way_round() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for _ in 0..100 {
            let v = Span::new(10, 3).draw(&mut rng);
            assert!((3..=10).contains(&v));
        }
        assert_eq!(Span::fixed(7).draw(&mut rng), 7);
    }
}
