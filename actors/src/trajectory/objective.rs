//! The execution-level objective (SPEC 3.7): group-relative advantages,
//! per-token coefficients, and the reference loss and gradient every trainer
//! backend must reproduce.
//!
//! For execution i with targets T_i (L_i tokens, disjoint across its admitted
//! trajectories):
//!
//! ```text
//! log ρ_u = log π_θ(y_u|c_u) − log p_u^roll          (behaviour log-prob as recorded)
//! s_i     = sg[exp(mean_{u∈T_i} log ρ_u)]             (monitoring + clip decision)
//! m_i     = 0 if Â_i > 0 and s_i > 1.005; 0 if Â_i < 0 and s_i < 0.995; else 1
//! ρ̄_u     = sg(min(ρ_u, 5))
//! ℓ_u     = min(100, −m_i · ρ̄_u · Â_i · log π_θ(y_u|c_u))
//! L       = Σ_u c_u · ℓ_u,   c_u = 1 / (L_i · B · N)
//! ```
//!
//! Every target of an execution carries the same coefficient, so an
//! execution's total weight is 1/(B·N) however many trajectories it
//! contributes and whichever admitted path a shared target is assigned to;
//! L_i = 0 contributes nothing. B·N counts every original execution of the
//! batch, dummies and excluded ones included. Since ρ̄ and m are stop-gradient,
//! ∂L/∂log π_u = −c_u·m_i·ρ̄_u·Â_i where the loss cap is not active (the cap
//! is active when the uncapped term exceeds it; at equality the gradient
//! flows) and 0 where it is.

use serde::{Deserialize, Serialize};

use super::scoring::Outcome;

/// Hyper-parameters of the objective; defaults are the reference ones.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectiveConfig {
    pub token_ratio_cap: f32,
    pub token_loss_cap: f32,
    pub seq_clip_low: f32,
    pub seq_clip_high: f32,
    /// Divide advantages by the group's reward standard deviation.
    pub normalize_std: bool,
    pub std_eps: f32,
}

impl Default for ObjectiveConfig {
    fn default() -> Self {
        ObjectiveConfig {
            token_ratio_cap: 5.0,
            token_loss_cap: 100.0,
            seq_clip_low: 0.995,
            seq_clip_high: 1.005,
            normalize_std: false,
            std_eps: 1e-6,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ObjectiveError {
    #[error("group member #{index} is {state}: a group trains only when every result is final")]
    NotReady { index: usize, state: &'static str },
    #[error("{what} has {got} entries, expected {expected}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("token #{token} names execution {execution}, but the batch has {executions}")]
    BadExecution {
        token: usize,
        execution: u32,
        executions: usize,
    },
    #[error("{what} #{index} is not finite")]
    NonFinite { what: &'static str, index: usize },
}

/// Group-relative advantages: reward minus the mean over valid results
/// (dummies are valid zeros), optionally over the standard deviation.
/// Excluded members get `None` and do not enter the statistics; a pending or
/// open member makes the whole group not ready.
pub fn group_advantages(
    outcomes: &[Outcome],
    cfg: &ObjectiveConfig,
) -> Result<Vec<Option<f32>>, ObjectiveError> {
    for (index, o) in outcomes.iter().enumerate() {
        let state = match o {
            Outcome::Open => "open",
            Outcome::Pending { .. } => "pending",
            _ => continue,
        };
        return Err(ObjectiveError::NotReady { index, state });
    }
    let rewards: Vec<f64> = outcomes
        .iter()
        .filter_map(Outcome::reward)
        .map(f64::from)
        .collect();
    if rewards.is_empty() {
        return Ok(vec![None; outcomes.len()]);
    }
    let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
    let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rewards.len() as f64;
    let scale = if cfg.normalize_std {
        var.sqrt() + f64::from(cfg.std_eps)
    } else {
        1.0
    };
    Ok(outcomes
        .iter()
        .map(|o| o.reward().map(|r| ((f64::from(r) - mean) / scale) as f32))
        .collect())
}

/// What the stream packer needs per execution of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionWeight {
    /// Â_i; `None` for an excluded execution.
    pub advantage: Option<f32>,
    /// c_i = 1/(L_i·B·N) for an execution that trains, else 0.
    pub coefficient: f32,
}

/// Advantages and coefficients of a whole batch. `groups[q][k]` is the
/// outcome of execution k of group q, `targets[q][k]` its L_i. B·N counts
/// every original execution, dummies and excluded ones included; only valid
/// results train. Fails if any result is still open or pending.
pub fn batch_weights(
    groups: &[Vec<Outcome>],
    targets: &[Vec<u64>],
    cfg: &ObjectiveConfig,
) -> Result<Vec<Vec<ExecutionWeight>>, ObjectiveError> {
    if targets.len() != groups.len() {
        return Err(ObjectiveError::LengthMismatch {
            what: "targets",
            expected: groups.len(),
            got: targets.len(),
        });
    }
    let batch: u64 = groups.iter().map(|g| g.len() as u64).sum();
    groups
        .iter()
        .zip(targets)
        .map(|(g, t)| {
            if t.len() != g.len() {
                return Err(ObjectiveError::LengthMismatch {
                    what: "group targets",
                    expected: g.len(),
                    got: t.len(),
                });
            }
            let adv = group_advantages(g, cfg)?;
            Ok(g.iter()
                .zip(t)
                .zip(adv)
                .map(|((o, &l), advantage)| ExecutionWeight {
                    advantage,
                    coefficient: if o.trains() {
                        coefficient(l, batch)
                    } else {
                        0.0
                    },
                })
                .collect())
        })
        .collect()
}

/// c = 1/(L_i·B·N); 0 when the execution has no targets.
pub fn coefficient(targets: u64, batch_executions: u64) -> f32 {
    if targets == 0 || batch_executions == 0 {
        return 0.0;
    }
    (1.0 / (targets as f64 * batch_executions as f64)) as f32
}

/// s = exp(mean(log π_new − log p_roll)); 1 for no tokens.
pub fn sequence_ratio(logp_new: &[f32], logp_old: &[f32]) -> f32 {
    if logp_new.is_empty() {
        return 1.0;
    }
    let sum: f64 = logp_new
        .iter()
        .zip(logp_old)
        .map(|(n, o)| f64::from(*n) - f64::from(*o))
        .sum();
    (sum / logp_new.len() as f64).exp() as f32
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

/// A batch's target tokens, flattened; one entry per target token.
#[derive(Clone, Copy, Debug)]
pub struct TargetTokens<'a> {
    /// Execution index of each token, into the per-execution slices.
    pub execution: &'a [u32],
    /// Recorded behaviour log-probabilities.
    pub behaviour_logprobs: &'a [f32],
    /// c_u = 1/(L_i·B·N).
    pub coefficients: &'a [f32],
}

/// The stop-gradient quantities, fixed at the point the loss is taken.
#[derive(Clone, Debug, PartialEq)]
pub struct Frozen {
    /// s_i per execution.
    pub seq_ratio: Vec<f32>,
    /// m_i per execution.
    pub clip_mask: Vec<f32>,
    /// ρ̄_u per token.
    pub rho_bar: Vec<f32>,
}

/// Loss, gradient and what a run should monitor.
#[derive(Clone, Debug, PartialEq)]
pub struct LossReport {
    pub loss: f64,
    /// ∂L/∂log π_θ(y_u|c_u), per token.
    pub grad: Vec<f32>,
    pub frozen: Frozen,
    /// Tokens whose ratio hit the cap.
    pub ratio_capped: usize,
    /// Tokens whose loss hit the cap (gradient zero).
    pub loss_capped: usize,
}

fn check(
    tokens: &TargetTokens<'_>,
    advantages: &[f32],
    logp_new: &[f32],
) -> Result<(), ObjectiveError> {
    let n = tokens.execution.len();
    for (what, got) in [
        ("behaviour_logprobs", tokens.behaviour_logprobs.len()),
        ("coefficients", tokens.coefficients.len()),
        ("logp_new", logp_new.len()),
    ] {
        if got != n {
            return Err(ObjectiveError::LengthMismatch {
                what,
                expected: n,
                got,
            });
        }
    }
    if let Some((token, &execution)) = tokens
        .execution
        .iter()
        .enumerate()
        .find(|(_, e)| **e as usize >= advantages.len())
    {
        return Err(ObjectiveError::BadExecution {
            token,
            execution,
            executions: advantages.len(),
        });
    }
    for (what, xs) in [
        ("behaviour_logprobs", tokens.behaviour_logprobs),
        ("coefficients", tokens.coefficients),
        ("logp_new", logp_new),
        ("advantages", advantages),
    ] {
        if let Some(index) = xs.iter().position(|x| !x.is_finite()) {
            return Err(ObjectiveError::NonFinite { what, index });
        }
    }
    Ok(())
}

/// s_i, m_i and ρ̄_u at `logp_new`.
pub fn freeze(
    tokens: &TargetTokens<'_>,
    advantages: &[f32],
    logp_new: &[f32],
    cfg: &ObjectiveConfig,
) -> Result<Frozen, ObjectiveError> {
    check(tokens, advantages, logp_new)?;
    let e = advantages.len();
    let (mut sum, mut count) = (vec![0f64; e], vec![0u64; e]);
    for (u, &i) in tokens.execution.iter().enumerate() {
        sum[i as usize] += f64::from(logp_new[u]) - f64::from(tokens.behaviour_logprobs[u]);
        count[i as usize] += 1;
    }
    let seq_ratio: Vec<f32> = sum
        .iter()
        .zip(&count)
        .map(|(s, &c)| {
            if c == 0 {
                1.0
            } else {
                (s / c as f64).exp() as f32
            }
        })
        .collect();
    let clip_mask = advantages
        .iter()
        .zip(&seq_ratio)
        .map(|(&a, &s)| clip_mask(a, s, cfg))
        .collect();
    let rho_bar = logp_new
        .iter()
        .zip(tokens.behaviour_logprobs)
        .map(|(n, o)| (n - o).exp().min(cfg.token_ratio_cap))
        .collect();
    Ok(Frozen {
        seq_ratio,
        clip_mask,
        rho_bar,
    })
}

/// The loss with the stop-gradient quantities held at `frozen`: the function
/// whose derivative [`loss_and_grad`] returns.
pub fn surrogate_loss(
    tokens: &TargetTokens<'_>,
    advantages: &[f32],
    frozen: &Frozen,
    logp_new: &[f32],
    cfg: &ObjectiveConfig,
) -> f64 {
    tokens
        .execution
        .iter()
        .enumerate()
        .map(|(u, &i)| {
            let (m, a) = (frozen.clip_mask[i as usize], advantages[i as usize]);
            let x = -f64::from(m)
                * f64::from(frozen.rho_bar[u])
                * f64::from(a)
                * f64::from(logp_new[u]);
            f64::from(tokens.coefficients[u]) * x.min(f64::from(cfg.token_loss_cap))
        })
        .sum()
}

/// The reference loss and its gradient with respect to each target token's
/// current log-probability.
pub fn loss_and_grad(
    tokens: &TargetTokens<'_>,
    advantages: &[f32],
    logp_new: &[f32],
    cfg: &ObjectiveConfig,
) -> Result<LossReport, ObjectiveError> {
    let frozen = freeze(tokens, advantages, logp_new, cfg)?;
    let loss = surrogate_loss(tokens, advantages, &frozen, logp_new, cfg);
    let (mut ratio_capped, mut loss_capped) = (0, 0);
    let grad = tokens
        .execution
        .iter()
        .enumerate()
        .map(|(u, &i)| {
            let (m, a) = (frozen.clip_mask[i as usize], advantages[i as usize]);
            let rho = frozen.rho_bar[u];
            if rho >= cfg.token_ratio_cap {
                ratio_capped += 1;
            }
            let slope = -f64::from(m) * f64::from(rho) * f64::from(a);
            if slope * f64::from(logp_new[u]) > f64::from(cfg.token_loss_cap) {
                loss_capped += 1;
                0.0
            } else {
                (f64::from(tokens.coefficients[u]) * slope) as f32
            }
        })
        .collect();
    Ok(LossReport {
        loss,
        grad,
        frozen,
        ratio_capped,
        loss_capped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantages_use_valid_results_only() {
        let cfg = ObjectiveConfig::default();
        let outcomes = [
            Outcome::Valid {
                score: 1.0,
                partial: false,
            },
            Outcome::Dummy,
            Outcome::Excluded { attempts: 3 },
        ];
        let a = group_advantages(&outcomes, &cfg).unwrap();
        assert_eq!(a, vec![Some(0.5), Some(-0.5), None]);
        let norm = ObjectiveConfig {
            normalize_std: true,
            ..cfg
        };
        let a = group_advantages(&outcomes, &norm).unwrap();
        assert!((a[0].unwrap() - 1.0).abs() < 1e-4);
        let pending = [Outcome::Pending { attempts: 0 }];
        assert!(matches!(
            group_advantages(&pending, &cfg),
            Err(ObjectiveError::NotReady { index: 0, .. })
        ));
    }

    #[test]
    fn clip_mask_follows_the_advantage_sign() {
        let cfg = ObjectiveConfig::default();
        assert_eq!(clip_mask(1.0, 1.01, &cfg), 0.0);
        assert_eq!(clip_mask(1.0, 0.9, &cfg), 1.0);
        assert_eq!(clip_mask(-1.0, 0.99, &cfg), 0.0);
        assert_eq!(clip_mask(-1.0, 1.1, &cfg), 1.0);
        assert_eq!(clip_mask(0.0, 2.0, &cfg), 1.0);
    }

    #[test]
    fn caps_apply_and_zero_the_gradient() {
        let cfg = ObjectiveConfig::default();
        let tokens = TargetTokens {
            execution: &[0, 0],
            behaviour_logprobs: &[-20.0, -1.0],
            coefficients: &[0.5, 0.5],
        };
        // Token 0: ratio e^19 capped at 5; 5·1·20 = 100 → at the cap (flows).
        // Token 1: ratio 1; term 1. s = exp(19/2) → masked? A > 0 and s > 1.005.
        let r = loss_and_grad(&tokens, &[1.0], &[-1.0, -1.0], &cfg).unwrap();
        assert_eq!(r.frozen.clip_mask, vec![0.0]);
        assert_eq!(r.loss, 0.0);
        let r = loss_and_grad(&tokens, &[-1.0], &[-30.0, -1.0], &cfg).unwrap();
        // A < 0, s = exp(-10/2) < 0.995 → masked too.
        assert_eq!(r.frozen.clip_mask, vec![0.0]);
        // Unmasked case: equal log-probs (s = 1), large loss on token 0.
        let tokens = TargetTokens {
            execution: &[0, 0],
            behaviour_logprobs: &[-60.0, -1.0],
            coefficients: &[0.5, 0.5],
        };
        let r = loss_and_grad(&tokens, &[2.0], &[-60.0, -1.0], &cfg).unwrap();
        assert_eq!(r.loss_capped, 1);
        assert!((r.loss - (0.5 * 100.0 + 0.5 * 2.0)).abs() < 1e-9);
        assert_eq!(r.grad, vec![0.0, -1.0]);
    }

    #[test]
    fn inconsistent_inputs_are_errors() {
        let cfg = ObjectiveConfig::default();
        let tokens = TargetTokens {
            execution: &[0, 1],
            behaviour_logprobs: &[-1.0, -1.0],
            coefficients: &[1.0, 1.0],
        };
        assert!(matches!(
            loss_and_grad(&tokens, &[1.0], &[-1.0, -1.0], &cfg),
            Err(ObjectiveError::BadExecution { token: 1, .. })
        ));
        assert!(matches!(
            loss_and_grad(&tokens, &[1.0, 1.0], &[-1.0], &cfg),
            Err(ObjectiveError::LengthMismatch { .. })
        ));
        assert!(matches!(
            loss_and_grad(&tokens, &[1.0, 1.0], &[-1.0, f32::NAN], &cfg),
            Err(ObjectiveError::NonFinite { .. })
        ));
        assert_eq!(coefficient(0, 32), 0.0);
        assert_eq!(coefficient(4, 2), 0.125);
    }
}
