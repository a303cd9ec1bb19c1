//! A wide scan of the swarm (`gyre_simulations::swarm`), core crashes
//! included: runs seeds `BASE..BASE+COUNT` and prints each failing seed
//! with its failure, then a summary (seeds, crashes of the core's node,
//! violations, wall time), so that rare failures are found before CI's
//! 10,000 seeds meet them.
//!
//! `cargo run --release -p gyre-simulations --example core_swarm -- BASE COUNT [-v]`
//! (`-v`: the actors' log lines to stderr, for a replay of one seed;
//! `--live`: the live cluster's settings and faults, `swarm::live_swarm_config`
//! and `swarm::live_plan`).

use std::time::Instant;

use gyre_runtime::sim::FaultPlan;
use gyre_simulations::swarm::{
    HORIZON, live_plan, live_swarm_config, node_crashes, run_swarm_inspect, swarm_config,
};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: u64| -> Result<u64, String> {
        args.get(i)
            .map_or(Ok(default), |s| s.parse().map_err(|e| format!("{s}: {e}")))
    };
    let verbose = args.iter().any(|a| a == "-v");
    let live = args.iter().any(|a| a == "--live");
    if verbose {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .without_time()
            .with_max_level(tracing::Level::DEBUG)
            .init();
    }
    let base = num(0, 0)?;
    let count = num(1, 10_000)?;
    let started = Instant::now();
    let (mut failed, mut core_crashes, mut crashes) = (0u64, 0usize, 0usize);
    let mut unservable = 0u64;
    for seed in base..base.saturating_add(count) {
        let cfg = if live {
            live_swarm_config(seed)
        } else {
            swarm_config(seed)
        };
        let core = gyre_actors::sched::plan::ClusterPlan::for_config(&cfg.sched).cells[0];
        let plan = if live {
            live_plan(seed)
        } else {
            FaultPlan::within(seed, HORIZON)
        };
        let all = node_crashes(&cfg, &plan);
        if verbose {
            println!("{cfg:?}\ncrashes {all:?}\npartitions {:?}", plan.partitions);
        }
        crashes += all.len();
        core_crashes += all.iter().filter(|(_, _, n)| *n == core).count();
        let mut show = |c: &gyre_simulations::world::Cluster| {
            if verbose {
                dump(c);
            }
        };
        match run_swarm_inspect(&cfg, plan, &mut show) {
            Ok(o) => {
                unservable += o.unservable_timeouts;
                if let Some(e) = o.error {
                    failed += 1;
                    println!("FAIL {seed}: {}", e.failure);
                }
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {seed}: could not run: {e}");
            }
        }
    }
    println!(
        "{count} seeds from {base}: {failed} failed; {crashes} node crashes, {core_crashes} of the core's node; {unservable} calls timed out with no engine to serve them; {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The actors' states at the end of a replay.
fn dump(c: &gyre_simulations::world::Cluster) {
    let sim = &c.sim;
    let Some(s) = sim.actor(c.sched) else {
        return;
    };
    println!("scheduler log: {:?}", s.log());
    let Some(p) = s.peers() else {
        return;
    };
    if let Some(core) = sim.actor(p.core) {
        println!("core: {core:?}");
    }
    for cell in p.cells.iter().chain(p.pool.iter()) {
        if let Some(x) = sim.actor(*cell) {
            println!("cell: {x:?}");
        }
    }
    if let Some(q) = sim.actor(p.queue) {
        println!("queue: {q:?}");
    }
}
