//! Supervision of live actors: what happens when a handler panics.
//!
//! A panic in one handler must not silently take its actor out of a run
//! that lasts hours, leaving the others to wait on it until a stall timer
//! fires. The driver catches the panic and files a [`PanicReport`] (node,
//! actor, the input it was handling, the panic's text) here; an actor
//! spawned with [`LiveNode::spawn_supervised`](super::LiveNode::spawn_supervised)
//! is then rebuilt in place from its factory, under the same id and mailbox,
//! up to its restart budget, and any other is stopped. Whoever runs the node
//! watches the reports ([`LiveNode::panics`](super::LiveNode::panics),
//! [`LiveNode::next_panic`](super::LiveNode::next_panic)) and fails the run
//! with the report at once when it cannot carry on.

use std::fmt;
use std::sync::Mutex;

use rustc_hash::FxHashMap;
use tokio::sync::Notify;

use crate::hosted::DynActor;
use crate::id::{ActorId, NodeId};

use super::lock;

/// One caught panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PanicReport {
    pub node: NodeId,
    pub actor: ActorId,
    /// The actor's Rust type.
    pub actor_type: &'static str,
    /// What the handler was handling: `start`, `timer`, `peer down nN`, or
    /// `message <type>` with the message's Rust type.
    pub input: String,
    /// The panic's message.
    pub panic: String,
    /// Whether the actor was rebuilt from its factory (else it stopped).
    pub restarted: bool,
}

impl fmt::Display for PanicReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "actor {} ({}) on node {} panicked handling {}: {}; {}",
            self.actor,
            self.actor_type,
            self.node,
            self.input,
            self.panic,
            if self.restarted {
                "restarted"
            } else {
                "stopped"
            }
        )
    }
}

/// The panic payload as text.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a non-text panic payload)".to_owned()
    }
}

type Factory = Box<dyn FnMut() -> Box<dyn DynActor> + Send>;

struct Restarter {
    make: Factory,
    left: u32,
}

/// A node's restart factories and the panics it has seen.
#[derive(Default)]
pub(crate) struct Supervision {
    restarters: Mutex<FxHashMap<ActorId, Restarter>>,
    reports: Mutex<Vec<PanicReport>>,
    filed: Notify,
}

impl Supervision {
    pub(crate) fn register(&self, id: ActorId, restarts: u32, make: Factory) {
        lock(&self.restarters).insert(
            id,
            Restarter {
                make,
                left: restarts,
            },
        );
    }

    /// A fresh incarnation of `id`, if it is supervised and has restarts
    /// left.
    pub(crate) fn rebuild(&self, id: ActorId) -> Option<Box<dyn DynActor>> {
        let mut map = lock(&self.restarters);
        let r = map.get_mut(&id)?;
        if r.left == 0 {
            map.remove(&id);
            return None;
        }
        r.left -= 1;
        Some((r.make)())
    }

    pub(crate) fn forget(&self, id: ActorId) {
        lock(&self.restarters).remove(&id);
    }

    pub(crate) fn file(&self, report: PanicReport) {
        tracing::error!(%report, "actor panicked");
        lock(&self.reports).push(report);
        self.filed.notify_waiters();
    }

    pub(crate) fn reports(&self) -> Vec<PanicReport> {
        lock(&self.reports).clone()
    }

    /// The report after the first `seen`, once there is one.
    pub(crate) async fn next(&self, seen: usize) -> PanicReport {
        loop {
            let notified = self.filed.notified();
            if let Some(r) = lock(&self.reports).get(seen) {
                return r.clone();
            }
            notified.await;
        }
    }
}
