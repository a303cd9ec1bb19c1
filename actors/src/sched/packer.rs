//! The stream packer: from ready groups to micro-steps, one batch at a time.
//!
//! When the queue runs short it takes one ready group from the trajectory
//! buffer, oldest policy version first, materialises its admitted rows,
//! reorders and packs them into micro-steps and enqueues them. It selects
//! the batch's B groups incrementally and closes the stream only after all
//! their micro-steps are enqueued (SPEC 2.6). Without streaming it waits
//! until B groups are ready and enqueues the whole batch at once.
//!
//! It fills at most one batch beyond the one in training, so groups are not
//! locked into far-future batches while cells could still join; and it is
//! where the scheduler's supply check reads from: the ready, unclaimed
//! groups (ready in the buffer, or taken and not yet claimed by training),
//! capped at what the batch in training still needs.
//!
//! Rows come from a [`SampleSource`]: token counts in the simulator, or each
//! execution's trajectory tree, built here from the proxy's TITO records, in
//! a real run (see [`crate::sched::samples`]). Large payloads never travel
//! in messages: the trees stay here from the first record to admission, and
//! the queue and the training cells see micro-step descriptors (id, group,
//! token count, rows handle). With a blob store ([`Packer::with_blobs`]) the
//! packer puts each micro-step's [`MicroStepRows`] there and the trainer
//! reads them by the descriptor's handle; the packer releases them once
//! their step is trained (not the trainer once it read them: a satellite
//! lost mid-batch may have read its share, which the survivors then read
//! again). In process the rows also stay readable through
//! [`Packer::payload`] until the batch is trained. Record handles of a taken group go to the source
//! ([`SampleSource::attach`]) before the group is planned.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gyre_runtime::{Actor, ActorId, Addr, BlobId, BlobStore, Cx, Recipient, put_encoded};
use rand::Rng;

use crate::sched::buffer::{Buffer, BufferMsg};
use crate::sched::core::{Core, CoreMsg, SealedBatch, TrainedGroup};
use crate::sched::ids::{ExecId, GroupId, MicroStepId, Step, Version};
use crate::sched::maths::supply::supply;
pub use crate::sched::msg::packer::PackerMsg;
use crate::sched::queue::{MicroQueue, MicroStep, QueueMsg};
use crate::sched::samples::{Counted, GroupCtx, Sample, SampleSource, plan_group};
use crate::sched::scheduler::{SchedMsg, Scheduler};
use crate::trajectory::TitoRecord;
use crate::trajectory::objective::ObjectiveConfig;
use crate::trajectory::packing::{MicroStepRows, RowChunk, TokenRow, stats_chunks};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackerConfig {
    pub batch_groups: u32,
    pub micro_tokens: u64,
    pub short_micro_steps: u32,
    pub streaming: bool,
    /// The core recovers from checkpoints: a trained step's rows are kept
    /// until its update is durable (`PackerMsg::Durable`).
    pub keep_until_durable: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct PackerLinks {
    pub buffer: Addr<Buffer>,
    pub queue: Addr<MicroQueue>,
    pub core: Addr<Core>,
    pub sched: Addr<Scheduler>,
}

#[derive(Debug, Clone, Copy)]
struct Taken {
    step: Step,
    micro_steps: u32,
    unclaimed: u32,
}

impl Taken {
    /// Training has claimed all of it. A group without trainable rows is
    /// only consumed by its step's update, so it never counts as claimed.
    fn claimed(&self) -> bool {
        self.micro_steps > 0 && self.unclaimed == 0
    }
}

/// The token rows behind one micro-step descriptor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Payload<'a> {
    pub group: GroupId,
    /// Every row of the group; `chunks` index them.
    pub rows: &'a [TokenRow],
    pub chunks: &'a [RowChunk],
    /// The chunks elsewhere of executions split over micro-steps
    /// (`MicroStepRows::stats_chunks`).
    pub stats_chunks: &'a [RowChunk],
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackerStats {
    /// Records taken into the sample source.
    pub records: u64,
    /// Records the source refused (bad record, count-only source).
    pub rejected_records: u64,
    /// Records of a group already taken: its rows were frozen without them.
    pub late_records: u64,
    /// Executions (or whole groups) whose rows could not be made.
    pub sample_errors: u64,
    /// Surplus executions of over-sampled groups, dropped untrained.
    pub discarded: u64,
}

#[derive(Debug)]
pub struct Packer {
    cfg: PackerConfig,
    links: PackerLinks,
    /// Ready groups not yet taken, oldest dispatch version first.
    ready: BTreeSet<(Version, GroupId)>,
    /// The batch being filled.
    step: Step,
    /// Steps the core has completed: batch `trained` is the one in training.
    trained: Step,
    selected: Vec<TrainedGroup>,
    taking: Option<GroupId>,
    /// Taken groups of batches not yet trained.
    taken: BTreeMap<GroupId, Taken>,
    msteps: Vec<MicroStepId>,
    last_supply: Option<u64>,
    source: Box<dyn SampleSource>,
    objective: ObjectiveConfig,
    /// Seeds admission; drawn from this actor's random stream at start.
    seed: u64,
    /// Executions already in the batch being filled.
    batch_execs: u32,
    /// Token rows of taken groups whose batch is not trained yet.
    rows: BTreeMap<GroupId, Vec<TokenRow>>,
    /// What each micro-step holds of its group's rows.
    chunks: BTreeMap<MicroStepId, (GroupId, Vec<RowChunk>, Vec<RowChunk>)>,
    /// Where micro-step rows are put for the trainers.
    blobs: Option<Arc<dyn BlobStore>>,
    /// The row handles put for each step, released once it is trained.
    put: BTreeMap<Step, Vec<BlobId>>,
    /// Those of trained steps whose updates are not durable yet (with
    /// `keep_until_durable`).
    undurable: BTreeMap<Step, Vec<BlobId>>,
    /// Told each sealed batch's groups.
    observer: Option<Recipient<SealedBatch>>,
    stats: PackerStats,
}

impl Packer {
    pub fn new(cfg: PackerConfig, links: PackerLinks) -> Self {
        Self {
            cfg,
            links,
            ready: BTreeSet::new(),
            step: 0,
            trained: 0,
            selected: Vec::new(),
            taking: None,
            taken: BTreeMap::new(),
            msteps: Vec::new(),
            last_supply: None,
            source: Box::new(Counted),
            objective: ObjectiveConfig::default(),
            seed: 0,
            batch_execs: 0,
            rows: BTreeMap::new(),
            chunks: BTreeMap::new(),
            blobs: None,
            put: BTreeMap::new(),
            undurable: BTreeMap::new(),
            observer: None,
            stats: PackerStats::default(),
        }
    }

    /// Packs from step `step` on (a run resumed at that version).
    pub fn starting_at(mut self, step: Step) -> Self {
        self.step = step;
        self.trained = step;
        self
    }

    /// Trains from `source` instead of the evaluator's token counts.
    pub fn with_source(mut self, source: Box<dyn SampleSource>) -> Self {
        self.source = source;
        self
    }

    /// Tells `observer` the groups of every batch it seals.
    pub fn with_observer(mut self, observer: Option<Recipient<SealedBatch>>) -> Self {
        self.observer = observer;
        self
    }

    /// Puts each micro-step's token rows in `blobs` and sends the handle.
    pub fn with_blobs(mut self, blobs: Arc<dyn BlobStore>) -> Self {
        self.blobs = Some(blobs);
        self
    }

    pub fn with_objective(mut self, objective: ObjectiveConfig) -> Self {
        self.objective = objective;
        self
    }

    pub fn stats(&self) -> PackerStats {
        self.stats
    }

    pub fn source(&self) -> &dyn SampleSource {
        self.source.as_ref()
    }

    /// The token rows behind a micro-step while its batch is untrained;
    /// `None` for a count-only source, which has no tokens.
    pub fn payload(&self, id: MicroStepId) -> Option<Payload<'_>> {
        let (group, chunks, stats_chunks) = self.chunks.get(&id)?;
        let rows = self.rows.get(group)?;
        Some(Payload {
            group: *group,
            rows,
            chunks,
            stats_chunks,
        })
    }

    /// The batch being filled.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Micro-steps enqueued and not yet claimed, over every batch.
    fn queue_unclaimed(&self) -> u64 {
        self.taken.values().map(|t| u64::from(t.unclaimed)).sum()
    }

    /// Ready, unclaimed groups (ready in the buffer, or taken and not yet
    /// claimed by training) capped at what the batch in training still
    /// needs (B minus its groups already claimed).
    pub fn supply(&self) -> u64 {
        let b = u64::from(self.cfg.batch_groups);
        let unclaimed = self.taken.values().filter(|t| !t.claimed()).count() as u64;
        let ready_unclaimed =
            self.ready.len() as u64 + u64::from(self.taking.is_some()) + unclaimed;
        let claimed_now = self
            .taken
            .values()
            .filter(|t| t.step == self.trained && t.claimed())
            .count() as u64;
        supply(ready_unclaimed, b.saturating_sub(claimed_now))
    }

    fn report(&mut self, cx: &mut Cx<'_, Self>) {
        let value = self.supply();
        if self.last_supply != Some(value) {
            self.last_supply = Some(value);
            cx.send(
                self.links.sched,
                SchedMsg::Supply {
                    step: self.trained,
                    value,
                },
            );
        }
    }

    /// Takes the oldest ready group when the stream runs short, filling at
    /// most one batch beyond the one in training.
    fn maybe_take(&mut self, cx: &mut Cx<'_, Self>) {
        if self.taking.is_some() || self.step > self.trained + 1 {
            return;
        }
        let remaining = u64::from(self.cfg.batch_groups).saturating_sub(self.selected.len() as u64);
        if remaining == 0 {
            return;
        }
        let go = if self.cfg.streaming {
            self.queue_unclaimed() < u64::from(self.cfg.short_micro_steps)
        } else {
            self.ready.len() as u64 >= remaining
        };
        if !go {
            return;
        }
        if let Some((_, group)) = self.ready.pop_first() {
            self.taking = Some(group);
            let reply_to = cx.recipient();
            cx.send(self.links.buffer, BufferMsg::Take { group, reply_to });
        }
    }

    fn take_in(&mut self, group: GroupId, v_d: Version, samples: &[Sample], cx: &mut Cx<'_, Self>) {
        let ctx = GroupCtx {
            first_execution: self.batch_execs,
            batch_executions: u64::from(self.cfg.batch_groups) * samples.len() as u64,
            budget: u32::try_from(self.cfg.micro_tokens)
                .unwrap_or(u32::MAX)
                .max(1),
            seed: self.seed,
            objective: self.objective,
        };
        for s in samples {
            match self.source.attach(s.exec, &s.records) {
                Ok(n) => self.stats.records += n as u64,
                // The execution has no rows now; planning counts that as
                // its sample error if it was to train.
                Err(error) => {
                    self.stats.rejected_records += 1;
                    tracing::warn!(?group, %error, "records of an execution unusable");
                }
            }
        }
        let plan = plan_group(self.source.as_mut(), samples, &ctx);
        self.batch_execs = self
            .batch_execs
            .saturating_add(u32::try_from(samples.len()).unwrap_or(u32::MAX));
        for error in &plan.errors {
            self.stats.sample_errors += 1;
            tracing::warn!(?group, %error, "part of a group trains nothing");
        }
        let step = self.step;
        let keep_rows = !plan.rows.is_empty();
        let mut msteps = Vec::with_capacity(plan.steps.len());
        let mut stats = if keep_rows {
            stats_chunks(&plan.rows, &plan.steps)
        } else {
            Vec::new()
        };
        for (k, packed) in plan.steps.into_iter().enumerate() {
            let elsewhere = stats.get_mut(k).map(std::mem::take).unwrap_or_default();
            let id = MicroStepId {
                step,
                seq: self.msteps.len() as u32,
            };
            self.msteps.push(id);
            let rows = match &self.blobs {
                Some(store) if keep_rows => {
                    put_rows(store.as_ref(), &plan.rows, &packed.chunks, &elsewhere)
                }
                _ => BlobId::NONE,
            };
            if !rows.is_none() {
                self.put.entry(step).or_default().push(rows);
            }
            msteps.push(MicroStep {
                id,
                group,
                tokens: u64::from(packed.tokens),
                rows,
            });
            if keep_rows {
                self.chunks.insert(id, (group, packed.chunks, elsewhere));
            }
        }
        if keep_rows {
            self.rows.insert(group, plan.rows);
        }
        let n = msteps.len() as u32;
        self.taken.insert(
            group,
            Taken {
                step,
                micro_steps: n,
                unclaimed: n,
            },
        );
        self.selected.push(TrainedGroup {
            group,
            v_d,
            tokens: plan.targets,
            micro_steps: n,
        });
        if !msteps.is_empty() {
            let notify = cx.recipient();
            cx.send(
                self.links.queue,
                QueueMsg::Push {
                    step,
                    msteps,
                    notify,
                },
            );
        }
        if self.selected.len() as u64 >= u64::from(self.cfg.batch_groups) {
            self.seal(cx);
        }
    }

    /// Frees the row payloads of these steps.
    fn release(&self, steps: BTreeMap<Step, Vec<BlobId>>) {
        if let Some(store) = &self.blobs {
            for id in steps.into_values().flatten() {
                store.release(id);
            }
        }
    }

    fn record(&mut self, exec: ExecId, group: GroupId, record: &TitoRecord) {
        if self.taken.contains_key(&group) {
            self.stats.late_records += 1;
            tracing::warn!(?exec, ?group, call = %record.call_id, "record after its group was taken");
            return;
        }
        match self.source.record(exec, record) {
            Ok(()) => self.stats.records += 1,
            Err(error) => {
                self.stats.rejected_records += 1;
                tracing::warn!(%error, "record rejected");
            }
        }
    }

    /// Surplus executions never train: attaching hands their record
    /// handles to the source, which releases every handle it is given, and
    /// forgetting drops whatever it built from them.
    fn discard(&mut self, samples: &[Sample]) {
        for s in samples {
            if !s.records.is_empty()
                && let Err(error) = self.source.attach(s.exec, &s.records)
            {
                tracing::debug!(exec = ?s.exec, %error, "surplus records unusable");
            }
            self.source.forget(s.exec);
            self.stats.discarded += 1;
        }
    }

    /// Closes the stream of the batch being filled and starts the next one.
    fn seal(&mut self, cx: &mut Cx<'_, Self>) {
        let step = self.step;
        let total = self.msteps.len() as u32;
        cx.send(self.links.queue, QueueMsg::Close { step, total });
        if let Some(observer) = self.observer {
            let groups = self.selected.iter().map(|g| g.group).collect();
            cx.send(observer, SealedBatch { step, groups });
        }
        let packer = cx.recipient();
        cx.send(
            self.links.core,
            CoreMsg::BatchSealed {
                step,
                groups: std::mem::take(&mut self.selected),
                micro_steps: std::mem::take(&mut self.msteps),
                packer,
            },
        );
        self.step += 1;
        self.batch_execs = 0;
    }
}

/// Stores one micro-step's rows; [`BlobId::NONE`] (logged) if they cannot
/// be, which the trainer treats as a micro-step without a payload.
fn put_rows(
    store: &dyn BlobStore,
    rows: &[TokenRow],
    chunks: &[RowChunk],
    stats_chunks: &[RowChunk],
) -> BlobId {
    let Some(m) = MicroStepRows::extract(rows, chunks, stats_chunks) else {
        tracing::error!("a micro-step chunk points past its group's rows");
        return BlobId::NONE;
    };
    match put_encoded(store, &m) {
        Ok(id) => id,
        Err(error) => {
            tracing::error!(%error, "micro-step rows could not be encoded");
            BlobId::NONE
        }
    }
}

impl Actor for Packer {
    type Msg = PackerMsg;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        self.seed = cx.rng().random();
        let packer = cx.recipient();
        cx.send(self.links.buffer, BufferMsg::Subscribe { packer });
        self.report(cx);
    }

    fn on_msg(&mut self, _from: ActorId, msg: PackerMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            PackerMsg::Ready { group, v_d } => {
                self.ready.insert((v_d, group));
            }
            PackerMsg::Taken {
                group,
                v_d,
                samples,
            } => {
                if self.taking != Some(group) {
                    tracing::warn!(?group, "packer got a group it did not ask for");
                    return;
                }
                self.taking = None;
                self.take_in(group, v_d, &samples, cx);
            }
            PackerMsg::NotReady { group } => {
                if self.taking == Some(group) {
                    self.taking = None;
                }
            }
            PackerMsg::Claimed { group, .. } => {
                if let Some(t) = self.taken.get_mut(&group) {
                    t.unclaimed = t.unclaimed.saturating_sub(1);
                }
            }
            PackerMsg::Trained { step } => {
                self.trained = self.trained.max(step + 1);
                let trained = self.trained;
                let later = self.put.split_off(&trained);
                let done = std::mem::replace(&mut self.put, later);
                if self.cfg.keep_until_durable {
                    self.undurable.extend(done);
                } else {
                    self.release(done);
                }
                self.taken.retain(|_, t| t.step >= trained);
                self.rows.retain(|g, _| self.taken.contains_key(g));
                self.chunks.retain(|id, _| id.step >= trained);
            }
            PackerMsg::Record {
                exec,
                group,
                record,
            } => self.record(exec, group, &record),
            PackerMsg::Discard { samples } => self.discard(&samples),
            PackerMsg::Durable { version } => {
                let later = self.undurable.split_off(&version);
                let durable = std::mem::replace(&mut self.undurable, later);
                self.release(durable);
            }
        }
        self.maybe_take(cx);
        self.report(cx);
    }
}
