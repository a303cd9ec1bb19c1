//! The node agent (`gyre node --head ADDR --node N`): one OS process that
//! hosts what the head assigns it (cells' engines, trainers and device
//! memory, or the pool's engine) and serves its payloads to the others.
//!
//! It starts its transfer engine, dials the head over an authenticated
//! live link, joins through the launcher, and then obeys the head's
//! commands: build the assigned backends on the run's configuration (the
//! same [`EmbeddedBackends`] factory the one-process runs use, over the
//! [`plane`](super::plane) instead of shared boards) and report their ports,
//! report the bytes it moved, stop. A small watchdog actor watches the head:
//! an agent whose head is gone (the core's first leaves the core's state on
//! disk, its last word) drops everything it built and, if told to
//! wait for a new head (`--head-wait-s`, given by a head whose run can be
//! resumed), joins again the head that comes back at the same address with
//! the same secret (`gyre train --cluster … --resume`); otherwise, or if no
//! head comes back in time, it exits instead of lingering.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use gyre_actors::sched::plan::BackendFactory;
use gyre_rdma::ClusterSecret;
use gyre_runtime::live::{LinkSecret, LiveConfig, LiveNode};
use gyre_runtime::{Actor, ActorId, Addr, Cx, External, NodeId, Recipient};

use super::launcher::Launcher;
use super::plane::{Directory, HOME_WAIT, Plane, PlaneError, shared_over};
use super::proto::{CellPorts, HEAD, NodeCmd, NodeEvent, NodePorts, Role, launcher_id};
use super::tap::{RemoteTap, TapMsg};
use crate::embedded::cluster::{BuildError, BuiltInTask, EmbeddedBackends, EmbeddedConfig};
use crate::embedded::engine::TokenTap;
use crate::embedded::last_word::CoreLastWord;
use crate::embedded::task::Workspaces;
use crate::embedded::trainer::UpdateSummary;

#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub head: SocketAddr,
    pub node: NodeId,
    /// The address to serve segments on; by default the interface that
    /// routes to the head.
    pub bind: Option<IpAddr>,
    pub secret: Vec<u8>,
    /// How long to try to reach the head (a refused handshake is retried
    /// until then, as the head may still be starting).
    pub join_timeout: Duration,
    /// How long to wait for a new head once the head's link is lost (zero:
    /// exit at once).
    pub head_wait: Duration,
    /// The head incarnation that started this agent
    /// ([`NodeEvent::Joined`]).
    pub incarnation: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("node {0} is the head's id; node agents take the ids the plan gives them")]
    HeadId(u32),
    #[error("cluster secret: {0}")]
    Secret(String),
    #[error("transfer plane: {0}")]
    Plane(#[from] PlaneError),
    #[error("live host: {0}")]
    Host(#[from] gyre_runtime::RuntimeError),
    #[error("could not start the tokio runtime: {0}")]
    Tokio(#[from] std::io::Error),
    #[error(
        "could not join the head at {head} within {secs} s (is it running, and is {env} its secret?)",
        env = super::placement::SECRET_ENV
    )]
    Unreachable { head: SocketAddr, secs: u64 },
    #[error("lost the link to the head; exiting")]
    HeadLost,
}

/// Tells the agent's own command loop when the head's link goes down.
struct HeadWatch {
    tell: Addr<External<NodeCmd>>,
}

impl Actor for HeadWatch {
    type Msg = ();
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        cx.watch_node(HEAD);
    }

    fn on_msg(&mut self, _from: ActorId, _msg: (), _cx: &mut Cx<'_, Self>) {}

    fn on_peer_down(&mut self, _node: NodeId, cx: &mut Cx<'_, Self>) {
        cx.send(self.tell, NodeCmd::HeadLost);
    }
}

/// The local address the kernel would use to reach `head` (no packet is
/// sent: connecting a UDP socket only picks the route).
fn route_to(head: SocketAddr) -> IpAddr {
    UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.connect(head).and_then(|()| s.local_addr()))
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip())
}

/// Runs a node agent until the head stops it (or, waiting for heads,
/// until none comes back in time).
pub fn run_node(opts: NodeOptions) -> Result<(), NodeError> {
    if opts.node == HEAD {
        return Err(NodeError::HeadId(opts.node.0));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut join_timeout = opts.join_timeout;
        loop {
            match session(&opts, join_timeout).await {
                Err(NodeError::HeadLost) if !opts.head_wait.is_zero() => {
                    tracing::warn!(
                        node = opts.node.0,
                        wait_s = opts.head_wait.as_secs(),
                        "lost the link to the head; dropped what it assigned, waiting for a new head"
                    );
                    join_timeout = opts.head_wait;
                }
                other => return other,
            }
        }
    })
}

/// One membership of a head: a fresh transfer plane and live host, joined
/// within `join_timeout`, obeying the head until it stops this agent or
/// its link is lost. Everything built here ends with it, so a new head
/// finds the agent as if just started.
async fn session(opts: &NodeOptions, join_timeout: Duration) -> Result<(), NodeError> {
    let link = LinkSecret::new(&opts.secret).map_err(|e| NodeError::Secret(e.to_string()))?;
    let transfer_secret =
        ClusterSecret::new(&opts.secret).map_err(|e| NodeError::Secret(e.to_string()))?;
    let routed = route_to(opts.head);
    let bind = opts.bind.unwrap_or(routed);
    let plane = Plane::start(opts.node, SocketAddr::new(bind, 0), transfer_secret)?;
    let port = plane.local_addr().map_or(0, |a| a.port());
    let advertised = if bind.is_unspecified() { routed } else { bind };
    let transfer = SocketAddr::new(advertised, port);

    let mut cfg = LiveConfig::local(opts.node, 0);
    cfg.peers = vec![(HEAD, opts.head)];
    cfg.secret = Some(link);
    let live = match LiveNode::start(cfg).await {
        Ok(live) => live,
        Err(e) => {
            plane.stop();
            return Err(e.into());
        }
    };
    if !live.connected(HEAD, join_timeout).await {
        live.shutdown().await;
        plane.stop();
        return Err(NodeError::Unreachable {
            head: opts.head,
            secs: join_timeout.as_secs(),
        });
    }
    let outcome = obey(opts, &live, &plane, transfer).await;
    live.shutdown().await;
    plane.stop();
    outcome
}

/// Joins through the head's launcher and carries out its commands.
async fn obey(
    opts: &NodeOptions,
    live: &LiveNode,
    plane: &Arc<Plane>,
    transfer: SocketAddr,
) -> Result<(), NodeError> {
    let (commands, mut rx) = live.probe::<NodeCmd>(64);
    live.spawn(HeadWatch { tell: commands });
    let launcher = Addr::<Launcher>::new(launcher_id());
    let from = commands.id();
    let node = opts.node;
    let joined = NodeEvent::Joined {
        node,
        pid: std::process::id(),
        transfer,
        commands,
        incarnation: opts.incarnation,
    };
    // Said again until the head answers: a head that is still starting
    // (a resumed one, which its waiting agents reach at once) has no
    // launcher yet to take it. The launcher drops repeats.
    let mut resend = tokio::time::interval(JOIN_RESEND);
    let mut answered = false;
    // The core's trainer, if assigned here, and the head it serves.
    let mut last_word: Option<(CoreLastWord, u64)> = None;
    loop {
        let next = if answered {
            rx.recv().await
        } else {
            tokio::select! {
                next = rx.recv() => next,
                _ = resend.tick() => {
                    // A head lost before the watch on it began is seen here.
                    if !live.connected(HEAD, Duration::ZERO).await {
                        return Err(NodeError::HeadLost);
                    }
                    live.send(from, launcher, joined.clone()).await?;
                    tracing::info!(node = node.0, %transfer, "node agent joined the head");
                    continue;
                }
            }
        };
        let Some((_, cmd)) = next else { break };
        answered = true;
        match cmd {
            NodeCmd::Assign {
                config,
                roles,
                directory,
                observer,
                tap,
                incarnation,
            } => {
                let assigned = Assignment {
                    config: &config,
                    roles: &roles,
                    directory: &directory,
                    observer,
                    tap,
                };
                let event = match assign(live, plane, assigned).await {
                    Ok((ports, word)) => {
                        last_word = word.map(|w| (w, incarnation));
                        NodeEvent::Ready { node, ports }
                    }
                    Err(error) => {
                        tracing::error!(node = node.0, %error, "assignment failed");
                        NodeEvent::Failed { node, error }
                    }
                };
                live.send(from, launcher, event).await?;
            }
            NodeCmd::Report => {
                let bytes = plane.moved();
                live.send(from, launcher, NodeEvent::Moved { node, bytes })
                    .await?;
            }
            NodeCmd::PeerBack {
                node: peer,
                transfer,
            } => {
                let p = plane.clone();
                let done = tokio::task::spawn_blocking(move || p.reconnect(peer, transfer))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                // Unanswered, the head never tells the scheduler the
                // peer is back: a failure is logged, and the head's
                // stall timeout names the run stuck.
                match done {
                    Ok(()) => {
                        live.send(from, launcher, NodeEvent::PeerBack { node, peer })
                            .await?;
                    }
                    Err(error) => {
                        tracing::error!(node = node.0, peer = peer.0, %error, "could not reconnect to a restarted peer");
                    }
                }
            }
            NodeCmd::Stop => return Ok(()),
            NodeCmd::HeadLost => {
                if let Some((word, incarnation)) = last_word.take() {
                    say_last_word(node, word, incarnation).await;
                }
                return Err(NodeError::HeadLost);
            }
        }
    }
    Ok(())
}

/// The core's node, its head lost: leaves the core's state for the head
/// resumed after it ([`crate::embedded::last_word`]), whether this agent
/// then waits for that head or exits. A failure costs only the updates
/// since the last periodic checkpoint, which the resume makes again.
async fn say_last_word(node: NodeId, word: CoreLastWord, incarnation: u64) {
    let said = tokio::task::spawn_blocking(move || word.say(incarnation))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
    match said {
        Ok(w) => tracing::info!(
            node = node.0,
            version = w.version,
            saved = w.saved,
            carried = w.updates.len(),
            "the core's last word is on disk"
        ),
        Err(error) => {
            tracing::error!(node = node.0, %error, "could not write the core's last word")
        }
    }
}

/// How often an agent says it joined until the head answers.
const JOIN_RESEND: Duration = Duration::from_millis(250);

/// What the head assigned this node.
struct Assignment<'a> {
    config: &'a str,
    roles: &'a [Role],
    directory: &'a Directory,
    observer: Recipient<UpdateSummary>,
    tap: Option<Addr<External<TapMsg>>>,
}

/// Builds the assigned roles on this node over the plane and returns their
/// ports.
async fn assign(
    live: &LiveNode,
    plane: &Arc<Plane>,
    assigned: Assignment<'_>,
) -> Result<(NodePorts, Option<CoreLastWord>), String> {
    let Assignment {
        config,
        roles,
        directory,
        observer,
        tap,
    } = assigned;
    let cfg = EmbeddedConfig::from_toml(config, &EmbeddedConfig::default())
        .map_err(|e| format!("the head's configuration: {e}"))?;
    let (p, d) = (plane.clone(), directory.clone());
    tokio::task::spawn_blocking(move || p.connect(&d))
        .await
        .map_err(|e| format!("connecting the plane: {e}"))?
        .map_err(|e| format!("connecting the plane: {e}"))?;
    // Records this node's engines write are kept at the head, so losing
    // this process loses no answered call's record.
    plane.home_blobs_at(HEAD, HOME_WAIT);
    let shared = shared_over(plane, cfg.model.clone());
    // The task's workspaces live on the head; nothing here reads them.
    let workspaces = Arc::new(Workspaces::new());
    let build = |e: BuildError| e.to_string();
    let tap = tap.map(|head| RemoteTap::start(live, head) as Arc<dyn TokenTap>);
    let task = BuiltInTask::new(&cfg, workspaces).with_tap(tap);
    let mut factory =
        EmbeddedBackends::with_task(&cfg, shared.clone(), task, Some(observer)).map_err(build)?;
    if roles.contains(&Role::Cell(0)) {
        // The core's node holds the published weights, from version 0 on.
        let params = factory.initial_params();
        shared
            .weights
            .publish(params.version, Arc::from(params.encode()));
    }
    let mut ports = NodePorts::default();
    let mut last_word = None;
    for role in roles {
        match *role {
            Role::Cell(c) => {
                let cell = factory.cell(c, cfg.sched.cell_capacity).map_err(build)?;
                if c == 0 {
                    last_word = cell.trainer.last_word();
                }
                ports.cells.push(CellPorts {
                    cell: c,
                    engine: Recipient::of(live.spawn(cell.engine)),
                    trainer: Recipient::of(live.spawn(cell.trainer)),
                    memory: Recipient::of(live.spawn(cell.memory)),
                });
            }
            Role::Pool => {
                let engine = factory.pool(cfg.sched.pool_capacity).map_err(build)?;
                ports.pool = Some(Recipient::of(live.spawn(engine)));
            }
        }
    }
    Ok((ports, last_word))
}

/// Hex, for the secret in the environment.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim();
    if s.len() % 2 != 0 {
        return Err(format!("odd number of hex digits ({})", s.len()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("not a hex digit pair at position {i}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_bad_digits_are_named() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(to_hex(&b), "0001abff");
        assert_eq!(from_hex("0001ABff\n").unwrap(), b);
        assert!(from_hex("abc").unwrap_err().contains("odd"));
        assert!(from_hex("zz").unwrap_err().contains("position 0"));
    }

    #[test]
    fn the_route_to_loopback_is_loopback() {
        assert_eq!(
            route_to("127.0.0.1:9".parse().unwrap()),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
    }
}
