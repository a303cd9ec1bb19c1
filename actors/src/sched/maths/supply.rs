//! The supply check of SPEC 2.3.
//!
//! A cell may only move to training when the number of ready, unclaimed
//! groups, capped at what the current batch still needs, has stayed at or
//! above ⌈ρ_min·B⌉ continuously for τ. The clock restarts after every
//! transition and at the start of every batch, so a transition is always
//! justified by supply observed since the last change of the training set.
//! A value that dips below the threshold, however briefly, restarts it too.

use gyre_runtime::Nanos;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupplyCheck {
    threshold: u64,
    tau: Nanos,
    value: u64,
    /// Since when the value has held at or above the threshold (or since the
    /// last reset, if later); `None` while it is below.
    since: Option<Nanos>,
}

/// ready, unclaimed groups capped at what the batch still needs.
pub fn supply(ready_unclaimed: u64, still_needed: u64) -> u64 {
    ready_unclaimed.min(still_needed)
}

impl SupplyCheck {
    /// A check that starts with no supply observed.
    pub fn new(threshold: u64, tau: Nanos) -> Self {
        Self {
            threshold,
            tau,
            value: 0,
            since: if threshold == 0 { Some(0) } else { None },
        }
    }

    pub fn value(&self) -> u64 {
        self.value
    }

    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    pub fn since(&self) -> Option<Nanos> {
        self.since
    }

    /// Records the supply seen at `now`.
    pub fn observe(&mut self, now: Nanos, value: u64) {
        self.value = value;
        if value >= self.threshold {
            self.since.get_or_insert(now);
        } else {
            self.since = None;
        }
    }

    /// Restarts the clock at `now` (a transition completed or a batch began).
    pub fn reset(&mut self, now: Nanos) {
        self.since = (self.value >= self.threshold).then_some(now);
    }

    /// Whether the supply has held for τ at `now`.
    pub fn passes(&self, now: Nanos) -> bool {
        self.since
            .is_some_and(|s| now.saturating_sub(s) >= self.tau)
    }

    /// When the check will pass if nothing changes (for a timer).
    pub fn due(&self) -> Option<Nanos> {
        self.since.map(|s| s.saturating_add(self.tau))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supply_is_capped_by_need() {
        assert_eq!(supply(5, 3), 3);
        assert_eq!(supply(1, 3), 1);
        assert_eq!(supply(4, 0), 0);
    }

    #[test]
    fn passes_only_after_tau_of_continuous_supply() {
        let mut s = SupplyCheck::new(2, 10);
        assert!(!s.passes(100));
        s.observe(5, 2);
        assert_eq!(s.due(), Some(15));
        assert!(!s.passes(14));
        assert!(s.passes(15));
        // A change that stays above the threshold keeps the clock running.
        s.observe(16, 3);
        assert_eq!(s.since(), Some(5));
    }

    #[test]
    fn a_flapping_supply_restarts_the_clock() {
        let mut s = SupplyCheck::new(2, 10);
        s.observe(0, 2);
        s.observe(8, 1); // dips
        assert!(!s.passes(12));
        assert_eq!(s.due(), None);
        s.observe(9, 2); // back
        assert!(!s.passes(18));
        assert!(s.passes(19));
        s.observe(20, 0);
        s.observe(20, 5);
        assert!(!s.passes(29));
        assert!(s.passes(30));
    }

    #[test]
    fn reset_restarts_the_clock_from_now() {
        let mut s = SupplyCheck::new(1, 10);
        s.observe(0, 1);
        assert!(s.passes(10));
        s.reset(10);
        assert!(!s.passes(19));
        assert!(s.passes(20));
        // A reset while below keeps it below.
        s.observe(21, 0);
        s.reset(22);
        assert!(!s.passes(1_000));
    }

    #[test]
    fn zero_threshold_and_zero_tau() {
        let mut s = SupplyCheck::new(0, 0);
        assert!(s.passes(0));
        s.observe(3, 0);
        assert!(s.passes(3));
        let mut s = SupplyCheck::new(2, 0);
        s.observe(7, 2);
        assert!(s.passes(7));
    }
}
