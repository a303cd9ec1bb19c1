//! The scheduler's three cumulative counters and the launch rule.
//!
//! d counts executions dispatched into the rollout queue, p executions that
//! actually started, f executions that terminated for any reason (SPEC 2.2).
//! Request-level retries stay inside their execution and move none of them.
//! So d − p is the queue, p − f the running set, and w = d − f the watermark
//! of SPEC 2.3.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    d: u64,
    p: u64,
    f: u64,
}

impl Counters {
    pub fn dispatched(&self) -> u64 {
        self.d
    }
    pub fn started(&self) -> u64 {
        self.p
    }
    pub fn finished(&self) -> u64 {
        self.f
    }

    /// d − p: accepted, not started.
    pub fn queued(&self) -> u64 {
        self.d - self.p
    }

    /// p − f: started, not finished.
    pub fn running(&self) -> u64 {
        self.p - self.f
    }

    /// w = d − f: dispatched and not finished (SPEC 2.3).
    pub fn watermark(&self) -> u64 {
        self.d - self.f
    }

    pub fn dispatch(&mut self, n: u64) {
        self.d += n;
    }

    /// Counts a start; refused (false) when nothing is queued, so p ≤ d
    /// holds whatever the caller does.
    pub fn start(&mut self) -> bool {
        if self.p < self.d {
            self.p += 1;
            true
        } else {
            false
        }
    }

    /// Counts a termination; refused when nothing runs, so f ≤ p holds.
    pub fn finish(&mut self) -> bool {
        if self.f < self.p {
            self.f += 1;
            true
        } else {
            false
        }
    }

    /// The launch rule: start min{d − p, C_R − (p − f)} queued executions.
    /// A queued execution that will never start (an over-sampling surplus):
    /// p and f both move, so d − p stays the queue length and p − f the
    /// number running. False if nothing is queued.
    pub fn withdraw(&mut self) -> bool {
        if self.p < self.d {
            self.p += 1;
            self.f += 1;
            true
        } else {
            false
        }
    }

    pub fn launchable(&self, rollout_capacity: u64) -> u64 {
        launchable(self.queued(), rollout_capacity, self.running())
    }
}

/// min{queued, C_R − running}, never negative.
pub fn launchable(queued: u64, rollout_capacity: u64, running: u64) -> u64 {
    queued.min(rollout_capacity.saturating_sub(running))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_keep_d_ge_p_ge_f() {
        let mut c = Counters::default();
        assert!(!c.start());
        assert!(!c.finish());
        c.dispatch(3);
        assert!(c.start() && c.start());
        assert!(c.finish());
        assert_eq!((c.dispatched(), c.started(), c.finished()), (3, 2, 1));
        assert_eq!((c.queued(), c.running(), c.watermark()), (1, 1, 2));
        assert!(c.start() && !c.start());
        assert!(c.finish() && c.finish() && !c.finish());
        assert_eq!(c.watermark(), 0);
    }

    #[test]
    fn withdrawing_a_queued_execution_keeps_queue_and_running() {
        let mut c = Counters::default();
        assert!(!c.withdraw());
        c.dispatch(3);
        c.start();
        assert!(c.withdraw());
        assert_eq!((c.queued(), c.running(), c.watermark()), (1, 1, 2));
        assert!(c.withdraw() && !c.withdraw());
        assert_eq!(c.watermark(), 1);
    }

    #[test]
    fn launch_rule_is_bounded_by_queue_and_free_capacity() {
        assert_eq!(launchable(5, 10, 3), 5);
        assert_eq!(launchable(5, 6, 3), 3);
        assert_eq!(launchable(0, 6, 0), 0);
        // Capacity shrank below the running set (a cell left): start nothing.
        assert_eq!(launchable(4, 2, 3), 0);
        let mut c = Counters::default();
        c.dispatch(8);
        c.start();
        assert_eq!(c.launchable(4), 3);
    }
}
