//! What the front, the record sink and the evaluator share about the
//! external runs: each execution's gateway id, query, workspace and the
//! version that served its first call, and the run's counters (the built-in
//! task's [`TaskStats`], so reports read rewards by version the same way).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use gyre_actors::sched::ids::{ExecId, Version};
use gyre_actors::sched::proto::harness::HarnessOutcome;

use crate::embedded::shared::lock;
use crate::embedded::task::TaskStats;

/// One external execution.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub execution: String,
    pub query: u64,
    pub workspace: PathBuf,
    pub outcome: Option<HarnessOutcome>,
    /// Policy version of its first recorded call.
    pub version: Option<Version>,
}

#[derive(Debug, Default)]
pub struct Board {
    runs: Mutex<BTreeMap<ExecId, RunInfo>>,
    stats: Mutex<TaskStats>,
}

impl Board {
    pub fn begin(&self, exec: ExecId, info: RunInfo) {
        lock(&self.runs).insert(exec, info);
        self.count(|s| s.begun += 1);
    }

    pub fn get(&self, exec: ExecId) -> Option<RunInfo> {
        lock(&self.runs).get(&exec).cloned()
    }

    pub fn finished(&self, exec: ExecId, outcome: HarnessOutcome) {
        if let Some(r) = lock(&self.runs).get_mut(&exec) {
            r.outcome = Some(outcome);
        }
        self.count(|s| match outcome {
            HarnessOutcome::Completed => s.completed += 1,
            HarnessOutcome::HarnessTimeout => s.harness_timeouts += 1,
            HarnessOutcome::Failed { .. } => s.failed += 1,
        });
    }

    /// A call of `exec` was recorded under `version`.
    pub fn recorded(&self, exec: ExecId, version: Version) {
        if let Some(r) = lock(&self.runs).get_mut(&exec) {
            r.version.get_or_insert(version);
        }
        self.count(|s| s.answered += 1);
    }

    /// `exec` was scored `reward`; its run is forgotten (the workspace
    /// stays on disk).
    pub fn scored(&self, exec: ExecId, reward: f64) {
        let version = lock(&self.runs).remove(&exec).and_then(|r| r.version);
        self.count(|s| {
            s.scored += 1;
            s.reward_sum += reward;
            if let Some(v) = version {
                let t = s.by_version.entry(v).or_default();
                t.scored += 1;
                t.reward_sum += reward;
            }
        });
    }

    pub fn count(&self, f: impl FnOnce(&mut TaskStats)) {
        f(&mut lock(&self.stats));
    }

    pub fn stats(&self) -> TaskStats {
        lock(&self.stats).clone()
    }
}
