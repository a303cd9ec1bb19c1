//! Where the node's drivers run: on dedicated single-threaded runtimes
//! owned by the node (the default), or as tasks on the runtime that started
//! the node.
//!
//! Each driver runs a share of the actors, assigned by id (round-robin), on
//! one thread at a time, the way actix runs each arbiter: actors that talk
//! to each other on one driver never cross threads. With `actor_threads =
//! 0` there is one driver per worker of the caller's runtime, so actors
//! still spread over its threads. Connections and the I/O worker pool are
//! not affected: they stay on the caller's runtime and the blocking pool.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::id::{ActorId, NodeId};

use super::driver::{Driver, DriverTx, Inject};
use super::lock;
use super::node::NodeInner;

/// How long a dedicated runtime waits for I/O still running on its
/// blocking pool when the node shuts down; that I/O's result is dropped.
const BLOCKING_GRACE: Duration = Duration::from_millis(100);

pub(crate) struct Executor {
    node: NodeId,
    drivers: Vec<DriverTx>,
    /// The drivers' receivers and runtimes until [`Executor::launch`].
    unlaunched: Mutex<Vec<(UnboundedReceiver<Inject>, Option<Runtime>)>>,
    shared: Option<Handle>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Dedicated threads, each with the signal that its driver and
    /// runtime are done (all that is left of it is the thread's exit).
    threads: Mutex<Vec<(std::thread::JoinHandle<()>, oneshot::Receiver<()>)>>,
}

impl Executor {
    /// `threads == 0` shares `caller`; otherwise builds that many runtimes.
    pub fn new(caller: Handle, threads: usize, node: NodeId) -> std::io::Result<Self> {
        let count = if threads == 0 {
            caller.metrics().num_workers().max(1)
        } else {
            threads
        };
        let mut drivers = Vec::with_capacity(count);
        let mut unlaunched = Vec::with_capacity(count);
        for _ in 0..count {
            let (tx, rx) = unbounded_channel();
            let rt = if threads == 0 {
                None
            } else {
                Some(
                    Builder::new_current_thread()
                        .enable_all()
                        .thread_name(format!("gyre-{node}-io"))
                        .build()?,
                )
            };
            drivers.push(tx);
            unlaunched.push((rx, rt));
        }
        Ok(Executor {
            node,
            drivers,
            unlaunched: Mutex::new(unlaunched),
            shared: (threads == 0).then_some(caller),
            tasks: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        })
    }

    /// Starts the drivers of `inner` (whose executor this is).
    pub fn launch(&self, inner: &Arc<NodeInner>) -> std::io::Result<()> {
        let unlaunched = std::mem::take(&mut *lock(&self.unlaunched));
        for (num, (rx, rt)) in unlaunched.into_iter().enumerate() {
            let driver = Driver::new(Arc::clone(inner), num, self.drivers[num].clone(), rx);
            match (rt, &self.shared) {
                (Some(rt), _) => {
                    let (done, ended) = oneshot::channel::<()>();
                    let join = std::thread::Builder::new()
                        .name(format!("gyre-{}-actors-{num}", self.node))
                        .spawn(move || {
                            rt.block_on(driver.run());
                            rt.shutdown_timeout(BLOCKING_GRACE);
                            let _ = done.send(());
                        })?;
                    lock(&self.threads).push((join, ended));
                }
                (None, Some(handle)) => lock(&self.tasks).push(handle.spawn(driver.run())),
                (None, None) => {
                    return Err(std::io::Error::other(
                        "a driver has neither a runtime nor a thread",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The number of the driver that runs actor `id`.
    pub fn driver_num(&self, id: ActorId) -> usize {
        usize::try_from(id.local % self.drivers.len() as u64).unwrap_or(0)
    }

    /// The inject queue of the driver that runs actor `id`.
    pub fn driver(&self, id: ActorId) -> &DriverTx {
        &self.drivers[self.driver_num(id)]
    }

    /// Waits for every driver to end (the node's shutdown token stops
    /// them), which drops every actor, and joins the dedicated threads.
    pub async fn stop(&self) {
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        for task in tasks {
            if let Err(err) = task.await
                && err.is_panic()
            {
                tracing::error!("an actor driver panicked");
            }
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for (join, ended) in threads {
            // Awaited rather than joined on the blocking pool: the join
            // below then only waits for the thread's last instructions.
            if ended.await.is_err() || join.join().is_err() {
                tracing::error!("an actor thread panicked");
            }
        }
    }
}
