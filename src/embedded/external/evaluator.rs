//! The evaluator backend of external runs: a command run on the preserved
//! workspace of a closed execution, printing its score.
//!
//! The command (placeholders `{workspace}` and `{query}`) runs as an I/O
//! job, so the actor never blocks; it must print one JSON object
//! `{"score": x, "valid": bool}` on stdout (the last such line counts). A
//! crash, a non-zero exit, unparseable output or `"valid": false` fails
//! the attempt, which the evaluator actor retries within the execution's
//! budget and otherwise excludes; it is never read as a zero. So does a
//! command that runs past its timeout: it is killed, so a hung evaluator
//! cannot hold an I/O worker (and its group's training) for good.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How long an evaluator command may run by default (`gyre train
/// --evaluator-timeout-s`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs the evaluator command per attempt (`Msg` accepts `EvalReq`).
#[derive(Debug)]
pub struct CommandEvaluator {
    argv: Vec<String>,
    board: Arc<Board>,
    scorer: Option<Arc<dyn WorkspaceScorer>>,
    timeout: Duration,
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
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Kills the command after `timeout` (the attempt fails).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Scores with `scorer` instead of a command.
    pub fn with_scorer(scorer: Arc<dyn WorkspaceScorer>, board: Arc<Board>) -> Self {
        Self {
            argv: Vec::new(),
            board,
            scorer: Some(scorer),
            timeout: DEFAULT_TIMEOUT,
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

fn evaluate(
    argv: &[String],
    board: &Board,
    exec: ExecId,
    timeout: Duration,
) -> Result<f64, String> {
    let run = board
        .get(exec)
        .ok_or_else(|| format!("{exec:?} has no workspace to score"))?;
    let fill = |a: &String| {
        a.replace("{workspace}", &run.workspace.display().to_string())
            .replace("{query}", &run.query.to_string())
    };
    let mut cmd = Command::new(fill(&argv[0]));
    cmd.args(argv[1..].iter().map(fill))
        .current_dir(&run.workspace);
    let (status, stdout, stderr) = output_within(cmd, timeout)?;
    if !status.success() {
        return Err(format!(
            "the evaluator exited with {status}: {}",
            String::from_utf8_lossy(&stderr).trim()
        ));
    }
    parse_score(&String::from_utf8_lossy(&stdout))
}

/// Runs `cmd` to its end with its stdout and stderr, or kills it after
/// `timeout`. The command leads a process group of its own, killed with it
/// at the timeout and once it has ended: what it left running in the
/// background (a server its tests started) would otherwise outlive it,
/// one more per evaluation, and hold its output pipes open. The pipes are
/// read on threads of their own, so a chatty command cannot block on a
/// full pipe.
fn output_within(
    mut cmd: Command,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>), String> {
    use std::os::unix::process::CommandExt;
    if crate::harness::orphans::stopping() {
        return Err("gyre is stopping on a signal".into());
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("the evaluator did not start: {e}"))?;
    // A signal that ends gyre ends the command's group too.
    let _tracked = crate::harness::orphans::track(child.id(), true);
    let group = i32::try_from(child.id()).map(nix::unistd::Pid::from_raw);
    let kill_group = || {
        if let Ok(g) = group {
            let _ = nix::sys::signal::killpg(g, nix::sys::signal::Signal::SIGKILL);
        }
    };
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                kill_group();
                let _ = child.wait();
                return Err(format!(
                    "the evaluator did not finish within {} s and was killed",
                    timeout.as_secs_f64()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                kill_group();
                return Err(format!("waiting for the evaluator: {e}"));
            }
        }
    };
    kill_group();
    let join = |t: std::thread::JoinHandle<Vec<u8>>| t.join().unwrap_or_default();
    Ok((status, join(out), join(err)))
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
                let (scorer, timeout) = (self.scorer.clone(), self.timeout);
                cx.io(
                    Work::new("evaluator.command", move || match scorer {
                        Some(s) => board
                            .get(exec)
                            .ok_or_else(|| format!("{exec:?} has no workspace to score"))
                            .and_then(|run| s.score(&run, attempt)),
                        None => evaluate(&argv, &board, exec, timeout).map(|reward| Scored {
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

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_command_past_its_timeout_is_killed_and_the_attempt_fails() {
        let t = Instant::now();
        let e = output_within(sh("exec sleep 30"), Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("did not finish within 0.3 s"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        // In time, its output and status come back whole, however much
        // it writes.
        let (status, out, err) = output_within(
            sh("head -c 300000 /dev/zero | tr '\\0' x; echo oops >&2"),
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(status.success());
        assert_eq!((out.len(), err), (300_000, b"oops\n".to_vec()));
    }

    #[test]
    fn what_a_command_leaves_running_is_killed_with_it() {
        let tag = format!("gyre-eval-test-{}", std::process::id());
        let tagged = |script: &str| {
            let mut c = sh(script);
            c.env(crate::harness::orphans::RUN_VAR, &tag);
            c
        };
        // Ends at once, leaving a sleeper that holds its stdout: the
        // answer comes back without waiting for the sleeper.
        let t = Instant::now();
        let (status, out, _) =
            output_within(tagged("sleep 600 & echo 0.5"), Duration::from_secs(30)).unwrap();
        assert!(status.success());
        assert_eq!(out, b"0.5\n");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        // Past its timeout, with a sleeper in the background too.
        let e = output_within(
            tagged("sleep 600 & exec sleep 30"),
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(e.contains("was killed"), "{e}");
        let left = (0..100).find_map(|_| {
            let left = crate::harness::orphans::find(&tag);
            if left.is_empty() {
                return Some(left);
            }
            std::thread::sleep(Duration::from_millis(20));
            None
        });
        assert_eq!(left, Some(Vec::new()), "processes left running");
    }

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
