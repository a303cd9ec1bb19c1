//! The evaluator backend of the built-in task: scores the preserved
//! workspace of a closed execution.
//!
//! Like a rubric command run on a sandbox, it reads what the harness left
//! and answers at once. A configured share of attempts fails, decided by a
//! draw keyed on `(seed, exec, attempt)`, so the evaluator actor's retries
//! are exercised the same way on every replay. A run with no workspace (its
//! harness was aborted) cannot be scored: every attempt fails and the
//! evaluator actor excludes it when its budget runs out.

use std::sync::Arc;

use gyre_actors::sched::proto::evaluator::{EvalEvent, EvalReq};
use gyre_runtime::rng::mix64;
use gyre_runtime::{Actor, ActorId, Cx};

use super::spec::{TaskConfig, TaskConfigError, unit_draw};
use super::workspace::{TaskStats, Workspaces};
use crate::embedded::journal::Journal;

/// Keeps the evaluator's draws apart from the harness's under one seed.
const SALT: u64 = 0x6576_616c; // "eval"

/// The task's evaluator (`Msg = EvalReq`; address it with `port(addr)`).
#[derive(Debug)]
pub struct EvaluatorWorker {
    cfg: TaskConfig,
    seed: u64,
    board: Arc<Workspaces>,
    /// `gyre train --record`: where every attempt is written.
    journal: Option<Journal>,
}

impl EvaluatorWorker {
    pub fn new(
        cfg: TaskConfig,
        board: Arc<Workspaces>,
        seed: u64,
    ) -> Result<Self, TaskConfigError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            seed: mix64(seed ^ SALT),
            board,
            journal: None,
        })
    }

    /// Writes every evaluation attempt to `journal`.
    pub fn with_journal(mut self, journal: Option<Journal>) -> Self {
        self.journal = journal;
        self
    }

    pub fn stats(&self) -> TaskStats {
        self.board.stats()
    }
}

impl Actor for EvaluatorWorker {
    type Msg = EvalReq;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, msg: EvalReq, cx: &mut Cx<'_, Self>) {
        let EvalReq::Score {
            exec,
            attempt,
            reply_to,
        } = msg;
        let note = |ok: bool| {
            if let Some(j) = &self.journal {
                j.evaluated(exec, cx.now(), 0, ok);
            }
        };
        let Some(ws) = self.board.get(exec) else {
            note(false);
            self.board.count(|s| s.eval_missing += 1);
            tracing::debug!(?exec, attempt, "no workspace to score");
            return cx.send(reply_to, EvalEvent::Failed { exec, attempt });
        };
        if unit_draw(self.seed, exec.0, u64::from(attempt)) < self.cfg.eval_failure_rate {
            note(false);
            self.board.count(|s| s.eval_failures += 1);
            return cx.send(reply_to, EvalEvent::Failed { exec, attempt });
        }
        note(true);
        let reward = ws.reward(&self.cfg);
        self.board.scored(exec, reward, ws.version());
        cx.send(
            reply_to,
            EvalEvent::Scored {
                exec,
                attempt,
                reward,
            },
        );
    }
}
