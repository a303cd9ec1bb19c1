//! A hosted actor's own queue of Gyre messages, beside its actix mailbox.
//!
//! A message between two Gyre actors is already boxed by the sender's `Cx`;
//! sending it through actix's mailbox would box it again in an envelope and
//! allocate a queue node for it, and pay the channel's counters and waker
//! (about nine atomic read-modify-writes a message, each dear on a VM). The
//! inbox takes the boxed message as it is: one compare-and-swap to push it,
//! one per batch to take what arrived, and the actor's task is woken only
//! when it had gone idle. The hosting actix actor drains the inbox from a
//! future in its own context, so it still runs as one actix actor in its
//! arbiter, next to the user's own.
//! Every path into a hosted actor goes through here (other Gyre actors,
//! [`super::GyreHandle::tell`], [`super::ActixGyre::send`], its own I/O
//! completions), so one sender's messages keep their order.
//!
//! The queue sits behind a one-word spin lock rather than a mutex: each
//! critical section is a push, a swap or a flag, and a mutex's unlock costs
//! another atomic. The same word says whether the actor parked: after taking
//! a batch the actor parks at once, so a sender that comes while the batch
//! is handled wakes it, and finding nothing new afterwards is a plain load.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Waker};

use crate::hosted::BoxMsg;
use crate::id::ActorId;

/// One queued message and its sender.
pub(super) type Letter = (ActorId, BoxMsg);

/// The state word's bits.
const LOCKED: u8 = 1;
/// The actor waits for a wake-up on the next letter.
const PARKED: u8 = 2;
/// The actor stopped: letters are refused.
const CLOSED: u8 = 4;

/// Spins before the lock holder (a push or a swap away from done, but maybe
/// preempted) is given the core.
const SPINS_BEFORE_YIELD: u32 = 64;

/// The sending side, shared by every route to the actor.
pub(super) struct Inbox {
    state: AtomicU8,
    /// Guarded by `LOCKED`.
    queue: UnsafeCell<VecDeque<Letter>>,
    /// The actor's task, kept across wake-ups so that parking again does not
    /// clone it. Written only by [`Receiver::poll_letter`], under the lock;
    /// read by senders under the lock and by the receiver without it (a
    /// cell of its own, so those shared reads never alias a `&mut` to the
    /// queue a sender holds).
    waker: UnsafeCell<Option<Waker>>,
}

// SAFETY: `queue` is only touched while holding the `LOCKED` bit of `state`
// (taken with an acquiring compare-and-swap, released with a releasing
// store); `waker` is written only under it, by the receiver, which alone
// also reads it outside the lock, so no write races a read. Letters and
// wakers are `Send`.
unsafe impl Sync for Inbox {}

impl Default for Inbox {
    fn default() -> Self {
        Self {
            state: AtomicU8::new(0),
            queue: UnsafeCell::new(VecDeque::new()),
            waker: UnsafeCell::new(None),
        }
    }
}

/// The lock held, with the state word as it was when taken.
struct Guard<'a> {
    inbox: &'a Inbox,
    was: u8,
    /// The flags (`PARKED`, `CLOSED`) the lock leaves set when released; a
    /// panic under the lock releases it unchanged.
    release: u8,
}

impl Guard<'_> {
    fn queue(&mut self) -> &mut VecDeque<Letter> {
        // SAFETY: this guard holds `LOCKED`, so no one else touches it.
        unsafe { &mut *self.inbox.queue.get() }
    }

    fn waker(&self) -> Option<&Waker> {
        // SAFETY: writes happen only under the lock, which this guard holds.
        unsafe { (*self.inbox.waker.get()).as_ref() }
    }

    /// Releases the lock, leaving `flags` set.
    fn unlock(mut self, flags: u8) {
        self.release = flags;
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.inbox.state.store(self.release, Ordering::Release);
    }
}

impl Inbox {
    /// Takes the lock unless the inbox is closed.
    fn lock(&self) -> Option<Guard<'_>> {
        let mut spins = 0;
        let mut was = self.state.load(Ordering::Relaxed);
        loop {
            if was & CLOSED != 0 {
                return None;
            }
            if was & LOCKED == 0 {
                match self.state.compare_exchange_weak(
                    was,
                    was | LOCKED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        return Some(Guard {
                            inbox: self,
                            was,
                            release: was,
                        });
                    }
                    Err(now) => {
                        was = now;
                        continue;
                    }
                }
            }
            spins += 1;
            if spins < SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                spins = 0;
                std::thread::yield_now();
            }
            was = self.state.load(Ordering::Relaxed);
        }
    }

    /// Queues `letter`; false (and the letter dropped) once the actor stopped.
    pub(super) fn push(&self, letter: Letter) -> bool {
        let Some(mut guard) = self.lock() else {
            return false;
        };
        let parked = guard.was & PARKED != 0;
        guard.queue().push_back(letter);
        if parked {
            if let Some(waker) = guard.waker() {
                // Tokio only schedules the task here; it runs later, so
                // waking under the lock cannot re-enter it.
                waker.wake_by_ref();
            }
        }
        guard.unlock(0);
        true
    }

    /// Refuses further letters and drops the queued ones.
    pub(super) fn close(&self) {
        let Some(mut guard) = self.lock() else {
            return;
        };
        let queued = std::mem::take(guard.queue());
        guard.unlock(CLOSED);
        drop(queued);
    }

    #[cfg(test)]
    pub(super) fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }
}

/// The receiving side, polled by the hosting actix actor. Dropping it (the
/// actor stopped or its arbiter went away) closes the inbox.
pub(super) struct Receiver {
    inbox: Arc<Inbox>,
    /// The batch taken from the queue, delivered before the lock is taken
    /// again.
    batch: VecDeque<Letter>,
}

impl Receiver {
    pub(super) fn new(inbox: Arc<Inbox>) -> Self {
        Self {
            inbox,
            batch: VecDeque::new(),
        }
    }

    /// Whether the waker the inbox holds wakes this task.
    fn waker_current(&self, cx: &Context<'_>) -> bool {
        // SAFETY: only this receiver's `poll_letter` writes the waker, so reading
        // it here cannot race with a write; senders and `close` never write
        // it, and the queue beside it is not touched.
        let waker = unsafe { &*self.inbox.waker.get() };
        waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
    }

    /// The next letter, or pending (and the task woken on the next push).
    pub(super) fn poll_letter(&mut self, cx: &mut Context<'_>) -> Poll<Letter> {
        let this = self;
        if let Some(letter) = this.batch.pop_front() {
            return Poll::Ready(letter);
        }
        // Parked since the last batch and nothing came: no lock needed.
        if this.inbox.state.load(Ordering::Acquire) == PARKED && this.waker_current(cx) {
            return Poll::Pending;
        }
        // A closed inbox stays pending: its actor is stopping already and
        // the receiver goes with it.
        let Some(mut guard) = this.inbox.lock() else {
            return Poll::Pending;
        };
        if !this.waker_current(cx) {
            // SAFETY: under the lock, and only this receiver writes it.
            unsafe { *this.inbox.waker.get() = Some(cx.waker().clone()) };
        }
        std::mem::swap(guard.queue(), &mut this.batch);
        guard.unlock(PARKED);
        match this.batch.pop_front() {
            Some(letter) => Poll::Ready(letter),
            None => Poll::Pending,
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.inbox.close();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    struct CountWakes(AtomicUsize);
    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn letter(n: u64) -> Letter {
        (ActorId::new(0, n), Box::new(n))
    }

    /// An inbox, its receiver, and a waker that counts its wake-ups.
    fn receiver() -> (Arc<Inbox>, Receiver, Arc<CountWakes>, Waker) {
        let inbox = Arc::new(Inbox::default());
        let receiver = Receiver::new(Arc::clone(&inbox));
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&wakes));
        (inbox, receiver, wakes, waker)
    }

    fn number(letter: Letter) -> u64 {
        *letter.1.into_any().downcast::<u64>().expect("a u64 letter")
    }

    #[test]
    fn letters_come_out_in_order_and_a_parked_actor_is_woken_once() {
        let (inbox, mut receiver, wakes, waker) = receiver();
        let mut cx = Context::from_waker(&waker);
        assert!(receiver.poll_letter(&mut cx).is_pending());
        for n in 0..5 {
            assert!(inbox.push(letter(n)));
        }
        assert_eq!(
            wakes.0.load(Ordering::Relaxed),
            1,
            "one wake per idle spell"
        );
        inbox.push(letter(5));
        let mut got = Vec::new();
        while let Poll::Ready(l) = receiver.poll_letter(&mut cx) {
            got.push(number(l));
            if got.len() == 3 {
                // The actor parked when it took the batch, so a letter that
                // comes while it is handled wakes it.
                inbox.push(letter(6));
                assert_eq!(wakes.0.load(Ordering::Relaxed), 2);
            }
        }
        assert_eq!(got, vec![0, 1, 2, 3, 4, 5, 6]);
        inbox.push(letter(7));
        inbox.push(letter(8));
        assert_eq!(wakes.0.load(Ordering::Relaxed), 3);
        let rest: Vec<u64> = std::iter::from_fn(|| match receiver.poll_letter(&mut cx) {
            Poll::Ready(l) => Some(number(l)),
            _ => None,
        })
        .collect();
        assert_eq!(rest, vec![7, 8]);
        assert_eq!(wakes.0.load(Ordering::Relaxed), 3, "nothing came since");
    }

    #[test]
    fn letters_from_many_threads_all_arrive_in_each_senders_order() {
        let (inbox, mut receiver, _wakes, waker) = receiver();
        let mut cx = Context::from_waker(&waker);
        const SENDERS: u64 = 4;
        const EACH: u64 = 2_000;
        let senders: Vec<_> = (0..SENDERS)
            .map(|s| {
                let inbox = Arc::clone(&inbox);
                std::thread::spawn(move || {
                    for n in 0..EACH {
                        assert!(inbox.push((ActorId::new(0, s), Box::new(n))));
                    }
                })
            })
            .collect();
        let mut next = vec![0; SENDERS as usize];
        let mut got = 0;
        while got < SENDERS * EACH {
            match receiver.poll_letter(&mut cx) {
                Poll::Ready(letter) => {
                    let from = letter.0;
                    let n = number(letter);
                    assert_eq!(n, next[from.local as usize], "sender {from}");
                    next[from.local as usize] += 1;
                    got += 1;
                }
                _ => std::thread::yield_now(),
            }
        }
        for s in senders {
            s.join().expect("sender thread");
        }
        assert!(receiver.poll_letter(&mut cx).is_pending());
    }

    #[test]
    fn a_dropped_receiver_refuses_letters() {
        let inbox = Arc::new(Inbox::default());
        let receiver = Receiver::new(Arc::clone(&inbox));
        assert!(inbox.push(letter(1)));
        drop(receiver);
        assert!(inbox.is_closed());
        assert!(!inbox.push(letter(2)));
    }
}
