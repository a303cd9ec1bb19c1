//! Fused CPU kernels with their backward passes, for the training step.
//!
//! Composed of candle's per-op kernels, a softmax is five passes over its
//! input with four temporaries, and its backward as many again; on the
//! small models Gyre trains on CPU those passes, their allocations and
//! their memsets cost more than the matrix products around them. Each op
//! here is one pass forward and one backward, and is exact: the same
//! arithmetic as the composed version, in the same order per row.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::error::ModelError;

/// softmax over the last dimension, with a one-pass backward. A row that
/// is all −∞ (no key visible) gives zeros rather than NaN.
pub fn softmax_last(x: &Tensor) -> Result<Tensor, ModelError> {
    Ok(x.contiguous()?.apply_op1(SoftmaxLast)?)
}

fn f32_rows<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    op: &str,
) -> candle_core::Result<(&'a [f32], usize)> {
    let CpuStorage::F32(v) = s else {
        candle_core::bail!("{op}: only f32 is supported");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{op}: the input must be contiguous");
    };
    let dim = l.dims().last().copied().unwrap_or(1).max(1);
    Ok((&v[a..b], dim))
}

struct SoftmaxLast;

impl CustomOp1 for SoftmaxLast {
    fn name(&self) -> &'static str {
        "gyre-softmax-last"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, dim) = f32_rows(s, l, self.name())?;
        let mut y = vec![0f32; x.len()];
        for (x, y) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
            softmax_row(x, y);
        }
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&dy.contiguous()?, &SoftmaxGrad)?))
    }
}

/// Elementwise maps of at least this many elements run on rayon's pool
/// (the matrix products' threads, so no second pool competes with them);
/// smaller ones, a decode step's, stay on the calling thread. Each element
/// is computed the same way on any thread.
pub(super) const PARALLEL_FROM: usize = 1 << 15;

fn map1(x: &[f32], f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    if x.len() < PARALLEL_FROM {
        x.iter().map(|&x| f(x)).collect()
    } else {
        x.par_iter().map(|&x| f(x)).collect()
    }
}

fn map2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    if a.len() < PARALLEL_FROM {
        a.iter().zip(b).map(|(&a, &b)| f(a, b)).collect()
    } else {
        a.par_iter().zip(b).map(|(&a, &b)| f(a, b)).collect()
    }
}

fn map3(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32 + Sync) -> Vec<f32> {
    if a.len() < PARALLEL_FROM {
        a.iter()
            .zip(b)
            .zip(c)
            .map(|((&a, &b), &c)| f(a, b, c))
            .collect()
    } else {
        a.par_iter()
            .zip(b)
            .zip(c)
            .map(|((&a, &b), &c)| f(a, b, c))
            .collect()
    }
}

/// One row of [`softmax_last`] into `y` (left as it is, zeros, for a row
/// that is all −∞).
pub(super) fn softmax_row(x: &[f32], y: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    exp_shifted(x, max, y);
    let sum: f32 = y.iter().sum();
    let inv = 1.0 / sum;
    for y in y.iter_mut() {
        *y *= inv;
    }
}

/// y = e^(x − max), compiled for AVX2 where the CPU has it (the crate
/// builds for baseline x86-64; both give the same bits, as neither
/// contracts a multiply and an add).
fn exp_shifted(x: &[f32], max: f32, y: &mut [f32]) {
    #[inline(always)]
    fn loops(x: &[f32], max: f32, y: &mut [f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = exp(x - max);
        }
    }
    crate::cpu::simd_dispatch!(loops, avx2, (x: &[f32], max: f32, y: &mut [f32]));
}

/// One row of the softmax's backward: dx = y ∘ (dy − Σ y∘dy).
pub(super) fn softmax_grad_row(y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let dot: f32 = y.iter().zip(dy).map(|(a, b)| a * b).sum();
    for ((dx, &y), &dy) in dx.iter_mut().zip(y).zip(dy) {
        *dx = y * (dy - dot);
    }
}

/// dx = y ∘ (dy − Σ y∘dy) per row.
struct SoftmaxGrad;

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "gyre-softmax-last-grad"
    }

    fn cpu_fwd(
        &self,
        ys: &CpuStorage,
        yl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (y, dim) = f32_rows(ys, yl, self.name())?;
        let (dy, _) = f32_rows(gs, gl, self.name())?;
        if y.len() != dy.len() {
            candle_core::bail!("{}: shapes differ", self.name());
        }
        let mut dx = vec![0f32; y.len()];
        for ((y, dy), dx) in y
            .chunks_exact(dim)
            .zip(dy.chunks_exact(dim))
            .zip(dx.chunks_exact_mut(dim))
        {
            softmax_grad_row(y, dy, dx);
        }
        Ok((CpuStorage::F32(dx), yl.shape().clone()))
    }
}

/// x · rsqrt(mean(x²) + ε) · g over the last dimension, with a one-pass
/// backward for x and for g.
pub fn rms_norm(x: &Tensor, g: &Tensor, eps: f64) -> Result<Tensor, ModelError> {
    Ok(x.contiguous()?
        .apply_op2(&g.contiguous()?, RmsNorm { eps })?)
}

/// 1 / sqrt(mean(x²) + ε) of one row.
pub(super) fn inv_rms(x: &[f32], eps: f64) -> f32 {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    1.0 / (ms + eps as f32).sqrt()
}

fn gain<'a>(
    gs: &'a CpuStorage,
    gl: &Layout,
    dim: usize,
    op: &str,
) -> candle_core::Result<&'a [f32]> {
    let (g, _) = f32_rows(gs, gl, op)?;
    if g.len() != dim {
        candle_core::bail!("{op}: gain of {} for rows of {dim}", g.len());
    }
    Ok(g)
}

struct RmsNorm {
    eps: f64,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "gyre-rms-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, dim) = f32_rows(xs, xl, self.name())?;
        let g = gain(gs, gl, dim, self.name())?;
        let mut y = vec![0f32; x.len()];
        for (x, y) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
            let r = inv_rms(x, self.eps);
            for ((y, &x), &g) in y.iter_mut().zip(x).zip(g) {
                *y = x * r * g;
            }
        }
        Ok((CpuStorage::F32(y), xl.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        g: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        let dx = x.apply_op3_no_bwd(g, &dy, &RmsNormGradX { eps: self.eps })?;
        let dg = x.apply_op2_no_bwd(&dy, &RmsNormGradG { eps: self.eps })?;
        Ok((Some(dx), Some(dg)))
    }
}

/// dx = r · (dy∘g − x · r² / D · Σ dy∘g∘x) per row, r = rsqrt(mean(x²) + ε).
struct RmsNormGradX {
    eps: f64,
}

impl CustomOp3 for RmsNormGradX {
    fn name(&self) -> &'static str {
        "gyre-rms-norm-grad-x"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, dim) = f32_rows(xs, xl, self.name())?;
        let g = gain(gs, gl, dim, self.name())?;
        let (dy, _) = f32_rows(ds, dl, self.name())?;
        if dy.len() != x.len() {
            candle_core::bail!("{}: shapes differ", self.name());
        }
        let mut dx = vec![0f32; x.len()];
        for ((x, dy), dx) in x
            .chunks_exact(dim)
            .zip(dy.chunks_exact(dim))
            .zip(dx.chunks_exact_mut(dim))
        {
            let r = inv_rms(x, self.eps);
            let dot: f32 = x.iter().zip(dy).zip(g).map(|((x, d), g)| d * g * x).sum();
            let c = r * r * dot / dim as f32;
            for (((dx, &x), &dy), &g) in dx.iter_mut().zip(x).zip(dy).zip(g) {
                *dx = r * (dy * g - x * c);
            }
        }
        Ok((CpuStorage::F32(dx), xl.shape().clone()))
    }
}

/// dg = Σ over rows of dy∘x·r.
struct RmsNormGradG {
    eps: f64,
}

impl CustomOp2 for RmsNormGradG {
    fn name(&self) -> &'static str {
        "gyre-rms-norm-grad-g"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, dim) = f32_rows(xs, xl, self.name())?;
        let (dy, _) = f32_rows(ds, dl, self.name())?;
        if dy.len() != x.len() {
            candle_core::bail!("{}: shapes differ", self.name());
        }
        let mut dg = vec![0f32; dim];
        for (x, dy) in x.chunks_exact(dim).zip(dy.chunks_exact(dim)) {
            let r = inv_rms(x, self.eps);
            for ((dg, &x), &dy) in dg.iter_mut().zip(x).zip(dy) {
                *dg += dy * x * r;
            }
        }
        Ok((CpuStorage::F32(dg), Shape::from(dim)))
    }
}

/// GELU, x · Φ(x) with the exact (erf) Φ, with a one-pass backward. Φ
/// and its density share one exponential, e^(−x²/2); erf is Abramowitz
/// and Stegun's 7.1.26 (absolute error under 1.5e-7, about f32's own
/// resolution near 1), where libm's scalar erff was a twentieth of a
/// training step.
pub fn gelu_erf(x: &Tensor) -> Result<Tensor, ModelError> {
    Ok(x.contiguous()?.apply_op1(GeluErf)?)
}

/// e^x without a call into libm: Cody and Waite's reduction x = n·ln 2 + r
/// and Cephes' degree-6 polynomial for e^r (within 2 ulp of libm's expf
/// over the whole range), written without branches so that a loop of it
/// over a slice compiles to vector instructions; libm's scalar expf was
/// the largest share of the activations' time. Inputs below −87 give
/// about 1.6e-38 rather than a subnormal or zero, which no caller can
/// tell apart (each adds it to or multiplies it by numbers of order 1).
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// (Φ(x), φ(x)): the standard normal's distribution and density.
#[inline(always)]
pub(super) fn phi(x: f32) -> (f32, f32) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    const INV_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let z = (x * INV_SQRT_2).abs();
    let e = exp(-0.5 * x * x);
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let erf_abs = 1.0 - poly * e;
    let erf = if x < 0.0 { -erf_abs } else { erf_abs };
    (0.5 * (1.0 + erf), e * INV_SQRT_2PI)
}

struct GeluErf;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "gyre-gelu-erf"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, _) = f32_rows(s, l, self.name())?;
        let y = map1(x, |x| x * phi(x).0);
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&dy.contiguous()?, &GeluErfGrad)?))
    }
}

/// dx = dy · (Φ(x) + x φ(x)).
struct GeluErfGrad;

impl CustomOp2 for GeluErfGrad {
    fn name(&self) -> &'static str {
        "gyre-gelu-erf-grad"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, _) = f32_rows(xs, xl, self.name())?;
        let (dy, _) = f32_rows(gs, gl, self.name())?;
        if dy.len() != x.len() {
            candle_core::bail!("{}: shapes differ", self.name());
        }
        let dx = map2(x, dy, |x, dy| {
            let (cdf, pdf) = phi(x);
            dy * (cdf + x * pdf)
        });
        Ok((CpuStorage::F32(dx), xl.shape().clone()))
    }
}

/// SwiGLU's gate, silu(g) ∘ u, with a one-pass backward for each input.
pub fn silu_mul(g: &Tensor, u: &Tensor) -> Result<Tensor, ModelError> {
    Ok(g.contiguous()?.apply_op2(&u.contiguous()?, SiluMul)?)
}

#[inline(always)]
pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

fn same_len<'a>(
    a: (&'a CpuStorage, &Layout),
    b: (&'a CpuStorage, &Layout),
    op: &str,
) -> candle_core::Result<(&'a [f32], &'a [f32])> {
    let (a, _) = f32_rows(a.0, a.1, op)?;
    let (b, _) = f32_rows(b.0, b.1, op)?;
    if a.len() != b.len() {
        candle_core::bail!("{op}: shapes differ");
    }
    Ok((a, b))
}

struct SiluMul;

impl CustomOp2 for SiluMul {
    fn name(&self) -> &'static str {
        "gyre-silu-mul"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (g, u) = same_len((gs, gl), (us, ul), self.name())?;
        let y = map2(g, u, |g, u| g * sigmoid(g) * u);
        Ok((CpuStorage::F32(y), gl.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        let dg = g.apply_op3_no_bwd(u, &dy, &SiluMulGrad { of_gate: true })?;
        let du = g.apply_op3_no_bwd(u, &dy, &SiluMulGrad { of_gate: false })?;
        Ok((Some(dg), Some(du)))
    }
}

/// d/dg = dy ∘ u ∘ σ(g)(1 + g(1 − σ(g))); d/du = dy ∘ silu(g).
struct SiluMulGrad {
    of_gate: bool,
}

impl CustomOp3 for SiluMulGrad {
    fn name(&self) -> &'static str {
        "gyre-silu-mul-grad"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (g, u) = same_len((gs, gl), (us, ul), self.name())?;
        let (_, dy) = same_len((gs, gl), (ds, dl), self.name())?;
        let of_gate = self.of_gate;
        let d = map3(g, u, dy, |g, u, dy| {
            let s = sigmoid(g);
            if of_gate {
                dy * u * s * (1.0 + g * (1.0 - s))
            } else {
                dy * g * s
            }
        });
        Ok((CpuStorage::F32(d), gl.shape().clone()))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use candle_core::{D, Device, Var};

    fn composed_softmax(x: &Tensor) -> Tensor {
        let max = x.max_keepdim(D::Minus1).unwrap().detach();
        let e = x.broadcast_sub(&max).unwrap().exp().unwrap();
        let s = e.sum_keepdim(D::Minus1).unwrap();
        e.broadcast_div(&s).unwrap()
    }

    pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    pub(crate) fn randn(mean: f32, std: f32, shape: impl Into<Shape>) -> Tensor {
        Tensor::randn(mean, std, shape, &Device::Cpu).unwrap()
    }

    pub(crate) fn var(t: Tensor) -> Var {
        Var::from_tensor(&t.contiguous().unwrap()).unwrap()
    }

    /// The fused op and the composed ops it replaces agree within `value`
    /// on the output and within `grad` on the gradient of each input, for
    /// a random weighting of the output (any loss reaches an op that way).
    pub(crate) fn assert_same_fn(
        inputs: &[&Var],
        fused: impl Fn(&[&Tensor]) -> Tensor,
        composed: impl Fn(&[&Tensor]) -> Tensor,
        value: f32,
        grad: f32,
    ) {
        let xs: Vec<&Tensor> = inputs.iter().map(|v| v.as_tensor()).collect();
        let (f, c) = (fused(&xs), composed(&xs));
        let d = max_diff(&f, &c);
        assert!(d < value, "output differs by {d}");
        let w = randn(0.0, 1.0, f.shape());
        let loss = |y: &Tensor| (y * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let (g1, g2) = (loss(&f), loss(&c));
        for (i, v) in inputs.iter().enumerate() {
            let d = max_diff(g1.get(v).unwrap(), g2.get(v).unwrap());
            assert!(d < grad, "gradient of input {i} differs by {d}");
        }
    }

    #[test]
    fn softmax_and_its_gradient_match_the_composed_ops() {
        let x = var(randn(0.0, 2.0, (3, 5, 17)));
        assert_same_fn(
            &[&x],
            |x| softmax_last(x[0]).unwrap(),
            |x| composed_softmax(x[0]),
            1e-6,
            1e-6,
        );
    }

    #[test]
    fn rms_norm_and_its_gradients_match_the_composed_ops() {
        let x = var(randn(0.0, 1.5, (2, 7, 24)));
        let g = var(randn(1.0, 0.3, 24));
        let eps = 1e-5;
        assert_same_fn(
            &[&x, &g],
            |t| rms_norm(t[0], t[1], eps).unwrap(),
            |t| {
                let ms = t[0].sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
                let inv = (ms + eps).unwrap().sqrt().unwrap().recip().unwrap();
                t[0].broadcast_mul(&inv)
                    .unwrap()
                    .broadcast_mul(t[1])
                    .unwrap()
            },
            1e-5,
            1e-4,
        );
    }

    #[test]
    fn exp_is_within_two_ulp_of_libms_over_the_range() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), x.exp());
            worst = worst.max((got - want).abs() / want);
            x += 0.000_97;
        }
        assert!(worst < 2.5 * f32::EPSILON, "relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) < 2e-38 && exp(-f32::INFINITY) < 2e-38);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn gelu_and_its_gradient_match_candles_exact_erf() {
        let x = var(randn(0.0, 3.0, (4, 257)));
        assert_same_fn(
            &[&x],
            |x| gelu_erf(x[0]).unwrap(),
            |x| x[0].gelu_erf().unwrap(),
            1e-6,
            1e-5,
        );
    }

    #[test]
    fn silu_mul_and_its_gradients_match_the_composed_ops() {
        let g = var(randn(0.0, 3.0, (5, 33)));
        let u = var(randn(0.0, 1.0, (5, 33)));
        assert_same_fn(
            &[&g, &u],
            |t| silu_mul(t[0], t[1]).unwrap(),
            |t| (t[0].silu().unwrap() * t[1]).unwrap(),
            1e-5,
            1e-5,
        );
    }

    #[test]
    fn a_row_with_no_visible_key_is_zeros_not_nan() {
        let x = Tensor::new(
            &[[f32::NEG_INFINITY, f32::NEG_INFINITY], [0.0, 0.0]],
            &Device::Cpu,
        )
        .unwrap();
        let y = softmax_last(&x).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(y, vec![vec![0.0, 0.0], vec![0.5, 0.5]]);
    }
}
