//! `gyre sandbox-forward` (hidden): the first process of a bwrap sandbox
//! whose network is only the gateway (src/harness/forward.rs). The runner
//! starts it; nobody types it.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Debug, Args)]
pub struct SandboxForwardArgs {
    /// The loopback address to listen on inside the sandbox.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The host's bridge socket, bound into the sandbox.
    #[arg(long)]
    pub unix: PathBuf,
    /// The harness command.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub fn run(args: SandboxForwardArgs) -> Result<()> {
    let code = crate::harness::forward::serve_in_sandbox(args.listen, &args.unix, &args.command)
        .with_context(|| format!("sandbox-forward: listening on {}", args.listen))?;
    std::process::exit(code)
}
