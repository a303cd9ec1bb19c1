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
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(g)?)
}

/// log softmax over the last dimension; the max shift is a constant.
pub fn log_softmax(x: &Tensor) -> Result<Tensor, ModelError> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let diff = x.broadcast_sub(&max)?;
    let lse = diff.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(diff.broadcast_sub(&lse)?)
}

fn softmax(x: &Tensor) -> Result<Tensor, ModelError> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
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
    let scores = (q.matmul(&kt)? * (1.0 / (hd as f64).sqrt()))?;
    let p = softmax(&scores.broadcast_add(mask)?)?;
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
