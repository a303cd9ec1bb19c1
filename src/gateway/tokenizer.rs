//! The model's tokeniser: an HF `tokenizer.json` through the `tokenizers`
//! crate, plus its end-of-turn token.
//!
//! The built-in one is a byte-level BPE with no merges (one token per byte)
//! and the ChatML special tokens, so the script engine and tests need no
//! model files; it is a real HF tokenizer, serialised and loaded the same way.

use std::path::Path;

use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a tokenizer.json the tokenizers crate can load: {message}")]
    Load { path: String, message: String },
    #[error("the end-of-turn token {token:?} is not in the vocabulary")]
    NoEos { token: String },
    #[error("tokenising failed: {0}")]
    Encode(String),
}

/// A loaded tokeniser and the token that ends an assistant turn.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: u32,
    eos_text: String,
    vocab_size: u32,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("eos", &self.eos_text)
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

/// GPT-2's byte to printable-character map, which byte-level BPE vocabularies use.
pub(crate) fn byte_chars() -> Vec<char> {
    let printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap_or('?');
    }
    let mut extra = 0u32;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + extra).unwrap_or('?');
            extra += 1;
        }
    }
    chars
}

/// Special tokens of the built-in tokeniser, after the 256 bytes.
pub const BUILTIN_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The built-in tokenizer.json (see the module doc).
pub fn builtin_tokenizer_json() -> Value {
    byte_tokenizer_json(&BUILTIN_SPECIALS)
}

/// A byte-level tokenizer.json: byte `b` is id `b`, then `specials`.
pub fn byte_tokenizer_json(specials: &[&str]) -> Value {
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            vocab.insert((*t).to_string(), json!(256 + i));
            json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
}

impl Tokenizer {
    pub fn builtin() -> Result<Tokenizer, TokenizerError> {
        Self::from_json(
            &builtin_tokenizer_json().to_string(),
            "<|im_end|>",
            "built-in",
        )
    }

    pub fn from_file(path: &Path, eos: &str) -> Result<Tokenizer, TokenizerError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&text, eos, &path.display().to_string())
    }

    pub fn from_json(json: &str, eos: &str, origin: &str) -> Result<Tokenizer, TokenizerError> {
        let inner: tokenizers::Tokenizer =
            json.parse()
                .map_err(|e: tokenizers::Error| TokenizerError::Load {
                    path: origin.to_string(),
                    message: e.to_string(),
                })?;
        let eos_id = inner
            .token_to_id(eos)
            .ok_or_else(|| TokenizerError::NoEos {
                token: eos.to_string(),
            })?;
        let vocab_size = inner.get_vocab_size(true) as u32;
        Ok(Tokenizer {
            inner,
            eos: eos_id,
            eos_text: eos.to_string(),
            vocab_size,
        })
    }

    pub fn eos(&self) -> u32 {
        self.eos
    }

    pub fn eos_text(&self) -> &str {
        &self.eos_text
    }

    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// Ids of `text`, special-token strings recognised, nothing added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Text of `ids`, special tokens kept; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_round_trips_bytes_and_specials() {
        let t = Tokenizer::builtin().unwrap();
        let text = "<|im_start|>user\nhé 🦀 {\"a\": 1}<|im_end|>\n";
        let ids = t.encode(text).unwrap();
        assert_eq!(ids[0], 257);
        assert_eq!(ids[ids.len() - 2], t.eos());
        assert_eq!(t.decode(&ids), text);
        assert_eq!(t.vocab_size(), 259);
    }

    #[test]
    fn unknown_eos_is_an_error() {
        let json = builtin_tokenizer_json().to_string();
        assert!(matches!(
            Tokenizer::from_json(&json, "</s>", "x"),
            Err(TokenizerError::NoEos { .. })
        ));
        assert!(Tokenizer::from_json("{", "</s>", "x").is_err());
    }
}
