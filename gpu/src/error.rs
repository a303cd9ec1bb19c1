//! Errors of the model layer: bad configurations, foreign parameter buffers,
//! tensor-library failures. Engine, trainer, memory and collectives have
//! their own error types that wrap this one where they build on the model.

/// What can go wrong building, loading or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid model configuration: {0}")]
    Config(String),
    #[error(
        "parameter buffer has layout {got:#018x}, this model expects {expected:#018x} (a different configuration)"
    )]
    Layout { expected: u64, got: u64 },
    #[error("parameter buffer holds {got} values, the layout needs {expected}")]
    Length { expected: usize, got: usize },
    #[error("malformed parameter bytes: {0}")]
    Bytes(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("safetensors file: {0}")]
    Safetensors(String),
    #[error("token id {token} at position {position} is outside the vocabulary of {vocab}")]
    Token {
        token: u32,
        position: usize,
        vocab: usize,
    },
    #[error("sequence of {len} tokens exceeds the context length {context}")]
    Context { len: usize, context: usize },
    #[error("tensor computation failed: {0}")]
    Tensor(#[from] candle_core::Error),
}
