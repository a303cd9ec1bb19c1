//! Record and replay: a recorded embedded run (`gyre train --record`)
//! replayed in the simulator (`gyre simulate --replay`) gives every
//! recorded step time within 10% and the same role changes in every burst;
//! recording changes nothing in the run. On the simulator host the record
//! is of a deterministic run whose every cost it holds (the engines'
//! control operations with their queueing, the serial transfer worker), so
//! the replay reproduces it: every step time, every role change and every
//! dispatch to the nanosecond.

use gyre::embedded::cluster::EmbeddedConfig;
use gyre::embedded::record::run_recorded;
use gyre::embedded::run::run;
use gyre_simulations::replay::{read, replay};

#[test]
fn a_recorded_run_replays_within_ten_percent_per_step_with_the_same_role_changes() {
    let cfg = EmbeddedConfig::tiny(1).with_steps(6);
    let (report, rec) = run_recorded(&cfg, &mut |_, _| {}).expect("the recorded run completes");
    let (_, plain) = run(&cfg, &mut |_, _| {}).expect("the plain run completes");
    assert_eq!(
        report.trace_hash, plain.trace_hash,
        "recording adds no event"
    );
    assert_eq!(report.events, plain.events);

    // Through the file format and back.
    let mut text = Vec::new();
    rec.write(&mut text).unwrap();
    let back = read(text.as_slice()).expect("the record reads back");
    assert_eq!(back, rec);
    assert_eq!(back.steps.len(), 6);
    assert!(back.executions.iter().all(|e| !e.calls.is_empty()));
    assert!(back.switches.len() >= 6, "{:?}", back.switches);
    assert!(back.ops.iter().any(|o| o.op == "trainer.fwd_bwd"));
    // The engines' controls, with how long each queued behind the job in
    // flight: what the replay prices them at.
    for kind in [
        "engine.pin",
        "engine.cancel",
        "engine.unload",
        "engine.load",
    ] {
        assert!(
            back.ops
                .iter()
                .any(|o| o.op == kind && o.queued_ns.is_some()),
            "no {kind} with its queueing in the record"
        );
    }
    assert!(
        back.ops.iter().any(|o| o.queued_ns.unwrap_or(0) > 0),
        "nothing ever queued"
    );

    let r = replay(&back).expect("the replay runs");
    assert_eq!(r.steps.len(), 6);
    for s in &r.steps {
        // The bound, and on this host the exact step time.
        assert!(
            s.error.abs() < 0.10,
            "step {}: recorded {} ns, simulated {} ns",
            s.step,
            s.recorded_ns,
            s.simulated_ns
        );
        assert_eq!(s.simulated_ns, s.recorded_ns, "step {}", s.step);
    }
    assert!(!r.bursts.is_empty());
    for b in &r.bursts {
        assert_eq!(b.simulated, b.recorded, "role changes of burst {}", b.burst);
    }
    assert!(r.same_role_changes);
    let switch_times = |s: &[gyre_simulations::replay::schema::Switch]| -> Vec<(u32, u64, u64)> {
        s.iter().map(|s| (s.cell, s.begin_ns, s.end_ns)).collect()
    };
    assert_eq!(
        switch_times(&r.simulated_switches),
        switch_times(&back.switches),
        "every switch begins and ends when it did"
    );
    for e in &back.executions {
        if let Some(d) = e.dispatch_ns {
            assert_eq!(
                r.simulated_dispatch.get(e.exec as usize),
                Some(&d),
                "execution {} dispatched when it was",
                e.exec
            );
        }
    }

    // The side-by-side timeline (`--plots`): both runs, the shared legend.
    let svg = std::env::temp_dir().join(format!("gyre-replay-{}.svg", std::process::id()));
    gyre_simulations::replay::plot::draw(&r, &svg).expect("the timeline is drawn");
    let text = std::fs::read_to_string(&svg).expect("the timeline is written");
    let _ = std::fs::remove_file(&svg);
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    for label in [
        "recorded",
        "simulated (replay)",
        "rollout",
        "switching",
        "training",
    ] {
        assert!(text.contains(label), "no {label:?} in the timeline");
    }
}
