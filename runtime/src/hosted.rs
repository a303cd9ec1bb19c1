//! The type-erased layer between typed actors and the hosts.
//!
//! Hosts store heterogeneous actors as `Box<dyn DynActor>` and move messages
//! as [`BoxMsg`]; they see effects as plain [`Effect`] values and timers as
//! integer tokens. All typing lives in [`Hosted<A>`], so a host is written
//! once for every actor type and never needs to be generic.

use std::any::Any;
use std::fmt::{self, Debug};

use crate::actor::{Actor, Message};
use crate::codec::{Bincode, Codec, CodecError};
use crate::cx::Cx;
use crate::error::RuntimeError;
use crate::id::{ActorId, NodeId};
use crate::io::{IoError, IoRequest};
use crate::recipient::{AnyMsg, message_key};
use crate::rng::{ActorRng, actor_rng};
use crate::time::{Clock, Nanos};
use crate::timers::TimerTable;

/// A message with its type erased; it can still be encoded for the wire.
pub trait ErasedMsg: Send + Debug + 'static {
    fn encode(&self) -> Result<Vec<u8>, CodecError>;
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
    fn type_name(&self) -> &'static str;
    /// The [`crate::recipient::message_key`] of a message that the receiver's
    /// host converts into its type (see [`crate::Recipient`]); `None` for a
    /// message already of the receiver's type.
    fn tag(&self) -> Option<u64> {
        None
    }
}

impl<M: Message> ErasedMsg for M {
    fn encode(&self) -> Result<Vec<u8>, CodecError> {
        Bincode::encode(self)
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<M>()
    }
}

pub type BoxMsg = Box<dyn ErasedMsg>;

/// Decodes wire bytes for one actor: its own message type when untagged,
/// or the accepted protocol message a tag names.
pub type Decoder = fn(Option<u64>, &[u8]) -> Result<BoxMsg, CodecError>;

fn decode_for<A: Actor>(tag: Option<u64>, bytes: &[u8]) -> Result<BoxMsg, CodecError> {
    match tag {
        None => Ok(Box::new(Bincode::decode::<A::Msg>(bytes)?)),
        Some(key) if key == message_key::<A::Msg>() => {
            Ok(Box::new(Bincode::decode::<A::Msg>(bytes)?))
        }
        Some(key) => match A::accepts().iter().find(|a| (a.key)() == key) {
            Some(accept) => (accept.decode)(bytes),
            None => Err(CodecError::NotAccepted {
                ty: std::any::type_name::<A::Msg>(),
                key,
            }),
        },
    }
}

/// The decoder for messages addressed to actors of type `A`.
pub fn decoder_of<A: Actor>() -> Decoder {
    decode_for::<A>
}

/// `msg` as `A`'s message: as it is, or converted through `A`'s table.
fn accept<A: Actor>(msg: AnyMsg) -> Result<A::Msg, AnyMsg> {
    let mut msg = match msg.downcast::<A::Msg>() {
        Ok(own) => return Ok(*own),
        Err(other) => other,
    };
    for entry in A::accepts() {
        msg = match (entry.convert)(msg) {
            Ok(converted) => return Ok(converted),
            Err(other) => other,
        };
    }
    Err(msg)
}

/// Hands out actor ids on a node; hosts implement it with a plain counter
/// (simulator) or an atomic one (live).
pub trait IdAlloc {
    fn alloc(&self, node: NodeId) -> ActorId;
}

/// Outside work with its result mapping, type erased.
pub trait ErasedIo: Send {
    fn kind(&self) -> &'static str;
    /// See [`IoRequest::payload_bytes`].
    fn payload_bytes(&self) -> Option<u64>;
    /// Runs the request and maps its result into the issuer's message.
    fn complete(self: Box<Self>) -> BoxMsg;
    /// Maps a failure the host decided on (fault injection, shutdown).
    fn fail(self: Box<Self>, err: IoError) -> BoxMsg;
}

struct IoOp<R, F> {
    req: R,
    map: F,
}

impl<R, M, F> ErasedIo for IoOp<R, F>
where
    R: IoRequest,
    M: Message,
    F: FnOnce(Result<R::Output, IoError>) -> M + Send + 'static,
{
    fn kind(&self) -> &'static str {
        self.req.kind()
    }
    fn payload_bytes(&self) -> Option<u64> {
        self.req.payload_bytes()
    }
    fn complete(self: Box<Self>) -> BoxMsg {
        let IoOp { req, map } = *self;
        Box::new(map(req.run()))
    }
    fn fail(self: Box<Self>, err: IoError) -> BoxMsg {
        Box::new((self.map)(Err(err)))
    }
}

pub(crate) fn io_op<R, M, F>(req: R, map: F) -> Box<dyn ErasedIo>
where
    R: IoRequest,
    M: Message,
    F: FnOnce(Result<R::Output, IoError>) -> M + Send + 'static,
{
    Box::new(IoOp { req, map })
}

/// What a handler asked its host to do, in the order it asked.
pub enum Effect {
    Send {
        to: ActorId,
        msg: BoxMsg,
    },
    SetTimer {
        token: u64,
        after: Nanos,
    },
    CancelTimer {
        token: u64,
    },
    Spawn {
        id: ActorId,
        actor: Box<dyn DynActor>,
    },
    Io {
        op: Box<dyn ErasedIo>,
    },
    WatchNode(NodeId),
    Stop,
}

impl Debug for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Effect::Send { to, msg } => write!(f, "Send({to}, {msg:?})"),
            Effect::SetTimer { token, after } => write!(f, "SetTimer(#{token}, +{after}ns)"),
            Effect::CancelTimer { token } => write!(f, "CancelTimer(#{token})"),
            Effect::Spawn { id, actor } => write!(f, "Spawn({id}, {})", actor.type_name()),
            Effect::Io { op } => write!(f, "Io({})", op.kind()),
            Effect::WatchNode(n) => write!(f, "WatchNode({n})"),
            Effect::Stop => write!(f, "Stop"),
        }
    }
}

/// What a host lends an actor for one handler call.
pub struct Env<'a> {
    pub now: Clock<'a>,
    pub run_seed: u64,
    pub effects: &'a mut Vec<Effect>,
    pub ids: &'a dyn IdAlloc,
}

/// An actor as hosts see it.
pub trait DynActor: Send {
    fn id(&self) -> ActorId;
    fn type_name(&self) -> &'static str;
    fn decoder(&self) -> Decoder;
    fn start(&mut self, env: &mut Env<'_>);
    /// Delivers a message; a message of the wrong type is returned as an error
    /// and the actor is left untouched.
    fn deliver(
        &mut self,
        from: ActorId,
        msg: BoxMsg,
        env: &mut Env<'_>,
    ) -> Result<(), RuntimeError>;
    /// Fires a timer token; returns false if the token had gone stale.
    fn fire(&mut self, token: u64, env: &mut Env<'_>) -> bool;
    fn peer_down(&mut self, node: NodeId, env: &mut Env<'_>);
    /// The actor's own state, for invariant checks and tests.
    fn state(&self) -> &dyn Any;
    fn state_mut(&mut self) -> &mut dyn Any;
    /// Timers currently armed.
    fn armed_timers(&self) -> usize;
}

/// A typed actor together with what the host keeps for it.
pub struct Hosted<A: Actor> {
    actor: A,
    id: ActorId,
    rng: ActorRng,
    timers: TimerTable<A::Timer>,
}

/// Wraps `actor` for hosting as `id` in a run seeded with `run_seed`.
pub fn hosted<A: Actor>(actor: A, id: ActorId, run_seed: u64) -> Box<dyn DynActor> {
    Box::new(Hosted {
        actor,
        id,
        rng: actor_rng(run_seed, id),
        timers: TimerTable::default(),
    })
}

impl<A: Actor> Hosted<A> {
    fn cx<'a>(&'a mut self, env: &'a mut Env<'_>) -> (&'a mut A, Cx<'a, A>) {
        let cx = Cx::new(
            self.id,
            &env.now,
            env.run_seed,
            &mut *env.effects,
            env.ids,
            &mut self.rng,
            &mut self.timers,
        );
        (&mut self.actor, cx)
    }
}

impl<A: Actor> DynActor for Hosted<A> {
    fn id(&self) -> ActorId {
        self.id
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<A>()
    }

    fn decoder(&self) -> Decoder {
        decoder_of::<A>()
    }

    fn start(&mut self, env: &mut Env<'_>) {
        let (actor, mut cx) = self.cx(env);
        actor.on_start(&mut cx);
    }

    fn deliver(
        &mut self,
        from: ActorId,
        msg: BoxMsg,
        env: &mut Env<'_>,
    ) -> Result<(), RuntimeError> {
        let got = msg.type_name();
        let msg = accept::<A>(msg.into_any()).map_err(|_| RuntimeError::WrongMessageType {
            to: self.id,
            expected: std::any::type_name::<A::Msg>(),
            got,
        })?;
        let (actor, mut cx) = self.cx(env);
        actor.on_msg(from, msg, &mut cx);
        Ok(())
    }

    fn fire(&mut self, token: u64, env: &mut Env<'_>) -> bool {
        let Some(key) = self.timers.fire(token) else {
            return false;
        };
        let (actor, mut cx) = self.cx(env);
        actor.on_timer(key, &mut cx);
        true
    }

    fn peer_down(&mut self, node: NodeId, env: &mut Env<'_>) {
        let (actor, mut cx) = self.cx(env);
        actor.on_peer_down(node, &mut cx);
    }

    fn state(&self) -> &dyn Any {
        &self.actor
    }

    fn state_mut(&mut self) -> &mut dyn Any {
        &mut self.actor
    }

    fn armed_timers(&self) -> usize {
        self.timers.len()
    }
}
