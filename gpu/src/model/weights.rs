//! The flat buffer seen as tensors. Inference builds plain tensors once per
//! weight version; training builds `Var`s so candle tracks gradients, and
//! reads those gradients back into the same flat layout. Which
//! architecture the tensors feed is the configuration's [`Arch`].

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};

use super::Model;
use super::config::{Arch, ModelConfig};
use super::decoder::DecoderWeights;
use super::gyre::GyreWeights;
use super::params::{ParamBuffer, ParamLayout};
use crate::error::ModelError;

/// A model's tensors, by architecture.
#[derive(Clone, Debug)]
pub enum Weights {
    Gyre(GyreWeights),
    Decoder(DecoderWeights),
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
        Self::assemble(cfg, &layout, &ts, data)
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
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        Ok((Self::assemble(cfg, &layout, &ts, &params.data)?, vars))
    }

    /// `ts` holds one tensor per layout spec, in layout order, made from
    /// `data`.
    fn assemble(
        cfg: &ModelConfig,
        layout: &ParamLayout,
        ts: &[Tensor],
        data: &[f32],
    ) -> Result<Self, ModelError> {
        Ok(match &cfg.arch {
            Arch::Gyre => Weights::Gyre(GyreWeights::assemble(cfg, layout, ts, data)),
            Arch::Decoder(a) => Weights::Decoder(DecoderWeights::assemble(cfg, a, layout, ts)?),
        })
    }

    /// The architecture's arithmetic.
    pub fn model(&self) -> &dyn Model {
        match self {
            Weights::Gyre(w) => w,
            Weights::Decoder(w) => w,
        }
    }

    pub fn cfg(&self) -> &ModelConfig {
        self.model().config()
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

/// A buffer of the layout's length (parameters or gradients).
pub(super) fn check_len(layout: &ParamLayout, data: &[f32]) -> Result<(), ModelError> {
    if data.len() != layout.total {
        return Err(ModelError::Length {
            expected: layout.total,
            got: data.len(),
        });
    }
    Ok(())
}
