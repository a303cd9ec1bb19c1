//! The shape of the embedded policy: a decoder-only transformer with a
//! byte-level vocabulary. The configuration fixes the parameter layout, so
//! its fingerprint guards every exchange of weights, gradients and KV blocks.

use serde::{Deserialize, Serialize};

use super::vocab::VOCAB_SIZE;
use crate::error::ModelError;

/// Hyper-parameters of the transformer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Vocabulary size: at least the byte vocabulary plus special tokens.
    pub vocab: usize,
    pub layers: usize,
    pub heads: usize,
    /// Residual width; a multiple of `heads`.
    pub width: usize,
    /// Hidden width of the MLP.
    pub ffn: usize,
    /// Longest sequence (prompt plus output) the model attends over.
    pub context: usize,
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
        }
    }
}

impl ModelConfig {
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
        }
    }

    pub fn head_dim(&self) -> usize {
        self.width / self.heads.max(1)
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.vocab < VOCAB_SIZE {
            return bad(format!(
                "vocab {} is smaller than the byte vocabulary with special tokens ({VOCAB_SIZE})",
                self.vocab
            ));
        }
        if self.vocab > u32::MAX as usize {
            return bad(format!("vocab {} does not fit a u32 token id", self.vocab));
        }
        for (name, v) in [
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
        if self.width % self.heads != 0 {
            return bad(format!(
                "width {} is not a multiple of heads {}",
                self.width, self.heads
            ));
        }
        Ok(())
    }

    /// FNV-1a over the shape: equal configurations, equal fingerprints, on
    /// every platform and build.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in [
            self.vocab,
            self.layers,
            self.heads,
            self.width,
            self.ffn,
            self.context,
        ] {
            for b in (v as u64).to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_bad_shapes() {
        assert!(ModelConfig::default().validate().is_ok());
        assert!(ModelConfig::tiny().validate().is_ok());
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
    }
}
