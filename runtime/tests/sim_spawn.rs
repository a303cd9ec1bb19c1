//! Spawning from inside a handler and stopping: children get ids from their
//! node's counter and start after the parent's handler; a stopping actor's
//! recorded effects still happen, and nothing reaches it afterwards.

use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{Actor, ActorId, Addr, Cx, MILLIS, Nanos, NodeId};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum ParentMsg {
    Spawn(u32),
    Done { n: u32, started_at: Nanos },
}

#[derive(Default)]
struct Parent {
    children: Vec<Addr<Child>>,
    done: Vec<(ActorId, u32, Nanos)>,
}

impl Actor for Parent {
    type Msg = ParentMsg;
    type Timer = ();

    fn on_msg(&mut self, from: ActorId, msg: ParentMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            ParentMsg::Spawn(count) => {
                for i in 0..count {
                    let child = cx.spawn(Child {
                        parent: cx.me(),
                        started_at: None,
                    });
                    // Sent right after the spawn: the child starts first.
                    cx.send(child, i);
                    self.children.push(child);
                }
            }
            ParentMsg::Done { n, started_at } => self.done.push((from, n, started_at)),
        }
    }
}

struct Child {
    parent: Addr<Parent>,
    started_at: Option<Nanos>,
}

impl Actor for Child {
    type Msg = u32;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        self.started_at = Some(cx.now());
        // Would fire after the child stopped: it must not.
        cx.set_timer((), MILLIS);
    }

    fn on_msg(&mut self, _from: ActorId, i: u32, cx: &mut Cx<'_, Self>) {
        let started_at = self.started_at.unwrap_or(Nanos::MAX);
        cx.stop();
        // Recorded after stop, still carried out.
        cx.send(
            self.parent,
            ParentMsg::Done {
                n: i * 10,
                started_at,
            },
        );
    }

    fn on_timer(&mut self, _t: (), _cx: &mut Cx<'_, Self>) {
        panic!("a stopped actor's timer fired");
    }
}

#[test]
fn children_spawn_start_reply_and_stop() {
    let mut sim = Sim::new(SimConfig::new(1));
    let parent = sim.spawn(NodeId(3), Parent::default());
    sim.run_until(2 * MILLIS).unwrap();
    sim.inject(ActorId::new(0, 0), parent, ParentMsg::Spawn(3));
    sim.run().unwrap();

    let p = sim.actor(parent).unwrap();
    let ids: Vec<ActorId> = p.children.iter().map(|c| c.id()).collect();
    // The node's counter starts at 1: the parent was 1, its children 2, 3, 4.
    assert_eq!(parent.id(), ActorId::new(3, 1));
    assert_eq!(
        ids,
        vec![ActorId::new(3, 2), ActorId::new(3, 3), ActorId::new(3, 4)]
    );
    // The injection crossed the 100µs link from node 0.
    let t = 2 * MILLIS + 100_000;
    let done: Vec<(ActorId, u32, Nanos)> = p.done.clone();
    assert_eq!(done, vec![(ids[0], 0, t), (ids[1], 10, t), (ids[2], 20, t)]);
    for id in &ids {
        assert!(!sim.is_alive(*id), "{id} stopped");
    }
    assert_eq!(sim.view().ids().collect::<Vec<_>>(), vec![parent.id()]);
    assert_eq!(sim.now(), t, "stopped actors' timers do not move the clock");

    // Messages to a stopped child are dropped and counted.
    let before = sim.stats().dropped_dead;
    sim.inject(parent.id(), p.children[0], 5u32);
    sim.run().unwrap();
    assert_eq!(sim.stats().dropped_dead, before + 1);
    assert!(!sim.restart(ids[0]), "a stopped actor cannot be restarted");
}

#[test]
fn spawned_worlds_replay_identically() {
    let run = |seed| {
        let mut sim = Sim::new(SimConfig::new(seed));
        let parent = sim.spawn(NodeId(0), Parent::default());
        sim.inject(ActorId::new(1, 0), parent, ParentMsg::Spawn(20));
        sim.run().unwrap();
        (sim.trace_hash(), sim.events())
    };
    assert_eq!(run(4), run(4));
}
