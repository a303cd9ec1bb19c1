//! Hugging Face checkpoint directories of the Llama and Qwen3 families:
//! `config.json`, one `model.safetensors` or shards with
//! `model.safetensors.index.json`, `tokenizer.json`, the chat template
//! (`chat_template.jinja` or `tokenizer_config.json`) and
//! `generation_config.json`'s stop tokens.
//!
//! - [`config`]: `config.json` ↔ [`ModelConfig`](super::ModelConfig),
//!   refusing what Gyre does not compute (naming it);
//! - [`checkpoint`]: tensors in (F32, BF16, F16 → the flat F32 buffer,
//!   checked by name and shape) and out (F32 shards, bit-exact).

pub mod checkpoint;
pub mod config;

pub use checkpoint::{HfCheckpoint, LoadOptions, load, save};
pub use config::{HfConfig, parse_config};
