//! The output end both architectures share: the final norm of the hidden
//! rows that predict a target, the output head, and the log-probability
//! of each target under the log-softmax, with the backward of all three.
//!
//! Only the target rows go through the head (as in the candle path), and
//! the softmax is never kept: the backward turns the saved logits into
//! their gradient in place, so a large vocabulary costs one [k, V] buffer.

use rayon::prelude::*;

use crate::model::fused::exp;

use super::{Batch, Grads};
use crate::error::ModelError;
use crate::model::kernels::{Mat, matmul, product, rms_norm, rms_norm_grad};
use crate::model::params::ParamView;

/// Where an architecture keeps its final norm and output head, and how:
/// Gyre's model keeps the head input-major [d, V] (`x · W`), a Hugging
/// Face decoder output-major [V, d] (`x · Wᵀ`, possibly the tied
/// embedding).
#[derive(Clone, Copy)]
pub(super) struct HeadParams {
    pub norm: &'static str,
    pub lm: &'static str,
    pub out_major: bool,
    pub eps: f64,
}

impl HeadParams {
    fn matrix<'a>(&self, p: &ParamView<'a>, d: usize, vocab: usize) -> Result<Mat<'a>, ModelError> {
        let data = p.get(self.lm)?;
        Ok(if self.out_major {
            Mat::new(data, vocab, d).t()
        } else {
            Mat::new(data, d, vocab)
        })
    }
}

pub(super) struct Head {
    at: HeadParams,
    d: usize,
    vocab: usize,
    /// The hidden rows of the targets, before and after the final norm.
    rows: Vec<f32>,
    normed: Vec<f32>,
    /// Logits [k, V] and, per row, its max and log-sum-exp.
    logits: Vec<f32>,
    shift: Vec<(f32, f32)>,
    tokens: Vec<u32>,
}

impl Head {
    /// log p(tokens[i] | row at[i] of `x`) for every target; `x` holds
    /// rows of `d`.
    pub fn forward(
        x: &[f32],
        (d, vocab): (usize, usize),
        b: &Batch,
        p: &ParamView,
        at: HeadParams,
    ) -> Result<(Head, Vec<f32>), ModelError> {
        let k = b.at.len();
        let mut rows = Vec::with_capacity(k * d);
        for &a in b.at {
            rows.extend_from_slice(&x[a * d..(a + 1) * d]);
        }
        let normed = rms_norm(&rows, p.get(at.norm)?, at.eps);
        let logits = product(Mat::new(&normed, k, d), at.matrix(p, d, vocab)?);
        // log softmax as the candle path composes it: diff = x − max,
        // lse = ln Σ exp(diff), log p = diff − lse.
        let shift: Vec<(f32, f32)> = logits
            .par_chunks_exact(vocab)
            .map(|l| {
                let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = l.iter().map(|&v| exp(v - max)).sum();
                (max, sum.ln())
            })
            .collect();
        let logp = logits
            .chunks_exact(vocab)
            .zip(&shift)
            .zip(b.tokens)
            .map(|((l, &(max, lse)), &tok)| (l[tok as usize] - max) - lse)
            .collect();
        let head = Head {
            at,
            d,
            vocab,
            rows,
            normed,
            logits,
            shift,
            tokens: b.tokens.to_vec(),
        };
        Ok((head, logp))
    }

    /// Given d loss / d log p of each target: the head's and the norm's
    /// gradients added into `g`, the hidden rows' added into `dx` at the
    /// rows `at` they came from.
    pub fn backward(
        mut self,
        p: &ParamView,
        g: &mut Grads,
        dlogp: &[f32],
        at: &[usize],
        dx: &mut [f32],
    ) -> Result<(), ModelError> {
        let (d, vocab, k) = (self.d, self.vocab, at.len());
        // d log p_tok / d logit_j = [j = tok] − softmax_j.
        self.logits
            .par_chunks_exact_mut(vocab)
            .zip(&self.shift)
            .zip(&self.tokens)
            .zip(dlogp)
            .for_each(|(((l, &(max, lse)), &tok), &g)| {
                for v in l.iter_mut() {
                    *v = -g * exp((*v - max) - lse);
                }
                l[tok as usize] += g;
            });
        let dl = Mat::new(&self.logits, k, vocab);
        let normed = Mat::new(&self.normed, k, d);
        if self.at.out_major {
            matmul(g.get(self.at.lm)?, dl.t(), normed, true);
        } else {
            matmul(g.get(self.at.lm)?, normed.t(), dl, true);
        }
        let d_normed = product(dl, self.at.matrix(p, d, vocab)?.t());
        let mut d_rows = vec![0f32; k * d];
        let norm = p.get(self.at.norm)?;
        let eps = self.at.eps;
        rms_norm_grad(
            &self.rows,
            norm,
            eps,
            &d_normed,
            &mut d_rows,
            g.get(self.at.norm)?,
        );
        for (r, &a) in d_rows.chunks_exact(d).zip(at) {
            for (o, &g) in dx[a * d..(a + 1) * d].iter_mut().zip(r) {
                *o += g;
            }
        }
        Ok(())
    }
}
