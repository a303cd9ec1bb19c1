//! Retrains the gateway's embedded-engine tokenizer
//! (`src/gateway/embedded_tokenizer.json`) from the repository's own text:
//!
//! ```sh
//! cargo run --release --example train_tokenizer -- [--root .] [--vocab 8192] [--out FILE]
//! ```
//!
//! The corpus is `gyre::gateway::bpe::corpus_files` (README, the crates'
//! Rust sources, the tool-schema file); training is deterministic, so at the
//! commit that trained the shipped file this reproduces it byte for byte.

use anyhow::{Context, Result, bail};
use gyre::gateway::bpe::{SHIPPED_VOCAB, corpus_files, train_byte_bpe};
use gyre_gpu::model::vocab::Special;

fn main() -> Result<()> {
    let mut root = std::path::PathBuf::from(".");
    let mut out = std::path::PathBuf::from("src/gateway/embedded_tokenizer.json");
    let mut vocab = SHIPPED_VOCAB;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--root" => root = value()?.into(),
            "--out" => out = value()?.into(),
            "--vocab" => vocab = value()?.parse().context("--vocab: expected a number")?,
            other => bail!("unknown argument {other:?} (expected --root, --out, --vocab)"),
        }
    }
    let files = corpus_files(&root)
        .context("listing the corpus (run from the repository root or pass --root)")?;
    let mut texts = Vec::with_capacity(files.len());
    for f in &files {
        texts.push(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?);
    }
    let bytes: usize = texts.iter().map(String::len).sum();
    let specials: Vec<&str> = Special::ALL.iter().map(|s| s.text()).collect();
    let trained = train_byte_bpe(&texts, vocab, &specials)?;
    let json = serde_json::to_string(&trained)?;
    let tok =
        gyre::gateway::tokenizer::Tokenizer::from_json(&json, Special::EndTurn.text(), "trained")?;
    let mut tokens = 0;
    for t in &texts {
        tokens += tok.encode(t)?.len();
    }
    std::fs::write(&out, &json).with_context(|| format!("writing {}", out.display()))?;
    println!(
        "{}: vocab {}, {} bytes; corpus {} files, {bytes} bytes, {tokens} tokens ({:.2} bytes/token)",
        out.display(),
        tok.vocab_size(),
        json.len(),
        files.len(),
        bytes as f64 / tokens.max(1) as f64
    );
    Ok(())
}
