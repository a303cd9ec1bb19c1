//! The simulator's own random draws (network and I/O faults).
//!
//! One ChaCha8 stream per run, separate from the actors' streams, so that a
//! fault decision never shifts what an actor draws. The integer and unit
//! draws are written out here rather than taken from `rand`'s distributions,
//! whose exact output may change between versions; replay must not. The
//! exponential latency uses `f64::ln`, which is exact enough to agree across
//! runs and processes on one platform; it is the one draw that could differ
//! in its last bit between platforms' math libraries.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::rng::mix64;
use crate::time::Nanos;

use super::config::Latency;

/// Salt that separates the simulator's stream from anything else derived
/// from the same seed.
const NET_SALT: u64 = 0x6779_7265_5f6e_6574; // "gyre_net"

pub(crate) struct Draw {
    rng: ChaCha8Rng,
}

impl Draw {
    pub(crate) fn new(seed: u64) -> Self {
        Self::salted(seed, NET_SALT)
    }

    pub(crate) fn salted(seed: u64, salt: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(mix64(seed ^ salt)),
        }
    }

    pub(crate) fn u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (clamped to `[0, 1]`); draws nothing when
    /// `p <= 0`, so a fault-free link costs no randomness.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (p >= 1.0 || self.unit() < p)
    }

    /// Uniform in `[lo, hi]` (inclusive, bounds swapped if backwards).
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
        let span = hi - lo;
        if span == u64::MAX {
            return self.rng.next_u64();
        }
        // Multiply-shift: maps 64 random bits onto span+1 values.
        let r = (u128::from(self.rng.next_u64()) * (u128::from(span) + 1)) >> 64;
        lo + r as u64
    }

    /// One sample of `latency`.
    pub(crate) fn latency(&mut self, latency: &Latency) -> Nanos {
        match *latency {
            Latency::Const(n) => n,
            Latency::Uniform { min, max } => self.between(min, max),
            Latency::Exponential { min, mean } => {
                let tail_mean = mean.saturating_sub(min);
                if tail_mean == 0 {
                    return min;
                }
                // Inverse CDF; 1 - unit() is in (0, 1], so ln is finite.
                let tail = -(1.0 - self.unit()).ln() * tail_mean as f64;
                // `as` saturates, so a huge tail cannot wrap around.
                min.saturating_add(tail as u64)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_draws_and_salts_separate() {
        let mut a = Draw::new(9);
        let mut b = Draw::new(9);
        let mut c = Draw::salted(9, 1);
        let xa: Vec<u64> = (0..4).map(|_| a.u64()).collect();
        let xb: Vec<u64> = (0..4).map(|_| b.u64()).collect();
        let xc: Vec<u64> = (0..4).map(|_| c.u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn between_stays_in_bounds_and_covers_them() {
        let mut d = Draw::new(1);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            let x = d.between(13, 10);
            assert!((10..=13).contains(&x));
            seen[(x - 10) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn chance_extremes_and_exponential_mean() {
        let mut d = Draw::new(2);
        assert!((0..100).all(|_| !d.chance(0.0)));
        assert!((0..100).all(|_| d.chance(1.0)));
        let lat = Latency::Exponential {
            min: 100,
            mean: 1100,
        };
        let n = 20_000u64;
        let sum: u64 = (0..n).map(|_| d.latency(&lat)).sum();
        let mean = sum / n;
        assert!((1000..1200).contains(&mean), "mean {mean}");
        assert!((0..1000).all(|_| d.latency(&lat) >= 100));
    }
}
