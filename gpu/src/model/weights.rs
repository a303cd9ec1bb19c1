//! The flat buffer seen as tensors. Inference builds plain tensors once per
//! weight version; training builds `Var`s so candle tracks gradients, and
//! reads those gradients back into the same flat layout.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};

use super::config::ModelConfig;
use super::params::{ParamBuffer, ParamLayout};
use crate::error::ModelError;

/// One block's tensors.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Tensor,
    pub wqkv: Tensor,
    pub wo: Tensor,
    pub mlp_norm: Tensor,
    pub w1: Tensor,
    pub w2: Tensor,
}

/// All tensors of the model, in layout order.
#[derive(Clone, Debug)]
pub struct Weights {
    pub cfg: ModelConfig,
    pub tok_emb: Tensor,
    pub pos_emb: Tensor,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Tensor,
    pub lm_head: Tensor,
}

impl Weights {
    /// Tensors copied from a flat buffer.
    pub fn from_flat(cfg: &ModelConfig, data: &[f32]) -> Result<Self, ModelError> {
        let layout = ParamLayout::new(cfg)?;
        check_len(&layout, data)?;
        let ts = layout
            .specs
            .iter()
            .map(|s| {
                Tensor::from_slice(
                    &data[s.offset..s.offset + s.len],
                    s.shape.as_slice(),
                    &Device::Cpu,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::assemble(cfg, ts))
    }

    /// Tensors backed by fresh `Var`s (returned in layout order) so that a
    /// backward pass yields a gradient for every parameter.
    pub fn vars(cfg: &ModelConfig, params: &ParamBuffer) -> Result<(Self, Vec<Var>), ModelError> {
        let layout = ParamLayout::new(cfg)?;
        params.check(&layout)?;
        let vars = layout
            .specs
            .iter()
            .map(|s| {
                Var::from_slice(
                    &params.data[s.offset..s.offset + s.len],
                    s.shape.as_slice(),
                    &Device::Cpu,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ts = vars.iter().map(|v| v.as_tensor().clone()).collect();
        Ok((Self::assemble(cfg, ts), vars))
    }

    /// `ts` holds one tensor per layout spec, in layout order.
    fn assemble(cfg: &ModelConfig, ts: Vec<Tensor>) -> Self {
        let at = |i: usize| ts[i].clone();
        let layers = (0..cfg.layers)
            .map(|l| {
                let b = 2 + 6 * l;
                LayerWeights {
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
        Weights {
            cfg: cfg.clone(),
            tok_emb: at(0),
            pos_emb: at(1),
            layers,
            final_norm: at(end),
            lm_head: at(end + 1),
        }
    }
}

/// Adds the gradient of every `Var` (layout order) into `out`; parameters
/// that did not take part in the loss contribute nothing.
pub fn add_grads(
    layout: &ParamLayout,
    vars: &[Var],
    grads: &GradStore,
    out: &mut [f32],
) -> Result<(), ModelError> {
    check_len(layout, out)?;
    for (s, v) in layout.specs.iter().zip(vars) {
        if let Some(g) = grads.get(v.as_tensor()) {
            let g = g.flatten_all()?.to_vec1::<f32>()?;
            for (o, x) in out[s.offset..s.offset + s.len].iter_mut().zip(g) {
                *o += x;
            }
        }
    }
    Ok(())
}

fn check_len(layout: &ParamLayout, data: &[f32]) -> Result<(), ModelError> {
    if data.len() != layout.total {
        return Err(ModelError::Length {
            expected: layout.total,
            got: data.len(),
        });
    }
    Ok(())
}
