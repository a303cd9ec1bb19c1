//! The gateway side of a run: the HTTP listener harness processes call,
//! the front that starts them, the call streams the engines' token tap
//! feeds, and the task backends (harness bridge, evaluator) that connect
//! them to the scheduling plane. A one-process run and a cluster's head
//! open it the same way; only where the engines run differs (in process,
//! or in node agents whose taps send their tokens to the head).
//!
//! [`prepare`] builds the task backends (the run's factory takes them);
//! [`Prepared::open`] builds the gateway over the run's payload store and
//! weights and binds its listener; the front and the bridge's inbox start
//! once the harness actor runs ([`GatewaySide::attach`]), since the inbox
//! forwards into it. Closing stops the listener; the front
//! ends, killing the harnesses still running, when the host that owns its
//! probe shuts down.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gyre_runtime::live::LiveNode;
use gyre_runtime::{ActorId, Addr, BlobStore, External, Recipient};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::adopt::{self, Adoption, Plan};
use super::board::Board;
use super::bridge::{BridgeMsg, GatewayHarness, ToFront};
use super::evaluator::{CommandEvaluator, WorkspaceScorer};
use super::front::{Front, forward};
use super::launcher::read_status;
use super::plane::{Executions, Inbox, PlaneEngine, PlaneRecords};
use super::run::{GatewayOptions, GatewayRunError, HarnessSummary};
use super::streams::CallStreams;
use crate::embedded::cluster::{BuildError, EmbeddedConfig, TaskBackends};
use crate::embedded::engine::TokenTap;
use crate::embedded::shared::Shared;
use crate::embedded::task::TaskStats;
use crate::gateway::embedded::renderer_for_vocab;
use crate::gateway::parse::ToolFormat;
use crate::gateway::service::{Gateway, GatewayConfig};
use crate::gateway::store::Store;
use crate::harness::orphans;

/// The harness and evaluator of external processes behind the gateway.
pub struct ExternalTask {
    front: Recipient<ToFront>,
    board: Arc<Board>,
    evaluator: Vec<String>,
    evaluator_timeout: std::time::Duration,
    scorer: Option<Arc<dyn WorkspaceScorer>>,
    tap: Arc<CallStreams>,
}

impl TaskBackends for ExternalTask {
    type Harness = GatewayHarness;
    type Evaluator = CommandEvaluator;

    fn harness(&mut self, shared: &Shared) -> Result<GatewayHarness, BuildError> {
        Ok(GatewayHarness::new(self.front, shared.blobs.clone()))
    }

    fn evaluator(&mut self) -> Result<CommandEvaluator, BuildError> {
        match &self.scorer {
            Some(s) => Ok(CommandEvaluator::with_scorer(s.clone(), self.board.clone())),
            None => CommandEvaluator::new(self.evaluator.clone(), self.board.clone())
                .map(|e| e.with_timeout(self.evaluator_timeout))
                .map_err(BuildError::Harness),
        }
    }

    fn token_tap(&self) -> Option<Arc<dyn TokenTap>> {
        Some(self.tap.clone())
    }
}

/// What the gateway side saw of a run (part of its report).
#[derive(Debug, Clone, Serialize)]
pub struct GatewayCounters {
    /// `http://HOST:PORT` of the gateway's API listener.
    pub gateway: String,
    pub task: HarnessSummary,
    pub gateway_calls: u64,
    pub plane_calls_answered: u64,
    pub calls_without_record: u64,
    pub streamed_tokens: u64,
    pub resumed_attempts: u64,
    pub engine_changes: u64,
    pub gateway_reroutes: u64,
}

/// Where the bridge's requests arrive: the probe's id and its receiver.
type FrontProbe = (ActorId, mpsc::Receiver<(ActorId, ToFront)>);

/// What a resumed head took over from the lost one ([`super::adopt`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AdoptionReport {
    /// Groups adopted: the resumed run's first groups.
    pub groups: u64,
    /// Harnesses adopted while running.
    pub running: u64,
    /// Ended members of adopted groups, scored again.
    pub ended: u64,
    /// Calls the adopted members had recorded under the lost head, kept
    /// for training rather than made again.
    pub records: u64,
    /// Adoptable groups beyond the run's first dispatch (redone).
    pub groups_left: u64,
    /// Harness processes of the run killed (not adopted).
    pub killed: u64,
}

/// The gateway in front of a run's executions (see the module's doc).
pub struct GatewaySide {
    /// What this head adopted of a lost head's runs (zeros unless resumed).
    pub adopted: AdoptionReport,
    pub gateway: Arc<Gateway>,
    pub streams: Arc<CallStreams>,
    pub board: Arc<Board>,
    pub executions: Arc<Executions>,
    /// `http://HOST:PORT` of the API listener.
    pub api_base: String,
    inbox_rx: Option<mpsc::UnboundedReceiver<BridgeMsg>>,
    front: Option<(Front, FrontProbe)>,
    server: JoinHandle<std::io::Result<()>>,
    forwarder: Option<JoinHandle<()>>,
    front_task: Option<JoinHandle<()>>,
}

/// The task backends are built first (the run's factory takes them);
/// the gateway itself needs the run's payload store and weights, which
/// exist once the factory does.
pub struct Prepared {
    streams: Arc<CallStreams>,
    board: Arc<Board>,
    front: FrontProbe,
}

/// The task backends of external processes behind the gateway, the
/// bridge talking to the probe `front`.
pub fn prepare(
    opts: &GatewayOptions,
    front: (Addr<External<ToFront>>, mpsc::Receiver<(ActorId, ToFront)>),
) -> (ExternalTask, Prepared) {
    let (front_addr, front_rx) = front;
    let streams = Arc::new(CallStreams::default());
    let board = Arc::new(Board::default());
    let task = ExternalTask {
        front: Recipient::of(front_addr),
        board: board.clone(),
        evaluator: opts.evaluator.clone(),
        evaluator_timeout: opts.evaluator_timeout,
        scorer: opts.scorer.clone(),
        tap: streams.clone(),
    };
    let prepared = Prepared {
        streams,
        board,
        front: (front_addr.id(), front_rx),
    };
    (task, prepared)
}

/// Where a head's harnesses work, and which of its run's heads it is.
#[derive(Debug, Clone, Default)]
pub struct Incarnation {
    /// Workspaces and logs go under it.
    pub dir: PathBuf,
    /// The run's tag every harness is told (`GYRE_RUN`,
    /// [`crate::harness::orphans`]).
    pub run: String,
    /// 0 for a run's first head, n for its n-th resume.
    pub number: u64,
    /// The groups the checkpoint holds trained, by (incarnation, group).
    pub trained: BTreeSet<(u64, u64)>,
}

impl Prepared {
    /// Builds the gateway over the run's payload store and published
    /// weights (`shared`) and binds its listener. A resumed head (`at`'s
    /// number above 0) adopts the groups lost heads left untrained where it
    /// can ([`super::adopt`]) and kills the rest of their harnesses.
    pub async fn open(
        self,
        cfg: &EmbeddedConfig,
        opts: &GatewayOptions,
        at: Incarnation,
        shared: &Shared,
    ) -> Result<GatewaySide, GatewayRunError> {
        let Incarnation {
            dir,
            run,
            number: incarnation,
            trained,
        } = at;
        let Prepared {
            streams,
            board,
            front: (front_id, front_rx),
        } = self;
        let blobs: Arc<dyn BlobStore> = shared.blobs.clone();
        let executions = Arc::new(Executions::default());
        let (inbox, inbox_rx): (Inbox, _) = mpsc::unbounded_channel();
        let engine = PlaneEngine {
            inbox: inbox.clone(),
            streams: streams.clone(),
            executions: executions.clone(),
            blobs: blobs.clone(),
            weights: shared.weights.clone(),
            context: cfg.model.context,
            max_tokens: opts.max_tokens,
        };
        let gw = |e: &dyn std::fmt::Display| GatewayRunError::Gateway(e.to_string());
        let store = match &opts.store {
            Some(d) => Store::open(d),
            None => Store::temporary(),
        }
        .map_err(|e| gw(&e))?;
        let config = GatewayConfig {
            model: "gyre-policy".into(),
            tool_format: ToolFormat::Hermes,
            max_body_bytes: 4 * 1024 * 1024,
            max_concurrency: 1024,
            request_timeout: Duration::from_secs(600),
        };
        // The policy's own vocabulary: the byte game's bytes, or the shipped BPE.
        let renderer = renderer_for_vocab(Some(cfg.model.vocab)).map_err(|e| gw(&e))?;
        let records = Arc::new(PlaneRecords {
            inbox: inbox.clone(),
            executions: executions.clone(),
            blobs,
            board: board.clone(),
        });
        let gateway = Gateway::new(Arc::new(engine), renderer, store, config)
            .map_err(|e| gw(&e))?
            .with_record_sink(records.clone());
        let listener = tokio::net::TcpListener::bind(opts.listen).await?;
        let api_base = format!("http://{}", listener.local_addr()?);
        // A resume adopts what it can of the lost head's running groups and
        // kills the other harnesses of the run.
        let metas = gateway.list_executions();
        let (plan, killed) = if incarnation == 0 {
            (Plan::default(), 0)
        } else {
            let plan = if opts.launcher.adopts() {
                let first = cfg.sched.validate().map_or(0, |d| {
                    d.over_groups + u64::from(cfg.sched.mu) * u64::from(cfg.sched.batch_groups)
                });
                adopt::plan(
                    &metas,
                    &orphans::leaders(&run),
                    read_status,
                    &run,
                    &api_base,
                    &trained,
                    first as usize,
                )
            } else {
                Plan::default()
            };
            let killed = orphans::reap_except(&run, &plan.running) as u64;
            (plan, killed)
        };
        // Executions read back from the store still open belong to an
        // earlier run or to a lost head of this one: unless adopted, their
        // harnesses are gone, so their keys stop working.
        for (meta, _) in metas {
            if !meta.closed && !plan.running.contains(&meta.id) {
                gateway
                    .close_execution(&meta.id)
                    .map_err(|e| gw(&e.message()))?;
            }
        }
        let adopted = AdoptionReport {
            groups: plan.groups.len() as u64,
            running: plan.running.len() as u64,
            ended: plan.ended,
            records: plan.records,
            groups_left: plan.groups_left,
            killed,
        };
        let gateway = Arc::new(gateway);
        let server = tokio::spawn({
            let router = crate::gateway::http::api_router(gateway.clone());
            async move { axum::serve(listener, router).await }
        });
        let front = Front {
            gateway: gateway.clone(),
            launcher: opts.launcher.clone(),
            executions: executions.clone(),
            streams: streams.clone(),
            inbox,
            board: board.clone(),
            task: cfg.task.clone(),
            api_base: api_base.clone(),
            dir,
            run,
            incarnation,
            runs: Default::default(),
            adoption: Adoption::new(&plan),
            records,
        };
        Ok(GatewaySide {
            adopted,
            gateway,
            streams,
            board,
            executions,
            api_base,
            inbox_rx: Some(inbox_rx),
            front: Some((front, (front_id, front_rx))),
            server,
            forwarder: None,
            front_task: None,
        })
    }
}

impl GatewaySide {
    /// Starts the front and the inbox into `harness`, the bridge actor
    /// the task's harness became on `node`.
    pub fn attach(&mut self, node: LiveNode, harness: Addr<GatewayHarness>) {
        if let (Some((front, (from, rx))), Some(inbox)) = (self.front.take(), self.inbox_rx.take())
        {
            self.forwarder = Some(tokio::spawn(forward(node, from, harness, inbox)));
            self.front_task = Some(tokio::spawn(front.run(rx)));
        }
    }

    /// The task's tallies so far (rewards by dispatch version).
    pub fn stats(&self) -> TaskStats {
        self.board.stats()
    }

    /// Stops the listener and the inbox. Call it after the host that owns
    /// the front's probe shut down: the front then ends, killing the
    /// harnesses still running, and is waited for here (10 s at most).
    pub async fn close(mut self) -> (GatewayCounters, TaskStats) {
        if let Some(front) = self.front_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), front).await;
        }
        if let Some(f) = self.forwarder.take() {
            f.abort();
        }
        self.server.abort();
        (self.counters(), self.board.stats())
    }

    fn counters(&self) -> GatewayCounters {
        let stats = self.board.stats();
        let (answered, unrecorded) = self.executions.answered_unrecorded();
        let m = &self.gateway.metrics;
        let s = &self.streams.stats;
        GatewayCounters {
            gateway: self.api_base.clone(),
            task: HarnessSummary::from(&stats),
            gateway_calls: m.calls_committed.load(Ordering::Relaxed),
            plane_calls_answered: answered,
            calls_without_record: unrecorded,
            streamed_tokens: s.tokens.load(Ordering::Relaxed),
            resumed_attempts: s.resumed.load(Ordering::Relaxed),
            engine_changes: s.engine_changes.load(Ordering::Relaxed),
            gateway_reroutes: m.reroutes.load(Ordering::Relaxed),
        }
    }
}
