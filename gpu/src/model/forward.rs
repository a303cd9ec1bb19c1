//! The arithmetic every architecture shares, and the two entry points the
//! trainer and the engine call, so both compute the same function:
//!
//! - [`hidden_batch`] runs right-padded rows as one batch (right padding
//!   needs no mask beyond causality: real tokens never see pads), with
//!   gradients;
//! - [`forward_ragged`] runs the new tokens of several sequences
//!   concatenated, attending to each one's cached keys and values, as
//!   continuous batching does.
//!
//! Each dispatches to the architecture's [`Model`] implementation.

use candle_core::{D, Device, Tensor};

use super::Model;
use super::config::ModelConfig;
use super::weights::Weights;
use crate::error::ModelError;

/// x · rsqrt(mean(x²) + ε) · g over the last dimension.
pub fn rms_norm_eps(x: &Tensor, g: &Tensor, eps: f64) -> Result<Tensor, ModelError> {
    super::fused::rms_norm(x, g, eps)
}

/// log softmax over the last dimension; the max shift is a constant.
pub fn log_softmax(x: &Tensor) -> Result<Tensor, ModelError> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let diff = x.broadcast_sub(&max)?;
    let lse = diff.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(diff.broadcast_sub(&lse)?)
}

/// Scaled dot-product attention: `q` [.., H, n, hd], `k`/`v` [.., H, m, hd],
/// `mask` additive [n, m].
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    hd: usize,
) -> Result<Tensor, ModelError> {
    let kt = k.transpose(D::Minus2, D::Minus1)?.contiguous()?;
    // The scale on q (n × hd values) rather than on the scores (n × m),
    // and a fused softmax whose backward is one pass too: composed of
    // per-op kernels, the scores' temporaries were a large share of a
    // training step.
    let q = (q * (1.0 / (hd as f64).sqrt()))?;
    let scores = q.matmul(&kt)?.broadcast_add(mask)?;
    let p = super::fused::softmax_last(&scores)?;
    Ok(p.matmul(v)?)
}

/// Additive causal mask for `n` queries at positions `past..past+n` over
/// `past+n` keys.
pub fn causal_mask(n: usize, past: usize) -> Result<Tensor, ModelError> {
    let m = past + n;
    let data: Vec<f32> = (0..n)
        .flat_map(|i| {
            (0..m).map(move |j| {
                if j <= past + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Ok(Tensor::from_vec(data, (n, m), &Device::Cpu)?)
}

/// Rejects sequences longer than the context and ids outside the
/// vocabulary before they reach an embedding lookup.
pub fn check_tokens(cfg: &ModelConfig, ids: &[u32], len: usize) -> Result<(), ModelError> {
    if len > cfg.context {
        return Err(ModelError::Context {
            len,
            context: cfg.context,
        });
    }
    check_vocab(cfg, ids)
}

/// Rejects ids outside the vocabulary, naming the first and its place.
pub fn check_vocab(cfg: &ModelConfig, ids: &[u32]) -> Result<(), ModelError> {
    if let Some((position, &token)) = ids
        .iter()
        .enumerate()
        .find(|(_, t)| **t as usize >= cfg.vocab)
    {
        return Err(ModelError::Token {
            token,
            position,
            vocab: cfg.vocab,
        });
    }
    Ok(())
}

/// Checks a right-padded batch's shape and tokens.
pub fn check_batch(cfg: &ModelConfig, ids: &[u32], n: usize, t: usize) -> Result<(), ModelError> {
    check_tokens(cfg, ids, t)?;
    if ids.len() != n * t {
        return Err(ModelError::Length {
            expected: n * t,
            got: ids.len(),
        });
    }
    Ok(())
}

/// Checks that a ragged batch's segments cover its tokens; returns every
/// token's position in its sequence.
pub fn ragged_positions(
    cfg: &ModelConfig,
    tokens: &[u32],
    segs: &[Segment],
    want: &[usize],
) -> Result<Vec<u32>, ModelError> {
    let mut positions = Vec::with_capacity(tokens.len());
    for s in segs {
        let Some(seg) = tokens.get(s.start..s.start + s.len) else {
            return Err(ModelError::Config(
                "ragged batch: a segment lies outside the tokens".into(),
            ));
        };
        check_tokens(cfg, seg, s.past + s.len)?;
        positions.extend((s.past..s.past + s.len).map(|p| p as u32));
    }
    if positions.len() != tokens.len() || want.iter().any(|&r| r >= tokens.len()) {
        return Err(ModelError::Config(
            "ragged batch: segments do not cover the tokens".into(),
        ));
    }
    Ok(positions)
}

/// The rows of `x` listed in `want` as logits, one `Vec` per row.
pub fn wanted_logits(
    m: &dyn Model,
    x: &Tensor,
    want: &[usize],
) -> Result<Vec<Vec<f32>>, ModelError> {
    if want.is_empty() {
        return Ok(Vec::new());
    }
    let rows = Tensor::from_vec(
        want.iter().map(|&r| r as u32).collect::<Vec<_>>(),
        want.len(),
        &Device::Cpu,
    )?;
    Ok(m.logits(&x.index_select(&rows, 0)?)?.to_vec2::<f32>()?)
}

/// Final hidden states (before the final norm) of right-padded rows:
/// `ids` is `n` rows of `t` tokens, row-major. Returns [n, t, width].
pub fn hidden_batch(w: &Weights, ids: &[u32], n: usize, t: usize) -> Result<Tensor, ModelError> {
    w.model().hidden_batch(ids, n, t)
}

/// Logits of hidden rows [k, width] → [k, vocab].
pub fn logits(w: &Weights, hidden: &Tensor) -> Result<Tensor, ModelError> {
    w.model().logits(hidden)
}

/// The new tokens of one sequence inside a ragged batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First row of this segment in the concatenated batch.
    pub start: usize,
    /// New tokens.
    pub len: usize,
    /// Tokens already in this sequence's cache (the position of the first
    /// new token).
    pub past: usize,
}

/// Where the engine keeps keys and values: rows of
/// [`ModelConfig::kv_width`] floats per token, per layer.
pub trait KvStore {
    /// Keys and values of the first `seg.past` tokens of segment `seg_ix`.
    fn load(&self, seg_ix: usize, layer: usize) -> Result<(Vec<f32>, Vec<f32>), ModelError>;
    /// Keys and values of the segment's new tokens, to keep at positions
    /// `past..past+len`.
    fn store(
        &mut self,
        seg_ix: usize,
        layer: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), ModelError>;
    /// The first `n` rows of keys (`kv` = 0) or values (1) of segment
    /// `seg_ix` where they lie, as runs of whole rows in position order,
    /// if the store holds them in memory; `None` (the default): read
    /// them through [`load`](Self::load).
    fn rows_in_place(
        &self,
        _seg_ix: usize,
        _layer: usize,
        _kv: usize,
        _n: usize,
    ) -> Option<Vec<&[f32]>> {
        None
    }
}

/// One segment's keys and values over its whole sequence: the cached rows
/// (loaded through `kv`) then the new ones (stored through `kv`), each
/// [past + len, width].
fn cached_and_new(
    kv: &mut dyn KvStore,
    seg_ix: usize,
    layer: usize,
    s: &Segment,
    kn: Tensor,
    vn: Tensor,
) -> Result<(Tensor, Tensor), ModelError> {
    let width = kn.dim(1)?;
    let (kp, vp) = kv.load(seg_ix, layer)?;
    kv.store(
        seg_ix,
        layer,
        &kn.flatten_all()?.to_vec1::<f32>()?,
        &vn.flatten_all()?.to_vec1::<f32>()?,
    )?;
    if s.past == 0 {
        return Ok((kn, vn));
    }
    let kp = Tensor::from_vec(kp, (s.past, width), &Device::Cpu)?;
    let vp = Tensor::from_vec(vp, (s.past, width), &Device::Cpu)?;
    Ok((Tensor::cat(&[kp, kn], 0)?, Tensor::cat(&[vp, vn], 0)?))
}

/// Causal attention of a ragged batch, segment by segment: `q` is
/// [total, heads, hd], `k`/`v` are [total, kv_width] rows (stored through
/// `kv`, after the cached rows it loads), `by_head` turns a segment's
/// [m, kv_width] rows into [heads, m, hd]. Returns [total, heads·hd].
///
/// In tensor ops, as the trainer's batch computes attention: the
/// reference [`attend_ragged`] (what the engine runs) is checked against.
#[allow(clippy::too_many_arguments)]
pub fn attend_segments(
    kv: &mut dyn KvStore,
    layer: usize,
    segs: &[Segment],
    masks: &[Tensor],
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    by_head: &dyn Fn(&Tensor, usize) -> Result<Tensor, ModelError>,
) -> Result<Tensor, ModelError> {
    let (_, heads, hd) = q.dims3()?;
    let mut outs = Vec::with_capacity(segs.len());
    for (si, s) in segs.iter().enumerate() {
        let (ka, va) = cached_and_new(
            kv,
            si,
            layer,
            s,
            k.narrow(0, s.start, s.len)?,
            v.narrow(0, s.start, s.len)?,
        )?;
        let m = s.past + s.len;
        let qs = q.narrow(0, s.start, s.len)?.transpose(0, 1)?.contiguous()?;
        let o = attend(&qs, &by_head(&ka, m)?, &by_head(&va, m)?, &masks[si], hd)?;
        outs.push(o.transpose(0, 1)?.reshape((s.len, heads * hd))?);
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// Causal attention of a ragged batch, in plain loops over the rows: `q`
/// is [total, heads, hd], `k`/`v` are [total, kv_heads·hd] rows (stored
/// through `kv`, after the cached rows it loads); query head h reads key
/// head h / (heads / kv_heads). Returns [total, heads·hd].
///
/// It computes what [`attend_segments`] computes (scores scaled by
/// 1/√hd, a causal softmax, the weighted values) without building
/// tensors per segment for segments of a few new rows: a decode step of
/// many sequences is one new token each, and a dozen small tensor ops per
/// sequence and layer cost far more than the arithmetic. A segment of
/// [`TENSOR_ROWS`] or more (a prompt chunk) still runs as tensor ops.
pub fn attend_ragged(
    kv: &mut dyn KvStore,
    layer: usize,
    segs: &[Segment],
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_heads: usize,
) -> Result<Tensor, ModelError> {
    let (total, heads, hd) = q.dims3()?;
    let kvw = kv_heads * hd;
    if kv_heads == 0 || heads % kv_heads != 0 || k.dims2()? != (total, kvw) {
        return Err(ModelError::Config(format!(
            "attention: {heads} query heads over {kv_heads} key heads of {hd} with keys {:?}",
            k.dims()
        )));
    }
    let group = heads / kv_heads;
    let q = q.flatten_all()?.to_vec1::<f32>()?;
    let k = k.flatten_all()?.to_vec1::<f32>()?;
    let v = v.flatten_all()?.to_vec1::<f32>()?;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; total * heads * hd];
    let mut p = Vec::new();
    for (si, s) in segs.iter().enumerate() {
        let new = s.start * kvw..(s.start + s.len) * kvw;
        let seen_all = s.past + s.len;
        // The cache's rows where they lie, or a copy of them.
        let copied;
        let (kr, vr): (Vec<&[f32]>, Vec<&[f32]>) = match kv.rows_in_place(si, layer, 0, s.past) {
            Some(_) => {
                kv.store(si, layer, &k[new.clone()], &v[new])?;
                let rows = |which| {
                    kv.rows_in_place(si, layer, which, seen_all)
                        .unwrap_or_default()
                        .into_iter()
                        .flat_map(|run| run.chunks_exact(kvw))
                        .collect::<Vec<_>>()
                };
                (rows(0), rows(1))
            }
            None => {
                let (mut kc, mut vc) = kv.load(si, layer)?;
                kv.store(si, layer, &k[new.clone()], &v[new.clone()])?;
                kc.extend_from_slice(&k[new.clone()]);
                vc.extend_from_slice(&v[new]);
                copied = (kc, vc);
                (
                    copied.0.chunks_exact(kvw).collect(),
                    copied.1.chunks_exact(kvw).collect(),
                )
            }
        };
        if kr.len() != seen_all || vr.len() != seen_all {
            return Err(ModelError::Config(format!(
                "attention: the cache gave {} key and {} value rows of {seen_all}",
                kr.len(),
                vr.len()
            )));
        }
        if s.len >= TENSOR_ROWS {
            let rows = s.start * heads * hd..(s.start + s.len) * heads * hd;
            let o = attend_in_tensors(&q[rows.clone()], &kr, &vr, s, [heads, kv_heads, hd])?;
            out[rows].copy_from_slice(&o);
            continue;
        }
        for i in 0..s.len {
            let row = s.start + i;
            let seen = s.past + i + 1;
            for h in 0..heads {
                let off = (h / group) * hd;
                let qh = &q[(row * heads + h) * hd..][..hd];
                let o = &mut out[(row * heads + h) * hd..][..hd];
                let rows = Rows {
                    keys: &kr[..seen],
                    values: &vr[..seen],
                    off,
                };
                head_attention(qh, rows, scale, &mut p, o);
            }
        }
    }
    Ok(Tensor::from_vec(out, (total, heads * hd), &Device::Cpu)?)
}

/// New rows of a segment from which its attention runs as tensor ops
/// (two batched matmuls) rather than loops: a prompt chunk's rows share
/// one pass over the cache, where a loop walks it once per row.
const TENSOR_ROWS: usize = 8;

/// One segment's attention in tensor ops: `q` its rows' queries
/// [len, heads, hd], `kr`/`vr` every key and value row it sees; returns
/// [len, heads·hd] flat.
fn attend_in_tensors(
    q: &[f32],
    kr: &[&[f32]],
    vr: &[&[f32]],
    s: &Segment,
    [heads, kv_heads, hd]: [usize; 3],
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

/// The key and value rows one query attends to, and where its head's
/// columns start in them.
struct Rows<'a> {
    keys: &'a [&'a [f32]],
    values: &'a [&'a [f32]],
    off: usize,
}

/// One query head over its rows: `o` += softmax(q·k · scale) · v, with
/// `p` as scratch. The same loops compiled for AVX2 and FMA where the CPU
/// has them (the crate builds for baseline x86-64), else as they are.
fn head_attention(q: &[f32], rows: Rows<'_>, scale: f32, p: &mut Vec<f32>, o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has both features, checked just above.
        return unsafe { head_attention_avx2(q, rows, scale, p, o) };
    }
    head_attention_loops(q, rows, scale, p, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn head_attention_avx2(q: &[f32], rows: Rows<'_>, scale: f32, p: &mut Vec<f32>, o: &mut [f32]) {
    head_attention_loops(q, rows, scale, p, o)
}

#[inline(always)]
fn head_attention_loops(q: &[f32], rows: Rows<'_>, scale: f32, p: &mut Vec<f32>, o: &mut [f32]) {
    let (hd, off) = (q.len(), rows.off);
    p.clear();
    p.extend(rows.keys.iter().map(|r| dot(q, &r[off..off + hd]) * scale));
    let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for x in p.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    for (&w, r) in p.iter().zip(rows.values) {
        let w = w / sum;
        for (o, &x) in o.iter_mut().zip(&r[off..off + hd]) {
            *o += w * x;
        }
    }
}

/// Σ a·b, in eight lanes so the compiler keeps it in vector registers.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// One continuous-batching iteration: runs every segment's new tokens,
/// writes their keys and values through `kv`, and returns the logits of
/// the batch rows listed in `want` (in that order).
pub fn forward_ragged(
    w: &Weights,
    tokens: &[u32],
    segs: &[Segment],
    kv: &mut dyn KvStore,
    want: &[usize],
) -> Result<Vec<Vec<f32>>, ModelError> {
    w.model().forward_ragged(tokens, segs, kv, want)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every segment's rows in a Vec: what a paged cache holds, unpaged.
    struct MemKv {
        segs: Vec<Segment>,
        rows: Vec<[Vec<f32>; 2]>,
        width: usize,
        /// Lends its rows in place (in runs of three) instead of copies.
        in_place: bool,
    }

    impl KvStore for MemKv {
        fn load(&self, seg_ix: usize, _: usize) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
            let n = self.segs[seg_ix].past * self.width;
            let [k, v] = &self.rows[seg_ix];
            Ok((k[..n].to_vec(), v[..n].to_vec()))
        }
        fn store(
            &mut self,
            seg_ix: usize,
            _: usize,
            k: &[f32],
            v: &[f32],
        ) -> Result<(), ModelError> {
            let n = self.segs[seg_ix].past * self.width;
            let [ks, vs] = &mut self.rows[seg_ix];
            ks.truncate(n);
            vs.truncate(n);
            ks.extend_from_slice(k);
            vs.extend_from_slice(v);
            Ok(())
        }
        fn rows_in_place(
            &self,
            seg_ix: usize,
            _: usize,
            kv: usize,
            n: usize,
        ) -> Option<Vec<&[f32]>> {
            let rows = self.rows[seg_ix][kv].get(..n * self.width)?;
            self.in_place.then(|| rows.chunks(3 * self.width).collect())
        }
    }

    fn filled(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The plain loops give what the tensor ops give, with grouped query
    /// heads, cached prefixes, decode rows and chunks of a prompt (short
    /// ones in loops, a long one in tensors).
    #[test]
    fn ragged_attention_in_loops_equals_the_tensor_ops() {
        for (heads, kv_heads, in_place) in
            [(4, 4, false), (4, 2, false), (4, 4, true), (4, 2, true)]
        {
            let hd = 8;
            let kvw = kv_heads * hd;
            let segs = vec![
                Segment {
                    start: 0,
                    len: 1,
                    past: 5,
                },
                Segment {
                    start: 1,
                    len: 3,
                    past: 0,
                },
                Segment {
                    start: 4,
                    len: 2,
                    past: 7,
                },
                // A prompt chunk: tensor ops.
                Segment {
                    start: 6,
                    len: TENSOR_ROWS + 1,
                    past: 4,
                },
            ];
            let total = 6 + TENSOR_ROWS + 1;
            let mem = |segs: &[Segment]| MemKv {
                segs: segs.to_vec(),
                rows: segs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let n = s.past * kvw;
                        [filled(n, 7 + i as u32), filled(n, 99 + i as u32)]
                    })
                    .collect(),
                width: kvw,
                in_place,
            };
            let q = Tensor::from_vec(
                filled(total * heads * hd, 1),
                (total, heads, hd),
                &Device::Cpu,
            )
            .unwrap();
            let k = Tensor::from_vec(filled(total * kvw, 2), (total, kvw), &Device::Cpu).unwrap();
            let v = Tensor::from_vec(filled(total * kvw, 3), (total, kvw), &Device::Cpu).unwrap();
            let masks: Vec<Tensor> = segs
                .iter()
                .map(|s| causal_mask(s.len, s.past).unwrap())
                .collect();
            let group = heads / kv_heads;
            let by_head = |t: &Tensor, m: usize| -> Result<Tensor, ModelError> {
                let t = t
                    .reshape((m, kv_heads, hd))?
                    .transpose(0, 1)?
                    .contiguous()?;
                let which: Vec<u32> = (0..heads).map(|h| (h / group) as u32).collect();
                let which = Tensor::from_vec(which, heads, &Device::Cpu)?;
                Ok(t.index_select(&which, 0)?)
            };
            let (mut a, mut b) = (mem(&segs), mem(&segs));
            let want = attend_segments(&mut a, 0, &segs, &masks, &q, &k, &v, &by_head)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let got = attend_ragged(&mut b, 0, &segs, &q, &k, &v, kv_heads)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            for (w, g) in want.iter().flatten().zip(got.iter().flatten()) {
                assert!(
                    (w - g).abs() < 1e-5,
                    "{w} vs {g} ({heads}/{kv_heads} heads)"
                );
            }
            assert_eq!(a.rows, b.rows, "the new rows are stored alike");
        }
    }
}
