//! `gyre node`: a node agent of a multi-process cluster. Started by the
//! head's launcher (or a cluster manager), it joins the head and hosts
//! what the head assigns it; see `gyre::cluster::node`.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use anyhow::{Context, Result, anyhow};
use clap::Args;
use gyre_runtime::NodeId;

use crate::cluster::node::{NodeOptions, from_hex, run_node};
use crate::cluster::placement::SECRET_ENV;

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The head's address (`gyre train --cluster …` prints it).
    #[arg(long)]
    pub head: String,
    /// This node's id, as the cluster plan numbers it (10 + cell, 5 the pool).
    #[arg(long)]
    pub node: u32,
    /// The address to serve payloads on (default: the interface that
    /// routes to the head).
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// Seconds to keep trying to reach the head.
    #[arg(long, default_value_t = 20)]
    pub join_timeout_s: u64,
    /// Seconds to wait for a new head (a resumed run's) once the head's
    /// link is lost; 0 exits at once.
    #[arg(long, default_value_t = 0)]
    pub head_wait_s: u64,
    /// The head incarnation that started this agent (the head sets it).
    #[arg(long, default_value_t = 0)]
    pub incarnation: u64,
}

pub fn run(args: NodeArgs) -> Result<()> {
    let head: SocketAddr = args
        .head
        .to_socket_addrs()
        .with_context(|| format!("resolving the head address {}", args.head))?
        .next()
        .ok_or_else(|| anyhow!("the head address {} resolves to nothing", args.head))?;
    let hex = std::env::var(SECRET_ENV)
        .with_context(|| format!("{SECRET_ENV} must hold the cluster secret (hex)"))?;
    let secret = from_hex(&hex).map_err(|e| anyhow!("{SECRET_ENV}: {e}"))?;
    run_node(NodeOptions {
        head,
        node: NodeId(args.node),
        bind: args.bind,
        secret,
        join_timeout: std::time::Duration::from_secs(args.join_timeout_s),
        head_wait: std::time::Duration::from_secs(args.head_wait_s),
        incarnation: args.incarnation,
    })
    .with_context(|| format!("node agent {}", args.node))
}
