//! Test checkpoints made at test time, and an independent reference.
//!
//! [`write_tiny`] draws a tiny Qwen3- or Llama-shaped model and writes it
//! the way Hugging Face lays a checkpoint out (config.json with HF keys,
//! safetensors in PyTorch shapes, sharded with an index or in one file,
//! F32 or BF16, a tokenizer_config.json with a chat template) without
//! using any of gyre-gpu's own layout or checkpoint code. [`Reference`]
//! computes the model's logits with plain loops in f64 from the same
//! tensors, written from the Hugging Face modelling code, not from Gyre's.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Qwen3,
    Llama,
}

/// The tiny shapes: GQA (4 query heads, 2 KV heads) in both; Qwen3 with a
/// head_dim apart from hidden/heads, q/k norm and tied embeddings; Llama
/// with an untied head, q/k/v biases and llama3 RoPE scaling.
#[derive(Clone, Debug)]
pub struct Tiny {
    pub shape: Shape,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub max_positions: usize,
    pub theta: f64,
    pub eps: f64,
    pub tied: bool,
    pub bias: bool,
    pub llama3_rope: Option<(f64, f64, f64, usize)>,
    pub eos: u32,
}

impl Tiny {
    pub fn new(shape: Shape) -> Self {
        match shape {
            Shape::Qwen3 => Tiny {
                shape,
                vocab: 320,
                hidden: 32,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                head_dim: 16,
                ffn: 48,
                max_positions: 96,
                theta: 1_000_000.0,
                eps: 1e-6,
                tied: true,
                bias: false,
                llama3_rope: None,
                eos: 7,
            },
            Shape::Llama => Tiny {
                shape,
                vocab: 300,
                hidden: 32,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                head_dim: 8,
                ffn: 40,
                max_positions: 96,
                theta: 500_000.0,
                eps: 1e-5,
                tied: false,
                bias: true,
                llama3_rope: Some((8.0, 1.0, 4.0, 32)),
                eos: 9,
            },
        }
    }

    pub fn config_json(&self) -> serde_json::Value {
        let (arch, ty) = match self.shape {
            Shape::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
            Shape::Llama => ("LlamaForCausalLM", "llama"),
        };
        let scaling = match self.llama3_rope {
            Some((f, lo, hi, orig)) => json!({"rope_type": "llama3", "factor": f,
                "low_freq_factor": lo, "high_freq_factor": hi,
                "original_max_position_embeddings": orig}),
            None => serde_json::Value::Null,
        };
        json!({
            "architectures": [arch], "model_type": ty, "vocab_size": self.vocab,
            "hidden_size": self.hidden, "intermediate_size": self.ffn,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "hidden_act": "silu", "max_position_embeddings": self.max_positions,
            "rms_norm_eps": self.eps, "rope_theta": self.theta, "rope_scaling": scaling,
            "tie_word_embeddings": self.tied, "attention_bias": self.bias,
            "bos_token_id": 1, "eos_token_id": self.eos, "torch_dtype": "float32",
            "use_sliding_window": false, "mlp_bias": false,
        })
    }
}

/// A deterministic normal stream (SplitMix64 + Box–Muller).
struct Draw(u64);

impl Draw {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (1.0 - self.unit(), self.unit());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// The checkpoint's tensors by Hugging Face name: shape and values.
pub type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

pub fn draw_tensors(t: &Tiny, seed: u64) -> Tensors {
    let mut d = Draw(seed);
    let mut out = Tensors::new();
    let mut put = |name: String, shape: Vec<usize>, norm: bool, d: &mut Draw| {
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|_| {
                let x = d.normal();
                (if norm { 1.0 + 0.1 * x } else { 0.15 * x }) as f32
            })
            .collect();
        out.insert(name, (shape, v));
    };
    let (h, q, kv, f) = (
        t.hidden,
        t.heads * t.head_dim,
        t.kv_heads * t.head_dim,
        t.ffn,
    );
    put(
        "model.embed_tokens.weight".into(),
        vec![t.vocab, h],
        false,
        &mut d,
    );
    for l in 0..t.layers {
        let p = format!("model.layers.{l}");
        put(format!("{p}.input_layernorm.weight"), vec![h], true, &mut d);
        put(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            true,
            &mut d,
        );
        for (n, o) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            put(
                format!("{p}.self_attn.{n}.weight"),
                vec![o, h],
                false,
                &mut d,
            );
            if t.bias {
                put(format!("{p}.self_attn.{n}.bias"), vec![o], false, &mut d);
            }
        }
        put(
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, q],
            false,
            &mut d,
        );
        if t.shape == Shape::Qwen3 {
            put(
                format!("{p}.self_attn.q_norm.weight"),
                vec![t.head_dim],
                true,
                &mut d,
            );
            put(
                format!("{p}.self_attn.k_norm.weight"),
                vec![t.head_dim],
                true,
                &mut d,
            );
        }
        put(
            format!("{p}.mlp.gate_proj.weight"),
            vec![f, h],
            false,
            &mut d,
        );
        put(format!("{p}.mlp.up_proj.weight"), vec![f, h], false, &mut d);
        put(
            format!("{p}.mlp.down_proj.weight"),
            vec![h, f],
            false,
            &mut d,
        );
    }
    put("model.norm.weight".into(), vec![h], true, &mut d);
    if !t.tied {
        put("lm_head.weight".into(), vec![t.vocab, h], false, &mut d);
    }
    out
}

/// How to write the checkpoint.
#[derive(Clone, Debug)]
pub struct Write {
    /// Shards with an index (`None`: one model.safetensors).
    pub shards: Option<usize>,
    pub bf16: bool,
    /// Tensors to leave out (for the refusal tests).
    pub skip: Vec<String>,
    /// Tensors whose shape to corrupt (an extra row).
    pub misshape: Vec<String>,
}

impl Default for Write {
    fn default() -> Self {
        Write {
            shards: Some(2),
            bf16: false,
            skip: Vec::new(),
            misshape: Vec::new(),
        }
    }
}

fn to_bf16(x: f32) -> u16 {
    // Round to nearest even, as torch does.
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Writes a tiny checkpoint into `dir`; returns the tensors as stored
/// (BF16-rounded when written in BF16).
pub fn write_tiny(dir: &Path, t: &Tiny, seed: u64, w: &Write) -> Tensors {
    std::fs::create_dir_all(dir).unwrap();
    let mut tensors = draw_tensors(t, seed);
    if w.bf16 {
        for (_, v) in tensors.values_mut() {
            for x in v.iter_mut() {
                *x = f32::from_bits(u32::from(to_bf16(*x)) << 16);
            }
        }
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&t.config_json()).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"chat_template": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"})
            .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"eos_token_id": [t.eos, t.eos + 1]}).to_string(),
    )
    .unwrap();
    let names: Vec<&String> = tensors.keys().filter(|n| !w.skip.contains(n)).collect();
    let shards = w.shards.unwrap_or(1).max(1);
    let per = names.len().div_ceil(shards);
    let mut map = BTreeMap::new();
    for (i, group) in names.chunks(per).enumerate() {
        let file = match w.shards {
            Some(n) => format!("model-{:05}-of-{n:05}.safetensors", i + 1),
            None => "model.safetensors".to_string(),
        };
        let mut bytes: HashMap<String, (Vec<usize>, Vec<u8>)> = HashMap::new();
        for name in group {
            let (shape, v) = &tensors[*name];
            let mut shape = shape.clone();
            let mut v = v.clone();
            if w.misshape.contains(name) {
                shape[0] += 1;
                let row: usize = shape[1..].iter().product();
                v.extend(std::iter::repeat_n(0.0, row));
            }
            let b: Vec<u8> = if w.bf16 {
                v.iter().flat_map(|x| to_bf16(*x).to_le_bytes()).collect()
            } else {
                v.iter().flat_map(|x| x.to_le_bytes()).collect()
            };
            bytes.insert((*name).clone(), (shape, b));
            map.insert((*name).clone(), file.clone());
        }
        let dtype = if w.bf16 { Dtype::BF16 } else { Dtype::F32 };
        let views: Vec<(String, TensorView)> = bytes
            .iter()
            .map(|(n, (s, b))| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
            .collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(views, Some(meta), &dir.join(&file)).unwrap();
    }
    if w.shards.is_some() {
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            json!({"metadata": {}, "weight_map": map}).to_string(),
        )
        .unwrap();
    }
    tensors
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "gyre-ckpt-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Hugging Face's decoder forward, one sequence, plain loops in f64.
pub struct Reference<'a> {
    pub t: &'a Tiny,
    pub w: &'a Tensors,
}

fn rms(x: &[f64], g: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|a| a * a).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter()
        .zip(g)
        .map(|(a, &b)| a * inv * f64::from(b))
        .collect()
}

impl Reference<'_> {
    fn get(&self, n: &str) -> &[f32] {
        &self.w[n].1
    }

    /// y = W x (+ b) with W [out, in].
    fn linear(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let (shape, w) = &self.w[&format!("{name}.weight")];
        let (out, inp) = (shape[0], shape[1]);
        let b = self.w.get(&format!("{name}.bias")).map(|x| &x.1);
        (0..out)
            .map(|o| {
                let s: f64 = (0..inp).map(|i| f64::from(w[o * inp + i]) * x[i]).sum();
                s + b.map_or(0.0, |b| f64::from(b[o]))
            })
            .collect()
    }

    fn inv_freq(&self) -> Vec<f64> {
        let d = self.t.head_dim;
        (0..d / 2)
            .map(|i| {
                let f = 1.0 / self.t.theta.powf((2 * i) as f64 / d as f64);
                let Some((factor, lo, hi, orig)) = self.t.llama3_rope else {
                    return f;
                };
                let wl = 2.0 * std::f64::consts::PI / f;
                let (lw, hw) = (orig as f64 / lo, orig as f64 / hi);
                if wl < hw {
                    f
                } else if wl > lw {
                    f / factor
                } else {
                    let s = (orig as f64 / wl - lo) / (hi - lo);
                    (1.0 - s) * f / factor + s * f
                }
            })
            .collect()
    }

    fn rope(&self, v: &mut [f64], pos: usize) {
        let half = v.len() / 2;
        for (i, f) in self.inv_freq().into_iter().enumerate() {
            let a = pos as f64 * f;
            let (c, s) = (a.cos(), a.sin());
            let (x1, x2) = (v[i], v[i + half]);
            v[i] = x1 * c - x2 * s;
            v[i + half] = x2 * c + x1 * s;
        }
    }

    /// Logits at every position of `ids`.
    pub fn logits(&self, ids: &[u32]) -> Vec<Vec<f64>> {
        let t = self.t;
        let (h, hd) = (t.hidden, t.head_dim);
        let rep = t.heads / t.kv_heads;
        let emb = self.get("model.embed_tokens.weight");
        let mut x: Vec<Vec<f64>> = ids
            .iter()
            .map(|&i| {
                emb[i as usize * h..(i as usize + 1) * h]
                    .iter()
                    .map(|&a| a.into())
                    .collect()
            })
            .collect();
        for l in 0..t.layers {
            let p = format!("model.layers.{l}");
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, xi) in x.iter().enumerate() {
                let hn = rms(xi, self.get(&format!("{p}.input_layernorm.weight")), t.eps);
                let mut q = self.linear(&format!("{p}.self_attn.q_proj"), &hn);
                let mut k = self.linear(&format!("{p}.self_attn.k_proj"), &hn);
                let v = self.linear(&format!("{p}.self_attn.v_proj"), &hn);
                for (vec, heads, norm) in
                    [(&mut q, t.heads, "q_norm"), (&mut k, t.kv_heads, "k_norm")]
                {
                    for head in 0..heads {
                        let s = &mut vec[head * hd..(head + 1) * hd];
                        if t.shape == Shape::Qwen3 {
                            let n =
                                rms(s, self.get(&format!("{p}.self_attn.{norm}.weight")), t.eps);
                            s.copy_from_slice(&n);
                        }
                        self.rope(s, pos);
                    }
                }
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            for i in 0..x.len() {
                let mut attn = vec![0.0; t.heads * hd];
                for head in 0..t.heads {
                    let kvh = head / rep;
                    let q = &qs[i][head * hd..(head + 1) * hd];
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        let v = &vs[j][kvh * hd..(kvh + 1) * hd];
                        for d in 0..hd {
                            attn[head * hd + d] += ej / z * v[d];
                        }
                    }
                }
                let o = self.linear(&format!("{p}.self_attn.o_proj"), &attn);
                for d in 0..h {
                    x[i][d] += o[d];
                }
            }
            for xi in x.iter_mut() {
                let hn = rms(
                    xi,
                    self.get(&format!("{p}.post_attention_layernorm.weight")),
                    t.eps,
                );
                let g = self.linear(&format!("{p}.mlp.gate_proj"), &hn);
                let u = self.linear(&format!("{p}.mlp.up_proj"), &hn);
                let a: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let dn = self.linear(&format!("{p}.mlp.down_proj"), &a);
                for d in 0..h {
                    xi[d] += dn[d];
                }
            }
        }
        let head = if t.tied {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let hw = self.get(head);
        x.iter()
            .map(|xi| {
                let n = rms(xi, self.get("model.norm.weight"), t.eps);
                (0..t.vocab)
                    .map(|v| (0..h).map(|d| f64::from(hw[v * h + d]) * n[d]).sum())
                    .collect()
            })
            .collect()
    }

    /// log softmax of [`Reference::logits`].
    pub fn logprobs(&self, ids: &[u32]) -> Vec<Vec<f64>> {
        self.logits(ids)
            .into_iter()
            .map(|l| {
                let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = l.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m;
                l.iter().map(|x| x - lse).collect()
            })
            .collect()
    }
}
