//! Faults picked by a seed, swarm-testing style.
//!
//! Rather than one fixed fault mix, each seed draws its own: whether links
//! reorder, their latency shape, loss and duplication rates, an I/O failure
//! rate, and a few partitions and crash/restart cycles at random times. Many
//! seeds with many different mixes find more bugs than many seeds with one
//! mix (Groce et al., "Swarm Testing"). Targets are chosen when a fault fires,
//! among the nodes and restartable actors that exist then, from a number the
//! plan fixes in advance, so the plan alone (and so the seed) decides them.

use std::fmt;

use crate::id::{ActorId, NodeId};
use crate::time::{MICROS, MILLIS, Nanos, SECS};

use super::config::{Latency, LinkModel};
use super::draw::Draw;
use super::fmt_nanos;

const FAULT_SALT: u64 = 0x6779_7265_5f66_6c74; // "gyre_flt"

/// How far into a run [`FaultPlan::from_seed`] places its faults.
pub const DEFAULT_HORIZON: Nanos = SECS;

/// A fault that starts at `at` (relative to when the plan is applied) and
/// lasts `lasts`; `pick` chooses its target among those present then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedFault {
    pub at: Nanos,
    pub lasts: Nanos,
    pub pick: u64,
}

/// The faults of one run, derived from its seed.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    pub seed: u64,
    pub horizon: Nanos,
    /// Replaces the default link between different nodes.
    pub link: LinkModel,
    /// Failure probability given to every I/O kind (a kind configured with
    /// a higher one keeps it).
    pub io_fail: f64,
    /// Cuts between two nodes, healed after `lasts`.
    pub partitions: Vec<TimedFault>,
    /// Crashes of a restartable actor, restarted after `lasts`.
    pub crashes: Vec<TimedFault>,
}

impl FaultPlan {
    /// The plan of `seed`, with faults within [`DEFAULT_HORIZON`].
    pub fn from_seed(seed: u64) -> Self {
        Self::within(seed, DEFAULT_HORIZON)
    }

    /// The plan of `seed`, with faults within `horizon` of being applied.
    pub fn within(seed: u64, horizon: Nanos) -> Self {
        let mut d = Draw::salted(seed, FAULT_SALT);
        let fifo = d.chance(0.5);
        let latency = match d.between(0, 2) {
            0 => Latency::Const(d.between(MICROS, 2 * MILLIS)),
            1 => {
                let min = d.between(0, 500 * MICROS);
                Latency::Uniform {
                    min,
                    max: min + d.between(MICROS, 5 * MILLIS),
                }
            }
            _ => {
                let min = d.between(0, 500 * MICROS);
                Latency::Exponential {
                    min,
                    mean: min + d.between(10 * MICROS, 2 * MILLIS),
                }
            }
        };
        let loss = if d.chance(0.5) { 0.0 } else { d.unit() * 0.1 };
        let duplicate = if d.chance(0.75) { 0.0 } else { d.unit() * 0.05 };
        let io_fail = if d.chance(0.5) { 0.0 } else { d.unit() * 0.1 };
        let horizon = horizon.max(1);
        let timed = |d: &mut Draw| {
            let n = d.between(0, 3);
            let mut v: Vec<TimedFault> = (0..n)
                .map(|_| TimedFault {
                    at: d.between(0, horizon),
                    lasts: d.between((horizon / 100).max(1), (horizon / 4).max(1)),
                    pick: d.u64(),
                })
                .collect();
            v.sort_by_key(|f| (f.at, f.pick));
            v
        };
        let partitions = timed(&mut d);
        let crashes = timed(&mut d);
        Self {
            seed,
            horizon,
            link: LinkModel {
                latency,
                loss,
                duplicate,
                fifo,
            },
            io_fail,
            partitions,
            crashes,
        }
    }

    /// A plan without partitions or crashes: only the link and I/O mix.
    pub fn network_only(mut self) -> Self {
        self.partitions.clear();
        self.crashes.clear();
        self
    }
}

fn list(f: &mut fmt::Formatter<'_>, what: &str, faults: &[TimedFault]) -> fmt::Result {
    write!(f, "; {what}: ")?;
    if faults.is_empty() {
        return write!(f, "none");
    }
    for (i, t) in faults.iter().enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(
            f,
            "at {} for {} (pick {})",
            fmt_nanos(t.at),
            fmt_nanos(t.lasts),
            t.pick
        )?;
    }
    Ok(())
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "faults of seed {} within {}: remote links {}; io failure {:.2}%",
            self.seed,
            fmt_nanos(self.horizon),
            self.link,
            self.io_fail * 100.0
        )?;
        list(f, "partitions", &self.partitions)?;
        list(f, "crashes", &self.crashes)
    }
}

/// A fault as a scheduled simulator event.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FaultAction {
    Partition { lasts: Nanos, pick: u64 },
    Heal { a: NodeId, b: NodeId },
    Crash { lasts: Nanos, pick: u64 },
    Restart { id: ActorId },
}

/// The `pick`-th unordered pair of distinct nodes in `nodes` (sorted).
pub(crate) fn pick_pair(nodes: &[NodeId], pick: u64) -> Option<(NodeId, NodeId)> {
    let n = nodes.len() as u64;
    if n < 2 {
        return None;
    }
    let mut k = pick % (n * (n - 1) / 2);
    for i in 0..n {
        let row = n - 1 - i;
        if k < row {
            return Some((nodes[i as usize], nodes[(i + 1 + k) as usize]));
        }
        k -= row;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_a_function_of_the_seed() {
        assert_eq!(FaultPlan::from_seed(3), FaultPlan::from_seed(3));
        let distinct: std::collections::BTreeSet<String> = (0..20)
            .map(|s| FaultPlan::from_seed(s).to_string())
            .collect();
        assert!(distinct.len() > 15);
    }

    #[test]
    fn plans_vary_their_mix_and_stay_in_bounds() {
        let plans: Vec<FaultPlan> = (0..200)
            .map(|s| FaultPlan::within(s, 100 * MILLIS))
            .collect();
        assert!(plans.iter().any(|p| p.link.fifo));
        assert!(plans.iter().any(|p| !p.link.fifo));
        assert!(plans.iter().any(|p| p.link.loss == 0.0));
        assert!(plans.iter().any(|p| p.link.loss > 0.0));
        assert!(plans.iter().any(|p| !p.crashes.is_empty()));
        assert!(plans.iter().any(|p| p.partitions.is_empty()));
        for p in &plans {
            assert!((0.0..=0.1).contains(&p.link.loss));
            for t in p.partitions.iter().chain(&p.crashes) {
                assert!(t.at <= 100 * MILLIS && t.lasts >= 1);
            }
        }
    }

    #[test]
    fn display_describes_the_mix() {
        let text = FaultPlan::from_seed(11).to_string();
        assert!(text.contains("seed 11"), "{text}");
        assert!(text.contains("partitions"), "{text}");
        assert!(text.contains("crashes"), "{text}");
    }

    #[test]
    fn pick_pair_enumerates_every_pair_once() {
        let nodes = [NodeId(0), NodeId(1), NodeId(2), NodeId(3)];
        let pairs: std::collections::BTreeSet<_> =
            (0..6).filter_map(|k| pick_pair(&nodes, k)).collect();
        assert_eq!(pairs.len(), 6);
        assert!(pairs.iter().all(|(a, b)| a < b));
        assert_eq!(pick_pair(&nodes, 6), pick_pair(&nodes, 0));
        assert_eq!(pick_pair(&nodes[..1], 5), None);
    }
}
