//! The policy models: configuration, byte vocabulary, flat parameter
//! buffer, safetensors checkpoints, and two architectures behind one
//! [`Model`] trait: Gyre's own byte-level transformer and the Llama-family
//! decoders (Llama, Qwen3) of Hugging Face checkpoints.
//!
//! - [`backprop`]: the trainer's hand-written forward and backward pass;
//! - [`config`]: the shape, with the architecture-specific part in `Arch`;
//! - [`params`]: the flat, versioned buffer every exchange copies;
//! - [`weights`]: that buffer as tensors (plain or `Var`s), by architecture;
//! - [`forward`]: shared arithmetic and the two entry points;
//! - [`fused`]: one-pass CPU kernels with their backward passes;
//! - [`fused_attention`]: causal attention over whole rows, for training;
//! - [`kernels`]: products, norms, activations and rotations on slices,
//!   which the trainer's pass and the engine's decoding share;
//! - [`ragged_attention`]: the engine's attention over a ragged batch;
//! - [`gyre`], [`decoder`], [`rope`]: the architectures;
//! - [`safetensors_io`]: Gyre's single-file checkpoints;
//! - [`hf`]: Hugging Face checkpoint directories (config.json, shards,
//!   tokenizer, chat template);
//! - [`vocab`]: the byte vocabulary of Gyre's model.

pub mod backprop;
pub mod config;
pub mod decoder;
pub mod forward;
pub mod fused;
pub mod fused_attention;
pub mod gyre;
pub mod hf;
pub(crate) mod kernels;
pub mod params;
pub mod ragged_attention;
pub mod rope;
pub mod safetensors_io;
pub mod vocab;
pub mod weights;

use candle_core::Tensor;

pub use config::{Arch, DecoderArch, Family, ModelConfig, RopeScaling};
pub use forward::{KvStore, Segment};
pub use params::{ParamBuffer, ParamLayout, ParamSpec};
pub use weights::Weights;

use crate::error::ModelError;

/// What the engine and the trainer need of an architecture: the same
/// function computed two ways. The trainer's teacher forcing
/// ([`Model::hidden_batch`] then [`Model::logits`], with gradients) and
/// the engine's paged, ragged decoding ([`Model::forward_ragged`]) must
/// agree, which is what makes recorded behaviour log-probs exact.
pub trait Model: Send + Sync + std::fmt::Debug {
    fn config(&self) -> &ModelConfig;

    /// Final hidden states (before the final norm) of `n` right-padded
    /// rows of `t` tokens, row-major: [n, t, width].
    fn hidden_batch(&self, ids: &[u32], n: usize, t: usize) -> Result<Tensor, ModelError>;

    /// Logits of hidden rows: [k, width] → [k, vocab].
    fn logits(&self, hidden: &Tensor) -> Result<Tensor, ModelError>;

    /// One continuous-batching iteration over the segments' new tokens
    /// (concatenated in `tokens`), reading and writing their keys and
    /// values through `kv`; the logits of the rows listed in `want`.
    fn forward_ragged(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        kv: &mut dyn KvStore,
        want: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError>;
}
