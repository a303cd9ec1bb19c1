//! The flat, versioned parameter buffer. Every parameter of the model lives
//! at a fixed offset of one `f32` buffer, so a publication, a satellite's
//! pull and a checkpoint are byte copies of it, and gradients and optimizer
//! state share the same layout.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::{Arch, DecoderArch, Family, ModelConfig};
use crate::error::ModelError;

/// One named tensor inside the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub len: usize,
}

/// A flat buffer's tensors by name, for the passes written on slices.
pub(crate) struct ParamView<'a> {
    pub layout: &'a ParamLayout,
    pub params: &'a [f32],
}

impl<'a> ParamView<'a> {
    pub fn get(&self, name: &str) -> Result<&'a [f32], ModelError> {
        Ok(&self.params[self.layout.range(name)?])
    }
}

/// Where each parameter lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamLayout {
    pub specs: Vec<ParamSpec>,
    pub total: usize,
    pub fingerprint: u64,
}

impl ParamLayout {
    pub fn new(cfg: &ModelConfig) -> Result<Self, ModelError> {
        cfg.validate()?;
        let shapes = match &cfg.arch {
            Arch::Gyre => gyre_shapes(cfg),
            Arch::Decoder(d) => decoder_shapes(cfg, d),
        };
        let mut offset = 0;
        let specs = shapes
            .into_iter()
            .map(|(name, shape)| {
                let len = shape.iter().product();
                let s = ParamSpec {
                    name,
                    shape,
                    offset,
                    len,
                };
                offset += len;
                s
            })
            .collect();
        Ok(ParamLayout {
            specs,
            total: offset,
            fingerprint: cfg.fingerprint(),
        })
    }

    pub fn spec(&self, name: &str) -> Option<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name)
    }

    /// Where the tensor `name` lies in the flat buffer.
    pub fn range(&self, name: &str) -> Result<std::ops::Range<usize>, ModelError> {
        self.spec(name)
            .map(|s| s.offset..s.offset + s.len)
            .ok_or_else(|| ModelError::Config(format!("layout has no tensor {name}")))
    }

    pub fn bytes(&self) -> usize {
        self.total * 4
    }
}

/// Gyre's model: fused QKV and matrices stored input-major (`x · W`).
fn gyre_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (v, d, f, c) = (cfg.vocab, cfg.width, cfg.ffn, cfg.context);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("tok_emb".into(), vec![v, d]),
        ("pos_emb".into(), vec![c, d]),
    ];
    for l in 0..cfg.layers {
        shapes.push((format!("layers.{l}.attn_norm"), vec![d]));
        shapes.push((format!("layers.{l}.wqkv"), vec![d, 3 * d]));
        shapes.push((format!("layers.{l}.wo"), vec![d, d]));
        shapes.push((format!("layers.{l}.mlp_norm"), vec![d]));
        shapes.push((format!("layers.{l}.w1"), vec![d, f]));
        shapes.push((format!("layers.{l}.w2"), vec![f, d]));
    }
    shapes.push(("final_norm".into(), vec![d]));
    shapes.push(("lm_head".into(), vec![d, v]));
    shapes
}

/// A Hugging Face decoder: the checkpoint's own tensor names and PyTorch
/// shapes (`Linear` weights output-major), so loading and saving a
/// checkpoint is a copy per tensor and nothing is renamed or transposed.
fn decoder_shapes(cfg: &ModelConfig, a: &DecoderArch) -> Vec<(String, Vec<usize>)> {
    let (v, d, f) = (cfg.vocab, cfg.width, cfg.ffn);
    let (q, kv, hd) = (cfg.heads * a.head_dim, a.kv_heads * a.head_dim, a.head_dim);
    let mut shapes: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![v, d])];
    for l in 0..cfg.layers {
        let p = format!("model.layers.{l}");
        shapes.push((format!("{p}.input_layernorm.weight"), vec![d]));
        for (name, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            shapes.push((format!("{p}.self_attn.{name}.weight"), vec![out, d]));
            if a.attention_bias {
                shapes.push((format!("{p}.self_attn.{name}.bias"), vec![out]));
            }
        }
        shapes.push((format!("{p}.self_attn.o_proj.weight"), vec![d, q]));
        if a.family == Family::Qwen3 {
            shapes.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
            shapes.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
        }
        shapes.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        shapes.push((format!("{p}.mlp.gate_proj.weight"), vec![f, d]));
        shapes.push((format!("{p}.mlp.up_proj.weight"), vec![f, d]));
        shapes.push((format!("{p}.mlp.down_proj.weight"), vec![d, f]));
    }
    shapes.push(("model.norm.weight".into(), vec![d]));
    if !a.tie_embeddings {
        shapes.push(("lm_head.weight".into(), vec![v, d]));
    }
    shapes
}

/// How a fresh parameter starts: norms at one, biases at zero, matrices
/// drawn, residual projections scaled down.
enum Init {
    One,
    Zero,
    Normal(f64),
}

fn init_of(name: &str, layers: usize) -> Init {
    if name.ends_with("norm") || name.ends_with("norm.weight") {
        return Init::One;
    }
    if name.ends_with(".bias") {
        return Init::Zero;
    }
    let resid = [".wo", ".w2", "o_proj.weight", "down_proj.weight"];
    if resid.iter().any(|r| name.ends_with(r)) {
        Init::Normal(0.02 * (1.0 / (2.0 * layers as f64).sqrt()))
    } else {
        Init::Normal(0.02)
    }
}

const MAGIC: &[u8; 8] = b"GYREPRM1";
const HEADER: usize = 32;

/// The model's parameters (or a gradient, or an optimizer moment) as one
/// flat buffer, stamped with the policy version and the layout fingerprint.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamBuffer {
    pub version: u64,
    pub fingerprint: u64,
    pub data: Vec<f32>,
}

impl ParamBuffer {
    /// Fresh weights: norms at one, biases at zero, matrices drawn
    /// N(0, 0.02²) from a seeded stream, residual projections scaled down
    /// by √(2·layers) so the residual stream does not grow with depth.
    /// Same seed, same bits.
    pub fn init(cfg: &ModelConfig, seed: u64) -> Result<Self, ModelError> {
        let layout = ParamLayout::new(cfg)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut data = vec![0f32; layout.total];
        for s in &layout.specs {
            let out = &mut data[s.offset..s.offset + s.len];
            match init_of(&s.name, cfg.layers) {
                Init::One => out.fill(1.0),
                Init::Zero => out.fill(0.0),
                Init::Normal(scale) => {
                    for x in out.iter_mut() {
                        *x = (normal(&mut rng) * scale) as f32;
                    }
                }
            }
        }
        Ok(ParamBuffer {
            version: 0,
            fingerprint: layout.fingerprint,
            data,
        })
    }

    /// A zero buffer of a layout (gradients, optimizer moments).
    pub fn zeros(layout: &ParamLayout) -> Self {
        ParamBuffer {
            version: 0,
            fingerprint: layout.fingerprint,
            data: vec![0.0; layout.total],
        }
    }

    /// Checks that this buffer fits `layout`.
    pub fn check(&self, layout: &ParamLayout) -> Result<(), ModelError> {
        if self.fingerprint != layout.fingerprint {
            return Err(ModelError::Layout {
                expected: layout.fingerprint,
                got: self.fingerprint,
            });
        }
        if self.data.len() != layout.total {
            return Err(ModelError::Length {
                expected: layout.total,
                got: self.data.len(),
            });
        }
        Ok(())
    }

    /// Rejects NaN or infinite values: a corrupt publication must not reach
    /// an engine or a trainer.
    pub fn check_finite(&self) -> Result<(), ModelError> {
        match self.data.iter().position(|x| !x.is_finite()) {
            Some(i) => Err(ModelError::Bytes(format!("parameter #{i} is not finite"))),
            None => Ok(()),
        }
    }

    /// The raw values as little-endian bytes, without a copy: what a
    /// transfer-engine segment exposes.
    pub fn payload(&self) -> &[u8] {
        bytemuck::cast_slice(&self.data)
    }

    /// Header (magic, fingerprint, version, length) plus payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.data.len() * 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        if cfg!(target_endian = "little") {
            out.extend_from_slice(self.payload());
        } else {
            for x in &self.data {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out
    }

    /// Parses [`ParamBuffer::encode`]'s bytes; rejects anything truncated,
    /// padded or foreign.
    pub fn decode(bytes: &[u8]) -> Result<Self, ModelError> {
        let mut buf = ParamBuffer {
            version: 0,
            fingerprint: 0,
            data: Vec::new(),
        };
        buf.decode_into(bytes)?;
        Ok(buf)
    }

    /// Like [`ParamBuffer::decode`], reusing this buffer's allocation (a
    /// satellite pulls into the same buffer every step).
    pub fn decode_into(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err(ModelError::Bytes("missing GYREPRM1 header".into()));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let (fingerprint, version, len) = (word(8), word(16), word(24));
        let body = &bytes[HEADER..];
        if u64::try_from(body.len()).ok() != len.checked_mul(4) {
            return Err(ModelError::Bytes(format!(
                "header announces {len} values, payload has {} bytes",
                body.len()
            )));
        }
        self.data.clear();
        self.data.extend(
            body.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
        self.fingerprint = fingerprint;
        self.version = version;
        Ok(())
    }
}

/// A standard normal draw (Box–Muller), reproducible from the stream alone.
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_contiguous_and_named() {
        let cfg = ModelConfig::tiny();
        let l = ParamLayout::new(&cfg).unwrap();
        let mut at = 0;
        for s in &l.specs {
            assert_eq!(s.offset, at);
            at += s.len;
        }
        assert_eq!(at, l.total);
        assert_eq!(l.spec("lm_head").unwrap().shape, vec![32, cfg.vocab]);
        assert!(l.spec("layers.1.w2").is_some());
    }

    #[test]
    fn init_is_seeded_and_bytes_round_trip() {
        let cfg = ModelConfig::tiny();
        let a = ParamBuffer::init(&cfg, 7).unwrap();
        assert_eq!(a, ParamBuffer::init(&cfg, 7).unwrap());
        assert_ne!(a, ParamBuffer::init(&cfg, 8).unwrap());
        let mut b = a.clone();
        b.version = 42;
        let bytes = b.encode();
        assert_eq!(ParamBuffer::decode(&bytes).unwrap(), b);
        assert!(ParamBuffer::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(ParamBuffer::decode(&bytes[4..]).is_err());
        let layout = ParamLayout::new(&cfg).unwrap();
        assert!(b.check(&layout).is_ok());
        let other = ParamLayout::new(&ModelConfig { ffn: 128, ..cfg }).unwrap();
        assert!(matches!(b.check(&other), Err(ModelError::Layout { .. })));
    }
}
