//! Where actor tasks run: on dedicated single-threaded runtimes owned by
//! the node (the default), or on the runtime that started the node.
//!
//! Messages between actors are tiny and handlers are short, so the cost of
//! a message is dominated by scheduling. On a work-stealing runtime two
//! actors that talk to each other keep getting woken on different threads;
//! on a dedicated thread a message is a queue push and a local wake, the way
//! actix runs each arbiter. With several threads, actors are spread over
//! them by id, round-robin. Connections and the I/O worker pool are not
//! affected: they stay on the caller's runtime and the blocking pool.

use std::sync::Mutex;
use std::time::Duration;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

use crate::id::{ActorId, NodeId};

use super::lock;

/// How long a dedicated runtime waits for I/O still running on its
/// blocking pool when the node shuts down; that I/O's result is dropped.
const BLOCKING_GRACE: Duration = Duration::from_millis(100);

pub(crate) enum Executor {
    Shared(Handle),
    Dedicated {
        handles: Vec<Handle>,
        stops: Mutex<Vec<oneshot::Sender<()>>>,
        threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    },
}

impl Executor {
    /// `threads == 0` shares `caller`; otherwise starts that many threads.
    pub fn new(caller: Handle, threads: usize, node: NodeId) -> std::io::Result<Self> {
        if threads == 0 {
            return Ok(Executor::Shared(caller));
        }
        let mut handles = Vec::with_capacity(threads);
        let mut stops = Vec::with_capacity(threads);
        let mut joins = Vec::with_capacity(threads);
        for i in 0..threads {
            let rt = Builder::new_current_thread()
                .enable_all()
                .thread_name(format!("gyre-{node}-io"))
                .build()?;
            handles.push(rt.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            let join = std::thread::Builder::new()
                .name(format!("gyre-{node}-actors-{i}"))
                .spawn(move || {
                    rt.block_on(async {
                        let _ = stopped.await;
                    });
                    rt.shutdown_timeout(BLOCKING_GRACE);
                })?;
            joins.push(join);
        }
        Ok(Executor::Dedicated {
            handles,
            stops: Mutex::new(stops),
            threads: Mutex::new(joins),
        })
    }

    /// The runtime actor `id` runs on.
    pub fn for_actor(&self, id: ActorId) -> &Handle {
        match self {
            Executor::Shared(handle) => handle,
            Executor::Dedicated { handles, .. } => {
                let i = usize::try_from(id.local % handles.len() as u64).unwrap_or(0);
                &handles[i]
            }
        }
    }

    /// Stops the dedicated threads (after every actor task has ended) and
    /// joins them.
    pub async fn stop(&self) {
        let Executor::Dedicated { stops, threads, .. } = self else {
            return;
        };
        for stop in std::mem::take(&mut *lock(stops)) {
            let _ = stop.send(());
        }
        let joins = std::mem::take(&mut *lock(threads));
        let joined =
            tokio::task::spawn_blocking(move || joins.into_iter().all(|j| j.join().is_ok())).await;
        if !matches!(joined, Ok(true)) {
            tracing::error!("an actor thread panicked");
        }
    }
}
