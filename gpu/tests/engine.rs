//! The embedded engine on the tiny model: continuous batching does not
//! change results, abort frees memory, KV migration continues a request
//! exactly, release/resume restores service, bad requests are rejected.

use gyre_gpu::engine::{
    Engine, EngineConfig, EngineError, FinishReason, MemTag, Request, SamplingParams,
};
use gyre_gpu::memory::Tag;
use gyre_gpu::model::vocab::{self, Role};
use gyre_gpu::model::{ModelConfig, ParamBuffer};

fn engine(seed: u64) -> Engine {
    let cfg = EngineConfig::for_model(ModelConfig::tiny(), 8);
    Engine::new(cfg, &ParamBuffer::init(&ModelConfig::tiny(), seed).unwrap()).unwrap()
}

fn req(text: &str, max_new: u32, seed: u64) -> Request {
    Request {
        prompt: vocab::chat(&[(Role::User, text)]),
        params: SamplingParams {
            max_new_tokens: max_new,
            seed,
            ..Default::default()
        },
    }
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

#[test]
fn batching_does_not_change_outputs() {
    let mut e = engine(1);
    let alone = e.generate(req("hello", 12, 5)).unwrap();
    assert_eq!(alone.tokens.len(), 12);
    assert_eq!(alone.finish, FinishReason::Length);
    assert!(alone.logprobs.iter().all(|&l| l < 0.0 && l.is_finite()));
    // The same request among seven others, with prompts chunked.
    let mut cfg = EngineConfig::for_model(ModelConfig::tiny(), 8);
    cfg.max_batch_tokens = 5;
    let mut e2 = Engine::new(cfg, &ParamBuffer::init(&ModelConfig::tiny(), 1).unwrap()).unwrap();
    let mut ids = Vec::new();
    for i in 0..8u64 {
        let r = if i == 3 {
            req("hello", 12, 5)
        } else {
            req("other prompt", 6 + i as u32, i)
        };
        ids.push(e2.submit(r).unwrap());
    }
    let done = e2.run_until_idle().unwrap();
    assert_eq!(done.len(), 8);
    let c = done.iter().find(|c| c.id == ids[3]).unwrap();
    assert_eq!(c.tokens, alone.tokens);
    // Bit for bit: a row's arithmetic does not depend on the rows beside
    // it (a `gyre serve` engine batches a run's calls differently from an
    // in-process one, and the first update must not change).
    assert_eq!(c.logprobs, alone.logprobs);
    assert_eq!(e2.load().kv_blocks_used, 0);
}

#[test]
fn stop_tokens_end_a_request_and_seeds_differ() {
    let mut e = engine(2);
    let a = e.generate(req("x", 20, 1)).unwrap();
    let b = e.generate(req("x", 20, 2)).unwrap();
    assert_ne!(a.tokens, b.tokens);
    let stop = a.tokens[4];
    let mut r = req("x", 20, 1);
    r.params.stop_tokens = vec![stop];
    let s = e.generate(r).unwrap();
    let first = a.tokens.iter().position(|&t| t == stop).unwrap();
    assert_eq!(s.finish, FinishReason::Stop);
    assert_eq!(s.tokens, a.tokens[..=first].to_vec());
}

#[test]
fn abort_returns_partial_output_and_frees_blocks() {
    let mut e = engine(3);
    let id = e.submit(req("abort me", 30, 9)).unwrap();
    for _ in 0..5 {
        e.step().unwrap();
    }
    assert!(e.load().kv_blocks_used > 0);
    let c = e.abort(id).unwrap();
    assert_eq!(c.finish, FinishReason::Aborted);
    assert_eq!(c.tokens.len(), 5);
    assert_eq!(c.logprobs.len(), 5);
    assert_eq!(e.load().kv_blocks_used, 0);
    assert!(matches!(e.abort(id), Err(EngineError::Unknown(_))));
    // The partial output is a prefix of the uninterrupted one.
    let full = e.generate(req("abort me", 30, 9)).unwrap();
    assert_eq!(full.tokens[..5], c.tokens[..]);
}

#[test]
fn migrated_kv_continues_with_the_same_distribution() {
    let mut src = engine(4);
    let reference = src.generate(req("migrate", 16, 11)).unwrap();
    let id = src.submit(req("migrate", 16, 11)).unwrap();
    for _ in 0..6 {
        src.step().unwrap();
    }
    let expected = src.next_token_logprobs(id).unwrap();
    let pin = src.pin_kv(id).unwrap();
    let partial = src.abort(id).unwrap();
    assert_eq!(partial.tokens.len(), 6);
    // Pinned blocks outlive the aborted request.
    assert!(src.load().kv_blocks_used > 0);
    let snap = src.export_pinned(pin).unwrap();
    let bytes = snap.encode();

    let mut dst = engine(4);
    let mut prompt = partial.prompt.clone();
    prompt.extend(&partial.tokens);
    let mut r = req("migrate", 10, 11);
    r.prompt = prompt;
    let snap = gyre_gpu::engine::KvSnapshot::decode(&bytes).unwrap();
    assert_eq!(snap.tokens.len(), partial.prompt.len() + 5);
    let did = dst.submit_with_kv(r, snap).unwrap();
    let got = dst.next_token_logprobs(did).unwrap();
    assert!(close(&got, &expected, 1e-5), "distributions differ");
    let rest = dst.run_until_idle().unwrap().pop().unwrap();
    assert_eq!(rest.tokens, reference.tokens[6..].to_vec());
    assert!(close(&rest.logprobs, &reference.logprobs[6..], 1e-4));
    src.release_pin(pin).unwrap();
    assert_eq!(src.load().kv_blocks_used, 0);
}

#[test]
fn kv_import_is_checked() {
    let mut src = engine(5);
    let id = src.submit(req("abc", 8, 1)).unwrap();
    src.step().unwrap();
    let pin = src.pin_kv(id).unwrap();
    let snap = src.export_pinned(pin).unwrap();
    let mut other = engine(5);
    // Wrong prompt.
    assert!(matches!(
        other.submit_with_kv(req("zzz", 4, 1), snap.clone()),
        Err(EngineError::KvMismatch(_))
    ));
    // Wrong weight version.
    let mut p = ParamBuffer::init(&ModelConfig::tiny(), 5).unwrap();
    p.version = 3;
    other.update_weights(&p).unwrap();
    let mut r = req("abc", 4, 1);
    r.prompt = snap.tokens.clone();
    r.prompt.push(1);
    assert!(matches!(
        other.submit_with_kv(r, snap),
        Err(EngineError::KvMismatch(_))
    ));
    // A pin blocks weight updates (its KV would no longer match).
    assert!(matches!(
        src.update_weights(&p),
        Err(EngineError::PinsHeld(1))
    ));
}

#[test]
fn release_and_resume_restore_identical_service() {
    let mut e = engine(6);
    let before = e.generate(req("memory", 10, 3)).unwrap();
    let full = e.memory_report().resident;
    let id = e.submit(req("busy", 4, 1)).unwrap();
    assert!(matches!(
        e.release_memory(&[MemTag::Weights]),
        Err(EngineError::Busy { .. })
    ));
    e.abort(id).unwrap();
    let freed = e
        .release_memory(&[MemTag::Weights, MemTag::KvCache])
        .unwrap();
    assert_eq!(freed, full);
    let rep = e.memory_report();
    assert_eq!(rep.resident, 0);
    assert_eq!(rep.usage(Tag::KvCache).unwrap().resident, 0);
    assert!(rep.usage(Tag::RolloutWeights).unwrap().host_backup > 0);
    assert!(!e.health().serving);
    e.submit(req("memory", 10, 3)).unwrap();
    assert!(matches!(e.step(), Err(EngineError::NotServing { .. })));
    e.abort_all();
    e.resume_memory(&[
        MemTag::parse("weights").unwrap(),
        MemTag::parse("kv_cache").unwrap(),
    ])
    .unwrap();
    assert!(e.health().serving);
    assert_eq!(e.memory_report().resident, full);
    let after = e.generate(req("memory", 10, 3)).unwrap();
    assert_eq!(after.tokens, before.tokens);
    assert_eq!(after.logprobs, before.logprobs);
    assert!(MemTag::parse("optimizer").is_err());
}

#[test]
fn weight_update_mid_request_recomputes_under_new_weights() {
    let mut e = engine(7);
    let id = e.submit(req("update", 8, 2)).unwrap();
    for _ in 0..3 {
        e.step().unwrap();
    }
    let mut p = ParamBuffer::init(&ModelConfig::tiny(), 70).unwrap();
    p.version = 1;
    e.update_weights_from_bytes(&p.encode()).unwrap();
    let c = e.run_until_idle().unwrap().pop().unwrap();
    assert_eq!(c.id, id);
    assert_eq!(c.versions, (0, 1));
    // The tokens after the update are what a fresh engine on the new
    // weights samples from the same context.
    let mut fresh = Engine::new(EngineConfig::for_model(ModelConfig::tiny(), 8), &p).unwrap();
    let mut r = req("update", 5, 2);
    r.prompt.extend(&c.tokens[..3]);
    let cont = fresh.generate(r).unwrap();
    assert_eq!(cont.tokens, c.tokens[3..].to_vec());
    assert!(close(&cont.logprobs, &c.logprobs[3..], 1e-5));
    assert_eq!(e.export_weights().unwrap(), p);
}

#[test]
fn bad_requests_are_rejected_alone() {
    let mut e = engine(8);
    let bad = |prompt: Vec<u32>, params: SamplingParams| Request { prompt, params };
    let p = SamplingParams::default();
    assert!(matches!(
        e.submit(bad(vec![], p.clone())),
        Err(EngineError::Invalid(_))
    ));
    assert!(matches!(
        e.submit(bad(vec![9999], p.clone())),
        Err(EngineError::Invalid(_))
    ));
    assert!(matches!(
        e.submit(bad(vec![1; 64], p.clone())),
        Err(EngineError::Invalid(_))
    ));
    let nan = SamplingParams {
        temperature: f32::NAN,
        ..p.clone()
    };
    assert!(matches!(
        e.submit(bad(vec![1], nan)),
        Err(EngineError::Invalid(_))
    ));
    let top = SamplingParams {
        top_p: 0.0,
        ..p.clone()
    };
    assert!(matches!(
        e.submit(bad(vec![1], top)),
        Err(EngineError::Invalid(_))
    ));
    let zero = SamplingParams {
        max_new_tokens: 0,
        ..p.clone()
    };
    assert!(matches!(
        e.submit(bad(vec![1], zero)),
        Err(EngineError::Invalid(_))
    ));
    let mut small = EngineConfig::for_model(ModelConfig::tiny(), 1);
    small.kv_blocks = 2;
    let mut s = Engine::new(small, &ParamBuffer::init(&ModelConfig::tiny(), 1).unwrap()).unwrap();
    let long = SamplingParams {
        max_new_tokens: 60,
        ..p.clone()
    };
    assert!(matches!(
        s.submit(bad(vec![1; 3], long)),
        Err(EngineError::TooLarge { .. })
    ));
    let mut nan = ParamBuffer::init(&ModelConfig::tiny(), 8).unwrap();
    nan.data[10] = f32::NAN;
    assert!(matches!(e.update_weights(&nan), Err(EngineError::Model(_))));
    let other = ParamBuffer::init(
        &ModelConfig {
            ffn: 32,
            ..ModelConfig::tiny()
        },
        8,
    )
    .unwrap();
    assert!(matches!(
        e.update_weights(&other),
        Err(EngineError::Model(_))
    ));
    assert!(e.update_weights_from_bytes(b"garbage").is_err());
    // The engine still serves.
    let ok = e.generate(req("fine", 3, 0)).unwrap();
    assert_eq!(ok.tokens.len(), 3);
    let h = e.health();
    assert!(h.serving && h.version == 0);
}

#[test]
fn max_running_and_pool_limits_queue_requests() {
    let mut cfg = EngineConfig::for_model(ModelConfig::tiny(), 2);
    cfg.max_running = 2;
    let mut e = Engine::new(cfg, &ParamBuffer::init(&ModelConfig::tiny(), 1).unwrap()).unwrap();
    for i in 0..5 {
        e.submit(req("q", 4, i)).unwrap();
    }
    e.step().unwrap();
    let l = e.load();
    assert_eq!((l.running, l.waiting), (2, 3));
    let done = e.run_until_idle().unwrap();
    assert_eq!(done.len(), 5);
    assert_eq!(e.load().generated, 20);
}
