//! Throughput of the embedded policy with the default small model and a
//! Qwen3-shaped decoder of the same width (GQA, RoPE, q/k norm, SwiGLU,
//! tied head): generation (one request, 32 concurrent) and training
//! micro-steps for both; release and restore of engine memory by tag and
//! export/import of the weight buffer for the default model.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group};
use gyre_gpu::engine::{Engine, EngineConfig, MemTag, Request, SamplingParams};
use gyre_gpu::model::{ModelConfig, ParamBuffer};
use gyre_gpu::trainer::{Loss, MicroStep, TrainRow, Trainer};

const NEW_TOKENS: u32 = 64;

fn request(i: u64) -> Request {
    Request {
        prompt: (0..32).map(|t| ((t * 7 + i * 13) % 256) as u32).collect(),
        params: SamplingParams {
            max_new_tokens: NEW_TOKENS,
            seed: i,
            ..Default::default()
        },
    }
}

fn models() -> [(&'static str, ModelConfig); 2] {
    [
        ("gyre", ModelConfig::default()),
        ("qwen3", ModelConfig::qwen3_small()),
    ]
}

fn generation(c: &mut Criterion) {
    let mut g = c.benchmark_group("generate");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for (name, cfg) in models() {
        let params = ParamBuffer::init(&cfg, 1).unwrap();
        let mut engine = Engine::new(EngineConfig::for_model(cfg, 32), &params).unwrap();
        for concurrent in [1u64, 32] {
            g.throughput(Throughput::Elements(concurrent * u64::from(NEW_TOKENS)));
            g.bench_function(
                format!("{name}_{concurrent}_requests_x{NEW_TOKENS}_tokens"),
                |b| {
                    b.iter(|| {
                        for i in 0..concurrent {
                            engine.submit(request(i)).unwrap();
                        }
                        engine.run_until_idle().unwrap()
                    })
                },
            );
        }
    }
    g.finish();
}

fn training(c: &mut Criterion) {
    let mut g = c.benchmark_group("train");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for (name, cfg) in models() {
        train_one(&mut g, name, &cfg);
    }
    g.finish();
}

fn train_one(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    cfg: &ModelConfig,
) {
    let params = ParamBuffer::init(cfg, 1).unwrap();
    let mut trainer = Trainer::new(cfg, &params).unwrap();
    let (rows_n, len) = (8usize, 128usize);
    let rows: Vec<TrainRow> = (0..rows_n)
        .map(|r| TrainRow {
            execution: r as u32,
            input_ids: (0..len).map(|t| ((t * 31 + r * 7) % 256) as u32).collect(),
            target: (0..len).map(|t| t >= 32).collect(),
            behaviour_logprobs: vec![-5.5; len],
            coefficients: vec![1.0 / (96.0 * rows_n as f32); len],
            advantage: if r % 2 == 0 { 1.0 } else { -1.0 },
        })
        .collect();
    let step = MicroStep::whole(&rows);
    g.throughput(Throughput::Elements((rows_n * len) as u64));
    g.bench_function(format!("{name}_fwd_bwd_{rows_n}x{len}_tokens"), |b| {
        b.iter(|| {
            let r = trainer
                .accumulate(&rows, &step, &Loss::Policy(Default::default()), None)
                .unwrap();
            trainer.zero_grads().unwrap();
            r
        })
    });
}

fn memory(c: &mut Criterion) {
    let cfg = ModelConfig::default();
    let params = ParamBuffer::init(&cfg, 1).unwrap();
    let mut engine = Engine::new(EngineConfig::for_model(cfg.clone(), 32), &params).unwrap();
    let mut g = c.benchmark_group("memory");
    g.sample_size(20);
    for (name, tags) in [
        ("weights", vec![MemTag::Weights]),
        ("kv_cache", vec![MemTag::KvCache]),
        ("weights+kv_cache", vec![MemTag::Weights, MemTag::KvCache]),
    ] {
        g.bench_function(format!("release_resume_{name}"), |b| {
            b.iter(|| {
                engine.release_memory(&tags).unwrap();
                engine.resume_memory(&tags).unwrap();
            })
        });
    }
    let bytes = params.encode();
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("weights_export", |b| b.iter(|| params.encode()));
    g.bench_function("weights_import", |b| {
        let mut buf = params.clone();
        b.iter(|| buf.decode_into(&bytes).unwrap())
    });
    g.bench_function("engine_update_weights_from_bytes", |b| {
        b.iter(|| engine.update_weights_from_bytes(&bytes).unwrap())
    });
    g.finish();
}

criterion_group!(benches, generation, training, memory);

fn main() {
    // Before criterion or candle start a thread (see gyre_gpu::cpu).
    gyre_gpu::cpu::settle();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
