//! The `gyre` command line: argument parsing and one module per command.

pub mod bench;
pub mod bench_harness;
pub mod demo;
pub mod gateway;
pub mod logging;
pub mod node;
pub mod report;
pub mod sandbox_forward;
pub mod serve;
pub mod simulate;
pub mod trace;
pub mod train;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "gyre",
    version,
    about = "Elastic online RL for long-horizon coding agents"
)]
pub struct Cli {
    /// Log line format on stderr (filter with RUST_LOG, default `info`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print version, protocol version and build information.
    Version,
    /// Run the demo protocol in the simulator and the live host; print both
    /// results and the simulator's trace hash.
    Demo(demo::DemoArgs),
    /// Inspect JSONL traces of recorded model calls: tree statistics,
    /// admission, synthetic traces.
    Trace(trace::TraceArgs),
    /// Compare scheduling policies on a published workload in the
    /// simulator: tables, JSON, plots, and the workload profile.
    Simulate(simulate::SimulateArgs),
    /// Train the embedded policy online on the built-in agent task through
    /// the whole elastic system, in the deterministic simulator.
    Train(train::TrainArgs),
    /// Serve the Anthropic and OpenAI APIs in front of an engine, recording
    /// every call's tokens (TITO); admin API on its own listener.
    Gateway(gateway::GatewayArgs),
    /// Benchmarks that print figures (`gyre bench gateway`).
    Bench(bench::BenchArgs),
    /// Serve the embedded engine over SGLang's native HTTP API.
    Serve(serve::ServeArgs),
    /// A node agent of a multi-process cluster (`gyre train --cluster`
    /// starts these itself).
    Node(node::NodeArgs),
    /// The first process of a bwrap sandbox whose network is only the
    /// gateway (the harness runner starts it).
    #[command(hide = true)]
    SandboxForward(sandbox_forward::SandboxForwardArgs),
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Version => {
            println!(
                "gyre {} (wire protocol {})",
                env!("CARGO_PKG_VERSION"),
                gyre_runtime::PROTOCOL_VERSION
            );
            Ok(())
        }
        Command::Demo(args) => demo::run(args),
        Command::Trace(args) => trace::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Train(args) => train::run(args),
        Command::Gateway(args) => gateway::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Node(args) => node::run(args),
        Command::SandboxForward(args) => sandbox_forward::run(args),
    }
}
