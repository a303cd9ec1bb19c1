//! Timers: re-arming replaces, cancelling disarms, stale firings are ignored
//! without moving the clock, and events due at the same instant run in the
//! order they were scheduled.

use gyre_runtime::sim::{Sim, SimConfig};
use gyre_runtime::{Actor, ActorId, Cx, MILLIS, Nanos, NodeId};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
enum Key {
    A,
    B,
    N(u8),
}

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Set(Key, Nanos),
    Cancel(Key),
    Note(u8),
}

#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Fired(Nanos, Key),
    Note(Nanos, u8),
}

#[derive(Default)]
struct Clock {
    seen: Vec<Seen>,
    armed_after_cancel: Option<bool>,
}

impl Actor for Clock {
    type Msg = Msg;
    type Timer = Key;

    fn on_msg(&mut self, _from: ActorId, msg: Msg, cx: &mut Cx<'_, Self>) {
        match msg {
            Msg::Set(k, after) => cx.set_timer(k, after),
            Msg::Cancel(k) => {
                cx.cancel_timer(&k);
                cx.cancel_timer(&k); // a second cancel is a no-op
                self.armed_after_cancel = Some(cx.timer_armed(&k));
            }
            Msg::Note(n) => self.seen.push(Seen::Note(cx.now(), n)),
        }
    }

    fn on_timer(&mut self, k: Key, cx: &mut Cx<'_, Self>) {
        self.seen.push(Seen::Fired(cx.now(), k));
    }
}

#[test]
fn rearm_replaces_and_cancel_disarms() {
    let mut sim = Sim::new(SimConfig::new(1));
    let clock = sim.spawn(NodeId(0), Clock::default());
    let me = ActorId::new(0, 100);
    sim.inject(me, clock, Msg::Set(Key::A, 5 * MILLIS));
    sim.inject(me, clock, Msg::Set(Key::B, 3 * MILLIS));
    sim.run_until(MILLIS).unwrap();
    sim.inject(me, clock, Msg::Set(Key::A, 10 * MILLIS));
    sim.inject(me, clock, Msg::Cancel(Key::B));
    sim.run().unwrap();
    let c = sim.actor(clock).unwrap();
    assert_eq!(c.seen, vec![Seen::Fired(11 * MILLIS, Key::A)]);
    assert_eq!(c.armed_after_cancel, Some(false));
}

#[test]
fn a_cancelled_timer_does_not_move_the_clock() {
    let mut sim = Sim::new(SimConfig::new(2));
    let clock = sim.spawn(NodeId(0), Clock::default());
    let me = ActorId::new(0, 100);
    sim.inject(me, clock, Msg::Set(Key::A, 60 * 1000 * MILLIS));
    sim.inject(me, clock, Msg::Cancel(Key::A));
    let stats = sim.run().unwrap();
    assert_eq!(sim.now(), 0);
    // Start and two deliveries; the stale timer is not an event.
    assert_eq!(stats.events, 3);
    assert_eq!(sim.pending(), 0);
}

#[test]
fn same_instant_events_run_in_schedule_order() {
    let mut sim = Sim::new(SimConfig::new(3));
    let clock = sim.spawn(NodeId(0), Clock::default());
    let me = ActorId::new(0, 100);
    // Keys set in an order unlike their own ordering, all due at 1ms.
    for n in [3u8, 1, 4, 0, 2] {
        sim.inject(me, clock, Msg::Set(Key::N(n), MILLIS));
    }
    sim.run_until(MILLIS / 2).unwrap();
    // Messages injected at 0.5ms run then, in injection order.
    for n in [9u8, 7, 8] {
        sim.inject(me, clock, Msg::Note(n));
    }
    sim.run().unwrap();
    let seen = &sim.actor(clock).unwrap().seen;
    let half = MILLIS / 2;
    let expected = vec![
        Seen::Note(half, 9),
        Seen::Note(half, 7),
        Seen::Note(half, 8),
        Seen::Fired(MILLIS, Key::N(3)),
        Seen::Fired(MILLIS, Key::N(1)),
        Seen::Fired(MILLIS, Key::N(4)),
        Seen::Fired(MILLIS, Key::N(0)),
        Seen::Fired(MILLIS, Key::N(2)),
    ];
    assert_eq!(seen, &expected);
}

/// On start: a zero-delay timer, then a message to itself; both are due
/// now, and the timer was scheduled first.
struct Racer {
    order: Vec<&'static str>,
}

impl Actor for Racer {
    type Msg = ();
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.set_timer((), 0);
        cx.send_self(());
    }

    fn on_msg(&mut self, _from: ActorId, _msg: (), _cx: &mut Cx<'_, Self>) {
        self.order.push("msg");
    }

    fn on_timer(&mut self, _t: (), _cx: &mut Cx<'_, Self>) {
        self.order.push("timer");
    }
}

#[test]
fn effects_are_scheduled_in_recorded_order() {
    let mut sim = Sim::new(SimConfig::new(4));
    let r = sim.spawn(NodeId(0), Racer { order: Vec::new() });
    sim.run().unwrap();
    assert_eq!(sim.actor(r).unwrap().order, ["timer", "msg"]);
}

#[test]
fn step_and_run_until_advance_one_event_and_to_a_time() {
    let mut sim = Sim::new(SimConfig::new(5));
    let clock = sim.spawn(NodeId(0), Clock::default());
    let me = ActorId::new(0, 100);
    sim.inject(me, clock, Msg::Set(Key::A, 2 * MILLIS));
    assert!(sim.step()); // start
    assert!(sim.step()); // the Set message
    assert_eq!(sim.events(), 2);
    let stats = sim.run_until(MILLIS).unwrap();
    assert_eq!((stats.events, stats.now), (0, MILLIS));
    assert_eq!(sim.now(), MILLIS);
    assert!(sim.step()); // the timer
    assert_eq!(sim.now(), 2 * MILLIS);
    assert!(!sim.step());
}

#[test]
fn max_events_bounds_a_run_that_would_not_end() {
    /// Re-arms itself forever.
    struct Forever;
    impl Actor for Forever {
        type Msg = ();
        type Timer = ();
        fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
            cx.set_timer((), 1);
        }
        fn on_msg(&mut self, _f: ActorId, _m: (), _cx: &mut Cx<'_, Self>) {}
        fn on_timer(&mut self, _t: (), cx: &mut Cx<'_, Self>) {
            cx.set_timer((), 1);
        }
    }
    let mut cfg = SimConfig::new(6);
    cfg.max_events = Some(1000);
    let mut sim = Sim::new(cfg);
    sim.spawn(NodeId(0), Forever);
    let stats = sim.run().unwrap();
    assert!(stats.limited);
    assert_eq!(stats.events, 1000);
    assert_eq!(sim.now(), 999);
}
