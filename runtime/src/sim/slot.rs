//! What the simulator keeps per address: a hosted actor, a probe, or the
//! memory of a crashed actor (its type's decoder and how to rebuild it).
//!
//! Probes stand in for whatever sits outside Gyre's actors (a test, an actix
//! actor): they record each message with its arrival time and sender.

use std::any::Any;
use std::cell::RefCell;

use rustc_hash::FxHashMap;

use crate::actor::Message;
use crate::hosted::{BoxMsg, Decoder, DynActor, IdAlloc};
use crate::id::{ActorId, NodeId};
use crate::time::Nanos;

use super::event::Incarnation;

/// One message a probe received.
#[derive(Debug, Clone, PartialEq)]
pub struct Received<M> {
    pub at: Nanos,
    pub from: ActorId,
    pub msg: M,
}

/// A probe's inbox with its message type erased.
pub(crate) trait ProbeSink {
    /// Stores `msg`; a message of another type is dropped and its type name
    /// returned.
    fn accept(&mut self, at: Nanos, from: ActorId, msg: BoxMsg) -> Result<(), &'static str>;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

pub(crate) struct Inbox<M>(pub(crate) Vec<Received<M>>);

impl<M: Message> ProbeSink for Inbox<M> {
    fn accept(&mut self, at: Nanos, from: ActorId, msg: BoxMsg) -> Result<(), &'static str> {
        let got = (*msg).type_name();
        let msg = msg.into_any().downcast::<M>().map_err(|_| got)?;
        self.0.push(Received {
            at,
            from,
            msg: *msg,
        });
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Rebuilds an actor for a restart as the given incarnation, already wrapped
/// for hosting.
pub(crate) type Factory = Box<dyn FnMut(Incarnation) -> Box<dyn DynActor>>;

pub(crate) enum Body {
    Actor(Box<dyn DynActor>),
    Probe(Box<dyn ProbeSink>),
    /// Crashed: messages are dropped until a restart.
    Down,
}

pub(crate) struct Slot {
    pub(crate) body: Body,
    pub(crate) inc: Incarnation,
    pub(crate) decoder: Decoder,
    pub(crate) factory: Option<Factory>,
    /// Nodes this incarnation asked to watch.
    pub(crate) watching: Vec<NodeId>,
}

impl Slot {
    pub(crate) fn new(body: Body, decoder: Decoder, factory: Option<Factory>) -> Self {
        Self {
            body,
            inc: 0,
            decoder,
            factory,
            watching: Vec::new(),
        }
    }
}

/// The per-node spawn counters behind every actor and probe id.
#[derive(Default)]
pub(crate) struct NodeCounters(RefCell<FxHashMap<NodeId, u64>>);

impl IdAlloc for NodeCounters {
    fn alloc(&self, node: NodeId) -> ActorId {
        let mut counters = self.0.borrow_mut();
        // Ids start at 1 on every host (0 is never handed out), so the same
        // spawn order yields the same ids, and the same random streams.
        let next = counters.entry(node).or_insert(1);
        let local = *next;
        *next += 1;
        ActorId { node, local }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_count_per_node() {
        let ids = NodeCounters::default();
        assert_eq!(ids.alloc(NodeId(1)), ActorId::new(1, 1));
        assert_eq!(ids.alloc(NodeId(2)), ActorId::new(2, 1));
        assert_eq!(ids.alloc(NodeId(1)), ActorId::new(1, 2));
    }

    #[test]
    fn inbox_takes_its_type_and_returns_others() {
        let mut inbox = Inbox::<u32>(Vec::new());
        let from = ActorId::new(0, 0);
        assert!(inbox.accept(5, from, Box::new(7u32)).is_ok());
        assert_eq!(
            inbox.accept(6, from, Box::new(String::from("x"))),
            Err(std::any::type_name::<String>())
        );
        assert_eq!(
            inbox.0,
            vec![Received {
                at: 5,
                from,
                msg: 7
            }]
        );
    }
}
