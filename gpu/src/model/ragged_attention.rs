//! The engine's causal attention over a ragged batch, on slices: each
//! sequence's new rows attend to its cached keys and values and to the
//! new rows before them.
//!
//! A decode step of many sequences is one new row each over a cache of
//! tens to thousands of rows; per sequence that is a few small dot
//! products per head, so the work lies in walking the cache, not in any
//! one product. The rows are read where the paged cache keeps them (no
//! copy) when the store lends them, each sequence's heads run in plain
//! loops compiled for AVX2 (the softmax's exp included, see
//! [`fused::exp`]), and the sequences of a large batch run in parallel on
//! rayon's pool. A sequence with [`TENSOR_ROWS`] or more new rows (a
//! prompt chunk) runs as two batched matrix products instead, which share
//! one pass over the cache among its rows.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::forward::{KvStore, Segment, attend, causal_mask};
use super::fused;
use crate::error::ModelError;

/// New rows of a segment from which its attention runs as tensor ops
/// (two batched matmuls) rather than loops: a prompt chunk's rows share
/// one pass over the cache, where a loop walks it once per row.
pub(super) const TENSOR_ROWS: usize = 8;

/// Multiply-adds (Σ rows · seen rows · heads · head width) of a batch from
/// which its sequences run in parallel: below it, rayon's fork and join
/// cost more than they save.
pub(super) const PARALLEL_WORK: usize = 1 << 16;

/// The heads' shape: query heads, key/value heads (query head h reads key
/// head h / (heads / kv_heads)), and each head's width.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub hd: usize,
}

/// Causal attention of a ragged batch: `q` is [total, heads·hd], `k`/`v`
/// are [total, kv_heads·hd] rows, stored through `kv` after the cached
/// rows it holds. Returns [total, heads·hd].
pub fn attend_rows(
    kv: &mut dyn KvStore,
    layer: usize,
    segs: &[Segment],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: Heads,
) -> Result<Vec<f32>, ModelError> {
    let Heads {
        heads,
        kv_heads,
        hd,
    } = dims;
    let (qw, kvw) = (heads * hd, kv_heads * hd);
    let total = q.len() / qw.max(1);
    if kv_heads == 0 || heads % kv_heads != 0 || q.len() != total * qw || k.len() != total * kvw {
        return Err(ModelError::Config(format!(
            "attention: {heads} query heads over {kv_heads} key heads of {hd} with {} query and {} key floats",
            q.len(),
            k.len()
        )));
    }
    if v.len() != k.len() {
        return Err(ModelError::Length {
            expected: k.len(),
            got: v.len(),
        });
    }
    if let Some(s) = segs.iter().find(|s| s.start + s.len > total) {
        return Err(ModelError::Config(format!(
            "attention: a segment of rows {}..{} in a batch of {total}",
            s.start,
            s.start + s.len
        )));
    }
    // Every new row is stored first, so that each sequence's rows are all
    // in place before any reads them; a store that lends no rows gives
    // copies of its cache, which the new rows extend.
    let mut copies = Vec::with_capacity(segs.len());
    for (si, s) in segs.iter().enumerate() {
        let new = s.start * kvw..(s.start + s.len) * kvw;
        if kv.rows_in_place(si, layer, 0, s.past).is_some() {
            kv.store(si, layer, &k[new.clone()], &v[new])?;
            copies.push(None);
        } else {
            let (mut kc, mut vc) = kv.load(si, layer)?;
            kv.store(si, layer, &k[new.clone()], &v[new.clone()])?;
            kc.extend_from_slice(&k[new.clone()]);
            vc.extend_from_slice(&v[new]);
            copies.push(Some((kc, vc)));
        }
    }
    let kv: &dyn KvStore = kv;
    let one = |(si, s): (usize, &Segment)| -> Result<Vec<f32>, ModelError> {
        let seen = s.past + s.len;
        let (keys, values) = match &copies[si] {
            Some((kc, vc)) => (
                kc.chunks_exact(kvw).collect::<Vec<_>>(),
                vc.chunks_exact(kvw).collect::<Vec<_>>(),
            ),
            None => {
                let rows = |which| {
                    kv.rows_in_place(si, layer, which, seen)
                        .unwrap_or_default()
                        .into_iter()
                        .flat_map(|run| run.chunks_exact(kvw))
                        .collect::<Vec<_>>()
                };
                (rows(0), rows(1))
            }
        };
        if keys.len() != seen || values.len() != seen {
            return Err(ModelError::Config(format!(
                "attention: the cache gave {} key and {} value rows of {seen}",
                keys.len(),
                values.len()
            )));
        }
        let q = &q[s.start * qw..(s.start + s.len) * qw];
        if s.len >= TENSOR_ROWS {
            return in_tensors(q, &keys, &values, s, dims);
        }
        let mut out = vec![0f32; s.len * qw];
        let rows = Rows {
            keys: &keys,
            values: &values,
        };
        segment(q, rows, s.past, dims, &mut out);
        Ok(out)
    };
    let work: usize = segs.iter().map(|s| s.len * (s.past + s.len) * qw).sum();
    let outs: Vec<Vec<f32>> = if segs.len() > 1 && work >= PARALLEL_WORK {
        segs.par_iter()
            .enumerate()
            .map(one)
            .collect::<Result<_, _>>()?
    } else {
        segs.iter().enumerate().map(one).collect::<Result<_, _>>()?
    };
    let mut out = vec![0f32; total * qw];
    for (s, o) in segs.iter().zip(outs) {
        out[s.start * qw..(s.start + s.len) * qw].copy_from_slice(&o);
    }
    Ok(out)
}

/// One segment's attention in tensor ops: `q` its rows' queries
/// [len, heads, hd], `kr`/`vr` every key and value row it sees; returns
/// [len, heads·hd] flat.
fn in_tensors(
    q: &[f32],
    kr: &[&[f32]],
    vr: &[&[f32]],
    s: &Segment,
    Heads {
        heads,
        kv_heads,
        hd,
    }: Heads,
) -> Result<Vec<f32>, ModelError> {
    let m = kr.len();
    let group = heads / kv_heads;
    let which = Tensor::from_vec(
        (0..heads).map(|h| (h / group) as u32).collect::<Vec<_>>(),
        heads,
        &Device::Cpu,
    )?;
    // [m, kv_heads·hd] rows → [heads, m, hd], query head h on key head h / group.
    let by_head = |rows: &[&[f32]]| -> Result<Tensor, ModelError> {
        let t = Tensor::from_vec(rows.concat(), (m, kv_heads, hd), &Device::Cpu)?
            .transpose(0, 1)?
            .contiguous()?;
        Ok(if group == 1 {
            t
        } else {
            t.index_select(&which, 0)?
        })
    };
    let qs = Tensor::from_slice(q, (s.len, heads, hd), &Device::Cpu)?
        .transpose(0, 1)?
        .contiguous()?;
    let o = attend(
        &qs,
        &by_head(kr)?,
        &by_head(vr)?,
        &causal_mask(s.len, s.past)?,
        hd,
    )?;
    Ok(o.transpose(0, 1)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Every key and value row one sequence sees, in position order.
#[derive(Clone, Copy)]
struct Rows<'a> {
    keys: &'a [&'a [f32]],
    values: &'a [&'a [f32]],
}

/// A few new rows of one sequence: row i (at position past + i) of `q`
/// ([len, heads·hd]) over the first past + i + 1 of `rows`, into `out`
/// (zeros, [len, heads·hd]). The AVX2 and FMA build where the CPU has
/// them (the crate builds for baseline x86-64).
fn segment(q: &[f32], rows: Rows<'_>, past: usize, dims: Heads, out: &mut [f32]) {
    crate::cpu::simd_dispatch!(
        segment_loops,
        segment_avx2,
        (q: &[f32], rows: Rows<'_>, past: usize, dims: Heads, out: &mut [f32])
    );
}

/// [`segment`]'s loops: plain `for` loops without closures, so that all
/// of it (the dot products, the exp, the weighted sum) is compiled with
/// the caller's target features. Each key and value row is read once for
/// all heads, in position order, as the cache lays them out.
#[inline(always)]
fn segment_loops(q: &[f32], rows: Rows<'_>, past: usize, dims: Heads, out: &mut [f32]) {
    let Heads {
        heads,
        kv_heads,
        hd,
    } = dims;
    let group = heads / kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut scratch = vec![0f32; heads * rows.keys.len()];
    for (i, (qi, oi)) in q
        .chunks_exact(heads * hd)
        .zip(out.chunks_exact_mut(heads * hd))
        .enumerate()
    {
        let seen = past + i + 1;
        // p[h · seen + j]: head h's weight of row j.
        let p = &mut scratch[..heads * seen];
        for (j, key) in rows.keys[..seen].iter().enumerate() {
            for (h, qh) in qi.chunks_exact(hd).enumerate() {
                let off = (h / group) * hd;
                p[h * seen + j] = dot(qh, &key[off..off + hd]) * scale;
            }
        }
        for ph in p.chunks_exact_mut(seen) {
            let mut max = f32::NEG_INFINITY;
            for &x in ph.iter() {
                max = max.max(x);
            }
            for x in ph.iter_mut() {
                *x = fused::exp(*x - max);
            }
            let inv = 1.0 / sum(ph);
            for x in ph.iter_mut() {
                *x *= inv;
            }
        }
        for (j, value) in rows.values[..seen].iter().enumerate() {
            for (h, oh) in oi.chunks_exact_mut(hd).enumerate() {
                let (off, w) = ((h / group) * hd, p[h * seen + j]);
                for (o, &x) in oh.iter_mut().zip(&value[off..off + hd]) {
                    *o += w * x;
                }
            }
        }
    }
}

/// Σ x, in eight lanes.
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let mut total = 0.0;
    for &r in chunks.remainder() {
        total += r;
    }
    for c in chunks {
        for l in 0..8 {
            lanes[l] += c[l];
        }
    }
    for l in lanes {
        total += l;
    }
    total
}

/// Σ a·b, in eight lanes so the compiler keeps it in vector registers.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let mut tail = 0.0;
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        tail += x * y;
    }
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut sum = tail;
    for l in lanes {
        sum += l;
    }
    sum
}
