//! The invariant hook and the seed-sweep harness: invariants run after every
//! event and a violation stops the run with an error that carries the seed
//! and settings; sweeps honour a replay seed and name the failing one.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use gyre_runtime::sim::{
    FaultPlan, Sim, SimConfig, SimFailure, SimView, SweepError, check_seeds, sweep_seeds,
};
use gyre_runtime::{Actor, ActorId, Addr, Cx, NodeId};

#[derive(Default)]
struct Counter {
    count: u32,
}

impl Actor for Counter {
    type Msg = ();
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, _msg: (), _cx: &mut Cx<'_, Self>) {
        self.count += 1;
    }
}

/// Two counters on two nodes, and an invariant that logs what `read` sees
/// after every event.
type Logged<T> = (Sim, Addr<Counter>, Addr<Counter>, Rc<RefCell<Vec<T>>>);

fn two_counters_logging<T: 'static>(read: impl Fn(&SimView<'_>) -> T + 'static) -> Logged<T> {
    let mut sim = Sim::new(SimConfig::new(1));
    let a = sim.spawn(NodeId(0), Counter::default());
    let b = sim.spawn(NodeId(1), Counter::default());
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = Rc::clone(&seen);
    sim.set_invariant(move |view| {
        log.borrow_mut().push(read(view));
        Ok(())
    });
    (sim, a, b, seen)
}

#[test]
fn invariants_run_after_every_event_and_see_its_result() {
    let (mut sim, a, b, calls) = two_counters_logging(|view| {
        let total: u32 = view.actors::<Counter>().map(|(_, c)| c.count).sum();
        (view.events(), total)
    });
    let second = Rc::new(Cell::new(0u64));
    let n = Rc::clone(&second);
    sim.set_invariant(move |_| {
        n.set(n.get() + 1);
        Ok(())
    });
    for _ in 0..3 {
        sim.inject(a.id(), b, ());
    }
    sim.inject(b.id(), a, ());
    sim.run().unwrap();
    assert_eq!(sim.events(), 6);
    let calls = calls.borrow();
    // One call per event, after it: two starts, then four deliveries.
    assert_eq!(*calls, vec![(1, 0), (2, 0), (3, 1), (4, 2), (5, 3), (6, 4)]);
    assert_eq!(second.get(), 6, "every invariant runs");
    let ids: Vec<ActorId> = sim.view().ids().collect();
    assert_eq!(ids, vec![a.id(), b.id()]);
}

#[test]
fn the_view_names_the_actor_each_event_ran_on_and_counts_outside_changes() {
    let (mut sim, a, b, seen) =
        two_counters_logging(|view| (view.handled(), view.outside_changes()));
    sim.inject(a.id(), b, ());
    sim.inject(b.id(), a, ());
    sim.run().unwrap();
    // Two spawns counted before any event; then the starts and deliveries,
    // each on its own actor.
    assert_eq!(
        *seen.borrow(),
        vec![
            (Some(a.id()), 2),
            (Some(b.id()), 2),
            (Some(b.id()), 2),
            (Some(a.id()), 2),
        ]
    );
    // A crash outside any handler moves the count, and so does a state
    // change made through `actor_mut`.
    assert!(sim.crash(a.id()));
    sim.actor_mut(b).unwrap().count = 0;
    assert_eq!(sim.view().outside_changes(), 4);
}

#[test]
fn a_violation_stops_the_run_with_the_seed() {
    let seed = 77;
    let mut sim = Sim::new(SimConfig::new(seed));
    let c = sim.spawn(NodeId(0), Counter::default());
    sim.set_invariant(move |view| match view.actor(c) {
        Some(counter) if counter.count > 3 => Err(format!("count {} > 3", counter.count)),
        _ => Ok(()),
    });
    for _ in 0..10 {
        sim.inject(ActorId::new(0, 9), c, ());
    }
    let err = sim.run().unwrap_err();
    assert_eq!(err.seed, seed);
    match &err.failure {
        SimFailure::Invariant { event, message, .. } => {
            assert_eq!(*event, 5, "start plus the fourth delivery");
            assert_eq!(message, "count 4 > 3");
        }
        other => panic!("unexpected failure {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("GYRE_SEED=77"), "{text}");
    assert!(text.contains("seed 77"), "{text}");
    assert!(text.contains("latency"), "settings are described: {text}");
    // The run stopped right there.
    assert_eq!(sim.actor(c).unwrap().count, 4);
    assert!(sim.pending() > 0);
}

#[test]
fn step_halts_on_a_violation_until_the_failure_is_taken() {
    let mut sim = Sim::new(SimConfig::new(5));
    sim.spawn(NodeId(0), Counter::default());
    sim.set_invariant(|view| {
        if view.events() >= 1 {
            Err("no events allowed".into())
        } else {
            Ok(())
        }
    });
    sim.inject(
        ActorId::new(0, 9),
        gyre_runtime::Addr::<Counter>::new(ActorId::new(0, 0)),
        (),
    );
    assert!(sim.step());
    assert!(!sim.step(), "halted");
    assert!(sim.take_failure().is_some());
}

#[test]
fn a_failure_names_the_fault_plan_it_ran_under() {
    let plan = FaultPlan::from_seed(21);
    let described = plan.to_string();
    let sim = Sim::new(SimConfig::new(21)).with_faults(plan);
    let err = sim.fail("final state is wrong");
    let text = err.to_string();
    assert!(text.contains(&described), "{text}");
    assert!(text.contains("final state is wrong"), "{text}");
}

#[test]
fn sweep_runs_the_range_or_only_the_replay_seed() {
    let seen = RefCell::new(Vec::new());
    let ok = |seed| {
        seen.borrow_mut().push(seed);
        Ok(())
    };
    assert_eq!(sweep_seeds(None, 5, 10, ok).unwrap(), 5);
    assert_eq!(*seen.borrow(), vec![10, 11, 12, 13, 14]);
    seen.borrow_mut().clear();
    assert_eq!(sweep_seeds(Some("123"), 5, 10, ok).unwrap(), 1);
    assert_eq!(sweep_seeds(Some("0x10"), 5, 10, ok).unwrap(), 1);
    assert_eq!(*seen.borrow(), vec![123, 16]);
    seen.borrow_mut().clear();
    // An empty value means "not set".
    assert_eq!(sweep_seeds(Some(""), 2, 0, ok).unwrap(), 2);
    assert!(matches!(
        sweep_seeds(Some("twelve"), 5, 10, ok),
        Err(SweepError::BadSeed { .. })
    ));
}

#[test]
fn sweep_reports_the_first_failing_seed_with_its_settings() {
    let f = |seed: u64| {
        let sim = Sim::new(SimConfig::new(seed)).with_faults(FaultPlan::from_seed(seed));
        if seed == 13 {
            return Err(sim.fail("boom"));
        }
        Ok(())
    };
    let err = sweep_seeds(None, 10, 10, f).unwrap_err();
    match &err {
        SweepError::Failed { seed, error } => {
            assert_eq!(*seed, 13);
            assert_eq!(error.seed, 13);
        }
        other => panic!("unexpected {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("GYRE_SEED=13"), "{text}");
    assert!(
        text.contains(&FaultPlan::from_seed(13).to_string()),
        "{text}"
    );
}

#[test]
fn sweep_turns_a_panic_into_a_named_seed() {
    let err = sweep_seeds(None, 3, 0, |seed| {
        assert!(seed != 2, "actor code blew up");
        Ok(())
    })
    .unwrap_err();
    match err {
        SweepError::Panicked { seed, message } => {
            assert_eq!(seed, 2);
            assert!(message.contains("blew up"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn check_seeds_panics_with_the_replay_command() {
    let payload = std::panic::catch_unwind(|| {
        check_seeds(3, 40, |seed| {
            Err(Sim::new(SimConfig::new(seed)).fail("always"))
        });
    })
    .unwrap_err();
    let text = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("rerun with GYRE_SEED="), "{text}");
    assert!(text.contains("always"), "{text}");
}
