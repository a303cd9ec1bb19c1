//! Seed-derived fault plans, end to end: a small retrying protocol keeps its
//! safety invariant and finishes under every fault mix of a sweep; runs with
//! faults replay exactly; a protocol without retries is caught, and its seed
//! replays the same failure.

use gyre_runtime::sim::{
    FaultPlan, Sim, SimConfig, SimError, SweepError, check_seeds, sweep_seeds,
};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, MILLIS, NodeId};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum ServerMsg {
    Put { v: u64, reply: Addr<Client> },
}

/// Keeps the largest value it was given; forgets it when it crashes.
struct Server {
    value: u64,
    started: Addr<External<()>>,
}

impl Actor for Server {
    type Msg = ServerMsg;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.send(self.started, ());
    }

    fn on_msg(&mut self, _from: ActorId, msg: ServerMsg, cx: &mut Cx<'_, Self>) {
        let ServerMsg::Put { v, reply } = msg;
        self.value = self.value.max(v);
        cx.send(reply, ClientMsg::Ack(v));
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum ClientMsg {
    Ack(u64),
}

/// Writes 1..=goal one at a time, retrying on a timer when `retry`.
struct Client {
    server: Addr<Server>,
    next: u64,
    goal: u64,
    retry: bool,
}

impl Client {
    fn put(&self, cx: &mut Cx<'_, Self>) {
        cx.send(
            self.server,
            ServerMsg::Put {
                v: self.next,
                reply: cx.me(),
            },
        );
        if self.retry {
            cx.set_timer((), 5 * MILLIS);
        }
    }

    fn done(&self) -> bool {
        self.next > self.goal
    }
}

impl Actor for Client {
    type Msg = ClientMsg;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        self.put(cx);
    }

    fn on_msg(&mut self, _from: ActorId, msg: ClientMsg, cx: &mut Cx<'_, Self>) {
        let ClientMsg::Ack(v) = msg;
        if v == self.next && !self.done() {
            self.next += 1;
            cx.cancel_timer(&());
            if !self.done() {
                self.put(cx);
            }
        }
    }

    fn on_timer(&mut self, _t: (), cx: &mut Cx<'_, Self>) {
        self.put(cx);
    }
}

struct Outcome {
    hash: u64,
    events: u64,
    starts: usize,
    dropped_partition: u64,
}

fn scenario(seed: u64, retry: bool) -> Result<Outcome, SimError> {
    let mut cfg = SimConfig::new(seed);
    cfg.codec_roundtrip = true;
    cfg.max_events = Some(200_000);
    let mut sim = Sim::new(cfg).with_faults(FaultPlan::from_seed(seed));
    let started = sim.probe::<()>(NodeId(1));
    let server = sim.spawn_restartable(NodeId(1), move || Server { value: 0, started });
    let client = sim.spawn(
        NodeId(0),
        Client {
            server,
            next: 1,
            goal: 40,
            retry,
        },
    );
    // Safety: the server never holds a value the client has not sent yet.
    sim.set_invariant(move |view| {
        let (Some(s), Some(c)) = (view.actor(server), view.actor(client)) else {
            return Ok(());
        };
        if s.value > c.next {
            return Err(format!(
                "server holds {} but client is at {}",
                s.value, c.next
            ));
        }
        Ok(())
    });
    let stats = sim.run()?;
    // Liveness: the client finishes once faults are over.
    let client_state = sim.actor(client).map(|c| (c.next, c.done()));
    match client_state {
        Some((_, true)) if !stats.limited => {}
        other => return Err(sim.fail(format!("client did not finish: {other:?}"))),
    }
    Ok(Outcome {
        hash: sim.trace_hash(),
        events: sim.events(),
        starts: sim.take_probe(started).len(),
        dropped_partition: sim.stats().dropped_partition,
    })
}

#[test]
fn retrying_protocol_survives_every_fault_mix() {
    check_seeds(60, 1000, |seed| scenario(seed, true).map(|_| ()));
}

#[test]
fn the_fault_mixes_do_crash_and_partition() {
    let mut restarts = 0;
    let mut cut = 0;
    for seed in 0..40 {
        let o = scenario(seed, true).unwrap_or_else(|e| panic!("{e}"));
        restarts += o.starts - 1;
        cut += o.dropped_partition;
    }
    assert!(restarts > 0, "no seed crashed the server");
    assert!(cut > 0, "no seed partitioned the nodes");
}

#[test]
fn runs_with_faults_replay_exactly() {
    for seed in [3, 8, 21] {
        let a = scenario(seed, true).unwrap();
        let b = scenario(seed, true).unwrap();
        assert_eq!((a.hash, a.events, a.starts), (b.hash, b.events, b.starts));
    }
}

#[test]
fn a_protocol_without_retries_is_caught_and_its_seed_replays() {
    let err = sweep_seeds(None, 40, 0, |seed| scenario(seed, false).map(|_| ())).unwrap_err();
    let SweepError::Failed { seed, error } = err else {
        panic!("expected a failed seed, got {err}");
    };
    assert_eq!(error.seed, seed);
    let text = error.to_string();
    assert!(text.contains("client did not finish"), "{text}");
    assert!(
        text.contains(&FaultPlan::from_seed(seed).to_string()),
        "{text}"
    );

    // GYRE_SEED=<seed> runs just that seed, and it fails the same way.
    let replay = sweep_seeds(Some(&seed.to_string()), 40, 0, |s| {
        scenario(s, false).map(|_| ())
    })
    .unwrap_err();
    let SweepError::Failed {
        seed: again,
        error: replayed,
    } = replay
    else {
        panic!("replay did not fail");
    };
    assert_eq!(again, seed);
    assert_eq!(replayed.to_string(), text);
}
