//! The trainer's forward and backward pass, written by hand over the flat
//! parameter buffer for both architectures.
//!
//! Through candle's autograd a training step paid, per node of the graph,
//! a zeroed gradient tensor it then added into, a copy for every transpose
//! and head split, batched products of one small matrix per row, and a
//! final copy of every parameter's gradient into the flat buffer. Here
//! each linear layer is one matrix product over all rows of the batch, a
//! parameter's gradient is added by its product straight into the flat
//! gradient buffer, and the residual stream's gradient is one buffer that
//! every branch adds into. The arithmetic of every op is the candle
//! path's (the same norms, activations, attention kernel and softmax), so
//! the engine's recorded log-probs still equal the trainer's; the tests
//! check values and gradients against candle's autograd of the same
//! model.
//!
//! The products, norms and activations on slices are
//! [`crate::model::kernels`], which the engine's decoding shares.
//!
//! - [`head`]: final norm, output head and log-softmax;
//! - [`gyre_pass`], [`decoder_pass`]: the two architectures' blocks.

mod decoder_pass;
mod gyre_pass;
mod head;

use super::config::{Arch, ModelConfig};
use super::forward::{check_batch, check_vocab};
use super::params::{ParamLayout, ParamView};
use super::weights::check_len;
use crate::error::ModelError;

/// Teacher-forced targets over right-padded rows: `ids` is `n` rows of `t`
/// tokens; target `i` is predicted by the hidden row `at[i]` (in
/// `0..n·t`) and is the token `tokens[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub ids: &'a [u32],
    pub n: usize,
    pub t: usize,
    pub at: &'a [usize],
    pub tokens: &'a [u32],
}

/// A forward pass that kept what its backward needs.
pub struct TrainPass {
    logp: Vec<f32>,
    saved: Saved,
    at: Vec<usize>,
    ids: Vec<u32>,
    t: usize,
}

enum Saved {
    Gyre(gyre_pass::Saved),
    Decoder(decoder_pass::Saved),
}

impl std::fmt::Debug for TrainPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainPass")
            .field("targets", &self.logp.len())
            .finish_non_exhaustive()
    }
}

impl TrainPass {
    /// The targets' log-probs under `params`, keeping the activations.
    pub fn forward(
        cfg: &ModelConfig,
        layout: &ParamLayout,
        params: &[f32],
        batch: &Batch,
    ) -> Result<Self, ModelError> {
        check_batch(cfg, batch.ids, batch.n, batch.t)?;
        check_len(layout, params)?;
        if batch.n == 0 || batch.t == 0 {
            return Err(ModelError::Config(format!(
                "an empty batch ({} rows of {} tokens)",
                batch.n, batch.t
            )));
        }
        let rows = batch.n * batch.t;
        if batch.at.len() != batch.tokens.len() {
            return Err(ModelError::Config(format!(
                "{} target rows for {} target tokens",
                batch.at.len(),
                batch.tokens.len()
            )));
        }
        if let Some(a) = batch.at.iter().find(|&&a| a >= rows) {
            return Err(ModelError::Config(format!(
                "a target is predicted by row {a} of a batch of {rows}"
            )));
        }
        check_vocab(cfg, batch.tokens)?;
        let p = ParamView { layout, params };
        let (saved, logp) = match &cfg.arch {
            Arch::Gyre => {
                let (s, l) = gyre_pass::forward(cfg, &p, batch)?;
                (Saved::Gyre(s), l)
            }
            Arch::Decoder(a) => {
                let (s, l) = decoder_pass::forward(cfg, a, &p, batch)?;
                (Saved::Decoder(s), l)
            }
        };
        Ok(TrainPass {
            logp,
            saved,
            at: batch.at.to_vec(),
            ids: batch.ids.to_vec(),
            t: batch.t,
        })
    }

    /// log π(token | context) of each target, in the batch's order.
    pub fn logprobs(&self) -> &[f32] {
        &self.logp
    }

    /// Adds into `grads` (the flat layout) the gradient of Σ dlogp_i ·
    /// log p_i, with the parameters the forward pass ran on.
    pub fn backward(
        self,
        layout: &ParamLayout,
        params: &[f32],
        dlogp: &[f32],
        grads: &mut [f32],
    ) -> Result<(), ModelError> {
        check_len(layout, params)?;
        check_len(layout, grads)?;
        if dlogp.len() != self.logp.len() {
            return Err(ModelError::Length {
                expected: self.logp.len(),
                got: dlogp.len(),
            });
        }
        let p = ParamView { layout, params };
        let g = Grads { layout, grads };
        let rows = Rows {
            ids: &self.ids,
            t: self.t,
            at: &self.at,
        };
        match self.saved {
            Saved::Gyre(s) => gyre_pass::backward(s, &p, g, rows, dlogp),
            Saved::Decoder(s) => decoder_pass::backward(s, &p, g, rows, dlogp),
        }
    }
}

/// What the backward pass needs of the batch.
struct Rows<'a> {
    ids: &'a [u32],
    t: usize,
    at: &'a [usize],
}

/// The flat gradient buffer by name.
struct Grads<'a> {
    layout: &'a ParamLayout,
    grads: &'a mut [f32],
}

impl Grads<'_> {
    fn get(&mut self, name: &str) -> Result<&mut [f32], ModelError> {
        let r = self.layout.range(name)?;
        Ok(&mut self.grads[r])
    }
}

#[cfg(test)]
mod tests;
