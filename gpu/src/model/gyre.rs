//! Gyre's own transformer: pre-norm blocks (RMSNorm, causal multi-head
//! attention with a fused QKV projection, GELU MLP), learned positions, an
//! untied head, over the byte vocabulary. Small and fast to train on CPU;
//! the default policy of `gyre train`.

use candle_core::{Device, Tensor};

use super::Model;
use super::config::ModelConfig;
use super::forward::{
    KvStore, Segment, attend_ragged, check_batch, ragged_positions, rms_norm_eps, wanted_logits,
};
use super::fused_attention::causal_attention;
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

/// All tensors of the model, in layout order.
#[derive(Clone, Debug)]
pub struct GyreWeights {
    pub cfg: ModelConfig,
    pub tok_emb: Tensor,
    pub pos_emb: Tensor,
    pub layers: Vec<GyreLayer>,
    pub final_norm: Tensor,
    pub lm_head: Tensor,
}

impl GyreWeights {
    /// `ts` holds one tensor per layout spec, in layout order.
    pub(super) fn assemble(cfg: &ModelConfig, ts: &[Tensor]) -> Self {
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
        let (d, h) = (self.cfg.width, self.cfg.heads);
        let hd = self.cfg.head_dim();
        let total = tokens.len();
        let ids = Tensor::from_slice(tokens, total, &Device::Cpu)?;
        let pos = Tensor::from_vec(positions, total, &Device::Cpu)?;
        let mut x = (self.tok_emb.embedding(&ids)? + self.pos_emb.embedding(&pos)?)?;
        for (li, l) in self.layers.iter().enumerate() {
            let hn = rms_norm(&x, &l.attn_norm)?;
            let qkv = hn.matmul(&l.wqkv)?;
            let (q, k, v) = (
                qkv.narrow(1, 0, d)?,
                qkv.narrow(1, d, d)?,
                qkv.narrow(1, 2 * d, d)?,
            );
            let q = q.reshape((total, h, hd))?;
            let a = attend_ragged(kv, li, segs, &q, &k.contiguous()?, &v.contiguous()?, h)?;
            x = (x + a.matmul(&l.wo)?)?;
            x = (&x + mlp(l, &x)?)?;
        }
        wanted_logits(self, &x, want)
    }
}
