//! Actor and node identities, and typed addresses.
//!
//! Ids are derived, never random: a node id is configured, and an actor's
//! local part comes from its node's spawn counter, so a simulation seed
//! reproduces every id. [`Addr<A>`] carries the actor's type so that a send is
//! checked at compile time; on the wire it is just the [`ActorId`].

use std::fmt;
use std::marker::PhantomData;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One OS process (live host) or one modelled machine (simulator).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct NodeId(pub u32);

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A node plus the node-local spawn counter value.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ActorId {
    pub node: NodeId,
    pub local: u64,
}

impl ActorId {
    pub const fn new(node: u32, local: u64) -> Self {
        Self {
            node: NodeId(node),
            local,
        }
    }

    /// Packs the id into one integer (node in the top 24 bits) for hashing.
    pub fn as_u64(self) -> u64 {
        (u64::from(self.node.0) << 40) ^ self.local
    }
}

impl fmt::Debug for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/a{}", self.node, self.local)
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The address of an actor of type `A`: sends to it must carry `A::Msg`.
pub struct Addr<A> {
    id: ActorId,
    _actor: PhantomData<fn() -> A>,
}

impl<A> Addr<A> {
    /// Types an id. The caller vouches that `id` hosts an `A`; a wrong claim
    /// is caught by the host, which logs and drops the mistyped message.
    pub const fn new(id: ActorId) -> Self {
        Self {
            id,
            _actor: PhantomData,
        }
    }

    pub const fn id(&self) -> ActorId {
        self.id
    }
}

impl<A> Clone for Addr<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Addr<A> {}
impl<A> PartialEq for Addr<A> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl<A> Eq for Addr<A> {}
impl<A> PartialOrd for Addr<A> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<A> Ord for Addr<A> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.id.cmp(&other.id)
    }
}
impl<A> std::hash::Hash for Addr<A> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}
impl<A> fmt::Debug for Addr<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Addr({})", self.id)
    }
}
impl<A> Serialize for Addr<A> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.id.serialize(s)
    }
}
impl<'de, A> Deserialize<'de> for Addr<A> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ActorId::deserialize(d).map(Addr::new)
    }
}
