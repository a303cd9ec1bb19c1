//! Staleness: the identity of SPEC 2.2 and the statistics that measure it.
//!
//! A group's staleness is v_t − v_d: the training version just before the
//! step that consumes it, minus the latest published version when it was
//! dispatched. Under boundary dispatch the group-weighted mean settles at
//! φ + (μ − 1)/2; the identity says nothing about the maximum or the
//! token-weighted mean, which are reported alongside.

use serde::{Deserialize, Serialize};

/// E[d] = φ + (μ − 1)/2.
pub fn expected_staleness(phi: f64, mu: u32) -> f64 {
    phi + (f64::from(mu) - 1.0) / 2.0
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Staleness {
    pub groups: u64,
    pub sum: u64,
    pub max: u64,
    pub tokens: u64,
    pub token_sum: u128,
}

impl Staleness {
    /// Adds one trained group of staleness `d` carrying `tokens` tokens.
    pub fn add(&mut self, d: u64, tokens: u64) {
        self.groups += 1;
        self.sum += d;
        self.max = self.max.max(d);
        self.tokens += tokens;
        self.token_sum += u128::from(d) * u128::from(tokens);
    }

    /// Group-weighted mean (the identity's quantity); 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.sum as f64 / self.groups as f64
        }
    }

    /// Token-weighted mean; 0 without tokens.
    pub fn token_mean(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.token_sum as f64 / self.tokens as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_for_the_six_reference_pairs() {
        assert_eq!(expected_staleness(1.5, 1), 1.5);
        assert_eq!(expected_staleness(0.0, 4), 1.5);
        assert_eq!(expected_staleness(0.5, 3), 1.5);
        assert_eq!(expected_staleness(1.0, 1), 1.0);
        assert_eq!(expected_staleness(0.0, 3), 1.0);
        assert_eq!(expected_staleness(0.5, 2), 1.0);
    }

    #[test]
    fn means_weight_groups_and_tokens_differently() {
        let mut s = Staleness::default();
        assert_eq!(s.mean(), 0.0);
        assert_eq!(s.token_mean(), 0.0);
        s.add(0, 300);
        s.add(2, 100);
        assert_eq!(s.mean(), 1.0);
        assert_eq!(s.token_mean(), 0.5);
        assert_eq!(s.max, 2);
    }
}
