//! The output end both architectures share: the final norm of the hidden
//! rows that predict a target, the output head, and the log-probability
//! of each target under the log-softmax, with the backward of all three.
//!
//! Only the target rows go through the head (as in the candle path), and
//! the softmax is never kept: the backward turns the saved logits into
//! their gradient in place, so a large vocabulary costs one [k, V] buffer.

use rayon::prelude::*;

use crate::model::fused::exp;

use super::kernels::{Mat, matmul, product, rms_norm, rms_norm_grad};

/// The output head's matrix as the checkpoint stores it: Gyre's model
/// keeps it input-major [d, V] (`x · W`), a Hugging Face decoder
/// output-major [V, d] (`x · Wᵀ`, possibly the tied embedding).
#[derive(Clone, Copy)]
pub(super) struct HeadMatrix<'a> {
    pub data: &'a [f32],
    pub out_major: bool,
}

impl HeadMatrix<'_> {
    fn read(&self, d: usize, vocab: usize) -> Mat<'_> {
        if self.out_major {
            Mat::new(self.data, vocab, d).t()
        } else {
            Mat::new(self.data, d, vocab)
        }
    }
}

pub(super) struct Head {
    d: usize,
    vocab: usize,
    eps: f64,
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
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        x: &[f32],
        d: usize,
        at: &[usize],
        tokens: &[u32],
        norm: &[f32],
        eps: f64,
        lm: HeadMatrix,
        vocab: usize,
    ) -> (Head, Vec<f32>) {
        let k = at.len();
        let mut rows = vec![0f32; k * d];
        for (r, &a) in rows.chunks_exact_mut(d).zip(at) {
            r.copy_from_slice(&x[a * d..(a + 1) * d]);
        }
        let normed = rms_norm(&rows, norm, eps);
        let mut logits = vec![0f32; k * vocab];
        matmul(
            &mut logits,
            Mat::new(&normed, k, d),
            lm.read(d, vocab),
            false,
        );
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
            .zip(tokens)
            .map(|((l, &(max, lse)), &tok)| (l[tok as usize] - max) - lse)
            .collect();
        let head = Head {
            d,
            vocab,
            eps,
            rows,
            normed,
            logits,
            shift,
            tokens: tokens.to_vec(),
        };
        (head, logp)
    }

    /// Given d loss / d log p of each target: the head's and the norm's
    /// gradients added into `d_lm` and `d_norm`, the hidden rows' added
    /// into `dx` at the rows they came from.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        mut self,
        dlogp: &[f32],
        at: &[usize],
        norm: &[f32],
        lm: HeadMatrix,
        d_lm: &mut [f32],
        d_norm: &mut [f32],
        dx: &mut [f32],
    ) {
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
        if lm.out_major {
            matmul(d_lm, dl.t(), normed, true);
        } else {
            matmul(d_lm, normed.t(), dl, true);
        }
        let d_normed = product(dl, lm.read(d, vocab).t());
        let mut d_rows = vec![0f32; k * d];
        rms_norm_grad(&self.rows, norm, self.eps, &d_normed, &mut d_rows, d_norm);
        for (r, &a) in d_rows.chunks_exact(d).zip(at) {
            for (o, &g) in dx[a * d..(a + 1) * d].iter_mut().zip(r) {
                *o += g;
            }
        }
    }
}
