//! The front: the async side of the bridge, where I/O happens. It hears
//! the bridge's [`ToFront`] requests on a probe address, creates each
//! execution at the gateway (its own key), gives it a fresh workspace and
//! starts its harness through the [`HarnessLauncher`]; when the program
//! ends it closes the gateway execution (the key stops working) and tells
//! the bridge. It also relays the proxy's answers to the call streams and
//! forwards the inbox into the bridge actor in order. In a resumed run it
//! hands the executions of the groups it adopts ([`super::adopt`]) to the
//! run's first groups instead of starting their harnesses again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use gyre_actors::sched::ids::{ExecId, GroupId};
use gyre_actors::sched::proto::harness::HarnessOutcome;
use gyre_runtime::live::LiveNode;
use gyre_runtime::{ActorId, Addr};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::adopt::{Adoption, Launched, Member, State, Take, now_ms};
use super::board::{Board, RunInfo};
use super::bridge::{BridgeMsg, GatewayHarness, ToFront};
use super::launcher::{HarnessLauncher, HarnessRun, LaunchSpec};
use super::plane::{Executions, Inbox, PlaneRecords};
use super::streams::CallStreams;
use crate::embedded::shared::lock;
use crate::embedded::task::TaskConfig;
use crate::gateway::service::Gateway;

/// Sends the inbox's messages into the bridge actor, one at a time.
pub async fn forward(
    node: LiveNode,
    from: ActorId,
    bridge: Addr<GatewayHarness>,
    mut inbox: mpsc::UnboundedReceiver<BridgeMsg>,
) {
    while let Some(msg) = inbox.recv().await {
        if let Err(error) = node.send(from, bridge, msg).await {
            tracing::debug!(%error, "the bridge is gone; the inbox stops");
            return;
        }
    }
}

pub struct Front {
    pub gateway: Arc<Gateway>,
    pub launcher: Arc<dyn HarnessLauncher>,
    pub executions: Arc<Executions>,
    pub streams: Arc<CallStreams>,
    pub inbox: Inbox,
    pub board: Arc<Board>,
    pub task: TaskConfig,
    /// `http://HOST:PORT` of the gateway's API listener.
    pub api_base: String,
    /// Workspaces and logs go under it.
    pub dir: PathBuf,
    /// The run's tag every harness gets as `GYRE_RUN`.
    pub run: String,
    /// 0 for a run's first head, n for its n-th resume.
    pub incarnation: u64,
    pub runs: HashMap<ExecId, (String, AbortHandle)>,
    /// The groups a resumed head adopts.
    pub adoption: Adoption,
    /// Where records an earlier head committed are handed over.
    pub records: Arc<PlaneRecords>,
}

impl Front {
    pub async fn run(mut self, mut requests: mpsc::Receiver<(ActorId, ToFront)>) {
        while let Some((_, msg)) = requests.recv().await {
            match msg {
                ToFront::Begin { exec, group } => self.begin(exec, group),
                ToFront::Answered {
                    call,
                    output_tokens,
                } => {
                    self.executions.answered(call);
                    self.streams.answered(call, output_tokens);
                }
                ToFront::Abort { exec, timed_out } => self.abort(exec, timed_out),
            }
        }
        self.stop_all();
    }

    /// Kills every harness still running.
    pub fn stop_all(&mut self) {
        for (_, (id, h)) in self.runs.drain() {
            h.abort();
            let _ = self.gateway.close_execution(&id);
        }
        for leader in self.adoption.untaken_leaders() {
            let _ = nix::sys::signal::killpg(leader, nix::sys::signal::Signal::SIGKILL);
        }
    }

    fn fail(&self, exec: ExecId, why: String) {
        tracing::warn!(?exec, %why, "the harness could not start");
        let outcome = HarnessOutcome::Failed { complete: true };
        self.board.count(|s| s.failed += 1);
        let _ = self.inbox.send(BridgeMsg::Finished { exec, outcome });
    }

    fn begin(&mut self, exec: ExecId, group: GroupId) {
        self.runs.retain(|_, (_, h)| !h.is_finished());
        let query = match self.adoption.take(group.0) {
            Take::Member(m) => return self.adopt(exec, group, *m),
            Take::Fresh(q) => q
                .or_else(|| self.launcher.query_of(group.0))
                .unwrap_or_else(|| self.task.query(group.0)),
        };
        self.start(exec, group, query);
    }

    /// Creates `exec`'s gateway execution and starts its harness on
    /// `query`.
    fn start(&mut self, exec: ExecId, group: GroupId, query: u64) {
        let workspace = self.dir.join("workspaces").join(format!("e{}", exec.0));
        let logs = self.dir.join("logs");
        let launched = Launched {
            query,
            group: group.0,
            run: self.run.clone(),
            incarnation: self.incarnation,
            api_base: self.api_base.clone(),
            workspace: workspace.clone(),
            log: logs.join(format!("e{}.log", exec.0)),
            started_ms: now_ms(),
            adopted_from: Vec::new(),
        };
        let described = serde_json::to_value(&launched).ok();
        let meta = match self
            .gateway
            .create_execution(described, Some(group.0.to_string()))
        {
            Ok(m) => m,
            Err(e) => return self.fail(exec, format!("gateway execution: {}", e.message())),
        };
        for d in [&workspace, &logs] {
            if let Err(e) = std::fs::create_dir_all(d) {
                return self.fail(exec, format!("{}: {e}", d.display()));
            }
        }
        self.executions.register(&meta.id, exec);
        self.board.begin(
            exec,
            RunInfo {
                execution: meta.id.clone(),
                query,
                workspace: workspace.clone(),
                outcome: None,
                version: None,
            },
        );
        let run = self.launcher.launch(LaunchSpec {
            execution: meta.id.clone(),
            key: meta.key,
            api_base: self.api_base.clone(),
            query,
            group: group.0,
            workspace,
            log: launched.log,
            run: self.run.clone(),
        });
        self.watch(exec, meta.id, run);
    }

    /// Takes over a member of a group an earlier head left: the records it
    /// committed go to `exec`, and its harness, still running, is waited
    /// for (its calls reach `exec` from now on), or, ended, is scored.
    fn adopt(&mut self, exec: ExecId, group: GroupId, mut m: Member) {
        // The group it was launched in names its folders and logs.
        let launched_in = m
            .launched
            .adopted_from
            .first()
            .map_or(m.launched.group, |(_, g)| *g);
        // It is this head's group's now: a later resume reads this head's
        // journal about it.
        let was = (m.launched.incarnation, m.launched.group);
        m.launched.adopted_from.push(was);
        m.launched.incarnation = self.incarnation;
        m.launched.group = group.0;
        let relabelled = serde_json::to_value(&m.launched)
            .map_err(|e| e.to_string())
            .and_then(|label| {
                self.gateway
                    .describe_execution(&m.id, label)
                    .map_err(|e| e.message().to_string())
            });
        if let Err(error) = relabelled {
            // Unlabelled, a later resume would judge it by the lost head's
            // journal and could train it twice: it is not adopted.
            tracing::warn!(execution = %m.id, %error, "an adopted execution could not be relabelled; its group's member starts afresh");
            if let State::Running(leader) = m.state {
                let _ = nix::sys::signal::killpg(leader, nix::sys::signal::Signal::SIGKILL);
            }
            let _ = self.gateway.close_execution(&m.id);
            return self.start(exec, group, m.launched.query);
        }
        self.executions.register(&m.id, exec);
        let l = &m.launched;
        self.board.begin(
            exec,
            RunInfo {
                execution: m.id.clone(),
                query: l.query,
                workspace: l.workspace.clone(),
                outcome: None,
                version: None,
            },
        );
        let records = self
            .gateway
            .execution(&m.id)
            .map(|e| lock(&e).records.clone())
            .unwrap_or_default();
        for r in &records {
            self.records.replay(r);
        }
        let spec = LaunchSpec {
            execution: m.id.clone(),
            key: m.key,
            api_base: l.api_base.clone(),
            query: l.query,
            group: launched_in,
            workspace: l.workspace.clone(),
            log: l.log.clone(),
            run: self.run.clone(),
        };
        let (leader, ended) = match m.state {
            State::Running(leader) => (Some(leader), None),
            State::Ended(outcome) => (None, Some(outcome)),
        };
        let run = self
            .launcher
            .adopt(spec, leader, l.started())
            .unwrap_or_else(|| match (leader, ended) {
                // Not this launcher's to wait for: ended like a lost run.
                (Some(leader), _) => {
                    let _ = nix::sys::signal::killpg(leader, nix::sys::signal::Signal::SIGKILL);
                    Box::pin(async { HarnessOutcome::Failed { complete: true } })
                }
                (None, outcome) => {
                    let outcome = outcome.unwrap_or(HarnessOutcome::Failed { complete: true });
                    Box::pin(async move { outcome })
                }
            });
        self.watch(exec, m.id, run);
    }

    /// Finishes `exec` once its harness `run` has ended.
    fn watch(&mut self, exec: ExecId, id: String, run: HarnessRun) {
        let (gateway, board, inbox, executions) = (
            self.gateway.clone(),
            self.board.clone(),
            self.inbox.clone(),
            self.executions.clone(),
        );
        let gateway_id = id.clone();
        let task = tokio::spawn(async move {
            let outcome = run.await;
            executions.finished(exec);
            let _ = gateway.close_execution(&gateway_id);
            board.finished(exec, outcome);
            let _ = inbox.send(BridgeMsg::Finished { exec, outcome });
        });
        self.runs.insert(exec, (id, task.abort_handle()));
    }

    fn abort(&mut self, exec: ExecId, timed_out: bool) {
        if let Some((id, h)) = self.runs.remove(&exec) {
            // A run that ended by itself was counted by its launcher.
            if !h.is_finished() {
                self.launcher.stopped(&id, timed_out);
            }
            h.abort();
            let _ = self.gateway.close_execution(&id);
            self.board.count(|s| s.aborted += 1);
        }
    }
}
