//! The engine's prefix cache on the tiny model: the second call of a
//! conversation prefills only its new suffix (plus the previous reply's
//! last token, which was never fed) and samples what a cold prefill
//! samples; forks from one entry and memory pressure keep results exact;
//! a weight update drops the cache.

use gyre_gpu::engine::{Completion, Engine, EngineConfig, Request, SamplingParams};
use gyre_gpu::model::vocab::{self, Role};
use gyre_gpu::model::{ModelConfig, ParamBuffer};

fn model() -> ModelConfig {
    ModelConfig {
        context: 256,
        ..ModelConfig::tiny()
    }
}

fn engine(prefix_cache: usize, kv_blocks: Option<usize>) -> Engine {
    let mut cfg = EngineConfig::for_model(model(), 4);
    cfg.prefix_cache = prefix_cache;
    cfg.max_batch_tokens = 24;
    if let Some(b) = kv_blocks {
        cfg.kv_blocks = b;
    }
    Engine::new(cfg, &ParamBuffer::init(&model(), 3).unwrap()).unwrap()
}

fn req(prompt: Vec<u32>, max_new: u32, seed: u64) -> Request {
    Request {
        prompt,
        params: SamplingParams {
            max_new_tokens: max_new,
            seed,
            ..Default::default()
        },
    }
}

fn close(a: &Completion, b: &Completion) {
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.logprobs.len(), b.logprobs.len());
    for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
        assert!((x - y).abs() <= 1e-4, "{x} vs {y}");
    }
}

/// Call 1's prompt + its output + a new user turn.
fn next_turn(first: &Completion, text: &str) -> Vec<u32> {
    let mut p = first.prompt.clone();
    p.extend(&first.tokens);
    p.push(vocab::Special::EndTurn.id());
    p.extend(&vocab::chat(&[(Role::User, text)])[1..]);
    p
}

#[test]
fn a_second_turn_prefills_only_its_suffix_and_matches_a_cold_prefill() {
    let mut warm = engine(4, None);
    let first_prompt = vocab::chat(&[(Role::System, "you are terse"), (Role::User, "hello")]);
    let first = warm.generate(req(first_prompt.clone(), 10, 1)).unwrap();
    let before = warm.load();
    assert_eq!(before.prefix_reused, 0);
    assert_eq!(before.prefilled, first_prompt.len() as u64);
    assert_eq!(before.prefix_entries, 1);

    let second_prompt = next_turn(&first, "and now more");
    let second = warm.generate(req(second_prompt.clone(), 10, 2)).unwrap();
    let after = warm.load();
    let kept = first.prompt.len() + first.tokens.len() - 1;
    assert_eq!(after.prefix_reused - before.prefix_reused, kept as u64);
    assert_eq!(
        after.prefilled - before.prefilled,
        (second_prompt.len() - kept) as u64,
        "only the suffix and the last sampled token are computed"
    );
    // The entry of call 1 is superseded by call 2's, which extends it.
    assert_eq!(after.prefix_entries, 1);

    let mut cold = engine(0, None);
    let reference = cold.generate(req(second_prompt, 10, 2)).unwrap();
    close(&second, &reference);
    assert_eq!(cold.load().prefix_reused, 0);
}

#[test]
fn forks_from_one_entry_and_memory_pressure_stay_exact() {
    // Room for exactly two full-context requests: entries must be evicted.
    let blocks = 2 * model().context.div_ceil(16);
    let mut warm = engine(8, Some(blocks));
    let mut cold = engine(0, None);
    let base = warm
        .generate(req(vocab::chat(&[(Role::User, "shared start")]), 12, 7))
        .unwrap();
    // Two continuations of the same entry at once, each checked against a
    // cold engine: the shared blocks are read by both, written by neither.
    let a = next_turn(&base, "left branch");
    let b = next_turn(&base, "right branch, a longer one");
    let ia = warm.submit(req(a.clone(), 8, 11)).unwrap();
    let ib = warm.submit(req(b.clone(), 8, 12)).unwrap();
    let done = warm.run_until_idle().unwrap();
    let get = |id| done.iter().find(|c| c.id == id).unwrap();
    close(get(ia), &cold.generate(req(a, 8, 11)).unwrap());
    close(get(ib), &cold.generate(req(b, 8, 12)).unwrap());
    assert!(warm.load().prefix_reused >= 2 * (base.prompt.len() as u64));
    // Unrelated long requests need every block: the cache gives them up.
    for i in 0..3u64 {
        let text = format!("unrelated request number {i} ").repeat(4);
        let r = req(vocab::chat(&[(Role::User, &text)]), 200, i);
        let got = warm.generate(r.clone()).unwrap();
        close(&got, &cold.generate(r).unwrap());
    }
    let load = warm.load();
    assert!(load.kv_blocks_used <= load.kv_blocks_total);
}

#[test]
fn a_weight_update_drops_the_cache() {
    let mut e = engine(4, None);
    let first = e
        .generate(req(vocab::chat(&[(Role::User, "hi")]), 6, 1))
        .unwrap();
    let prompt = next_turn(&first, "again");
    assert!(e.cached_prefix_len(&prompt) > 0);
    let mut p = ParamBuffer::init(&model(), 9).unwrap();
    p.version = 2;
    e.update_weights(&p).unwrap();
    assert_eq!(e.cached_prefix_len(&prompt), 0);
    assert_eq!(e.load().prefix_entries, 0);
    assert_eq!(e.load().kv_blocks_used, 0);
    let before = e.load().prefilled;
    e.generate(req(prompt.clone(), 4, 1)).unwrap();
    assert_eq!(e.load().prefilled - before, prompt.len() as u64);
}
