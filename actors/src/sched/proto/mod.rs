//! The backends of the scheduling plane, each a small message protocol.
//!
//! An actor addresses a backend by its protocol, a [`Port`], not by the type
//! that implements it, so a simulated engine (simulations/) and a live one
//! answer the same requests. Each request carries a `Recipient` of its
//! answer type (events the asking actor's message enum converts from and
//! lists in its `accepts!` table), so no protocol here imports an actor.

pub mod engine;
pub mod evaluator;
pub mod harness;
pub mod memory;
pub mod payload;
pub mod trainer;
pub mod transfer;

use gyre_runtime::{Actor, Addr, Recipient};

/// The address of whatever actor accepts protocol `M`.
pub type Port<M> = Recipient<M>;

/// The port of a hosted backend actor whose message type is its protocol.
pub fn port<A: Actor>(addr: Addr<A>) -> Port<A::Msg> {
    Recipient::of(addr)
}
