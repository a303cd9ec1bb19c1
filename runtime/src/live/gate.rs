//! The admission counter of one actor's mailbox: what makes it bounded.
//!
//! The messages themselves sit in a queue the actor's driver owns; the gate
//! only counts places, so that every sender (an actor on the same driver,
//! another thread, a connection reader, an I/O worker) claims a place with
//! one compare-and-swap and the driver hands it back with one decrement. A
//! driver may also claim a few places at once and keep places it took back
//! for its own actors' next sends (see `Slot::credits`): counted places are
//! either queued or held, so the bound is exact either way, at most `cap`
//! messages are ever queued. A sender that finds no room parks on the gate
//! and is woken only when one is actually waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use tokio::sync::Notify;

/// Why a claim failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRoom {
    Full,
    /// The actor stopped: nothing will take messages out any more.
    Closed,
}

pub(crate) struct Gate {
    queued: AtomicUsize,
    cap: usize,
    /// Senders parked on a full mailbox; the driver only notifies when
    /// this is non-zero.
    waiting: AtomicUsize,
    closed: AtomicBool,
    room: Notify,
}

impl Gate {
    /// A gate for a mailbox of `cap` (at least 1) messages.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Gate {
            queued: AtomicUsize::new(0),
            cap: cap.max(1),
            waiting: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            room: Notify::new(),
        })
    }

    /// Claims a place for one message.
    pub fn try_claim(&self) -> Result<(), NoRoom> {
        let claimed = self
            .queued
            .fetch_update(SeqCst, SeqCst, |q| (q < self.cap).then_some(q + 1));
        match claimed {
            Ok(_) => Ok(()),
            // Checked only when full: a closed actor's gate never drains.
            Err(_) if self.closed.load(SeqCst) => Err(NoRoom::Closed),
            Err(_) => Err(NoRoom::Full),
        }
    }

    /// Claims between one and `want` places, as many as there is room for.
    pub fn try_claim_some(&self, want: usize) -> Result<usize, NoRoom> {
        let mut got = 0;
        let claimed = self.queued.fetch_update(SeqCst, SeqCst, |q| {
            got = want.min(self.cap.saturating_sub(q));
            (got > 0).then_some(q + got)
        });
        match claimed {
            Ok(_) => Ok(got),
            Err(_) if self.closed.load(SeqCst) => Err(NoRoom::Closed),
            Err(_) => Err(NoRoom::Full),
        }
    }

    /// Hands back `n` places (messages taken out, or places held unused).
    pub fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.queued.fetch_sub(n, SeqCst);
        let waiting = self.waiting.load(SeqCst);
        for _ in 0..n.min(waiting) {
            self.room.notify_one();
        }
    }

    /// Whether a sender is parked, waiting for room.
    pub fn has_waiting(&self) -> bool {
        self.waiting.load(SeqCst) > 0
    }

    /// Marks the actor gone and releases every parked sender.
    pub fn close(&self) {
        self.closed.store(true, SeqCst);
        self.room.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    /// Claims a place, waiting for room; `Closed` if the actor stops first.
    pub async fn claim(&self) -> Result<(), NoRoom> {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Counted from before the claim below, so a release in between
            // notifies us; uncounted however this wait ends, cancel included.
            let _waiting = Waiting::new(&self.waiting);
            match self.try_claim() {
                Err(NoRoom::Full) => notified.await,
                done => return done,
            }
        }
    }

    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queued.load(SeqCst)
    }
}

/// One parked claimer, for as long as it is parked.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, SeqCst);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn holds_at_most_cap_and_wakes_a_waiting_claimer() {
        let gate = Gate::new(2);
        assert_eq!(gate.try_claim(), Ok(()));
        assert_eq!(gate.try_claim(), Ok(()));
        assert_eq!(gate.try_claim(), Err(NoRoom::Full));
        let waiter = tokio::spawn({
            let gate = Arc::clone(&gate);
            async move { gate.claim().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a claimer must wait while full");
        assert!(gate.has_waiting());
        gate.release(1);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(gate.queued(), 2);
        // A claim given up half way leaves no waiter behind.
        let given_up = tokio::time::timeout(Duration::from_millis(10), gate.claim()).await;
        assert!(given_up.is_err());
        assert_eq!(gate.waiting.load(SeqCst), 0);
    }

    #[test]
    fn claims_in_chunks_up_to_the_room_left() {
        let gate = Gate::new(5);
        assert_eq!(gate.try_claim_some(3), Ok(3));
        assert_eq!(gate.try_claim_some(3), Ok(2));
        assert_eq!(gate.try_claim_some(1), Err(NoRoom::Full));
        gate.release(4);
        assert_eq!(gate.queued(), 1);
        assert_eq!(gate.try_claim_some(9), Ok(4));
        gate.close();
        assert_eq!(gate.try_claim_some(1), Err(NoRoom::Closed));
    }

    #[tokio::test]
    async fn closing_releases_waiting_claimers() {
        let gate = Gate::new(1);
        gate.try_claim().unwrap();
        let waiter = tokio::spawn({
            let gate = Arc::clone(&gate);
            async move { gate.claim().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        gate.close();
        assert_eq!(waiter.await.unwrap(), Err(NoRoom::Closed));
        assert!(gate.is_closed());
        assert_eq!(gate.try_claim(), Err(NoRoom::Closed));
    }

    #[test]
    fn many_claimers_never_exceed_the_bound() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async {
            let gate = Gate::new(3);
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let claimers: Vec<_> = (0..4u32)
                .map(|s| {
                    let (gate, tx) = (Arc::clone(&gate), tx.clone());
                    tokio::spawn(async move {
                        for i in 0..2000u32 {
                            gate.claim().await.unwrap();
                            tx.send((s, i)).unwrap();
                        }
                    })
                })
                .collect();
            drop(tx);
            let mut next = [0u32; 4];
            let mut got = 0;
            while let Some((s, i)) = rx.recv().await {
                assert!(gate.queued() <= 3);
                assert_eq!(next[s as usize], i, "per-claimer order");
                next[s as usize] += 1;
                got += 1;
                gate.release(1);
            }
            assert_eq!(got, 8000);
            for c in claimers {
                c.await.unwrap();
            }
        });
    }
}
