//! `gyre demo`: the demo protocol (fan-out request/reply with timers and
//! retries, see `gyre_actors::demo`) in the simulator and in the live host
//! (and in the actix adapter when built with `--features actix`), printing
//! each host's result and the simulator's trace hash.
//!
//! The results must agree: the protocol's outcome depends only on the seed.
//! The trace hash fingerprints the simulator's exact schedule, so two runs
//! with one seed print the same hash and different seeds different ones.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use gyre_actors::demo::{Coordinator, DemoConfig, DemoReport};
use gyre_runtime::live::{LiveConfig, LiveNode};
use gyre_runtime::sim::{Latency, LinkModel, Sim, SimConfig};
use gyre_runtime::{MICROS, MILLIS, NodeId};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Seed of the run: drives the simulator's network and every actor's
    /// random stream (in every host).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Workers the coordinator fans out to.
    #[arg(long, default_value_t = 8)]
    pub workers: u32,
    /// Request/reply rounds.
    #[arg(long, default_value_t = 20)]
    pub rounds: u32,
}

/// What one simulated run of the demo produced.
#[derive(Debug, Serialize)]
pub struct SimOutcome {
    pub report: DemoReport,
    pub trace_hash: u64,
    pub events: u64,
    pub dropped: u64,
}

#[derive(Debug, Serialize)]
struct DemoOutput {
    seed: u64,
    /// Hex, so that JSON readers with 53-bit integers keep every bit.
    sim_trace_hash: String,
    sim_events: u64,
    sim_virtual_ms: f64,
    sim_messages_lost: u64,
    sim_retries: u64,
    sim_result: gyre_actors::demo::DemoResult,
    live_wall_ms: f64,
    live_retries: u64,
    live_result: gyre_actors::demo::DemoResult,
    #[serde(skip_serializing_if = "Option::is_none")]
    actix_result: Option<gyre_actors::demo::DemoResult>,
    agree: bool,
}

/// The simulated network of the demo: random latency that reorders, and
/// some loss, so the retry path is exercised and seeds change the schedule.
fn sim_config(seed: u64) -> SimConfig {
    let mut cfg = SimConfig::new(seed);
    cfg.local_link = LinkModel {
        latency: Latency::Uniform {
            min: 50 * MICROS,
            max: 2 * MILLIS,
        },
        loss: 0.02,
        duplicate: 0.0,
        fifo: false,
    };
    cfg.codec_roundtrip = true;
    cfg
}

/// Runs the demo in the simulator under the demo's lossy, reordering network.
pub fn run_sim(seed: u64, demo: DemoConfig) -> Result<SimOutcome> {
    let mut sim = Sim::new(sim_config(seed));
    let probe = sim.probe::<DemoReport>(NodeId(0));
    sim.spawn(NodeId(0), Coordinator::new(demo, probe));
    sim.run().context("simulated demo run")?;
    let report = sim
        .take_probe(probe)
        .pop()
        .map(|r| r.msg)
        .context("the simulated coordinator never reported")?;
    Ok(SimOutcome {
        report,
        trace_hash: sim.trace_hash(),
        events: sim.events(),
        dropped: sim.stats().dropped_loss,
    })
}

async fn run_live(seed: u64, demo: DemoConfig) -> Result<(DemoReport, Duration)> {
    let started = Instant::now();
    let node = LiveNode::start(LiveConfig::local(NodeId(0), seed))
        .await
        .context("starting the live host")?;
    let (probe, mut reports) = node.probe::<DemoReport>(4);
    node.spawn(Coordinator::new(demo, probe));
    let report = tokio::time::timeout(Duration::from_secs(60), reports.recv())
        .await
        .context("the live coordinator did not report within 60 s")?
        .map(|(_, r)| r)
        .context("the live host closed the report channel")?;
    node.shutdown().await;
    Ok((report, started.elapsed()))
}

/// Runs the demo in a fresh in-process live host on its own tokio runtime.
pub fn run_live_blocking(seed: u64, demo: DemoConfig) -> Result<(DemoReport, Duration)> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?
        .block_on(run_live(seed, demo))
}

/// Runs the demo inside a fresh actix system through the adapter.
#[cfg(feature = "actix")]
pub fn run_actix(seed: u64, demo: DemoConfig) -> Result<DemoReport> {
    use actix_adapter::run;
    run(seed, demo)
}

#[cfg(feature = "actix")]
mod actix_adapter {
    use std::sync::{Arc, Mutex};

    use anyhow::{Context, Result};
    use gyre_actors::demo::{Coordinator, DemoConfig, DemoReport};
    use gyre_runtime::NodeId;
    use gyre_runtime::actix_host::{ActixGyre, Tell};

    struct Sink(Arc<Mutex<Option<DemoReport>>>);
    impl actix::Actor for Sink {
        type Context = actix::Context<Self>;
    }
    impl actix::Handler<Tell<DemoReport>> for Sink {
        type Result = ();
        fn handle(&mut self, tell: Tell<DemoReport>, _: &mut Self::Context) {
            if let Ok(mut slot) = self.0.lock() {
                *slot = Some(tell.msg);
            }
            actix::System::current().stop();
        }
    }

    pub fn run(seed: u64, demo: DemoConfig) -> Result<DemoReport> {
        let slot = Arc::new(Mutex::new(None));
        let sys = actix::System::new();
        let sink_slot = Arc::clone(&slot);
        sys.block_on(async move {
            use actix::Actor as _;
            let gyre = ActixGyre::new(NodeId(0), seed);
            let sink = gyre.external(Sink(sink_slot).start().recipient());
            gyre.start(Coordinator::new(demo, sink));
        });
        sys.run().context("running the actix system")?;
        let report = slot
            .lock()
            .ok()
            .and_then(|mut s| s.take())
            .context("the actix coordinator never reported")?;
        Ok(report)
    }
}

pub fn run(args: DemoArgs) -> Result<()> {
    let demo = DemoConfig {
        workers: args.workers,
        rounds: args.rounds,
        ..DemoConfig::default()
    };
    let sim = run_sim(args.seed, demo)?;
    let (live, live_wall) = run_live_blocking(args.seed, demo)?;
    #[cfg(feature = "actix")]
    let actix_result = Some(run_actix(args.seed, demo)?.result);
    #[cfg(not(feature = "actix"))]
    let actix_result: Option<gyre_actors::demo::DemoResult> = None;

    let agree = sim.report.result == live.result
        && actix_result
            .as_ref()
            .is_none_or(|a| *a == sim.report.result);
    let out = DemoOutput {
        seed: args.seed,
        sim_trace_hash: format!("{:#018x}", sim.trace_hash),
        sim_events: sim.events,
        sim_virtual_ms: sim.report.elapsed as f64 / MILLIS as f64,
        sim_messages_lost: sim.dropped,
        sim_retries: sim.report.retries,
        sim_result: sim.report.result.clone(),
        live_wall_ms: live_wall.as_secs_f64() * 1e3,
        live_retries: live.retries,
        live_result: live.result.clone(),
        actix_result,
        agree,
    };
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        print_table(&out);
    }
    if !agree {
        bail!(
            "the hosts disagree on the demo's result (seed {})",
            args.seed
        );
    }
    Ok(())
}

fn print_table(out: &DemoOutput) {
    let r = &out.sim_result;
    println!(
        "gyre demo: seed {}, {} workers x {} rounds",
        out.seed, r.workers, r.rounds
    );
    println!(
        "  simulator  checksum {:#018x}  retries {:>3}  lost {:>3}  virtual {:>8.2} ms  events {}",
        r.checksum, out.sim_retries, out.sim_messages_lost, out.sim_virtual_ms, out.sim_events
    );
    println!(
        "  live host  checksum {:#018x}  retries {:>3}            wall    {:>8.2} ms",
        out.live_result.checksum, out.live_retries, out.live_wall_ms
    );
    if let Some(a) = &out.actix_result {
        println!("  actix      checksum {:#018x}", a.checksum);
    }
    println!("  sim trace hash {}", out.sim_trace_hash);
    println!("  results {}", if out.agree { "agree" } else { "DISAGREE" });
}
