//! The backends of the scheduling plane, each a small message protocol.
//!
//! An actor addresses a backend by its protocol, a [`Port`], not by the type
//! that implements it, so a simulated engine (simulations/) and a live one
//! answer the same requests. Each request carries the typed address of the
//! actor to answer; answers are events the asking actor's message enum
//! converts from.

pub mod engine;
pub mod evaluator;
pub mod harness;
pub mod memory;
pub mod payload;
pub mod trainer;
pub mod transfer;

use gyre_runtime::{Actor, Addr, External};

/// The address of whatever actor speaks protocol `M` (its `Msg` is `M`).
pub type Port<M> = Addr<External<M>>;

/// The port of a hosted backend actor.
pub fn port<A: Actor>(addr: Addr<A>) -> Port<A::Msg> {
    Addr::new(addr.id())
}
