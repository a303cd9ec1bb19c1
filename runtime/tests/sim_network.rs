//! The modelled network: latency, FIFO versus reordering links, loss,
//! duplication, partitions and their healing, per-link overrides.

use gyre_runtime::sim::{Latency, LinkModel, Sim, SimConfig};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, MICROS, MILLIS, NodeId};

/// Records the order messages arrive in.
struct Receiver {
    log: Vec<u32>,
}

impl Actor for Receiver {
    type Msg = u32;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, n: u32, _cx: &mut Cx<'_, Self>) {
        self.log.push(n);
    }
}

/// Sends `0..count`, one every 10µs, so that random latencies can overtake.
struct Sender {
    to: Addr<Receiver>,
    next: u32,
    count: u32,
}

impl Actor for Sender {
    type Msg = ();
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.set_timer((), 0);
    }

    fn on_msg(&mut self, _from: ActorId, _msg: (), _cx: &mut Cx<'_, Self>) {}

    fn on_timer(&mut self, _t: (), cx: &mut Cx<'_, Self>) {
        cx.send(self.to, self.next);
        self.next += 1;
        if self.next < self.count {
            cx.set_timer((), 10 * MICROS);
        }
    }
}

fn random_link(fifo: bool) -> LinkModel {
    LinkModel {
        latency: Latency::Uniform {
            min: 0,
            max: 2 * MILLIS,
        },
        loss: 0.0,
        duplicate: 0.0,
        fifo,
    }
}

fn arrival_order(seed: u64, link: LinkModel) -> Vec<u32> {
    let mut cfg = SimConfig::new(seed);
    cfg.default_link = link;
    let mut sim = Sim::new(cfg);
    let rx = sim.spawn(NodeId(0), Receiver { log: Vec::new() });
    sim.spawn(
        NodeId(1),
        Sender {
            to: rx,
            next: 0,
            count: 50,
        },
    );
    sim.run().unwrap();
    assert_eq!(sim.stats().delivered, 50);
    sim.actor(rx).unwrap().log.clone()
}

#[test]
fn fifo_link_never_reorders() {
    let sorted: Vec<u32> = (0..50).collect();
    for seed in 0..30 {
        assert_eq!(
            arrival_order(seed, random_link(true)),
            sorted,
            "seed {seed}"
        );
    }
}

#[test]
fn non_fifo_link_reorders() {
    let sorted: Vec<u32> = (0..50).collect();
    let reordered = (0..30)
        .filter(|seed| arrival_order(*seed, random_link(false)) != sorted)
        .count();
    assert!(reordered > 0, "no seed reordered a non-FIFO link");
}

#[test]
fn constant_latency_is_exact_and_local_links_are_instant() {
    let mut sim = Sim::new(SimConfig::new(1));
    let local = sim.probe::<u32>(NodeId(0));
    let remote = sim.probe::<u32>(NodeId(1));
    let other = sim.probe::<u32>(NodeId(2));
    sim.set_link(NodeId(0), NodeId(2), LinkModel::constant(5 * MILLIS));
    let me = ActorId::new(0, 99);
    sim.inject(me, local, 1u32);
    sim.inject(me, remote, 2u32);
    sim.inject(me, other, 3u32);
    sim.run().unwrap();
    let at = |v: Vec<gyre_runtime::sim::Received<u32>>| {
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].from, me);
        v[0].at
    };
    assert_eq!(at(sim.take_probe(local)), 0);
    // The default link between nodes is a constant 100µs.
    assert_eq!(at(sim.take_probe(remote)), 100 * MICROS);
    assert_eq!(at(sim.take_probe(other)), 5 * MILLIS);
    assert!(sim.take_probe(other).is_empty(), "taking empties the probe");
}

#[test]
fn total_loss_delivers_nothing_and_counts_it() {
    let mut cfg = SimConfig::new(3);
    cfg.default_link = LinkModel::lossy(Latency::Const(MILLIS), 1.0);
    let mut sim = Sim::new(cfg);
    let probe = sim.probe::<u32>(NodeId(1));
    let local = sim.probe::<u32>(NodeId(0));
    for n in 0..10u32 {
        sim.inject(ActorId::new(0, 50), probe, n);
    }
    sim.inject(ActorId::new(0, 50), local, 99u32);
    sim.run().unwrap();
    assert!(sim.take_probe(probe).is_empty());
    assert_eq!(
        sim.take_probe(local).len(),
        1,
        "the local link is not lossy"
    );
    let s = sim.stats();
    assert_eq!((s.sent, s.dropped_loss, s.delivered), (11, 10, 1), "{s:?}");
}

#[test]
fn partial_loss_drops_about_its_share() {
    let mut cfg = SimConfig::new(4);
    cfg.default_link = LinkModel::lossy(Latency::Const(MICROS), 0.3);
    let mut sim = Sim::new(cfg);
    let probe = sim.probe::<u32>(NodeId(1));
    for n in 0..2000u32 {
        sim.inject(ActorId::new(0, 7), probe, n);
    }
    sim.run().unwrap();
    let got = sim.take_probe(probe).len() as u64;
    assert_eq!(got + sim.stats().dropped_loss, 2000);
    assert!((1250..1550).contains(&got), "delivered {got}");
}

#[test]
fn partition_drops_both_ways_until_heal() {
    let mut sim = Sim::new(SimConfig::new(5));
    let a = sim.probe::<u32>(NodeId(0));
    let b = sim.probe::<u32>(NodeId(1));
    let c = sim.probe::<u32>(NodeId(2));
    // One message is in flight when the cut happens: it is lost too.
    sim.inject(a.id(), b, 0u32);
    sim.run_until(10 * MICROS).unwrap();
    sim.partition(NodeId(1), NodeId(0));
    sim.inject(a.id(), b, 1u32);
    sim.inject(b.id(), a, 2u32);
    sim.inject(a.id(), c, 3u32);
    sim.run().unwrap();
    assert!(sim.take_probe(a).is_empty());
    assert!(sim.take_probe(b).is_empty());
    assert_eq!(sim.take_probe(c).len(), 1, "other links are unaffected");
    assert_eq!(sim.stats().dropped_partition, 3);

    sim.heal(NodeId(0), NodeId(1));
    sim.inject(a.id(), b, 4u32);
    sim.inject(b.id(), a, 5u32);
    sim.run().unwrap();
    assert_eq!(sim.take_probe(b)[0].msg, 4);
    assert_eq!(sim.take_probe(a)[0].msg, 5);
    assert_eq!(sim.stats().dropped_partition, 3);
}

#[test]
fn duplication_delivers_copies_through_the_codec() {
    let mut cfg = SimConfig::new(6);
    cfg.default_link = LinkModel {
        duplicate: 1.0,
        ..LinkModel::constant(MICROS)
    };
    let mut sim = Sim::new(cfg);
    let probe: Addr<External<String>> = sim.probe(NodeId(1));
    sim.inject(ActorId::new(0, 1), probe, "x".to_owned());
    sim.inject(ActorId::new(0, 1), probe, "y".to_owned());
    sim.run().unwrap();
    let got: Vec<String> = sim.take_probe(probe).into_iter().map(|r| r.msg).collect();
    assert_eq!(got, ["x", "x", "y", "y"]);
    assert_eq!(sim.stats().duplicated, 2);
    assert_eq!(sim.stats().delivered, 4);
}

#[test]
fn duplication_is_off_by_default() {
    let cfg = SimConfig::new(0);
    assert_eq!(cfg.default_link.duplicate, 0.0);
    assert_eq!(cfg.local_link, LinkModel::instant());
    assert!(cfg.default_link.fifo);
}
