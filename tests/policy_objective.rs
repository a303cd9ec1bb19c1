//! The embedded trainer computes exactly the trajectory plane's objective
//! contract: on rows packed into micro-steps by the stream packer (rows cut
//! across micro-steps, several rows per execution, off-policy behaviour
//! log-probs that trigger the sequence clip, the ratio cap and the loss
//! cap), its loss, its per-token gradient and its parameter gradient match
//! `gyre_actors::trajectory::objective` evaluated on the same log-probs.

use gyre::embedded::trainer::micro_step;
use gyre_actors::trajectory::objective::{
    ObjectiveConfig as RefConfig, coefficient, loss_and_grad,
};
use gyre_actors::trajectory::packing::{TokenRow, flatten_targets, pack};
use gyre_actors::trajectory::tree::NodeId;
use gyre_gpu::model::{ModelConfig, ParamBuffer};
use gyre_gpu::trainer::{
    Loss, MicroStep, ObjectiveConfig, SeqStats, TrainRow, Trainer, data, objective,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ADVANTAGES: [f32; 5] = [2.0, -1.5, 40.0, 0.5, -0.7];

fn leaf() -> NodeId {
    // Node ids are opaque outside their tree; rows only carry them along.
    serde_json::from_str("1").unwrap()
}

/// Two rows per execution sharing a prompt, disjoint targets.
fn rows(rng: &mut ChaCha8Rng, vocab: u32) -> Vec<TokenRow> {
    let batch = 2 * ADVANTAGES.len() as u64;
    let mut out = Vec::new();
    for (e, &adv) in ADVANTAGES.iter().enumerate() {
        let prompt: Vec<u32> = (0..6).map(|_| rng.random_range(0..vocab)).collect();
        let shapes: Vec<(usize, usize)> = (0..2)
            .map(|_| (rng.random_range(4..14), rng.random_range(3..12)))
            .collect();
        let targets: u64 = shapes.iter().map(|s| s.0 as u64).sum();
        let c = coefficient(targets, batch);
        for (out_len, tail) in shapes {
            let mut ids = prompt.clone();
            let mut target = vec![false; prompt.len()];
            for _ in 0..out_len {
                ids.push(rng.random_range(0..vocab));
                target.push(true);
            }
            // A tool result after the output: context, not a target.
            for _ in 0..tail {
                ids.push(rng.random_range(0..vocab));
                target.push(false);
            }
            let n = ids.len();
            out.push(TokenRow {
                execution: e as u32,
                leaf: leaf(),
                input_ids: ids,
                coefficients: target.iter().map(|&t| if t { c } else { 0.0 }).collect(),
                behaviour_logprobs: vec![0.0; n],
                target,
                advantage: adv,
            });
        }
    }
    out
}

fn to_gpu(rows: &[TokenRow]) -> Vec<TrainRow> {
    rows.iter()
        .map(|r| TrainRow {
            execution: r.execution,
            input_ids: r.input_ids.clone(),
            target: r.target.clone(),
            behaviour_logprobs: r.behaviour_logprobs.clone(),
            coefficients: r.coefficients.clone(),
            advantage: r.advantage,
        })
        .collect()
}

#[test]
fn trainer_matches_the_reference_objective() {
    let cfg = ModelConfig::tiny();
    let params = ParamBuffer::init(&cfg, 17).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut rows = rows(&mut rng, cfg.vocab as u32);
    let packed = pack(&rows, 16).unwrap();
    let steps: Vec<MicroStep> = packed.iter().map(|s| micro_step(&s.chunks)).collect();
    assert!(steps.len() > 3);
    let mut trainer = Trainer::new(&cfg, &params).unwrap();

    // Behaviour log-probs: the current ones shifted per execution, so that
    // one execution is on-policy, one is clipped by s_i, one hits the
    // ratio and loss caps with s_i = 1.
    let whole = MicroStep::whole(&to_gpu(&rows));
    let current = trainer.token_logprobs(&to_gpu(&rows), &whole).unwrap();
    let mut k = 0;
    for r in rows.iter_mut() {
        let mut parity = 0;
        for u in 0..r.len() {
            if !r.target[u] {
                continue;
            }
            let shift = match r.execution {
                0 => 0.001,
                1 => 0.02,
                2 => {
                    parity += 1;
                    if parity % 2 == 0 { 3.0 } else { -3.0 }
                }
                3 => -0.002,
                _ => 0.004,
            };
            r.behaviour_logprobs[u] = current[k] + shift;
            k += 1;
        }
    }
    // Execution 2's ±3 shifts keep its mean log-ratio near 0 (inside the
    // clip band), which the loss-cap assertion below depends on.
    let gpu_rows = to_gpu(&rows);

    // Reference on every target of the batch (flattened in micro-step order).
    let flat = flatten_targets(&rows, packed.iter().flat_map(|s| &s.chunks));
    let mut logp = Vec::new();
    for s in &steps {
        logp.extend(trainer.token_logprobs(&gpu_rows, s).unwrap());
    }
    let advantages: Vec<f32> = ADVANTAGES.to_vec();
    let reference = loss_and_grad(&flat.view(), &advantages, &logp, &RefConfig::default()).unwrap();
    assert!(
        reference.frozen.clip_mask.contains(&0.0),
        "no execution is clipped"
    );
    assert!(
        reference.ratio_capped > 0 && reference.loss_capped > 0,
        "caps not exercised"
    );

    // Trainer: batch-wide sequence statistics, then each micro-step.
    let mut stats = SeqStats::default();
    for s in &steps {
        stats
            .merge(&trainer.sequence_stats(&gpu_rows, s).unwrap())
            .unwrap();
    }
    for (e, &s_ref) in reference.frozen.seq_ratio.iter().enumerate() {
        assert!((stats.seq_ratio(e as u32).unwrap() - s_ref).abs() < 1e-6);
    }
    let ocfg = ObjectiveConfig::default();
    let mut weights = Vec::new();
    let mut loss = 0.0;
    let mut at = 0;
    for s in &steps {
        let ts = data::targets(&gpu_rows, s, cfg.vocab, cfg.context).unwrap();
        let w = objective::policy_weights(&ts, &logp[at..at + ts.len()], &stats, &ocfg).unwrap();
        at += ts.len();
        weights.extend(w.grad);
        loss += trainer
            .accumulate(&gpu_rows, s, &Loss::Policy(ocfg), Some(&stats))
            .unwrap()
            .loss;
    }
    assert!(
        (loss - reference.loss).abs() <= 1e-6 * reference.loss.abs().max(1.0),
        "loss {loss} vs {}",
        reference.loss
    );
    assert_eq!(weights.len(), reference.grad.len());
    for (a, b) in weights.iter().zip(&reference.grad) {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
            "∂L/∂log π: {a} vs {b}"
        );
    }
    let policy_grad = trainer.export_grads().unwrap();

    // Parameter gradient: Σ_u (∂L/∂log π_u)·∇log π_u, computed by a
    // supervised pass whose coefficients are minus the reference weights.
    let mut chain_rows = gpu_rows.clone();
    let mut it = reference.grad.iter();
    for s in &steps {
        for c in &s.chunks {
            let r = &mut chain_rows[c.row as usize];
            for u in c.start as usize..c.end as usize {
                if r.target[u] {
                    r.coefficients[u] = -*it.next().unwrap();
                }
            }
        }
    }
    let mut chain = Trainer::new(&cfg, &params).unwrap();
    for s in &steps {
        chain
            .accumulate(&chain_rows, s, &Loss::Supervised, None)
            .unwrap();
    }
    let expected = chain.export_grads().unwrap();
    let norm = expected.norm();
    assert!(norm > 0.0);
    let worst = policy_grad
        .data
        .iter()
        .zip(&expected.data)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max);
    assert!(worst <= 1e-5 * norm, "max |Δ∇θ| = {worst}, ‖∇θ‖ = {norm}");
}
