//! From logits to a token: the exact log-probability under the model, then
//! temperature and nucleus sampling with a draw fixed by (seed, position).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::request::SamplingParams;

/// log softmax of `logits`, computed in f64.
pub fn log_probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    logits.iter().map(|&x| x as f64 - lse).collect()
}

/// The uniform draw for the token at `position` of a request seeded `seed`.
fn uniform(seed: u64, position: usize) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(position as u64);
    rng.random::<f64>()
}

/// Picks the token for `position`; returns it with its model log-prob.
pub fn sample(logits: &[f32], p: &SamplingParams, position: usize) -> (u32, f32) {
    sample_top_k(logits, p, None, position)
}

/// [`sample`] keeping only the `top_k` most likely tokens before the
/// nucleus cut (SGLang's order: top-k, then top-p).
pub fn sample_top_k(
    logits: &[f32],
    p: &SamplingParams,
    top_k: Option<u32>,
    position: usize,
) -> (u32, f32) {
    let lp = log_probs(logits);
    let argmax = || {
        lp.iter()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (i, &x)| {
                if x > best.1 { (i, x) } else { best }
            })
            .0
    };
    let token = if p.temperature <= 0.0 {
        argmax()
    } else {
        let t = f64::from(p.temperature);
        let top = lp.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut probs: Vec<(usize, f64)> = lp
            .iter()
            .enumerate()
            .map(|(i, &x)| (i, ((x - top) / t).exp()))
            .collect();
        // A total order (probability, then id) so the nucleus and the draw
        // are reproducible; with no ties, an unstable sort gives it too.
        probs.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if let Some(k) = top_k.filter(|&k| k > 0) {
            probs.truncate(k as usize);
        }
        let z: f64 = probs.iter().map(|x| x.1).sum();
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (k, &(_, q)) in probs.iter().enumerate() {
                acc += q / z;
                if acc >= f64::from(p.top_p) {
                    keep = k + 1;
                    break;
                }
            }
        }
        let kept = &probs[..keep];
        let mass: f64 = kept.iter().map(|x| x.1).sum();
        let mut u = uniform(p.seed, position) * mass;
        let mut pick = kept[keep - 1].0;
        for &(i, q) in kept {
            if u < q {
                pick = i;
                break;
            }
            u -= q;
        }
        pick
    };
    (token as u32, lp[token] as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_nucleus_and_seeded_draws() {
        let logits = [0.0f32, 3.0, 1.0, 2.9];
        let greedy = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let (t, lp) = sample(&logits, &greedy, 0);
        assert_eq!(t, 1);
        assert!((f64::from(lp) - log_probs(&logits)[1]).abs() < 1e-6);
        // top_p small keeps only the best token whatever the draw.
        let narrow = SamplingParams {
            top_p: 0.01,
            ..Default::default()
        };
        for pos in 0..20 {
            assert_eq!(sample(&logits, &narrow, pos).0, 1);
        }
        // Same seed and position, same token; the draws cover more than one token.
        let p = SamplingParams::default();
        let picks: Vec<u32> = (0..200).map(|pos| sample(&logits, &p, pos).0).collect();
        let again: Vec<u32> = (0..200).map(|pos| sample(&logits, &p, pos).0).collect();
        assert_eq!(picks, again);
        assert!(picks.contains(&1) && picks.contains(&3) && picks.contains(&2));
        let lp = log_probs(&logits);
        let total: f64 = lp.iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        // top_k 2 keeps tokens 1 and 3 only; the log-prob stays the model's.
        let two: Vec<u32> = (0..200)
            .map(|pos| sample_top_k(&logits, &p, Some(2), pos).0)
            .collect();
        assert!(two.iter().all(|t| *t == 1 || *t == 3) && two.contains(&3));
        let (t, l) = sample_top_k(&logits, &p, Some(1), 0);
        assert_eq!((t, f64::from(l) as f32), (1, lp[1] as f32));
    }
}
