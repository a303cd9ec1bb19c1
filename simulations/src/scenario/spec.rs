//! The schema of a scenario file: every section and field a user can edit.
//!
//! Units are in the field names (`_s`, `_ms`, `_us`, `_hours`, `_gib`,
//! `_gbps` for GB/s, `_tokens`). Unknown keys and missing fields are
//! rejected by the parser; [`super::validate`] rejects values that cannot
//! run, naming the field.

use gyre_actors::sched::Policy;
use serde::{Deserialize, Serialize};

use crate::workload::WorkloadModel;
use crate::workload::profile::Targets;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// Training steps of a run (`--steps` overrides).
    pub steps: u64,
    /// Default target staleness E[d] (`--staleness` overrides).
    pub staleness: f64,
    pub cluster: ClusterSpec,
    pub model: ModelSpec,
    pub inference: InferenceSpec,
    pub training: TrainingSpec,
    pub switch: SwitchSpec,
    pub transfer: TransferSpec,
    pub evaluator: EvaluatorSpec,
    pub workload: WorkloadModel,
    pub policies: PolicySpec,
    /// The equal-staleness (φ, μ) of each policy, one entry per target.
    #[serde(default)]
    pub pairs: Vec<PairSpec>,
    /// Scheduling variants (the ablation); when present they are the runs.
    #[serde(default)]
    pub variants: Vec<Variant>,
    /// Published workload statistics the model is calibrated to.
    #[serde(default)]
    pub targets: Targets,
    /// Published results, printed beside ours.
    #[serde(default)]
    pub published: Vec<Published>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// K: elastic cells; cell 0 is the core.
    pub cells: u32,
    pub nodes_per_cell: u32,
    /// C_e: concurrent executions one cell's engine serves.
    pub cell_capacity: u32,
    /// Nodes of the standalone pool (GPU-time accounting).
    pub pool_nodes: u32,
    /// C_s: concurrent executions of the standalone pool.
    pub pool_capacity: u32,
    /// N: executions per group.
    pub group_size: u32,
    /// B: groups per batch.
    pub batch_groups: u32,
    pub gpus_per_node: u32,
    pub gpu_memory_gib: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub params_billion: f64,
    /// Training state per parameter (weights, gradients, optimizer).
    pub training_bytes_per_param: f64,
    /// Inference weights per parameter.
    pub rollout_bytes_per_param: f64,
    /// KV cache per token of context.
    pub kv_kib_per_token: f64,
    /// KV cache an engine reserves, per GPU.
    pub kv_cache_gib_per_gpu: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferenceSpec {
    /// Fixed cost of a call (scheduling, first token) `[min, max]`.
    pub call_overhead_ms: [u64; 2],
    /// Prefill per prompt token not in the cache.
    pub prefill_us_per_token: f64,
    /// Decode per output token of one sequence on an idle engine.
    pub decode_ms_per_token: f64,
    /// Extra per-call time, as a share, with C_e calls in flight.
    pub slowdown_at_capacity: f64,
    /// Prefix still cached after a compaction (the system prompt).
    pub shared_prefix_tokens: u64,
    /// A call retried on its destination during a switch waits there for
    /// its execution's migrated KV blocks (at most `KV_WAIT`) instead of
    /// prefilling its prefix: SPEC 2.5 step 4, and what the embedded
    /// engine does. Off by default, the setting the shipped figures were
    /// measured with; on, six seeds of deepswe-122b and terminalbench-122b
    /// gave the same speed-ups within their spread (README, session 17).
    #[serde(default)]
    pub hold_for_kv: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingSpec {
    /// Forward and backward per trainable token on one node; a cell of n
    /// nodes is n times faster.
    pub node_ms_per_token: f64,
    /// Token capacity of one micro-step.
    pub micro_step_tokens: u64,
    pub micro_step_overhead_ms: f64,
    /// The packer takes another group when fewer micro-steps wait.
    pub short_micro_steps: u32,
    /// Per cell and batch: fill and drain the pipeline.
    pub warmup_s: f64,
    pub drain_s: f64,
    /// Gathering gradients: fixed part per member.
    pub reduce_s: f64,
    /// Clip and one optimizer update on the core.
    pub optimizer_s: f64,
    /// Fixed part of a parameter broadcast to satellites.
    pub broadcast_s: f64,
    /// Building the K − 1 prefix communication groups, once.
    pub build_groups_s: f64,
    /// Bandwidth between cells, per node of a cell.
    pub interconnect_gbps_per_node: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSpec {
    /// Rollout → training: unload, free rollout memory, restore training.
    pub to_training_s: f64,
    /// Training → rollout: free training memory, restore rollout, reload.
    pub to_rollout_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferSpec {
    /// One-sided read latency.
    pub latency_ms: f64,
    /// Read bandwidth into one cell (KV blocks, weight snapshots).
    pub read_gbps: f64,
    /// Bandwidth of a weight publication to every rollout engine.
    pub publish_gbps: f64,
    /// What one payload-transfer effect (`PayloadRead`/`Write`/`Release`)
    /// costs in the simulator: a latency in µs plus its bytes over GB/s
    /// (`SimConfig::payload`). 0 and 0 (the default) make them instant.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub payload_latency_us: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub payload_gbps: f64,
}

impl TransferSpec {
    /// Sets the payload-transfer cost from `LATENCY_US,GBPS` (e.g. `50,10`).
    pub fn set_payload_cost(&mut self, text: &str) -> Result<(), String> {
        let bad = || format!("payload cost {text:?}: expected LATENCY_US,GBPS (two numbers ≥ 0)");
        let (lat, gbps) = text.split_once(',').ok_or_else(bad)?;
        let num = |t: &str| {
            t.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(bad)
        };
        self.payload_latency_us = num(lat)?;
        self.payload_gbps = num(gbps)?;
        Ok(())
    }
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluatorSpec {
    /// `[min, max]` minutes to evaluate one preserved workspace.
    pub latency_min: [f64; 2],
    pub failure_share: f64,
    pub retry_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Async's fixed split: cells 0..train_cells train for the whole run.
    pub async_train_cells: u32,
    pub rho_min: f64,
    pub tau_s: f64,
    pub streaming: bool,
    /// "boundary" (SPEC 2.2) or "continuous".
    pub dispatch: String,
    /// Over-sampling of Gyre's own policy (elastic, and the ablation's E
    /// variants), M: extra executions dispatched per group; the first N
    /// valid ones form the group and the surplus are cancelled (SPEC 2.2's
    /// f counts them, so the reference system over-samples). 0, the
    /// default, is off.
    #[serde(default)]
    pub oversample: u32,
    /// Over-sampling of the baselines (Colocate, Async and their variants).
    /// 0 by default: SPEC 5 defines them by (φ, μ) and boundary dispatch
    /// alone, and only without it do they reproduce their published ratio
    /// to each other (README, "Over-sampling").
    #[serde(default)]
    pub baseline_oversample: u32,
}

impl PolicySpec {
    /// M for a run of `policy`: Gyre's own or the baselines'.
    pub fn oversample_for(&self, policy: Policy) -> u32 {
        match policy {
            Policy::Elastic => self.oversample,
            Policy::Colocate | Policy::Async { .. } => self.baseline_oversample,
        }
    }
}

/// (φ, μ).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhiMu {
    pub phi: f64,
    pub mu: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairSpec {
    /// Target E[d].
    pub staleness: f64,
    pub elastic: PhiMu,
    pub colocate: PhiMu,
    #[serde(rename = "async")]
    pub fixed: PhiMu,
}

/// One scheduling variant: a policy and the layout it runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub id: String,
    pub description: String,
    /// "elastic", "colocate" or "async".
    pub policy: String,
    pub phi: f64,
    pub mu: u32,
    pub streaming: bool,
    /// Async only: cells that train for the whole run.
    #[serde(default)]
    pub train_cells: Option<u32>,
    #[serde(default)]
    pub cells: Option<u32>,
    #[serde(default)]
    pub nodes_per_cell: Option<u32>,
    #[serde(default)]
    pub cell_capacity: Option<u32>,
    #[serde(default)]
    pub pool_nodes: Option<u32>,
    #[serde(default)]
    pub pool_capacity: Option<u32>,
}

/// A published result of this workload (SPEC 5), for comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
    /// Target E[d] it was measured at.
    pub staleness: f64,
    /// Speed-up of the elastic policy over Async `[low, high]`.
    pub vs_async: [f64; 2],
    pub vs_colocate: [f64; 2],
    /// Total hours, when published.
    #[serde(default)]
    pub hours: Option<PublishedHours>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedHours {
    pub elastic: f64,
    pub colocate: f64,
    #[serde(rename = "async")]
    pub fixed: f64,
}
