//! The hand-written pass against candle's autograd of the same model (the
//! reference the engine's forward shares): log-probs and every
//! parameter's gradient, for each architecture and its variants.

use candle_core::{Device, Tensor};

use super::{Batch, TrainPass};
use crate::model::config::{Arch, DecoderArch, Family, ModelConfig, RopeScaling};
use crate::model::forward::{hidden_batch, log_softmax, logits};
use crate::model::params::{ParamBuffer, ParamLayout};
use crate::model::weights::{Weights, add_grads};

fn qwen3() -> ModelConfig {
    ModelConfig {
        vocab: 300,
        layers: 2,
        heads: 4,
        width: 32,
        ffn: 48,
        context: 64,
        arch: Arch::Decoder(DecoderArch {
            family: Family::Qwen3,
            kv_heads: 2,
            head_dim: 8,
            rope_theta: 10_000.0,
            rope_scaling: None,
            norm_eps: 1e-6,
            tie_embeddings: true,
            attention_bias: false,
        }),
    }
}

fn llama() -> ModelConfig {
    ModelConfig {
        vocab: 280,
        layers: 2,
        heads: 4,
        width: 32,
        ffn: 40,
        context: 64,
        arch: Arch::Decoder(DecoderArch {
            family: Family::Llama,
            kv_heads: 1,
            head_dim: 6,
            rope_theta: 500_000.0,
            rope_scaling: Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 16,
            }),
            norm_eps: 1e-5,
            tie_embeddings: false,
            attention_bias: true,
        }),
    }
}

/// Seeded weights with every tensor perturbed, so that norms' gains and
/// biases are not their neutral initial values.
fn params(cfg: &ModelConfig) -> ParamBuffer {
    let mut p = ParamBuffer::init(cfg, 7).unwrap();
    for (i, x) in p.data.iter_mut().enumerate() {
        *x += 0.05 * ((i as f32) * 0.618).sin();
    }
    p
}

/// Three right-padded rows of different lengths, targets scattered over
/// them (some rows' last real positions, some early ones), and a weight
/// per target.
fn batch(cfg: &ModelConfig) -> (Vec<u32>, usize, usize, Vec<usize>, Vec<u32>, Vec<f32>) {
    let (n, t) = (3, 19);
    let lens = [19, 11, 6];
    let mut ids = vec![0u32; n * t];
    for (r, &len) in lens.iter().enumerate() {
        for i in 0..len {
            ids[r * t + i] = ((r * 31 + i * 17 + 5) % cfg.vocab) as u32;
        }
    }
    let mut at = Vec::new();
    let mut tokens = Vec::new();
    for (r, &len) in lens.iter().enumerate() {
        for u in (1..len).filter(|u| u % 2 == 1 || *u + 1 == len) {
            at.push(r * t + u - 1);
            tokens.push(ids[r * t + u]);
        }
    }
    let w = (0..at.len())
        .map(|i| 0.3 * ((i as f32) * 1.3).cos())
        .collect();
    (ids, n, t, at, tokens, w)
}

/// Log-probs and Σ w·log p's gradients by candle's autograd.
fn reference(
    cfg: &ModelConfig,
    p: &ParamBuffer,
    ids: &[u32],
    (n, t): (usize, usize),
    at: &[usize],
    tokens: &[u32],
    w: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let layout = ParamLayout::new(cfg).unwrap();
    let (weights, vars) = Weights::vars(cfg, p).unwrap();
    let hidden = hidden_batch(&weights, ids, n, t)
        .unwrap()
        .reshape((n * t, cfg.width))
        .unwrap();
    let k = at.len();
    let idx = Tensor::from_vec(
        at.iter().map(|&a| a as u32).collect::<Vec<_>>(),
        k,
        &Device::Cpu,
    )
    .unwrap();
    let lsm =
        log_softmax(&logits(&weights, &hidden.index_select(&idx, 0).unwrap()).unwrap()).unwrap();
    let tok = Tensor::from_vec(tokens.to_vec(), (k, 1), &Device::Cpu).unwrap();
    let logp = lsm.gather(&tok, 1).unwrap().squeeze(1).unwrap();
    let wt = Tensor::from_slice(w, k, &Device::Cpu).unwrap();
    let grads = (&logp * wt).unwrap().sum_all().unwrap().backward().unwrap();
    let mut out = vec![0f32; layout.total];
    add_grads(&layout, &vars, &grads, &mut out).unwrap();
    (logp.to_vec1().unwrap(), out)
}

/// Gradients must agree within `tol` of each tensor's largest entry.
fn check(cfg: &ModelConfig, tol: f32) {
    let layout = ParamLayout::new(cfg).unwrap();
    let p = params(cfg);
    let (ids, n, t, at, tokens, w) = batch(cfg);
    let (want_lp, want_g) = reference(cfg, &p, &ids, (n, t), &at, &tokens, &w);
    let b = Batch {
        ids: &ids,
        n,
        t,
        at: &at,
        tokens: &tokens,
    };
    let pass = TrainPass::forward(cfg, &layout, &p.data, &b).unwrap();
    for (i, (a, b)) in pass.logprobs().iter().zip(&want_lp).enumerate() {
        assert!((a - b).abs() < 2e-5, "target {i}: log-prob {a} vs {b}");
    }
    assert_eq!(pass.logprobs().len(), want_lp.len());
    // The gradient adds into what the buffer holds.
    let mut got = vec![1f32; layout.total];
    pass.backward(&layout, &p.data, &w, &mut got).unwrap();
    for s in &layout.specs {
        let (g, r) = (
            &got[s.offset..s.offset + s.len],
            &want_g[s.offset..s.offset + s.len],
        );
        let scale = r.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
        let worst = g
            .iter()
            .zip(r)
            .map(|(g, r)| (g - 1.0 - r).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= tol * scale,
            "{}: gradient differs by {worst} (largest {scale})",
            s.name
        );
    }
}

#[test]
fn gyre_values_and_gradients_match_candles_autograd() {
    check(&ModelConfig::tiny(), 1e-4);
}

#[test]
fn qwen3_values_and_gradients_match_candles_autograd() {
    check(&qwen3(), 1e-4);
}

#[test]
fn llama_with_biases_an_untied_head_and_scaled_rope_matches_candles_autograd() {
    check(&llama(), 1e-4);
}

#[test]
fn the_policy_bench_shapes_match_candles_autograd() {
    // A norm gain's gradient sums thousands of rows' terms that largely
    // cancel, so the two orders of summation differ by more here.
    check(&ModelConfig::qwen3_small(), 2e-3);
    check(&ModelConfig::default(), 2e-3);
}

#[test]
fn bad_batches_are_refused_naming_what_is_wrong() {
    let cfg = ModelConfig::tiny();
    let layout = ParamLayout::new(&cfg).unwrap();
    let p = params(&cfg);
    let ids = vec![1u32; 8];
    let forward = |at: &[usize], tokens: &[u32], params: &[f32]| {
        let b = Batch {
            ids: &ids,
            n: 2,
            t: 4,
            at,
            tokens,
        };
        TrainPass::forward(&cfg, &layout, params, &b)
            .unwrap_err()
            .to_string()
    };
    assert!(forward(&[8], &[1], &p.data).contains("row 8 of a batch of 8"));
    let empty = Batch {
        ids: &[],
        n: 2,
        t: 0,
        at: &[],
        tokens: &[],
    };
    let err = TrainPass::forward(&cfg, &layout, &p.data, &empty).unwrap_err();
    assert!(err.to_string().contains("an empty batch"), "{err}");
    assert!(forward(&[0], &[1, 2], &p.data).contains("1 target rows for 2"));
    assert!(forward(&[0], &[100_000], &p.data).contains("token id 100000"));
    assert!(forward(&[0], &[1], &p.data[1..]).contains("holds"));
    let b = Batch {
        ids: &ids,
        n: 2,
        t: 4,
        at: &[0],
        tokens: &[1],
    };
    let pass = TrainPass::forward(&cfg, &layout, &p.data, &b).unwrap();
    let mut g = vec![0f32; layout.total];
    let err = pass.backward(&layout, &p.data, &[1.0, 2.0], &mut g);
    assert!(err.unwrap_err().to_string().contains("needs 1"));
}
