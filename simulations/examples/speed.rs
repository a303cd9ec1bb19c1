//! The simulator's speed on one core: every policy of a scenario run one
//! after another on this thread, with the events it processed per second
//! of wall time, and the results as `gyre simulate --json` prints them
//! (so a faster simulator can be checked to give byte-identical figures).
//!
//! `cargo run --release -p gyre-simulations --example speed -- [SCENARIO]
//! [STALENESS] [STEPS] [--json FILE]` (default: nl2repo-2.4t 1.5 48).

use std::time::Instant;

use gyre_simulations::lab::{self, RunOptions};
use gyre_simulations::scenario::{self, Selection};

fn main() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let json = match args.iter().position(|a| a == "--json") {
        Some(i) if i + 1 < args.len() => {
            let path = args.remove(i + 1);
            args.remove(i);
            Some(path)
        }
        Some(_) => return Err("--json needs a file".into()),
        None => None,
    };
    let name = args.first().map_or("nl2repo-2.4t", String::as_str);
    let sc = scenario::load(name).map_err(|e| e.to_string())?;
    let staleness: f64 = match args.get(1) {
        Some(s) => s.parse().map_err(|e| format!("staleness: {e}"))?,
        None => sc.staleness,
    };
    let steps = match args.get(2) {
        Some(s) => s.parse().map_err(|e| format!("steps: {e}"))?,
        None => sc.steps,
    };
    let runs = sc
        .runs(&Selection::parse("all"), Some(staleness))
        .map_err(|e| e.to_string())?;
    let opts = RunOptions::new(steps, 1);
    let started = Instant::now();
    let c = lab::compare(&sc, &runs, staleness, &opts, 1, &|_, _| {}).map_err(|e| e.to_string())?;
    let wall = started.elapsed().as_secs_f64();
    let events: u64 = c.results.iter().map(|r| r.events).sum();
    println!(
        "{name} E[d] = {staleness}, {steps} steps, {} runs on one thread: {events} events in {wall:.2} s = {:.2} M events/s",
        c.results.len(),
        events as f64 / wall / 1e6
    );
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&c).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}
