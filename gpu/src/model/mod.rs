//! The embedded policy model: configuration, byte vocabulary, flat
//! parameter buffer, safetensors checkpoints and the transformer itself.

pub mod config;
pub mod forward;
pub mod params;
pub mod safetensors_io;
pub mod vocab;
pub mod weights;

pub use config::ModelConfig;
pub use params::{ParamBuffer, ParamLayout, ParamSpec};
pub use weights::Weights;
