//! The `gyre` binary: parses the command line, sets up logging, runs the
//! command.

use anyhow::Result;
use clap::Parser;
use gyre::cli::{Cli, Command, logging};

fn main() -> Result<()> {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match cli.command {
        Command::Version => {
            println!(
                "gyre {} (wire protocol {})",
                env!("CARGO_PKG_VERSION"),
                gyre::runtime::PROTOCOL_VERSION
            );
            Ok(())
        }
    }
}
