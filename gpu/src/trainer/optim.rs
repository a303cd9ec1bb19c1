//! The core's optimizer step: normalise the reduced gradient, clip its
//! global norm, one Adam(W) update over the flat buffer.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// How the reduced sum becomes the batch gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GradScale {
    /// The per-token coefficients already divide by B·N: the sum over the
    /// participating cells is the batch gradient (the objective contract).
    Sum,
    /// Divide by the number of participating cells (data-parallel mean of
    /// per-cell mean losses).
    PerCell,
    /// Divide by the batch's micro-steps (mean of per-micro-step losses).
    PerMicroStep,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimConfig {
    /// Constant learning rate; SPEC 3.7's reference is 1e-6.
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled (AdamW) weight decay; 0 is plain Adam.
    pub weight_decay: f64,
    /// Clip the global gradient norm to this; `None` disables clipping.
    pub max_grad_norm: Option<f64>,
    pub scale: GradScale,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: 1e-6,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: Some(1.0),
            scale: GradScale::Sum,
        }
    }
}

/// What one update did.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateReport {
    /// Policy version after the update.
    pub version: u64,
    /// Norm of the normalised gradient, before clipping.
    pub grad_norm: f64,
    pub clipped: bool,
    /// Batch loss (normalised like the gradient).
    pub loss: f64,
    pub micro_steps: u64,
    pub targets: u64,
}

/// Normalises and clips `grad` in place; returns (norm before clipping,
/// clipped).
pub fn normalise_and_clip(grad: &mut [f32], divide: f64, max_norm: Option<f64>) -> (f64, bool) {
    let inv = if divide > 0.0 { 1.0 / divide } else { 1.0 };
    let mut sq = 0.0f64;
    for g in grad.iter_mut() {
        *g = (f64::from(*g) * inv) as f32;
        sq += f64::from(*g) * f64::from(*g);
    }
    let norm = sq.sqrt();
    match max_norm {
        Some(m) if norm > m && norm > 0.0 => {
            let s = (m / norm) as f32;
            for g in grad.iter_mut() {
                *g *= s;
            }
            (norm, true)
        }
        _ => (norm, false),
    }
}

/// One AdamW step, `t` counting from 1. `moments` is m then v, each the
/// length of `params`.
pub fn adamw_step(
    params: &mut [f32],
    grad: &[f32],
    moments: &mut [f32],
    t: u64,
    cfg: &OptimConfig,
) {
    let n = params.len();
    let (m, v) = moments.split_at_mut(n);
    let c = Step {
        cfg: *cfg,
        bc1: 1.0 - cfg.beta1.powf(t as f64),
        bc2: 1.0 - cfg.beta2.powf(t as f64),
    };
    // Each element's update is the same arithmetic on any thread and in
    // either build of the loop, so the result does not depend on either.
    params
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m), v)| step_chunk(p, g, m, v, &c));
}

/// Elements per task of the update on rayon's pool.
const CHUNK: usize = 1 << 14;

/// The constants of one step.
struct Step {
    cfg: OptimConfig,
    bc1: f64,
    bc2: f64,
}

#[inline(always)]
fn step_loops(params: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], c: &Step) {
    let cfg = &c.cfg;
    for (((p, &g), m), v) in params.iter_mut().zip(grad).zip(m).zip(v) {
        let g = f64::from(g);
        let mi = cfg.beta1 * f64::from(*m) + (1.0 - cfg.beta1) * g;
        let vi = cfg.beta2 * f64::from(*v) + (1.0 - cfg.beta2) * g * g;
        *m = mi as f32;
        *v = vi as f32;
        let mhat = mi / c.bc1;
        let vhat = vi / c.bc2;
        let x = f64::from(*p);
        let upd = mhat / (vhat.sqrt() + cfg.eps) + cfg.weight_decay * x;
        *p = (x - cfg.lr * upd) as f32;
    }
}

/// The loop compiled for AVX2 where the CPU has it (the crate builds for
/// baseline x86-64): four f64 square roots and divisions at a time, the
/// same correctly rounded results.
fn step_chunk(params: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], c: &Step) {
    crate::cpu::simd_dispatch!(
        step_loops,
        step_avx2,
        (params: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], c: &Step)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool's chunks and the AVX2 build give the baseline loop's bits.
    #[test]
    fn the_update_is_the_baseline_loop_bit_for_bit() {
        let cfg = OptimConfig {
            lr: 1e-3,
            weight_decay: 0.01,
            ..Default::default()
        };
        let n = 3 * CHUNK + 17;
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        let grad: Vec<f32> = (0..n).map(|i| f(i, 0.37) * 1e-3).collect();
        let params: Vec<f32> = (0..n).map(|i| f(i, 0.11)).collect();
        let moments: Vec<f32> = (0..2 * n).map(|i| f(i, 0.07).abs() * 1e-4).collect();
        let (mut p1, mut m1) = (params.clone(), moments.clone());
        adamw_step(&mut p1, &grad, &mut m1, 3, &cfg);
        let (mut p2, mut m2) = (params, moments);
        let c = Step {
            cfg,
            bc1: 1.0 - cfg.beta1.powf(3.0),
            bc2: 1.0 - cfg.beta2.powf(3.0),
        };
        let (a, b) = m2.split_at_mut(n);
        step_loops(&mut p2, &grad, a, b, &c);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&p1), bits(&p2));
        assert_eq!(bits(&m1), bits(&m2));
    }

    #[test]
    fn first_adam_step_moves_each_weight_by_lr() {
        let cfg = OptimConfig {
            lr: 0.1,
            ..Default::default()
        };
        let mut p = vec![1.0f32, 1.0, 1.0];
        let mut mom = vec![0.0f32; 6];
        adamw_step(&mut p, &[2.0, -0.5, 0.0], &mut mom, 1, &cfg);
        assert!((p[0] - 0.9).abs() < 1e-6);
        assert!((p[1] - 1.1).abs() < 1e-6);
        assert_eq!(p[2], 1.0);
        let decay = OptimConfig {
            weight_decay: 0.5,
            ..cfg
        };
        let mut p = vec![2.0f32];
        adamw_step(&mut p, &[0.0], &mut [0.0, 0.0], 1, &decay);
        assert!((p[0] - 1.9).abs() < 1e-6);
    }

    #[test]
    fn clipping_bounds_the_norm() {
        let mut g = vec![6.0f32, 8.0];
        let (n, c) = normalise_and_clip(&mut g, 2.0, Some(1.0));
        assert!((n - 5.0).abs() < 1e-9 && c);
        assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
        let mut g = vec![0.3f32, 0.4];
        assert!(!normalise_and_clip(&mut g, 1.0, Some(1.0)).1);
    }
}
