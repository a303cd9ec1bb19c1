//! Crashes and restarts: a crash loses state, timers and pending I/O; while
//! down, messages are dropped and counted; a restart rebuilds the actor under
//! the same id and runs `on_start` again. Node crashes and partitions reach
//! watchers as `on_peer_down`.

use gyre_runtime::sim::{Latency, Sim, SimConfig};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, IoError, IoRequest, MILLIS, NodeId};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Report {
    Started,
    Tick(u32),
    Done(u32),
    PeerDown(NodeId),
}

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Inc,
    Arm(u64),
    Work(u32),
    #[serde(skip)]
    WorkDone(Result<u32, IoError>),
}

struct Doubler(u32);

impl IoRequest for Doubler {
    type Output = u32;
    fn kind(&self) -> &'static str {
        "double"
    }
    fn run(self) -> Result<u32, IoError> {
        Ok(self.0 * 2)
    }
}

struct Counter {
    count: u32,
    report: Addr<External<Report>>,
}

impl Actor for Counter {
    type Msg = Msg;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.send(self.report, Report::Started);
    }

    fn on_msg(&mut self, _from: ActorId, msg: Msg, cx: &mut Cx<'_, Self>) {
        match msg {
            Msg::Inc => self.count += 1,
            Msg::Arm(after) => cx.set_timer((), after),
            Msg::Work(n) => cx.io(Doubler(n), Msg::WorkDone),
            Msg::WorkDone(r) => {
                if let Ok(n) = r {
                    cx.send(self.report, Report::Done(n));
                }
            }
        }
    }

    fn on_timer(&mut self, _t: (), cx: &mut Cx<'_, Self>) {
        cx.send(self.report, Report::Tick(self.count));
    }
}

fn reports(sim: &mut Sim, probe: Addr<External<Report>>) -> Vec<(u64, Report)> {
    sim.take_probe(probe)
        .into_iter()
        .map(|r| (r.at, r.msg))
        .collect()
}

#[test]
fn crash_then_restart_resets_state_and_forgets_timers() {
    let mut sim = Sim::new(SimConfig::new(1));
    let probe = sim.probe::<Report>(NodeId(0));
    let counter = sim.spawn_restartable(NodeId(0), move || Counter {
        count: 0,
        report: probe,
    });
    let me = probe.id();
    for _ in 0..3 {
        sim.inject(me, counter, Msg::Inc);
    }
    sim.inject(me, counter, Msg::Arm(5 * MILLIS));
    sim.run_until(MILLIS).unwrap();
    assert_eq!(sim.actor(counter).unwrap().count, 3);
    assert_eq!(reports(&mut sim, probe), vec![(0, Report::Started)]);

    assert!(sim.crash(counter.id()));
    assert!(sim.actor(counter).is_none());
    assert!(!sim.is_alive(counter.id()));
    sim.inject(me, counter, Msg::Inc);
    sim.inject(me, counter, Msg::Inc);
    sim.run_until(2 * MILLIS).unwrap();
    assert_eq!(sim.stats().dropped_dead, 2);

    // Restarted at 2ms; the new incarnation arms its own timer (reusing
    // token numbers) for 12ms. The old one, due at 5ms, must not fire it.
    assert!(sim.restart(counter.id()));
    sim.inject(me, counter, Msg::Inc);
    sim.inject(me, counter, Msg::Arm(10 * MILLIS));
    sim.run().unwrap();
    assert_eq!(
        reports(&mut sim, probe),
        vec![
            (2 * MILLIS, Report::Started),
            (12 * MILLIS, Report::Tick(1))
        ]
    );
    assert_eq!(sim.actor(counter).unwrap().count, 1);
    assert_eq!(sim.now(), 12 * MILLIS, "stale timers do not move the clock");
}

#[test]
fn plain_actors_stay_down_and_restart_says_so() {
    let mut sim = Sim::new(SimConfig::new(2));
    let probe = sim.probe::<Report>(NodeId(0));
    let counter = sim.spawn(
        NodeId(0),
        Counter {
            count: 0,
            report: probe,
        },
    );
    sim.run().unwrap();
    assert!(sim.crash(counter.id()));
    assert!(!sim.crash(counter.id()), "already down");
    assert!(!sim.restart(counter.id()));
    assert!(!sim.restart(ActorId::new(9, 9)), "unknown id");
    sim.inject(probe.id(), counter, Msg::Inc);
    sim.inject(
        probe.id(),
        Addr::<Counter>::new(ActorId::new(7, 7)),
        Msg::Inc,
    );
    sim.run().unwrap();
    assert_eq!(sim.stats().dropped_dead, 2);
}

#[test]
fn io_of_a_crashed_incarnation_never_completes() {
    let mut cfg = SimConfig::new(3);
    cfg.io = cfg.io.with_kind("double", Latency::Const(5 * MILLIS), 0.0);
    let mut sim = Sim::new(cfg);
    let probe = sim.probe::<Report>(NodeId(0));
    let counter = sim.spawn_restartable(NodeId(0), move || Counter {
        count: 0,
        report: probe,
    });
    sim.inject(probe.id(), counter, Msg::Work(4));
    sim.run_until(MILLIS).unwrap();
    sim.crash(counter.id());
    sim.run_until(2 * MILLIS).unwrap();
    sim.restart(counter.id());
    sim.run().unwrap();
    let got = reports(&mut sim, probe);
    assert!(
        !got.iter().any(|(_, r)| matches!(r, Report::Done(_))),
        "{got:?}"
    );
    assert_eq!(sim.stats().io_dropped, 1);

    // The lost completion was still due (and counted) at 5ms.
    assert_eq!(sim.now(), 5 * MILLIS);
    // The new incarnation's own I/O completes.
    sim.inject(probe.id(), counter, Msg::Work(4));
    sim.run().unwrap();
    assert_eq!(
        reports(&mut sim, probe),
        vec![(10 * MILLIS, Report::Done(8))]
    );
}

/// Watches a node and reports when it goes down.
struct Watcher {
    node: NodeId,
    report: Addr<External<Report>>,
}

impl Actor for Watcher {
    type Msg = ();
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.watch_node(self.node);
    }

    fn on_msg(&mut self, _from: ActorId, _msg: (), _cx: &mut Cx<'_, Self>) {}

    fn on_peer_down(&mut self, node: NodeId, cx: &mut Cx<'_, Self>) {
        cx.send(self.report, Report::PeerDown(node));
    }
}

#[test]
fn node_crash_downs_its_actors_and_tells_watchers() {
    let mut sim = Sim::new(SimConfig::new(4));
    let probe = sim.probe::<Report>(NodeId(0));
    sim.spawn(
        NodeId(0),
        Watcher {
            node: NodeId(1),
            report: probe,
        },
    );
    let p = probe;
    let restartable = sim.spawn_restartable(NodeId(1), move || Counter {
        count: 0,
        report: p,
    });
    let plain = sim.spawn(
        NodeId(1),
        Counter {
            count: 0,
            report: probe,
        },
    );
    sim.run_until(MILLIS).unwrap();
    sim.take_probe(probe);

    assert_eq!(sim.crash_node(NodeId(1)), 2);
    sim.run().unwrap();
    let got = reports(&mut sim, probe);
    // Watcher and probe share node 0, so the notice arrives at once.
    assert_eq!(got, vec![(MILLIS, Report::PeerDown(NodeId(1)))]);
    assert!(!sim.is_alive(restartable.id()) && !sim.is_alive(plain.id()));

    assert_eq!(sim.restart_node(NodeId(1)), 1);
    sim.run().unwrap();
    assert!(sim.is_alive(restartable.id()));
    assert!(!sim.is_alive(plain.id()));
}

#[test]
fn partition_tells_watchers_on_either_side_only() {
    let mut sim = Sim::new(SimConfig::new(5));
    let probe = sim.probe::<Report>(NodeId(0));
    let watch = |sim: &mut Sim, on: u32, node: u32| {
        sim.spawn(
            NodeId(on),
            Watcher {
                node: NodeId(node),
                report: probe,
            },
        )
    };
    let near = watch(&mut sim, 0, 1);
    watch(&mut sim, 2, 1); // watches node 1 but is not cut from it
    sim.spawn(
        NodeId(1),
        Counter {
            count: 0,
            report: probe,
        },
    );
    sim.run().unwrap();
    sim.take_probe(probe);

    sim.partition(NodeId(0), NodeId(1));
    sim.partition(NodeId(1), NodeId(0)); // already cut: no second notice
    sim.run().unwrap();
    let got = sim.take_probe(probe);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].from, near.id());
    assert_eq!(got[0].msg, Report::PeerDown(NodeId(1)));
}
