//! The trainer protocol: micro-step compute for a training cell, and the
//! collective and optimizer work of the core (SPEC 2.6).

use serde::{Deserialize, Serialize};

use crate::sched::ids::{MicroStepId, Step, Version};
use gyre_runtime::{BlobId, Recipient};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TrainerReq {
    /// Fill the one-forward-one-backward pipeline: once per batch.
    Warmup {
        step: Step,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Forward and backward over one micro-step; gradients accumulate.
    FwdBwd {
        mstep: MicroStepId,
        tokens: u64,
        /// The micro-step's [`super::payload::MicroStepRows`]; released by
        /// the trainer once computed.
        rows: BlobId,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Drain the pipeline: once per batch, after the stream closed.
    Drain {
        step: Step,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Build the communication groups of these prefix sizes, up front.
    BuildGroups {
        prefixes: Vec<u32>,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Gather and normalise the gradients of the prefix {0..members−1}.
    Reduce {
        step: Step,
        members: u32,
        group: Option<u32>,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Clip and apply one optimizer update.
    Update {
        step: Step,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Send the new parameters to the satellites of the prefix.
    Broadcast {
        step: Step,
        members: u32,
        group: Option<u32>,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Write the core's state after the update of `step` (weights, optimizer
    /// state, step, `version`) as a durable checkpoint.
    Checkpoint {
        step: Step,
        version: Version,
        reply_to: Recipient<TrainerEvent>,
    },
    /// From the core, after its trainer's node went down: drop any
    /// accumulated gradient and answers given before, and be at the latest
    /// consistent state: the one kept if this process survived (a
    /// partition), else the last durable checkpoint (the initial
    /// parameters if there is none). `epoch` numbers the core's restores.
    Restore {
        epoch: u64,
        reply_to: Recipient<TrainerEvent>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TrainerEvent {
    Warm {
        step: Step,
    },
    Computed {
        mstep: MicroStepId,
    },
    Drained {
        step: Step,
    },
    GroupsBuilt {
        groups: u32,
    },
    Reduced {
        step: Step,
        grad_norm: f64,
    },
    Updated {
        step: Step,
    },
    Broadcasted {
        step: Step,
    },
    /// The checkpoint of `version` is on stable storage (`durable`), or its
    /// write failed and the last durable checkpoint is still the one before.
    Checkpointed {
        version: Version,
        durable: bool,
    },
    /// The trainer holds `version` (weights and optimizer state) and no
    /// gradient: the state it `kept`, or the checkpoint it loaded.
    Restored {
        epoch: u64,
        version: Version,
        kept: bool,
    },
}
