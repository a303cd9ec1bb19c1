//! gyre-runtime: the actor contract every Gyre protocol is written against,
//! and the hosts that carry it out.
//!
//! Actors decide; hosts carry out. An actor is a deterministic state machine:
//! a typed message, a timer or an I/O completion comes in, effects go out
//! through its [`Cx`]. Handlers never block, read a clock, spawn threads or
//! touch the network, so the very same actor code runs in
//! - [`sim`]: one thread, virtual integer-nanosecond time, one seed, a
//!   modelled network with faults, a running trace hash and exact replay;
//! - [`live`]: tokio tasks with bounded mailboxes, real timers, an I/O worker
//!   pool, and TCP between OS processes;
//! - [`actix_host`] (feature `actix`): inside a user's actix system.

#[cfg(feature = "actix")]
pub mod actix_host;
pub mod actor;
pub mod blob;
pub mod codec;
pub mod cx;
pub mod error;
pub mod hosted;
pub mod id;
pub mod io;
pub mod live;
pub mod payload;
pub mod recipient;
pub mod rng;
pub mod sim;
pub mod time;
pub mod timers;

pub use actor::{Actor, External, Message};
pub use blob::{BlobError, BlobId, BlobStore, MemBlobs, get_decoded, put_encoded};
pub use codec::{Bincode, Codec, CodecError};
pub use cx::Cx;
pub use error::RuntimeError;
pub use hosted::{BoxMsg, DynActor, Effect, Env, ErasedMsg, IdAlloc, hosted};
pub use id::{ActorId, Addr, NodeId};
pub use io::{IoError, IoRequest};
pub use payload::{PayloadRead, PayloadRelease, PayloadWrite};
pub use recipient::{Accept, Recipient, Tagged, Target, message_key};
pub use rng::{ActorRng, derive_seed};
pub use time::{MICROS, MILLIS, Nanos, SECS};

/// Version of the wire protocol (frame layout and every wire enum). Peers
/// with a different version are refused at the handshake: bincode's layout is
/// positional, so enums are append-only and any incompatible change bumps this.
/// 2: payload handles (`BlobId`) in the scheduling plane's protocols.
/// 3: `Recipient` replies, sent as `Tell` frames naming the message's key.
pub const PROTOCOL_VERSION: u32 = 3;
