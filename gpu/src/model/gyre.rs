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
use super::kernels::{Mat, add, gelu, product, rms_norm as rms_norm_rows, split_cols};
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
            // The residual sums as products added afterwards, not added into
            // by the product: `gemm` adds into its destination in another
            // order for a single row, and a row's bits must not depend on
            // the rows batched beside it.
            add(
                &mut x,
                &product(Mat::new(&a, m, d), Mat::new(part(l, 2), d, d)),
            );
            let h2 = rms_norm_rows(&x, part(l, 3), NORM_EPS);
            let (g, _) = gelu(&product(Mat::new(&h2, m, d), Mat::new(part(l, 4), d, f)));
            add(
                &mut x,
                &product(Mat::new(&g, m, f), Mat::new(part(l, 5), f, d)),
            );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ParamBuffer, Weights};

    /// Each sequence's keys and values per layer, in Vecs.
    #[derive(Default)]
    struct LayeredKv {
        segs: Vec<Segment>,
        rows: std::collections::HashMap<(usize, usize), [Vec<f32>; 2]>,
    }

    impl KvStore for LayeredKv {
        fn load(&self, seg_ix: usize, layer: usize) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
            let [k, v] = self.rows.get(&(seg_ix, layer)).cloned().unwrap_or_default();
            Ok((k, v))
        }
        fn store(
            &mut self,
            seg_ix: usize,
            layer: usize,
            k: &[f32],
            v: &[f32],
        ) -> Result<(), ModelError> {
            let [ks, vs] = self.rows.entry((seg_ix, layer)).or_default();
            ks.extend_from_slice(k);
            vs.extend_from_slice(v);
            Ok(())
        }
    }

    /// Runs the sequences' `steps` (a batch of segments each, with `want`)
    /// from empty caches; the logits of every step.
    fn run(
        w: &GyreWeights,
        seqs: &[&[u32]],
        steps: &[(Vec<(usize, usize)>, usize)],
    ) -> Vec<Vec<f32>> {
        let mut kv = LayeredKv::default();
        let mut done = vec![0usize; seqs.len()];
        let mut out = Vec::new();
        for (parts, want_seq) in steps {
            let (mut tokens, mut segs, mut want) = (Vec::new(), Vec::new(), Vec::new());
            for &(seq, len) in parts {
                let start = tokens.len();
                tokens.extend_from_slice(&seqs[seq][done[seq]..done[seq] + len]);
                segs.push(Segment {
                    start,
                    len,
                    past: done[seq],
                });
                if seq == *want_seq {
                    want.push(start + len - 1);
                }
            }
            // The store's segment indices are this step's; map them to
            // the sequences' own rows.
            let mut step_kv = LayeredKv {
                segs: segs.clone(),
                rows: Default::default(),
            };
            for (si, &(seq, _)) in parts.iter().enumerate() {
                for l in 0..w.cfg.layers {
                    if let Some(r) = kv.rows.get(&(seq, l)) {
                        step_kv.rows.insert((si, l), r.clone());
                    }
                }
            }
            out.extend(
                w.forward_ragged(&tokens, &segs, &mut step_kv, &want)
                    .unwrap(),
            );
            for (si, &(seq, len)) in parts.iter().enumerate() {
                for l in 0..w.cfg.layers {
                    kv.rows.insert((seq, l), step_kv.rows[&(si, l)].clone());
                }
                done[seq] += len;
            }
            assert_eq!(step_kv.segs, segs);
        }
        out
    }

    /// A decode row's logits are the same bits alone (a one-row pass) as
    /// beside other rows: a `gyre serve` engine batches a run's calls
    /// otherwise than an in-process one, and the run's first update must
    /// come out the same (tests/train_serve.rs).
    #[test]
    fn a_rows_logits_do_not_depend_on_the_rows_beside_it() {
        let cfg = ModelConfig::tiny();
        let params = ParamBuffer::init(&cfg, 3).unwrap();
        let Weights::Gyre(w) = Weights::from_flat(&cfg, &params.data).unwrap() else {
            panic!("the tiny model is Gyre's");
        };
        let a: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 256).collect();
        let b: Vec<u32> = (0..9).map(|i| (i * 11 + 2) % 256).collect();
        // Prefill both, then decode a's next rows alone or beside b's.
        let alone = run(
            &w,
            &[&a, &b],
            &[
                (vec![(0, 5), (1, 5)], 0),
                (vec![(0, 1)], 0),
                (vec![(0, 1)], 0),
            ],
        );
        let beside = run(
            &w,
            &[&a, &b],
            &[
                (vec![(0, 5), (1, 5)], 0),
                (vec![(1, 1), (0, 1)], 0),
                (vec![(0, 1), (1, 1)], 0),
            ],
        );
        assert_eq!(alone, beside);
    }
}
