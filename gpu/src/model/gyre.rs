//! Gyre's own transformer: pre-norm blocks (RMSNorm, causal multi-head
//! attention with a fused QKV projection, GELU MLP), learned positions, an
//! untied head, over the byte vocabulary. Small and fast to train on CPU;
//! the default policy of `gyre train`.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::Model;
use super::config::ModelConfig;
use super::forward::{KvStore, Segment, check_batch, ragged_positions, rms_norm_eps};
use super::fused_attention::causal_attention;
use super::kernels::{Mat, gelu, matmul, product, rms_norm as rms_norm_rows, split_cols};
use super::params::ParamLayout;
use super::ragged_attention::{Heads, attend_rows};
use crate::error::ModelError;

const NORM_EPS: f64 = 1e-5;

fn rms_norm(x: &Tensor, g: &Tensor) -> Result<Tensor, ModelError> {
    rms_norm_eps(x, g, NORM_EPS)
}

/// One block's tensors.
#[derive(Clone, Debug)]
pub struct GyreLayer {
    pub attn_norm: Tensor,
    pub wqkv: Tensor,
    pub wo: Tensor,
    pub mlp_norm: Tensor,
    pub w1: Tensor,
    pub w2: Tensor,
}

/// All tensors of the model, in layout order, and the flat buffer they
/// were made from: the engine's decoding runs on the buffer's slices
/// (see [`Model::forward_ragged`] below), the tensors are the teacher
/// forcing the tests check the trainer's pass against.
#[derive(Clone)]
pub struct GyreWeights {
    pub cfg: ModelConfig,
    /// Each tensor's place in `flat`, in layout order (found once: a
    /// one-token decode step is short enough for lookups by name to show).
    ranges: Arc<[Range<usize>]>,
    flat: Arc<[f32]>,
    pub tok_emb: Tensor,
    pub pos_emb: Tensor,
    pub layers: Vec<GyreLayer>,
    pub final_norm: Tensor,
    pub lm_head: Tensor,
}

impl std::fmt::Debug for GyreWeights {
    /// The configuration, not the floats.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GyreWeights")
            .field("cfg", &self.cfg)
            .field("floats", &self.flat.len())
            .finish_non_exhaustive()
    }
}

impl GyreWeights {
    /// `ts` holds one tensor per layout spec, in layout order, made from
    /// `flat`.
    pub(super) fn assemble(
        cfg: &ModelConfig,
        layout: &ParamLayout,
        ts: &[Tensor],
        flat: &[f32],
    ) -> Self {
        let at = |i: usize| ts[i].clone();
        let layers = (0..cfg.layers)
            .map(|l| {
                let b = 2 + 6 * l;
                GyreLayer {
                    attn_norm: at(b),
                    wqkv: at(b + 1),
                    wo: at(b + 2),
                    mlp_norm: at(b + 3),
                    w1: at(b + 4),
                    w2: at(b + 5),
                }
            })
            .collect();
        let end = 2 + 6 * cfg.layers;
        GyreWeights {
            cfg: cfg.clone(),
            ranges: layout
                .specs
                .iter()
                .map(|s| s.offset..s.offset + s.len)
                .collect(),
            flat: flat.into(),
            tok_emb: at(0),
            pos_emb: at(1),
            layers,
            final_norm: at(end),
            lm_head: at(end + 1),
        }
    }
}

fn mlp(l: &GyreLayer, x: &Tensor) -> Result<Tensor, ModelError> {
    let h = rms_norm(x, &l.mlp_norm)?;
    let a = super::fused::gelu_erf(&h.broadcast_matmul(&l.w1)?)?;
    Ok(a.broadcast_matmul(&l.w2)?)
}

impl Model for GyreWeights {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn hidden_batch(&self, ids: &[u32], n: usize, t: usize) -> Result<Tensor, ModelError> {
        check_batch(&self.cfg, ids, n, t)?;
        let (d, h) = (self.cfg.width, self.cfg.heads);
        let hd = self.cfg.head_dim();
        let idx = Tensor::from_slice(ids, n * t, &Device::Cpu)?;
        let x = self.tok_emb.embedding(&idx)?.reshape((n, t, d))?;
        let mut x = x.broadcast_add(&self.pos_emb.narrow(0, 0, t)?)?;
        for l in &self.layers {
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
            let a = causal_attention(&q, &k, &v)?
                .transpose(1, 2)?
                .reshape((n, t, d))?;
            x = (x + a.broadcast_matmul(&l.wo)?)?;
            x = (&x + mlp(l, &x)?)?;
        }
        Ok(x)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        Ok(rms_norm(hidden, &self.final_norm)?.matmul(&self.lm_head)?)
    }

    /// On the flat buffer's slices, with the trainer's kernels: a decode
    /// step is a few rows per sequence, and as candle tensor ops its time
    /// went to dispatching small ops and handing each product to rayon's
    /// pool and back, not to arithmetic.
    fn forward_ragged(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        kv: &mut dyn KvStore,
        want: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let positions = ragged_positions(&self.cfg, tokens, segs, want)?;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let cfg = &self.cfg;
        let (d, f, m) = (cfg.width, cfg.ffn, tokens.len());
        let dims = Heads {
            heads: cfg.heads,
            kv_heads: cfg.heads,
            hd: cfg.head_dim(),
        };
        // Layout order: the two embeddings, six tensors per block (as in
        // `assemble`), the final norm and the head.
        let at = |i: usize| &self.flat[self.ranges[i].clone()];
        let part = |l: usize, i: usize| at(2 + 6 * l + i);
        let (tok, pos) = (at(0), at(1));
        let mut x = Vec::with_capacity(m * d);
        for (&id, &at) in tokens.iter().zip(&positions) {
            let (e, q) = (&tok[id as usize * d..][..d], &pos[at as usize * d..][..d]);
            x.extend(e.iter().zip(q).map(|(e, q)| e + q));
        }
        for l in 0..cfg.layers {
            let h1 = rms_norm_rows(&x, part(l, 0), NORM_EPS);
            let wqkv = Mat::new(part(l, 1), d, 3 * d);
            let qkv = split_cols(&product(Mat::new(&h1, m, d), wqkv), m, &[d, d, d]);
            let a = attend_rows(kv, l, segs, &qkv[0], &qkv[1], &qkv[2], dims)?;
            matmul(&mut x, Mat::new(&a, m, d), Mat::new(part(l, 2), d, d), true);
            let h2 = rms_norm_rows(&x, part(l, 3), NORM_EPS);
            let (g, _) = gelu(&product(Mat::new(&h2, m, d), Mat::new(part(l, 4), d, f)));
            matmul(&mut x, Mat::new(&g, m, f), Mat::new(part(l, 5), f, d), true);
        }
        if want.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows = Vec::with_capacity(want.len() * d);
        for &r in want {
            rows.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
        let end = 2 + 6 * cfg.layers;
        let hn = rms_norm_rows(&rows, at(end), NORM_EPS);
        let head = Mat::new(at(end + 1), d, cfg.vocab);
        let logits = product(Mat::new(&hn, want.len(), d), head);
        Ok(logits
            .chunks_exact(cfg.vocab)
            .map(<[f32]>::to_vec)
            .collect())
    }
}
