//! The whole embedded cluster inside a user's actix system: the same
//! configuration as the simulator and live runs trains on the actix host,
//! a user's actix actor hears every optimizer update as it happens, and
//! stopping the system from that actor ends the run after the steps it
//! chose.
#![cfg(feature = "actix")]

use std::sync::{Arc, Mutex};

use actix::{Actor, Context, Handler, System};
use gyre::embedded::actix::{ActixCluster, start_on_actix};
use gyre::embedded::cluster::EmbeddedConfig;
use gyre::embedded::trainer::UpdateSummary;
use gyre_runtime::NodeId;
use gyre_runtime::actix_host::{ActixGyre, Tell};

/// The user's actor: keeps every update it is told and stops the system
/// after `stop_after` of them.
struct Watcher {
    seen: Arc<Mutex<Vec<UpdateSummary>>>,
    stop_after: u64,
}

impl Actor for Watcher {
    type Context = Context<Self>;
}

impl Handler<Tell<UpdateSummary>> for Watcher {
    type Result = ();
    fn handle(&mut self, tell: Tell<UpdateSummary>, _: &mut Context<Self>) {
        let mut seen = self.seen.lock().unwrap();
        seen.push(tell.msg);
        if seen.len() as u64 >= self.stop_after {
            System::current().stop();
        }
    }
}

fn run(cfg: &EmbeddedConfig, stop_after: u64) -> (ActixCluster, Vec<UpdateSummary>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sys = System::new();
    let watcher = Watcher {
        seen: seen.clone(),
        stop_after,
    };
    let cluster = sys
        .block_on(async {
            let gyre = ActixGyre::new(NodeId(0), cfg.seed);
            start_on_actix(&gyre, cfg, Some(watcher.start().recipient()))
        })
        .expect("the cluster assembles on actix");
    sys.run().expect("the actix system runs");
    let seen = seen.lock().unwrap().clone();
    (cluster, seen)
}

fn tiny(seed: u64, steps: u64) -> EmbeddedConfig {
    EmbeddedConfig::tiny(seed).with_steps(steps)
}

#[test]
fn the_embedded_cluster_learns_on_actix_and_reports_each_step() {
    let steps = 40;
    let (cluster, seen) = run(&tiny(1, steps), steps);
    let versions: Vec<u64> = seen.iter().map(|u| u.version).collect();
    assert_eq!(
        versions,
        (1..=steps).collect::<Vec<_>>(),
        "one report per step"
    );
    assert!(seen.iter().all(|u| u.targets > 0 && u.loss.is_finite()));
    let r = cluster.report();
    assert_eq!(r.steps, steps);
    assert_eq!(
        r.updates, seen,
        "the watcher heard every update the core made"
    );
    // Real time is not reproducible: over 40 steps the live host's and
    // this host's runs of this configuration end anywhere between 1.4× and
    // 11× their early reward (the simulator's ≥ 3× is exact replay), so a
    // rise is what holds on every run.
    let early = r.early_reward.expect("early versions were scored");
    let late = r.late_reward.expect("late versions were scored");
    assert!(late > early, "reward {early:.3} → {late:.3}");
}

#[test]
fn the_users_actor_stops_the_run_after_the_steps_it_chose() {
    let (cluster, seen) = run(&tiny(2, 40), 3);
    assert_eq!(seen.len(), 3);
    let published = cluster.published();
    assert!((3..40).contains(&published), "published {published}");
    assert!(cluster.report().scored > 0);
}
