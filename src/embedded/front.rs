//! A backend's port: the actor a protocol's requests are addressed to.
//!
//! A backend that does long work (a decode step, a forward/backward pass)
//! must hear about its completions as messages of its own type, but the
//! actors of the scheduling plane address it by protocol (`Port<EngineReq>`
//! is an address whose message type *is* `EngineReq`). So each live backend
//! is two actors: this front, whose message type is the protocol, and a
//! worker spawned beside it, whose message enum wraps the protocol's
//! requests together with the worker's own completions. The front forwards
//! each request unchanged; the worker answers the requester directly (every
//! request carries its reply address), so the hop costs one local send.

use std::marker::PhantomData;

use gyre_runtime::{Actor, ActorId, Addr, Cx, Message};

/// Forwards protocol `M` to a worker `W` it spawns at start.
#[derive(Debug)]
pub struct Front<M, W: Actor> {
    worker: Option<W>,
    addr: Option<Addr<W>>,
    /// Requests that arrived before the worker existed (none do on the
    /// hosts we have; kept so no request can be lost if one ever does).
    early: Vec<M>,
    _msg: PhantomData<fn() -> M>,
}

impl<M, W> Front<M, W>
where
    M: Message,
    W: Actor,
    W::Msg: From<M>,
{
    pub fn new(worker: W) -> Self {
        Self {
            worker: Some(worker),
            addr: None,
            early: Vec::new(),
            _msg: PhantomData,
        }
    }

    /// The worker, once started: tests read its state through it.
    pub fn worker(&self) -> Option<Addr<W>> {
        self.addr
    }
}

impl<M, W> Actor for Front<M, W>
where
    M: Message,
    W: Actor,
    W::Msg: From<M>,
{
    type Msg = M;
    type Timer = ();

    fn on_start(&mut self, cx: &mut Cx<'_, Self>) {
        if let Some(w) = self.worker.take() {
            let addr = cx.spawn(w);
            self.addr = Some(addr);
            for m in self.early.drain(..) {
                cx.send(addr, m);
            }
        }
    }

    fn on_msg(&mut self, _from: ActorId, msg: M, cx: &mut Cx<'_, Self>) {
        match self.addr {
            Some(addr) => cx.send(addr, msg),
            None => self.early.push(msg),
        }
    }
}
