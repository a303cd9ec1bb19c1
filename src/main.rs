//! The `gyre` binary: parses the command line, sets up logging, runs the
//! command.

use anyhow::Result;
use clap::Parser;
use gyre::cli::{Cli, logging};

fn main() -> Result<()> {
    // First, while this is the only thread (see gyre_gpu::cpu).
    gyre_gpu::cpu::settle();
    let cli = Cli::parse();
    logging::init(cli.log_format);
    gyre::cli::run(cli)
}
