//! The transformer's arithmetic, shared by the trainer and the engine so
//! both compute the same function: pre-norm blocks (RMSNorm, causal
//! multi-head attention, GELU MLP), learned positions, an untied head.
//!
//! Two entry points: [`hidden_batch`] runs right-padded rows as one batch
//! (right padding needs no mask beyond causality: real tokens never see
//! pads), with gradients; [`forward_ragged`] runs the new tokens of several
//! sequences concatenated, attending to each one's cached keys and values,
//! as continuous batching does.

use candle_core::{D, DType, Device, Tensor};

use super::weights::{LayerWeights, Weights};
use crate::error::ModelError;

const NORM_EPS: f64 = 1e-5;

/// x · rsqrt(mean(x²) + ε) · g over the last dimension.
pub fn rms_norm(x: &Tensor, g: &Tensor) -> Result<Tensor, ModelError> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + NORM_EPS)?.sqrt()?.recip()?;
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
fn attend(
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

fn mlp(l: &LayerWeights, x: &Tensor) -> Result<Tensor, ModelError> {
    let h = rms_norm(x, &l.mlp_norm)?;
    Ok(h.broadcast_matmul(&l.w1)?
        .gelu_erf()?
        .broadcast_matmul(&l.w2)?)
}

/// Additive causal mask for `n` queries at positions `past..past+n` over
/// `past+n` keys.
fn causal_mask(n: usize, past: usize) -> Result<Tensor, ModelError> {
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

fn check_tokens(w: &Weights, ids: &[u32], len: usize) -> Result<(), ModelError> {
    if len > w.cfg.context {
        return Err(ModelError::Context {
            len,
            context: w.cfg.context,
        });
    }
    if let Some((position, &token)) = ids
        .iter()
        .enumerate()
        .find(|(_, t)| **t as usize >= w.cfg.vocab)
    {
        return Err(ModelError::Token {
            token,
            position,
            vocab: w.cfg.vocab,
        });
    }
    Ok(())
}

/// Final hidden states (before the final norm) of right-padded rows:
/// `ids` is `n` rows of `t` tokens, row-major. Returns [n, t, width].
pub fn hidden_batch(w: &Weights, ids: &[u32], n: usize, t: usize) -> Result<Tensor, ModelError> {
    check_tokens(w, ids, t)?;
    if ids.len() != n * t {
        return Err(ModelError::Length {
            expected: n * t,
            got: ids.len(),
        });
    }
    let (d, h) = (w.cfg.width, w.cfg.heads);
    let hd = w.cfg.head_dim();
    let idx = Tensor::from_slice(ids, n * t, &Device::Cpu)?;
    let x = w.tok_emb.embedding(&idx)?.reshape((n, t, d))?;
    let mut x = x.broadcast_add(&w.pos_emb.narrow(0, 0, t)?)?;
    let mask = causal_mask(t, 0)?;
    for l in &w.layers {
        let hn = rms_norm(&x, &l.attn_norm)?;
        let qkv = hn.broadcast_matmul(&l.wqkv)?;
        let split = |i: usize| -> Result<Tensor, ModelError> {
            Ok(qkv
                .narrow(2, i * d, d)?
                .reshape((n, t, h, hd))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let a = attend(&q, &k, &v, &mask, hd)?
            .transpose(1, 2)?
            .reshape((n, t, d))?;
        x = (x + a.broadcast_matmul(&l.wo)?)?;
        x = (&x + mlp(l, &x)?)?;
    }
    Ok(x)
}

/// Logits of hidden rows [k, width] → [k, vocab].
pub fn logits(w: &Weights, hidden: &Tensor) -> Result<Tensor, ModelError> {
    Ok(rms_norm(hidden, &w.final_norm)?.matmul(&w.lm_head)?)
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

/// Where the engine keeps keys and values: rows of `width` floats per
/// token, per layer.
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
    let (d, h) = (w.cfg.width, w.cfg.heads);
    let hd = w.cfg.head_dim();
    let total = tokens.len();
    let mut positions = Vec::with_capacity(total);
    for s in segs {
        check_tokens(w, &tokens[s.start..s.start + s.len], s.past + s.len)?;
        positions.extend((s.past..s.past + s.len).map(|p| p as u32));
    }
    if positions.len() != total || want.iter().any(|&r| r >= total) {
        return Err(ModelError::Config(
            "ragged batch: segments do not cover the tokens".into(),
        ));
    }
    if total == 0 {
        return Ok(Vec::new());
    }
    let ids = Tensor::from_slice(tokens, total, &Device::Cpu)?;
    let pos = Tensor::from_vec(positions, total, &Device::Cpu)?;
    let mut x = (w.tok_emb.embedding(&ids)? + w.pos_emb.embedding(&pos)?)?;
    let masks = segs
        .iter()
        .map(|s| causal_mask(s.len, s.past))
        .collect::<Result<Vec<_>, _>>()?;
    for (li, l) in w.layers.iter().enumerate() {
        let hn = rms_norm(&x, &l.attn_norm)?;
        let qkv = hn.matmul(&l.wqkv)?;
        let (q, k, v) = (
            qkv.narrow(1, 0, d)?,
            qkv.narrow(1, d, d)?,
            qkv.narrow(1, 2 * d, d)?,
        );
        let mut outs = Vec::with_capacity(segs.len());
        for (si, s) in segs.iter().enumerate() {
            let kn = k.narrow(0, s.start, s.len)?;
            let vn = v.narrow(0, s.start, s.len)?;
            let (kp, vp) = kv.load(si, li)?;
            kv.store(
                si,
                li,
                &kn.flatten_all()?.to_vec1::<f32>()?,
                &vn.flatten_all()?.to_vec1::<f32>()?,
            )?;
            let (ka, va) = if s.past == 0 {
                (kn, vn)
            } else {
                let kp = Tensor::from_vec(kp, (s.past, d), &Device::Cpu)?;
                let vp = Tensor::from_vec(vp, (s.past, d), &Device::Cpu)?;
                (Tensor::cat(&[kp, kn], 0)?, Tensor::cat(&[vp, vn], 0)?)
            };
            let m = s.past + s.len;
            let heads = |t: &Tensor, rows: usize| -> Result<Tensor, ModelError> {
                Ok(t.reshape((rows, h, hd))?.transpose(0, 1)?.contiguous()?)
            };
            let qs = heads(&q.narrow(0, s.start, s.len)?, s.len)?;
            let o = attend(&qs, &heads(&ka, m)?, &heads(&va, m)?, &masks[si], hd)?;
            outs.push(o.transpose(0, 1)?.reshape((s.len, d))?);
        }
        let a = Tensor::cat(&outs, 0)?;
        x = (x + a.matmul(&l.wo)?)?;
        x = (&x + mlp(l, &x)?)?;
    }
    if want.is_empty() {
        return Ok(Vec::new());
    }
    let rows = Tensor::from_vec(
        want.iter().map(|&r| r as u32).collect::<Vec<_>>(),
        want.len(),
        &Device::Cpu,
    )?;
    let lg = logits(w, &x.index_select(&rows, 0)?)?;
    Ok(lg.to_dtype(DType::F32)?.to_vec2::<f32>()?)
}
