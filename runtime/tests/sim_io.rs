//! Modelled I/O: per-kind latency, per-kind injected failures, completions
//! delivered to the issuer as its own message.

use gyre_runtime::sim::{IoKindModel, Latency, Sim, SimConfig};
use gyre_runtime::{Actor, ActorId, Cx, IoError, IoRequest, MILLIS, Nanos, NodeId};
use serde::{Deserialize, Serialize};

struct Square {
    kind: &'static str,
    n: u64,
}

impl IoRequest for Square {
    type Output = u64;
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn run(self) -> Result<u64, IoError> {
        Ok(self.n * self.n)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Kind {
    Fast,
    Slow,
    Other,
    Flaky,
    Sometimes,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fast => "fast",
            Kind::Slow => "slow",
            Kind::Other => "other",
            Kind::Flaky => "flaky",
            Kind::Sometimes => "sometimes",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Go(Kind, u64),
    #[serde(skip)]
    Done(Kind, u64, Result<u64, IoError>),
}

/// One completion, as the issuer saw it.
#[derive(Debug, Clone, PartialEq)]
struct Done {
    at: Nanos,
    kind: Kind,
    n: u64,
    result: Result<u64, IoError>,
    from: ActorId,
}

#[derive(Default)]
struct Issuer {
    done: Vec<Done>,
}

impl Actor for Issuer {
    type Msg = Msg;
    type Timer = ();

    fn on_msg(&mut self, from: ActorId, msg: Msg, cx: &mut Cx<'_, Self>) {
        match msg {
            Msg::Go(kind, n) => {
                let req = Square {
                    kind: kind.name(),
                    n,
                };
                cx.io(req, move |r| Msg::Done(kind, n, r));
            }
            Msg::Done(kind, n, result) => self.done.push(Done {
                at: cx.now(),
                kind,
                n,
                result,
                from,
            }),
        }
    }
}

fn config(seed: u64) -> SimConfig {
    let mut cfg = SimConfig::new(seed);
    cfg.io.default = IoKindModel {
        latency: Latency::Const(3 * MILLIS),
        fail: 0.0,
    };
    cfg.io = cfg
        .io
        .with_kind("fast", Latency::Const(MILLIS), 0.0)
        .with_kind(
            "slow",
            Latency::Uniform {
                min: 10 * MILLIS,
                max: 20 * MILLIS,
            },
            0.0,
        )
        .with_kind("flaky", Latency::Const(MILLIS), 1.0)
        .with_kind("sometimes", Latency::Const(MILLIS), 0.25);
    cfg
}

#[test]
fn latency_is_modelled_per_kind() {
    let mut sim = Sim::new(config(1));
    let issuer = sim.spawn(NodeId(0), Issuer::default());
    let me = ActorId::new(0, 50);
    for (kind, n) in [(Kind::Slow, 5), (Kind::Other, 4), (Kind::Fast, 3)] {
        sim.inject(me, issuer, Msg::Go(kind, n));
    }
    sim.run().unwrap();
    let done = &sim.actor(issuer).unwrap().done;
    assert_eq!(done.len(), 3);
    let me_id = issuer.id();
    assert_eq!(
        done[0],
        Done {
            at: MILLIS,
            kind: Kind::Fast,
            n: 3,
            result: Ok(9),
            from: me_id, // a completion comes from its issuer
        }
    );
    assert_eq!(
        done[1],
        Done {
            at: 3 * MILLIS,
            kind: Kind::Other,
            n: 4,
            result: Ok(16),
            from: me_id,
        }
    );
    assert_eq!((done[2].kind, done[2].result.clone()), (Kind::Slow, Ok(25)));
    assert!((10 * MILLIS..=20 * MILLIS).contains(&done[2].at));
    assert_eq!(sim.stats().io_started, 3);
    assert_eq!(sim.stats().io_failed, 0);
}

#[test]
fn failures_are_injected_per_kind() {
    let mut sim = Sim::new(config(2));
    let issuer = sim.spawn(NodeId(0), Issuer::default());
    let me = ActorId::new(0, 50);
    sim.inject(me, issuer, Msg::Go(Kind::Flaky, 2));
    sim.inject(me, issuer, Msg::Go(Kind::Fast, 2));
    sim.run().unwrap();
    let done = &sim.actor(issuer).unwrap().done;
    assert_eq!(
        done[0].result,
        Err(IoError::Injected {
            kind: "flaky".into()
        })
    );
    assert_eq!(done[1].result, Ok(4));
    assert_eq!(sim.stats().io_failed, 1);
}

#[test]
fn failure_probability_is_honoured_and_replayable() {
    let failures = |seed| {
        let mut sim = Sim::new(config(seed));
        let issuer = sim.spawn(NodeId(0), Issuer::default());
        for n in 0..1000 {
            sim.inject(ActorId::new(0, 50), issuer, Msg::Go(Kind::Sometimes, n));
        }
        sim.run().unwrap();
        let done = &sim.actor(issuer).unwrap().done;
        assert_eq!(done.len(), 1000);
        let failed: Vec<u64> = done
            .iter()
            .filter(|d| d.result.is_err())
            .map(|d| d.n)
            .collect();
        assert_eq!(failed.len() as u64, sim.stats().io_failed);
        failed
    };
    let a = failures(3);
    assert!((180..320).contains(&a.len()), "{} failed", a.len());
    assert_eq!(a, failures(3), "the same seed fails the same requests");
    assert_ne!(a, failures(4));
}
