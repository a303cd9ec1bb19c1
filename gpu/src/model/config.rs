//! The shape of a policy model. Two architectures share one configuration:
//! Gyre's own byte-level transformer (learned positions, GELU MLP, fused
//! QKV) and the Llama-style decoders of Hugging Face checkpoints (Llama,
//! Qwen3: RoPE, grouped-query attention, SwiGLU, Qwen3's q/k norm). The
//! fields every architecture has sit at the top; what only decoders have
//! sits in [`Arch::Decoder`]. The configuration fixes the parameter layout,
//! so its fingerprint guards every exchange of weights, gradients and KV
//! blocks.

use serde::{Deserialize, Serialize};

use super::vocab::VOCAB_SIZE;
use crate::error::ModelError;

/// Hyper-parameters of the transformer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Vocabulary size: for Gyre's model at least the byte vocabulary plus
    /// special tokens.
    pub vocab: usize,
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Residual width (`hidden_size`).
    pub width: usize,
    /// Hidden width of the MLP (`intermediate_size`).
    pub ffn: usize,
    /// Longest sequence (prompt plus output) the model attends over.
    pub context: usize,
    /// Gyre's own model unless a checkpoint says otherwise; absent from
    /// Gyre-model configuration files, which therefore read as before.
    #[serde(default, skip_serializing_if = "Arch::is_gyre")]
    pub arch: Arch,
}

/// Which arithmetic the parameters feed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arch {
    /// Gyre's byte-level transformer (`gpu/src/model/gyre.rs`).
    #[default]
    Gyre,
    /// A Llama-family decoder (`gpu/src/model/decoder.rs`).
    Decoder(DecoderArch),
}

impl Arch {
    pub fn is_gyre(&self) -> bool {
        matches!(self, Arch::Gyre)
    }
}

/// Hugging Face decoder families Gyre loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `LlamaForCausalLM`.
    Llama,
    /// `Qwen3ForCausalLM`: Llama plus an RMSNorm over each head's queries
    /// and keys before RoPE, no attention bias.
    Qwen3,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen3 => "qwen3",
        }
    }
}

/// What a Llama-style decoder adds to the common shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecoderArch {
    pub family: Family,
    /// Key/value heads (grouped-query attention); divides `heads`.
    pub kv_heads: usize,
    /// Per-head width; Qwen3 sets it apart from `width / heads`.
    pub head_dim: usize,
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    pub norm_eps: f64,
    /// The output head is the transposed token embedding.
    pub tie_embeddings: bool,
    /// Biases on the q/k/v projections (Llama's `attention_bias`).
    #[serde(default)]
    pub attention_bias: bool,
}

/// RoPE frequency adjustments of long-context checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1's piecewise rescaling of low frequencies.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

impl Default for ModelConfig {
    /// The default small model: big enough to be a real transformer, small
    /// enough to generate and train at interactive speed on two CPU cores.
    fn default() -> Self {
        ModelConfig {
            vocab: VOCAB_SIZE,
            layers: 4,
            heads: 4,
            width: 128,
            ffn: 512,
            context: 256,
            arch: Arch::Gyre,
        }
    }
}

impl ModelConfig {
    /// A Qwen3-shaped decoder as wide and deep as the default model, over
    /// the same vocabulary (4 layers, width 128, 4 query / 2 KV heads of
    /// 32, SwiGLU 384, q/k norm, tied head), so the two architectures
    /// compare at equal size (the policy bench, the PyTorch comparison).
    pub fn qwen3_small() -> Self {
        ModelConfig {
            ffn: 384,
            arch: Arch::Decoder(DecoderArch {
                family: Family::Qwen3,
                kv_heads: 2,
                head_dim: 32,
                rope_theta: 1_000_000.0,
                rope_scaling: None,
                norm_eps: 1e-6,
                tie_embeddings: true,
                attention_bias: false,
            }),
            ..ModelConfig::default()
        }
    }

    /// A model for tests: every path is exercised in milliseconds in a
    /// debug build.
    pub fn tiny() -> Self {
        ModelConfig {
            vocab: VOCAB_SIZE,
            layers: 2,
            heads: 2,
            width: 32,
            ffn: 64,
            context: 64,
            arch: Arch::Gyre,
        }
    }

    pub fn head_dim(&self) -> usize {
        match &self.arch {
            Arch::Gyre => self.width / self.heads.max(1),
            Arch::Decoder(d) => d.head_dim,
        }
    }

    pub fn kv_heads(&self) -> usize {
        match &self.arch {
            Arch::Gyre => self.heads,
            Arch::Decoder(d) => d.kv_heads,
        }
    }

    /// Floats of keys (or of values) one token keeps per layer: the row
    /// width of the paged KV cache.
    pub fn kv_width(&self) -> usize {
        self.kv_heads() * self.head_dim()
    }

    pub fn decoder(&self) -> Option<&DecoderArch> {
        match &self.arch {
            Arch::Gyre => None,
            Arch::Decoder(d) => Some(d),
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.arch.is_gyre() && self.vocab < VOCAB_SIZE {
            return bad(format!(
                "vocab {} is smaller than the byte vocabulary with special tokens ({VOCAB_SIZE})",
                self.vocab
            ));
        }
        if self.vocab > u32::MAX as usize {
            return bad(format!("vocab {} does not fit a u32 token id", self.vocab));
        }
        for (name, v) in [
            ("vocab", self.vocab),
            ("layers", self.layers),
            ("heads", self.heads),
            ("width", self.width),
            ("ffn", self.ffn),
            ("context", self.context),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        match &self.arch {
            Arch::Gyre if self.width % self.heads != 0 => bad(format!(
                "width {} is not a multiple of heads {}",
                self.width, self.heads
            )),
            Arch::Gyre => Ok(()),
            Arch::Decoder(d) => d.validate(self.heads),
        }
    }

    /// FNV-1a over the shape: equal configurations, equal fingerprints, on
    /// every platform and build. A Gyre model's fingerprint is what it was
    /// before decoders existed, so published buffers stay valid.
    pub fn fingerprint(&self) -> u64 {
        let mut words = vec![
            self.vocab as u64,
            self.layers as u64,
            self.heads as u64,
            self.width as u64,
            self.ffn as u64,
            self.context as u64,
        ];
        if let Arch::Decoder(d) = &self.arch {
            words.extend([
                0xdec0_de00 + d.family as u64,
                d.kv_heads as u64,
                d.head_dim as u64,
                d.rope_theta.to_bits(),
                d.norm_eps.to_bits(),
                u64::from(d.tie_embeddings),
                u64::from(d.attention_bias),
            ]);
            match &d.rope_scaling {
                None => {}
                Some(RopeScaling::Linear { factor }) => words.extend([1, factor.to_bits()]),
                Some(RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                }) => words.extend([
                    2,
                    factor.to_bits(),
                    low_freq_factor.to_bits(),
                    high_freq_factor.to_bits(),
                    *original_max_position_embeddings as u64,
                ]),
            }
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in words {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }
}

impl DecoderArch {
    fn validate(&self, heads: usize) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.kv_heads == 0 || heads % self.kv_heads != 0 {
            return bad(format!(
                "num_key_value_heads {} does not divide num_attention_heads {heads}",
                self.kv_heads
            ));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return bad(format!(
                "head_dim {} must be positive and even (RoPE rotates pairs)",
                self.head_dim
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rope_theta {} must be positive", self.rope_theta));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad(format!("rms_norm_eps {} must be positive", self.norm_eps));
        }
        match &self.rope_scaling {
            Some(RopeScaling::Linear { factor }) if !positive(*factor) => {
                bad(format!("rope_scaling factor {factor} must be positive"))
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) if !(positive(*factor)
                && positive(*low_freq_factor)
                && positive(high_freq_factor - low_freq_factor)
                && *original_max_position_embeddings > 0) =>
            {
                bad(format!(
                    "llama3 rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0 \
                     (got {factor}, {low_freq_factor}, {high_freq_factor})"
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Finite and above zero (NaN is not).
fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder() -> ModelConfig {
        ModelConfig {
            vocab: 100,
            layers: 1,
            heads: 4,
            width: 16,
            ffn: 24,
            context: 32,
            arch: Arch::Decoder(DecoderArch {
                family: Family::Qwen3,
                kv_heads: 2,
                head_dim: 8,
                rope_theta: 10_000.0,
                rope_scaling: None,
                norm_eps: 1e-6,
                tie_embeddings: true,
                attention_bias: false,
            }),
        }
    }

    #[test]
    fn validation_rejects_bad_shapes() {
        assert!(ModelConfig::default().validate().is_ok());
        assert!(ModelConfig::tiny().validate().is_ok());
        assert!(decoder().validate().is_ok());
        let c = ModelConfig {
            width: 30,
            heads: 4,
            ..ModelConfig::tiny()
        };
        assert!(c.validate().is_err());
        let c = ModelConfig {
            vocab: 10,
            ..ModelConfig::tiny()
        };
        assert!(c.validate().is_err());
        let c = ModelConfig {
            layers: 0,
            ..ModelConfig::tiny()
        };
        assert!(c.validate().is_err());
        let mut c = decoder();
        c.heads = 3;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("num_key_value_heads")
        );
    }

    #[test]
    fn fingerprint_tracks_the_shape() {
        let a = ModelConfig::tiny();
        let b = ModelConfig {
            ffn: 65,
            ..a.clone()
        };
        assert_eq!(a.fingerprint(), ModelConfig::tiny().fingerprint());
        assert_ne!(a.fingerprint(), b.fingerprint());
        // Gyre's fingerprint is the pre-decoder one (published buffers).
        assert_eq!(a.fingerprint(), 0xe470_4e00_8f50_aa52);
        let mut d = decoder();
        let f = d.fingerprint();
        if let Arch::Decoder(x) = &mut d.arch {
            x.tie_embeddings = false;
        }
        assert_ne!(f, d.fingerprint());
    }

    #[test]
    fn gyre_configs_read_and_print_as_before() {
        let text = "vocab = 264\nlayers = 2\nheads = 2\nwidth = 32\nffn = 64\ncontext = 64\n";
        let c: ModelConfig = toml::from_str(text).unwrap();
        assert_eq!(c, ModelConfig::tiny());
        assert_eq!(toml::to_string(&c).unwrap(), text);
        let d = decoder();
        let back: ModelConfig = toml::from_str(&toml::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }
}
