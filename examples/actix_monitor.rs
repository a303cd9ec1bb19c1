//! Gyre's elastic scheduling plane inside a user's actix system.
//!
//! The user's own actix actor, `Monitor`, is told every optimizer update of
//! the embedded cluster (two elastic cells and a pool training the tiny
//! policy on the built-in agent task) as it happens, prints it, and stops
//! the run after the steps it chose by stopping the actix system. After
//! the second update it pauses the scheduler's dispatch for half a second
//! (`SchedMsg::PauseDispatch`, then `ResumeDispatch`): a command message.
//!
//! ```text
//! cargo run --features actix --example actix_monitor -- [STOP_AFTER] [SEED]
//! ```

use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Handler, Message, System};
use anyhow::{Context as _, Result};
use gyre::embedded::actix::start_on_actix;
use gyre::embedded::cluster::EmbeddedConfig;
use gyre::embedded::trainer::UpdateSummary;
use gyre_actors::sched::msg::scheduler::SchedMsg;
use gyre_actors::sched::scheduler::Scheduler;
use gyre_runtime::actix_host::{ActixGyre, Tell};
use gyre_runtime::{ActorId, Addr, NodeId};

/// The user's actor: follows training and decides when it has seen enough.
struct Monitor {
    stop_after: u64,
    started: Instant,
    /// Where commands go, once the cluster is up.
    scheduler: Option<(ActixGyre, Addr<Scheduler>)>,
}

/// Hands the monitor the running cluster's scheduler.
#[derive(Message)]
#[rtype(result = "()")]
struct Steer(ActixGyre, Addr<Scheduler>);

impl Handler<Steer> for Monitor {
    type Result = ();

    fn handle(&mut self, Steer(gyre, sched): Steer, _: &mut Context<Self>) {
        self.scheduler = Some((gyre, sched));
    }
}

impl Monitor {
    fn command(&self, msg: SchedMsg) {
        if let Some((gyre, sched)) = &self.scheduler {
            println!("monitor: {msg:?}");
            gyre.send(ActorId::new(0, u64::MAX), *sched, msg);
        }
    }
}

impl Actor for Monitor {
    type Context = Context<Self>;
}

impl Handler<Tell<UpdateSummary>> for Monitor {
    type Result = ();

    fn handle(&mut self, tell: Tell<UpdateSummary>, cx: &mut Context<Self>) {
        let u = tell.msg;
        println!(
            "{:>7.2} s  step {:>3} → version {:>3}  loss {:>8.4}  grad norm {:>7.4}  {} targets",
            self.started.elapsed().as_secs_f64(),
            u.step,
            u.version,
            u.loss,
            u.grad_norm,
            u.targets
        );
        if u.version == 2 {
            self.command(SchedMsg::PauseDispatch);
            cx.run_later(Duration::from_millis(500), |me, _| {
                me.command(SchedMsg::ResumeDispatch)
            });
        }
        if u.version >= self.stop_after {
            println!("monitor: {} steps seen, stopping the run", u.version);
            System::current().stop();
        }
    }
}

fn arg(ix: usize, default: u64) -> Result<u64> {
    match std::env::args().nth(ix) {
        None => Ok(default),
        Some(a) => a
            .parse()
            .with_context(|| format!("argument {ix} must be a whole number, got {a:?}")),
    }
}

fn main() -> Result<()> {
    let stop_after = arg(1, 20)?;
    let seed = arg(2, 1)?;
    // The cluster would train on; the monitor ends it.
    let cfg = EmbeddedConfig::tiny(seed).with_steps(stop_after.saturating_add(10));

    let sys = System::new();
    let cluster = sys.block_on(async {
        let monitor = Monitor {
            stop_after,
            started: Instant::now(),
            scheduler: None,
        }
        .start();
        let gyre = ActixGyre::new(NodeId(0), cfg.seed);
        let cluster = start_on_actix(&gyre, &cfg, Some(monitor.clone().recipient()))?;
        monitor.do_send(Steer(gyre, cluster.parts.sched));
        anyhow::Ok(cluster)
    })?;
    sys.run().context("running the actix system")?;

    let r = cluster.report();
    println!(
        "stopped at version {} after {:.1} s: {} executions, {} scored",
        r.steps, r.wall_secs, r.executions, r.scored
    );
    for v in &r.reward_by_version {
        println!(
            "  served by version {:>3}: {:>4} scored, mean reward {:.3}",
            v.version, v.scored, v.mean_reward
        );
    }
    if let (Some(early), Some(late)) = (r.early_reward, r.late_reward) {
        println!("reward, first → last quarter of versions: {early:.3} → {late:.3}");
    }
    Ok(())
}
