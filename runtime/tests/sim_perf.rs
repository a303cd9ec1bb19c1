//! The simulator's hot path (a ping-pong between two actors on one node over
//! a zero-latency local link) counts every event exactly. Its speed is
//! measured by `cargo bench -p gyre-runtime --features actix --bench hosts`,
//! never by a timed test.

use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{Actor, ActorId, Addr, Cx, NodeId};

struct Ping {
    peer: Option<Addr<Ping>>,
    left: u64,
}

impl Actor for Ping {
    type Msg = u64;
    type Timer = ();

    fn on_msg(&mut self, from: ActorId, n: u64, cx: &mut Cx<'_, Self>) {
        if self.left == 0 {
            return;
        }
        self.left -= 1;
        let peer = self.peer.unwrap_or(Addr::new(from));
        cx.send(peer, n + 1);
    }
}

fn ping_pong(rounds: u64) -> (Sim, u64) {
    let mut sim = Sim::new(SimConfig::new(1));
    let a = sim.spawn(
        NodeId(0),
        Ping {
            peer: None,
            left: rounds,
        },
    );
    let b = sim.spawn(
        NodeId(0),
        Ping {
            peer: Some(a),
            left: rounds,
        },
    );
    sim.inject(b.id(), a, 0u64);
    let before = sim.events();
    sim.run().unwrap();
    let events = sim.events() - before;
    (sim, events)
}

#[test]
fn ping_pong_counts_every_event() {
    let (sim, events) = ping_pong(1000);
    // Two starts, then 2 * 1000 replies plus the injected first message.
    assert_eq!(events, 2 + 2001);
    assert_eq!(sim.stats().delivered, 2001);
}
