//! Addresses typed by message: a [`Recipient<M>`] is any actor that accepts `M`.
//!
//! An [`Addr<A>`] names the receiver's type, so a protocol that answers
//! through one has to import whoever asks. A `Recipient<M>` names only the
//! message: it is made from the `Addr<B>` of any actor whose message enum
//! converts from `M` (`B::Msg: From<M>`), and it is what reply fields,
//! subscriptions and backend ports hold. That keeps protocol files free of
//! actors, and lets one backend answer several kinds of asker.
//!
//! The conversion into the receiver's enum happens where the receiver is
//! hosted, never at the sender: a recipient travels inside messages to other
//! nodes, where nothing knows the receiver's type. It is sent as `M` marked
//! with `M`'s [`message_key`] (a [`Tagged`] message, a `Tell` frame on the
//! wire), and the receiver's host turns it into `B::Msg` with the table its
//! actor declares with [`accepts!`](crate::accepts). A recipient whose `M`
//! *is* the receiver's message type is sent as a plain message, at exactly
//! the cost of an `Addr`.

use std::any::{Any, TypeId};
use std::fmt;
use std::marker::PhantomData;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::actor::{Actor, Message};
use crate::codec::{Bincode, Codec, CodecError};
use crate::hosted::{BoxMsg, ErasedMsg};
use crate::id::{ActorId, Addr};

/// A stable name for message type `M` on the wire: FNV-1a of its type path.
/// Peers run the same build (the handshake checks [`crate::PROTOCOL_VERSION`]),
/// so the same type has the same key on every node.
pub fn message_key<M: 'static>() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::any::type_name::<M>().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The address of an actor that accepts messages of type `M`.
pub struct Recipient<M> {
    id: ActorId,
    /// `M` is the receiver's own message type: no conversion needed.
    direct: bool,
    _msg: PhantomData<fn(M)>,
}

impl<M: Message> Recipient<M> {
    /// The recipient for `addr`'s actor. Its message enum converts from `M`
    /// and, unless it *is* `M`, lists `M` in its [`accepts!`](crate::accepts)
    /// table; a missing entry is a programming error, caught here in debug
    /// builds (in release the host drops such messages as mistyped).
    pub fn of<B: Actor>(addr: Addr<B>) -> Self
    where
        B::Msg: From<M>,
    {
        let direct = TypeId::of::<M>() == TypeId::of::<B::Msg>();
        debug_assert!(
            direct || B::accepts().iter().any(|a| (a.key)() == message_key::<M>()),
            "{} converts from {} but its accepts! table does not list it",
            std::any::type_name::<B>(),
            std::any::type_name::<M>(),
        );
        Self {
            id: addr.id(),
            direct,
            _msg: PhantomData,
        }
    }

    pub const fn id(&self) -> ActorId {
        self.id
    }

    /// The same actor, addressed with another message type `N` (one its
    /// accepts! table lists, or its own): for a backend that answers an
    /// asker with a second kind of message. Sent tagged, so the receiver's
    /// host converts it, or drops it as mistyped if it accepts no `N`.
    pub fn same_actor<N: Message>(&self) -> Recipient<N> {
        Recipient {
            id: self.id,
            direct: false,
            _msg: PhantomData,
        }
    }

    /// `msg` ready for the host: plain when the receiver's type is `M`,
    /// tagged for conversion at the receiver otherwise.
    pub(crate) fn wrap(&self, msg: M) -> BoxMsg {
        if self.direct {
            Box::new(msg)
        } else {
            Box::new(Tagged(msg))
        }
    }
}

impl<B: Actor> From<Addr<B>> for Recipient<B::Msg> {
    fn from(addr: Addr<B>) -> Self {
        Recipient::of(addr)
    }
}

/// Where a `Cx::send` can go: a typed [`Addr`] or a [`Recipient`].
pub trait Target: Copy {
    type Msg: Message;
    fn to(&self) -> ActorId;
    fn wrap(&self, msg: Self::Msg) -> BoxMsg;
}

impl<B: Actor> Target for Addr<B> {
    type Msg = B::Msg;
    fn to(&self) -> ActorId {
        self.id()
    }
    fn wrap(&self, msg: B::Msg) -> BoxMsg {
        Box::new(msg)
    }
}

impl<M: Message> Target for Recipient<M> {
    type Msg = M;
    fn to(&self) -> ActorId {
        self.id
    }
    fn wrap(&self, msg: M) -> BoxMsg {
        Recipient::wrap(self, msg)
    }
}

/// A message to be converted into its receiver's type where it is delivered.
pub struct Tagged<M>(pub M);

impl<M: fmt::Debug> fmt::Debug for Tagged<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<M: Message> ErasedMsg for Tagged<M> {
    fn encode(&self) -> Result<Vec<u8>, CodecError> {
        Bincode::encode(&self.0)
    }
    /// The inner `M`: a receiver whose type is `M` takes it as is, others
    /// look it up in their table.
    fn into_any(self: Box<Self>) -> AnyMsg {
        Box::new(self.0)
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<M>()
    }
    fn tag(&self) -> Option<u64> {
        Some(message_key::<M>())
    }
}

/// A delivered message, type erased.
pub type AnyMsg = Box<dyn Any + Send>;

/// One entry of an actor's table: a protocol message `M` its enum `T`
/// converts from.
pub struct Accept<T> {
    pub key: fn() -> u64,
    /// Decodes wire bytes of `M` (still tagged, so a copy re-encodes alike).
    pub decode: fn(&[u8]) -> Result<BoxMsg, CodecError>,
    /// Converts a delivered `M`; hands back anything else.
    pub convert: fn(AnyMsg) -> Result<T, AnyMsg>,
}

impl<T: 'static> Accept<T> {
    pub const fn of<M: Message>() -> Self
    where
        T: From<M>,
    {
        Self {
            key: message_key::<M>,
            decode: decode_tagged::<M>,
            convert: convert::<M, T>,
        }
    }
}

fn decode_tagged<M: Message>(bytes: &[u8]) -> Result<BoxMsg, CodecError> {
    Ok(Box::new(Tagged(Bincode::decode::<M>(bytes)?)))
}

fn convert<M: 'static, T: From<M>>(any: AnyMsg) -> Result<T, AnyMsg> {
    any.downcast::<M>().map(|m| T::from(*m))
}

/// Declares, inside an `impl Actor for X` block, the protocol messages
/// (other than `X::Msg` itself) that `X`'s message enum accepts through a
/// [`Recipient`]. Each listed type needs `X::Msg: From<Type>`.
///
/// ```ignore
/// impl Actor for Cell {
///     type Msg = CellMsg;
///     type Timer = CellTimer;
///     gyre_runtime::accepts!(EngineEvent, TrainerEvent, MemoryEvent);
///     ...
/// }
/// ```
#[macro_export]
macro_rules! accepts {
    ($($m:ty),* $(,)?) => {
        fn accepts() -> &'static [$crate::Accept<Self::Msg>] {
            const { &[$($crate::Accept::of::<$m>()),*] }
        }
    };
}

impl<M> Recipient<M> {
    fn parts(&self) -> (ActorId, bool) {
        (self.id, self.direct)
    }
}

impl<M> Clone for Recipient<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Recipient<M> {}
impl<M> PartialEq for Recipient<M> {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}
impl<M> Eq for Recipient<M> {}
impl<M> PartialOrd for Recipient<M> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<M> Ord for Recipient<M> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}
impl<M> std::hash::Hash for Recipient<M> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}
impl<M> fmt::Debug for Recipient<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Recipient({})", self.id)
    }
}
impl<M> Serialize for Recipient<M> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.parts().serialize(s)
    }
}
impl<'de, M> Deserialize<'de> for Recipient<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (id, direct) = <(ActorId, bool)>::deserialize(d)?;
        Ok(Self {
            id,
            direct,
            _msg: PhantomData,
        })
    }
}
