//! What a scheduling plane is configured with, and the checks that reject a
//! configuration before any actor starts.
//!
//! The three baseline policies of the reference comparison are not separate
//! code paths: Colocate, Async and the elastic policy are values of
//! [`Policy`] given to the same actors, each with streaming training on or
//! off and either dispatch mode.

use gyre_runtime::{MILLIS, Nanos, SECS};
use serde::{Deserialize, Serialize};

use crate::sched::samples::RecordedConfig;

/// Who trains when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    /// Cells switch one at a time under the watermark rule (SPEC 2.3) and
    /// return at each burst end under rule (3) (SPEC 2.4).
    Elastic,
    /// All cells switch together once the unfinished work fits the
    /// standalone pool, and all return at each burst end.
    Colocate,
    /// A fixed partition: cells `0..train_cells` train for the whole run,
    /// the rest (and the standalone pool) roll out. The reference baseline
    /// uses μ = 1; a multi-step burst (the ablation's A2) is allowed.
    Async { train_cells: u32 },
}

/// When new executions are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DispatchMode {
    /// (φ+μ)·N·B at start, μ·N·B after each publication (SPEC 2.2).
    Boundary,
    /// Dispatch slots are refilled as soon as a training step frees them
    /// (N·B after every step) instead of at publications.
    Continuous,
}

/// Where the packer's rows come from (see [`crate::sched::samples`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub enum SampleMode {
    /// The evaluator's token counts: the simulator's mode.
    #[default]
    Counted,
    /// TITO records by handle from the backends' blob store, as trees.
    Recorded(RecordedConfig),
}

/// The scheduling plane's parameters (symbols of SPEC 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedConfig {
    /// K: elastic cells; cell 0 is the core.
    pub cells: u32,
    /// C_e: concurrent executions one cell's inference engine serves.
    pub cell_capacity: u32,
    /// C_s: capacity of the standalone pool (0: no pool).
    pub pool_capacity: u32,
    /// N: executions per group.
    pub group_size: u32,
    /// M: over-sampling, extra executions dispatched per group. A group is
    /// formed by the first N of its N + M executions that close with a
    /// valid outcome; the rest are cancelled as surplus (see
    /// [`crate::sched::buffer`]). 0 (the default) dispatches exactly N.
    #[serde(default)]
    pub oversample: u32,
    /// B: groups per batch.
    pub batch_groups: u32,
    /// φ: over-dispatch, in units of B groups; φ·B must be whole.
    pub phi: f64,
    /// μ: steps per burst.
    pub mu: u32,
    pub policy: Policy,
    /// Streaming training: micro-steps flow as groups become ready and
    /// satellites join mid-batch; off, a batch starts once all B groups are
    /// ready and membership changes only between batches.
    pub streaming: bool,
    pub dispatch: DispatchMode,
    /// ρ_min: the supply check wants ⌈ρ_min·B⌉ ready groups.
    pub rho_min: f64,
    /// τ: how long the supply must have held.
    pub tau: Nanos,
    /// Training steps to run.
    pub target_steps: u64,
    /// Token capacity of one micro-step.
    pub micro_tokens: u64,
    /// The packer takes another group when fewer micro-steps than this are
    /// waiting unclaimed in the queue.
    pub short_micro_steps: u32,
    /// An execution's total time budget (overall timeout), from its start.
    pub overall_timeout: Nanos,
    /// Delay before a failed evaluation is retried on the same state.
    pub eval_retry: Nanos,
    /// Counted in the simulator; Recorded needs the backends' blob store.
    #[serde(default)]
    pub samples: SampleMode,
    /// Resend a backend request unanswered for this long (lost messages,
    /// partitions; see [`crate::sched::retry`]). `None` (the default)
    /// never resends, which keeps a fault-free simulation's schedule as it
    /// was; fault-injected runs set it.
    #[serde(default)]
    pub retry: Option<Nanos>,
    /// S: the core writes a durable checkpoint (weights, optimizer state,
    /// step, version) after every S-th update, which a new core resumes
    /// from. `None` (the default) writes none: no checkpoint effect, the
    /// schedule as before.
    #[serde(default)]
    pub checkpoint_every: Option<u64>,
    /// The scheduler watches the nodes of the cells' and the pool's
    /// backends and takes a lost one out of rollout (see
    /// `scheduler::loss`). Off by default: watching adds no message, but a
    /// fault-free run has nothing to gain from it, and its schedule stays
    /// as it was. Needs `retry`, which is how a lost node is found again.
    #[serde(default)]
    pub watch_nodes: bool,
    /// A lost node is found again when its host says so
    /// (`SchedMsg::NodeBack`: a cluster's launcher restarted it), not by
    /// resending to it. For hosts whose backends should not see resends
    /// (a live cluster's); `watch_nodes` needs this or `retry`.
    #[serde(default)]
    pub rejoin_notices: bool,
    /// The backends' reduction reads every member's gradients (a live
    /// cluster's ring over processes), so a satellite lost while the core
    /// reduces fails the reduction and the step is collected again without
    /// it (see `CoreConfig::reduce_needs_members`).
    #[serde(default)]
    pub reduce_needs_members: bool,
    /// The policy version the run starts from: 0 for the initial
    /// parameters, c when a restarted head resumes from the core's durable
    /// checkpoint of version c. Step s trains version s, so the first step
    /// is c and the run trains `target_steps − c` steps. Every scheduling
    /// id but the version (executions, groups, bursts) starts afresh.
    #[serde(default)]
    pub start_version: u64,
}

impl Default for SchedConfig {
    fn default() -> Self {
        Self {
            cells: 4,
            cell_capacity: 4,
            pool_capacity: 0,
            group_size: 4,
            oversample: 0,
            batch_groups: 2,
            phi: 0.5,
            mu: 2,
            policy: Policy::Elastic,
            streaming: true,
            dispatch: DispatchMode::Boundary,
            rho_min: 0.5,
            tau: 100 * MILLIS,
            target_steps: 4,
            micro_tokens: 4_096,
            short_micro_steps: 2,
            overall_timeout: 3_600 * SECS,
            eval_retry: SECS,
            samples: SampleMode::Counted,
            retry: None,
            checkpoint_every: None,
            watch_nodes: false,
            rejoin_notices: false,
            reduce_needs_members: false,
            start_version: 0,
        }
    }
}

/// Why a configuration cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{what} must be at least 1 (got 0)")]
    Zero { what: &'static str },
    #[error("φ = {phi} must be finite and ≥ 0, and φ·B = {phi}·{b} whole groups")]
    Phi { phi: f64, b: u32 },
    #[error("ρ_min = {0} must lie in [0, 1]")]
    RhoMin(f64),
    #[error("Colocate cannot over-dispatch without a standalone pool: set φ = 0 or C_s > 0")]
    ColocatePhi,
    #[error("{what}: expected {expected} backend ports, got {got}")]
    Ports {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error(
        "Async trains on 1..=K cells and must leave rollout capacity: train_cells = {train}, K = {k}, C_s = {pool}"
    )]
    AsyncSplit { train: u32, k: u32, pool: u32 },
    #[error("samples: {0}")]
    Samples(String),
    #[error(
        "the run starts from version {start} but trains only to {target}: nothing left to train"
    )]
    StartPastTarget { start: u64, target: u64 },
    #[error(
        "watch_nodes finds a lost node again by resending to it (set retry) or by the host's notice (set rejoin_notices)"
    )]
    WatchWithoutRetry,
}

/// Values derived once from a valid configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Derived {
    /// φ·B: over-dispatched groups.
    pub over_groups: u64,
    /// ⌈ρ_min·B⌉: the supply check's threshold, in groups.
    pub supply_threshold: u32,
}

impl SchedConfig {
    /// Checks every rule a run depends on; the actors assume a valid config.
    pub fn validate(&self) -> Result<Derived, ConfigError> {
        for (what, v) in [
            ("K (cells)", self.cells),
            ("C_e (cell capacity)", self.cell_capacity),
            ("N (group size)", self.group_size),
            ("B (batch groups)", self.batch_groups),
            ("μ (steps per burst)", self.mu),
            (
                "micro-step token capacity",
                u32::from(self.micro_tokens > 0),
            ),
            ("target steps", u32::from(self.target_steps > 0)),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero { what });
            }
        }
        if self.start_version >= self.target_steps {
            return Err(ConfigError::StartPastTarget {
                start: self.start_version,
                target: self.target_steps,
            });
        }
        if self.watch_nodes && self.retry.is_none() && !self.rejoin_notices {
            return Err(ConfigError::WatchWithoutRetry);
        }
        let b = self.batch_groups;
        let over = self.phi * f64::from(b);
        if !self.phi.is_finite() || self.phi < 0.0 || (over - over.round()).abs() > 1e-9 {
            return Err(ConfigError::Phi { phi: self.phi, b });
        }
        if !(0.0..=1.0).contains(&self.rho_min) {
            return Err(ConfigError::RhoMin(self.rho_min));
        }
        match self.policy {
            Policy::Colocate if self.phi > 0.0 && self.pool_capacity == 0 => {
                return Err(ConfigError::ColocatePhi);
            }
            Policy::Async { train_cells } => {
                let leaves_rollout = train_cells < self.cells || self.pool_capacity > 0;
                if train_cells == 0 || train_cells > self.cells || !leaves_rollout {
                    return Err(ConfigError::AsyncSplit {
                        train: train_cells,
                        k: self.cells,
                        pool: self.pool_capacity,
                    });
                }
            }
            _ => {}
        }
        Ok(Derived {
            over_groups: over.round() as u64,
            supply_threshold: (self.rho_min * f64::from(b) - 1e-9).ceil().max(0.0) as u32,
        })
    }

    /// Executions per group times groups: N·B.
    pub fn batch_executions(&self) -> u64 {
        u64::from(self.group_size) * u64::from(self.batch_groups)
    }

    /// Executions dispatched per group: N + M.
    pub fn dispatched_per_group(&self) -> u32 {
        self.group_size.saturating_add(self.oversample)
    }

    /// Executions dispatched per batch: (N + M)·B, what boundary dispatch
    /// adds per step of a burst and rule (3) reserves room for.
    pub fn batch_dispatch(&self) -> u64 {
        u64::from(self.dispatched_per_group()) * u64::from(self.batch_groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_derives_whole_groups() {
        let d = SchedConfig::default().validate().unwrap();
        assert_eq!(d.over_groups, 1); // φ = 0.5, B = 2
        assert_eq!(d.supply_threshold, 1); // ⌈0.5·2⌉
    }

    #[test]
    fn fractional_over_dispatch_is_rejected() {
        let cfg = SchedConfig {
            phi: 0.5,
            batch_groups: 3,
            ..SchedConfig::default()
        };
        assert!(matches!(cfg.validate(), Err(ConfigError::Phi { .. })));
        let cfg = SchedConfig {
            phi: f64::NAN,
            ..SchedConfig::default()
        };
        assert!(matches!(cfg.validate(), Err(ConfigError::Phi { .. })));
    }

    #[test]
    fn zero_sizes_are_rejected() {
        let cfg = SchedConfig {
            cells: 0,
            ..SchedConfig::default()
        };
        assert!(matches!(cfg.validate(), Err(ConfigError::Zero { .. })));
        let cfg = SchedConfig {
            target_steps: 0,
            ..SchedConfig::default()
        };
        assert!(matches!(cfg.validate(), Err(ConfigError::Zero { .. })));
    }

    #[test]
    fn supply_threshold_rounds_up_and_allows_zero() {
        let t = |rho, b| {
            SchedConfig {
                rho_min: rho,
                batch_groups: b,
                phi: 0.0,
                ..SchedConfig::default()
            }
            .validate()
            .unwrap()
            .supply_threshold
        };
        assert_eq!(t(0.0, 4), 0);
        assert_eq!(t(0.3, 4), 2);
        assert_eq!(t(0.25, 4), 1);
        assert_eq!(t(1.0, 3), 3);
        let bad = SchedConfig {
            rho_min: 1.5,
            ..SchedConfig::default()
        };
        assert_eq!(bad.validate(), Err(ConfigError::RhoMin(1.5)));
    }

    #[test]
    fn colocate_over_dispatch_needs_a_pool() {
        let mut cfg = SchedConfig {
            policy: Policy::Colocate,
            phi: 0.5,
            ..SchedConfig::default()
        };
        assert_eq!(cfg.validate(), Err(ConfigError::ColocatePhi));
        cfg.pool_capacity = 2;
        assert!(cfg.validate().is_ok());
        cfg.pool_capacity = 0;
        cfg.phi = 0.0;
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn async_needs_a_rollout_side_and_allows_multi_step_bursts() {
        let mut cfg = SchedConfig {
            policy: Policy::Async { train_cells: 2 },
            mu: 3,
            ..SchedConfig::default()
        };
        assert!(cfg.validate().is_ok());
        cfg.mu = 1;
        assert!(cfg.validate().is_ok());
        cfg.policy = Policy::Async { train_cells: 4 };
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::AsyncSplit { .. })
        ));
        cfg.pool_capacity = 3;
        assert!(cfg.validate().is_ok());
        cfg.policy = Policy::Async { train_cells: 0 };
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::AsyncSplit { .. })
        ));
    }
}
