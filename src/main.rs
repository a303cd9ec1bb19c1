//! The `gyre` binary: parses the command line, sets up logging, runs the
//! command.

use std::process::ExitCode;

use clap::Parser;
use gyre::cli::{Cli, logging, report};

fn main() -> ExitCode {
    // First, while this is the only thread (see gyre_gpu::cpu).
    gyre_gpu::cpu::settle();
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match gyre::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", report::report(&e));
            ExitCode::FAILURE
        }
    }
}
