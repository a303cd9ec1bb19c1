//! What the head and the node agents say to each other, over the live
//! host's authenticated links.
//!
//! A node agent joins by telling the launcher its transfer-engine address
//! and where to reach it; the head answers with an assignment (the run's
//! configuration, the roles the plan gives that node, the plane's
//! directory); the node builds its backends and answers with their ports.
//! At the end the head asks each node for the bytes it moved, then stops it.

use std::net::SocketAddr;

use gyre_actors::sched::SchedConfig;
use gyre_actors::sched::plan::ClusterPlan;
use gyre_actors::sched::proto::engine::EngineReq;
use gyre_actors::sched::proto::memory::MemoryReq;
use gyre_actors::sched::proto::trainer::TrainerReq;
use gyre_runtime::{ActorId, Addr, External, NodeId, Recipient};
use serde::{Deserialize, Serialize};

use super::plane::{BytesMoved, Directory};
use super::tap::TapMsg;
use crate::embedded::trainer::UpdateSummary;

/// The head's node id; node agents get the ids the plan gives them.
pub const HEAD: NodeId = NodeId(0);
/// The head opens four endpoints (its event and update probes, the
/// gateway front's and the token tap's, which a run without the gateway
/// leaves unused) and then spawns the launcher, so node agents find the
/// launcher at this id on the head without being told (the head checks it
/// got this id).
pub const LAUNCHER_LOCAL_ID: u64 = 5;

/// The launcher's address on the head.
pub fn launcher_id() -> ActorId {
    ActorId {
        node: HEAD,
        local: LAUNCHER_LOCAL_ID,
    }
}

/// What the plan places on a node agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    /// Cell c's engine, trainer and device memory.
    Cell(u32),
    /// The standalone pool's engine.
    Pool,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Cell(c) => write!(f, "cell {c}"),
            Role::Pool => f.write_str("pool"),
        }
    }
}

/// One node-agent process: its node id and what it hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub node: NodeId,
    pub roles: Vec<Role>,
}

impl NodeSpec {
    pub fn label(&self) -> String {
        let roles: Vec<String> = self.roles.iter().map(Role::to_string).collect();
        format!("node {} ({})", self.node.0, roles.join(", "))
    }
}

/// The plan's cell and pool nodes packed into `processes` node agents
/// (every plan node its own process when `processes` is `None` or
/// larger): plan nodes are dealt round-robin in plan order (cells, then
/// the pool), and a process takes the id of its first plan node.
pub fn node_specs(sched: &SchedConfig, processes: Option<usize>) -> Vec<NodeSpec> {
    let plan = ClusterPlan::for_config(sched);
    let mut units: Vec<(NodeId, Role)> = (0u32..)
        .zip(&plan.cells)
        .map(|(c, &n)| (n, Role::Cell(c)))
        .collect();
    if let Some(pool) = plan.pool {
        units.push((pool, Role::Pool));
    }
    let n = processes
        .unwrap_or(units.len())
        .clamp(1, units.len().max(1));
    let mut specs: Vec<NodeSpec> = Vec::new();
    for (i, (node, role)) in units.into_iter().enumerate() {
        match specs.get_mut(i % n) {
            Some(spec) => spec.roles.push(role),
            None => specs.push(NodeSpec {
                node,
                roles: vec![role],
            }),
        }
    }
    specs
}

/// A cell's three ports, as its node agent spawned them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellPorts {
    pub cell: u32,
    pub engine: Recipient<EngineReq>,
    pub trainer: Recipient<TrainerReq>,
    pub memory: Recipient<MemoryReq>,
}

/// Everything a node agent hosts, by port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePorts {
    pub cells: Vec<CellPorts>,
    pub pool: Option<Recipient<EngineReq>>,
}

/// What the head tells a node agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum NodeCmd {
    /// Build and start these backends.
    Assign {
        /// The run's `EmbeddedConfig` as TOML.
        config: String,
        roles: Vec<Role>,
        directory: Directory,
        /// Where the core reports each optimizer update.
        observer: Recipient<UpdateSummary>,
        /// Where the engines stream every sampled token (a run whose
        /// executions are external processes behind the head's gateway);
        /// `None`: the engines write each call's record themselves.
        tap: Option<Addr<External<TapMsg>>>,
        /// The head's incarnation (0 for the run's first, n for its n-th
        /// resume), which the core's last word names when it is lost.
        incarnation: u64,
    },
    /// Tell the head the bytes this process moved.
    Report,
    /// Stop the node's actors and exit.
    Stop,
    /// The node agent's own watchdog: the link to the head went down.
    HeadLost,
    /// `node` was lost and its agent restarted: its transfer engine now
    /// listens at `transfer`. Reconnect, forget the prefix rings it was a
    /// rank of, and answer [`NodeEvent::PeerBack`].
    PeerBack { node: NodeId, transfer: SocketAddr },
}

/// What a node agent tells the head's launcher.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum NodeEvent {
    Joined {
        node: NodeId,
        pid: u32,
        transfer: SocketAddr,
        commands: Addr<External<NodeCmd>>,
        /// The head incarnation that started this agent (0 for a run's
        /// first head, n for its n-th resume): an agent that outlived its
        /// head joins the next one with a smaller number, which that
        /// head's launcher adopts or stops (see `super::launcher`).
        incarnation: u64,
    },
    Ready {
        node: NodeId,
        ports: NodePorts,
    },
    Moved {
        node: NodeId,
        bytes: BytesMoved,
    },
    /// `node` reconnected its plane to the restarted `peer`.
    PeerBack {
        node: NodeId,
        peer: NodeId,
    },
    /// The assignment could not be carried out.
    Failed {
        node: NodeId,
        error: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_packed_into_processes_round_robin() {
        let sched = SchedConfig {
            cells: 2,
            pool_capacity: 4,
            ..SchedConfig::default()
        };
        let one_each = node_specs(&sched, None);
        assert_eq!(
            one_each,
            vec![
                NodeSpec {
                    node: NodeId(10),
                    roles: vec![Role::Cell(0)]
                },
                NodeSpec {
                    node: NodeId(11),
                    roles: vec![Role::Cell(1)]
                },
                NodeSpec {
                    node: NodeId(5),
                    roles: vec![Role::Pool]
                },
            ]
        );
        let two = node_specs(&sched, Some(2));
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].roles, vec![Role::Cell(0), Role::Pool]);
        assert_eq!(two[0].label(), "node 10 (cell 0, pool)");
        assert_eq!(node_specs(&sched, Some(9)).len(), 3);
        assert_eq!(node_specs(&sched, Some(0)).len(), 1);
    }
}
