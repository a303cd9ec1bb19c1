//! The embedded model's BPE vocabulary: training a byte-level BPE with the
//! `tokenizers` crate's trainer, and the trained file the project ships.
//!
//! Claude Code sends about 50 KB of system prompt and tool schemas with
//! every call; one token per byte (the byte game's vocabulary) would not
//! fit a context a CPU can prefill, so the gateway's embedded engine speaks
//! a byte-level BPE instead. Its first ids keep the byte game's layout
//! (byte `b` is id `b`, then the model's special tokens at 256..264), so the
//! engine's stop tokens and the chat format's markers are the same ids in
//! both vocabularies; learned merges follow from id 264. The shipped file
//! is [`SHIPPED`]; `cargo run --release --example train_tokenizer` retrains
//! it from [`corpus_files`] (see the README for the corpus and the figures).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    TokenizerBuilder,
};

use super::tokenizer::{TokenizerError, byte_chars};

/// The shipped tokenizer.json of the gateway's embedded engine.
pub const SHIPPED: &str = include_str!("embedded_tokenizer.json");

/// Vocabulary size of the shipped tokenizer (bytes, specials, merges).
pub const SHIPPED_VOCAB: usize = 8192;

fn train_error(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Encode(format!("training the BPE: {e}"))
}

/// Trains a byte-level BPE of `vocab_size` ids on `texts`, then lays its
/// ids out as the byte game's: bytes at 0..256, `specials` next, merges
/// after. Deterministic: the same texts give the same file.
pub fn train_byte_bpe(
    texts: &[String],
    vocab_size: usize,
    specials: &[&str],
) -> Result<Value, TokenizerError> {
    let added: Vec<AddedToken> = specials
        .iter()
        .map(|s| AddedToken::from(s.to_string(), true))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(added)
        .build();
    let byte_level = ByteLevel::new(false, false, true);
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(byte_level.into()))
    .with_decoder(Some(byte_level.into()))
    .build()
    .map_err(train_error)?;
    tokenizer
        .train(&mut trainer, texts.iter())
        .map_err(train_error)?;
    let trained: Value = serde_json::from_str(&tokenizer.to_string(false).map_err(train_error)?)
        .map_err(train_error)?;
    relabel(trained, specials)
}

/// Renumbers a trained tokenizer.json: bytes first (in byte order), then
/// the specials, then every other token in its trained order.
fn relabel(mut t: Value, specials: &[&str]) -> Result<Value, TokenizerError> {
    let vocab = t["model"]["vocab"]
        .as_object()
        .ok_or_else(|| train_error("trained file has no model.vocab"))?;
    let mut learned: Vec<(&String, u64)> = vocab
        .iter()
        .map(|(k, v)| (k, v.as_u64().unwrap_or(u64::MAX)))
        .collect();
    learned.sort_by_key(|(_, id)| *id);
    let chars: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    let mut out = serde_json::Map::new();
    for (b, c) in chars.iter().enumerate() {
        out.insert(c.clone(), json!(b));
    }
    for (i, s) in specials.iter().enumerate() {
        out.insert((*s).to_string(), json!(256 + i));
    }
    let mut next = out.len();
    for (k, _) in learned {
        if !out.contains_key(k.as_str()) {
            out.insert(k.clone(), json!(next));
            next += 1;
        }
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": 256 + i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    t["model"]["vocab"] = Value::Object(out);
    t["added_tokens"] = json!(added);
    Ok(t)
}

/// The training corpus, relative to the repository root, in a fixed
/// order: English prose (README.md), Rust code of the workspace's crates
/// (with their comments), and JSON tool schemas in the shape harnesses
/// send (`src/gateway/bpe_corpus_tools.json`, written for this corpus,
/// counted four times so schema keys weigh as they do in a real call).
pub fn corpus_files(root: &Path) -> Result<Vec<PathBuf>, std::io::Error> {
    let mut code = Vec::new();
    for dir in ["src", "actors/src", "runtime/src", "gpu/src"] {
        collect_rs(&root.join(dir), &mut code)?;
    }
    code.sort();
    let mut files = vec![root.join("README.md")];
    files.extend(code);
    let tools = root.join("src/gateway/bpe_corpus_tools.json");
    files.extend(std::iter::repeat_n(tools, 4));
    Ok(files)
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), std::io::Error> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::tokenizer::Tokenizer;
    use gyre_gpu::model::vocab::Special;

    fn specials() -> Vec<&'static str> {
        Special::ALL.iter().map(|s| s.text()).collect()
    }

    #[test]
    fn training_is_deterministic_and_keeps_the_byte_layout() {
        let texts: Vec<String> = (0..40)
            .map(|i| format!("fn main() {{ println!(\"hello {i}\"); }} // the quick brown fox\n"))
            .collect();
        let a = train_byte_bpe(&texts, 300, &specials()).unwrap();
        let b = train_byte_bpe(&texts, 300, &specials()).unwrap();
        assert_eq!(a, b);
        let tok = Tokenizer::from_json(&a.to_string(), Special::EndTurn.text(), "t").unwrap();
        assert_eq!(tok.vocab_size(), 300);
        assert_eq!(tok.eos(), Special::EndTurn.id());
        let ids = tok.encode("<|bos|>fn main() é").unwrap();
        assert_eq!(ids[0], Special::Bos.id());
        assert!(ids.iter().any(|&i| i >= 264), "merges are used: {ids:?}");
        assert_eq!(tok.decode(&ids), "<|bos|>fn main() é");
        // A single byte is its own id, as in the byte game.
        assert_eq!(tok.encode("A").unwrap(), vec![b'A' as u32]);
    }

    #[test]
    fn the_shipped_tokenizer_loads_and_round_trips() {
        let tok = Tokenizer::from_json(SHIPPED, Special::EndTurn.text(), "shipped").unwrap();
        assert_eq!(tok.vocab_size() as usize, SHIPPED_VOCAB);
        for s in Special::ALL {
            assert_eq!(tok.encode(s.text()).unwrap(), vec![s.id()], "{s:?}");
        }
        let text = "<|system|>You are Claude Code. Use the Bash tool.<|end|><|user|>\
            {\"type\": \"object\", \"properties\": {\"command\": {\"type\": \"string\", \
            \"description\": \"The command to execute\"}}, \"required\": [\"command\"]}\n\
            fn main() {\n    println!(\"héllo 🦀\");\n}\n\t\r\u{0}<|end|><|assistant|>";
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids), text);
        // Far fewer tokens than bytes on English, code and JSON.
        assert!(
            ids.len() * 3 < text.len(),
            "{} ids for {} bytes",
            ids.len(),
            text.len()
        );
    }
}
