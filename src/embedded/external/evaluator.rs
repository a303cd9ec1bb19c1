//! The evaluator backend of external runs: a command run on the preserved
//! workspace of a closed execution, printing its score.
//!
//! The command (placeholders `{workspace}` and `{query}`) runs as an I/O
//! job, so the actor never blocks; it must print one JSON object
//! `{"score": x, "valid": bool}` on stdout (the last such line counts). A
//! crash, a non-zero exit, unparseable output or `"valid": false` fails
//! the attempt, which the evaluator actor retries within the execution's
//! budget and otherwise excludes; it is never read as a zero.

use std::process::Command;
use std::sync::Arc;

use gyre_actors::sched::ids::ExecId;
use gyre_actors::sched::proto::evaluator::{EvalEvent, EvalReq, EvalState};
use gyre_actors::trajectory::scoring::ArtifactRef;
use gyre_runtime::{Actor, ActorId, Cx, IoError, Recipient};
use serde::{Deserialize, Serialize};

use super::board::{Board, RunInfo};
use crate::embedded::work::Work;

#[derive(Debug, Serialize, Deserialize)]
pub enum CommandEvalMsg {
    Req(EvalReq),
    Done {
        exec: ExecId,
        attempt: u32,
        reply_to: Recipient<EvalEvent>,
        score: Result<Scored, IoError>,
    },
}

/// One attempt's valid score, and the state it was taken on where the
/// scorer names it (a workspace's content hash and branch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scored {
    pub reward: f64,
    pub artifact: Option<ArtifactRef>,
}

impl From<EvalReq> for CommandEvalMsg {
    fn from(r: EvalReq) -> Self {
        CommandEvalMsg::Req(r)
    }
}

/// Scores a run's workspace in place of the command (a job file's
/// evaluator runner, `crate::harness`); called on an I/O worker, so it may
/// block. `Err` is a failed attempt (pending, retried), never a zero.
pub trait WorkspaceScorer: std::fmt::Debug + Send + Sync + 'static {
    fn score(&self, run: &RunInfo, attempt: u32) -> Result<Scored, String>;
}

/// Runs the evaluator command per attempt (`Msg` accepts `EvalReq`).
#[derive(Debug)]
pub struct CommandEvaluator {
    argv: Vec<String>,
    board: Arc<Board>,
    scorer: Option<Arc<dyn WorkspaceScorer>>,
}

impl CommandEvaluator {
    pub fn new(argv: Vec<String>, board: Arc<Board>) -> Result<Self, String> {
        if argv.first().is_none_or(|a| a.trim().is_empty()) {
            return Err("the evaluator command is empty".into());
        }
        Ok(Self {
            argv,
            board,
            scorer: None,
        })
    }

    /// Scores with `scorer` instead of a command.
    pub fn with_scorer(scorer: Arc<dyn WorkspaceScorer>, board: Arc<Board>) -> Self {
        Self {
            argv: Vec::new(),
            board,
            scorer: Some(scorer),
        }
    }
}

/// The score in an evaluator's stdout.
pub fn parse_score(stdout: &str) -> Result<f64, String> {
    #[derive(Deserialize)]
    struct Verdict {
        score: f64,
        #[serde(default = "yes")]
        valid: bool,
    }
    fn yes() -> bool {
        true
    }
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| format!("no JSON verdict in the evaluator's output: {stdout:?}"))?;
    let v: Verdict = serde_json::from_str(line)
        .map_err(|e| format!("the evaluator's verdict {line:?} does not parse: {e}"))?;
    if !v.valid {
        return Err("the evaluator called the run invalid".into());
    }
    if !v.score.is_finite() {
        return Err(format!("the evaluator's score {} is not a number", v.score));
    }
    Ok(v.score)
}

fn evaluate(argv: &[String], board: &Board, exec: ExecId) -> Result<f64, String> {
    let run = board
        .get(exec)
        .ok_or_else(|| format!("{exec:?} has no workspace to score"))?;
    let fill = |a: &String| {
        a.replace("{workspace}", &run.workspace.display().to_string())
            .replace("{query}", &run.query.to_string())
    };
    let out = Command::new(fill(&argv[0]))
        .args(argv[1..].iter().map(fill))
        .current_dir(&run.workspace)
        .output()
        .map_err(|e| format!("the evaluator did not start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the evaluator exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_score(&String::from_utf8_lossy(&out.stdout))
}

impl Actor for CommandEvaluator {
    type Msg = CommandEvalMsg;
    type Timer = ();
    gyre_runtime::accepts!(EvalReq);

    fn on_msg(&mut self, _from: ActorId, msg: CommandEvalMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            CommandEvalMsg::Req(EvalReq::Score {
                exec,
                attempt,
                reply_to,
            }) => {
                let (argv, board) = (self.argv.clone(), self.board.clone());
                let scorer = self.scorer.clone();
                cx.io(
                    Work::new("evaluator.command", move || match scorer {
                        Some(s) => board
                            .get(exec)
                            .ok_or_else(|| format!("{exec:?} has no workspace to score"))
                            .and_then(|run| s.score(&run, attempt)),
                        None => evaluate(&argv, &board, exec).map(|reward| Scored {
                            reward,
                            artifact: None,
                        }),
                    }),
                    move |score| CommandEvalMsg::Done {
                        exec,
                        attempt,
                        reply_to,
                        score,
                    },
                );
            }
            CommandEvalMsg::Done {
                exec,
                attempt,
                reply_to,
                score,
            } => match score {
                Ok(Scored { reward, artifact }) => {
                    self.board.scored(exec, reward);
                    // The evaluator actor accepts the state through its
                    // accepts! table, as it does `EvalEvent`.
                    if let Some(artifact) = artifact {
                        let state = EvalState {
                            exec,
                            attempt,
                            artifact,
                        };
                        cx.send(reply_to.same_actor::<EvalState>(), state);
                    }
                    cx.send(
                        reply_to,
                        EvalEvent::Scored {
                            exec,
                            attempt,
                            reward,
                        },
                    );
                }
                Err(error) => {
                    tracing::debug!(?exec, attempt, %error, "evaluation attempt failed");
                    self.board.count(|s| s.eval_failures += 1);
                    cx.send(reply_to, EvalEvent::Failed { exec, attempt });
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_parse_and_bad_ones_fail() {
        assert_eq!(
            parse_score("noise\n{\"score\": 0.5, \"valid\": true}\n"),
            Ok(0.5)
        );
        assert_eq!(parse_score("{\"score\": 1}"), Ok(1.0));
        assert!(parse_score("{\"score\": 1, \"valid\": false}").is_err());
        assert!(parse_score("score 1").is_err());
        assert!(parse_score("{\"valid\": true}").is_err());
    }
}
