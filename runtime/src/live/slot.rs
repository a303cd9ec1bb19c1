//! One actor as its driver keeps it: the actor itself, its mailbox queue,
//! the timers that fired for it, and, when a send had to wait for room,
//! the rest of the effects it still owes.
//!
//! The driver owns every slot outright, so nothing here is shared or
//! locked: the only thing other threads touch is the mailbox's [`Gate`]
//! (its admission counter). Inputs are taken in a fixed order: start
//! first, then fired timers, then the mailbox. Sends to itself never wait:
//! when its own mailbox is full they go to an overflow queue, served
//! between mailbox inputs once no earlier send to itself is still queued,
//! so they keep their order and neither queue starves the other.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Waker;

use crate::hosted::{BoxMsg, DynActor, Effect};
use crate::id::{ActorId, NodeId};
use crate::time::Nanos;

use super::gate::Gate;
use super::mailbox::{Envelope, SlowDelivery};

/// Places claimed from a gate at once when a driver holds none for it.
const CREDIT_CHUNK: usize = 8;

/// Where an actor sits in its driver's slab. The generation changes when
/// the place is reused, so a stale key (a late wake-up, a late timer)
/// finds nothing instead of another actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key {
    pub idx: u32,
    pub generation: u32,
}

/// One input to a handler.
pub(crate) enum Input {
    Start,
    Msg { from: ActorId, msg: BoxMsg },
    Timer(u64),
    PeerDown(NodeId),
}

/// A send that found its destination full, and everything the handler
/// recorded after it: none of that happens before the send does.
pub(crate) struct Blocked {
    pub wait: SlowDelivery,
    pub waker: Waker,
    /// For a destination on the same driver, the wait only claims a place;
    /// the message is pushed once it has one.
    pub then_push: Option<(ActorId, BoxMsg)>,
    pub rest: VecDeque<Effect>,
    /// The time the handler saw, if it read one (timers are relative to it).
    pub now: Option<Nanos>,
}

pub(crate) struct Slot {
    pub id: ActorId,
    pub actor: Box<dyn DynActor>,
    pub gate: Arc<Gate>,
    /// Messages that hold a place at the gate.
    pub queue: VecDeque<Envelope>,
    /// Sends to itself that found its own mailbox full (they never wait).
    pub overflow: VecDeque<BoxMsg>,
    /// Tokens of timers that fired, oldest first.
    pub due: VecDeque<u64>,
    pub started: bool,
    /// In the driver's ready queue, or running.
    pub scheduled: bool,
    pub blocked: Option<Box<Blocked>>,
    pub stopping: bool,
    /// Places claimed at the gate that no message holds: the driver keeps
    /// them for the next sends to this actor from its own actors, so that
    /// a steady exchange between two actors of one driver touches no
    /// atomic. Handed back at the end of the driver's round, or at once
    /// when a sender is parked on the gate.
    pub credits: usize,
    /// In the driver's list of slots holding credits.
    pub pooled: bool,
    /// Sends to itself still in `queue`: the overflow waits behind them.
    own_queued: usize,
    /// Whether the last input came from the queue (then the overflow goes
    /// next, if it may).
    last_from_queue: bool,
}

impl Slot {
    pub fn new(actor: Box<dyn DynActor>, gate: Arc<Gate>) -> Self {
        Self {
            id: actor.id(),
            actor,
            gate,
            queue: VecDeque::new(),
            overflow: VecDeque::new(),
            due: VecDeque::new(),
            started: false,
            scheduled: false,
            blocked: None,
            stopping: false,
            credits: 0,
            pooled: false,
            own_queued: 0,
            last_from_queue: false,
        }
    }

    /// Whether a handler is waiting to run (a blocked send aside).
    #[inline]
    pub fn has_input(&self) -> bool {
        !self.started || !self.due.is_empty() || !self.queue.is_empty() || !self.overflow.is_empty()
    }

    /// The next input, giving its mailbox place back.
    #[inline]
    pub fn next_input(&mut self) -> Option<Input> {
        if !self.started {
            self.started = true;
            return Some(Input::Start);
        }
        if let Some(token) = self.due.pop_front() {
            return Some(Input::Timer(token));
        }
        let overflow_next =
            self.last_from_queue && self.own_queued == 0 && !self.overflow.is_empty();
        if !overflow_next && let Some(env) = self.queue.pop_front() {
            self.credits += 1;
            if self.gate.has_waiting() {
                self.return_credits();
            }
            self.last_from_queue = true;
            return Some(match env {
                Envelope::Msg { from, msg } => Input::Msg { from, msg },
                Envelope::Own(msg) => {
                    self.own_queued -= 1;
                    Input::Msg { from: self.id, msg }
                }
                Envelope::PeerDown(node) => Input::PeerDown(node),
            });
        }
        self.last_from_queue = false;
        let msg = self.overflow.pop_front()?;
        Some(Input::Msg { from: self.id, msg })
    }

    /// Takes a place for one message: a held credit, else a few fresh
    /// places from the gate. False when the mailbox is full (or closed).
    #[inline]
    pub fn take_place(&mut self) -> bool {
        if self.credits == 0 {
            // With a sender parked, take only what is needed: a chunk would
            // grab the room the parked sender was just woken for.
            let want = if self.gate.has_waiting() {
                1
            } else {
                CREDIT_CHUNK
            };
            match self.gate.try_claim_some(want) {
                Ok(got) => self.credits = got,
                Err(_) => return false,
            }
        }
        self.credits -= 1;
        true
    }

    /// Hands every held place back to the gate.
    pub fn return_credits(&mut self) {
        self.gate.release(self.credits);
        self.credits = 0;
    }

    /// Queues a send to itself: into the mailbox while it has room and
    /// nothing overflowed before, else into the overflow.
    pub fn send_self(&mut self, msg: BoxMsg) {
        if self.overflow.is_empty() && self.take_place() {
            self.own_queued += 1;
            self.queue.push_back(Envelope::Own(msg));
        } else {
            self.overflow.push_back(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::Actor;
    use crate::cx::Cx;
    use crate::hosted::hosted;

    struct Sink;
    impl Actor for Sink {
        type Msg = u32;
        type Timer = ();
        fn on_msg(&mut self, _: ActorId, _: u32, _: &mut Cx<'_, Self>) {}
    }

    fn slot(cap: usize) -> Slot {
        Slot::new(hosted(Sink, ActorId::new(1, 1), 0), Gate::new(cap))
    }

    fn value(input: Option<Input>) -> u32 {
        match input {
            Some(Input::Msg { msg, .. }) => *msg.into_any().downcast::<u32>().unwrap(),
            _ => panic!("expected a message"),
        }
    }

    fn push(s: &mut Slot, v: u32) {
        s.gate.try_claim().unwrap();
        let from = ActorId::new(1, 9);
        s.queue.push_back(Envelope::Msg {
            from,
            msg: Box::new(v),
        });
    }

    #[test]
    fn start_then_timers_then_mail() {
        let mut s = slot(4);
        push(&mut s, 1);
        s.due.push_back(7);
        assert!(s.has_input());
        assert!(matches!(s.next_input(), Some(Input::Start)));
        assert!(matches!(s.next_input(), Some(Input::Timer(7))));
        assert_eq!(value(s.next_input()), 1);
        assert!(s.next_input().is_none());
        assert!(!s.has_input());
        assert_eq!(s.gate.queued(), 1, "the place is held as a credit");
        assert_eq!(s.credits, 1);
        s.return_credits();
        assert_eq!(s.gate.queued(), 0);
    }

    #[test]
    fn credits_never_let_the_queue_pass_the_bound() {
        let mut s = slot(3);
        let mut queued = 0;
        for _ in 0..10 {
            if s.take_place() {
                queued += 1;
            }
        }
        assert_eq!(queued, 3);
        assert_eq!(s.gate.queued(), 3);
        assert!(s.gate.try_claim().is_err(), "no room left for anyone else");
        s.credits += 1; // a message taken out
        assert!(s.take_place(), "its place is reused without the gate");
        assert!(!s.take_place());
    }

    #[tokio::test]
    async fn a_parked_sender_gets_places_back_at_once() {
        let mut s = slot(1);
        s.started = true;
        push(&mut s, 1);
        let gate = Arc::clone(&s.gate);
        let waiter = tokio::spawn(async move { gate.claim().await });
        while !s.gate.has_waiting() {
            tokio::task::yield_now().await;
        }
        assert_eq!(value(s.next_input()), 1);
        assert_eq!(s.credits, 0, "handed back for the parked sender");
        assert!(waiter.await.unwrap().is_ok());
    }

    #[test]
    fn sends_to_itself_overflow_in_order_and_interleave_with_mail() {
        let mut s = slot(2);
        s.started = true;
        for v in 10u32..15 {
            s.send_self(Box::new(v));
        }
        assert_eq!(s.queue.len(), 2, "the mailbox bound holds for itself too");
        assert_eq!(s.overflow.len(), 3);
        // A later outside message waits for the place the first one frees.
        assert_eq!(value(s.next_input()), 10);
        assert!(
            s.gate.try_claim().is_err(),
            "its place is held until the round ends"
        );
        s.return_credits();
        push(&mut s, 99);
        s.send_self(Box::new(15u32)); // behind the overflow, never ahead of it
        let got: Vec<u32> = std::iter::from_fn(|| s.next_input().map(|i| value(Some(i)))).collect();
        // 11 was queued before 12 overflowed, so it goes first; then the
        // overflow and the mailbox take turns.
        assert_eq!(got, vec![11, 12, 99, 13, 14, 15]);
        s.return_credits();
        assert_eq!(s.gate.queued(), 0);
    }
}
