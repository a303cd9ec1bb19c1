//! The actor contract.
//!
//! An actor owns its state and reacts to four kinds of input: start, a typed
//! message, one of its timers firing, and a watched peer node going down. Each
//! handler returns after recording effects in its [`Cx`]; it never blocks.
//! One message enum per actor, which is also its wire enum (append-only).

use std::fmt::Debug;
use std::hash::Hash;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cx::Cx;
use crate::id::{ActorId, NodeId};
use crate::recipient::Accept;

/// What may travel between actors: serialisable (for the wire and the
/// simulator's round-trip check), debuggable (for traces), sendable.
pub trait Message: Serialize + DeserializeOwned + Debug + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Debug + Send + 'static> Message for T {}

pub trait Actor: Send + Sized + 'static {
    /// The one message enum of this actor.
    type Msg: Message;
    /// Timer keys: setting a key that is already armed re-arms it. Hashed
    /// (the timer table looks keys up on every set and fire).
    type Timer: Clone + Ord + Hash + Debug + Send + 'static;

    fn on_start(&mut self, _cx: &mut Cx<'_, Self>) {}

    fn on_msg(&mut self, from: ActorId, msg: Self::Msg, cx: &mut Cx<'_, Self>);

    fn on_timer(&mut self, _timer: Self::Timer, _cx: &mut Cx<'_, Self>) {}

    /// A node this actor watches (see [`Cx::watch_node`]) lost its connection.
    fn on_peer_down(&mut self, _node: NodeId, _cx: &mut Cx<'_, Self>) {}

    /// The protocol messages besides `Self::Msg` that reach this actor
    /// through a [`crate::Recipient`]; written with [`crate::accepts!`].
    fn accepts() -> &'static [Accept<Self::Msg>] {
        &[]
    }
}

/// The type of an address outside Gyre's actors (an actix actor, a test
/// probe) that receives messages of type `M`. It is never hosted as an actor
/// itself: hosts route its id to whatever endpoint registered it.
pub struct External<M>(PhantomData<fn() -> M>);

impl<M: Message> Actor for External<M> {
    type Msg = M;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, _msg: M, _cx: &mut Cx<'_, Self>) {}
}
