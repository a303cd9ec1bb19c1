//! Llama-family decoders (see [`crate::model::decoder`]): token embedding,
//! pre-norm blocks of RMSNorm, grouped-query attention with RoPE (Qwen3
//! normalises each head's queries and keys first) and optional biases, a
//! SwiGLU MLP, a final norm and an output-major head that may be the tied
//! embedding. `Linear` weights are [out, in], applied as `x · Wᵀ`.

use std::ops::Range;

use super::head::{Head, HeadParams};
use super::{Batch, Grads, Rows};
use crate::error::ModelError;
use crate::model::config::{DecoderArch, Family};
use crate::model::fused_attention::{self, Dims};
use crate::model::kernels::{
    Mat, add, concat_cols, from_heads, matmul, product, rms_norm, rms_norm_grad, rope, rope_grad,
    silu_mul, silu_mul_grad, split_cols, sum_rows, to_heads,
};
use crate::model::params::ParamView;
use crate::model::{ModelConfig, rope as rope_tables};

pub(super) struct Saved {
    d: usize,
    f: usize,
    heads: usize,
    arch: DecoderArch,
    cos: Vec<f32>,
    sin: Vec<f32>,
    layers: Vec<Layer>,
    head: Head,
}

/// One block's activations: its input, the attention's normed input,
/// Qwen3's queries and keys before their norm, the heads after the
/// rotation (head-major), the attention's output, the MLP's input and
/// normed input, silu of the gate with its slope, the up projection and
/// the product.
struct Layer {
    x: Vec<f32>,
    h1: Vec<f32>,
    q_raw: Vec<f32>,
    k_raw: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    x_mid: Vec<f32>,
    h2: Vec<f32>,
    silu: Vec<f32>,
    slope: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
}

fn name(l: usize, p: &str) -> String {
    format!("model.layers.{l}.{p}")
}

fn head(a: &DecoderArch) -> HeadParams {
    HeadParams {
        norm: "model.norm.weight",
        lm: if a.tie_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        },
        out_major: true,
        eps: a.norm_eps,
    }
}

/// `Linear` layers that read the same input (q, k and v; gate and up):
/// their prefixes and output widths.
struct Projections<'a> {
    layers: Vec<(String, usize)>,
    bias: bool,
    /// Where the weights lie when they are adjacent in the layout, in
    /// order, without biases between them: then they are one [Σ out, in]
    /// matrix, and the group is one product forward and two backward
    /// (a larger product instead of two or three small ones).
    fused: Option<Range<usize>>,
    p: &'a ParamView<'a>,
}

impl<'a> Projections<'a> {
    fn new(
        p: &'a ParamView<'a>,
        layers: Vec<(String, usize)>,
        bias: bool,
    ) -> Result<Self, ModelError> {
        let mut fused = None;
        if !bias {
            let ranges = layers
                .iter()
                .map(|(prefix, _)| p.layout.range(&format!("{prefix}.weight")))
                .collect::<Result<Vec<_>, _>>()?;
            if ranges.windows(2).all(|w| w[0].end == w[1].start) {
                fused = Some(ranges[0].start..ranges[ranges.len() - 1].end);
            }
        }
        Ok(Projections {
            layers,
            bias,
            fused,
            p,
        })
    }

    fn width(&self) -> usize {
        self.layers.iter().map(|(_, o)| o).sum()
    }

    /// x · Wᵀ (+ b) of each layer, over `m` rows of `din`.
    fn forward(&self, x: &[f32], m: usize, din: usize) -> Result<Vec<Vec<f32>>, ModelError> {
        if let Some(r) = &self.fused {
            let w = Mat::new(&self.p.params[r.clone()], self.width(), din);
            let y = product(Mat::new(x, m, din), w.t());
            let widths: Vec<usize> = self.layers.iter().map(|(_, o)| *o).collect();
            return Ok(split_cols(&y, m, &widths));
        }
        self.layers
            .iter()
            .map(|(prefix, dout)| {
                let w = Mat::new(self.p.get(&format!("{prefix}.weight"))?, *dout, din);
                let mut y = product(Mat::new(x, m, din), w.t());
                if self.bias {
                    let b = self.p.get(&format!("{prefix}.bias"))?;
                    for row in y.chunks_exact_mut(*dout) {
                        add(row, b);
                    }
                }
                Ok(y)
            })
            .collect()
    }

    /// Each layer's weight (and bias) gradient from its output gradient
    /// in `dys` and the input `x`; returns dx = Σ dy · W.
    fn backward(
        &self,
        g: &mut Grads,
        x: &[f32],
        dys: &[&[f32]],
        m: usize,
        din: usize,
    ) -> Result<Vec<f32>, ModelError> {
        if let Some(r) = &self.fused {
            let parts: Vec<(&[f32], usize)> = dys
                .iter()
                .zip(&self.layers)
                .map(|(dy, (_, o))| (*dy, *o))
                .collect();
            let dy = concat_cols(&parts, m);
            let dym = Mat::new(&dy, m, self.width());
            matmul(&mut g.grads[r.clone()], dym.t(), Mat::new(x, m, din), true);
            let w = Mat::new(&self.p.params[r.clone()], self.width(), din);
            return Ok(product(dym, w));
        }
        let mut dx = vec![0f32; m * din];
        for ((prefix, dout), dy) in self.layers.iter().zip(dys) {
            let w = format!("{prefix}.weight");
            let dym = Mat::new(dy, m, *dout);
            matmul(g.get(&w)?, dym.t(), Mat::new(x, m, din), true);
            if self.bias {
                sum_rows(dy, *dout, g.get(&format!("{prefix}.bias"))?);
            }
            matmul(&mut dx, dym, Mat::new(self.p.get(&w)?, *dout, din), true);
        }
        Ok(dx)
    }
}

/// The q, k and v projections of layer `l`.
fn qkv_of<'a>(
    p: &'a ParamView<'a>,
    l: usize,
    (qw, kw): (usize, usize),
    bias: bool,
) -> Result<Projections<'a>, ModelError> {
    let layers = [("q_proj", qw), ("k_proj", kw), ("v_proj", kw)]
        .into_iter()
        .map(|(proj, out)| (name(l, &format!("self_attn.{proj}")), out))
        .collect();
    Projections::new(p, layers, bias)
}

/// The gate and up projections of layer `l`.
fn mlp_of<'a>(p: &'a ParamView<'a>, l: usize, f: usize) -> Result<Projections<'a>, ModelError> {
    let layers = vec![(name(l, "mlp.gate_proj"), f), (name(l, "mlp.up_proj"), f)];
    Projections::new(p, layers, false)
}

/// The last of a group's outputs.
fn pop(v: &mut Vec<Vec<f32>>) -> Result<Vec<f32>, ModelError> {
    v.pop()
        .ok_or_else(|| ModelError::Config("a projection group came back short".into()))
}

/// The down projection's gradients: dW += dyᵀ · x, and dy · W.
fn down_grad(
    p: &ParamView,
    g: &mut Grads,
    name: &str,
    x: &[f32],
    dy: &[f32],
    (m, din, dout): (usize, usize, usize),
) -> Result<Vec<f32>, ModelError> {
    let dym = Mat::new(dy, m, dout);
    matmul(g.get(name)?, dym.t(), Mat::new(x, m, din), true);
    Ok(product(dym, Mat::new(p.get(name)?, dout, din)))
}

pub(super) fn forward(
    cfg: &ModelConfig,
    arch: &DecoderArch,
    p: &ParamView,
    b: &Batch,
) -> Result<(Saved, Vec<f32>), ModelError> {
    let (d, f, heads, hd) = (cfg.width, cfg.ffn, cfg.heads, arch.head_dim);
    let (kvh, eps, bias) = (arch.kv_heads, arch.norm_eps, arch.attention_bias);
    let qwen = arch.family == Family::Qwen3;
    let (n, t) = (b.n, b.t);
    let m = n * t;
    let (qw, kw) = (heads * hd, kvh * hd);
    let attn = Dims {
        heads,
        kv_heads: kvh,
        t,
        hd,
    };
    let (cos, sin) = rope_tables::angles(arch, t);
    let embed = p.get("model.embed_tokens.weight")?;
    let mut x = vec![0f32; m * d];
    for (row, &id) in x.chunks_exact_mut(d).zip(b.ids) {
        let id = id as usize;
        row.copy_from_slice(&embed[id * d..(id + 1) * d]);
    }
    let mut layers = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        let h1 = rms_norm(&x, p.get(&name(l, "input_layernorm.weight"))?, eps);
        let mut qkv = qkv_of(p, l, (qw, kw), bias)?.forward(&h1, m, d)?;
        let (v, k_raw, q_raw) = (pop(&mut qkv)?, pop(&mut qkv)?, pop(&mut qkv)?);
        let (mut q, mut k) = if qwen {
            (
                rms_norm(&q_raw, p.get(&name(l, "self_attn.q_norm.weight"))?, eps),
                rms_norm(&k_raw, p.get(&name(l, "self_attn.k_norm.weight"))?, eps),
            )
        } else {
            (q_raw.clone(), k_raw.clone())
        };
        rope(&mut q, qw, t, &cos, &sin, hd);
        rope(&mut k, kw, t, &cos, &sin, hd);
        let (q, k, v) = (
            to_heads(&q, qw, 0, (n, t, heads, hd)),
            to_heads(&k, kw, 0, (n, t, kvh, hd)),
            to_heads(&v, kw, 0, (n, t, kvh, hd)),
        );
        let o = fused_attention::forward(attn, &q, &k, &v);
        let a = from_heads(&[(&o, heads)], (n, t, hd));
        let mut x_mid = x.clone();
        let wo = Mat::new(p.get(&name(l, "self_attn.o_proj.weight"))?, d, qw);
        matmul(&mut x_mid, Mat::new(&a, m, qw), wo.t(), true);
        let h2 = rms_norm(
            &x_mid,
            p.get(&name(l, "post_attention_layernorm.weight"))?,
            eps,
        );
        let mut gu = mlp_of(p, l, f)?.forward(&h2, m, d)?;
        let (up, gate) = (pop(&mut gu)?, pop(&mut gu)?);
        let (act, silu, slope) = silu_mul(&gate, &up);
        let mut out = x_mid.clone();
        let wd = Mat::new(p.get(&name(l, "mlp.down_proj.weight"))?, d, f);
        matmul(&mut out, Mat::new(&act, m, f), wd.t(), true);
        layers.push(Layer {
            x: std::mem::replace(&mut x, out),
            h1,
            q_raw: if qwen { q_raw } else { Vec::new() },
            k_raw: if qwen { k_raw } else { Vec::new() },
            q,
            k,
            v,
            a,
            x_mid,
            h2,
            silu,
            slope,
            up,
            act,
        });
    }
    let (head, logp) = Head::forward(&x, (d, cfg.vocab), b, p, head(arch))?;
    let saved = Saved {
        d,
        f,
        heads,
        arch: arch.clone(),
        cos,
        sin,
        layers,
        head,
    };
    Ok((saved, logp))
}

pub(super) fn backward(
    s: Saved,
    p: &ParamView,
    mut g: Grads,
    rows: Rows,
    dlogp: &[f32],
) -> Result<(), ModelError> {
    let (d, f, heads, t) = (s.d, s.f, s.heads, rows.t);
    let a = &s.arch;
    let (hd, kvh, eps, bias) = (a.head_dim, a.kv_heads, a.norm_eps, a.attention_bias);
    let qwen = a.family == Family::Qwen3;
    let m = rows.ids.len();
    let n = m / t;
    let (qw, kw) = (heads * hd, kvh * hd);
    let attn = Dims {
        heads,
        kv_heads: kvh,
        t,
        hd,
    };
    let mut dx = vec![0f32; m * d];
    s.head.backward(p, &mut g, dlogp, rows.at, &mut dx)?;
    for (l, y) in s.layers.into_iter().enumerate().rev() {
        // x_out = x_mid + down(silu(gate(h2)) ∘ up(h2))
        let down = name(l, "mlp.down_proj.weight");
        let mut dact = down_grad(p, &mut g, &down, &y.act, &dx, (m, f, d))?;
        let dup = silu_mul_grad(&y.silu, &y.slope, &y.up, &mut dact);
        let dh = mlp_of(p, l, f)?.backward(&mut g, &y.h2, &[&dact, &dup], m, d)?;
        let post = name(l, "post_attention_layernorm.weight");
        rms_norm_grad(&y.x_mid, p.get(&post)?, eps, &dh, &mut dx, g.get(&post)?);
        // x_mid = x + o(attention(rope(norm(q(h1))), rope(norm(k(h1))), v(h1)))
        let o = name(l, "self_attn.o_proj.weight");
        let da = down_grad(p, &mut g, &o, &y.a, &dx, (m, qw, d))?;
        let dout = to_heads(&da, qw, 0, (n, t, heads, hd));
        let (dqh, dkh, dvh) = fused_attention::gradients(attn, &y.q, &y.k, &y.v, &dout);
        let (mut dq, mut dk, dv) = (
            from_heads(&[(&dqh, heads)], (n, t, hd)),
            from_heads(&[(&dkh, kvh)], (n, t, hd)),
            from_heads(&[(&dvh, kvh)], (n, t, hd)),
        );
        rope_grad(&mut dq, qw, t, &s.cos, &s.sin, hd);
        rope_grad(&mut dk, kw, t, &s.cos, &s.sin, hd);
        if qwen {
            let (mut dq_raw, mut dk_raw) = (vec![0f32; m * qw], vec![0f32; m * kw]);
            let qn = name(l, "self_attn.q_norm.weight");
            rms_norm_grad(&y.q_raw, p.get(&qn)?, eps, &dq, &mut dq_raw, g.get(&qn)?);
            let kn = name(l, "self_attn.k_norm.weight");
            rms_norm_grad(&y.k_raw, p.get(&kn)?, eps, &dk, &mut dk_raw, g.get(&kn)?);
            (dq, dk) = (dq_raw, dk_raw);
        }
        let qkv = qkv_of(p, l, (qw, kw), bias)?;
        let dh = qkv.backward(&mut g, &y.h1, &[&dq, &dk, &dv], m, d)?;
        let input = name(l, "input_layernorm.weight");
        rms_norm_grad(&y.x, p.get(&input)?, eps, &dh, &mut dx, g.get(&input)?);
    }
    let d_embed = g.get("model.embed_tokens.weight")?;
    for (row, &id) in dx.chunks_exact(d).zip(rows.ids) {
        let id = id as usize;
        add(&mut d_embed[id * d..(id + 1) * d], row);
    }
    Ok(())
}
