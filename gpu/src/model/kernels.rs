//! The slice kernels of the trainer's hand-written pass and the engine's
//! decoding: row-major matrix products that may read either operand
//! transposed and add into their output, and the row-wise norms,
//! activations and rotations with their gradients.
//!
//! Every gradient kernel adds into its output (`+=`), so a parameter or a
//! residual stream that several paths feed collects them in place: no
//! zeroed temporary per node and no separate sum, which is what candle's
//! gradient store cost the step.

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use crate::model::fused::{PARALLEL_FROM, inv_rms, phi, sigmoid};

/// A row-major matrix operand: `rows × cols` as stored, read transposed
/// when `t` is set.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub t: bool,
}

impl<'a> Mat<'a> {
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            t: false,
        }
    }

    pub fn t(self) -> Self {
        Mat { t: !self.t, ..self }
    }

    /// (rows, cols) as the product reads it.
    fn shape(&self) -> (usize, usize) {
        if self.t {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// (column stride, row stride) as the product reads it.
    fn strides(&self) -> (isize, isize) {
        if self.t {
            (self.cols as isize, 1)
        } else {
            (1, self.cols as isize)
        }
    }
}

/// Products at least this large (m·n·k) use rayon's pool, the threads
/// candle's matrix products use; a decode-sized one stays on this thread.
const PARALLEL_PRODUCT: usize = 1 << 18;

/// dst (m × n, row-major) = a · b, or dst += a · b with `add`.
pub(crate) fn matmul(dst: &mut [f32], a: Mat, b: Mat, add: bool) {
    let ((m, _), (_, n)) = (a.shape(), b.shape());
    assert_eq!(dst.len(), m * n, "matmul: the destination's size");
    // SAFETY: `dst` holds the m × n floats the product writes, and is a
    // unique borrow, so it overlaps neither operand.
    unsafe { gemm_raw(dst.as_mut_ptr(), a, b, add) }
}

/// a · b into a new matrix, which is written once and never zeroed first
/// (zeroing the step's fresh buffers was a twentieth of its time).
pub(crate) fn product(a: Mat, b: Mat) -> Vec<f32> {
    let ((m, _), (_, n)) = (a.shape(), b.shape());
    let mut out = Vec::with_capacity(m * n);
    // SAFETY: the product writes all m × n floats of the capacity (zeros
    // when the depth is 0) without reading them; the length is set after.
    unsafe {
        gemm_raw(out.as_mut_ptr(), a, b, false);
        out.set_len(m * n);
    }
    out
}

/// # Safety
/// `dst` must be valid for writes (and reads, with `add`) of the m × n
/// floats of the product, and overlap neither operand.
unsafe fn gemm_raw(dst: *mut f32, a: Mat, b: Mat, add: bool) {
    let ((m, k), (k2, n)) = (a.shape(), b.shape());
    assert!(
        k == k2 && a.data.len() == a.rows * a.cols && b.data.len() == b.rows * b.cols,
        "matmul: [{m}×{k}]·[{k2}×{n}] over {} and {} floats",
        a.data.len(),
        b.data.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !add {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::write_bytes(dst, 0, m * n) };
        }
        return;
    }
    let (a_cs, a_rs) = a.strides();
    let (b_cs, b_rs) = b.strides();
    let par = if m * n * k >= PARALLEL_PRODUCT {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    };
    // SAFETY: the assert above checks that each operand holds exactly the
    // matrix its shape and strides address; `dst` is the caller's.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            add,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            if add { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `f` over the rows of `dim` of `xs` and `ys` together, on rayon's pool
/// when they are large.
fn rows2<F>(x: &[f32], y: &mut [f32], dim: usize, f: F)
where
    F: Fn(&[f32], &mut [f32]) + Sync,
{
    if x.len() < PARALLEL_FROM {
        x.chunks_exact(dim)
            .zip(y.chunks_exact_mut(dim))
            .for_each(|(x, y)| f(x, y));
    } else {
        x.par_chunks_exact(dim)
            .zip(y.par_chunks_exact_mut(dim))
            .for_each(|(x, y)| f(x, y));
    }
}

/// y = x · rsqrt(mean(x²) + ε) · g per row of g's length (the arithmetic
/// of [`crate::model::fused::rms_norm`]).
pub(crate) fn rms_norm(x: &[f32], g: &[f32], eps: f64) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    rows2(x, &mut y, g.len(), |x, y| {
        let r = inv_rms(x, eps);
        for ((y, &x), &g) in y.iter_mut().zip(x).zip(g) {
            *y = x * r * g;
        }
    });
    y
}

/// The norm's backward: dx += r · (dy∘g − x · r² / D · Σ dy∘g∘x) per row,
/// and dg += Σ over rows of dy∘x·r.
pub(crate) fn rms_norm_grad(
    x: &[f32],
    g: &[f32],
    eps: f64,
    dy: &[f32],
    dx: &mut [f32],
    dg: &mut [f32],
) {
    let dim = g.len();
    let row = |x: &[f32], dy: &[f32], dx: &mut [f32]| {
        let r = inv_rms(x, eps);
        let dot: f32 = x.iter().zip(dy).zip(g).map(|((x, d), g)| d * g * x).sum();
        let c = r * r * dot / dim as f32;
        for (((dx, &x), &dy), &g) in dx.iter_mut().zip(x).zip(dy).zip(g) {
            *dx += r * (dy * g - x * c);
        }
    };
    if x.len() < PARALLEL_FROM {
        for ((x, dy), dx) in x
            .chunks_exact(dim)
            .zip(dy.chunks_exact(dim))
            .zip(dx.chunks_exact_mut(dim))
        {
            row(x, dy, dx);
        }
    } else {
        x.par_chunks_exact(dim)
            .zip(dy.par_chunks_exact(dim))
            .zip(dx.par_chunks_exact_mut(dim))
            .for_each(|((x, dy), dx)| row(x, dy, dx));
    }
    for (x, dy) in x.chunks_exact(dim).zip(dy.chunks_exact(dim)) {
        let r = inv_rms(x, eps);
        for ((dg, &x), &dy) in dg.iter_mut().zip(x).zip(dy) {
            *dg += dy * x * r;
        }
    }
}

/// Elementwise over equal-length slices, on rayon's pool when large.
fn zip_map<F>(a: &[f32], b: &[f32], out: &mut [f32], f: F)
where
    F: Fn(f32, f32, &mut f32) + Sync,
{
    if a.len() < PARALLEL_FROM {
        for ((&a, &b), o) in a.iter().zip(b).zip(out.iter_mut()) {
            f(a, b, o);
        }
    } else {
        a.par_iter()
            .zip(b)
            .zip(out.par_iter_mut())
            .for_each(|((&a, &b), o)| f(a, b, o));
    }
}

/// Elements per task of the activation kernels on rayon's pool.
const CHUNK: usize = 1 << 13;

/// Runs `f` over matching chunks of an input and of two outputs, on
/// rayon's pool when large.
fn chunks3<F>(x: &[f32], y: &mut [f32], z: &mut [f32], f: F)
where
    F: Fn(&[f32], &mut [f32], &mut [f32]) + Sync,
{
    if x.len() < PARALLEL_FROM {
        f(x, y, z);
    } else {
        x.par_chunks(CHUNK)
            .zip(y.par_chunks_mut(CHUNK))
            .zip(z.par_chunks_mut(CHUNK))
            .for_each(|((x, y), z)| f(x, y, z));
    }
}

#[inline(always)]
fn gelu_loops(u: &[f32], y: &mut [f32], slope: &mut [f32]) {
    for ((&u, y), s) in u.iter().zip(y.iter_mut()).zip(slope.iter_mut()) {
        let (cdf, pdf) = phi(u);
        *y = u * cdf;
        *s = cdf + u * pdf;
    }
}

fn gelu_chunk(u: &[f32], y: &mut [f32], slope: &mut [f32]) {
    crate::cpu::simd_dispatch!(gelu_loops, gelu_avx2, (u: &[f32], y: &mut [f32], slope: &mut [f32]));
}

/// GELU with the exact Φ: u·Φ(u), and its slope Φ(u) + u·φ(u), which is
/// all the backward needs.
pub(crate) fn gelu(u: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (mut y, mut slope) = (vec![0f32; u.len()], vec![0f32; u.len()]);
    chunks3(u, &mut y, &mut slope, gelu_chunk);
    (y, slope)
}

/// dy ∘ slope, in place.
pub(crate) fn scale_by(dy: &mut [f32], slope: &[f32]) {
    zip_map(slope, slope, dy, |s, _, d| *d *= s);
}

#[inline(always)]
fn silu_loops(g: &[f32], silu: &mut [f32], slope: &mut [f32]) {
    for ((&g, y), d) in g.iter().zip(silu.iter_mut()).zip(slope.iter_mut()) {
        let s = sigmoid(g);
        *y = g * s;
        *d = s * (1.0 + g * (1.0 - s));
    }
}

fn silu_chunk(g: &[f32], silu: &mut [f32], slope: &mut [f32]) {
    crate::cpu::simd_dispatch!(silu_loops, silu_avx2, (g: &[f32], silu: &mut [f32], slope: &mut [f32]));
}

/// SwiGLU's gate, silu(g) ∘ u, with what the backward needs: silu(g) and
/// its slope σ(g)(1 + g(1 − σ(g))). Returns (silu(g) ∘ u, silu(g), slope).
pub(crate) fn silu_mul(g: &[f32], u: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut silu, mut slope) = (vec![0f32; g.len()], vec![0f32; g.len()]);
    chunks3(g, &mut silu, &mut slope, silu_chunk);
    let mut y = vec![0f32; g.len()];
    zip_map(&silu, u, &mut y, |s, u, y| *y = s * u);
    (y, silu, slope)
}

/// The gradients of silu(g) ∘ u: dg = dy ∘ u ∘ slope, du = dy ∘ silu(g).
/// `dy` becomes dg; du is returned.
pub(crate) fn silu_mul_grad(silu: &[f32], slope: &[f32], u: &[f32], dy: &mut [f32]) -> Vec<f32> {
    let mut du = vec![0f32; dy.len()];
    zip_map(dy, silu, &mut du, |dy, s, du| *du = dy * s);
    zip_map(u, slope, dy, |u, s, dy| *dy *= u * s);
    du
}

/// Adds each row of `x` (rows of `dim`) into `out`.
pub(crate) fn sum_rows(x: &[f32], dim: usize, out: &mut [f32]) {
    for r in x.chunks_exact(dim) {
        for (o, &v) in out.iter_mut().zip(r) {
            *o += v;
        }
    }
}

/// `a += b`.
pub(crate) fn add(a: &mut [f32], b: &[f32]) {
    zip_map(b, b, a, |b, _, a| *a += b);
}

/// Copies the columns `col..col + heads·hd` of `x` (rows of `stride`, `n`
/// sequences of `t` rows) into head-major [n, heads, t, hd].
pub(crate) fn to_heads(
    x: &[f32],
    stride: usize,
    col: usize,
    (n, t, heads, hd): (usize, usize, usize, usize),
) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * heads * t * hd);
    for b in 0..n {
        for h in 0..heads {
            for i in 0..t {
                let at = (b * t + i) * stride + col + h * hd;
                out.extend_from_slice(&x[at..at + hd]);
            }
        }
    }
    out
}

/// The inverse of [`to_heads`] for whole rows: each row is, part after
/// part, every head's vector of that part (head-major [n, heads, t, hd]
/// with its number of heads).
pub(crate) fn from_heads(parts: &[(&[f32], usize)], (n, t, hd): (usize, usize, usize)) -> Vec<f32> {
    let width: usize = parts.iter().map(|(_, h)| h * hd).sum();
    let mut out = Vec::with_capacity(n * t * width);
    for b in 0..n {
        for i in 0..t {
            for &(src, heads) in parts {
                for h in 0..heads {
                    let at = ((b * heads + h) * t + i) * hd;
                    out.extend_from_slice(&src[at..at + hd]);
                }
            }
        }
    }
    out
}

/// The column blocks of `x` (`m` rows of Σ widths), each as its own
/// row-major matrix.
pub(crate) fn split_cols(x: &[f32], m: usize, widths: &[usize]) -> Vec<Vec<f32>> {
    let total: usize = widths.iter().sum();
    let mut out: Vec<Vec<f32>> = widths.iter().map(|w| Vec::with_capacity(m * w)).collect();
    for row in x.chunks_exact(total).take(m) {
        let mut at = 0;
        for (o, &w) in out.iter_mut().zip(widths) {
            o.extend_from_slice(&row[at..at + w]);
            at += w;
        }
    }
    out
}

/// The inverse of [`split_cols`]: matrices of `m` rows side by side.
pub(crate) fn concat_cols(parts: &[(&[f32], usize)], m: usize) -> Vec<f32> {
    let total: usize = parts.iter().map(|(_, w)| w).sum();
    let mut out = Vec::with_capacity(m * total);
    for r in 0..m {
        for &(x, w) in parts {
            out.extend_from_slice(&x[r * w..(r + 1) * w]);
        }
    }
    out
}

/// Rotary embedding of each head (rows of `hd`) of row-major `x`, whose
/// row `r` is at position `r % t`: x·cos + rotate_half(x)·sin, in place.
pub(crate) fn rope(x: &mut [f32], width: usize, t: usize, cos: &[f32], sin: &[f32], hd: usize) {
    let half = hd / 2;
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        let p = (r % t) * hd;
        let (c, s) = (&cos[p..p + hd], &sin[p..p + hd]);
        for h in row.chunks_exact_mut(hd) {
            for i in 0..half {
                let (x1, x2) = (h[i], h[i + half]);
                h[i] = x1 * c[i] + (-x2) * s[i];
                h[i + half] = x2 * c[i + half] + x1 * s[i + half];
            }
        }
    }
}

/// The rotation's backward, in place: dx = dy·cos + rotate_halfᵀ(dy·sin).
pub(crate) fn rope_grad(
    dy: &mut [f32],
    width: usize,
    t: usize,
    cos: &[f32],
    sin: &[f32],
    hd: usize,
) {
    let half = hd / 2;
    for (r, row) in dy.chunks_exact_mut(width).enumerate() {
        let p = (r % t) * hd;
        let (c, s) = (&cos[p..p + hd], &sin[p..p + hd]);
        for h in row.chunks_exact_mut(hd) {
            for i in 0..half {
                let (d1, d2) = (h[i], h[i + half]);
                h[i] = d1 * c[i] + d2 * s[i + half];
                h[i + half] = d2 * c[i + half] - d1 * s[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], (m, k): (usize, usize), b: &[f32], n: usize) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut t = vec![0f32; a.len()];
        for i in 0..rows {
            for j in 0..cols {
                t[j * rows + i] = a[i * cols + j];
            }
        }
        t
    }

    #[test]
    fn products_read_either_operand_transposed_and_add_when_asked() {
        let (m, k, n) = (7, 5, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want = naive(&a, (m, k), &b, n);
        let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
        for (a, b) in [
            (Mat::new(&a, m, k), Mat::new(&b, k, n)),
            (Mat::new(&at, k, m).t(), Mat::new(&b, k, n)),
            (Mat::new(&a, m, k), Mat::new(&bt, n, k).t()),
            (Mat::new(&at, k, m).t(), Mat::new(&bt, n, k).t()),
        ] {
            let mut c = vec![1f32; m * n];
            matmul(&mut c, a, b, false);
            for (x, y) in c.iter().zip(&want) {
                assert!((x - y).abs() < 1e-5);
            }
            matmul(&mut c, a, b, true);
            for (x, y) in c.iter().zip(&want) {
                assert!((x - 2.0 * y).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn heads_round_trip() {
        // Two sequences of three rows of 2 heads of 4, then 1 head of 4.
        let (n, t, hd) = (2, 3, 4);
        let x: Vec<f32> = (0..n * t * 12).map(|i| i as f32).collect();
        let a = to_heads(&x, 12, 0, (n, t, 2, hd));
        let b = to_heads(&x, 12, 8, (n, t, 1, hd));
        // Head-major: sequence 1, head 0, row 2 holds row 5's columns 0..4.
        assert_eq!(&a[(2 * 3 + 2) * 4..(2 * 3 + 3) * 4], &x[5 * 12..5 * 12 + 4]);
        assert_eq!(from_heads(&[(&a, 2), (&b, 1)], (n, t, hd)), x);
    }

    #[test]
    fn column_blocks_split_and_join_back() {
        let x: Vec<f32> = (0..3 * 7).map(|i| i as f32).collect();
        let parts = split_cols(&x, 3, &[4, 1, 2]);
        assert_eq!(parts[1], vec![4.0, 11.0, 18.0]);
        let joined = concat_cols(&[(&parts[0], 4), (&parts[1], 1), (&parts[2], 2)], 3);
        assert_eq!(joined, x);
    }

    #[test]
    fn the_rotation_gradient_is_its_transpose() {
        // <rope(x), y> = <x, rope_grad(y)> for any x, y.
        let (t, hd, width) = (3, 4, 8);
        let cos: Vec<f32> = (0..t * hd).map(|i| (i as f32 * 0.3).cos()).collect();
        let sin: Vec<f32> = (0..t * hd).map(|i| (i as f32 * 0.3).sin()).collect();
        let x: Vec<f32> = (0..2 * t * width).map(|i| (i as f32 * 0.7).sin()).collect();
        let y: Vec<f32> = (0..2 * t * width).map(|i| (i as f32 * 0.9).cos()).collect();
        let (mut rx, mut gy) = (x.clone(), y.clone());
        rope(&mut rx, width, t, &cos, &sin, hd);
        rope_grad(&mut gy, width, t, &cos, &sin, hd);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f32>();
        assert!((dot(&rx, &y) - dot(&x, &gy)).abs() < 1e-4);
    }
}
