//! Llama-family decoders (see [`crate::model::decoder`]): token embedding,
//! pre-norm blocks of RMSNorm, grouped-query attention with RoPE (Qwen3
//! normalises each head's queries and keys first) and optional biases, a
//! SwiGLU MLP, a final norm and an output-major head that may be the tied
//! embedding. `Linear` weights are [out, in], applied as `x · Wᵀ`.

use super::head::{Head, HeadMatrix};
use super::kernels::{
    Mat, add, from_heads, matmul, product, rms_norm, rms_norm_grad, rope, rope_grad, silu_mul,
    silu_mul_grad, sum_rows, to_heads,
};
use super::{Batch, Grads, Params, Rows};
use crate::error::ModelError;
use crate::model::config::{DecoderArch, Family};
use crate::model::fused_attention::{self, Dims};
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

fn head_name(a: &DecoderArch) -> &'static str {
    if a.tie_embeddings {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    }
}

/// x · Wᵀ (+ b) of the `Linear` `prefix` over `m` rows of `din`.
fn linear(
    p: &Params,
    prefix: &str,
    bias: bool,
    x: &[f32],
    (m, din, dout): (usize, usize, usize),
) -> Result<Vec<f32>, ModelError> {
    let w = Mat::new(p.get(&format!("{prefix}.weight"))?, dout, din);
    let mut y = product(Mat::new(x, m, din), w.t());
    if bias {
        let b = p.get(&format!("{prefix}.bias"))?;
        for row in y.chunks_exact_mut(dout) {
            add(row, b);
        }
    }
    Ok(y)
}

/// The `Linear`'s weight (and bias) gradients of output gradient `dy`
/// and input `x`, and dx += dy · W.
#[allow(clippy::too_many_arguments)]
fn linear_grad(
    p: &Params,
    g: &mut Grads,
    prefix: &str,
    bias: bool,
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    (m, din, dout): (usize, usize, usize),
    dx_add: bool,
) -> Result<(), ModelError> {
    let w = format!("{prefix}.weight");
    let dym = Mat::new(dy, m, dout);
    matmul(g.get(&w)?, dym.t(), Mat::new(x, m, din), true);
    if bias {
        sum_rows(dy, dout, g.get(&format!("{prefix}.bias"))?);
    }
    matmul(dx, dym, Mat::new(p.get(&w)?, dout, din), dx_add);
    Ok(())
}

pub(super) fn forward(
    cfg: &ModelConfig,
    arch: &DecoderArch,
    p: &Params,
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
        let q_raw = linear(p, &name(l, "self_attn.q_proj"), bias, &h1, (m, d, qw))?;
        let k_raw = linear(p, &name(l, "self_attn.k_proj"), bias, &h1, (m, d, kw))?;
        let v = linear(p, &name(l, "self_attn.v_proj"), bias, &h1, (m, d, kw))?;
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
        let gate = linear(p, &name(l, "mlp.gate_proj"), false, &h2, (m, d, f))?;
        let up = linear(p, &name(l, "mlp.up_proj"), false, &h2, (m, d, f))?;
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
    let lm = HeadMatrix {
        data: p.get(head_name(arch))?,
        out_major: true,
    };
    let (head, logp) = Head::forward(
        &x,
        d,
        b.at,
        b.tokens,
        p.get("model.norm.weight")?,
        eps,
        lm,
        cfg.vocab,
    );
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
    p: &Params,
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
    let lm_name = head_name(a);
    let lm = HeadMatrix {
        data: p.get(lm_name)?,
        out_major: true,
    };
    let mut d_final = vec![0f32; d];
    s.head.backward(
        dlogp,
        rows.at,
        p.get("model.norm.weight")?,
        lm,
        g.get(lm_name)?,
        &mut d_final,
        &mut dx,
    );
    add(g.get("model.norm.weight")?, &d_final);
    for (l, y) in s.layers.into_iter().enumerate().rev() {
        // x_out = x_mid + down(silu(gate(h2)) ∘ up(h2))
        let mut dact = vec![0f32; m * f];
        linear_grad(
            p,
            &mut g,
            &name(l, "mlp.down_proj"),
            false,
            &y.act,
            &dx,
            &mut dact,
            (m, f, d),
            false,
        )?;
        let dup = silu_mul_grad(&y.silu, &y.slope, &y.up, &mut dact);
        let mut dh = vec![0f32; m * d];
        linear_grad(
            p,
            &mut g,
            &name(l, "mlp.gate_proj"),
            false,
            &y.h2,
            &dact,
            &mut dh,
            (m, d, f),
            false,
        )?;
        linear_grad(
            p,
            &mut g,
            &name(l, "mlp.up_proj"),
            false,
            &y.h2,
            &dup,
            &mut dh,
            (m, d, f),
            true,
        )?;
        let post = name(l, "post_attention_layernorm.weight");
        rms_norm_grad(&y.x_mid, p.get(&post)?, eps, &dh, &mut dx, g.get(&post)?);
        // x_mid = x + o(attention(rope(norm(q(h1))), rope(norm(k(h1))), v(h1)))
        let mut da = vec![0f32; m * qw];
        linear_grad(
            p,
            &mut g,
            &name(l, "self_attn.o_proj"),
            false,
            &y.a,
            &dx,
            &mut da,
            (m, qw, d),
            false,
        )?;
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
        for (i, (proj, dy, out)) in [
            ("q_proj", &dq, qw),
            ("k_proj", &dk, kw),
            ("v_proj", &dv, kw),
        ]
        .into_iter()
        .enumerate()
        {
            linear_grad(
                p,
                &mut g,
                &name(l, &format!("self_attn.{proj}")),
                bias,
                &y.h1,
                dy,
                &mut dh,
                (m, d, out),
                i > 0,
            )?;
        }
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
