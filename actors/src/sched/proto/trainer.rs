//! The trainer protocol: micro-step compute for a training cell, and the
//! collective and optimizer work of the core (SPEC 2.6).
//!
//! Every request and answer carries the `epoch` of the core's restores it
//! belongs to (0 before the first). A restore rolls the model back and
//! trains the lost steps again under the same step and micro-step ids, so
//! without it a copy of a request or an answer from before the restore,
//! delayed by the network past it, would be taken for the redo's: a
//! gradient added to the redone batch, an update the trainer never made
//! taken as made. Trainers ignore requests of an epoch older than the
//! newest they have seen, and the core and the cells act only on answers
//! of their current epoch.

use serde::{Deserialize, Serialize};

use crate::sched::ids::{MicroStepId, Step, Version};
use gyre_runtime::{BlobId, Recipient};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TrainerReq {
    /// Fill the one-forward-one-backward pipeline: once per batch.
    Warmup {
        epoch: u64,
        step: Step,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Forward and backward over one micro-step; gradients accumulate.
    FwdBwd {
        epoch: u64,
        mstep: MicroStepId,
        tokens: u64,
        /// The micro-step's [`super::payload::MicroStepRows`]; released by
        /// the trainer once computed.
        rows: BlobId,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Drain the pipeline: once per batch, after the stream closed.
    Drain {
        epoch: u64,
        step: Step,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Build the communication groups of these prefix sizes, up front.
    BuildGroups {
        epoch: u64,
        prefixes: Vec<u32>,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Gather and normalise the gradients of the prefix {0..members−1}.
    Reduce {
        epoch: u64,
        step: Step,
        members: u32,
        group: Option<u32>,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Clip and apply one optimizer update.
    Update {
        epoch: u64,
        step: Step,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Send the new parameters to the satellites of the prefix.
    Broadcast {
        epoch: u64,
        step: Step,
        members: u32,
        group: Option<u32>,
        reply_to: Recipient<TrainerEvent>,
    },
    /// Write the core's state after the update of `step` (weights, optimizer
    /// state, step, `version`) as a durable checkpoint.
    Checkpoint {
        epoch: u64,
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
        epoch: u64,
        step: Step,
    },
    Computed {
        epoch: u64,
        mstep: MicroStepId,
    },
    Drained {
        epoch: u64,
        step: Step,
    },
    GroupsBuilt {
        epoch: u64,
        groups: u32,
    },
    Reduced {
        epoch: u64,
        step: Step,
        grad_norm: f64,
    },
    Updated {
        epoch: u64,
        step: Step,
    },
    Broadcasted {
        epoch: u64,
        step: Step,
    },
    /// The checkpoint of `version` is on stable storage (`durable`), or its
    /// write failed and the last durable checkpoint is still the one before.
    Checkpointed {
        epoch: u64,
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

impl TrainerReq {
    /// The core's restore epoch the request was made in.
    pub fn epoch(&self) -> u64 {
        self.parts().0
    }

    /// Who the answer goes to.
    pub fn reply_to(&self) -> Recipient<TrainerEvent> {
        self.parts().1
    }

    fn parts(&self) -> (u64, Recipient<TrainerEvent>) {
        match self {
            TrainerReq::Warmup {
                epoch, reply_to, ..
            }
            | TrainerReq::FwdBwd {
                epoch, reply_to, ..
            }
            | TrainerReq::Drain {
                epoch, reply_to, ..
            }
            | TrainerReq::BuildGroups {
                epoch, reply_to, ..
            }
            | TrainerReq::Reduce {
                epoch, reply_to, ..
            }
            | TrainerReq::Update {
                epoch, reply_to, ..
            }
            | TrainerReq::Broadcast {
                epoch, reply_to, ..
            }
            | TrainerReq::Checkpoint {
                epoch, reply_to, ..
            }
            | TrainerReq::Restore { epoch, reply_to } => (*epoch, *reply_to),
        }
    }
}

impl TrainerEvent {
    /// The epoch of the request this answers.
    pub fn epoch(&self) -> u64 {
        match self {
            TrainerEvent::Warm { epoch, .. }
            | TrainerEvent::Computed { epoch, .. }
            | TrainerEvent::Drained { epoch, .. }
            | TrainerEvent::GroupsBuilt { epoch, .. }
            | TrainerEvent::Reduced { epoch, .. }
            | TrainerEvent::Updated { epoch, .. }
            | TrainerEvent::Broadcasted { epoch, .. }
            | TrainerEvent::Checkpointed { epoch, .. }
            | TrainerEvent::Restored { epoch, .. } => *epoch,
        }
    }
}
