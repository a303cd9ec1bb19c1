//! Protocol-level tests of single actors: each actor runs in the simulator
//! with probes standing in for every peer and backend, so each test can
//! drive one protocol step by step and see exactly what the actor sends.

use std::collections::BTreeMap;

use gyre_actors::sched::buffer::{BufferMsg, Sample};
use gyre_actors::sched::cell::{Cell, CellLinks, CellMsg, CellRole, Move};
use gyre_actors::sched::core::CoreMsg;
use gyre_actors::sched::execution::ExecMsg;
use gyre_actors::sched::ids::{CallId, EngineIx, ExecId, GroupId, MicroStepId, SwitchId};
use gyre_actors::sched::packer::{Packer, PackerConfig, PackerLinks, PackerMsg};
use gyre_actors::sched::proto::engine::{CallEvent, EngineEvent, EngineReq, KvBlocks};
use gyre_actors::sched::proto::memory::{MemRole, MemoryEvent, MemoryReq};
use gyre_actors::sched::proto::trainer::{TrainerEvent, TrainerReq};
use gyre_actors::sched::proto::transfer::{ReadTag, Segment, TransferEvent, TransferReq};
use gyre_actors::sched::proxy::{Proxy, ProxyMsg};
use gyre_actors::sched::queue::{MicroQueue, MicroStep, QueueMsg};
use gyre_actors::sched::scheduler::SchedMsg;
use gyre_actors::trajectory::scoring::Outcome;
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{ActorId, Addr, BlobId, External, Message, NodeId};
use gyre_simulations::backends::{CheckpointDisk, SimTrainer};

const TESTER: ActorId = ActorId::new(99, 1);

/// Everything `probe` received since the last look, messages only.
fn got<M: Message>(sim: &mut Sim, probe: Addr<External<M>>) -> Vec<M> {
    sim.run().unwrap();
    sim.take_probe(probe).into_iter().map(|r| r.msg).collect()
}

/// Types a probe as the actor whose messages it stands in for.
fn as_actor<A, M>(probe: Addr<External<M>>) -> Addr<A> {
    Addr::new(probe.id())
}

fn call(exec: u64, seq: u32) -> CallId {
    CallId {
        exec: ExecId(exec),
        seq,
    }
}

struct ProxyRig {
    sim: Sim,
    proxy: Addr<Proxy>,
    a: Addr<External<EngineReq>>,
    b: Addr<External<EngineReq>>,
    exec: Addr<External<ExecMsg>>,
    cell: Addr<External<CellMsg>>,
}

fn proxy_rig() -> ProxyRig {
    let mut sim = Sim::new(SimConfig::new(1));
    let a = sim.probe::<EngineReq>(NodeId(1));
    let b = sim.probe::<EngineReq>(NodeId(2));
    let exec = sim.probe::<ExecMsg>(NodeId(3));
    let cell = sim.probe::<CellMsg>(NodeId(4));
    let engines = BTreeMap::from([(EngineIx::Cell(0), a.into()), (EngineIx::Cell(1), b.into())]);
    let proxy = sim.spawn(NodeId(0), Proxy::new(engines));
    ProxyRig {
        sim,
        proxy,
        a,
        b,
        exec,
        cell,
    }
}

impl ProxyRig {
    fn call(&mut self, c: CallId) {
        let reply_to = self.exec.into();
        self.sim.inject(
            TESTER,
            self.proxy,
            ProxyMsg::Call {
                call: c,
                prompt_tokens: 100,
                prompt: prompt_of(c),
                reply_to,
            },
        );
    }

    fn reroute(&mut self, exec: u64, to: EngineIx) {
        let notify = self.cell.into();
        self.sim.inject(
            TESTER,
            self.proxy,
            ProxyMsg::Reroute {
                switch: SwitchId(1),
                moves: vec![(ExecId(exec), to)],
                notify,
            },
        );
    }

    fn engine(&mut self, event: CallEvent) {
        self.sim.inject(TESTER, self.proxy, ProxyMsg::Engine(event));
    }
}

/// The prompt handle a harness would send with `c`.
fn prompt_of(c: CallId) -> BlobId {
    BlobId(1_000 + c.exec.0 * 100 + u64::from(c.seq))
}

/// Every attempt of a call must carry the harness's prompt handle.
fn serves(reqs: &[EngineReq]) -> Vec<(CallId, u32)> {
    reqs.iter()
        .filter_map(|r| match r {
            EngineReq::Serve {
                call,
                attempt,
                prompt,
                ..
            } => {
                assert_eq!(*prompt, prompt_of(*call), "the same prompt handle");
                Some((*call, *attempt))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn proxy_retries_a_cancelled_call_on_the_new_route_and_answers_once() {
    let mut r = proxy_rig();
    let c = call(0, 0);
    r.sim.inject(
        TESTER,
        r.proxy,
        ProxyMsg::Route {
            exec: ExecId(0),
            engine: EngineIx::Cell(0),
        },
    );
    r.call(c);
    assert_eq!(serves(&got(&mut r.sim, r.a)), vec![(c, 1)]);
    r.reroute(0, EngineIx::Cell(1));
    let acks = got(&mut r.sim, r.cell);
    assert!(matches!(
        acks[..],
        [CellMsg::RoutesMoved {
            switch: SwitchId(1)
        }]
    ));
    r.engine(CallEvent::Cancelled {
        call: c,
        attempt: 1,
    });
    assert_eq!(serves(&got(&mut r.sim, r.b)), vec![(c, 2)]);
    assert!(
        got(&mut r.sim, r.exec).is_empty(),
        "no error reaches the execution"
    );
    // A late answer of the cancelled attempt is ignored; the retry answers.
    r.engine(CallEvent::Done {
        call: c,
        attempt: 1,
        output_tokens: 1,
        version: 0,
        output: BlobId(51),
    });
    r.engine(CallEvent::Done {
        call: c,
        attempt: 2,
        output_tokens: 7,
        version: 0,
        output: BlobId(52),
    });
    let answers = got(&mut r.sim, r.exec);
    assert_eq!(answers.len(), 1);
    assert!(matches!(
        answers[0],
        ExecMsg::Answer {
            output_tokens: 7,
            output: BlobId(52),
            ..
        }
    ));
    let p = r.sim.actor(r.proxy).unwrap();
    assert_eq!(p.reroutes().get(&ExecId(0)), Some(&1));
    assert_eq!((p.stats().retries, p.outstanding()), (1, 0));
}

#[test]
fn proxy_holds_a_refused_call_until_the_reroute_arrives() {
    let mut r = proxy_rig();
    let c = call(3, 1);
    // The call arrives before the execution's route: held.
    r.call(c);
    assert!(got(&mut r.sim, r.a).is_empty());
    r.sim.inject(
        TESTER,
        r.proxy,
        ProxyMsg::Route {
            exec: ExecId(3),
            engine: EngineIx::Cell(0),
        },
    );
    assert_eq!(serves(&got(&mut r.sim, r.a)), vec![(c, 1)]);
    // Refused by an engine that stopped admitting, before the reroute: held.
    r.engine(CallEvent::Rejected {
        call: c,
        attempt: 1,
    });
    assert!(got(&mut r.sim, r.a).is_empty() && got(&mut r.sim, r.b).is_empty());
    r.reroute(3, EngineIx::Cell(1));
    assert_eq!(serves(&got(&mut r.sim, r.b)), vec![(c, 2)]);
}

#[test]
fn proxy_forgets_a_closed_execution() {
    let mut r = proxy_rig();
    let c = call(4, 0);
    r.sim.inject(
        TESTER,
        r.proxy,
        ProxyMsg::Route {
            exec: ExecId(4),
            engine: EngineIx::Cell(0),
        },
    );
    r.call(c);
    r.sim
        .inject(TESTER, r.proxy, ProxyMsg::Forget { exec: ExecId(4) });
    r.engine(CallEvent::Done {
        call: c,
        attempt: 1,
        output_tokens: 1,
        version: 0,
        output: BlobId::NONE,
    });
    assert!(got(&mut r.sim, r.exec).is_empty());
    // A route that arrives after the close is not resurrected.
    r.sim.inject(
        TESTER,
        r.proxy,
        ProxyMsg::Route {
            exec: ExecId(4),
            engine: EngineIx::Cell(0),
        },
    );
    r.sim.run().unwrap();
    assert_eq!(r.sim.actor(r.proxy).unwrap().route(ExecId(4)), None);
}

fn mstep(step: u64, seq: u32) -> MicroStep {
    MicroStep {
        id: MicroStepId { step, seq },
        group: GroupId(0),
        tokens: 10,
        rows: BlobId(u64::from(seq) + 1),
    }
}

#[test]
fn a_rewind_puts_every_granted_micro_step_of_the_rolled_back_steps_back() {
    let mut sim = Sim::new(SimConfig::new(2));
    let c0 = sim.probe::<CellMsg>(NodeId(1));
    let packer = sim.probe::<PackerMsg>(NodeId(3));
    let q = sim.spawn(NodeId(0), MicroQueue::new());
    for step in [0, 1] {
        let msteps = vec![mstep(step, 0), mstep(step, 1), mstep(step, 2)];
        let notify = packer.into();
        sim.inject(
            TESTER,
            q,
            QueueMsg::Push {
                step,
                msteps,
                notify,
            },
        );
        sim.inject(TESTER, q, QueueMsg::Close { step, total: 3 });
    }
    let claim = |sim: &mut Sim, step: u64| {
        let reply_to = c0.into();
        sim.inject(
            TESTER,
            q,
            QueueMsg::Claim {
                step,
                cell: 0,
                reply_to,
            },
        );
    };
    let grants = |sim: &mut Sim| -> Vec<(u64, u32)> {
        got(sim, c0)
            .into_iter()
            .filter_map(|m| match m {
                CellMsg::Grant { mstep } => Some((mstep.id.step, mstep.id.seq)),
                _ => None,
            })
            .collect()
    };
    // Step 0 trained whole, step 1 in part, when the core rolls back to 0.
    for _ in 0..3 {
        claim(&mut sim, 0);
    }
    claim(&mut sim, 1);
    assert_eq!(grants(&mut sim), vec![(0, 0), (0, 1), (0, 2), (1, 0)]);
    sim.inject(TESTER, q, QueueMsg::Rewind { from: 0 });
    for _ in 0..3 {
        claim(&mut sim, 0);
    }
    for _ in 0..3 {
        claim(&mut sim, 1);
    }
    // The same micro-steps again, in id order, each once.
    assert_eq!(
        grants(&mut sim),
        vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    );
    let queue = sim.actor(q).unwrap();
    assert_eq!((queue.granted(0), queue.granted(1)), (3, 3));
    let st = queue.stats().clone();
    assert_eq!(
        (st.rewound, st.rewound_tokens, st.double_grants),
        (4, 40, 0)
    );
}

#[test]
fn a_rebuilt_core_trainer_answers_nothing_until_it_restores_the_checkpoint() {
    let mut sim = Sim::new(SimConfig::new(3));
    let core = sim.probe::<TrainerEvent>(NodeId(1));
    let disk = CheckpointDisk::default();
    disk.write(3);
    let costs = gyre_simulations::costs::Costs::default().trainer;
    let t = sim.spawn(
        NodeId(10),
        SimTrainer::new(costs, 0).with_disk(disk.clone()).fresh(),
    );
    let reply_to = core.into();
    sim.inject(
        TESTER,
        t,
        TrainerReq::Update {
            epoch: 0,
            step: 3,
            reply_to,
        },
    );
    assert!(got(&mut sim, core).is_empty(), "no state: ignored");
    sim.inject(TESTER, t, TrainerReq::Restore { epoch: 1, reply_to });
    assert!(matches!(
        got(&mut sim, core)[..],
        [TrainerEvent::Restored {
            epoch: 1,
            version: 3,
            kept: false
        }]
    ));
    // The update is asked again in the restore's epoch: done, answered.
    sim.inject(
        TESTER,
        t,
        TrainerReq::Update {
            epoch: 1,
            step: 3,
            reply_to,
        },
    );
    sim.inject(
        TESTER,
        t,
        TrainerReq::Checkpoint {
            epoch: 1,
            step: 3,
            version: 4,
            reply_to,
        },
    );
    assert_eq!(got(&mut sim, core).len(), 2);
    assert_eq!(disk.last(), Some(4));
    // A process that kept its state restores nothing.
    sim.inject(TESTER, t, TrainerReq::Restore { epoch: 2, reply_to });
    assert!(matches!(
        got(&mut sim, core)[..],
        [TrainerEvent::Restored {
            epoch: 2,
            version: 4,
            kept: true
        }]
    ));
    let st = sim.actor(t).unwrap().stats();
    assert_eq!((st.ignored, st.restores, st.updates), (1, 2, 1));
}

#[test]
fn queue_grants_disjoint_micro_steps_parks_claims_and_ends_streams() {
    let mut sim = Sim::new(SimConfig::new(2));
    let c0 = sim.probe::<CellMsg>(NodeId(1));
    let c1 = sim.probe::<CellMsg>(NodeId(2));
    let packer = sim.probe::<PackerMsg>(NodeId(3));
    let q = sim.spawn(NodeId(0), MicroQueue::new());
    let claim = |sim: &mut Sim, cell: u32, to: Addr<External<CellMsg>>| {
        sim.inject(
            TESTER,
            q,
            QueueMsg::Claim {
                step: 0,
                cell,
                reply_to: to.into(),
            },
        );
    };
    claim(&mut sim, 0, c0); // parks: nothing enqueued yet
    assert!(got(&mut sim, c0).is_empty());
    sim.inject(
        TESTER,
        q,
        QueueMsg::Push {
            step: 0,
            msteps: vec![mstep(0, 0), mstep(0, 1), mstep(0, 2)],
            notify: packer.into(),
        },
    );
    claim(&mut sim, 1, c1);
    claim(&mut sim, 0, c0);
    claim(&mut sim, 1, c1); // parks again: the queue is empty, not closed
    let mut granted = Vec::new();
    for m in got(&mut sim, c0).into_iter().chain(got(&mut sim, c1)) {
        match m {
            CellMsg::Grant { mstep } => granted.push(mstep.id.seq),
            other => panic!("unexpected {other:?}"),
        }
    }
    granted.sort();
    assert_eq!(granted, vec![0, 1, 2], "each micro-step exactly once");
    assert_eq!(
        got(&mut sim, packer).len(),
        3,
        "the packer hears of each claim"
    );
    sim.inject(TESTER, q, QueueMsg::Close { step: 0, total: 3 });
    assert!(matches!(
        got(&mut sim, c1)[..],
        [CellMsg::StreamEnd { step: 0 }]
    ));
    claim(&mut sim, 0, c0);
    assert!(matches!(
        got(&mut sim, c0)[..],
        [CellMsg::StreamEnd { step: 0 }]
    ));
    let stats = sim.actor(q).unwrap().stats().clone();
    assert_eq!((stats.double_grants, stats.bad_closes), (0, 0));
    assert_eq!(stats.grants.values().sum::<u64>(), 3);
}

#[test]
fn packer_takes_oldest_version_first_and_stays_one_batch_ahead() {
    let mut sim = Sim::new(SimConfig::new(3));
    let buffer = sim.probe::<BufferMsg>(NodeId(1));
    let queue = sim.probe::<QueueMsg>(NodeId(2));
    let core = sim.probe::<CoreMsg>(NodeId(3));
    let sched = sim.probe::<SchedMsg>(NodeId(4));
    let packer = sim.spawn(
        NodeId(0),
        Packer::new(
            PackerConfig {
                batch_groups: 2,
                micro_tokens: 100,
                short_micro_steps: 1,
                streaming: true,
                keep_until_durable: false,
            },
            PackerLinks {
                buffer: as_actor(buffer),
                queue: as_actor(queue),
                core: as_actor(core),
                sched: as_actor(sched),
            },
        ),
    );
    let takes = |sim: &mut Sim| -> Vec<u64> {
        got(sim, buffer)
            .into_iter()
            .filter_map(|m| match m {
                BufferMsg::Take { group, .. } => Some(group.0),
                _ => None,
            })
            .collect()
    };
    let ready = |sim: &mut Sim, g: u64, v: u64| {
        sim.inject(
            TESTER,
            packer,
            PackerMsg::Ready {
                group: GroupId(g),
                v_d: v,
            },
        );
    };
    let taken = |sim: &mut Sim, g: u64, v: u64, tokens: u64, valid: bool| {
        let outcome = if valid {
            Outcome::Valid {
                score: 1.0,
                partial: false,
            }
        } else {
            Outcome::Dummy
        };
        sim.inject(
            TESTER,
            packer,
            PackerMsg::Taken {
                group: GroupId(g),
                v_d: v,
                samples: vec![Sample {
                    exec: ExecId(g * 10),
                    outcome,
                    tokens,
                    records: Vec::new(),
                }],
            },
        );
    };
    ready(&mut sim, 9, 0);
    assert_eq!(takes(&mut sim), vec![9]);
    taken(&mut sim, 9, 0, 250, true); // three micro-steps: not short any more
    for (g, v) in [(5, 2), (4, 1), (3, 1)] {
        ready(&mut sim, g, v);
    }
    assert!(takes(&mut sim).is_empty());
    for seq in 0..3 {
        sim.inject(
            TESTER,
            packer,
            PackerMsg::Claimed {
                id: MicroStepId { step: 0, seq },
                group: GroupId(9),
            },
        );
    }
    // Short again: the oldest version (1), lowest group first.
    assert_eq!(takes(&mut sim), vec![3]);
    taken(&mut sim, 3, 1, 0, false); // a dummy: no micro-steps
    let to_queue = got(&mut sim, queue);
    assert!(matches!(
        to_queue.last(),
        Some(QueueMsg::Close { step: 0, total: 3 })
    ));
    let sealed = got(&mut sim, core);
    let Some(CoreMsg::BatchSealed {
        step: 0, groups, ..
    }) = sealed.first()
    else {
        panic!("batch 0 not sealed: {sealed:?}");
    };
    assert_eq!(
        groups.iter().map(|g| g.group.0).collect::<Vec<_>>(),
        vec![9, 3]
    );
    // Batch 1 fills while batch 0 trains...
    assert_eq!(takes(&mut sim), vec![4]);
    taken(&mut sim, 4, 1, 50, true);
    // One micro-step waiting is enough (short = 1) until a cell claims it.
    assert!(takes(&mut sim).is_empty());
    sim.inject(
        TESTER,
        packer,
        PackerMsg::Claimed {
            id: MicroStepId { step: 1, seq: 0 },
            group: GroupId(4),
        },
    );
    assert_eq!(takes(&mut sim), vec![5]);
    taken(&mut sim, 5, 2, 0, false);
    // ...but batch 2 waits until batch 0 is trained.
    ready(&mut sim, 6, 2);
    assert!(takes(&mut sim).is_empty());
    sim.inject(TESTER, packer, PackerMsg::Trained { step: 0 });
    assert_eq!(takes(&mut sim), vec![6]);
    let supplies: Vec<u64> = got(&mut sim, sched)
        .into_iter()
        .filter_map(|m| match m {
            SchedMsg::Supply { value, .. } => Some(value),
            _ => None,
        })
        .collect();
    assert!(!supplies.is_empty() && supplies.iter().all(|v| *v <= 2));
}

struct CellRig {
    sim: Sim,
    cell: Addr<Cell>,
    engine: Addr<External<EngineReq>>,
    memory: Addr<External<MemoryReq>>,
    trainer: Addr<External<TrainerReq>>,
    transfer: Addr<External<TransferReq>>,
    sched: Addr<External<SchedMsg>>,
    core: Addr<External<CoreMsg>>,
    queue: Addr<External<QueueMsg>>,
    dest: Addr<External<CellMsg>>,
}

fn cell_rig() -> CellRig {
    let mut sim = Sim::new(SimConfig::new(4));
    let engine = sim.probe::<EngineReq>(NodeId(1));
    let memory = sim.probe::<MemoryReq>(NodeId(1));
    let trainer = sim.probe::<TrainerReq>(NodeId(1));
    let transfer = sim.probe::<TransferReq>(NodeId(2));
    let sched = sim.probe::<SchedMsg>(NodeId(3));
    let core = sim.probe::<CoreMsg>(NodeId(3));
    let queue = sim.probe::<QueueMsg>(NodeId(3));
    let dest = sim.probe::<CellMsg>(NodeId(4));
    let links = CellLinks {
        sched: as_actor(sched),
        core: as_actor(core),
        queue: as_actor(queue),
        engine: engine.into(),
        trainer: Some(trainer.into()),
        memory: Some(memory.into()),
        transfer: transfer.into(),
    };
    let cell = sim.spawn(NodeId(0), Cell::new(1, links, 1024));
    CellRig {
        sim,
        cell,
        engine,
        memory,
        trainer,
        transfer,
        sched,
        core,
        queue,
        dest,
    }
}

impl CellRig {
    fn send(&mut self, msg: impl Into<CellMsg>) {
        self.sim.inject(TESTER, self.cell, msg.into());
    }

    fn role(&self) -> CellRole {
        self.sim.actor(self.cell).unwrap().role()
    }
}

#[test]
fn a_cell_switches_to_training_step_by_step() {
    let mut r = cell_rig();
    let sw = SwitchId(1);
    let dest_cell = r.dest.into();
    let moves = [7, 8]
        .map(|e| Move {
            exec: ExecId(e),
            dest: EngineIx::Cell(3),
            dest_cell,
        })
        .to_vec();
    r.send(CellMsg::Switch { switch: sw, moves });
    // 1. Stop admitting; nothing else until the proxy has the new routes.
    assert!(matches!(
        got(&mut r.sim, r.engine)[..],
        [EngineReq::StopAdmitting { .. }]
    ));
    assert_eq!(r.role(), CellRole::Draining);
    r.send(EngineEvent::AdmissionStopped);
    assert!(got(&mut r.sim, r.engine).is_empty());
    // 2–4. Routes in place: pin the displaced executions' blocks, then cancel.
    r.send(CellMsg::RoutesMoved { switch: sw });
    let pin = got(&mut r.sim, r.engine);
    assert!(
        matches!(&pin[..], [EngineReq::PinKv { execs, .. }] if execs == &[ExecId(7), ExecId(8)])
    );
    let kv = KvBlocks {
        exec: ExecId(7),
        engine: EngineIx::Cell(1),
        tokens: 500,
    };
    r.send(EngineEvent::KvPinned { blocks: vec![kv] });
    // The destination is warned first (its engine then holds the retried
    // call for the blocks), then the calls are cancelled.
    assert!(matches!(
        got(&mut r.sim, r.dest)[..],
        [CellMsg::KvComing {
            switch: SwitchId(1),
            exec: ExecId(7)
        }]
    ));
    assert!(matches!(
        got(&mut r.sim, r.engine)[..],
        [EngineReq::CancelAll { .. }]
    ));
    // After the cancel completed, the destination is offered the blocks.
    r.send(EngineEvent::CancelComplete { cancelled: 2 });
    let offers = got(&mut r.sim, r.dest);
    assert!(matches!(&offers[..], [CellMsg::TakeOver { kv: k, .. }] if *k == kv));
    assert!(
        got(&mut r.sim, r.engine).is_empty(),
        "pins held until acknowledged"
    );
    // The destination acknowledges: release, then unload.
    r.send(CellMsg::TakenOver {
        switch: sw,
        exec: ExecId(7),
    });
    let after = got(&mut r.sim, r.engine);
    assert!(matches!(
        &after[..],
        [EngineReq::ReleaseKv { execs }, EngineReq::Unload { .. }] if execs == &[ExecId(7)]
    ));
    assert_eq!(r.role(), CellRole::Switching);
    // 5. Rollout memory released, training memory restored, change reported.
    r.send(EngineEvent::Unloaded);
    assert!(matches!(
        got(&mut r.sim, r.memory)[..],
        [MemoryReq::Release {
            role: MemRole::Rollout,
            ..
        }]
    ));
    r.send(MemoryEvent::Released {
        role: MemRole::Rollout,
    });
    assert!(matches!(
        got(&mut r.sim, r.memory)[..],
        [MemoryReq::Restore {
            role: MemRole::Training,
            ..
        }]
    ));
    r.send(MemoryEvent::Restored {
        role: MemRole::Training,
    });
    assert!(matches!(
        got(&mut r.sim, r.sched)[..],
        [SchedMsg::Switched { cell: 1, switch }] if switch == sw
    ));
    assert_eq!(r.role(), CellRole::Training);
}

#[test]
fn a_training_cell_warms_up_once_drains_once_and_returns_after_its_batch() {
    let mut r = cell_rig();
    r.send(CellMsg::Switch {
        switch: SwitchId(1),
        moves: vec![],
    });
    r.send(EngineEvent::AdmissionStopped);
    r.send(CellMsg::RoutesMoved {
        switch: SwitchId(1),
    });
    r.send(EngineEvent::KvPinned { blocks: vec![] });
    r.send(EngineEvent::CancelComplete { cancelled: 0 });
    r.send(EngineEvent::Unloaded);
    r.send(MemoryEvent::Released {
        role: MemRole::Rollout,
    });
    r.send(MemoryEvent::Restored {
        role: MemRole::Training,
    });
    r.sim.run().unwrap();
    r.sim.take_probe(r.engine);
    r.sim.take_probe(r.memory);
    r.sim.take_probe(r.sched);
    // Join: read the core's snapshot of step 4, then report and claim.
    let snapshot = Segment {
        id: 1,
        version: 4,
        bytes: 1 << 20,
    };
    // In the core's second restore epoch: a late answer of an earlier one
    // (the lost step's, same ids) is not the batch's.
    r.send(CellMsg::Batch {
        epoch: 2,
        step: 4,
        snapshot: Some(snapshot),
    });
    assert!(matches!(
        got(&mut r.sim, r.transfer)[..],
        [TransferReq::Read {
            tag: ReadTag::Snapshot {
                step: 4,
                version: 4
            },
            ..
        }]
    ));
    r.send(TransferEvent::ReadDone {
        tag: ReadTag::Snapshot {
            step: 4,
            version: 4,
        },
    });
    assert!(matches!(
        got(&mut r.sim, r.sched)[..],
        [SchedMsg::Joined { cell: 1, .. }]
    ));
    assert!(matches!(
        got(&mut r.sim, r.queue)[..],
        [QueueMsg::Claim { step: 4, .. }]
    ));
    // The burst ends while the cell computes: the return waits for the batch.
    r.send(CellMsg::Return {
        switch: SwitchId(2),
        version: 5,
    });
    for seq in 0..2 {
        r.send(CellMsg::Grant {
            mstep: mstep(4, seq),
        });
        let reqs = got(&mut r.sim, r.trainer);
        if seq == 0 {
            assert!(matches!(
                reqs[..],
                [TrainerReq::Warmup {
                    epoch: 2,
                    step: 4,
                    ..
                }]
            ));
            r.send(TrainerEvent::Warm { epoch: 2, step: 4 });
            assert!(matches!(
                got(&mut r.sim, r.trainer)[..],
                [TrainerReq::FwdBwd {
                    rows: BlobId(1),
                    ..
                }]
            ));
        } else {
            assert!(
                matches!(reqs[..], [TrainerReq::FwdBwd { rows, .. }] if rows == mstep(4, seq).rows),
                "one warm-up per batch; the rows handle of the granted micro-step"
            );
        }
        r.send(TrainerEvent::Computed {
            epoch: 1,
            mstep: mstep(4, seq).id,
        });
        assert!(got(&mut r.sim, r.queue).is_empty(), "a stale answer");
        r.send(TrainerEvent::Computed {
            epoch: 2,
            mstep: mstep(4, seq).id,
        });
        assert!(matches!(
            got(&mut r.sim, r.queue)[..],
            [QueueMsg::Claim { step: 4, .. }]
        ));
    }
    assert!(got(&mut r.sim, r.memory).is_empty(), "not while computing");
    r.send(CellMsg::StreamEnd { step: 4 });
    assert!(matches!(
        got(&mut r.sim, r.trainer)[..],
        [TrainerReq::Drain { step: 4, .. }]
    ));
    r.send(TrainerEvent::Drained { epoch: 2, step: 4 });
    let done = got(&mut r.sim, r.core);
    assert!(matches!(
        &done[..],
        [CoreMsg::BatchDone { step: 4, cell: 1, consumed }] if consumed.len() == 2
    ));
    // Now the deferred return runs: training memory out, rollout memory in,
    // the published weights loaded.
    assert!(matches!(
        got(&mut r.sim, r.memory)[..],
        [MemoryReq::Release {
            role: MemRole::Training,
            ..
        }]
    ));
    r.send(MemoryEvent::Released {
        role: MemRole::Training,
    });
    r.send(MemoryEvent::Restored {
        role: MemRole::Rollout,
    });
    assert!(matches!(
        got(&mut r.sim, r.engine)[..],
        [EngineReq::Load { version: 5, .. }]
    ));
    r.send(EngineEvent::Loaded { version: 5 });
    assert!(matches!(
        got(&mut r.sim, r.sched)[..],
        [SchedMsg::Returned {
            cell: 1,
            switch: SwitchId(2)
        }]
    ));
    assert_eq!(r.role(), CellRole::Rollout);
    let st = r.sim.actor(r.cell).unwrap().stats();
    assert_eq!((st.warmups, st.drains, st.unexpected), (1, 1, 0));
    assert_eq!(st.stale_trainer_answers, 2);
}

#[test]
fn a_destination_reads_the_blocks_adopts_them_and_acknowledges() {
    let mut r = cell_rig();
    let source = r.dest; // any cell-typed probe will do as the source
    let kv = KvBlocks {
        exec: ExecId(2),
        engine: EngineIx::Cell(0),
        tokens: 300,
    };
    // Warned before the source cancels: the engine holds the execution's
    // retried call for the blocks.
    r.send(CellMsg::KvComing {
        switch: SwitchId(9),
        exec: ExecId(2),
    });
    assert!(matches!(
        got(&mut r.sim, r.engine)[..],
        [EngineReq::ExpectKv { exec: ExecId(2) }]
    ));
    r.send(CellMsg::TakeOver {
        switch: SwitchId(9),
        kv,
        source: source.into(),
    });
    let reads = got(&mut r.sim, r.transfer);
    let [TransferReq::Read { tag, bytes, .. }] = &reads[..] else {
        panic!("{reads:?}");
    };
    assert_eq!(*bytes, 300 * 1024);
    r.send(TransferEvent::ReadDone { tag: *tag });
    assert!(matches!(
        got(&mut r.sim, r.engine)[..],
        [EngineReq::AdoptKv {
            exec: ExecId(2),
            tokens: 300
        }]
    ));
    assert!(matches!(
        got(&mut r.sim, source)[..],
        [CellMsg::TakenOver {
            switch: SwitchId(9),
            exec: ExecId(2)
        }]
    ));
}

#[test]
fn the_core_takes_no_answer_from_before_its_restore_for_the_redos() {
    // The core loses its trainer while the update of step 0 is under way,
    // restores (epoch 1) and trains step 0 again: the same step id, so
    // only the epoch tells the lost update's answer, delayed past the
    // restore, from the redo's.
    use gyre_actors::sched::core::{Core, CoreConfig, CoreLinks, CorePhase};
    let mut sim = Sim::new(SimConfig::new(5));
    let trainer = sim.probe::<TrainerReq>(NodeId(1));
    let transfer = sim.probe::<TransferReq>(NodeId(2));
    let sched = sim.probe::<SchedMsg>(NodeId(3));
    let cell0 = sim.probe::<CellMsg>(NodeId(1));
    let packer = sim.probe::<PackerMsg>(NodeId(3));
    let queue = sim.probe::<QueueMsg>(NodeId(3));
    let cfg = CoreConfig {
        cells: 1,
        mu: 4,
        target_steps: 4,
        streaming: true,
        keep_satellites: false,
        checkpoint_every: Some(1),
        recover: true,
        reduce_needs_members: false,
    };
    let links = CoreLinks {
        sched: as_actor(sched),
        trainer: trainer.into(),
        transfer: transfer.into(),
    };
    let core = sim.spawn(NodeId(3), Core::new(cfg, links));
    let send = |sim: &mut Sim, msg: CoreMsg| sim.inject(TESTER, core, msg);
    let answer = |sim: &mut Sim, e: TrainerEvent| sim.inject(TESTER, core, CoreMsg::Trainer(e));
    sim.run().unwrap();
    assert!(matches!(
        got(&mut sim, trainer)[..],
        [TrainerReq::BuildGroups { epoch: 0, .. }]
    ));
    answer(
        &mut sim,
        TrainerEvent::GroupsBuilt {
            epoch: 0,
            groups: 0,
        },
    );
    // Collect step 0 and reduce it; its update is asked.
    let collect = |sim: &mut Sim, epoch: u64| {
        assert!(matches!(
            got(sim, cell0)[..],
            [CellMsg::Batch { step: 0, epoch: e, .. }] if e == epoch
        ));
        sim.inject(
            TESTER,
            core,
            CoreMsg::Transfer(TransferEvent::Exposed {
                segment: Segment {
                    id: 1,
                    version: 0,
                    bytes: 1,
                },
            }),
        );
        sim.inject(
            TESTER,
            core,
            CoreMsg::BatchDone {
                step: 0,
                cell: 0,
                consumed: vec![MicroStepId { step: 0, seq: 0 }],
            },
        );
        sim.run().unwrap();
        let reqs = got(sim, trainer);
        assert!(
            matches!(reqs[..], [TrainerReq::Reduce { step: 0, epoch: e, .. }] if e == epoch),
            "{reqs:?}"
        );
        sim.inject(
            TESTER,
            core,
            CoreMsg::Trainer(TrainerEvent::Reduced {
                epoch,
                step: 0,
                grad_norm: 1.0,
            }),
        );
        sim.run().unwrap();
        let reqs = got(sim, trainer);
        assert!(
            matches!(reqs[..], [TrainerReq::Update { step: 0, epoch: e, .. }] if e == epoch),
            "{reqs:?}"
        );
    };
    send(
        &mut sim,
        CoreMsg::Activate {
            step: 0,
            burst: 0,
            members: vec![(0, cell0.into())],
        },
    );
    send(
        &mut sim,
        CoreMsg::BatchSealed {
            step: 0,
            groups: vec![],
            micro_steps: vec![MicroStepId { step: 0, seq: 0 }],
            packer: packer.into(),
        },
    );
    sim.run().unwrap();
    collect(&mut sim, 0);
    // The trainer's node is lost before it answers the update.
    send(
        &mut sim,
        CoreMsg::MemberLost {
            cell: 0,
            queue: queue.into(),
        },
    );
    sim.run().unwrap();
    assert!(matches!(
        got(&mut sim, cell0)[..],
        [CellMsg::Abort { step: 0 }]
    ));
    send(&mut sim, CoreMsg::Aborted { step: 0 });
    sim.run().unwrap();
    assert!(matches!(
        got(&mut sim, trainer)[..],
        [TrainerReq::Restore { epoch: 1, .. }]
    ));
    answer(
        &mut sim,
        TrainerEvent::Restored {
            epoch: 1,
            version: 0,
            kept: true,
        },
    );
    sim.run().unwrap();
    collect(&mut sim, 1);
    // The lost update's answer arrives late: not the redo's.
    answer(&mut sim, TrainerEvent::Updated { epoch: 0, step: 0 });
    sim.run().unwrap();
    let c = sim.actor(core).unwrap();
    assert_eq!((c.version(), c.phase()), (0, CorePhase::Updating));
    assert_eq!(c.log().stale_answers, 1);
    // The redo's answer counts.
    answer(&mut sim, TrainerEvent::Updated { epoch: 1, step: 0 });
    sim.run().unwrap();
    let c = sim.actor(core).unwrap();
    assert_eq!(c.version(), 1);
    assert!(c.log().violations.is_empty(), "{:?}", c.log().violations);
}
