//! The embedded trainer as the scheduling plane's trainer backend.
//!
//! One worker per cell drives that cell's [`Trainer`]; cell 0's is also the
//! core's (it owns the optimizer). Every operation runs as I/O, one at a
//! time in arrival order:
//! - `Warmup`: sync to the newest published parameters. Weights are fixed
//!   during a step, so the newest version at a step's warm-up is exactly the
//!   snapshot a joining satellite reads and what a broadcast delivers.
//! - `FwdBwd`: read the micro-step's rows by handle, forward/backward under
//!   the objective of SPEC 3.7 with the packer's per-token coefficients,
//!   accumulate (the packer releases the rows once the step is trained).
//! - `Drain`: hand this cell's accumulated gradients to the reduction board
//!   and zero them.
//! - `Reduce` (core): sum the gradients of the prefix's cells; the
//!   coefficients already divide by B·N, so the sum is the batch gradient.
//! - `Update` (core): clip and one AdamW step, then publish the new version.
//! - `Checkpoint` (core): write weights, AdamW state, step and version to
//!   `<dir>/core.ckpt` atomically (see [`gyre_gpu::trainer::checkpoint`]);
//!   answered once the file is durable.
//!
//! The sequence ratio s_i only decides the clip mask; it is computed over
//! the targets of the execution inside each micro-step, which is exact
//! when an execution's targets share a micro-step (the packer keeps rows
//! whole, and the embedded task's executions are a few short rows).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gyre_actors::sched::ids::{MicroStepId, Step};
use gyre_actors::sched::proto::trainer::{TrainerEvent, TrainerReq};
use gyre_actors::trajectory::packing::MicroStepRows;
use gyre_gpu::trainer::{
    CoreCheckpoint, GradBuffer, Loss, MicroReport, MicroStep, ObjectiveConfig, RowChunk, TrainRow,
    Trainer, UpdateReport,
};
use gyre_runtime::{Actor, ActorId, Cx, IoError, Nanos, Recipient, get_decoded};
use serde::{Deserialize, Serialize};

use super::journal::{Journal, op_line};
use super::last_word::{CoreLastWord, RecentUpdates};
use super::shared::{Shared, TrainerHandle, lock};
use super::work::{Serial, Work};
use gyre_simulations::replay::schema::Op;

#[derive(Debug, Serialize, Deserialize)]
pub enum TrainerWorkerMsg {
    Req(TrainerReq),
    Done(Result<Finished, IoError>),
}

impl From<TrainerReq> for TrainerWorkerMsg {
    fn from(r: TrainerReq) -> Self {
        TrainerWorkerMsg::Req(r)
    }
}

/// What one operation did, as plain data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Finished {
    Warm {
        loaded: Option<u64>,
    },
    Computed {
        /// The parameters' version the micro-step was computed under.
        version: u64,
        loss: f64,
        targets: u64,
        tokens: u64,
        clipped_executions: u64,
        ratio_capped: u64,
    },
    Drained {
        micro_steps: u64,
    },
    Reduced {
        grad_norm: f64,
        missing: Vec<u32>,
    },
    Updated(UpdateSummary),
    Broadcasted,
    Checkpointed {
        bytes: u64,
    },
    /// The gradients were dropped; the parameters are at `version`, the
    /// state this process `kept` or the checkpoint it loaded.
    Restored {
        version: u64,
        kept: bool,
    },
}

/// One optimizer update, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UpdateSummary {
    pub step: Step,
    pub version: u64,
    pub loss: f64,
    pub grad_norm: f64,
    pub clipped: bool,
    pub micro_steps: u64,
    pub targets: u64,
}

impl UpdateSummary {
    /// An update of `version` for tests of what keeps updates.
    #[cfg(test)]
    pub(crate) fn example(version: u64) -> Self {
        Self {
            step: version - 1,
            version,
            loss: 0.5,
            grad_norm: 1.0,
            clipped: false,
            micro_steps: 2,
            targets: 10,
        }
    }

    fn new(step: Step, r: &UpdateReport) -> Self {
        Self {
            step,
            version: r.version,
            loss: r.loss,
            grad_norm: r.grad_norm,
            clipped: r.clipped,
            micro_steps: r.micro_steps,
            targets: r.targets,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainerStats {
    pub warmups: u64,
    pub syncs: u64,
    pub micro_steps: u64,
    pub targets: u64,
    pub tokens: u64,
    pub drains: u64,
    /// Micro-steps whose rows could not be read or computed: they train
    /// nothing, and the step still completes.
    pub failed_micro_steps: u64,
    /// Members of a reduction that deposited no gradients: a satellite
    /// that joined after the last micro-step was claimed computes nothing
    /// and never warms up, so it contributes zero.
    pub idle_members: u64,
    pub errors: u64,
    /// Requests of an older restore epoch than the newest seen, dropped.
    pub stale: u64,
    /// Durable checkpoints written, and their bytes.
    pub checkpoints: u64,
    pub checkpoint_bytes: u64,
    pub updates: Vec<UpdateSummary>,
    /// Micro-steps by the parameters' version they were computed under.
    pub by_version: BTreeMap<u64, ComputedAt>,
}

/// What was computed under one parameters' version. Under the version that
/// sampled the rows, every importance ratio is 1 up to float error (TITO),
/// so nothing is clipped or capped: a non-zero count there means the
/// recorded log-probs and the trainer disagree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComputedAt {
    pub micro_steps: u64,
    pub targets: u64,
    pub clipped_executions: u64,
    pub ratio_capped: u64,
}

pub struct TrainerWorker {
    cell: u32,
    trainer: TrainerHandle,
    shared: Shared,
    objective: ObjectiveConfig,
    /// The core's reduced gradients between `Reduce` and `Update`.
    reduced: Arc<Mutex<Option<GradBuffer>>>,
    jobs: Serial<TrainerReq>,
    stats: TrainerStats,
    /// Hears every optimizer update this worker makes (a user's monitor).
    observer: Option<Recipient<UpdateSummary>>,
    /// Where the core writes its durable checkpoint.
    checkpoint: Option<PathBuf>,
    /// The core's latest updates, for its last word.
    recent: RecentUpdates,
    /// `gyre train --record`: where each operation is written, and when
    /// the running one began.
    journal: Option<Journal>,
    began: Nanos,
    /// When the running one arrived.
    arrived: Nanos,
    /// Nothing has run here yet: this process is new, so a restore loads
    /// the core's last durable checkpoint instead of keeping the state.
    fresh: bool,
    /// The newest restore epoch of the core seen in a request: one of an
    /// older epoch belongs to a state rolled back (its gradients must not
    /// reach the redone step) and is dropped, even if already queued.
    epoch: u64,
}

impl std::fmt::Debug for TrainerWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainerWorker")
            .field("cell", &self.cell)
            .field("queued", &self.jobs.waiting())
            .field("stats", &self.stats)
            .finish()
    }
}

impl TrainerWorker {
    pub fn new(
        cell: u32,
        trainer: TrainerHandle,
        shared: Shared,
        objective: ObjectiveConfig,
    ) -> Self {
        Self {
            cell,
            trainer,
            shared,
            objective,
            reduced: Arc::default(),
            jobs: Serial::default(),
            stats: TrainerStats::default(),
            observer: None,
            checkpoint: None,
            recent: RecentUpdates::default(),
            journal: None,
            began: 0,
            arrived: 0,
            fresh: true,
            epoch: 0,
        }
    }

    /// The core writes its checkpoints to `path` (`None`: a checkpoint
    /// request fails, and is logged as an error).
    pub fn with_checkpoint(mut self, path: Option<PathBuf>) -> Self {
        self.checkpoint = path;
        self
    }

    /// What the core's node agent writes when the head is lost (a core
    /// with checkpoints only; see [`crate::embedded::last_word`]).
    pub fn last_word(&self) -> Option<CoreLastWord> {
        let path = self.checkpoint.as_deref()?;
        Some(CoreLastWord::new(
            self.trainer.clone(),
            self.recent.clone(),
            path,
        ))
    }

    /// Writes every operation to `journal` (`gyre train --record`).
    pub fn with_journal(mut self, journal: Option<Journal>) -> Self {
        self.journal = journal;
        self
    }

    /// Reports each update to `observer` as it is published, so an
    /// embedding application follows training without polling the boards.
    pub fn with_observer(mut self, observer: Option<Recipient<UpdateSummary>>) -> Self {
        self.observer = observer;
        self
    }

    pub fn stats(&self) -> &TrainerStats {
        &self.stats
    }

    fn next(&mut self, cx: &mut Cx<'_, Self>) {
        let Some(req) = self.jobs.take_next() else {
            return;
        };
        if req.epoch() < self.epoch {
            self.stats.stale += 1;
            return self.next(cx);
        }
        let epoch = req.epoch();
        let done = TrainerWorkerMsg::Done;
        match &req {
            TrainerReq::Warmup { step, .. } => {
                let step = *step;
                cx.io(self.warmup(step), done)
            }
            TrainerReq::FwdBwd { rows, .. } => {
                let rows = *rows;
                cx.io(self.fwd_bwd(rows), done)
            }
            TrainerReq::Drain { step, .. } => {
                let step = *step;
                cx.io(self.drain(step), done)
            }
            TrainerReq::Reduce { step, members, .. } => {
                let (step, members) = (*step, *members);
                cx.io(self.reduce(step, members), done)
            }
            TrainerReq::Update { step, .. } => {
                let step = *step;
                cx.io(self.update(step), done)
            }
            // Nothing to compute: in one process every prefix group is the
            // gradient board, and satellites pull at their next warm-up.
            TrainerReq::BuildGroups {
                prefixes, reply_to, ..
            } => {
                let groups = prefixes.len() as u32;
                cx.send(*reply_to, TrainerEvent::GroupsBuilt { epoch, groups });
                return self.next(cx);
            }
            TrainerReq::Broadcast { step, reply_to, .. } if !self.shared.weights.broadcasts() => {
                cx.send(*reply_to, TrainerEvent::Broadcasted { epoch, step: *step });
                return self.next(cx);
            }
            TrainerReq::Broadcast { members, .. } => {
                let weights = self.shared.weights.clone();
                let members = *members;
                let job = Work::new("trainer.broadcast", move || {
                    weights.broadcast(members).map(|_| Finished::Broadcasted)
                });
                cx.io(job, done)
            }
            TrainerReq::Checkpoint { step, .. } => {
                let step = *step;
                cx.io(self.write_checkpoint(step), done)
            }
            TrainerReq::Restore { .. } if self.fresh => cx.io(self.load_checkpoint(), done),
            // This process kept its state (its node was cut off, not
            // restarted): only the gradients accumulated go.
            TrainerReq::Restore { .. } => {
                let trainer = self.trainer.clone();
                let job = Work::new("trainer.restore", move || {
                    let mut t = lock(&trainer);
                    t.zero_grads().map_err(|e| e.to_string())?;
                    Ok(Finished::Restored {
                        version: t.version(),
                        kept: true,
                    })
                });
                cx.io(job, done)
            }
        }
        self.began = cx.now();
        self.arrived = self.jobs.arrived();
        self.jobs.begin(req);
    }

    /// Weights are fixed during a step and step s trains version s, so a
    /// warm-up loads exactly that version (the newest this process heard
    /// of may be older: a restarted process missed the announcements).
    fn warmup(&self, step: Step) -> Work<Finished> {
        let trainer = self.trainer.clone();
        let weights = self.shared.weights.clone();
        Work::new("trainer.warmup", move || {
            let mut t = lock(&trainer);
            let found = weights
                .get(step)
                .map(|b| (step, b))
                .or_else(|| weights.latest());
            let Some((version, bytes)) = found else {
                return Ok(Finished::Warm { loaded: None });
            };
            if version == t.version() {
                return Ok(Finished::Warm { loaded: None });
            }
            t.load_params_from_bytes(&bytes)
                .map_err(|e| format!("loading v{version}: {e}"))?;
            Ok(Finished::Warm {
                loaded: Some(version),
            })
        })
    }

    fn fwd_bwd(&self, rows: gyre_runtime::BlobId) -> Work<Finished> {
        let trainer = self.trainer.clone();
        let blobs = self.shared.blobs.clone();
        let cfg = self.objective;
        Work::new("trainer.fwd_bwd", move || {
            // Read once, whatever it holds: a payload that does not decode
            // will not decode later either.
            // The packer releases the rows once the step is trained.
            let payload = get_decoded::<MicroStepRows>(blobs.as_ref(), rows);
            let payload = payload.map_err(|e| format!("micro-step rows: {e}"))?;
            let elsewhere = stats_input(&payload);
            let (rows, step) = to_trainer_input(payload);
            let mut t = lock(&trainer);
            let report = accumulate_exact(&mut t, &rows, &step, &elsewhere, cfg)
                .map_err(|e| e.to_string())?;
            Ok(Finished::Computed {
                version: t.version(),
                loss: report.loss,
                targets: report.targets as u64,
                tokens: report.tokens,
                clipped_executions: report.clipped_executions as u64,
                ratio_capped: report.ratio_capped as u64,
            })
        })
    }

    fn drain(&self, step: Step) -> Work<Finished> {
        let trainer = self.trainer.clone();
        let grads = self.shared.grads.clone();
        let cell = self.cell;
        Work::new("trainer.drain", move || {
            let mut t = lock(&trainer);
            let g = t.export_grads().map_err(|e| e.to_string())?;
            t.zero_grads().map_err(|e| e.to_string())?;
            let micro_steps = g.micro_steps;
            grads.deposit(step, cell, g);
            Ok(Finished::Drained { micro_steps })
        })
    }

    fn reduce(&self, step: Step, members: u32) -> Work<Finished> {
        let grads = self.shared.grads.clone();
        let slot = self.reduced.clone();
        let trainer = self.trainer.clone();
        Work::new("trainer.reduce", move || {
            let (sum, missing) = grads.reduce(step, members.max(1))?;
            // A batch whose executions all failed to produce rows has no
            // micro-steps, so nobody drained: its gradient is zero, and the
            // step still makes its one update (the version advances as the
            // core counts it).
            let sum = match sum {
                Some(sum) => sum,
                None => lock(&trainer).export_grads().map_err(|e| e.to_string())?,
            };
            let grad_norm = sum.norm();
            *lock(&slot) = Some(sum);
            Ok(Finished::Reduced { grad_norm, missing })
        })
    }

    fn update(&self, step: Step) -> Work<Finished> {
        let trainer = self.trainer.clone();
        let slot = self.reduced.clone();
        let weights = self.shared.weights.clone();
        let recent = self.recent.clone();
        Work::new("trainer.update", move || {
            let reduced = lock(&slot)
                .take()
                .ok_or_else(|| format!("update of step {step} without reduced gradients"))?;
            let mut t = lock(&trainer);
            let report = t.apply(&reduced).map_err(|e| e.to_string())?;
            let params = t.params().map_err(|e| e.to_string())?;
            weights.publish(params.version, Arc::from(params.encode()));
            let summary = UpdateSummary::new(step, &report);
            // Under the trainer's lock: the core's last word reads the
            // version and its summaries together.
            recent.push(summary);
            Ok(Finished::Updated(summary))
        })
    }

    fn write_checkpoint(&self, step: Step) -> Work<Finished> {
        let trainer = self.trainer.clone();
        let path = self.checkpoint.clone();
        Work::new("trainer.checkpoint", move || {
            let path = path.ok_or("no checkpoint path configured ([checkpoint] dir)")?;
            let c = lock(&trainer).checkpoint(step).map_err(|e| e.to_string())?;
            let bytes = c.save(&path).map_err(|e| e.to_string())?;
            Ok(Finished::Checkpointed { bytes })
        })
    }

    /// A new core process's restore: the last durable checkpoint, or the
    /// initial parameters (version 0) if none was written. The restored
    /// parameters are published again, and every process forgets the
    /// versions after them: the updates after the checkpoint are made
    /// again, and their version numbers will name other parameters.
    fn load_checkpoint(&self) -> Work<Finished> {
        let trainer = self.trainer.clone();
        let path = self.checkpoint.clone();
        let weights = self.shared.weights.clone();
        Work::new("trainer.restore", move || {
            let path = path.ok_or("no checkpoint path configured ([checkpoint] dir)")?;
            let checkpoint = if path.exists() {
                let c =
                    CoreCheckpoint::load(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                tracing::info!(path = %path.display(), version = c.version, step = c.step, "core checkpoint loaded");
                Some(c)
            } else {
                tracing::warn!(path = %path.display(), "no core checkpoint yet: training again from the initial parameters");
                None
            };
            let mut t = lock(&trainer);
            let params = with_training_memory(&mut t, |t| {
                if let Some(c) = &checkpoint {
                    t.restore(c)?;
                }
                t.zero_grads()?;
                t.params()
            })?;
            weights.roll_back(params.version);
            weights.publish(params.version, Arc::from(params.encode()));
            Ok(Finished::Restored {
                version: t.version(),
                kept: false,
            })
        })
    }

    /// Answers the request that just finished, whatever its outcome (but a
    /// failed reduction, see below): the trainer protocol has no failure
    /// replies, and a step must complete (a failed micro-step trains
    /// nothing; it is counted and logged).
    fn finish(
        &mut self,
        req: TrainerReq,
        result: Result<Finished, IoError>,
        cx: &mut Cx<'_, Self>,
    ) {
        if let Some(j) = &self.journal {
            let (step, tokens) = match &req {
                TrainerReq::FwdBwd { mstep, tokens, .. } => (Some(mstep.step), Some(*tokens)),
                TrainerReq::Warmup { step, .. }
                | TrainerReq::Drain { step, .. }
                | TrainerReq::Reduce { step, .. }
                | TrainerReq::Update { step, .. } => (Some(*step), None),
                _ => (None, None),
            };
            let kind = format!("trainer.{}", op_name(&req));
            j.op(Op {
                step,
                tokens,
                ..op_line(Some(self.cell), &kind, self.arrived, self.began, cx.now())
            });
        }
        let ok = match result {
            Ok(f) => Some(f),
            Err(e) => {
                self.stats.errors += 1;
                tracing::error!(cell = self.cell, op = op_name(&req), error = %e, "trainer operation failed");
                None
            }
        };
        // A restore that failed (an unreadable checkpoint, logged above)
        // leaves the process new: asked again, it loads again.
        if ok.is_some() || !matches!(req, TrainerReq::Restore { .. }) {
            self.fresh = false;
        }
        let epoch = req.epoch();
        match req {
            TrainerReq::Warmup { step, reply_to, .. } => {
                self.stats.warmups += 1;
                if let Some(Finished::Warm { loaded: Some(_) }) = ok {
                    self.stats.syncs += 1;
                }
                cx.send(reply_to, TrainerEvent::Warm { epoch, step });
            }
            TrainerReq::FwdBwd {
                mstep, reply_to, ..
            } => {
                self.computed(mstep, ok);
                cx.send(reply_to, TrainerEvent::Computed { epoch, mstep });
            }
            TrainerReq::Drain { step, reply_to, .. } => {
                self.stats.drains += 1;
                cx.send(reply_to, TrainerEvent::Drained { epoch, step });
            }
            TrainerReq::Reduce { step, reply_to, .. } => {
                // A failed reduction is not answered: across processes it
                // fails when a member is lost, and the core, told of the
                // loss, collects the step again and asks anew. Answering
                // would let an update run on no gradients.
                if let Some(Finished::Reduced { grad_norm, missing }) = ok {
                    if !missing.is_empty() {
                        tracing::debug!(step, ?missing, "members that computed nothing");
                    }
                    self.stats.idle_members += missing.len() as u64;
                    cx.send(
                        reply_to,
                        TrainerEvent::Reduced {
                            epoch,
                            step,
                            grad_norm,
                        },
                    );
                }
            }
            TrainerReq::Update { step, reply_to, .. } => {
                if let Some(Finished::Updated(u)) = ok {
                    tracing::info!(
                        step,
                        version = u.version,
                        loss = u.loss,
                        grad_norm = u.grad_norm,
                        "update"
                    );
                    self.stats.updates.push(u);
                    lock(&self.shared.updates).push(u);
                    if let Some(observer) = self.observer {
                        cx.send(observer, u);
                    }
                }
                cx.send(reply_to, TrainerEvent::Updated { epoch, step });
            }
            TrainerReq::Broadcast { step, reply_to, .. } => {
                cx.send(reply_to, TrainerEvent::Broadcasted { epoch, step });
            }
            TrainerReq::Checkpoint {
                step,
                version,
                reply_to,
                ..
            } => {
                let durable = match ok {
                    Some(Finished::Checkpointed { bytes }) => {
                        self.stats.checkpoints += 1;
                        self.stats.checkpoint_bytes += bytes;
                        tracing::info!(step, version, bytes, "checkpoint durable");
                        true
                    }
                    _ => false,
                };
                cx.send(
                    reply_to,
                    TrainerEvent::Checkpointed {
                        epoch,
                        version,
                        durable,
                    },
                );
            }
            TrainerReq::Restore { reply_to, .. } => {
                if let Some(Finished::Restored { version, kept }) = ok {
                    tracing::info!(
                        cell = self.cell,
                        epoch,
                        version,
                        kept,
                        "core trainer restored"
                    );
                    let event = TrainerEvent::Restored {
                        epoch,
                        version,
                        kept,
                    };
                    cx.send(reply_to, event);
                }
            }
            TrainerReq::BuildGroups { .. } => {}
        }
    }

    fn computed(&mut self, mstep: MicroStepId, ok: Option<Finished>) {
        match ok {
            Some(Finished::Computed {
                version,
                targets,
                tokens,
                clipped_executions,
                ratio_capped,
                ..
            }) => {
                self.stats.micro_steps += 1;
                self.stats.targets += targets;
                self.stats.tokens += tokens;
                let v = self.stats.by_version.entry(version).or_default();
                v.micro_steps += 1;
                v.targets += targets;
                v.clipped_executions += clipped_executions;
                v.ratio_capped += ratio_capped;
            }
            _ => {
                self.stats.failed_micro_steps += 1;
                tracing::warn!(cell = self.cell, ?mstep, "micro-step trains nothing");
            }
        }
    }
}

/// Runs `f` with the trainer's training memory resident: a new process
/// starts in rollout, its training memory parked on the host, so if `f`
/// fails for that, the memory comes back for it and is parked again.
fn with_training_memory<T>(
    t: &mut Trainer,
    f: impl Fn(&mut Trainer) -> Result<T, gyre_gpu::trainer::TrainerError>,
) -> Result<T, String> {
    match f(t) {
        Ok(v) => Ok(v),
        Err(_) => {
            t.restore_memory().map_err(|e| e.to_string())?;
            let out = f(t).map_err(|e| e.to_string());
            t.release_memory().map_err(|e| e.to_string())?;
            out
        }
    }
}

fn op_name(r: &TrainerReq) -> &'static str {
    match r {
        TrainerReq::Warmup { .. } => "warmup",
        TrainerReq::FwdBwd { .. } => "fwd_bwd",
        TrainerReq::Drain { .. } => "drain",
        TrainerReq::BuildGroups { .. } => "build_groups",
        TrainerReq::Reduce { .. } => "reduce",
        TrainerReq::Update { .. } => "update",
        TrainerReq::Broadcast { .. } => "broadcast",
        TrainerReq::Checkpoint { .. } => "checkpoint",
        TrainerReq::Restore { .. } => "restore",
    }
}

/// The chunks elsewhere of executions split over micro-steps, as a
/// forward-only micro-step over the same rows.
pub fn stats_input(p: &MicroStepRows) -> MicroStep {
    micro_step(&p.stats_chunks)
}

/// The packer's chunks as the trainer's micro-step.
pub fn micro_step(chunks: &[gyre_actors::trajectory::packing::RowChunk]) -> MicroStep {
    MicroStep {
        chunks: chunks
            .iter()
            .map(|c| RowChunk {
                row: c.row,
                start: c.start,
                end: c.end,
            })
            .collect(),
    }
}

/// One micro-step's forward and backward under SPEC 3.7 with the exact
/// s_i: an execution split over micro-steps gets its other chunks' share
/// of the sequence-ratio sums from a forward-only pass over `elsewhere`
/// (weights are fixed during a step), so its clip mask is the unsplit one.
pub fn accumulate_exact(
    t: &mut Trainer,
    rows: &[TrainRow],
    step: &MicroStep,
    elsewhere: &MicroStep,
    cfg: ObjectiveConfig,
) -> Result<MicroReport, gyre_gpu::trainer::TrainerError> {
    let stats = if elsewhere.chunks.is_empty() {
        None
    } else {
        let mut s = t.sequence_stats(rows, step)?;
        s.merge(&t.sequence_stats(rows, elsewhere)?)?;
        Some(s)
    };
    t.accumulate(rows, step, &Loss::Policy(cfg), stats.as_ref())
}

/// The packer's rows in the trainer's own (field-for-field) types.
pub fn to_trainer_input(p: MicroStepRows) -> (Vec<TrainRow>, MicroStep) {
    let rows = p
        .rows
        .into_iter()
        .map(|r| TrainRow {
            execution: r.execution,
            input_ids: r.input_ids,
            target: r.target,
            behaviour_logprobs: r.behaviour_logprobs,
            coefficients: r.coefficients,
            advantage: r.advantage,
        })
        .collect();
    (rows, micro_step(&p.chunks))
}

impl Actor for TrainerWorker {
    type Msg = TrainerWorkerMsg;
    type Timer = ();
    gyre_runtime::accepts!(TrainerReq);

    fn on_msg(&mut self, _from: ActorId, msg: TrainerWorkerMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            TrainerWorkerMsg::Req(r) if r.epoch() < self.epoch => self.stats.stale += 1,
            TrainerWorkerMsg::Req(r) => {
                self.epoch = r.epoch();
                self.jobs.push(r, cx.now());
            }
            TrainerWorkerMsg::Done(result) => match self.jobs.finish() {
                Some(req) => self.finish(req, result, cx),
                None => {
                    self.stats.errors += 1;
                    tracing::error!(cell = self.cell, "completion without a running operation");
                }
            },
        }
        self.next(cx);
    }
}

/// A fresh trainer for `cell` (the core's has the optimizer).
pub fn trainer_handle(
    shared: &Shared,
    params: &gyre_gpu::model::ParamBuffer,
    core: Option<gyre_gpu::trainer::OptimConfig>,
) -> Result<TrainerHandle, gyre_gpu::trainer::TrainerError> {
    let t = match core {
        Some(optim) => Trainer::core(&shared.model, params, optim)?,
        None => Trainer::new(&shared.model, params)?,
    };
    Ok(Arc::new(Mutex::new(t)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gyre_actors::sched::cell::CellMsg;
    use gyre_actors::sched::core::CoreMsg;
    use gyre_actors::sched::ids::MicroStepId;
    use gyre_actors::trajectory::packing::{RowChunk as PackedChunk, TokenRow};
    use gyre_gpu::model::vocab::{self, Role};
    use gyre_gpu::model::{ModelConfig, ParamBuffer};
    use gyre_gpu::trainer::OptimConfig;
    use gyre_runtime::sim::{Sim, SimConfig};
    use gyre_runtime::{BlobId, BlobStore, MemBlobs, NodeId, put_encoded};

    use super::*;

    fn rows() -> MicroStepRows {
        let prompt = vocab::chat(&[(Role::User, "say a")]);
        let p = prompt.len();
        let mut input_ids = prompt;
        input_ids.extend([u32::from(b'a'), u32::from(b'b')]);
        let n = input_ids.len();
        let target: Vec<bool> = (0..n).map(|u| u >= p).collect();
        let lp = -(264f32).ln();
        MicroStepRows {
            rows: vec![TokenRow {
                execution: 0,
                leaf: serde_json::from_str("1").unwrap(),
                behaviour_logprobs: target.iter().map(|t| if *t { lp } else { 0.0 }).collect(),
                coefficients: target.iter().map(|t| if *t { 0.5 } else { 0.0 }).collect(),
                target,
                input_ids,
                advantage: 1.0,
            }],
            chunks: vec![PackedChunk {
                row: 0,
                start: 0,
                end: n as u32,
            }],
            stats_chunks: Vec::new(),
        }
    }

    /// Two rows of one execution, longer together than the budget: the
    /// packer puts them in two micro-steps. Behaviour log-probs make the
    /// first row alone look off-policy upwards (s > 1.005: clipped for a
    /// positive advantage) and the second downwards, balanced so that over
    /// the whole execution s_i = 1 (kept).
    #[test]
    fn a_split_execution_gets_the_clip_mask_and_loss_of_the_unsplit_one() {
        use gyre_actors::trajectory::packing::{pack_by_execution, stats_chunks, whole_rows};
        let cfg = ModelConfig::tiny();
        let params = ParamBuffer::init(&cfg, 5).unwrap();
        let mut a = rows().rows.remove(0);
        let mut b = a.clone();
        b.input_ids.extend(vocab::chat(&[(Role::User, "and b")]));
        b.input_ids.push(u32::from(b'c'));
        let nb = b.input_ids.len();
        b.target = (0..nb)
            .map(|u| u + 1 == nb || a.target.get(u) == Some(&true))
            .collect();
        b.coefficients = b
            .target
            .iter()
            .map(|t| if *t { 0.25 } else { 0.0 })
            .collect();
        b.behaviour_logprobs = vec![0.0; nb];
        a.coefficients = a
            .target
            .iter()
            .map(|t| if *t { 0.25 } else { 0.0 })
            .collect();
        let group = vec![a, b];
        let whole = MicroStepRows {
            chunks: whole_rows(&group),
            rows: group.clone(),
            stats_chunks: Vec::new(),
        };
        // On-policy log-probs, then shifted: +d on row 0, −d·n0/n1 on row 1.
        let mut t = Trainer::new(&cfg, &params).unwrap();
        let (tr, ts) = to_trainer_input(whole.clone());
        let on = t.token_logprobs(&tr, &ts).unwrap();
        let n0 = group[0].targets();
        let n1 = group[1].targets();
        let d = 0.05f32;
        let mut group = group;
        let mut lp = on.into_iter();
        for (r, row) in group.iter_mut().enumerate() {
            let shift = if r == 0 {
                d
            } else {
                -d * n0 as f32 / n1 as f32
            };
            for u in 0..row.len() {
                if row.target[u] {
                    row.behaviour_logprobs[u] = lp.next().unwrap() - shift;
                }
            }
        }
        let whole = MicroStepRows {
            rows: group.clone(),
            ..whole
        };
        let budget = group[1].len() as u32;
        let steps = pack_by_execution(&group, budget).unwrap();
        assert_eq!(steps.len(), 2, "the execution does not fit: split");
        let elsewhere = stats_chunks(&group, &steps);
        let ocfg = ObjectiveConfig::default();
        let run = |payloads: Vec<MicroStepRows>, exact: bool| {
            let mut t = Trainer::new(&cfg, &params).unwrap();
            let (mut loss, mut clipped) = (0.0, 0);
            for p in payloads {
                let other = if exact {
                    stats_input(&p)
                } else {
                    MicroStep { chunks: Vec::new() }
                };
                let (rows, step) = to_trainer_input(p);
                let r = accumulate_exact(&mut t, &rows, &step, &other, ocfg).unwrap();
                loss += r.loss;
                clipped += r.clipped_executions;
            }
            (loss, clipped, t.export_grads().unwrap().data)
        };
        let (l_whole, c_whole, g_whole) = run(vec![whole], true);
        let split: Vec<MicroStepRows> = steps
            .iter()
            .zip(&elsewhere)
            .map(|(s, e)| MicroStepRows::extract(&group, &s.chunks, e).unwrap())
            .collect();
        assert!(split.iter().all(|p| !p.stats_chunks.is_empty()));
        let (l_split, c_split, g_split) = run(split.clone(), true);
        assert_eq!(
            (c_whole, c_split),
            (0, 0),
            "kept, as over the whole execution"
        );
        assert!((l_whole - l_split).abs() < 1e-6, "{l_whole} vs {l_split}");
        assert!(
            g_whole
                .iter()
                .zip(&g_split)
                .all(|(x, y)| (x - y).abs() < 1e-6)
        );
        // Per micro-step alone, the first row's s would clip it.
        let (_, c_naive, _) = run(split, false);
        assert_eq!(c_naive, 1);
    }

    #[test]
    fn bad_rows_train_nothing_and_the_step_still_completes() {
        let cfg = ModelConfig::tiny();
        let blobs = MemBlobs::shared();
        let shared = Shared::new(cfg.clone(), blobs.clone());
        let params = ParamBuffer::init(&cfg, 3).unwrap();
        shared.weights.publish(0, Arc::from(params.encode()));
        let optim = OptimConfig {
            lr: 1e-2,
            ..OptimConfig::default()
        };
        let th = trainer_handle(&shared, &params, Some(optim)).unwrap();
        let mut sim = Sim::new(SimConfig::new(1));
        let tw = sim.spawn(
            NodeId(1),
            TrainerWorker::new(0, th.clone(), shared.clone(), ObjectiveConfig::default()),
        );
        let cell_probe = sim.probe::<TrainerEvent>(NodeId(2));
        let core_probe = sim.probe::<TrainerEvent>(NodeId(2));
        let (cell, core) = (cell_probe.into(), core_probe.into());
        // On-policy behaviour log-probs, so the sequence clip keeps the
        // execution (an arbitrary behaviour policy may clip it to zero).
        let mut payload = rows();
        let (train_rows, step) = to_trainer_input(payload.clone());
        let lp = th
            .lock()
            .unwrap()
            .token_logprobs(&train_rows, &step)
            .unwrap();
        let mut lp = lp.into_iter();
        let row = &mut payload.rows[0];
        for (b, t) in row.behaviour_logprobs.iter_mut().zip(&row.target) {
            if *t {
                *b = lp.next().unwrap();
            }
        }
        let garbage = blobs.put(vec![7; 5]);
        let good = put_encoded(blobs.as_ref(), &payload).unwrap();
        let mstep = |seq| MicroStepId { step: 0, seq };
        let reqs = [
            TrainerReq::Warmup {
                epoch: 0,
                step: 0,
                reply_to: cell,
            },
            TrainerReq::FwdBwd {
                epoch: 0,
                mstep: mstep(0),
                tokens: 8,
                rows: garbage,
                reply_to: cell,
            },
            TrainerReq::FwdBwd {
                epoch: 0,
                mstep: mstep(1),
                tokens: 8,
                rows: BlobId(999),
                reply_to: cell,
            },
            TrainerReq::FwdBwd {
                epoch: 0,
                mstep: mstep(2),
                tokens: 8,
                rows: good,
                reply_to: cell,
            },
            TrainerReq::Drain {
                epoch: 0,
                step: 0,
                reply_to: cell,
            },
            TrainerReq::Reduce {
                epoch: 0,
                step: 0,
                members: 1,
                group: None,
                reply_to: core,
            },
            TrainerReq::Update {
                epoch: 0,
                step: 0,
                reply_to: core,
            },
        ];
        for r in reqs {
            sim.inject(cell_probe.id(), tw, r);
        }
        sim.run().unwrap();
        let to_cell: Vec<_> = sim
            .take_probe(cell_probe)
            .into_iter()
            .map(|r| CellMsg::from(r.msg))
            .collect();
        let computed: Vec<_> = to_cell
            .iter()
            .filter_map(|m| match m {
                CellMsg::Trainer(TrainerEvent::Computed { mstep, .. }) => Some(mstep.seq),
                _ => None,
            })
            .collect();
        assert_eq!(
            computed,
            vec![0, 1, 2],
            "every micro-step is answered, in order"
        );
        assert!(matches!(
            to_cell.last(),
            Some(CellMsg::Trainer(TrainerEvent::Drained { step: 0, .. }))
        ));
        let to_core: Vec<_> = sim
            .take_probe(core_probe)
            .into_iter()
            .map(|r| CoreMsg::from(r.msg))
            .collect();
        assert!(
            matches!(
                &to_core[..],
                [
                    CoreMsg::Trainer(TrainerEvent::Reduced {
                        step: 0, grad_norm, ..
                    }),
                    CoreMsg::Trainer(TrainerEvent::Updated { step: 0, .. }),
                ] if *grad_norm > 0.0
            ),
            "{to_core:?}"
        );
        let worker = sim.actor(tw).unwrap();
        let st = worker.stats();
        assert_eq!(
            (st.micro_steps, st.failed_micro_steps, st.errors),
            (1, 2, 2)
        );
        assert_eq!(st.updates.len(), 1);
        assert_eq!(
            shared.weights.latest().map(|(v, _)| v),
            Some(1),
            "v1 published"
        );
        assert_eq!(th.lock().unwrap().version(), 1);
        assert_eq!(
            blobs.live(),
            2,
            "the trainer releases no rows (the packer does, once the step is trained)"
        );
        // After a request of the core's next restore epoch, one of the
        // epoch before (a late copy) is dropped: its gradient would land in
        // the redone step.
        sim.inject(
            cell_probe.id(),
            tw,
            TrainerReq::Warmup {
                epoch: 1,
                step: 1,
                reply_to: cell,
            },
        );
        sim.inject(
            cell_probe.id(),
            tw,
            TrainerReq::FwdBwd {
                epoch: 0,
                mstep: MicroStepId { step: 1, seq: 0 },
                tokens: 8,
                rows: good,
                reply_to: cell,
            },
        );
        sim.run().unwrap();
        let late: Vec<_> = sim
            .take_probe(cell_probe)
            .into_iter()
            .map(|r| CellMsg::from(r.msg))
            .collect();
        assert!(
            matches!(
                late[..],
                [CellMsg::Trainer(TrainerEvent::Warm { epoch: 1, step: 1 })]
            ),
            "{late:?}"
        );
        let st = sim.actor(tw).unwrap().stats();
        assert_eq!((st.micro_steps, st.stale), (1, 1));
    }
}
