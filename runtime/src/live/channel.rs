//! The bounded mailbox channel: tokio's unbounded queue behind an admission
//! counter.
//!
//! tokio's bounded channel takes a mutex on every receive to hand the slot
//! back; on a ping-pong between two actors that lock is a tenth of the cost
//! of a message. Here a sender claims a slot with one compare-and-swap on a
//! counter and the receiver returns it with one decrement, waking a waiting
//! sender only when one is actually waiting. The bound is exact: at most
//! `cap` messages are ever queued.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Why `try_send` handed the value back.
pub(crate) enum TrySend<T> {
    Full(T),
    Closed(T),
}

struct Gate {
    queued: AtomicUsize,
    cap: usize,
    /// Senders parked on a full queue; the receiver only notifies when
    /// this is non-zero.
    waiting: AtomicUsize,
    closed: AtomicBool,
    room: Notify,
}

pub(crate) struct Tx<T> {
    tx: UnboundedSender<T>,
    gate: Arc<Gate>,
}

impl<T> Clone for Tx<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            gate: Arc::clone(&self.gate),
        }
    }
}

pub(crate) struct Rx<T> {
    rx: UnboundedReceiver<T>,
    gate: Arc<Gate>,
}

/// A channel holding at most `cap` (at least 1) values.
pub(crate) fn bounded<T>(cap: usize) -> (Tx<T>, Rx<T>) {
    let (tx, rx) = unbounded_channel();
    let gate = Arc::new(Gate {
        queued: AtomicUsize::new(0),
        cap: cap.max(1),
        waiting: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        room: Notify::new(),
    });
    (
        Tx {
            tx,
            gate: Arc::clone(&gate),
        },
        Rx { rx, gate },
    )
}

impl<T> Tx<T> {
    pub fn try_send(&self, value: T) -> Result<(), TrySend<T>> {
        let gate = &*self.gate;
        let claimed = gate
            .queued
            .fetch_update(SeqCst, SeqCst, |q| (q < gate.cap).then_some(q + 1));
        if claimed.is_err() {
            // Checked only here: with room, the send below sees a closed
            // receiver by itself.
            if gate.closed.load(SeqCst) {
                return Err(TrySend::Closed(value));
            }
            return Err(TrySend::Full(value));
        }
        self.tx.send(value).map_err(|e| {
            gate.queued.fetch_sub(1, SeqCst);
            TrySend::Closed(e.0)
        })
    }

    /// Sends, waiting for room; gives the value back if the receiver is gone.
    pub async fn send(&self, mut value: T) -> Result<(), T> {
        let gate = &*self.gate;
        loop {
            let notified = gate.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            gate.waiting.fetch_add(1, SeqCst);
            let attempt = self.try_send(value);
            match attempt {
                Ok(()) => {
                    gate.waiting.fetch_sub(1, SeqCst);
                    return Ok(());
                }
                Err(TrySend::Closed(v)) => {
                    gate.waiting.fetch_sub(1, SeqCst);
                    return Err(v);
                }
                Err(TrySend::Full(v)) => value = v,
            }
            notified.await;
            gate.waiting.fetch_sub(1, SeqCst);
        }
    }

    #[cfg(test)]
    pub fn is_closed(&self) -> bool {
        self.gate.closed.load(SeqCst)
    }
}

impl<T> Rx<T> {
    /// The next value; `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<T> {
        let value = self.rx.recv().await?;
        self.gate.queued.fetch_sub(1, SeqCst);
        if self.gate.waiting.load(SeqCst) > 0 {
            self.gate.room.notify_one();
        }
        Some(value)
    }
}

impl<T> Drop for Rx<T> {
    fn drop(&mut self) {
        self.gate.closed.store(true, SeqCst);
        self.rx.close();
        self.gate.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn holds_at_most_cap_and_wakes_a_waiting_sender() {
        let (tx, mut rx) = bounded::<u32>(2);
        assert!(tx.try_send(1).is_ok());
        assert!(tx.try_send(2).is_ok());
        assert!(matches!(tx.try_send(3), Err(TrySend::Full(3))));
        let waiter = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(3).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "sender must wait while full");
        assert_eq!(rx.recv().await, Some(1));
        waiter.await.unwrap().unwrap();
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, Some(3));
    }

    #[tokio::test]
    async fn dropping_the_receiver_releases_waiting_senders() {
        let (tx, rx) = bounded::<u32>(1);
        tx.try_send(1).ok();
        let waiter = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(2).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(rx);
        assert_eq!(waiter.await.unwrap(), Err(2));
        assert!(tx.is_closed());
        assert!(matches!(tx.try_send(3), Err(TrySend::Closed(3))));
    }

    #[test]
    fn many_senders_never_exceed_the_bound_and_lose_nothing() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, mut rx) = bounded::<(u32, u32)>(3);
            let gate = Arc::clone(&tx.gate);
            let senders: Vec<_> = (0..4)
                .map(|s| {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        for i in 0..2000 {
                            tx.send((s, i)).await.unwrap();
                        }
                    })
                })
                .collect();
            drop(tx);
            let mut next = [0u32; 4];
            let mut got = 0;
            while let Some((s, i)) = rx.recv().await {
                assert!(gate.queued.load(SeqCst) <= 3);
                assert_eq!(next[s as usize], i, "per-sender order");
                next[s as usize] += 1;
                got += 1;
            }
            assert_eq!(got, 8000);
            for s in senders {
                s.await.unwrap();
            }
        });
    }
}
