//! Scenarios: the published workloads and the ablation as TOML files a user
//! can copy and edit (`simulations/scenarios/`), parsed strictly, validated
//! with errors that name the field, and turned into the runs of one
//! comparison.
//!
//! - [`spec`]: the file's schema;
//! - [`build`]: a run of a scenario as a [`crate::world::ClusterConfig`]
//!   (the cost models every constant of the file feeds);
//! - [`error`]: field-naming errors;
//! - `scale`: a scenario shrunk for quick looks and tests.

pub mod build;
pub mod error;
mod scale;
pub mod spec;

use std::path::Path;

use gyre_actors::sched::Policy;
use gyre_actors::sched::maths::staleness::expected_staleness;

pub use build::{RunSpec, cluster_config};
pub use error::FieldError;
pub use spec::Scenario;

use error::check;

/// The scenarios shipped with Gyre, by name.
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "nl2repo-122b",
        include_str!("../../scenarios/nl2repo-122b.toml"),
    ),
    (
        "deepswe-122b",
        include_str!("../../scenarios/deepswe-122b.toml"),
    ),
    (
        "terminalbench-122b",
        include_str!("../../scenarios/terminalbench-122b.toml"),
    ),
    (
        "nl2repo-2.4t",
        include_str!("../../scenarios/nl2repo-2.4t.toml"),
    ),
    (
        "ablation-nl2repo-122b",
        include_str!("../../scenarios/ablation-nl2repo-122b.toml"),
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("no scenario named `{name}`; built in: {known}; or give the path of a .toml file")]
    Unknown { name: String, known: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {error}")]
    Invalid { path: String, error: FieldError },
    #[error("{0}")]
    Selection(String),
}

impl ScenarioError {
    /// The field at fault, when one is.
    pub fn field(&self) -> Option<&str> {
        match self {
            ScenarioError::Invalid { error, .. } => Some(&error.field),
            _ => None,
        }
    }
}

/// Loads a built-in scenario by name, or a scenario file by path.
pub fn load(name_or_path: &str) -> Result<Scenario, ScenarioError> {
    if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
        return parse(text, name_or_path);
    }
    let path = Path::new(name_or_path);
    let looks_like_path = name_or_path.ends_with(".toml") || name_or_path.contains('/');
    if !looks_like_path && !path.is_file() {
        return Err(ScenarioError::Unknown {
            name: name_or_path.to_owned(),
            known: BUILTIN
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: name_or_path.to_owned(),
        source,
    })?;
    parse(&text, name_or_path)
}

/// Parses and validates scenario text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
    let scenario: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
        path: origin.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })?;
    validate(&scenario).map_err(|error| ScenarioError::Invalid {
        path: origin.to_owned(),
        error,
    })?;
    Ok(scenario)
}

/// Rejects a scenario that cannot run, naming the field at fault.
pub fn validate(s: &Scenario) -> Result<(), FieldError> {
    check(!s.name.trim().is_empty(), "name", "must not be empty")?;
    check(s.steps >= 1, "steps", "must be at least 1")?;
    let c = &s.cluster;
    check(c.cells >= 1, "cluster.cells", "K must be at least 1")?;
    check(
        c.nodes_per_cell >= 1,
        "cluster.nodes_per_cell",
        "must be at least 1",
    )?;
    check(
        c.cell_capacity >= 1,
        "cluster.cell_capacity",
        "C_e must be at least 1: a cell that serves no execution cannot roll out",
    )?;
    check(
        c.group_size >= 1,
        "cluster.group_size",
        "N must be at least 1",
    )?;
    check(
        c.batch_groups >= 1,
        "cluster.batch_groups",
        "B must be at least 1",
    )?;
    check(
        c.gpus_per_node >= 1,
        "cluster.gpus_per_node",
        "must be at least 1",
    )?;
    check(
        c.gpu_memory_gib > 0.0,
        "cluster.gpu_memory_gib",
        "must be > 0",
    )?;
    check(
        c.pool_capacity == 0 || c.pool_nodes > 0,
        "cluster.pool_nodes",
        "a standalone pool with capacity needs nodes",
    )?;
    fits(s, c.nodes_per_cell, "cluster.nodes_per_cell")?;
    let m = &s.model;
    for (name, v) in [
        ("model.training_bytes_per_param", m.training_bytes_per_param),
        ("model.rollout_bytes_per_param", m.rollout_bytes_per_param),
        ("model.kv_kib_per_token", m.kv_kib_per_token),
    ] {
        check(v > 0.0, name, "must be > 0")?;
    }
    check(
        m.kv_cache_gib_per_gpu >= 0.0,
        "model.kv_cache_gib_per_gpu",
        "must be ≥ 0",
    )?;
    let i = &s.inference;
    check(
        i.call_overhead_ms[0] <= i.call_overhead_ms[1],
        "inference.call_overhead_ms",
        "is [min, max] with min ≤ max",
    )?;
    check(
        i.prefill_us_per_token >= 0.0,
        "inference.prefill_us_per_token",
        "must be ≥ 0",
    )?;
    check(
        i.decode_ms_per_token > 0.0,
        "inference.decode_ms_per_token",
        "must be > 0",
    )?;
    check(
        i.slowdown_at_capacity >= 0.0,
        "inference.slowdown_at_capacity",
        "must be ≥ 0",
    )?;
    let t = &s.training;
    check(
        t.node_ms_per_token > 0.0,
        "training.node_ms_per_token",
        "must be > 0",
    )?;
    check(
        t.micro_step_tokens >= 1,
        "training.micro_step_tokens",
        "must be at least 1",
    )?;
    check(
        t.short_micro_steps >= 1,
        "training.short_micro_steps",
        "must be at least 1",
    )?;
    for (name, v) in [
        ("training.micro_step_overhead_ms", t.micro_step_overhead_ms),
        ("training.warmup_s", t.warmup_s),
        ("training.drain_s", t.drain_s),
        ("training.reduce_s", t.reduce_s),
        ("training.optimizer_s", t.optimizer_s),
        ("training.broadcast_s", t.broadcast_s),
        ("training.build_groups_s", t.build_groups_s),
        ("switch.to_training_s", s.switch.to_training_s),
        ("switch.to_rollout_s", s.switch.to_rollout_s),
        ("transfer.latency_ms", s.transfer.latency_ms),
        ("transfer.payload_latency_us", s.transfer.payload_latency_us),
        ("transfer.payload_gbps", s.transfer.payload_gbps),
        ("policies.tau_s", s.policies.tau_s),
    ] {
        check(
            v.is_finite() && v >= 0.0,
            name,
            "must be a finite value ≥ 0",
        )?;
    }
    check(
        t.interconnect_gbps_per_node > 0.0,
        "training.interconnect_gbps_per_node",
        "must be > 0",
    )?;
    check(
        s.transfer.read_gbps > 0.0,
        "transfer.read_gbps",
        "must be > 0",
    )?;
    check(
        s.transfer.publish_gbps > 0.0,
        "transfer.publish_gbps",
        "must be > 0",
    )?;
    let e = &s.evaluator;
    check(
        0.0 <= e.latency_min[0] && e.latency_min[0] <= e.latency_min[1],
        "evaluator.latency_min",
        "is [min, max] minutes with 0 ≤ min ≤ max",
    )?;
    check(
        (0.0..1.0).contains(&e.failure_share),
        "evaluator.failure_share",
        "must lie in [0, 1)",
    )?;
    check(e.retry_s > 0.0, "evaluator.retry_s", "must be > 0")?;
    s.workload.validate("workload")?;
    let p = &s.policies;
    check(
        (0.0..=1.0).contains(&p.rho_min),
        "policies.rho_min",
        "ρ_min must lie in [0, 1]",
    )?;
    check(
        matches!(p.dispatch.as_str(), "boundary" | "continuous"),
        "policies.dispatch",
        "must be \"boundary\" or \"continuous\"",
    )?;
    if s.variants.is_empty() {
        check(
            (1..c.cells).contains(&p.async_train_cells)
                || (p.async_train_cells == c.cells && c.pool_capacity > 0),
            "policies.async_train_cells",
            format!(
                "Async trains on 1..K cells and must leave rollout capacity (K = {})",
                c.cells
            ),
        )?;
        check(
            !s.pairs.is_empty(),
            "pairs",
            "need at least one staleness target",
        )?;
        check(
            s.pairs.iter().any(|p| same(p.staleness, s.staleness)),
            "staleness",
            format!("no [[pairs]] entry for E[d] = {}", s.staleness),
        )?;
    }
    for (i, pair) in s.pairs.iter().enumerate() {
        for (who, pm) in [
            ("elastic", pair.elastic),
            ("colocate", pair.colocate),
            ("async", pair.fixed),
        ] {
            let got = expected_staleness(pm.phi, pm.mu);
            check(
                same(got, pair.staleness),
                format!("pairs[{i}].{who}"),
                format!(
                    "(φ, μ) = ({}, {}) gives E[d] = φ + (μ − 1)/2 = {got}, not {}",
                    pm.phi, pm.mu, pair.staleness
                ),
            )?;
        }
    }
    let mut ids = std::collections::BTreeSet::new();
    for (i, v) in s.variants.iter().enumerate() {
        let at = |f: &str| format!("variants[{i}].{f}");
        check(
            ids.insert(v.id.as_str()),
            at("id"),
            format!("`{}` is used twice", v.id),
        )?;
        check(
            !matches!(v.id.as_str(), "all" | "elastic" | "colocate" | "async"),
            at("id"),
            "is a policy name; pick another id",
        )?;
        check(
            matches!(v.policy.as_str(), "elastic" | "colocate" | "async"),
            at("policy"),
            "must be \"elastic\", \"colocate\" or \"async\"",
        )?;
        check(
            v.policy != "async" || v.train_cells.is_some(),
            at("train_cells"),
            "an async variant needs its fixed split",
        )?;
        if let Some(n) = v.nodes_per_cell {
            fits(s, n, &at("nodes_per_cell"))?;
        }
        check(
            v.cell_capacity != Some(0),
            at("cell_capacity"),
            "C_e must be at least 1",
        )?;
        check(v.cells != Some(0), at("cells"), "K must be at least 1")?;
    }
    for run in s.all_runs()? {
        let cfg = cluster_config(s, &run, s.steps, 0);
        cfg.sched.validate().map_err(|e| {
            let field = match s.variants.iter().position(|v| v.id == run.name) {
                Some(i) => format!("variants[{i}]"),
                None => format!("policies ({})", run.name),
            };
            FieldError::new(field, e.to_string())
        })?;
    }
    Ok(())
}

/// The model's training state and rollout weights fit a cell of `nodes`.
fn fits(s: &Scenario, nodes: u32, field: &str) -> Result<(), FieldError> {
    check(nodes >= 1, field, "must be at least 1")?;
    let c = &s.cluster;
    let m = &s.model;
    check(
        m.params_billion.is_finite() && m.params_billion > 0.0,
        "model.params_billion",
        "must be > 0",
    )?;
    let gpus = f64::from(nodes) * f64::from(c.gpus_per_node);
    let cell_gib = gpus * c.gpu_memory_gib;
    let train_gib = build::training_gib(m);
    let roll_gib = build::rollout_gib(m, gpus);
    check(
        train_gib <= cell_gib,
        "model.params_billion",
        format!(
            "a {}B-parameter model needs {train_gib:.0} GiB of training state; a cell of {nodes} \
             nodes ({field}) holds {cell_gib:.0} GiB: it does not fit a cell",
            m.params_billion
        ),
    )?;
    check(
        roll_gib <= cell_gib,
        "model.kv_cache_gib_per_gpu",
        format!(
            "rollout weights and KV cache need {roll_gib:.0} GiB; a cell of {nodes} nodes holds {cell_gib:.0} GiB"
        ),
    )
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Which runs of a scenario to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// The three policies, or every variant.
    All,
    /// Policy names or variant ids.
    Names(Vec<String>),
}

impl Selection {
    /// `all`, or a comma-separated list.
    pub fn parse(text: &str) -> Self {
        let names: Vec<String> = text
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if names.is_empty() || names.iter().any(|n| n == "all") {
            Selection::All
        } else {
            Selection::Names(names)
        }
    }
}

impl Scenario {
    /// The pair of (φ, μ) for target staleness `e_d`.
    pub fn pair(&self, e_d: f64) -> Option<&spec::PairSpec> {
        self.pairs.iter().find(|p| same(p.staleness, e_d))
    }

    /// Every run the scenario defines at its default staleness.
    fn all_runs(&self) -> Result<Vec<RunSpec>, FieldError> {
        if self.variants.is_empty() {
            let pair = self
                .pair(self.staleness)
                .ok_or_else(|| FieldError::new("staleness", "no matching [[pairs]] entry"))?;
            Ok(self.policy_runs(pair))
        } else {
            Ok(self.variants.iter().map(|v| self.variant_run(v)).collect())
        }
    }

    fn base_run(&self, name: &str, policy: Policy, pm: spec::PhiMu) -> RunSpec {
        let c = &self.cluster;
        RunSpec {
            name: name.to_owned(),
            policy,
            phi: pm.phi,
            mu: pm.mu,
            streaming: self.policies.streaming,
            cells: c.cells,
            nodes_per_cell: c.nodes_per_cell,
            cell_capacity: c.cell_capacity,
            pool_nodes: c.pool_nodes,
            pool_capacity: c.pool_capacity,
        }
    }

    fn policy_runs(&self, pair: &spec::PairSpec) -> Vec<RunSpec> {
        vec![
            self.base_run("elastic", Policy::Elastic, pair.elastic),
            self.base_run("colocate", Policy::Colocate, pair.colocate),
            self.base_run(
                "async",
                Policy::Async {
                    train_cells: self.policies.async_train_cells,
                },
                pair.fixed,
            ),
        ]
    }

    fn variant_run(&self, v: &spec::Variant) -> RunSpec {
        let policy = match v.policy.as_str() {
            "async" => Policy::Async {
                train_cells: v.train_cells.unwrap_or(1),
            },
            "colocate" => Policy::Colocate,
            _ => Policy::Elastic,
        };
        let mut run = self.base_run(
            &v.id,
            policy,
            spec::PhiMu {
                phi: v.phi,
                mu: v.mu,
            },
        );
        run.streaming = v.streaming;
        run.cells = v.cells.unwrap_or(run.cells);
        run.nodes_per_cell = v.nodes_per_cell.unwrap_or(run.nodes_per_cell);
        run.cell_capacity = v.cell_capacity.unwrap_or(run.cell_capacity);
        run.pool_nodes = v.pool_nodes.unwrap_or(run.pool_nodes);
        run.pool_capacity = v.pool_capacity.unwrap_or(run.pool_capacity);
        run
    }

    /// The runs `selection` asks for at target staleness `e_d` (the
    /// scenario's default when `None`; variants carry their own (φ, μ)).
    pub fn runs(
        &self,
        selection: &Selection,
        e_d: Option<f64>,
    ) -> Result<Vec<RunSpec>, ScenarioError> {
        let all = if self.variants.is_empty() {
            let e_d = e_d.unwrap_or(self.staleness);
            let pair = self.pair(e_d).ok_or_else(|| {
                ScenarioError::Selection(format!(
                    "scenario `{}` has no (φ, μ) for staleness {e_d}; it has {}",
                    self.name,
                    self.pairs
                        .iter()
                        .map(|p| p.staleness.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            self.policy_runs(pair)
        } else {
            if let Some(e) = e_d
                && !same(e, self.staleness)
            {
                return Err(ScenarioError::Selection(format!(
                    "scenario `{}` holds variants at staleness {}; --staleness {e} does not apply",
                    self.name, self.staleness
                )));
            }
            self.variants.iter().map(|v| self.variant_run(v)).collect()
        };
        match selection {
            Selection::All => Ok(all),
            Selection::Names(names) => names
                .iter()
                .map(|n| {
                    all.iter().find(|r| &r.name == n).cloned().ok_or_else(|| {
                        ScenarioError::Selection(format!(
                            "scenario `{}` has no run `{n}`; it has {}",
                            self.name,
                            all.iter()
                                .map(|r| r.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })
                })
                .collect(),
        }
    }
}
