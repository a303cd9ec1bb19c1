//! Llama-family decoders as Hugging Face defines them (`LlamaForCausalLM`,
//! `Qwen3ForCausalLM`): token embedding, pre-norm blocks of RMSNorm,
//! grouped-query attention with RoPE (Qwen3 first normalises each head's
//! queries and keys), a SwiGLU MLP, a final RMSNorm and an output head
//! that is either its own matrix or the tied embedding. Parameters keep
//! the checkpoint's names and PyTorch shapes (`Linear` weights are
//! [out, in], applied as `x · Wᵀ`).

use std::collections::HashMap;

use candle_core::{Device, Tensor};

use super::Model;
use super::config::{DecoderArch, Family, ModelConfig};
use super::forward::{
    KvStore, Segment, attend_ragged, check_batch, ragged_positions, rms_norm_eps, wanted_logits,
};
use super::fused_attention::causal_attention;
use super::params::ParamLayout;
use super::rope::{self, RopeTables};
use crate::error::ModelError;

/// A `Linear` layer: weight [out, in] and an optional bias [out].
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// x · Wᵀ (+ b) for x of rank 2 or 3 (a batch is flattened into one
    /// matrix product: one large GEMM instead of a batched strided one).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let y = match *x.dims() {
            [b, t, d] => x.reshape((b * t, d))?.matmul(&self.weight.t()?)?.reshape((
                b,
                t,
                self.weight.dim(0)?,
            ))?,
            _ => x.matmul(&self.weight.t()?)?,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

#[derive(Clone, Debug)]
pub struct DecoderLayer {
    pub input_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    /// Qwen3's per-head RMSNorm weights [head_dim].
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub post_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

#[derive(Clone, Debug)]
pub struct DecoderWeights {
    pub cfg: ModelConfig,
    pub arch: DecoderArch,
    pub embed: Tensor,
    pub layers: Vec<DecoderLayer>,
    pub norm: Tensor,
    /// [vocab, width]: the embedding itself when tied.
    pub lm_head: Tensor,
    pub rope: RopeTables,
}

impl DecoderWeights {
    /// `ts` holds one tensor per layout spec, in layout order.
    pub(super) fn assemble(
        cfg: &ModelConfig,
        arch: &DecoderArch,
        layout: &ParamLayout,
        ts: &[Tensor],
    ) -> Result<Self, ModelError> {
        let by_name: HashMap<&str, &Tensor> = layout
            .specs
            .iter()
            .map(|s| s.name.as_str())
            .zip(ts)
            .collect();
        let get = |name: &str| -> Result<Tensor, ModelError> {
            by_name
                .get(name)
                .map(|t| (*t).clone())
                .ok_or_else(|| ModelError::Config(format!("layout has no tensor {name}")))
        };
        let linear = |p: &str, bias: bool| -> Result<Linear, ModelError> {
            Ok(Linear {
                weight: get(&format!("{p}.weight"))?,
                bias: if bias {
                    Some(get(&format!("{p}.bias"))?)
                } else {
                    None
                },
            })
        };
        let qwen = arch.family == Family::Qwen3;
        let ab = arch.attention_bias;
        let layers = (0..cfg.layers)
            .map(|l| {
                let p = format!("model.layers.{l}");
                Ok(DecoderLayer {
                    input_norm: get(&format!("{p}.input_layernorm.weight"))?,
                    q: linear(&format!("{p}.self_attn.q_proj"), ab)?,
                    k: linear(&format!("{p}.self_attn.k_proj"), ab)?,
                    v: linear(&format!("{p}.self_attn.v_proj"), ab)?,
                    o: linear(&format!("{p}.self_attn.o_proj"), false)?,
                    q_norm: qwen
                        .then(|| get(&format!("{p}.self_attn.q_norm.weight")))
                        .transpose()?,
                    k_norm: qwen
                        .then(|| get(&format!("{p}.self_attn.k_norm.weight")))
                        .transpose()?,
                    post_norm: get(&format!("{p}.post_attention_layernorm.weight"))?,
                    gate: linear(&format!("{p}.mlp.gate_proj"), false)?,
                    up: linear(&format!("{p}.mlp.up_proj"), false)?,
                    down: linear(&format!("{p}.mlp.down_proj"), false)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let embed = get("model.embed_tokens.weight")?;
        let lm_head = if arch.tie_embeddings {
            embed.clone()
        } else {
            get("lm_head.weight")?
        };
        Ok(DecoderWeights {
            cfg: cfg.clone(),
            arch: arch.clone(),
            norm: get("model.norm.weight")?,
            layers,
            embed,
            lm_head,
            rope: RopeTables::new(arch, cfg.context)?,
        })
    }

    fn norm(&self, x: &Tensor, g: &Tensor) -> Result<Tensor, ModelError> {
        rms_norm_eps(x, g, self.arch.norm_eps)
    }

    /// Projects normalised hidden states to per-head queries, keys and
    /// values ([.., heads, head_dim]), with Qwen3's q/k norm applied.
    fn qkv(&self, l: &DecoderLayer, h: &Tensor) -> Result<(Tensor, Tensor, Tensor), ModelError> {
        let hd = self.arch.head_dim;
        let split = |x: Tensor, heads: usize| -> Result<Tensor, ModelError> {
            let mut dims = x.dims().to_vec();
            dims.pop();
            dims.extend([heads, hd]);
            Ok(x.reshape(dims)?)
        };
        let mut q = split(l.q.forward(h)?, self.cfg.heads)?;
        let mut k = split(l.k.forward(h)?, self.arch.kv_heads)?;
        let v = split(l.v.forward(h)?, self.arch.kv_heads)?;
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            q = self.norm(&q, qn)?;
            k = self.norm(&k, kn)?;
        }
        Ok((q, k, v))
    }

    fn mlp(&self, l: &DecoderLayer, x: &Tensor) -> Result<Tensor, ModelError> {
        let h = self.norm(x, &l.post_norm)?;
        let act = super::fused::silu_mul(&l.gate.forward(&h)?, &l.up.forward(&h)?)?;
        l.down.forward(&act)
    }
}

impl Model for DecoderWeights {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn hidden_batch(&self, ids: &[u32], n: usize, t: usize) -> Result<Tensor, ModelError> {
        check_batch(&self.cfg, ids, n, t)?;
        let (d, hd) = (self.cfg.width, self.arch.head_dim);
        let idx = Tensor::from_slice(ids, n * t, &Device::Cpu)?;
        let mut x = self.embed.embedding(&idx)?.reshape((n, t, d))?;
        let cos = self.rope.cos.narrow(0, 0, t)?;
        let sin = self.rope.sin.narrow(0, 0, t)?;
        for l in &self.layers {
            let h = self.norm(&x, &l.input_norm)?;
            let (q, k, v) = self.qkv(l, &h)?;
            // [n, t, heads, hd] → [n, heads, t, hd]
            let q = rope::apply(&q.transpose(1, 2)?.contiguous()?, &cos, &sin)?;
            let k = rope::apply(&k.transpose(1, 2)?.contiguous()?, &cos, &sin)?;
            let v = v.transpose(1, 2)?.contiguous()?;
            let a = causal_attention(&q, &k, &v)?.transpose(1, 2)?.reshape((
                n,
                t,
                self.cfg.heads * hd,
            ))?;
            x = (x + l.o.forward(&a)?)?;
            x = (&x + self.mlp(l, &x)?)?;
        }
        Ok(x)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        Ok(self.norm(hidden, &self.norm)?.matmul(&self.lm_head.t()?)?)
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
        let (hd, kvh) = (self.arch.head_dim, self.arch.kv_heads);
        let total = tokens.len();
        let ids = Tensor::from_slice(tokens, total, &Device::Cpu)?;
        let pos = Tensor::from_vec(positions, total, &Device::Cpu)?;
        // [total, 1, hd]: one row of angles per token, shared by its heads.
        let cos = self.rope.cos.index_select(&pos, 0)?.unsqueeze(1)?;
        let sin = self.rope.sin.index_select(&pos, 0)?.unsqueeze(1)?;
        let mut x = self.embed.embedding(&ids)?;
        for (li, l) in self.layers.iter().enumerate() {
            let h = self.norm(&x, &l.input_norm)?;
            let (q, k, v) = self.qkv(l, &h)?;
            let q = rope::apply(&q, &cos, &sin)?;
            let k = rope::apply(&k, &cos, &sin)?.reshape((total, kvh * hd))?;
            let v = v.reshape((total, kvh * hd))?;
            let a = attend_ragged(kv, li, segs, &q, &k, &v, kvh)?;
            x = (x + l.o.forward(&a)?)?;
            x = (&x + self.mlp(l, &x)?)?;
        }
        wanted_logits(self, &x, want)
    }
}
