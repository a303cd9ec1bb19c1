//! Where a message for a local address goes: an actor's bounded mailbox or a
//! probe's channel.
//!
//! A [`Route`] is cheap to clone, so drivers and connection readers cache
//! the routes they use. An actor's route is its [`Inbox`]: the way in from
//! outside its driver (another driver, a connection, an I/O worker, the
//! node handle). Claiming a place at the actor's [`Gate`] comes first, then
//! the message joins the driver's inject queue, so the mailbox bound holds
//! whichever way a message comes. When the mailbox is full the sender
//! awaits room: that wait is the backpressure, and nothing is ever buffered
//! beyond the configured capacity. Actors on the same driver skip all this
//! and push straight into each other's queues (see `effects.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::driver::{DriverTx, Inject};
use super::gate::{Gate, NoRoom};

use crate::actor::Message;
use crate::hosted::{BoxMsg, Decoder};
use crate::id::{ActorId, NodeId};

/// What an actor's mailbox holds.
pub(crate) enum Envelope {
    Msg {
        from: ActorId,
        msg: BoxMsg,
    },
    /// A send of the actor to itself.
    Own(BoxMsg),
    PeerDown(NodeId),
}

/// The way into one actor's mailbox from outside its driver.
#[derive(Clone)]
pub(crate) struct Inbox {
    pub to: ActorId,
    pub gate: Arc<Gate>,
    pub driver: DriverTx,
}

/// Why [`Inbox::try_send`] did not deliver.
pub(crate) enum TrySend {
    Full(Envelope),
    Closed,
}

impl Inbox {
    pub fn try_send(&self, env: Envelope) -> Result<(), TrySend> {
        if self.gate.is_closed() {
            return Err(TrySend::Closed);
        }
        match self.gate.try_claim() {
            Ok(()) => self.push(env),
            Err(NoRoom::Full) => Err(TrySend::Full(env)),
            Err(NoRoom::Closed) => Err(TrySend::Closed),
        }
    }

    /// Sends, waiting for room; `Err` if the actor is gone.
    pub async fn send(&self, env: Envelope) -> Result<(), TrySend> {
        match self.gate.claim().await {
            Ok(()) => self.push(env),
            Err(_) => Err(TrySend::Closed),
        }
    }

    /// Queues a message whose place is already claimed.
    fn push(&self, env: Envelope) -> Result<(), TrySend> {
        let to = self.to;
        self.driver.send(Inject::Deliver { to, env }).map_err(|_| {
            // The driver is gone (shutdown): so is the actor.
            self.gate.release(1);
            TrySend::Closed
        })
    }
}

/// A local destination.
#[derive(Clone)]
pub(crate) enum Route {
    Actor {
        inbox: Inbox,
        decoder: Decoder,
    },
    Probe {
        sink: Arc<dyn ProbeSink>,
        decoder: Decoder,
    },
}

/// Why a message was not delivered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Undelivered {
    /// The destination stopped (its receiver is gone).
    Closed,
    /// A probe was handed a message of another type.
    WrongType {
        expected: &'static str,
        got: &'static str,
    },
}

/// The rest of a delivery that found the destination full: it owns what it
/// needs, so a driver can park it beside the sending actor.
pub(crate) type SlowDelivery = BoxFuture<'static, Result<(), Undelivered>>;

/// How long a sender waits on a full mailbox before it warns that it may be
/// part of a cycle of full mailboxes (which bounded mailboxes cannot break).
const SLOW_SEND_WARNING: Duration = Duration::from_secs(5);

impl Route {
    pub fn decoder(&self) -> Decoder {
        match self {
            Route::Actor { decoder, .. } | Route::Probe { decoder, .. } => *decoder,
        }
    }

    /// Delivers `msg`, waiting for room if the destination is full.
    pub async fn deliver(
        &self,
        from: ActorId,
        to: ActorId,
        msg: BoxMsg,
    ) -> Result<(), Undelivered> {
        match self.try_deliver(from, to, msg)? {
            None => Ok(()),
            Some(wait) => wait.await,
        }
    }

    /// Delivers at once (`None`) or returns the wait for room.
    pub fn try_deliver(
        &self,
        from: ActorId,
        to: ActorId,
        msg: BoxMsg,
    ) -> Result<Option<SlowDelivery>, Undelivered> {
        match self {
            Route::Actor { inbox, .. } => match inbox.try_send(Envelope::Msg { from, msg }) {
                Ok(()) => Ok(None),
                Err(TrySend::Closed) => Err(Undelivered::Closed),
                Err(TrySend::Full(env)) => {
                    let inbox = inbox.clone();
                    Ok(Some(Box::pin(async move {
                        warn_if_slow(inbox.send(env), from, to)
                            .await
                            .map_err(|_| Undelivered::Closed)
                    })))
                }
            },
            Route::Probe { sink, .. } => Ok(sink
                .put(from, msg)?
                .map(|wait| -> SlowDelivery { Box::pin(warn_if_slow(wait, from, to)) })),
        }
    }
}

/// Runs `wait`, logging once if it takes longer than [`SLOW_SEND_WARNING`].
pub(crate) async fn warn_if_slow<F: Future>(wait: F, from: ActorId, to: ActorId) -> F::Output {
    tokio::pin!(wait);
    match tokio::time::timeout(SLOW_SEND_WARNING, &mut wait).await {
        Ok(done) => done,
        Err(_) => {
            tracing::warn!(
                %from, %to,
                "sender blocked for {SLOW_SEND_WARNING:?} on a full mailbox; \
                 a cycle of actors waiting on each other's full mailboxes never clears"
            );
            wait.await
        }
    }
}

/// A probe's channel with its message type erased.
pub(crate) trait ProbeSink: Send + Sync {
    /// Delivers at once (`None`) or returns the wait for room.
    fn put(
        &self,
        from: ActorId,
        msg: BoxMsg,
    ) -> Result<Option<BoxFuture<'static, Result<(), Undelivered>>>, Undelivered>;
}

pub(crate) struct TypedSink<M>(pub mpsc::Sender<(ActorId, M)>);

impl<M: Message> ProbeSink for TypedSink<M> {
    fn put(
        &self,
        from: ActorId,
        msg: BoxMsg,
    ) -> Result<Option<BoxFuture<'static, Result<(), Undelivered>>>, Undelivered> {
        let got = msg.type_name();
        let msg = msg
            .into_any()
            .downcast::<M>()
            .map_err(|_| Undelivered::WrongType {
                expected: std::any::type_name::<M>(),
                got,
            })?;
        match self.0.try_send((from, *msg)) {
            Ok(()) => Ok(None),
            Err(TrySendError::Closed(_)) => Err(Undelivered::Closed),
            Err(TrySendError::Full(item)) => {
                let tx = self.0.clone();
                Ok(Some(Box::pin(async move {
                    tx.send(item).await.map_err(|_| Undelivered::Closed)
                })))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::External;
    use crate::hosted::decoder_of;

    #[tokio::test]
    async fn probe_sink_checks_type_and_waits_for_room() {
        let (tx, mut rx) = mpsc::channel::<(ActorId, u32)>(1);
        let route = Route::Probe {
            sink: Arc::new(TypedSink(tx)),
            decoder: decoder_of::<External<u32>>(),
        };
        let a = ActorId::new(1, 1);
        route.deliver(a, a, Box::new(5u32)).await.unwrap();
        let err = route
            .deliver(a, a, Box::new("no".to_string()))
            .await
            .unwrap_err();
        assert!(matches!(err, Undelivered::WrongType { .. }));
        let second = tokio::spawn({
            let route = route.clone();
            async move { route.deliver(a, a, Box::new(6u32)).await }
        });
        assert_eq!(rx.recv().await, Some((a, 5)));
        assert_eq!(rx.recv().await, Some((a, 6)));
        second.await.unwrap().unwrap();
        drop(rx);
        assert_eq!(
            route.deliver(a, a, Box::new(7u32)).await,
            Err(Undelivered::Closed)
        );
    }
}
