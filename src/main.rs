//! The `gyre` binary: parses the command line, sets up logging, runs the
//! command.

use anyhow::Result;
use clap::Parser;
use gyre::cli::{Cli, logging};

fn main() -> Result<()> {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    gyre::cli::run(cli)
}
