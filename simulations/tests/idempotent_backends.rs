//! The simulated backends answer a repeated request (a resend after a lost
//! answer, or the network's duplicate) without doing its work twice: the
//! trainer computes a micro-step once and answers every copy of the
//! request, the engine answers a repeated call attempt from its memory
//! instead of serving it again, and device memory answers a repeated
//! release at once. A request from before the core's restore, delayed past
//! it, is neither done nor answered.

use gyre_actors::sched::ids::{CallId, EngineIx, ExecId, MicroStepId};
use gyre_actors::sched::proto::engine::{CallEvent, EngineReq};
use gyre_actors::sched::proto::memory::{MemRole, MemoryEvent, MemoryReq};
use gyre_actors::sched::proto::trainer::{TrainerEvent, TrainerReq};
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{ActorId, Addr, BlobId, External, NodeId, Recipient};
use gyre_simulations::backends::{SimEngine, SimMemory, SimTrainer};
use gyre_simulations::costs::Costs;

/// Who sends the requests (a test double: nothing is hosted there).
fn asker() -> ActorId {
    ActorId::new(0, 99)
}

fn answers<M: gyre_runtime::Message>(sim: &mut Sim, probe: Addr<External<M>>) -> Vec<M> {
    sim.run().unwrap();
    sim.take_probe(probe).into_iter().map(|r| r.msg).collect()
}

/// Sends `req()` twice at once (a copy while the first is under way), then
/// once more after the answer; returns the answers of each round.
fn twice_then_again<A: gyre_runtime::Actor, M: gyre_runtime::Message>(
    sim: &mut Sim,
    to: Addr<A>,
    probe: Addr<External<M>>,
    req: impl Fn() -> A::Msg,
) -> (Vec<M>, Vec<M>) {
    sim.inject(asker(), to, req());
    sim.inject(asker(), to, req());
    let first = answers(sim, probe);
    sim.inject(asker(), to, req());
    (first, answers(sim, probe))
}

#[test]
fn a_repeated_micro_step_is_computed_once_and_answered_each_time() {
    let mut sim = Sim::new(SimConfig::new(1));
    let trainer = sim.spawn(NodeId(1), SimTrainer::new(Costs::default().trainer, 0));
    let probe = sim.probe::<TrainerEvent>(NodeId(0));
    let req = || TrainerReq::FwdBwd {
        epoch: 0,
        mstep: MicroStepId { step: 0, seq: 3 },
        tokens: 100,
        rows: BlobId::NONE,
        reply_to: Recipient::of(probe),
    };
    // Twice while queued (ignored), once after it is done (answered again).
    let (first, again) = twice_then_again(&mut sim, trainer, probe, req);
    assert!(
        matches!(first[..], [TrainerEvent::Computed { .. }]),
        "{first:?}"
    );
    assert!(
        matches!(again[..], [TrainerEvent::Computed { .. }]),
        "{again:?}"
    );
    assert_eq!(sim.actor(trainer).unwrap().stats().micro_steps, 1);
}

#[test]
fn a_repeated_call_attempt_is_answered_from_memory_not_served_twice() {
    let mut sim = Sim::new(SimConfig::new(2));
    let engine = sim.spawn(
        NodeId(1),
        SimEngine::new(EngineIx::Cell(0), Costs::default().engine),
    );
    let probe = sim.probe::<CallEvent>(NodeId(0));
    let call = CallId {
        exec: ExecId(4),
        seq: 0,
    };
    let serve = || EngineReq::Serve {
        call,
        attempt: 1,
        prompt_tokens: 50,
        prompt: BlobId::NONE,
        reply_to: Recipient::of(probe),
    };
    let (first, again) = twice_then_again(&mut sim, engine, probe, serve);
    let tokens = |v: &[CallEvent]| match v {
        [CallEvent::Done { output_tokens, .. }] => Some(*output_tokens),
        _ => None,
    };
    assert!(tokens(&first).is_some(), "{first:?}");
    assert_eq!(tokens(&first), tokens(&again), "{again:?}");
    let st = sim.actor(engine).unwrap().stats();
    assert_eq!((st.served, st.repeats), (1, 2));
}

#[test]
fn a_repeated_release_is_answered_at_once() {
    let mut sim = Sim::new(SimConfig::new(3));
    let memory = sim.spawn(NodeId(1), SimMemory::new(Costs::default().memory));
    let probe = sim.probe::<MemoryEvent>(NodeId(0));
    let release = || MemoryReq::Release {
        role: MemRole::Rollout,
        reply_to: Recipient::of(probe),
    };
    let (first, again) = twice_then_again(&mut sim, memory, probe, release);
    assert!(
        matches!(first[..], [MemoryEvent::Released { .. }]),
        "{first:?}"
    );
    assert!(
        matches!(again[..], [MemoryEvent::Released { .. }]),
        "{again:?}"
    );
    assert_eq!(sim.actor(memory).unwrap().stats().releases, 1);
}

#[test]
fn a_micro_step_from_before_a_restore_is_neither_computed_nor_answered() {
    // The redone step repeats the lost one's micro-step ids: only the
    // epoch tells a delayed copy of the lost step's request from the
    // redo's.
    let mut sim = Sim::new(SimConfig::new(4));
    let trainer = sim.spawn(NodeId(1), SimTrainer::new(Costs::default().trainer, 0));
    let probe = sim.probe::<TrainerEvent>(NodeId(0));
    let fwd = |epoch| TrainerReq::FwdBwd {
        epoch,
        mstep: MicroStepId { step: 0, seq: 3 },
        tokens: 100,
        rows: BlobId::NONE,
        reply_to: Recipient::of(probe),
    };
    sim.inject(asker(), trainer, fwd(0));
    let before = answers(&mut sim, probe);
    assert!(
        matches!(before[..], [TrainerEvent::Computed { epoch: 0, .. }]),
        "{before:?}"
    );
    sim.inject(
        asker(),
        trainer,
        TrainerReq::Restore {
            epoch: 1,
            reply_to: Recipient::of(probe),
        },
    );
    let restored = answers(&mut sim, probe);
    assert!(
        matches!(restored[..], [TrainerEvent::Restored { epoch: 1, .. }]),
        "{restored:?}"
    );
    // The network's late copy of the lost step's request.
    sim.inject(asker(), trainer, fwd(0));
    let late = answers(&mut sim, probe);
    assert!(late.is_empty(), "{late:?}");
    // The redo's request, same id: computed afresh, answered in epoch 1.
    sim.inject(asker(), trainer, fwd(1));
    let redo = answers(&mut sim, probe);
    assert!(
        matches!(redo[..], [TrainerEvent::Computed { epoch: 1, .. }]),
        "{redo:?}"
    );
    let st = sim.actor(trainer).unwrap().stats();
    assert_eq!((st.micro_steps, st.stale), (2, 1));
}
