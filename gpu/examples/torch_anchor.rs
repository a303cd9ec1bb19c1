//! Gyre's side of the PyTorch comparison (`scripts/torch_anchor.sh` runs
//! both): the tiny Qwen3 shape of `benches/policy.rs` as a Hugging Face
//! checkpoint that `transformers` loads too (`DIR/qwen3`), Gyre's own
//! default model as a Gyre safetensors file that the script's PyTorch
//! module of that architecture loads (`DIR/gyre.safetensors`), and Gyre's
//! engine and trainer timed on either the way `scripts/torch_anchor.py`
//! times PyTorch.
//!
//! ```text
//! cargo run --release -p gyre-gpu --example torch_anchor -- write DIR
//! cargo run --release -p gyre-gpu --example torch_anchor -- bench DIR/qwen3 [REPS]
//! cargo run --release -p gyre-gpu --example torch_anchor -- bench DIR/gyre.safetensors [REPS]
//! ```
//!
//! `bench` prints one JSON line: the median seconds of generation with 1
//! and with 32 concurrent requests (32-token prompts, 64 sampled tokens
//! each, temperature 1) and of one training step over 8 rows of 128
//! tokens (forward+backward of the policy objective, then the core's
//! clipped AdamW update), with the tokens each processed, and the
//! teacher-forced log-probs of the first training row's targets under
//! the initial weights (the script checks PyTorch computes the same
//! function: `logprobs`).

use std::path::Path;
use std::time::Instant;

use gyre_gpu::engine::{Engine, EngineConfig, Request, SamplingParams};
use gyre_gpu::model::hf::{self, HfConfig, LoadOptions};
use gyre_gpu::model::{ModelConfig, ParamBuffer, safetensors_io};
use gyre_gpu::trainer::{Loss, MicroStep, OptimConfig, TrainRow, Trainer};

const PROMPT: usize = 32;
const NEW_TOKENS: u32 = 64;
const ROWS: usize = 8;
const ROW_LEN: usize = 128;

/// `ModelConfig::qwen3_small` (the policy bench's Qwen3 shape) as a
/// checkpoint configuration.
fn qwen3_small() -> HfConfig {
    let model = ModelConfig::qwen3_small();
    HfConfig {
        max_positions: model.context,
        model,
        bos_token_id: None,
        eos_token_ids: Vec::new(),
    }
}

fn prompt(i: usize) -> Vec<u32> {
    (0..PROMPT)
        .map(|t| ((t * 7 + i * 13) % 256) as u32)
        .collect()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn generate(engine: &mut Engine, concurrent: usize, rep: usize) -> Result<f64, String> {
    let t = Instant::now();
    for i in 0..concurrent {
        let params = SamplingParams {
            max_new_tokens: NEW_TOKENS,
            seed: (rep * 1000 + i) as u64,
            ..Default::default()
        };
        let req = Request {
            prompt: prompt(i),
            params,
        };
        engine.submit(req).map_err(|e| e.to_string())?;
    }
    let done = engine.run_until_idle().map_err(|e| e.to_string())?;
    let tokens: usize = done.iter().map(|c| c.tokens.len()).sum();
    if tokens != concurrent * NEW_TOKENS as usize {
        return Err(format!("{tokens} tokens generated"));
    }
    Ok(t.elapsed().as_secs_f64())
}

fn train_rows() -> Vec<TrainRow> {
    (0..ROWS)
        .map(|r| TrainRow {
            execution: r as u32,
            input_ids: (0..ROW_LEN)
                .map(|t| ((t * 31 + r * 7) % 256) as u32)
                .collect(),
            target: (0..ROW_LEN).map(|t| t >= PROMPT).collect(),
            behaviour_logprobs: vec![-5.5; ROW_LEN],
            coefficients: vec![1.0 / (96.0 * ROWS as f32); ROW_LEN],
            advantage: if r % 2 == 0 { 1.0 } else { -1.0 },
        })
        .collect()
}

/// Both models of the comparison under `dir`.
fn write(dir: &Path) -> Result<(), String> {
    let cfg = qwen3_small();
    let params = ParamBuffer::init(&cfg.model, 1).map_err(|e| e.to_string())?;
    hf::save(&dir.join("qwen3"), &cfg, &params, 1).map_err(|e| e.to_string())?;
    let gyre = ModelConfig::default();
    let params = ParamBuffer::init(&gyre, 1).map_err(|e| e.to_string())?;
    safetensors_io::save(&dir.join("gyre.safetensors"), &gyre, &params).map_err(|e| e.to_string())
}

/// A Gyre safetensors file, or a Hugging Face checkpoint directory.
fn load(path: &Path) -> Result<(ModelConfig, ParamBuffer), String> {
    if path.is_file() {
        return safetensors_io::load(path).map_err(|e| e.to_string());
    }
    let ck = hf::load(path, &LoadOptions::default()).map_err(|e| e.to_string())?;
    Ok((ck.config.model, ck.params))
}

/// The trainer both modes time, with the PyTorch side's optimizer.
fn trainer_for(model: &ModelConfig, params: &ParamBuffer) -> Result<Trainer, String> {
    let optim = OptimConfig {
        lr: 1e-4,
        weight_decay: 0.01,
        ..Default::default()
    };
    Trainer::core(model, params, optim).map_err(|e| e.to_string())
}

/// One training step (forward, backward, AdamW update); its seconds.
fn train_step(
    trainer: &mut Trainer,
    rows: &[TrainRow],
    step: &MicroStep,
    loss: &Loss,
) -> Result<f64, String> {
    let t = Instant::now();
    trainer
        .accumulate(rows, step, loss, None)
        .map_err(|e| e.to_string())?;
    let grads = trainer.export_grads().map_err(|e| e.to_string())?;
    trainer.apply(&grads).map_err(|e| e.to_string())?;
    Ok(t.elapsed().as_secs_f64())
}

fn bench(path: &Path, reps: usize) -> Result<(), String> {
    let (model, params) = load(path)?;
    let cfg = EngineConfig::for_model(model.clone(), 32);
    let mut engine = Engine::new(cfg, &params).map_err(|e| e.to_string())?;
    let mut trainer = trainer_for(&model, &params)?;
    let rows = train_rows();
    let first = MicroStep::whole(&rows[..1]);
    let logprobs = trainer
        .token_logprobs(&rows[..1], &first)
        .map_err(|e| e.to_string())?;
    let step = MicroStep::whole(&rows);
    let loss = Loss::Policy(Default::default());
    // One warm-up of each, then `reps` timed runs.
    let (mut one, mut many, mut train) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..=reps {
        let a = generate(&mut engine, 1, rep)?;
        let b = generate(&mut engine, 32, rep)?;
        let c = train_step(&mut trainer, &rows, &step, &loss)?;
        if rep > 0 {
            one.push(a);
            many.push(b);
            train.push(c);
        }
    }
    let out = serde_json::json!({
        "impl": "gyre",
        "model": if model.arch.is_gyre() { "gyre" } else { "qwen3" },
        "threads": candle_core::utils::get_num_threads(),
        "reps": reps,
        "generate_1_s": median(one),
        "generate_1_tokens": NEW_TOKENS,
        "generate_32_s": median(many),
        "generate_32_tokens": 32 * NEW_TOKENS,
        "train_s": median(train),
        "train_tokens": ROWS * ROW_LEN,
        "logprobs": logprobs,
    });
    println!("{out}");
    Ok(())
}

/// Only the training step, `reps` times (for a profiler: `perf record`
/// on `torch_anchor train DIR/gyre.safetensors 50`); prints its median.
fn train_only(path: &Path, reps: usize) -> Result<(), String> {
    let (model, params) = load(path)?;
    let mut trainer = trainer_for(&model, &params)?;
    let rows = train_rows();
    let step = MicroStep::whole(&rows);
    let loss = Loss::Policy(Default::default());
    let mut train = Vec::new();
    for _ in 0..reps {
        train.push(train_step(&mut trainer, &rows, &step, &loss)?);
    }
    let out = serde_json::json!({
        "impl": "gyre",
        "threads": candle_core::utils::get_num_threads(),
        "reps": reps,
        "train_s": median(train),
        "train_tokens": ROWS * ROW_LEN,
    });
    println!("{out}");
    Ok(())
}

/// Only generation with `concurrent` requests, `reps` times (for a
/// profiler: `perf record` on `torch_anchor generate DIR/gyre.safetensors
/// 50`); prints its median.
fn generate_only(path: &Path, reps: usize, concurrent: usize) -> Result<(), String> {
    let (model, params) = load(path)?;
    let cfg = EngineConfig::for_model(model.clone(), 32);
    let mut engine = Engine::new(cfg, &params).map_err(|e| e.to_string())?;
    let mut many = Vec::new();
    for rep in 0..reps {
        many.push(generate(&mut engine, concurrent, rep)?);
    }
    let out = serde_json::json!({
        "impl": "gyre",
        "threads": candle_core::utils::get_num_threads(),
        "reps": reps,
        "concurrent": concurrent,
        "generate_s": median(many),
        "generate_tokens": concurrent * NEW_TOKENS as usize,
    });
    println!("{out}");
    Ok(())
}

fn main() {
    gyre_gpu::cpu::settle();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["write", dir] => write(Path::new(dir)),
        ["bench", dir] => bench(Path::new(dir), 5),
        ["bench", dir, reps] => match reps.parse() {
            Ok(n) if n > 0 => bench(Path::new(dir), n),
            _ => Err(format!("REPS must be a positive integer, got {reps:?}")),
        },
        ["train", dir, reps] => match reps.parse() {
            Ok(n) if n > 0 => train_only(Path::new(dir), n),
            _ => Err(format!("REPS must be a positive integer, got {reps:?}")),
        },
        ["generate", dir, reps] => match reps.parse() {
            Ok(n) if n > 0 => generate_only(Path::new(dir), n, 32),
            _ => Err(format!("REPS must be a positive integer, got {reps:?}")),
        },
        ["generate", dir, reps, concurrent] => match (reps.parse(), concurrent.parse()) {
            (Ok(n), Ok(c)) if n > 0 && c > 0 => generate_only(Path::new(dir), n, c),
            _ => Err(format!(
                "REPS and CONCURRENT must be positive integers, got {reps:?} and {concurrent:?}"
            )),
        },
        _ => Err(
            "usage: torch_anchor write DIR | bench DIR/qwen3|DIR/gyre.safetensors [REPS] | train DIR/qwen3|DIR/gyre.safetensors REPS | generate DIR/qwen3|DIR/gyre.safetensors REPS [CONCURRENT]".into(),
        ),
    };
    if let Err(e) = result {
        eprintln!("torch_anchor: {e}");
        std::process::exit(1);
    }
}
