//! A cell's device-memory manager over its real engine and trainer: the
//! live counterpart of the simulator's memory model (SPEC 2.5 step 5).
//!
//! Releasing the rollout role frees the engine's weights (backed up to the
//! host) and its KV cache; releasing the training role frees the trainer's
//! parameters and optimizer state (backed up) and its gradients. Each
//! request is one "memory.release" / "memory.restore" I/O job, one at a
//! time in arrival order; whatever the engine or trainer refuses (an engine
//! still holding requests or pins, a trainer mid-accumulation) is answered
//! `Refused` with its reason.

use gyre_actors::sched::proto::memory::{MemRole, MemoryEvent, MemoryReq};
use gyre_gpu::engine::MemTag;
use gyre_runtime::{Actor, ActorId, Cx, IoError, Nanos, Recipient};
use serde::{Deserialize, Serialize};

use crate::embedded::journal::{Journal, op_line};
use crate::embedded::shared::{EngineHandle, TrainerHandle, lock};
use crate::embedded::work::{Serial, Work};

#[derive(Debug, Serialize, Deserialize)]
pub enum MemoryWorkerMsg {
    Req(MemoryReq),
    /// The job in flight finished: bytes freed by a release (0 for a
    /// restore).
    Done(Result<u64, IoError>),
}

impl From<MemoryReq> for MemoryWorkerMsg {
    fn from(r: MemoryReq) -> Self {
        MemoryWorkerMsg::Req(r)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub releases: u64,
    pub restores: u64,
    pub refusals: u64,
    pub rollout_bytes_released: u64,
    pub training_bytes_released: u64,
}

#[derive(Debug, Clone, Copy)]
struct Op {
    restore: bool,
    role: MemRole,
    reply_to: Recipient<MemoryEvent>,
}

impl From<MemoryReq> for Op {
    fn from(r: MemoryReq) -> Self {
        match r {
            MemoryReq::Release { role, reply_to } => Op {
                restore: false,
                role,
                reply_to,
            },
            MemoryReq::Restore { role, reply_to } => Op {
                restore: true,
                role,
                reply_to,
            },
        }
    }
}

#[derive(Debug)]
pub struct MemoryWorker {
    /// `None`: the rollout side lives in a server (an SGLang engine),
    /// whose adapter releases and resumes it on `Unload` and `Load`.
    engine: Option<EngineHandle>,
    trainer: TrainerHandle,
    jobs: Serial<Op>,
    stats: MemoryStats,
    /// `gyre train --record`: the cell, where each operation is written,
    /// and when the running one began.
    journal: Option<(u32, Journal)>,
    began: Nanos,
    /// When the running one arrived.
    arrived: Nanos,
}

impl MemoryWorker {
    pub fn new(engine: EngineHandle, trainer: TrainerHandle) -> Self {
        Self {
            engine: Some(engine),
            trainer,
            jobs: Serial::default(),
            stats: MemoryStats::default(),
            journal: None,
            began: 0,
            arrived: 0,
        }
    }

    /// Writes every release and restore of cell `cell` to `journal`.
    pub fn with_journal(mut self, cell: u32, journal: Option<Journal>) -> Self {
        self.journal = journal.map(|j| (cell, j));
        self
    }

    /// A cell whose rollout memory is its server's: releasing or restoring
    /// the rollout role frees nothing here and succeeds.
    pub fn training_only(trainer: TrainerHandle) -> Self {
        Self {
            engine: None,
            trainer,
            jobs: Serial::default(),
            stats: MemoryStats::default(),
            journal: None,
            began: 0,
            arrived: 0,
        }
    }

    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    fn kick(&mut self, cx: &mut Cx<'_, Self>) {
        let Some(op) = self.jobs.take_next() else {
            return;
        };
        self.jobs.begin(op);
        self.began = cx.now();
        self.arrived = self.jobs.arrived();
        let engine = self.engine.clone();
        let trainer = self.trainer.clone();
        let kind = if op.restore {
            "memory.restore"
        } else {
            "memory.release"
        };
        let job = move || -> Result<u64, String> {
            const ROLLOUT: [MemTag; 2] = [MemTag::Weights, MemTag::KvCache];
            let text = |e: &dyn std::fmt::Display| e.to_string();
            match (op.role, op.restore, engine) {
                (MemRole::Rollout, _, None) => Ok(0),
                (MemRole::Rollout, false, Some(engine)) => {
                    lock(&engine).release_memory(&ROLLOUT).map_err(|e| text(&e))
                }
                (MemRole::Rollout, true, Some(engine)) => lock(&engine)
                    .resume_memory(&ROLLOUT)
                    .map(|()| 0)
                    .map_err(|e| text(&e)),
                (MemRole::Training, false, _) => {
                    lock(&trainer).release_memory().map_err(|e| text(&e))
                }
                (MemRole::Training, true, _) => lock(&trainer)
                    .restore_memory()
                    .map(|()| 0)
                    .map_err(|e| text(&e)),
            }
        };
        cx.io(Work::new(kind, job), MemoryWorkerMsg::Done);
    }
}

impl Actor for MemoryWorker {
    type Msg = MemoryWorkerMsg;
    type Timer = ();
    gyre_runtime::accepts!(MemoryReq);

    fn on_msg(&mut self, _from: ActorId, msg: MemoryWorkerMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            MemoryWorkerMsg::Req(r) => self.jobs.push(r.into(), cx.now()),
            MemoryWorkerMsg::Done(result) => {
                let Some(op) = self.jobs.finish() else {
                    tracing::error!("memory job completion with no job in flight");
                    return;
                };
                let role = op.role;
                if let Some((cell, j)) = &self.journal {
                    let kind = match (op.restore, role) {
                        (false, MemRole::Rollout) => "memory.release_rollout",
                        (false, MemRole::Training) => "memory.release_training",
                        (true, MemRole::Rollout) => "memory.restore_rollout",
                        (true, MemRole::Training) => "memory.restore_training",
                    };
                    let arrived = self.arrived;
                    j.op(op_line(Some(*cell), kind, arrived, self.began, cx.now()));
                }
                let event = match result {
                    Ok(_) if op.restore => {
                        self.stats.restores += 1;
                        MemoryEvent::Restored { role }
                    }
                    Ok(freed) => {
                        self.stats.releases += 1;
                        match role {
                            MemRole::Rollout => self.stats.rollout_bytes_released += freed,
                            MemRole::Training => self.stats.training_bytes_released += freed,
                        }
                        MemoryEvent::Released { role }
                    }
                    Err(e) => {
                        tracing::warn!(?role, restore = op.restore, error = %e, "device memory refused");
                        self.stats.refusals += 1;
                        MemoryEvent::Refused {
                            role,
                            reason: e.to_string(),
                        }
                    }
                };
                cx.send(op.reply_to, event);
            }
        }
        self.kick(cx);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use gyre_gpu::engine::{Engine, EngineConfig, Request, SamplingParams};
    use gyre_gpu::memory::Tag;
    use gyre_gpu::model::{ModelConfig, ParamBuffer};
    use gyre_gpu::trainer::Trainer;
    use gyre_runtime::sim::{Sim, SimConfig};
    use gyre_runtime::{Addr, External, NodeId};

    use super::*;

    const TESTER: ActorId = ActorId::new(9, 1);

    fn rig() -> (
        Sim,
        Addr<MemoryWorker>,
        Addr<External<MemoryEvent>>,
        EngineHandle,
        TrainerHandle,
    ) {
        let m = ModelConfig::tiny();
        let p = ParamBuffer::init(&m, 1).unwrap();
        let engine = Arc::new(Mutex::new(
            Engine::new(EngineConfig::for_model(m.clone(), 2), &p).unwrap(),
        ));
        let trainer = Arc::new(Mutex::new(Trainer::new(&m, &p).unwrap()));
        let mut sim = Sim::new(SimConfig::new(5));
        let mem = sim.spawn(
            NodeId(1),
            MemoryWorker::new(engine.clone(), trainer.clone()),
        );
        let cell = sim.probe::<MemoryEvent>(NodeId(1));
        (sim, mem, cell, engine, trainer)
    }

    fn events(sim: &mut Sim, cell: Addr<External<MemoryEvent>>) -> Vec<MemoryEvent> {
        sim.run().unwrap();
        sim.take_probe(cell).into_iter().map(|r| r.msg).collect()
    }

    fn resident(report: &gyre_gpu::memory::MemoryReport, tag: Tag) -> u64 {
        report.usage(tag).map_or(0, |u| u.resident)
    }

    #[test]
    fn releases_and_restores_show_in_the_memory_reports() {
        let (mut sim, mem, cell, engine, trainer) = rig();
        let before = lock(&engine).memory_report();
        assert!(resident(&before, Tag::KvCache) > 0);
        let release = |role| MemoryReq::Release {
            role,
            reply_to: cell.into(),
        };
        let restore = |role| MemoryReq::Restore {
            role,
            reply_to: cell.into(),
        };
        sim.inject(TESTER, mem, release(MemRole::Rollout));
        sim.inject(TESTER, mem, restore(MemRole::Training));
        let got = events(&mut sim, cell);
        assert!(matches!(
            got[..],
            [
                MemoryEvent::Released {
                    role: MemRole::Rollout
                },
                MemoryEvent::Restored {
                    role: MemRole::Training
                }
            ]
        ));
        let r = lock(&engine).memory_report();
        assert_eq!(resident(&r, Tag::KvCache), 0);
        assert_eq!(resident(&r, Tag::RolloutWeights), 0);
        assert!(!lock(&engine).health().serving);

        sim.inject(TESTER, mem, release(MemRole::Training));
        sim.inject(TESTER, mem, restore(MemRole::Rollout));
        let got = events(&mut sim, cell);
        assert_eq!(got.len(), 2);
        let t = lock(&trainer).memory_report();
        assert_eq!(resident(&t, Tag::TrainParams), 0);
        let r = lock(&engine).memory_report();
        assert_eq!(r.resident, before.resident);
        assert!(lock(&engine).health().serving);

        let w = sim.actor(mem).unwrap().stats();
        assert_eq!((w.releases, w.restores, w.refusals), (2, 2, 0));
        assert_eq!(w.rollout_bytes_released, before.resident);
        assert!(w.training_bytes_released > 0);
    }

    #[test]
    fn a_busy_engine_refuses_to_release() {
        let (mut sim, mem, cell, engine, _) = rig();
        lock(&engine)
            .submit(Request {
                prompt: vec![1, 2],
                params: SamplingParams::default(),
            })
            .unwrap();
        sim.inject(
            TESTER,
            mem,
            MemoryReq::Release {
                role: MemRole::Rollout,
                reply_to: cell.into(),
            },
        );
        let got = events(&mut sim, cell);
        assert!(
            matches!(&got[..], [MemoryEvent::Refused { role: MemRole::Rollout, reason }] if reason.contains("running")),
            "{got:?}"
        );
        assert!(lock(&engine).health().serving);
    }
}
