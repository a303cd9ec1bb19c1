//! Causal attention over whole right-padded rows as one op with its own
//! backward, for the trainer's teacher forcing.
//!
//! Composed of candle's ops, attention in a training step is a scaled copy
//! of the queries, a transposed copy of the keys, a batched product whose
//! small matrices (one per row and head) run one after another, an added
//! mask, a softmax, a second product and, for grouped queries, copies of
//! every key and value head; each keeps its output for the backward pass,
//! and the backward adds every gradient into a zeroed buffer of its own.
//! This op runs the rows and heads in parallel, keeps nothing (the
//! backward recomputes the probabilities, one small product per head), and
//! reads a key/value head in place for every query head that shares it.
//!
//! It computes what the composed ops compute, in the same order, except
//! for the exponential: the queries are scaled before the product, the
//! products are gemm calls over the keys each block of queries can see
//! (the masked entries are exact zeros, which the composed products
//! added), the softmax and its gradient are [`softmax_row`] (with
//! [`exp`](super::fused::exp) for libm's expf) and [`softmax_grad_row`],
//! and the gradients of a shared key/value head are summed over its query
//! heads in order.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Storage, Tensor};
use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use super::fused::{softmax_grad_row, softmax_row};
use crate::error::ModelError;

/// softmax(q·kᵀ/√hd + causal mask)·v for `q` [n, H, t, hd] and `k`, `v`
/// [n, G, t, hd], G dividing H: query head h reads key/value head
/// h / (H/G), as grouped-query attention repeats them.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor, ModelError> {
    Ok(q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, CausalAttention)?)
}

/// The shape every pass checks once.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    pub heads: usize,
    pub kv_heads: usize,
    pub t: usize,
    pub hd: usize,
}

impl Dims {
    fn of(q: &Layout, k: &Layout, v: &Layout) -> candle_core::Result<Dims> {
        let (&[n, heads, t, hd], &[kn, kv_heads, kt, khd]) = (q.dims(), k.dims()) else {
            candle_core::bail!("causal attention: q and k must be [n, heads, t, head_dim]");
        };
        if (kn, kt, khd) != (n, t, hd) || v.dims() != k.dims() {
            candle_core::bail!(
                "causal attention: q {:?}, k {:?} and v {:?} do not match",
                q.dims(),
                k.dims(),
                v.dims()
            );
        }
        if kv_heads == 0 || heads % kv_heads != 0 {
            candle_core::bail!("causal attention: {heads} query heads over {kv_heads} kv heads");
        }
        Ok(Dims {
            heads,
            kv_heads,
            t,
            hd,
        })
    }

    fn scale(&self) -> f32 {
        (1.0 / (self.hd as f64).sqrt()) as f32
    }

    fn head(&self) -> usize {
        self.t * self.hd
    }
}

fn contiguous<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        candle_core::bail!("causal attention: only f32 is supported");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("causal attention: inputs must be contiguous");
    };
    Ok(&v[a..b])
}

/// dst (m × n, rows `dst_rs` apart) = [dst +] a · b, where a is m × k
/// and b is k × n, each given by its column and row strides.
#[allow(clippy::too_many_arguments)]
fn product(
    (m, n, k): (usize, usize, usize),
    (dst, dst_rs): (&mut [f32], usize),
    accumulate: bool,
    a: &[f32],
    (a_cs, a_rs): (usize, usize),
    b: &[f32],
    (b_cs, b_rs): (usize, usize),
) {
    debug_assert!(m == 0 || dst.len() >= (m - 1) * dst_rs + n);
    debug_assert!(m == 0 || k == 0 || a.len() > (m - 1) * a_rs + (k - 1) * a_cs);
    debug_assert!(n == 0 || k == 0 || b.len() > (k - 1) * b_rs + (n - 1) * b_cs);
    // SAFETY: the strides address only elements inside the slices (checked
    // above in debug builds; every caller passes whole heads of the sizes
    // given), and `dst` does not overlap `a` or `b`.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// Rows per block of the causal products: a block of queries needs only
/// the keys up to its last row, so the products skip the masked upper
/// triangle's blocks (about 3/8 of a 128-token row's work at 32).
const BLOCK: usize = 32;

/// The blocks of `0..t`, as (first, end).
fn blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t).step_by(BLOCK).map(move |a| (a, (a + BLOCK).min(t)))
}

/// Scaled queries, and the causal probabilities of one head: `qs` gets
/// q·scale, `p` the t × t probabilities (zeros above the diagonal).
fn probabilities(d: Dims, q: &[f32], k: &[f32], qs: &mut [f32], p: &mut [f32]) {
    let (t, hd) = (d.t, d.hd);
    let scale = d.scale();
    for (qs, &q) in qs.iter_mut().zip(q) {
        *qs = q * scale;
    }
    // scores = qs · kᵀ (kᵀ's element (depth e, column j) is k[j, e]), for
    // each block of queries over the keys it can see.
    for (a, b) in blocks(t) {
        let dst = (&mut p[a * t..], t);
        product(
            (b - a, b, hd),
            dst,
            false,
            &qs[a * hd..],
            (1, hd),
            k,
            (hd, 1),
        );
    }
    let mut row = vec![0f32; t];
    for i in 0..t {
        let s = &mut p[i * t..(i + 1) * t];
        let visible = i + 1;
        row[..visible].fill(0.0);
        softmax_row(&s[..visible], &mut row[..visible]);
        s[..visible].copy_from_slice(&row[..visible]);
        s[visible..].fill(0.0);
    }
}

/// The attention of `q` [n, H, t, hd] over `k`, `v` [n, G, t, hd], all
/// contiguous and of the sizes `d` gives.
pub(super) fn forward(d: Dims, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let (t, hd, head) = (d.t, d.hd, d.head());
    let rep = d.heads / d.kv_heads;
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(head).enumerate().for_each_init(
        || (vec![0f32; head], vec![0f32; t * t]),
        |(scaled, p), (bh, o)| {
            let (b, h) = (bh / d.heads, bh % d.heads);
            let kv = (b * d.kv_heads + h / rep) * head;
            let qh = &q[bh * head..(bh + 1) * head];
            probabilities(d, qh, &k[kv..kv + head], scaled, p);
            // Each block of queries reads the values its probabilities
            // reach.
            for (a, b) in blocks(t) {
                let (p, o) = (&p[a * t..], (&mut o[a * hd..], hd));
                product(
                    (b - a, hd, b),
                    o,
                    false,
                    p,
                    (1, t),
                    &v[kv..kv + head],
                    (1, hd),
                );
            }
        },
    );
    out
}

struct CausalAttention;

impl CustomOp3 for CausalAttention {
    fn name(&self) -> &'static str {
        "gyre-causal-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let d = Dims::of(ql, kl, vl)?;
        let (q, k, v) = (
            contiguous(qs, ql)?,
            contiguous(ks, kl)?,
            contiguous(vs, vl)?,
        );
        let out = forward(d, q, k, v);
        Ok((CpuStorage::F32(out), ql.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _out: &Tensor,
        dout: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dout = dout.contiguous()?;
        let (qg, ql) = q.storage_and_layout();
        let (kg, kl) = k.storage_and_layout();
        let (vg, vl) = v.storage_and_layout();
        let (og, ol) = dout.storage_and_layout();
        let d = Dims::of(ql, kl, vl)?;
        if ol.dims() != ql.dims() {
            candle_core::bail!("causal attention: the output's gradient has another shape");
        }
        let (dq, dk, dv) = gradients(
            d,
            contiguous(cpu(&qg)?, ql)?,
            contiguous(cpu(&kg)?, kl)?,
            contiguous(cpu(&vg)?, vl)?,
            contiguous(cpu(&og)?, ol)?,
        );
        let device = q.device();
        Ok((
            Some(Tensor::from_vec(dq, ql.shape(), device)?),
            Some(Tensor::from_vec(dk, kl.shape(), device)?),
            Some(Tensor::from_vec(dv, vl.shape(), device)?),
        ))
    }
}

fn cpu(s: &Storage) -> candle_core::Result<&CpuStorage> {
    match s {
        Storage::Cpu(c) => Ok(c),
        _ => candle_core::bail!("causal attention: CPU tensors only"),
    }
}

/// dq, dk and dv. One task per row and key/value head: it owns that
/// head's dk and dv and the dq of the query heads that read it, and sums
/// their contributions to dk and dv in head order.
pub(super) fn gradients(
    d: Dims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (t, hd, head) = (d.t, d.hd, d.head());
    let rep = d.heads / d.kv_heads;
    let scale = d.scale();
    let mut dq = vec![0f32; q.len()];
    let mut dk = vec![0f32; k.len()];
    let mut dv = vec![0f32; v.len()];
    dq.par_chunks_mut(rep * head)
        .zip(dk.par_chunks_mut(head))
        .zip(dv.par_chunks_mut(head))
        .enumerate()
        .for_each_init(
            || {
                let square = vec![0f32; t * t];
                (vec![0f32; head], square.clone(), square.clone(), square)
            },
            |(scaled, p, dp, ds), (group, ((dq, dk), dv))| {
                let kv = group * head;
                let (k, v) = (&k[kv..kv + head], &v[kv..kv + head]);
                for r in 0..rep {
                    let h = (group * rep + r) * head;
                    let (q, dout) = (&q[h..h + head], &dout[h..h + head]);
                    probabilities(d, q, k, scaled, p);
                    let first = r == 0;
                    // dv (+)= pᵀ · dout: a block of keys is seen by the
                    // queries from its first row on.
                    for (a, b) in blocks(t) {
                        let dst = (&mut dv[a * hd..], hd);
                        let (p, dout) = (&p[a * t + a..], &dout[a * hd..]);
                        product((b - a, hd, t - a), dst, !first, p, (t, 1), dout, (1, hd));
                    }
                    // dp = dout · vᵀ over the keys each block of queries sees
                    for (a, b) in blocks(t) {
                        let dst = (&mut dp[a * t..], t);
                        product(
                            (b - a, b, hd),
                            dst,
                            false,
                            &dout[a * hd..],
                            (1, hd),
                            v,
                            (hd, 1),
                        );
                    }
                    for i in 0..t {
                        let visible = i + 1;
                        let dsi = &mut ds[i * t..(i + 1) * t];
                        softmax_grad_row(
                            &p[i * t..i * t + visible],
                            &dp[i * t..i * t + visible],
                            &mut dsi[..visible],
                        );
                        dsi[visible..].fill(0.0);
                    }
                    // dq = (ds · k) · scale
                    let dqh = &mut dq[r * head..(r + 1) * head];
                    for (a, b) in blocks(t) {
                        let dst = (&mut dqh[a * hd..], hd);
                        product((b - a, hd, b), dst, false, &ds[a * t..], (1, t), k, (1, hd));
                    }
                    for x in dqh.iter_mut() {
                        *x *= scale;
                    }
                    // dk (+)= dsᵀ · scaled q, by blocks of keys as dv
                    for (a, b) in blocks(t) {
                        let dst = (&mut dk[a * hd..], hd);
                        let (ds, qs) = (&ds[a * t + a..], &scaled[a * hd..]);
                        product((b - a, hd, t - a), dst, !first, ds, (t, 1), qs, (1, hd));
                    }
                }
            },
        );
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::forward::{attend, causal_mask};
    use crate::model::fused::tests::{assert_same_fn, max_diff, randn, var};

    fn composed(q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let (h, g) = (q.dims()[1], k.dims()[1]);
        let repeat = |x: &Tensor| {
            let x = x.unsqueeze(2).unwrap();
            let copies = vec![&x; h / g];
            let mut dims = k.dims().to_vec();
            dims[1] = h;
            Tensor::cat(&copies, 2).unwrap().reshape(dims).unwrap()
        };
        let (t, hd) = (q.dims()[2], q.dims()[3]);
        attend(q, &repeat(k), &repeat(v), &causal_mask(t, 0).unwrap(), hd).unwrap()
    }

    #[test]
    fn attention_and_its_gradients_match_the_composed_ops() {
        for (h, g) in [(4, 4), (4, 2), (6, 1)] {
            let q = var(randn(0.0, 1.0, (3, h, 17, 8)));
            let k = var(randn(0.0, 1.0, (3, g, 17, 8)));
            let v = var(randn(0.0, 1.0, (3, g, 17, 8)));
            assert_same_fn(
                &[&q, &k, &v],
                |x| causal_attention(x[0], x[1], x[2]).unwrap(),
                |x| composed(x[0], x[1], x[2]),
                1e-6,
                1e-5,
            );
        }
    }

    /// At a training step's shape (four blocks of rows), the values and
    /// gradients are the composed ops' to within the exponential's
    /// rounding.
    #[test]
    fn at_a_training_shape_the_results_are_the_composed_ops() {
        let (q, k, v) = (
            var(randn(0.0, 1.0, (2, 4, 128, 32))),
            var(randn(0.0, 1.0, (2, 4, 128, 32))),
            var(randn(0.0, 1.0, (2, 4, 128, 32))),
        );
        assert_same_fn(
            &[&q, &k, &v],
            |x| causal_attention(x[0], x[1], x[2]).unwrap(),
            |x| composed(x[0], x[1], x[2]),
            1e-6,
            1e-5,
        );
    }

    #[test]
    fn a_query_sees_no_later_key() {
        let q = randn(0.0, 1.0, (1, 2, 5, 4));
        let k = randn(0.0, 1.0, (1, 2, 5, 4));
        let v = randn(0.0, 1.0, (1, 2, 5, 4));
        let full = causal_attention(&q, &k, &v).unwrap();
        // Changing the last position's key and value changes no earlier
        // output row.
        let k2 = k.slice_assign(&[0..1, 0..2, 4..5, 0..4], &randn(0.0, 1.0, (1, 2, 1, 4)));
        let v2 = v.slice_assign(&[0..1, 0..2, 4..5, 0..4], &randn(0.0, 1.0, (1, 2, 1, 4)));
        let other = causal_attention(&q, &k2.unwrap(), &v2.unwrap()).unwrap();
        let early = |x: &Tensor| x.narrow(2, 0, 4).unwrap();
        assert_eq!(max_diff(&early(&full), &early(&other)), 0.0);
        assert!(max_diff(&full, &other) > 0.0);
    }

    #[test]
    fn mismatched_shapes_are_refused() {
        let q = randn(0.0, 1.0, (1, 3, 5, 4));
        let k = randn(0.0, 1.0, (1, 2, 5, 4));
        let err = causal_attention(&q, &k, &k).unwrap_err().to_string();
        assert!(err.contains("3 query heads over 2"), "{err}");
        let k = randn(0.0, 1.0, (1, 3, 6, 4));
        assert!(causal_attention(&q, &k, &k).is_err());
    }
}
