//! Collectives over the transfer engine, on CPU: the gradient reduction of a
//! training prefix and the parameter broadcast that follows it.
//!
//! - `group`: who takes part (ranks → peers) and how to take a prefix.
//! - `ring`: ring all-reduce of f32 gradients (reduce-scatter, all-gather);
//!   each step is a one-sided WRITE into the right neighbour's inbox followed
//!   by a notification, the transfer engine's write-then-notify pattern.
//! - `broadcast`: the root registers a frozen snapshot; members read it
//!   (striped) and report back.

mod broadcast;
mod group;
mod ring;

pub use group::{CollectiveError, Group, STEP_TIMEOUT};
pub use ring::{RingAllReduce, ring_order_sum};
