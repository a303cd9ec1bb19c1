//! The execution-level objective (SPEC 3.7) on a micro-step's targets,
//! exactly as the trajectory plane's reference defines it:
//!
//! ```text
//! s_i = exp(mean_{u∈T_i}(log π_θ(y_u|c_u) − log p_u^roll))    stop-gradient
//! m_i = 0 if Â_i > 0 and s_i > 1.005; 0 if Â_i < 0 and s_i < 0.995; else 1
//! ρ̄_u = min(exp(log π − log p^roll), 5)                      stop-gradient
//! ℓ_u = min(100, −m_i·ρ̄_u·Â_i·log π_θ(y_u|c_u)),   L = Σ_u c_u·ℓ_u
//! ```
//!
//! s_i needs every target of execution i, which may lie in other
//! micro-steps or other cells. Weights are fixed during accumulation, so
//! the sums behind s_i are additive: [`SeqStats`] from a forward-only pass
//! over each micro-step, summed across micro-steps and cells, give the
//! exact s_i. Without them a micro-step uses its own targets, which is
//! exact when each execution's targets are all in it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::TrainerError;
use super::data::Target;

/// Hyper-parameters; defaults are the reference ones.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectiveConfig {
    pub token_ratio_cap: f32,
    pub token_loss_cap: f32,
    pub seq_clip_low: f32,
    pub seq_clip_high: f32,
}

impl Default for ObjectiveConfig {
    fn default() -> Self {
        ObjectiveConfig {
            token_ratio_cap: 5.0,
            token_loss_cap: 100.0,
            seq_clip_low: 0.995,
            seq_clip_high: 1.005,
        }
    }
}

/// Which loss a micro-step trains.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Loss {
    /// The execution-level policy objective.
    Policy(ObjectiveConfig),
    /// Cross-entropy weighted by the coefficients: Σ −c_u·log π(y_u).
    Supervised,
}

/// One execution's share of the sequence-ratio sums.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecStat {
    /// Σ (log π − log p^roll) over its targets seen so far.
    pub sum: f64,
    pub count: u64,
    pub advantage: f32,
}

/// Additive per-execution sums behind s_i.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SeqStats {
    pub executions: BTreeMap<u32, ExecStat>,
}

impl SeqStats {
    pub fn from_targets(targets: &[Target], logp: &[f32]) -> Result<Self, TrainerError> {
        let mut s = SeqStats::default();
        for (t, &lp) in targets.iter().zip(logp) {
            s.add(
                t.execution,
                t.advantage,
                f64::from(lp) - f64::from(t.behaviour_logprob),
                1,
            )?;
        }
        Ok(s)
    }

    fn add(&mut self, exec: u32, advantage: f32, sum: f64, count: u64) -> Result<(), TrainerError> {
        let e = self.executions.entry(exec).or_insert(ExecStat {
            sum: 0.0,
            count: 0,
            advantage,
        });
        if e.advantage != advantage {
            return Err(TrainerError::BadInput(format!(
                "execution {exec} has two advantages ({} and {advantage})",
                e.advantage
            )));
        }
        e.sum += sum;
        e.count += count;
        Ok(())
    }

    /// Adds another micro-step's or cell's sums.
    pub fn merge(&mut self, other: &SeqStats) -> Result<(), TrainerError> {
        for (&exec, st) in &other.executions {
            self.add(exec, st.advantage, st.sum, st.count)?;
        }
        Ok(())
    }

    /// s_i; 1 for an execution without targets.
    pub fn seq_ratio(&self, exec: u32) -> Option<f32> {
        self.executions.get(&exec).map(|e| {
            if e.count == 0 {
                1.0
            } else {
                (e.sum / e.count as f64).exp() as f32
            }
        })
    }
}

/// The shared clip mask m_i.
pub fn clip_mask(advantage: f32, seq_ratio: f32, cfg: &ObjectiveConfig) -> f32 {
    if (advantage > 0.0 && seq_ratio > cfg.seq_clip_high)
        || (advantage < 0.0 && seq_ratio < cfg.seq_clip_low)
    {
        0.0
    } else {
        1.0
    }
}

/// Per-target weights ∂L/∂log π and the loss value, with what a run
/// monitors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenWeights {
    pub grad: Vec<f32>,
    pub loss: f64,
    pub ratio_capped: usize,
    pub loss_capped: usize,
    /// Executions whose clip mask is 0.
    pub clipped_executions: usize,
}

/// Weights of the policy objective at `logp` (current log-probs of the
/// targets); `stats` are the batch-wide sums (or this micro-step's).
pub fn policy_weights(
    targets: &[Target],
    logp: &[f32],
    stats: &SeqStats,
    cfg: &ObjectiveConfig,
) -> Result<TokenWeights, TrainerError> {
    let mut masks = BTreeMap::new();
    for t in targets {
        if masks.contains_key(&t.execution) {
            continue;
        }
        let st = stats.executions.get(&t.execution).ok_or_else(|| {
            TrainerError::BadInput(format!(
                "no sequence statistics for execution {}",
                t.execution
            ))
        })?;
        if st.advantage != t.advantage {
            return Err(TrainerError::BadInput(format!(
                "execution {}: advantage {} differs from its statistics' {}",
                t.execution, t.advantage, st.advantage
            )));
        }
        let s = stats.seq_ratio(t.execution).unwrap_or(1.0);
        masks.insert(t.execution, clip_mask(t.advantage, s, cfg));
    }
    let mut out = TokenWeights {
        clipped_executions: masks.values().filter(|&&m| m == 0.0).count(),
        ..Default::default()
    };
    for (t, &lp) in targets.iter().zip(logp) {
        let m = masks.get(&t.execution).copied().unwrap_or(1.0);
        let rho = (lp - t.behaviour_logprob).exp().min(cfg.token_ratio_cap);
        if rho >= cfg.token_ratio_cap {
            out.ratio_capped += 1;
        }
        let slope = -f64::from(m) * f64::from(rho) * f64::from(t.advantage);
        let x = slope * f64::from(lp);
        let c = f64::from(t.coefficient);
        if x > f64::from(cfg.token_loss_cap) {
            out.loss_capped += 1;
            out.grad.push(0.0);
            out.loss += c * f64::from(cfg.token_loss_cap);
        } else {
            out.grad.push((c * slope) as f32);
            out.loss += c * x;
        }
    }
    Ok(out)
}

/// Weights of the supervised loss.
pub fn supervised_weights(targets: &[Target], logp: &[f32]) -> TokenWeights {
    let mut out = TokenWeights::default();
    for (t, &lp) in targets.iter().zip(logp) {
        out.grad.push(-t.coefficient);
        out.loss -= f64::from(t.coefficient) * f64::from(lp);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(exec: u32, b: f32, c: f32, a: f32) -> Target {
        Target {
            chunk: 0,
            position: 1,
            token: 0,
            execution: exec,
            behaviour_logprob: b,
            coefficient: c,
            advantage: a,
        }
    }

    #[test]
    fn caps_and_masks_follow_the_contract() {
        let cfg = ObjectiveConfig::default();
        // Equal log-probs (s = 1), large loss on token 0 → capped, zero grad.
        let ts = [target(0, -60.0, 0.5, 2.0), target(0, -1.0, 0.5, 2.0)];
        let lp = [-60.0, -1.0];
        let st = SeqStats::from_targets(&ts, &lp).unwrap();
        let w = policy_weights(&ts, &lp, &st, &cfg).unwrap();
        assert_eq!(w.loss_capped, 1);
        assert!((w.loss - (0.5 * 100.0 + 0.5 * 2.0)).abs() < 1e-9);
        assert_eq!(w.grad, vec![0.0, -1.0]);
        // Positive advantage and s > 1.005: masked.
        let lp = [-59.0, -0.5];
        let st = SeqStats::from_targets(&ts, &lp).unwrap();
        let w = policy_weights(&ts, &lp, &st, &cfg).unwrap();
        assert_eq!(w.clipped_executions, 1);
        assert_eq!(w.loss, 0.0);
    }

    #[test]
    fn stats_merge_and_reject_conflicts() {
        let a = SeqStats::from_targets(&[target(1, -1.0, 1.0, 0.5)], &[-0.9]).unwrap();
        let mut b = SeqStats::from_targets(&[target(1, -1.0, 1.0, 0.5)], &[-1.1]).unwrap();
        b.merge(&a).unwrap();
        assert!((b.seq_ratio(1).unwrap() - 1.0).abs() < 1e-6);
        let c = SeqStats::from_targets(&[target(1, -1.0, 1.0, -0.5)], &[-1.0]).unwrap();
        assert!(b.merge(&c).is_err());
        let w = policy_weights(
            &[target(2, -1.0, 1.0, 1.0)],
            &[-1.0],
            &b,
            &ObjectiveConfig::default(),
        );
        assert!(w.is_err());
    }
}
