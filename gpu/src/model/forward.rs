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
use super::ragged_attention::{Heads, attend_rows};
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
/// [`ModelConfig::kv_width`] floats per token, per layer. Shared between
/// threads while the sequences of a batch attend in parallel.
pub trait KvStore: Sync {
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

/// Causal attention of a ragged batch in tensors: `q` is [total, heads,
/// hd], `k`/`v` are [total, kv_heads·hd] rows (stored through `kv`, after
/// the cached rows it loads); query head h reads key head h / (heads /
/// kv_heads). Returns [total, heads·hd]. It computes what
/// [`attend_segments`] computes, on slices: see [`attend_rows`].
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
    let dims = Heads {
        heads,
        kv_heads,
        hd,
    };
    let flat = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
    let out = attend_rows(kv, layer, segs, &flat(q)?, &flat(k)?, &flat(v)?, dims)?;
    Ok(Tensor::from_vec(out, (total, heads * hd), &Device::Cpu)?)
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
    use crate::model::ragged_attention::{PARALLEL_WORK, TENSOR_ROWS};

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

    /// The ragged attention on slices gives what the tensor ops give, the
    /// same rows stored, for `segs` (concatenated in order).
    fn check_ragged(segs: &[Segment], heads: usize, kv_heads: usize, in_place: bool) {
        let hd = 8;
        let kvw = kv_heads * hd;
        let total: usize = segs.iter().map(|s| s.len).sum();
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
        let (mut a, mut b) = (mem(segs), mem(segs));
        let want = attend_segments(&mut a, 0, segs, &masks, &q, &k, &v, &by_head)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let got = attend_ragged(&mut b, 0, segs, &q, &k, &v, kv_heads)
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

    /// With grouped query heads, cached prefixes, decode rows and chunks of
    /// a prompt (short ones in loops, a long one in tensors).
    #[test]
    fn ragged_attention_in_loops_equals_the_tensor_ops() {
        let segs = [(1, 5), (3, 0), (2, 7), (TENSOR_ROWS + 1, 4)];
        let mut start = 0;
        let segs: Vec<Segment> = segs
            .iter()
            .map(|&(len, past)| {
                start += len;
                Segment {
                    start: start - len,
                    len,
                    past,
                }
            })
            .collect();
        for (heads, kv_heads, in_place) in
            [(4, 4, false), (4, 2, false), (4, 4, true), (4, 2, true)]
        {
            check_ragged(&segs, heads, kv_heads, in_place);
        }
    }

    /// A decode step of many sequences is large enough to run them in
    /// parallel: each still gets its own rows' attention, in its place.
    #[test]
    fn many_sequences_attending_in_parallel_equal_the_tensor_ops() {
        let segs: Vec<Segment> = (0..48)
            .map(|i| Segment {
                start: i,
                len: 1,
                past: 40 + (i * 7) % 50,
            })
            .collect();
        let work: usize = segs.iter().map(|s| s.past + 1).sum::<usize>() * 4 * 8;
        assert!(
            work >= PARALLEL_WORK,
            "the batch is below the parallel threshold"
        );
        check_ragged(&segs, 4, 2, true);
        check_ragged(&segs, 4, 4, false);
    }

    /// Rows the batch does not have are named, not read.
    #[test]
    fn a_segment_outside_the_batch_is_refused() {
        let segs = [Segment {
            start: 1,
            len: 2,
            past: 0,
        }];
        let mut kv = MemKv {
            segs: segs.to_vec(),
            rows: vec![[Vec::new(), Vec::new()]],
            width: 8,
            in_place: false,
        };
        let dims = Heads {
            heads: 1,
            kv_heads: 1,
            hd: 8,
        };
        let rows = vec![0.5f32; 2 * 8];
        let err = attend_rows(&mut kv, 0, &segs, &rows, &rows, &rows, dims).unwrap_err();
        assert!(
            err.to_string().contains("rows 1..3 in a batch of 2"),
            "{err}"
        );
    }
}
