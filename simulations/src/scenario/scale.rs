//! A scenario shrunk for quick looks and tests: B and every capacity (C_e,
//! C_s) divided by k, the model calls by another factor, with the per-token
//! training cost and the per-call context growth raised to match, so step
//! times, execution lengths and the ratio of work to capacity stay as they
//! were while the simulator does far less work. Absolute hours move (fewer
//! groups per batch make a noisier tail), so published comparisons use the
//! full scale.

use super::spec::Scenario;
use super::{ScenarioError, validate};

impl Scenario {
    /// This scenario shrunk by `k` (1: unchanged).
    pub fn scaled(&self, k: u32) -> Result<Scenario, ScenarioError> {
        self.scaled_with(k, k)
    }

    /// B and the capacities shrunk by `k`, the model calls by `calls`.
    pub fn scaled_with(&self, k: u32, calls: u32) -> Result<Scenario, ScenarioError> {
        if k <= 1 && calls <= 1 {
            return Ok(self.clone());
        }
        let k = k.max(1);
        let calls = calls.max(1);
        let mut s = self.clone();
        let div = |v: u32| v.div_ceil(k).max(1);
        let kf = f64::from(k);
        s.cluster.batch_groups = div(s.cluster.batch_groups);
        s.cluster.cell_capacity = div(s.cluster.cell_capacity);
        if s.cluster.pool_capacity > 0 {
            s.cluster.pool_capacity = div(s.cluster.pool_capacity);
        }
        for v in &mut s.variants {
            v.cell_capacity = v.cell_capacity.map(div);
            v.pool_capacity = v.pool_capacity.map(|c| if c > 0 { div(c) } else { 0 });
        }
        // Fewer groups per step and fewer sampled tokens per execution:
        // the same training time per step.
        let cf = f64::from(calls);
        s.training.node_ms_per_token *= kf * cf;
        let w = &mut s.workload;
        w.call_cycle_s *= cf;
        w.min_calls = w.min_calls.div_ceil(calls).max(1);
        w.growth_tokens = w.growth_tokens.map(|t| t * u64::from(calls));
        w.context_limit_tokens = w
            .context_limit_tokens
            .max(w.growth_tokens[1] + w.compacted_tokens[1] + 1);
        s.name = format!("{} (scaled 1/{k}, calls 1/{calls})", s.name);
        validate(&s).map_err(|error| ScenarioError::Invalid {
            path: format!("{} scaled by {k}", self.name),
            error,
        })?;
        Ok(s)
    }
}
