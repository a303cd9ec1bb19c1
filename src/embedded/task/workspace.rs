//! The preserved workspace of each finished execution, and the task's
//! counters.
//!
//! A real harness leaves a sandbox behind that the evaluator inspects after
//! the run closed; here the "sandbox" is the transcript of what each call
//! started with. The harness writes it when its run finishes, the evaluator
//! reads it (possibly several times, after failed attempts) and frees it
//! once it produced a score. The board also keeps the counters both sides
//! update, so reports read one place.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gyre_actors::sched::ids::{ExecId, Version};
use gyre_actors::sched::proto::harness::HarnessOutcome;

use super::spec::TaskConfig;
use crate::embedded::shared::lock;

/// What one model call left in the workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct CallNote {
    pub seq: u32,
    pub thread: String,
    pub sub_agent: bool,
    /// First output token; `None` for an empty or unreadable answer.
    pub first: Option<u32>,
    /// Policy version that served the call (from its TITO record).
    pub version: Option<Version>,
    pub prompt_tokens: u32,
}

/// The preserved state of one execution.
#[derive(Debug, Clone, PartialEq)]
pub struct Workspace {
    pub query: u64,
    pub target: u32,
    /// Main calls the run was meant to make: the reward's denominator, so a
    /// run cut short earns partial credit only for what it did.
    pub planned: u32,
    pub calls: Vec<CallNote>,
    pub outcome: HarnessOutcome,
    pub compactions: u32,
}

impl Workspace {
    /// Mean credit over the planned main calls, in [0, 1].
    pub fn reward(&self, cfg: &TaskConfig) -> f64 {
        let sum: f64 = self
            .main_calls()
            .map(|c| cfg.credit(c.first, self.target))
            .sum();
        (sum / f64::from(self.planned.max(1))).clamp(0.0, 1.0)
    }

    pub fn main_calls(&self) -> impl Iterator<Item = &CallNote> {
        self.calls.iter().filter(|c| !c.sub_agent)
    }

    /// The version that served the first main call: what the run mostly
    /// measures of the policy.
    pub fn version(&self) -> Option<Version> {
        self.main_calls().find_map(|c| c.version)
    }
}

/// Reward of the executions scored under one policy version.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RewardTally {
    pub scored: u64,
    pub reward_sum: f64,
}

impl RewardTally {
    pub fn mean(&self) -> Option<f64> {
        (self.scored > 0).then(|| self.reward_sum / self.scored as f64)
    }
}

/// Counters of the harness and the evaluator of one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskStats {
    pub begun: u64,
    pub completed: u64,
    pub harness_timeouts: u64,
    /// Runs the harness ended as failed (an unreadable answer, no room left).
    pub failed: u64,
    pub aborted: u64,
    pub calls: u64,
    pub sub_agent_calls: u64,
    pub compactions: u64,
    pub answered: u64,
    /// Main calls whose first token was the target.
    pub hits: u64,
    pub main_answered: u64,
    /// Answers whose record was missing or did not decode.
    pub bad_answers: u64,
    /// Answers to calls that were not outstanding.
    pub stray_answers: u64,
    /// Workspaces dropped unscored because the board was full.
    pub evicted: u64,
    pub scored: u64,
    pub reward_sum: f64,
    /// Evaluation attempts failed on purpose (the configured rate).
    pub eval_failures: u64,
    /// Evaluation attempts that found no workspace (an aborted run).
    pub eval_missing: u64,
    pub by_version: BTreeMap<Version, RewardTally>,
}

impl TaskStats {
    pub fn finished(&self) -> u64 {
        self.completed + self.harness_timeouts + self.failed
    }

    pub fn mean_reward(&self) -> Option<f64> {
        (self.scored > 0).then(|| self.reward_sum / self.scored as f64)
    }

    /// Fraction of main calls that hit the target.
    pub fn hit_rate(&self) -> Option<f64> {
        (self.main_answered > 0).then(|| self.hits as f64 / self.main_answered as f64)
    }
}

#[derive(Debug, Default)]
struct Inner {
    open: BTreeMap<ExecId, Workspace>,
    stats: TaskStats,
}

/// Workspaces of finished executions waiting for their score, shared by the
/// harness and the evaluator (`Arc`).
#[derive(Debug, Default)]
pub struct Workspaces {
    inner: Mutex<Inner>,
}

impl Workspaces {
    /// Workspaces kept at most: one whose evaluation never came (its budget
    /// ran out first) is dropped, oldest execution first.
    pub const KEEP: usize = 4096;

    pub fn new() -> Self {
        Self::default()
    }

    pub fn preserve(&self, exec: ExecId, ws: Workspace) {
        let mut g = lock(&self.inner);
        g.open.insert(exec, ws);
        while g.open.len() > Self::KEEP {
            g.open.pop_first();
            g.stats.evicted += 1;
        }
    }

    pub fn get(&self, exec: ExecId) -> Option<Workspace> {
        lock(&self.inner).open.get(&exec).cloned()
    }

    /// Frees the workspace of a scored execution and counts its reward.
    pub fn scored(&self, exec: ExecId, reward: f64, version: Option<Version>) {
        let mut g = lock(&self.inner);
        g.open.remove(&exec);
        g.stats.scored += 1;
        g.stats.reward_sum += reward;
        if let Some(v) = version {
            let t = g.stats.by_version.entry(v).or_default();
            t.scored += 1;
            t.reward_sum += reward;
        }
    }

    pub fn len(&self) -> usize {
        lock(&self.inner).open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> TaskStats {
        lock(&self.inner).stats.clone()
    }

    pub(crate) fn count(&self, f: impl FnOnce(&mut TaskStats)) {
        f(&mut lock(&self.inner).stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(seq: u32, sub_agent: bool, first: u8, version: u64) -> CallNote {
        CallNote {
            seq,
            thread: if sub_agent { "sub0" } else { "main" }.into(),
            sub_agent,
            first: Some(u32::from(first)),
            version: Some(version),
            prompt_tokens: 10,
        }
    }

    fn ws(calls: Vec<CallNote>) -> Workspace {
        Workspace {
            query: 2,
            target: u32::from(b'c'),
            planned: 3,
            calls,
            outcome: HarnessOutcome::Completed,
            compactions: 0,
        }
    }

    #[test]
    fn reward_is_the_mean_over_planned_main_calls_only() {
        let exact = TaskConfig {
            shaping_width: 0,
            ..TaskConfig::default()
        };
        let w = ws(vec![
            note(0, false, b'c', 4),
            note(1, true, b'c', 4),
            note(2, false, b'z', 5),
            note(3, false, b'c', 5),
        ]);
        assert!((w.reward(&exact) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(w.version(), Some(4));
        // Cut short after one hit: a third of the credit, not all of it.
        let short = ws(vec![note(0, false, b'c', 1)]);
        assert!((short.reward(&exact) - 1.0 / 3.0).abs() < 1e-12);
        let shaped = TaskConfig::default();
        let near = ws(vec![note(0, false, b'e', 0)]);
        let r = near.reward(&shaped);
        assert!(r > 0.0 && r < 1.0 / 3.0, "{r}");
        assert_eq!(ws(vec![]).reward(&shaped), 0.0);
    }

    #[test]
    fn scoring_frees_and_tallies_by_version() {
        let b = Workspaces::new();
        b.preserve(ExecId(1), ws(vec![]));
        b.preserve(ExecId(2), ws(vec![]));
        assert_eq!(b.len(), 2);
        b.scored(ExecId(1), 1.0, Some(3));
        b.scored(ExecId(2), 0.0, Some(3));
        assert!(b.is_empty());
        let s = b.stats();
        assert_eq!(s.mean_reward(), Some(0.5));
        assert_eq!(s.by_version[&3].mean(), Some(0.5));
    }

    #[test]
    fn the_board_is_bounded() {
        let b = Workspaces::new();
        for e in 0..(Workspaces::KEEP as u64 + 3) {
            b.preserve(ExecId(e), ws(vec![]));
        }
        assert_eq!(b.len(), Workspaces::KEEP);
        assert_eq!(b.stats().evicted, 3);
        assert!(b.get(ExecId(0)).is_none());
        assert!(b.get(ExecId(3)).is_some());
    }
}
