//! Where a message for a local address goes: an actor's bounded mailbox or a
//! probe's channel.
//!
//! A [`Route`] is cheap to clone, so actor tasks cache the routes they use and
//! a local send costs a hash lookup and a `try_send`. When the mailbox is full
//! the sender awaits room: that wait is the backpressure, and nothing is ever
//! buffered beyond the configured capacity.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::channel::{TrySend, Tx};

use crate::actor::Message;
use crate::hosted::{BoxMsg, Decoder};
use crate::id::{ActorId, NodeId};

/// What an actor task receives.
pub(crate) enum Envelope {
    Msg { from: ActorId, msg: BoxMsg },
    PeerDown(NodeId),
}

/// A local destination.
#[derive(Clone)]
pub(crate) enum Route {
    Actor {
        tx: Tx<Envelope>,
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
        match self {
            Route::Actor { tx, .. } => match tx.try_send(Envelope::Msg { from, msg }) {
                Ok(()) => Ok(()),
                Err(TrySend::Closed(_)) => Err(Undelivered::Closed),
                Err(TrySend::Full(env)) => send_slow(tx, env, from, to).await,
            },
            Route::Probe { sink, .. } => match sink.put(from, msg)? {
                None => Ok(()),
                Some(wait) => wait.await,
            },
        }
    }
}

async fn send_slow(
    tx: &Tx<Envelope>,
    env: Envelope,
    from: ActorId,
    to: ActorId,
) -> Result<(), Undelivered> {
    let send = tx.send(env);
    tokio::pin!(send);
    let sent = match tokio::time::timeout(SLOW_SEND_WARNING, &mut send).await {
        Ok(sent) => sent,
        Err(_) => {
            tracing::warn!(
                %from, %to,
                "sender blocked for {SLOW_SEND_WARNING:?} on a full mailbox; \
                 a cycle of actors waiting on each other's full mailboxes never clears"
            );
            send.await
        }
    };
    sent.map_err(|_| Undelivered::Closed)
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
