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
//! live host does. [`run_on_actix`] is `gyre train --host actix`: its own
//! system, whose only user actor ends the run at the target step.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix::{ActorContext as _, AsyncContext as _, Recipient as ActixRecipient};
use gyre_actors::sched::plan::Host;
use gyre_runtime::actix_host::{ActixGyre, Tell};
use gyre_runtime::{Actor, Addr, NodeId, Recipient};

use super::cluster::{Assembled, BuildError, EmbeddedConfig, assemble_observed};
use super::live::{LiveReport, LiveRunError, published};
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

/// The run's own actix actor under `gyre train --host actix`: stops the
/// system once the core published `target`, or after `stall` without an
/// update (and says so).
struct Finisher {
    target: u64,
    stall: Duration,
    last: Instant,
    seen: Rc<Cell<u64>>,
    stalled: Rc<Cell<bool>>,
}

impl actix::Actor for Finisher {
    type Context = actix::Context<Self>;

    fn started(&mut self, cx: &mut Self::Context) {
        cx.run_interval(Duration::from_millis(500), |me, cx| {
            if me.last.elapsed() > me.stall {
                me.stalled.set(true);
                cx.stop();
                actix::System::current().stop();
            }
        });
    }
}

impl actix::Handler<Tell<UpdateSummary>> for Finisher {
    type Result = ();

    fn handle(&mut self, tell: Tell<UpdateSummary>, _: &mut Self::Context) {
        self.last = Instant::now();
        self.seen.set(self.seen.get().max(tell.msg.version));
        if tell.msg.version >= self.target {
            actix::System::current().stop();
        }
    }
}

/// Runs `cfg` on the actix host, in a system of its own, until the core
/// published every step or nothing moved for `stall`.
pub fn run_on_actix(cfg: &EmbeddedConfig, stall: Duration) -> Result<LiveReport, LiveRunError> {
    use actix::Actor as _;
    let target = cfg.sched.target_steps;
    let (seen, stalled) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(false)));
    let sys = actix::System::new();
    let cluster = sys.block_on(async {
        let finisher = Finisher {
            target,
            stall,
            last: Instant::now(),
            seen: seen.clone(),
            stalled: stalled.clone(),
        }
        .start();
        let gyre = ActixGyre::new(NodeId(0), cfg.seed);
        start_on_actix(&gyre, cfg, Some(finisher.recipient()))
    })?;
    sys.run()?;
    if stalled.get() {
        return Err(LiveRunError::Stalled {
            secs: stall.as_secs(),
            steps: seen.get(),
            target,
        });
    }
    Ok(cluster.report())
}
