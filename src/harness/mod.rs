//! Live harness and evaluator runners: a user's own agent program run on a
//! user's own tasks, sandboxed, through the gateway, and scored by the
//! user's own rubric command (SPEC 3.3; ARCHITECTURE "harness" and
//! "evaluator" backends).
//!
//! - [`job`]: the job file (`gyre train --job`); [`duration`]: "30m".
//! - [`tasks`]: the task folders and the seeded epochs queries are drawn in.
//! - [`workspace`]: per-execution folders and the content hash.
//! - [`process`]: a child in its own session and group, rlimits, logs,
//!   timeouts that kill the whole group, nothing left behind.
//! - [`orphans`]: the harnesses a killed head left running, found by
//!   their run's `GYRE_RUN` and killed when the run resumes.
//! - [`sandbox`]: none, bwrap, or a user's container prefix; [`forward`]:
//!   a bwrap sandbox's only way out, to the gateway.
//! - [`access`]: opening and closing executions at the gateway.
//! - [`runner`]: one harness execution end to end; [`evaluator`]: one
//!   evaluator attempt, the verdict and its binding.
//! - [`bench`]: the measurements of `gyre bench harness`.
//! - [`train`]: a job as `gyre train`'s cluster configuration, harness
//!   launcher and evaluator (the gateway front of src/embedded/external).
//! - [`launcher`]: the traits and I/O requests the scheduling plane's
//!   backend actors use; [`placeholders`]: `{workspace}` and friends.

pub mod access;
pub mod bench;
pub mod duration;
pub mod evaluator;
pub mod forward;
pub mod job;
pub mod launcher;
pub mod orphans;
pub mod placeholders;
pub mod process;
pub mod runner;
pub mod sandbox;
pub mod tasks;
pub mod train;
pub mod workspace;

pub use access::{AdminHttp, Credentials, GatewayAccess, InProcess};
pub use evaluator::{Binding, EvalTarget, Evaluation, EvaluatorConfig, EvaluatorRunner, Verdict};
pub use job::{JobError, JobFile};
pub use launcher::{Launcher, RunExecution, ScoreAttempt, Scorer};
pub use runner::{ExecutionRequest, HarnessRun, HarnessRunner, RunOutcome, RunnerConfig};
pub use tasks::{Epochs, Task, TaskSet};
