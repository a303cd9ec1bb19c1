//! The embedded trainer: the live counterpart of the trainer protocol, as a
//! plain struct that an actor adapter drives.
//!
//! Every training cell runs forward/backward over the micro-steps it claims
//! and accumulates gradients in its `gradients` region; it exports them as
//! a flat [`GradBuffer`]. The core (a trainer built with an optimizer)
//! takes the reduced buffer, normalises and clips it, applies one Adam(W)
//! step and exports the new parameters for broadcast and publication.
//! Weights stay fixed while gradients accumulate, which is what makes a
//! satellite's snapshot consistent and the sequence-ratio sums additive.

pub mod checkpoint;
pub mod data;
pub mod grads;
pub mod objective;
pub mod optim;

pub use checkpoint::{CheckpointError, CoreCheckpoint};
pub use data::{MicroStep, RowChunk, Target, TrainRow};
pub use grads::GradBuffer;
pub use objective::{Loss, ObjectiveConfig, SeqStats};
pub use optim::{GradScale, OptimConfig, UpdateReport};

use crate::error::ModelError;
use crate::memory::{DeviceMemory, HostBackend, Keep, MemoryError, MemoryReport, Role, Tag};
use crate::model::backprop::{Batch, TrainPass};
use crate::model::{ModelConfig, ParamBuffer, ParamLayout};

#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error("bad training input: {0}")]
    BadInput(String),
    #[error(
        "{0} micro-steps are accumulated: export or zero the gradients before changing weights"
    )]
    Accumulating(u64),
    #[error("this trainer has no optimizer: only the core applies updates")]
    NotCore,
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl From<candle_core::Error> for TrainerError {
    fn from(e: candle_core::Error) -> Self {
        TrainerError::Model(ModelError::Tensor(e))
    }
}

/// What one micro-step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MicroReport {
    pub loss: f64,
    pub targets: usize,
    pub tokens: u64,
    pub ratio_capped: usize,
    pub loss_capped: usize,
    pub clipped_executions: usize,
}

/// A micro-step's targets and the forward pass that computed their
/// log-probs (`None` without targets).
type Forwarded = (Vec<Target>, Option<TrainPass>);

struct Accumulated {
    micro_steps: u64,
    targets: u64,
    loss: f64,
}

pub struct Trainer {
    cfg: ModelConfig,
    layout: ParamLayout,
    memory: DeviceMemory<HostBackend>,
    version: u64,
    /// The current parameters, copied out of the device-memory region
    /// once per version: a backward pass reads them while it writes the
    /// gradient region.
    weights: Option<Vec<f32>>,
    optim: Option<(OptimConfig, u64)>,
    acc: Accumulated,
}

/// A summary: the state worth logging, not the tensors.
impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("version", &self.version)
            .field("core", &self.optim.is_some())
            .field("accumulated", &self.acc.micro_steps)
            .finish_non_exhaustive()
    }
}

impl Trainer {
    /// A training cell holding `params`.
    pub fn new(cfg: &ModelConfig, params: &ParamBuffer) -> Result<Self, TrainerError> {
        let layout = ParamLayout::new(cfg)?;
        params.check(&layout)?;
        let mut memory = DeviceMemory::new(HostBackend);
        memory.allocate(Tag::TrainParams, layout.total)?;
        memory.write(Tag::TrainParams, 0, &params.data)?;
        memory.allocate(Tag::Gradients, layout.total)?;
        Ok(Trainer {
            cfg: cfg.clone(),
            layout,
            memory,
            version: params.version,
            weights: None,
            optim: None,
            acc: Accumulated {
                micro_steps: 0,
                targets: 0,
                loss: 0.0,
            },
        })
    }

    /// The core: a trainer that also owns the optimizer state.
    pub fn core(
        cfg: &ModelConfig,
        params: &ParamBuffer,
        optim: OptimConfig,
    ) -> Result<Self, TrainerError> {
        let mut t = Trainer::new(cfg, params)?;
        t.memory.allocate(Tag::OptimizerState, 2 * t.layout.total)?;
        t.optim = Some((optim, 0));
        Ok(t)
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The current parameters, for broadcast to satellites and publication
    /// to rollout engines.
    pub fn params(&mut self) -> Result<ParamBuffer, TrainerError> {
        Ok(ParamBuffer {
            version: self.version,
            fingerprint: self.layout.fingerprint,
            data: self.memory.read_all(Tag::TrainParams)?,
        })
    }

    /// A satellite's pull (or a broadcast): adopt the core's parameters.
    pub fn load_params(&mut self, params: &ParamBuffer) -> Result<(), TrainerError> {
        params.check(&self.layout)?;
        params.check_finite()?;
        if self.acc.micro_steps > 0 {
            return Err(TrainerError::Accumulating(self.acc.micro_steps));
        }
        self.memory.write(Tag::TrainParams, 0, &params.data)?;
        self.version = params.version;
        self.weights = None;
        Ok(())
    }

    pub fn load_params_from_bytes(&mut self, bytes: &[u8]) -> Result<(), TrainerError> {
        self.load_params(&ParamBuffer::decode(bytes)?)
    }

    fn take_weights(&mut self) -> Result<Vec<f32>, TrainerError> {
        match self.weights.take() {
            Some(w) => Ok(w),
            None => Ok(self.memory.read_all(Tag::TrainParams)?),
        }
    }

    /// Log-probs of the micro-step's targets under the current weights,
    /// with the targets.
    fn target_logprobs(
        &mut self,
        rows: &[TrainRow],
        step: &MicroStep,
    ) -> Result<Forwarded, TrainerError> {
        let w = self.take_weights()?;
        let out = self.forward(&w, rows, step);
        self.weights = Some(w);
        out
    }

    /// The forward pass over a micro-step's chunks as right-padded rows,
    /// keeping what its backward needs.
    fn forward(
        &self,
        w: &[f32],
        rows: &[TrainRow],
        step: &MicroStep,
    ) -> Result<Forwarded, TrainerError> {
        let targets = data::targets(rows, step, self.cfg.vocab, self.cfg.context)?;
        if targets.is_empty() {
            return Ok((targets, None));
        }
        let n = step.chunks.len();
        let t = step
            .chunks
            .iter()
            .map(|c| c.end as usize)
            .max()
            .unwrap_or(0);
        let mut ids = vec![0u32; n * t];
        for (i, c) in step.chunks.iter().enumerate() {
            let row = &rows[c.row as usize];
            ids[i * t..i * t + c.end as usize].copy_from_slice(&row.input_ids[..c.end as usize]);
        }
        // The hidden row that predicts token u sits at position u − 1.
        let at: Vec<usize> = targets
            .iter()
            .map(|x| x.chunk * t + x.position - 1)
            .collect();
        let tokens: Vec<u32> = targets.iter().map(|x| x.token).collect();
        let batch = Batch {
            ids: &ids,
            n,
            t,
            at: &at,
            tokens: &tokens,
        };
        let pass = TrainPass::forward(&self.cfg, &self.layout, w, &batch)?;
        Ok((targets, Some(pass)))
    }

    /// log π_θ(y_u | c_u) of every target by teacher forcing, in the
    /// packer's flattening order (TITO consistency checks and monitoring).
    pub fn token_logprobs(
        &mut self,
        rows: &[TrainRow],
        step: &MicroStep,
    ) -> Result<Vec<f32>, TrainerError> {
        let (_, pass) = self.target_logprobs(rows, step)?;
        Ok(pass.map(|p| p.logprobs().to_vec()).unwrap_or_default())
    }

    /// Forward only: this micro-step's share of the sequence-ratio sums.
    pub fn sequence_stats(
        &mut self,
        rows: &[TrainRow],
        step: &MicroStep,
    ) -> Result<SeqStats, TrainerError> {
        let (targets, pass) = self.target_logprobs(rows, step)?;
        let lp = pass.map(|p| p.logprobs().to_vec()).unwrap_or_default();
        SeqStats::from_targets(&targets, &lp)
    }

    /// Forward and backward over one micro-step; gradients add to the
    /// accumulated ones. For the policy loss, `stats` are the batch-wide
    /// sequence-ratio sums (see [`objective`]); `None` uses this
    /// micro-step's own targets.
    pub fn accumulate(
        &mut self,
        rows: &[TrainRow],
        step: &MicroStep,
        loss: &Loss,
        stats: Option<&SeqStats>,
    ) -> Result<MicroReport, TrainerError> {
        let w = self.take_weights()?;
        let out = crate::cpu::on_pool(|| self.accumulate_with(&w, rows, step, loss, stats));
        self.weights = Some(w);
        let report = out?;
        self.acc.micro_steps += 1;
        self.acc.targets += report.targets as u64;
        self.acc.loss += report.loss;
        Ok(report)
    }

    /// [`accumulate`](Self::accumulate)'s forward and backward under the
    /// parameters `w`.
    fn accumulate_with(
        &mut self,
        w: &[f32],
        rows: &[TrainRow],
        step: &MicroStep,
        loss: &Loss,
        stats: Option<&SeqStats>,
    ) -> Result<MicroReport, TrainerError> {
        let (targets, pass) = self.forward(w, rows, step)?;
        let mut report = MicroReport {
            tokens: step.tokens(),
            targets: targets.len(),
            ..Default::default()
        };
        let Some(pass) = pass else {
            return Ok(report);
        };
        let lp = pass.logprobs();
        let weights = match loss {
            Loss::Policy(cfg) => {
                let local;
                let stats = match stats {
                    Some(s) => s,
                    None => {
                        local = SeqStats::from_targets(&targets, lp)?;
                        &local
                    }
                };
                objective::policy_weights(&targets, lp, stats, cfg)?
            }
            Loss::Supervised => objective::supervised_weights(&targets, lp),
        };
        pass.backward(
            &self.layout,
            w,
            &weights.grad,
            self.memory.host_mut(Tag::Gradients)?,
        )?;
        report.loss = weights.loss;
        report.ratio_capped = weights.ratio_capped;
        report.loss_capped = weights.loss_capped;
        report.clipped_executions = weights.clipped_executions;
        Ok(report)
    }

    /// Both passes over a whole batch held by this trainer: sequence
    /// statistics first, then forward/backward with the exact s_i.
    pub fn accumulate_batch(
        &mut self,
        rows: &[TrainRow],
        steps: &[MicroStep],
        cfg: &ObjectiveConfig,
    ) -> Result<Vec<MicroReport>, TrainerError> {
        let mut stats = SeqStats::default();
        for s in steps {
            stats.merge(&self.sequence_stats(rows, s)?)?;
        }
        steps
            .iter()
            .map(|s| self.accumulate(rows, s, &Loss::Policy(*cfg), Some(&stats)))
            .collect()
    }

    /// The accumulated gradients, for reduction across cells.
    pub fn export_grads(&mut self) -> Result<GradBuffer, TrainerError> {
        Ok(GradBuffer {
            version: self.version,
            fingerprint: self.layout.fingerprint,
            cells: 1,
            micro_steps: self.acc.micro_steps,
            targets: self.acc.targets,
            loss: self.acc.loss,
            data: self.memory.read_all(Tag::Gradients)?,
        })
    }

    pub fn zero_grads(&mut self) -> Result<(), TrainerError> {
        self.memory.host_mut(Tag::Gradients)?.fill(0.0);
        self.acc = Accumulated {
            micro_steps: 0,
            targets: 0,
            loss: 0.0,
        };
        Ok(())
    }

    /// The core's update from the reduced gradients of the training
    /// prefix: normalise, clip, one Adam(W) step, version + 1. Clears this
    /// trainer's own accumulation (it is part of `reduced`).
    pub fn apply(&mut self, reduced: &GradBuffer) -> Result<UpdateReport, TrainerError> {
        let (cfg, t) = self.optim.ok_or(TrainerError::NotCore)?;
        if reduced.fingerprint != self.layout.fingerprint || reduced.data.len() != self.layout.total
        {
            return Err(TrainerError::BadInput(
                "gradients of a different model".into(),
            ));
        }
        if reduced.version != self.version {
            return Err(TrainerError::BadInput(format!(
                "gradients taken at v{}, parameters are v{}",
                reduced.version, self.version
            )));
        }
        if let Some(i) = reduced.data.iter().position(|x| !x.is_finite()) {
            return Err(TrainerError::BadInput(format!(
                "gradient #{i} is not finite"
            )));
        }
        let divide = match cfg.scale {
            GradScale::Sum => 1.0,
            GradScale::PerCell => reduced.cells as f64,
            GradScale::PerMicroStep => reduced.micro_steps as f64,
        };
        let mut g = reduced.data.clone();
        let (grad_norm, clipped) = optim::normalise_and_clip(&mut g, divide, cfg.max_grad_norm);
        let mut params = self.memory.read_all(Tag::TrainParams)?;
        let t = t + 1;
        optim::adamw_step(
            &mut params,
            &g,
            self.memory.host_mut(Tag::OptimizerState)?,
            t,
            &cfg,
        );
        self.memory.write(Tag::TrainParams, 0, &params)?;
        self.optim = Some((cfg, t));
        self.version += 1;
        self.weights = None;
        self.zero_grads()?;
        Ok(UpdateReport {
            version: self.version,
            grad_norm,
            clipped,
            loss: if divide > 0.0 {
                reduced.loss / divide
            } else {
                reduced.loss
            },
            micro_steps: reduced.micro_steps,
            targets: reduced.targets,
        })
    }

    /// The core's state after the update of `step`, for a durable
    /// checkpoint (see [`checkpoint`]).
    pub fn checkpoint(&mut self, step: u64) -> Result<CoreCheckpoint, TrainerError> {
        let (_, adam_t) = self.optim.ok_or(TrainerError::NotCore)?;
        Ok(CoreCheckpoint {
            fingerprint: self.layout.fingerprint,
            step,
            version: self.version,
            adam_t,
            params: self.memory.read_all(Tag::TrainParams)?,
            moments: self.memory.read_all(Tag::OptimizerState)?,
        })
    }

    /// A new core continues from `c`: its parameters, moments, Adam step
    /// and version; whatever was accumulated is dropped.
    pub fn restore(&mut self, c: &CoreCheckpoint) -> Result<(), TrainerError> {
        let (cfg, _) = self.optim.ok_or(TrainerError::NotCore)?;
        c.check_model(self.layout.fingerprint)?;
        let n = self.layout.total;
        if c.params.len() != n || c.moments.len() != 2 * n {
            return Err(TrainerError::BadInput(format!(
                "checkpoint holds {} parameters and {} moments, the model has {n} and {}",
                c.params.len(),
                c.moments.len(),
                2 * n
            )));
        }
        self.memory.write(Tag::TrainParams, 0, &c.params)?;
        self.memory.write(Tag::OptimizerState, 0, &c.moments)?;
        self.optim = Some((cfg, c.adam_t));
        self.version = c.version;
        self.weights = None;
        self.zero_grads()
    }

    /// Releases the training role's memory (parameters and optimizer state
    /// backed up to the host, gradients dropped) when the cell returns to
    /// rollout; returns the bytes freed.
    pub fn release_memory(&mut self) -> Result<u64, TrainerError> {
        if self.acc.micro_steps > 0 {
            return Err(TrainerError::Accumulating(self.acc.micro_steps));
        }
        self.weights = None;
        Ok(self.memory.release_role(Role::Training, |t| {
            if t == Tag::Gradients {
                Keep::Discard
            } else {
                Keep::Backup
            }
        })?)
    }

    pub fn restore_memory(&mut self) -> Result<(), TrainerError> {
        Ok(self.memory.restore_role(Role::Training)?)
    }

    pub fn memory_report(&self) -> MemoryReport {
        self.memory.report()
    }
}
