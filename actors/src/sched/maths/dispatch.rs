//! How many executions are dispatched, and when.
//!
//! Boundary dispatch (SPEC 2.2): (φ+μ)·N·B at start, μ·N·B after every weight
//! publication, nothing in between, so d is constant inside a burst and the
//! group-weighted mean staleness is φ + (μ−1)/2. Continuous dispatch refills
//! the N·B dispatch slots a training step frees as soon as it frees them,
//! which the simulator offers for comparison.

use serde::{Deserialize, Serialize};

use crate::sched::config::DispatchMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispatcher {
    pub mode: DispatchMode,
    /// φ·B.
    pub over_groups: u64,
    pub mu: u64,
    pub batch_groups: u64,
    pub group_size: u64,
}

impl Dispatcher {
    /// Executions to dispatch at start: (φ + μ)·N·B.
    pub fn at_start(&self) -> u64 {
        (self.over_groups + self.mu * self.batch_groups) * self.group_size
    }

    /// Executions to dispatch when a publication happens.
    pub fn at_publication(&self) -> u64 {
        match self.mode {
            DispatchMode::Boundary => self.mu * self.batch_groups * self.group_size,
            DispatchMode::Continuous => 0,
        }
    }

    /// Executions to dispatch when a training step has consumed its B groups.
    pub fn at_step(&self) -> u64 {
        match self.mode {
            DispatchMode::Boundary => 0,
            DispatchMode::Continuous => self.batch_groups * self.group_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(mode: DispatchMode, over: u64, mu: u64) -> Dispatcher {
        Dispatcher {
            mode,
            over_groups: over,
            mu,
            batch_groups: 2,
            group_size: 3,
        }
    }

    #[test]
    fn boundary_dispatch_amounts() {
        // (φ, μ) = (0.5, 3) with B = 2: φ·B = 1 group.
        let b = d(DispatchMode::Boundary, 1, 3);
        assert_eq!(b.at_start(), (1 + 6) * 3);
        assert_eq!(b.at_publication(), 18);
        assert_eq!(b.at_step(), 0);
        // μ = 1, φ = 0: one batch at start, one per publication.
        let b = d(DispatchMode::Boundary, 0, 1);
        assert_eq!(b.at_start(), 6);
        assert_eq!(b.at_publication(), 6);
    }

    #[test]
    fn continuous_dispatch_refills_per_step() {
        let c = d(DispatchMode::Continuous, 2, 2);
        assert_eq!(c.at_start(), (2 + 4) * 3);
        assert_eq!(c.at_publication(), 0);
        assert_eq!(c.at_step(), 6);
        // Over a burst both modes dispatch the same amount in total.
        let b = d(DispatchMode::Boundary, 2, 2);
        assert_eq!(b.at_publication(), 2 * c.at_step());
    }
}
