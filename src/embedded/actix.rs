//! The embedded cluster inside a user's actix system (feature `actix`).
//!
//! The design's third user already lives in actix: it wants the elastic
//! scheduling plane next to its own actors, not beside them in another
//! runtime. [`start_on_actix`] assembles the same cluster the simulator and
//! the live host run (one [`ClusterPlan`](gyre_actors::sched::plan::ClusterPlan),
//! the same backends and scheduler) as actix actors through the adapter of
//! `gyre_runtime::actix_host`, in the running system's arbiter, with model
//! work on tokio's blocking pool.
//!
//! The user's actor observes training as messages: every optimizer update
//! reaches it as a `Tell<UpdateSummary>`, sent by the trainer that made it.
//! It steers the run the actix way: stopping the system (or dropping the
//! cluster's actors) stops the run after as many steps as it chose, and
//! [`ActixCluster::report`] reads what was learned from the boards, as the
//! live host does.

use std::time::Instant;

use actix::Recipient as ActixRecipient;
use gyre_actors::sched::plan::Host;
use gyre_runtime::actix_host::{ActixGyre, Tell};
use gyre_runtime::{Actor, Addr, NodeId, Recipient};

use super::cluster::{Assembled, BuildError, EmbeddedConfig, assemble_observed};
use super::live::{LiveReport, published};
use super::trainer::UpdateSummary;

/// Spawns every actor of the cluster in the current actix arbiter (the
/// adapter is one node: the plan's node is ignored, as on the live host).
pub struct OnActix<'a>(pub &'a ActixGyre);

impl Host for OnActix<'_> {
    fn spawn<A: Actor>(&mut self, _node: NodeId, actor: A) -> Addr<A> {
        self.0.start(actor).id
    }
}

/// A cluster running in an actix system.
pub struct ActixCluster {
    pub gyre: ActixGyre,
    pub parts: Assembled,
    seed: u64,
    started: Instant,
}

impl ActixCluster {
    /// The newest version the core published.
    pub fn published(&self) -> u64 {
        published(&self.parts)
    }

    /// What the run learned so far: updates, rewards by version, executions.
    pub fn report(&self) -> LiveReport {
        LiveReport::of(&self.parts, self.seed, self.started)
    }
}

/// Starts the embedded cluster of `cfg` in the running actix system, on
/// `gyre`'s node; each optimizer update is also told to `observer`. Must be
/// called from inside the system (e.g. `System::block_on` or a handler).
pub fn start_on_actix(
    gyre: &ActixGyre,
    cfg: &EmbeddedConfig,
    observer: Option<ActixRecipient<Tell<UpdateSummary>>>,
) -> Result<ActixCluster, BuildError> {
    let started = Instant::now();
    let observer = observer.map(|r| Recipient::of(gyre.external(r)));
    let parts = assemble_observed(&mut OnActix(gyre), cfg, observer)?;
    Ok(ActixCluster {
        gyre: gyre.clone(),
        parts,
        seed: cfg.seed,
        started,
    })
}
