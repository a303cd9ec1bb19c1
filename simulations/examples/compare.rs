//! The simulation lab's comparison without the CLI: what `gyre simulate
//! --scenario S --staleness E --steps N [--oversample M]` prints as hours,
//! from a release build of the simulator crates alone (the root package
//! also builds the gateway and the embedded model).
//!
//! `cargo run --release -p gyre-simulations --example compare -- SCENARIO
//! STALENESS [STEPS] [OVERSAMPLE [BASELINE_OVERSAMPLE]]` (over-sampling of
//! elastic, then of Colocate and Async, each overriding the scenario's
//! `[policies]`); it also prints the GPU-time breakdown,
//! and with `GYRE_PLOTS=DIR` writes the breakdown, critical-path and
//! timeline plots there; `GYRE_POLICIES=colocate,async` runs only those.

use gyre_simulations::lab::{self, RunOptions};
use gyre_simulations::scenario::{self, Selection};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, staleness, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: compare SCENARIO STALENESS [STEPS] [OVERSAMPLE [BASELINE_OVERSAMPLE]]".into(),
        );
    };
    let mut sc = scenario::load(name).map_err(|e| e.to_string())?;
    let staleness: f64 = staleness.parse().map_err(|e| format!("staleness: {e}"))?;
    let steps = match rest.first() {
        Some(s) => s.parse().map_err(|e| format!("steps: {e}"))?,
        None => sc.steps,
    };
    if let Some(m) = rest.get(1) {
        sc.policies.oversample = m.parse().map_err(|e| format!("oversample: {e}"))?;
    }
    if let Some(m) = rest.get(2) {
        sc.policies.baseline_oversample =
            m.parse().map_err(|e| format!("baseline oversample: {e}"))?;
    }
    // GYRE_PAYLOAD_COST=LATENCY_US,GBPS prices payload-transfer effects
    // (`gyre simulate --payload-cost`).
    if let Ok(cost) = std::env::var("GYRE_PAYLOAD_COST") {
        sc.transfer.set_payload_cost(&cost)?;
    }
    // GYRE_POLICIES=colocate,async runs only those (`gyre simulate --policy`).
    let policies = std::env::var("GYRE_POLICIES").unwrap_or_else(|_| "all".into());
    let runs = sc
        .runs(&Selection::parse(&policies), Some(staleness))
        .map_err(|e| e.to_string())?;
    let mut opts = RunOptions::new(steps, 1);
    // GYRE_NO_BREAKDOWN=1 times the simulator without the breakdown's hook.
    opts.breakdown = std::env::var_os("GYRE_NO_BREAKDOWN").is_none();
    let c = lab::compare(&sc, &runs, staleness, &opts, runs.len(), &|_, _| {})
        .map_err(|e| e.to_string())?;
    for r in &c.results {
        println!(
            "{} total {:.2} h, staleness {:.3} (max {}), executions started {} finished {}",
            r.name,
            r.total_hours,
            r.mean_staleness,
            r.max_staleness,
            r.executions_started,
            r.executions_finished
        );
    }
    if let Some(s) = c.speedups.get("elastic") {
        println!("speedups {s:?}");
    }
    print!("{}", lab::report::breakdown_table(&c));
    if let Ok(dir) = std::env::var("GYRE_PLOTS") {
        let dir = std::path::Path::new(&dir);
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        lab::plot::breakdown::draw_gpu_hours(&c, &dir.join("breakdown.svg"))
            .map_err(|e| e.to_string())?;
        lab::plot::breakdown::draw_critical_path(&c, &dir.join("critical_path.svg"))
            .map_err(|e| e.to_string())?;
        lab::plot::timeline::draw(&c, &dir.join("timeline.svg")).map_err(|e| e.to_string())?;
    }
    Ok(())
}
