//! The proxy's same-engine retry of rejected calls, on the simulator with
//! probes for engines and the execution.

use std::collections::BTreeMap;

use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{ActorId, Addr, BlobId, External, MILLIS, NodeId};

use super::*;
use crate::sched::ids::SwitchId;

const TESTER: ActorId = ActorId::new(99, 1);
const EXEC: ExecId = ExecId(1);
const CALL: CallId = CallId { exec: EXEC, seq: 0 };

struct Rig {
    sim: Sim,
    proxy: Addr<Proxy>,
    engines: [Addr<External<EngineReq>>; 2],
    exec: Addr<External<ExecMsg>>,
}

fn rig(retry: RejectRetry) -> Rig {
    let mut sim = Sim::new(SimConfig::new(1));
    let engines = [sim.probe::<EngineReq>(NodeId(1)), sim.probe(NodeId(2))];
    let exec = sim.probe::<ExecMsg>(NodeId(3));
    let ports = BTreeMap::from([
        (EngineIx::Cell(0), engines[0].into()),
        (EngineIx::Cell(1), engines[1].into()),
    ]);
    let proxy = sim.spawn(NodeId(0), Proxy::new(ports).with_reject_retry(retry));
    let route = ProxyMsg::Route {
        exec: EXEC,
        engine: EngineIx::Cell(0),
    };
    sim.inject(TESTER, proxy, route);
    let call = ProxyMsg::Call {
        call: CALL,
        prompt_tokens: 4,
        prompt: BlobId(7),
        reply_to: exec.into(),
    };
    sim.inject(TESTER, proxy, call);
    Rig {
        sim,
        proxy,
        engines,
        exec,
    }
}

impl Rig {
    /// The attempts engine `i` was sent, with when they arrived.
    fn served(&mut self, i: usize) -> Vec<(Nanos, u32)> {
        self.sim.run().unwrap();
        self.sim
            .take_probe(self.engines[i])
            .into_iter()
            .filter_map(|r| match r.msg {
                EngineReq::Serve { attempt, .. } => Some((r.at, attempt)),
                _ => None,
            })
            .collect()
    }

    fn answer(&mut self, e: CallEvent) {
        self.sim.inject(TESTER, self.proxy, ProxyMsg::Engine(e));
    }

    fn reject(&mut self, attempt: u32) {
        self.answer(CallEvent::Rejected {
            call: CALL,
            attempt,
        });
    }

    fn reroute(&mut self, to: EngineIx) {
        let notify = self.sim.probe::<CellMsg>(NodeId(4));
        let moves = vec![(EXEC, to)];
        let msg = ProxyMsg::Reroute {
            switch: SwitchId(1),
            moves,
            notify: notify.into(),
        };
        self.sim.inject(TESTER, self.proxy, msg);
    }

    fn stats(&self) -> ProxyStats {
        self.sim.actor(self.proxy).unwrap().stats()
    }
}

#[test]
fn a_rejected_call_is_retried_on_its_engine_with_backoff_then_held_for_a_reroute() {
    let backoff = 100 * MILLIS;
    let mut r = rig(RejectRetry {
        retries: 2,
        backoff,
    });
    let first = r.served(0);
    assert_eq!(first.iter().map(|s| s.1).collect::<Vec<_>>(), [1]);
    let t0 = r.sim.now();
    r.reject(1);
    let second = r.served(0);
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].1, 2);
    assert!(second[0].0 >= t0 + backoff, "waited its backoff");
    let t1 = r.sim.now();
    r.reject(2);
    let third = r.served(0);
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].1, 3);
    assert!(third[0].0 >= t1 + 2 * backoff, "the backoff doubles");
    // Retries spent: the call is held, on no engine, until it moves.
    r.reject(3);
    assert!(r.served(0).is_empty());
    assert!(r.served(1).is_empty());
    r.reroute(EngineIx::Cell(1));
    let moved = r.served(1);
    assert_eq!(moved.iter().map(|s| s.1).collect::<Vec<_>>(), [4]);
    let s = r.stats();
    assert_eq!((s.same_engine_retries, s.held, s.retries), (2, 1, 3));
    // The new engine answers; the execution hears once.
    r.answer(CallEvent::Done {
        call: CALL,
        attempt: 4,
        output_tokens: 1,
        version: 0,
        output: BlobId::NONE,
    });
    r.sim.run().unwrap();
    assert_eq!(r.sim.take_probe(r.exec).len(), 1);
}

#[test]
fn a_reroute_during_a_backoff_sends_the_call_once_on_the_new_route() {
    let mut r = rig(RejectRetry {
        retries: 3,
        backoff: 500 * MILLIS,
    });
    assert_eq!(r.served(0).len(), 1);
    r.reject(1);
    // Before the backoff ends, the call's execution moves.
    r.reroute(EngineIx::Cell(1));
    r.sim.run().unwrap();
    assert_eq!(
        r.served(1).iter().map(|s| s.1).collect::<Vec<_>>(),
        [2],
        "sent at once on the new route"
    );
    assert!(r.served(0).is_empty(), "the ended backoff sends nothing");
}

#[test]
fn without_the_knob_or_for_a_cancel_the_call_is_held_as_before() {
    let mut r = rig(RejectRetry::default());
    assert_eq!(r.served(0).len(), 1);
    r.reject(1);
    assert!(r.served(0).is_empty());
    assert_eq!(r.stats().held, 1);

    let mut r = rig(RejectRetry {
        retries: 3,
        backoff: MILLIS,
    });
    assert_eq!(r.served(0).len(), 1);
    r.answer(CallEvent::Cancelled {
        call: CALL,
        attempt: 1,
    });
    assert!(r.served(0).is_empty(), "a cancel is a role change: held");
    assert_eq!(r.stats().same_engine_retries, 0);
}

impl Rig {
    /// The attempt numbers engine `i` was sent.
    fn attempts(&mut self, i: usize) -> Vec<u32> {
        self.served(i).into_iter().map(|s| s.1).collect()
    }

    /// Engine 0's node is lost with no slot free elsewhere: the execution
    /// has no route, and its call waits.
    fn lose_engine_0(&mut self) {
        let lost = ProxyMsg::EngineLost {
            engine: EngineIx::Cell(0),
            moves: vec![(EXEC, None)],
        };
        self.sim.inject(TESTER, self.proxy, lost);
    }

    fn lend(&mut self, engines: &[EngineIx]) {
        let engines = engines.to_vec();
        self.sim
            .inject(TESTER, self.proxy, ProxyMsg::Lend { engines });
    }

    fn answers(&mut self) -> Vec<CallId> {
        self.sim.run().unwrap();
        self.sim
            .take_probe(self.exec)
            .into_iter()
            .filter_map(|r| match r.msg {
                ExecMsg::Answer { call, .. } => Some(call),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_call_without_a_slot_is_served_as_a_guest_by_a_lending_engine() {
    let mut r = rig(RejectRetry::default());
    assert_eq!(r.served(0).len(), 1);
    r.lose_engine_0();
    assert!(r.served(1).is_empty());
    // Engine 1 lends itself: the call goes there, without a route.
    r.lend(&[EngineIx::Cell(1)]);
    assert_eq!(r.attempts(1), [2]);
    assert_eq!(r.sim.actor(r.proxy).unwrap().route(EXEC), None);
    // Refused there with no other lender: held until the lenders change.
    r.reject(2);
    assert!(r.served(1).is_empty());
    r.lend(&[EngineIx::Cell(1), EngineIx::Cell(0)]);
    assert_eq!(r.attempts(1), [3]);
    // A second unplaced execution's call goes to the lender with fewer
    // attempts in flight.
    let other = CallId {
        exec: ExecId(2),
        seq: 0,
    };
    let call = ProxyMsg::Call {
        call: other,
        prompt_tokens: 4,
        prompt: BlobId(8),
        reply_to: r.exec.into(),
    };
    r.sim.inject(TESTER, r.proxy, call);
    assert_eq!(r.attempts(0), [1]);
    // A slot frees and the first execution is placed while its guest call
    // runs: the call is not sent again, and its answer is delivered once.
    let route = ProxyMsg::Route {
        exec: EXEC,
        engine: EngineIx::Cell(0),
    };
    r.sim.inject(TESTER, r.proxy, route);
    assert!(r.served(0).is_empty());
    let done = CallEvent::Done {
        call: CALL,
        attempt: 3,
        output_tokens: 5,
        version: 0,
        output: BlobId(9),
    };
    r.answer(done);
    assert_eq!(r.answers(), [CALL]);
    assert_eq!(r.stats().lent, 3);
    // Nothing lends once every execution has a slot.
    r.lend(&[]);
    assert!(r.served(0).is_empty() && r.served(1).is_empty());
}

#[test]
fn a_guest_call_cancelled_by_a_switch_moves_to_another_lender() {
    let mut r = rig(RejectRetry::default());
    assert_eq!(r.served(0).len(), 1);
    r.lose_engine_0();
    r.lend(&[EngineIx::Cell(1), EngineIx::Cell(0)]);
    assert_eq!(r.attempts(1), [2]);
    r.answer(CallEvent::Cancelled {
        call: CALL,
        attempt: 2,
    });
    assert_eq!(r.attempts(0), [3]);
    // An engine lost while it serves a guest stops lending; the call goes
    // to the lender left.
    let lost = ProxyMsg::EngineLost {
        engine: EngineIx::Cell(0),
        moves: Vec::new(),
    };
    r.sim.inject(TESTER, r.proxy, lost);
    assert_eq!(r.attempts(1), [4]);
}
