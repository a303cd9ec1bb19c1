//! The core optimizer owner: runs each training step over the current prefix.
//!
//! Per step (SPEC 2.6): expose the authoritative weights through the
//! transfer engine; admit joining satellites in index order while the join
//! window is open (mid-batch with streaming, at the batch start without);
//! wait until the stream is sealed and every member has drained its share of
//! the micro-steps; close the join window; reduce the gradients over the
//! prefix's communication group (one of K − 1 built up front), clip, and
//! make exactly one optimizer update. After a non-final step of the burst it
//! broadcasts the new parameters to the satellites and starts the next step;
//! after the last one it publishes to the rollout engines and waits for the
//! scheduler's burst-end decision (stay, or leave and return to rollout).
//!
//! With `checkpoint_every = Some(S)`, every update that makes the version a
//! multiple of S is followed by a durable checkpoint of the core's state
//! (`TrainerReq::Checkpoint`, written by the trainer backend); the step
//! goes on once it is acknowledged, so a checkpoint the core has counted is
//! on stable storage. `None` (the default) writes none and keeps the
//! schedule as it was.
//!
//! With `recover` on as well (node watching and checkpoints), every
//! publication is also durable, and the core restores from the last
//! checkpoint when its trainer's node is lost (see [`restore`]).
//!
//! It also keeps the record the invariants and the staleness report read:
//! one entry per update of the model's history, with the groups it trained
//! and their versions.

mod restore;
pub use restore::RestoreRecord;

use std::collections::{BTreeMap, BTreeSet};

use gyre_runtime::{Actor, ActorId, Addr, Cx, Nanos, Recipient};

use crate::sched::ids::{GroupId, MicroStepId, Step, Version};
use crate::sched::maths::prefix::comm_group_for;
use crate::sched::msg::cell::CellMsg;
pub use crate::sched::msg::core::{CoreMsg, SealedBatch, StepRecord, TrainedGroup};
use crate::sched::msg::packer::PackerMsg;
use crate::sched::proto::Port;
use crate::sched::proto::trainer::{TrainerEvent, TrainerReq};
use crate::sched::proto::transfer::{Segment, TransferEvent, TransferReq};
use crate::sched::retry::{Outbox, ReqKey, Resend, RetryTick};
use crate::sched::scheduler::{SchedMsg, Scheduler};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreConfig {
    pub cells: u32,
    pub mu: u32,
    pub target_steps: u64,
    pub streaming: bool,
    /// Satellites stay across publications (Async's fixed partition).
    pub keep_satellites: bool,
    /// S: a durable checkpoint after every S-th update (`None`: never).
    pub checkpoint_every: Option<u64>,
    /// Restore from the last checkpoint when the trainer's node is lost
    /// (the scheduler watches it); publications are checkpointed too.
    pub recover: bool,
    /// The reduction reads every member's gradients (a ring over their
    /// processes), so a member lost while the core reduces fails it: the
    /// lost member's share goes back to the queue, the survivors claim it,
    /// and the step reduces again over them. Off, a reduction under way
    /// completes with what the members had drained (the simulator's).
    pub reduce_needs_members: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct CoreLinks {
    pub sched: Addr<Scheduler>,
    pub trainer: Port<TrainerReq>,
    pub transfer: Port<TransferReq>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorePhase {
    Idle,
    Collecting,
    Reducing,
    Updating,
    Broadcasting,
    Publishing,
    /// Published; waiting for the scheduler's burst-end decision.
    AwaitDecision,
    /// Updated; waiting for the checkpoint of the new version to be durable.
    Checkpointing,
    /// The trainer's node was lost: waiting for cell 0 to drop its batch,
    /// then for the trainer to restore.
    Restoring,
}

#[derive(Debug, Clone)]
struct Sealed {
    groups: Vec<TrainedGroup>,
    micro_steps: Vec<MicroStepId>,
}

/// What the core did, for invariants and reports.
#[derive(Debug, Clone, Default)]
pub struct CoreLog {
    /// The step of each optimizer update, in order.
    pub updates: Vec<Step>,
    pub records: Vec<StepRecord>,
    /// Every group trained so far.
    pub trained: BTreeSet<GroupId>,
    /// Protocol breaches seen (must stay empty).
    pub violations: Vec<String>,
    /// Joins refused because the burst had closed.
    pub late_joins: u64,
    /// Membership of every batch, which must be a prefix.
    pub memberships: Vec<Vec<u32>>,
    /// Durable checkpoints acknowledged, as (step, version), in order.
    pub checkpoints: Vec<(Step, Version)>,
    /// Checkpoint writes that failed (the trainer reported no durable file).
    pub failed_checkpoints: u64,
    /// Members cut from a batch by a satellite's loss: (step, cell).
    pub cut: Vec<(Step, u32)>,
    /// Restores after the trainer's node was lost, in order.
    pub restores: Vec<RestoreRecord>,
    /// Records of updates lost with the trainer (rolled back): their groups
    /// were trained again; work redone, not part of the model's history.
    pub redone: Vec<StepRecord>,
    /// Reductions begun again after a member was lost while reducing
    /// (`CoreConfig::reduce_needs_members`).
    pub redone_reductions: u64,
    /// Trainer answers of an earlier restore epoch, ignored.
    pub stale_answers: u64,
}

#[derive(Debug)]
pub struct Core {
    cfg: CoreConfig,
    links: CoreLinks,
    groups_built: bool,
    phase: CorePhase,
    step: Step,
    version: Version,
    burst: u64,
    /// The final step of the burst is past its update: no more joins.
    burst_closed: bool,
    members: Vec<(u32, Recipient<CellMsg>)>,
    pending: BTreeMap<u32, Recipient<CellMsg>>,
    exposed: Option<Segment>,
    window_open: bool,
    sealed: BTreeMap<Step, Sealed>,
    done: BTreeMap<u32, Vec<MicroStepId>>,
    packer: Option<Recipient<PackerMsg>>,
    /// Members cut from the batch being collected (their late report of
    /// it is ignored).
    cut: BTreeSet<u32>,
    /// What survivors had computed of the batch before a cut sent them
    /// back to the queue for the cut members' share.
    earlier: BTreeMap<u32, Vec<MicroStepId>>,
    /// Trainer and transfer requests awaiting their answers.
    outbox: Outbox,
    /// A restore under way.
    restoring: Option<restore::Restoring>,
    log: CoreLog,
}

impl Core {
    pub fn new(cfg: CoreConfig, links: CoreLinks) -> Self {
        Self {
            cfg,
            links,
            groups_built: false,
            phase: CorePhase::Idle,
            step: 0,
            version: 0,
            burst: 0,
            burst_closed: false,
            members: Vec::new(),
            pending: BTreeMap::new(),
            exposed: None,
            window_open: false,
            sealed: BTreeMap::new(),
            done: BTreeMap::new(),
            packer: None,
            cut: BTreeSet::new(),
            earlier: BTreeMap::new(),
            outbox: Outbox::new(None),
            restoring: None,
            log: CoreLog::default(),
        }
    }

    /// Starts from policy version `version` (a head resumed from the
    /// checkpoint of that version): its first step is `version`, since
    /// step s trains version s.
    pub fn starting_at(mut self, version: Version) -> Self {
        self.step = version;
        self.version = version;
        self
    }

    /// Resends unanswered backend requests every `after`.
    pub fn with_retry(mut self, after: Option<Nanos>) -> Self {
        self.outbox = Outbox::new(after);
        self
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    pub fn phase(&self) -> CorePhase {
        self.phase
    }

    pub fn log(&self) -> &CoreLog {
        &self.log
    }

    /// Updates made so far: the policy version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Cells of the current batch, in join order (a prefix).
    pub fn members(&self) -> Vec<u32> {
        self.members.iter().map(|(c, _)| *c).collect()
    }

    fn violation(&mut self, text: String) {
        tracing::error!(%text, "core protocol violation");
        self.log.violations.push(text);
    }

    /// Starts `self.step`: expose weights, restart the current members.
    fn begin(&mut self, cx: &mut Cx<'_, Self>) {
        self.phase = CorePhase::Collecting;
        self.done.clear();
        self.cut.clear();
        self.earlier.clear();
        self.exposed = None;
        self.window_open = false;
        let step = self.step;
        for (_, addr) in &self.members {
            cx.send(
                *addr,
                CellMsg::Batch {
                    epoch: self.epoch(),
                    step,
                    snapshot: None,
                },
            );
        }
        let reply_to = cx.recipient();
        self.outbox.send(
            cx,
            Resend::Transfer(
                self.links.transfer,
                TransferReq::Expose {
                    version: self.version,
                    reply_to,
                },
            ),
        );
    }

    /// Admits pending joiners that extend the prefix, in index order.
    fn admit(&mut self, cx: &mut Cx<'_, Self>) {
        let Some(segment) = self.exposed else {
            return;
        };
        if !self.window_open {
            return;
        }
        loop {
            let cell = self.members.len() as u32;
            // A cell cut from this step (it rejoined since) joins the next.
            if self.log.cut.contains(&(self.step, cell)) {
                break;
            }
            let Some(addr) = self.pending.remove(&cell) else {
                break;
            };
            self.members.push((cell, addr));
            cx.send(
                addr,
                CellMsg::Batch {
                    epoch: self.epoch(),
                    step: self.step,
                    snapshot: Some(segment),
                },
            );
        }
    }

    fn try_complete(&mut self, cx: &mut Cx<'_, Self>) {
        if self.phase != CorePhase::Collecting || !self.groups_built {
            return;
        }
        let Some(sealed) = self.sealed.get(&self.step) else {
            return;
        };
        if self.members.iter().any(|(c, _)| !self.done.contains_key(c)) {
            return;
        }
        let mut consumed: Vec<MicroStepId> = self.done.values().flatten().copied().collect();
        consumed.sort();
        let unique = consumed.windows(2).all(|w| w[0] != w[1]);
        let mut expected = sealed.micro_steps.clone();
        expected.sort();
        if unique && !self.cut.is_empty() && consumed.len() < expected.len() {
            // A cut member's share went back to the queue after the
            // survivors finished: they claim again.
            let step = self.step;
            for (c, addr) in &self.members {
                if let Some(done) = self.done.remove(c) {
                    self.earlier.entry(*c).or_default().extend(done);
                    cx.send(
                        *addr,
                        CellMsg::Batch {
                            epoch: self.epoch(),
                            step,
                            snapshot: None,
                        },
                    );
                }
            }
            return;
        }
        // Close the join window before the update.
        self.window_open = false;
        if !unique || consumed != expected {
            let text = format!(
                "step {}: consumed {:?} but sealed {:?}",
                self.step, consumed, expected
            );
            self.violation(text);
        }
        let members = self.members.len() as u32;
        self.log.memberships.push(self.members());
        self.phase = CorePhase::Reducing;
        let reply_to = cx.recipient();
        self.outbox.send(
            cx,
            Resend::Trainer(
                self.links.trainer,
                TrainerReq::Reduce {
                    epoch: self.epoch(),
                    step: self.step,
                    members,
                    group: comm_group_for(members),
                    reply_to,
                },
            ),
        );
    }

    fn updated(&mut self, cx: &mut Cx<'_, Self>) {
        let step = self.step;
        self.version += 1;
        self.log.updates.push(step);
        if let Some(p) = self.packer {
            cx.send(p, PackerMsg::Trained { step });
        }
        // Recovering, a batch stays until its update is durable: a restore
        // to an earlier version trains it again.
        let sealed = if self.cfg.recover {
            self.sealed.get(&step).cloned()
        } else {
            self.sealed.remove(&step)
        };
        self.resumed(cx.now());
        let (groups, micro_steps) = sealed
            .map(|s| (s.groups, s.micro_steps.len() as u32))
            .unwrap_or_default();
        for g in &groups {
            if !self.log.trained.insert(g.group) {
                let text = format!("group {:?} trained twice (step {step})", g.group);
                self.violation(text);
            }
        }
        self.log.records.push(StepRecord {
            step,
            members: self.members.len() as u32,
            groups,
            micro_steps,
        });
        let due = self
            .cfg
            .checkpoint_every
            .is_some_and(|every| every > 0 && self.version % every == 0)
            || (self.cfg.recover && self.final_of_burst(step));
        if due {
            self.phase = CorePhase::Checkpointing;
            let reply_to = cx.recipient();
            self.outbox.send(
                cx,
                Resend::Trainer(
                    self.links.trainer,
                    TrainerReq::Checkpoint {
                        epoch: self.epoch(),
                        step,
                        version: self.version,
                        reply_to,
                    },
                ),
            );
            return;
        }
        self.proceed(cx);
    }

    /// After the update (and its checkpoint, if one was due): broadcast to
    /// the satellites, start the next step, or publish.
    fn proceed(&mut self, cx: &mut Cx<'_, Self>) {
        let step = self.step;
        let last = step + 1 >= self.cfg.target_steps;
        let final_of_burst = self.final_of_burst(step);
        if final_of_burst {
            self.burst_closed = true;
            self.pending.clear();
        }
        let broadcast =
            self.members.len() > 1 && (!final_of_burst || (self.cfg.keep_satellites && !last));
        if broadcast {
            self.phase = CorePhase::Broadcasting;
            let members = self.members.len() as u32;
            let reply_to = cx.recipient();
            self.outbox.send(
                cx,
                Resend::Trainer(
                    self.links.trainer,
                    TrainerReq::Broadcast {
                        epoch: self.epoch(),
                        step,
                        members,
                        group: comm_group_for(members),
                        reply_to,
                    },
                ),
            );
        } else {
            self.after_update(cx);
        }
    }

    /// Has the trainer build the K − 1 prefix groups {0..1}, …, {0..K−1}
    /// (once per trainer process).
    fn build_groups(&mut self, cx: &mut Cx<'_, Self>) {
        self.groups_built = false;
        let prefixes: Vec<u32> = (2..=self.cfg.cells).collect();
        let reply_to = cx.recipient();
        let epoch = self.epoch();
        self.outbox.send(
            cx,
            Resend::Trainer(
                self.links.trainer,
                TrainerReq::BuildGroups {
                    epoch,
                    prefixes,
                    reply_to,
                },
            ),
        );
    }

    /// The epoch of the core's restores its trainer requests are made in
    /// (0 before the first restore; see `crate::sched::proto::trainer`).
    fn epoch(&self) -> u64 {
        self.log.restores.len() as u64
    }

    /// `step` ends its burst: a publication follows its update.
    fn final_of_burst(&self, step: Step) -> bool {
        (step + 1) % u64::from(self.cfg.mu) == 0 || step + 1 >= self.cfg.target_steps
    }

    fn after_update(&mut self, cx: &mut Cx<'_, Self>) {
        let step = self.step;
        if self.burst_closed {
            self.phase = CorePhase::Publishing;
            let reply_to = cx.recipient();
            self.outbox.send(
                cx,
                Resend::Transfer(
                    self.links.transfer,
                    TransferReq::Publish {
                        version: self.version,
                        engines: self.cfg.cells,
                        reply_to,
                    },
                ),
            );
        } else {
            cx.send(self.links.sched, SchedMsg::StepDone { step });
            self.step += 1;
            self.begin(cx);
        }
    }
}

impl Core {
    /// Satellite `cell` is gone: the prefix shrinks to the members below
    /// it (those above could no longer reduce over a prefix group), and,
    /// while the batch is still being collected, every cut member's grants
    /// return to the queue for the survivors to compute. Once the batch is
    /// reducing, its gradients are already drained and only later steps
    /// lose the members. The core's own loss (cell 0) is a restore.
    fn member_lost(
        &mut self,
        cell: u32,
        queue: Recipient<crate::sched::msg::queue::QueueMsg>,
        cx: &mut Cx<'_, Self>,
    ) {
        if cell == 0 {
            if self.cfg.recover {
                self.core_lost(queue, cx);
            }
            return;
        }
        self.pending.retain(|c, _| *c < cell);
        let Some(at) = self.members.iter().position(|(c, _)| *c >= cell) else {
            return;
        };
        let cut: Vec<u32> = self.members.drain(at..).map(|(c, _)| c).collect();
        self.log.cut.extend(cut.iter().map(|c| (self.step, *c)));
        if self.phase == CorePhase::Reducing && self.cfg.reduce_needs_members {
            // The reduction under way fails without the cut members (the
            // trainer does not answer a failed one): collect again.
            let step = self.step;
            self.outbox.forget(&ReqKey::Reduce(step));
            self.log.memberships.pop();
            self.log.redone_reductions += 1;
            self.phase = CorePhase::Collecting;
        }
        if self.phase == CorePhase::Collecting {
            for c in &cut {
                self.done.remove(c);
                self.cut.insert(*c);
            }
            let step = self.step;
            cx.send(
                queue,
                crate::sched::msg::queue::QueueMsg::Requeue { step, cells: cut },
            );
            self.try_complete(cx);
        }
    }
}

impl Actor for Core {
    type Msg = CoreMsg;
    type Timer = RetryTick;
    gyre_runtime::accepts!(TrainerEvent, TransferEvent);

    fn on_timer(&mut self, _: RetryTick, cx: &mut Cx<'_, Self>) {
        self.outbox.tick(cx);
    }

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        self.build_groups(cx);
    }

    fn on_msg(&mut self, from: ActorId, msg: CoreMsg, cx: &mut Cx<'_, Self>) {
        let msg = match msg {
            m @ (CoreMsg::Activate { .. }
            | CoreMsg::Continue { .. }
            | CoreMsg::Leave
            | CoreMsg::Join { .. }) => match self.defer(m) {
                Ok(()) => return,
                Err(m) => m,
            },
            // A satellite's loss after an activation that waits for the
            // restore applies to that activation's members: it waits too,
            // in order (the core's own loss does not).
            m @ CoreMsg::MemberLost { cell, .. } if cell != 0 => match self.defer(m) {
                Ok(()) => return,
                Err(m) => m,
            },
            m => m,
        };
        self.on_msg_now(from, msg, cx);
    }
}

impl Core {
    fn on_msg_now(&mut self, _from: ActorId, msg: CoreMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            // An answer from before a restore belongs to the state rolled
            // back (see `crate::sched::proto::trainer`).
            CoreMsg::Trainer(e) if e.epoch() != self.epoch() => {
                self.log.stale_answers += 1;
            }
            // A backend's answer counts once (see `crate::sched::retry`).
            CoreMsg::Trainer(e) if !self.outbox.ack(&e) => {}
            CoreMsg::Transfer(e) if !self.outbox.ack(&e) => {}
            CoreMsg::Activate {
                step,
                burst,
                members,
            } => {
                if self.phase != CorePhase::Idle {
                    self.violation(format!("activate while {:?}", self.phase));
                    return;
                }
                if step != self.version {
                    self.violation(format!("activate at step {step}, version {}", self.version));
                }
                self.step = self.version;
                self.burst = burst;
                self.burst_closed = false;
                self.members.clear();
                self.pending.clear();
                for (cell, addr) in members {
                    if cell == 0 {
                        self.members.push((0, addr));
                    } else {
                        self.pending.insert(cell, addr);
                    }
                }
                if self.members.is_empty() {
                    self.violation("activate without cell 0".to_owned());
                    return;
                }
                self.begin(cx);
            }
            CoreMsg::Join { cell, addr, burst } => {
                let open = matches!(
                    self.phase,
                    CorePhase::Collecting
                        | CorePhase::Reducing
                        | CorePhase::Updating
                        | CorePhase::Broadcasting
                );
                if burst != self.burst || self.burst_closed || !open {
                    self.log.late_joins += 1;
                    return;
                }
                self.pending.insert(cell, addr);
                if self.cfg.streaming {
                    self.admit(cx);
                }
            }
            CoreMsg::Continue { burst } => {
                if self.phase != CorePhase::AwaitDecision {
                    self.violation(format!("continue while {:?}", self.phase));
                    return;
                }
                self.burst = burst;
                self.burst_closed = false;
                self.step = self.version;
                if !self.cfg.keep_satellites {
                    self.members.truncate(1);
                }
                self.begin(cx);
            }
            CoreMsg::Leave => {
                self.phase = CorePhase::Idle;
                self.members.clear();
                self.pending.clear();
                self.burst_closed = false;
                self.step = self.version;
            }
            CoreMsg::BatchSealed {
                step,
                groups,
                micro_steps,
                packer,
            } => {
                self.packer = Some(packer);
                if step < self.version || self.sealed.contains_key(&step) {
                    self.violation(format!("batch {step} sealed twice or late"));
                    return;
                }
                self.sealed.insert(
                    step,
                    Sealed {
                        groups,
                        micro_steps,
                    },
                );
                self.try_complete(cx);
            }
            CoreMsg::MemberLost { cell, queue } => self.member_lost(cell, queue, cx),
            CoreMsg::NodeBack { node } => {
                let sent = self.outbox.resend_to(node, cx);
                tracing::info!(%node, sent, "the core trainer's node back; requests resent");
            }
            CoreMsg::Aborted { step } => self.aborted(step, cx),
            // Cell 0's report of a batch it finished just before the abort.
            CoreMsg::BatchDone { .. } if self.phase == CorePhase::Restoring => {}
            // A cut member's late report of the batch it was cut from.
            CoreMsg::BatchDone { step, cell, .. } if self.log.cut.contains(&(step, cell)) => {}
            CoreMsg::BatchDone {
                step,
                cell,
                consumed,
            } => {
                let member = self.members.iter().any(|(c, _)| *c == cell);
                if step != self.step || self.phase != CorePhase::Collecting || !member {
                    self.violation(format!(
                        "batch-done from cell {cell} for step {step} while at {} {:?}",
                        self.step, self.phase
                    ));
                    return;
                }
                let mut consumed = consumed;
                consumed.extend(self.earlier.remove(&cell).unwrap_or_default());
                if self.done.insert(cell, consumed).is_some() {
                    self.violation(format!("cell {cell} finished step {step} twice"));
                }
                self.try_complete(cx);
            }
            CoreMsg::Trainer(TrainerEvent::GroupsBuilt { .. }) => {
                self.groups_built = true;
                self.try_complete(cx);
            }
            CoreMsg::Trainer(TrainerEvent::Reduced { step, .. }) => {
                if self.phase == CorePhase::Reducing && step == self.step {
                    self.phase = CorePhase::Updating;
                    let reply_to = cx.recipient();
                    let epoch = self.epoch();
                    self.outbox.send(
                        cx,
                        Resend::Trainer(
                            self.links.trainer,
                            TrainerReq::Update {
                                epoch,
                                step,
                                reply_to,
                            },
                        ),
                    );
                }
            }
            CoreMsg::Trainer(TrainerEvent::Updated { step, .. }) => {
                if self.phase == CorePhase::Updating && step == self.step {
                    self.updated(cx);
                }
            }
            CoreMsg::Trainer(TrainerEvent::Broadcasted { step, .. }) => {
                if self.phase == CorePhase::Broadcasting && step == self.step {
                    self.after_update(cx);
                }
            }
            CoreMsg::Trainer(TrainerEvent::Checkpointed {
                version, durable, ..
            }) => {
                if self.phase == CorePhase::Checkpointing && version == self.version {
                    let step = self.step;
                    if durable {
                        self.log.checkpoints.push((step, version));
                        // Batches of durable updates are never trained again.
                        self.sealed.retain(|s, _| *s >= version);
                        self.durable(version, cx);
                    } else {
                        // Training goes on; a new core would resume from
                        // the checkpoint before this one.
                        tracing::warn!(step, version, "checkpoint not written");
                        self.log.failed_checkpoints += 1;
                    }
                    self.proceed(cx);
                }
            }
            CoreMsg::Trainer(TrainerEvent::Restored {
                epoch,
                version,
                kept,
            }) => self.restored(epoch, version, kept, cx),
            CoreMsg::Trainer(_) => {}
            CoreMsg::Transfer(TransferEvent::Exposed { segment }) => {
                if self.phase == CorePhase::Collecting && segment.version == self.version {
                    self.exposed = Some(segment);
                    self.window_open = true;
                    self.admit(cx);
                }
            }
            CoreMsg::Transfer(TransferEvent::Published { version }) => {
                if self.phase == CorePhase::Publishing && version == self.version {
                    self.phase = CorePhase::AwaitDecision;
                    cx.send(
                        self.links.sched,
                        SchedMsg::Published {
                            step: self.step,
                            version,
                        },
                    );
                }
            }
            CoreMsg::Transfer(TransferEvent::ReadDone { .. }) => {}
        }
    }
}
