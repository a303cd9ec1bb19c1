//! Prefill cost of the gateway's embedded engine on a real harness
//! request, cold vs the conversation's second turn (prefix cache):
//!
//! ```sh
//! cargo run --release --example embedded_prefill -- REQUEST.json [MODEL.toml]
//! ```
//!
//! REQUEST.json is an Anthropic Messages body (e.g. one Claude Code sent,
//! captured as the README describes). The request is rendered with the
//! shipped tokenizer and the embedded template exactly as the gateway
//! renders it, and generated from (6 tokens) by the default embedded
//! model; the second turn is its prompt + reply + a new user message,
//! rendered token-exactly as the gateway does, run warm (same engine) and
//! cold (a fresh one).

use std::time::Instant;

use anyhow::{Context, Result};
use gyre::gateway::anthropic;
use gyre::gateway::chat::{Message, Role};
use gyre::gateway::embedded::{self, EmbeddedConfig};
use gyre::gateway::render::PriorCall;
use gyre_gpu::engine::{Engine, Request, SamplingParams};
use gyre_gpu::model::vocab::Special;

fn run(engine: &mut Engine, prompt: &[u32], label: &str) -> Result<Vec<u32>> {
    let before = engine.load();
    let t = Instant::now();
    let c = engine.generate(Request {
        prompt: prompt.to_vec(),
        params: SamplingParams {
            max_new_tokens: 6,
            stop_tokens: vec![Special::EndTurn.id()],
            seed: 1,
            ..Default::default()
        },
    })?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let after = engine.load();
    println!(
        "{label:<22} prompt {:>6} tokens  prefilled {:>6}  reused {:>6}  {ms:>9.0} ms",
        prompt.len(),
        after.prefilled - before.prefilled,
        after.prefix_reused - before.prefix_reused,
    );
    Ok(c.tokens)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .context("usage: embedded_prefill REQUEST.json [MODEL.toml]")?;
    let model = args.next();
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let body: serde_json::Value =
        serde_json::from_str(&text).context("REQUEST.json is not JSON")?;
    let obj = body
        .as_object()
        .context("REQUEST.json is not a JSON object")?;
    let req =
        anthropic::parse(obj, 64, true).map_err(|e| anyhow::anyhow!(e.message().to_string()))?;
    let renderer = embedded::renderer()?;
    let t = Instant::now();
    let first = renderer.full(&req.messages, &req.tools)?;
    println!(
        "request {} bytes -> {} tokens with the shipped tokenizer ({:.2} bytes/token; render + tokenise {:.1} ms)",
        text.len(),
        first.ids.len(),
        text.len() as f64 / first.ids.len() as f64,
        t.elapsed().as_secs_f64() * 1e3
    );
    let cfg = EmbeddedConfig::read(model.as_deref().map(std::path::Path::new))?;
    let mut warm = cfg.engine()?;
    let out = run(&mut warm, &first.ids, "turn 1 (cold)")?;
    let mut messages = req.messages.clone();
    let reply: Vec<u32> = out
        .iter()
        .copied()
        .filter(|&t| t != Special::EndTurn.id())
        .collect();
    messages.push(Message::text(
        Role::Assistant,
        renderer.tokenizer.decode(&reply),
    ));
    messages.push(Message::text(
        Role::User,
        "Thanks. Now list the files in this directory.",
    ));
    let matched = req.messages.len() + 1;
    let second = renderer.prompt(
        &messages,
        &req.tools,
        Some(PriorCall {
            input_ids: &first.ids,
            output_ids: &out,
            matched,
        }),
    )?;
    run(&mut warm, &second.ids, "turn 2 (warm)")?;
    let mut cold = cfg.engine()?;
    run(&mut cold, &second.ids, "turn 2 (cold)")?;
    Ok(())
}
