//! Standard normal draws (Box–Muller), so the workload needs no extra
//! distributions crate for the one shape it uses.

use rand::Rng;

/// One N(0, 1) draw.
pub fn standard(rng: &mut impl Rng) -> f64 {
    // u1 in (0, 1]: ln(u1) stays finite.
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn mean_zero_variance_one() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let n = 100_000;
        let xs: Vec<f64> = (0..n).map(|_| standard(&mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0).abs() < 0.02, "{var}");
        assert!(xs.iter().all(|x| x.is_finite()));
    }
}
