//! Gyre's own transformer (see [`crate::model::gyre`]): token and learned
//! position embeddings, pre-norm blocks of RMSNorm, attention with a
//! fused QKV projection and a GELU MLP, a final norm and an untied
//! input-major head.

use super::head::{Head, HeadParams};
use super::{Batch, Grads, Rows};
use crate::error::ModelError;
use crate::model::ModelConfig;
use crate::model::fused_attention::{self, Dims};
use crate::model::kernels::{
    Mat, from_heads, gelu, matmul, product, rms_norm, rms_norm_grad, scale_by, to_heads,
};
use crate::model::params::ParamView;

/// The norm's ε, as [`crate::model::gyre`] has it.
const NORM_EPS: f64 = 1e-5;

const HEAD: HeadParams = HeadParams {
    norm: "final_norm",
    lm: "lm_head",
    out_major: false,
    eps: NORM_EPS,
};

pub(super) struct Saved {
    d: usize,
    f: usize,
    heads: usize,
    layers: Vec<Layer>,
    head: Head,
}

/// One block's activations: its input, the attention's normed input, the
/// heads (head-major), the attention's output, the MLP's input and
/// normed input, the activation and its slope.
struct Layer {
    x: Vec<f32>,
    h1: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    x_mid: Vec<f32>,
    h2: Vec<f32>,
    g: Vec<f32>,
    slope: Vec<f32>,
}

fn name(l: usize, p: &str) -> String {
    format!("layers.{l}.{p}")
}

pub(super) fn forward(
    cfg: &ModelConfig,
    p: &ParamView,
    b: &Batch,
) -> Result<(Saved, Vec<f32>), ModelError> {
    let (d, f, heads) = (cfg.width, cfg.ffn, cfg.heads);
    let hd = cfg.head_dim();
    let (n, t) = (b.n, b.t);
    let m = n * t;
    let dims = (n, t, heads, hd);
    let attn = Dims {
        heads,
        kv_heads: heads,
        t,
        hd,
    };
    let (tok, pos) = (p.get("tok_emb")?, p.get("pos_emb")?);
    let mut x = vec![0f32; m * d];
    for (r, row) in x.chunks_exact_mut(d).enumerate() {
        let (id, i) = (b.ids[r] as usize, r % t);
        let (e, q) = (&tok[id * d..(id + 1) * d], &pos[i * d..(i + 1) * d]);
        for ((o, &e), &q) in row.iter_mut().zip(e).zip(q) {
            *o = e + q;
        }
    }
    let mut layers = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        let h1 = rms_norm(&x, p.get(&name(l, "attn_norm"))?, NORM_EPS);
        let wqkv = Mat::new(p.get(&name(l, "wqkv"))?, d, 3 * d);
        let qkv = product(Mat::new(&h1, m, d), wqkv);
        let (q, k, v) = (
            to_heads(&qkv, 3 * d, 0, dims),
            to_heads(&qkv, 3 * d, d, dims),
            to_heads(&qkv, 3 * d, 2 * d, dims),
        );
        let o = fused_attention::forward(attn, &q, &k, &v);
        let a = from_heads(&[(&o, heads)], (n, t, hd));
        let mut x_mid = x.clone();
        let wo = Mat::new(p.get(&name(l, "wo"))?, d, d);
        matmul(&mut x_mid, Mat::new(&a, m, d), wo, true);
        let h2 = rms_norm(&x_mid, p.get(&name(l, "mlp_norm"))?, NORM_EPS);
        let w1 = Mat::new(p.get(&name(l, "w1"))?, d, f);
        let u = product(Mat::new(&h2, m, d), w1);
        let (g, slope) = gelu(&u);
        let mut out = x_mid.clone();
        let w2 = Mat::new(p.get(&name(l, "w2"))?, f, d);
        matmul(&mut out, Mat::new(&g, m, f), w2, true);
        layers.push(Layer {
            x: std::mem::replace(&mut x, out),
            h1,
            q,
            k,
            v,
            a,
            x_mid,
            h2,
            g,
            slope,
        });
    }
    let (head, logp) = Head::forward(&x, (d, cfg.vocab), b, p, HEAD)?;
    let saved = Saved {
        d,
        f,
        heads,
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
    let m = rows.ids.len();
    let (n, hd) = (m / t, d / heads);
    let dims = (n, t, heads, hd);
    let attn = Dims {
        heads,
        kv_heads: heads,
        t,
        hd,
    };
    let mut dx = vec![0f32; m * d];
    s.head.backward(p, &mut g, dlogp, rows.at, &mut dx)?;
    for (l, a) in s.layers.into_iter().enumerate().rev() {
        // x_out = x_mid + gelu(h2 · w1) · w2
        let dxm = Mat::new(&dx, m, d);
        matmul(g.get(&name(l, "w2"))?, Mat::new(&a.g, m, f).t(), dxm, true);
        let mut du = product(dxm, Mat::new(p.get(&name(l, "w2"))?, f, d).t());
        scale_by(&mut du, &a.slope);
        matmul(
            g.get(&name(l, "w1"))?,
            Mat::new(&a.h2, m, d).t(),
            Mat::new(&du, m, f),
            true,
        );
        let w1 = Mat::new(p.get(&name(l, "w1"))?, d, f);
        let mut dh = product(Mat::new(&du, m, f), w1.t());
        rms_norm_grad(
            &a.x_mid,
            p.get(&name(l, "mlp_norm"))?,
            NORM_EPS,
            &dh,
            &mut dx,
            g.get(&name(l, "mlp_norm"))?,
        );
        // x_mid = x + attention(h1 · wqkv) · wo
        let dxm = Mat::new(&dx, m, d);
        matmul(g.get(&name(l, "wo"))?, Mat::new(&a.a, m, d).t(), dxm, true);
        let da = product(dxm, Mat::new(p.get(&name(l, "wo"))?, d, d).t());
        let dout = to_heads(&da, d, 0, dims);
        let (dq, dk, dv) = fused_attention::gradients(attn, &a.q, &a.k, &a.v, &dout);
        let dqkv = from_heads(&[(&dq, heads), (&dk, heads), (&dv, heads)], (n, t, hd));
        let dqkv = Mat::new(&dqkv, m, 3 * d);
        matmul(
            g.get(&name(l, "wqkv"))?,
            Mat::new(&a.h1, m, d).t(),
            dqkv,
            true,
        );
        let wqkv = Mat::new(p.get(&name(l, "wqkv"))?, d, 3 * d);
        matmul(&mut dh, dqkv, wqkv.t(), false);
        rms_norm_grad(
            &a.x,
            p.get(&name(l, "attn_norm"))?,
            NORM_EPS,
            &dh,
            &mut dx,
            g.get(&name(l, "attn_norm"))?,
        );
    }
    let d_tok = g.get("tok_emb")?;
    for (row, &id) in dx.chunks_exact(d).zip(rows.ids) {
        let id = id as usize;
        for (o, &v) in d_tok[id * d..(id + 1) * d].iter_mut().zip(row) {
            *o += v;
        }
    }
    let d_pos = g.get("pos_emb")?;
    for (r, row) in dx.chunks_exact(d).enumerate() {
        let i = r % t;
        for (o, &v) in d_pos[i * d..(i + 1) * d].iter_mut().zip(row) {
            *o += v;
        }
    }
    Ok(())
}
