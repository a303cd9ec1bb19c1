//! Lost nodes in the simulator, each with its defined outcome (see
//! `gyre_actors::sched::scheduler::loss`): a rollout cell's node and the
//! pool's node crash and restart, and a satellite's node crashes mid-batch.
//! Every run is checked after every event by the invariant checker and at
//! the end by the exact accounting (every call answered, every group
//! trained once, every micro-step of a step consumed exactly once, one
//! update per step, every published version served), with the harness
//! never seeing an error.

use gyre_actors::sched::cell::CellRole;
use gyre_actors::sched::ids::EngineIx;
use gyre_actors::sched::maths::Role;
use gyre_actors::sched::{Policy, SchedConfig};
use gyre_runtime::{MILLIS, NodeId, SECS};
use gyre_simulations::checker::check_end;
use gyre_simulations::world::{Cluster, ClusterConfig};

mod common;
use common::{checked, run_until};

fn config(sched: SchedConfig, seed: u64) -> ClusterConfig {
    let mut cfg = ClusterConfig::new(
        SchedConfig {
            retry: Some(SECS),
            watch_nodes: true,
            ..sched
        },
        seed,
    );
    cfg.restartable = true;
    cfg
}

fn finish(cluster: &mut Cluster) {
    let stats = cluster.sim.run().expect("invariants hold");
    assert!(!stats.limited, "the run did not finish");
    check_end(cluster).expect("end-of-run accounting");
}

fn sched(cluster: &Cluster) -> &gyre_actors::sched::scheduler::Scheduler {
    cluster.sim.actor(cluster.sched).expect("the scheduler")
}

#[test]
fn a_rollout_cells_node_dies_its_calls_move_and_it_rejoins_after_a_restart() {
    let cfg = config(
        SchedConfig {
            cells: 3,
            cell_capacity: 4,
            pool_capacity: 4,
            target_steps: 4,
            ..SchedConfig::default()
        },
        7,
    );
    let mut cluster = checked(&cfg);
    let node = NodeId(12);
    // Cell 2 in rollout, serving a call.
    let busy = run_until(&mut cluster, |c| {
        let s = sched(c);
        let serving = s
            .peers()
            .and_then(|p| c.sim.actor(p.proxy))
            .is_some_and(|p| {
                p.pending_calls()
                    .iter()
                    .any(|(_, at, _)| *at == Some(EngineIx::Cell(2)))
            });
        s.ledger().role(2) == Some(Role::Rollout) && serving
    });
    assert!(busy, "cell 2 never served");
    let before = sched(&cluster).ledger().rollout_capacity();
    let placed = sched(&cluster).ledger().used_of(EngineIx::Cell(2));
    cluster.sim.crash_node(node);
    cluster
        .sim
        .run_until(cluster.sim.now() + 100 * MILLIS)
        .expect("invariants hold");
    let s = sched(&cluster);
    assert_eq!(s.ledger().role(2), Some(Role::Lost));
    assert_eq!(
        s.ledger().rollout_capacity(),
        before - 4,
        "C_R drops by C_e"
    );
    let loss = s.log().losses[0];
    assert_eq!(loss.engine, EngineIx::Cell(2));
    assert_eq!(loss.displaced, placed as usize);
    // Lost for a while, then the node restarts with fresh backends.
    cluster
        .sim
        .run_until(cluster.sim.now() + 30 * SECS)
        .expect("invariants hold");
    assert_eq!(sched(&cluster).ledger().role(2), Some(Role::Lost));
    cluster.sim.restart_node(node);
    finish(&mut cluster);
    let s = sched(&cluster);
    let proxy = cluster
        .sim
        .actor(s.peers().expect("peers").proxy)
        .expect("the proxy");
    assert!(proxy.stats().lost_attempts > 0, "{:?}", proxy.stats());
    assert!(s.log().losses[0].rejoined_at.is_some());
    assert_eq!(s.ledger().role(2), Some(Role::Rollout));
}

#[test]
fn the_pools_node_dies_and_comes_back() {
    let cfg = config(
        SchedConfig {
            cells: 2,
            cell_capacity: 4,
            pool_capacity: 4,
            target_steps: 4,
            ..SchedConfig::default()
        },
        3,
    );
    let mut cluster = checked(&cfg);
    let busy = run_until(&mut cluster, |c| {
        sched(c).ledger().used_of(EngineIx::Pool) > 0
    });
    assert!(busy, "the pool never served");
    let before = sched(&cluster).ledger().rollout_capacity();
    cluster.sim.crash_node(NodeId(5));
    cluster
        .sim
        .run_until(cluster.sim.now() + 10 * SECS)
        .expect("invariants hold");
    let s = sched(&cluster);
    assert!(s.ledger().pool_lost());
    assert!(s.ledger().rollout_capacity() <= before.saturating_sub(4));
    cluster.sim.restart_node(NodeId(5));
    finish(&mut cluster);
    let s = sched(&cluster);
    assert!(!s.ledger().pool_lost());
    assert_eq!(s.log().losses.len(), 1);
    assert!(s.log().losses[0].rejoined_at.is_some());
}

#[test]
fn a_satellite_dies_mid_batch_and_its_micro_steps_are_trained_once_by_the_survivors() {
    let cfg = config(
        SchedConfig {
            cells: 3,
            cell_capacity: 2,
            pool_capacity: 4,
            batch_groups: 4,
            target_steps: 4,
            policy: Policy::Elastic,
            ..SchedConfig::default()
        },
        11,
    );
    let mut cluster = checked(&cfg);
    cluster.sim.run_until(MILLIS).expect("invariants hold");
    let peers = sched(&cluster).peers().expect("peers").clone();
    let (cell1, queue) = (peers.cells[1], peers.queue);
    // Cell 1 trains and holds a grant of the batch.
    let mid_batch = run_until(&mut cluster, |c| {
        let cell = c.sim.actor(cell1).expect("cell 1");
        let granted = c
            .sim
            .actor(queue)
            .and_then(|q| q.stats().grants.get(&1).copied())
            .unwrap_or(0);
        cell.role() == CellRole::Training
            && cell.training_step().is_some()
            && granted > cell.stats().micro_steps
    });
    assert!(mid_batch, "cell 1 never trained");
    cluster.sim.crash_node(NodeId(11));
    cluster
        .sim
        .run_until(cluster.sim.now() + 20 * SECS)
        .expect("invariants hold");
    cluster.sim.restart_node(NodeId(11));
    finish(&mut cluster);
    let s = sched(&cluster);
    let core = cluster.sim.actor(peers.core).expect("the core");
    let q = cluster.sim.actor(queue).expect("the queue");
    assert_eq!(s.log().losses[0].role, Some(Role::Training));
    assert!(!core.log().cut.is_empty(), "the prefix was cut");
    assert!(q.stats().requeued > 0, "{:?}", q.stats());
    assert_eq!(core.log().updates, (0..4).collect::<Vec<_>>());
    assert!(
        core.log().violations.is_empty(),
        "{:?}",
        core.log().violations
    );
}

/// The live cluster's way back (`rejoin_notices`, no resend timer): a lost
/// node's cells wait, however long, until the host says the node runs
/// again (`SchedMsg::NodeBack`, sent by the head once the launcher's
/// restarted agent has rebuilt its backends); then they resend their
/// return to rollout there once, and the cell serves again.
#[test]
fn without_resends_a_lost_node_rejoins_when_its_host_says_it_is_back() {
    let mut cfg = ClusterConfig::new(
        SchedConfig {
            cells: 3,
            cell_capacity: 4,
            pool_capacity: 4,
            target_steps: 4,
            watch_nodes: true,
            rejoin_notices: true,
            retry: None,
            ..SchedConfig::default()
        },
        7,
    );
    cfg.restartable = true;
    let mut cluster = checked(&cfg);
    let node = NodeId(12);
    let serving = run_until(&mut cluster, |c| {
        sched(c).ledger().role(2) == Some(Role::Rollout) && !sched(c).log().bursts.is_empty()
    });
    assert!(serving, "cell 2 never served after a burst");
    cluster.sim.crash_node(node);
    cluster
        .sim
        .run_until(cluster.sim.now() + 10 * SECS)
        .expect("invariants hold");
    cluster.sim.restart_node(node);
    // Restarted, but nothing finds it: no resend timer, no notice yet.
    cluster
        .sim
        .run_until(cluster.sim.now() + 60 * SECS)
        .expect("invariants hold");
    assert_eq!(sched(&cluster).ledger().role(2), Some(Role::Lost));
    assert!(sched(&cluster).log().losses[0].rejoined_at.is_none());
    let from = cluster.sched.id();
    cluster.sim.inject(
        from,
        cluster.sched,
        gyre_actors::sched::scheduler::SchedMsg::NodeBack { node },
    );
    finish(&mut cluster);
    let s = sched(&cluster);
    assert!(
        s.log().losses[0].rejoined_at.is_some(),
        "{:?}",
        s.log().losses
    );
    assert_eq!(s.ledger().role(2), Some(Role::Rollout));
    let cell = cluster
        .sim
        .actor(s.peers().expect("peers").cells[2])
        .expect("cell 2");
    assert_eq!(cell.stats().losses, 1, "{:?}", cell.stats());
}
