//! The simulated engine's `inference.hold_for_kv`: a call retried on its
//! destination during a switch waits there for its execution's migrated KV
//! blocks (`ExpectKv` … `AdoptKv`) and is then charged only what they do
//! not cover, as the embedded engine serves it; without the blocks it is
//! prefilled after `KV_WAIT`; a cancel answers it like any call in flight.
//! Off, the hint is ignored and the call is prefilled at once.

use gyre_actors::sched::ids::{CallId, EngineIx, ExecId};
use gyre_actors::sched::proto::engine::{CallEvent, EngineEvent, EngineReq, KV_WAIT};
use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{ActorId, Addr, BlobId, External, MILLIS, NodeId, Recipient};
use gyre_simulations::backends::{SimEngine, engine::EngineStats};
use gyre_simulations::costs::Costs;

/// Who sends the requests (a test double for the cells and the proxy).
const ASKER: ActorId = ActorId::new(0, 99);
const EXEC: ExecId = ExecId(4);
const PROMPT: u64 = 5_000;

struct Rig {
    sim: Sim,
    engine: Addr<SimEngine>,
    calls: Addr<External<CallEvent>>,
    cell: Addr<External<EngineEvent>>,
}

impl Rig {
    fn new(hold: bool) -> Self {
        let mut sim = Sim::new(SimConfig::new(7));
        let mut costs = Costs::default().engine;
        costs.hold_for_kv = hold;
        let engine = sim.spawn(NodeId(1), SimEngine::new(EngineIx::Cell(1), costs));
        let calls = sim.probe::<CallEvent>(NodeId(0));
        let cell = sim.probe::<EngineEvent>(NodeId(0));
        Rig {
            sim,
            engine,
            calls,
            cell,
        }
    }

    fn send(&mut self, req: EngineReq) {
        self.sim.inject(ASKER, self.engine, req);
    }

    /// The displaced call's retry, warned of its blocks first.
    fn expect_then_retry(&mut self) {
        self.send(EngineReq::ExpectKv { exec: EXEC });
        self.send(EngineReq::Serve {
            call: CallId { exec: EXEC, seq: 3 },
            attempt: 1,
            prompt_tokens: PROMPT,
            prompt: BlobId::NONE,
            reply_to: Recipient::of(self.calls),
        });
    }

    /// Runs `for_ns` more, and what the proxy got meanwhile.
    fn run_for(&mut self, for_ns: u64) -> Vec<CallEvent> {
        let until = self.sim.now() + for_ns;
        self.sim.run_until(until).unwrap();
        self.sim
            .take_probe(self.calls)
            .into_iter()
            .map(|r| r.msg)
            .collect()
    }

    fn stats(&self) -> EngineStats {
        self.sim.actor(self.engine).unwrap().stats()
    }

    /// (calls held, waits that ran out, prompt tokens cached, prefilled).
    fn held(&self) -> (u64, u64, u64, u64) {
        let st = self.stats();
        (
            st.held_for_kv,
            st.kv_wait_expired,
            st.cached_tokens,
            st.prefilled_tokens,
        )
    }
}

fn done(v: &[CallEvent]) -> bool {
    matches!(v, [CallEvent::Done { attempt: 1, .. }])
}

#[test]
fn a_held_call_starts_from_its_adopted_blocks() {
    let mut r = Rig::new(true);
    r.expect_then_retry();
    assert!(r.run_for(100 * MILLIS).is_empty(), "held for its blocks");
    r.send(EngineReq::AdoptKv {
        exec: EXEC,
        tokens: PROMPT,
    });
    assert!(done(&r.run_for(KV_WAIT)));
    assert_eq!(r.held(), (1, 0, PROMPT, 0));
}

#[test]
fn without_its_blocks_a_held_call_is_prefilled_after_the_wait() {
    let mut r = Rig::new(true);
    r.expect_then_retry();
    assert!(
        r.run_for(KV_WAIT - MILLIS).is_empty(),
        "held until the wait ends"
    );
    assert!(done(&r.run_for(KV_WAIT)));
    assert_eq!(r.held(), (1, 1, 0, PROMPT));
}

#[test]
fn a_cancel_answers_a_held_call() {
    let mut r = Rig::new(true);
    r.expect_then_retry();
    assert!(r.run_for(MILLIS).is_empty());
    r.send(EngineReq::CancelAll {
        reply_to: Recipient::of(r.cell),
    });
    let got = r.run_for(KV_WAIT + MILLIS);
    assert!(
        matches!(got[..], [CallEvent::Cancelled { attempt: 1, .. }]),
        "{got:?}"
    );
    let cell: Vec<_> = r
        .sim
        .take_probe(r.cell)
        .into_iter()
        .map(|m| m.msg)
        .collect();
    assert!(
        matches!(cell[..], [EngineEvent::CancelComplete { cancelled: 1 }]),
        "{cell:?}"
    );
    assert_eq!(
        r.stats().kv_wait_expired,
        0,
        "the wait ended with the cancel"
    );
}

#[test]
fn off_the_hint_is_ignored_and_the_call_prefilled_at_once() {
    let mut r = Rig::new(false);
    r.expect_then_retry();
    assert!(done(&r.run_for(KV_WAIT - MILLIS)));
    let st = r.stats();
    assert_eq!((st.held_for_kv, st.prefilled_tokens), (0, PROMPT));
}
