//! The seam between the scheduling plane and the live runners.
//!
//! An execution actor's harness backend and the evaluator actor's backend
//! must not block or do I/O in a handler, so a run and an evaluation
//! attempt are [`IoRequest`]s: the host runs them (the live host on its
//! blocking pool, which waits on the async runner through a tokio
//! [`Handle`]) and the completion comes back to the backend actor as its
//! own message. [`Launcher`] and [`Scorer`] are the small traits behind
//! those requests, so a bridge can hold any runner (the process runner
//! here, or a test double) as `Arc<dyn Launcher>`.

use std::sync::Arc;

use futures::future::BoxFuture;
use gyre_runtime::{IoError, IoRequest};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::evaluator::{EvalTarget, EvaluatorRunner, Verdict};
use super::runner::{ExecutionRequest, HarnessRun, HarnessRunner};

/// Starts one harness execution and completes when it has ended.
pub trait Launcher: Send + Sync + 'static {
    fn launch(
        &self,
        req: ExecutionRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, HarnessRun>;
}

/// Runs one evaluator attempt on a preserved workspace.
pub trait Scorer: Send + Sync + 'static {
    fn score(&self, target: EvalTarget, attempt: u32) -> BoxFuture<'static, Verdict>;
}

impl Launcher for HarnessRunner {
    fn launch(
        &self,
        req: ExecutionRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, HarnessRun> {
        let me = self.clone();
        Box::pin(async move { me.run(req, cancel).await })
    }
}

impl Scorer for EvaluatorRunner {
    fn score(&self, target: EvalTarget, attempt: u32) -> BoxFuture<'static, Verdict> {
        let me = self.clone();
        Box::pin(async move {
            me.attempt(&target, attempt, &CancellationToken::new())
                .await
        })
    }
}

/// A harness run as an actor I/O request (kind `harness.run`).
pub struct RunExecution {
    pub launcher: Arc<dyn Launcher>,
    pub runtime: Handle,
    pub request: ExecutionRequest,
    /// Cancelled by the backend actor on `HarnessReq::Abort`.
    pub cancel: CancellationToken,
}

impl IoRequest for RunExecution {
    type Output = HarnessRun;

    fn kind(&self) -> &'static str {
        "harness.run"
    }

    fn run(self) -> Result<HarnessRun, IoError> {
        Ok(self
            .runtime
            .block_on(self.launcher.launch(self.request, self.cancel)))
    }
}

/// An evaluator attempt as an actor I/O request (kind `evaluator.score`).
pub struct ScoreAttempt {
    pub scorer: Arc<dyn Scorer>,
    pub runtime: Handle,
    pub target: EvalTarget,
    pub attempt: u32,
}

impl IoRequest for ScoreAttempt {
    type Output = Verdict;

    fn kind(&self) -> &'static str {
        "evaluator.score"
    }

    fn run(self) -> Result<Verdict, IoError> {
        Ok(self
            .runtime
            .block_on(self.scorer.score(self.target, self.attempt)))
    }
}
