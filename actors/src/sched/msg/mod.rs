//! Every actor's message enum, one file per actor, beside the backend
//! protocols of [`super::proto`]. Addresses inside messages are
//! [`gyre_runtime::Recipient`]s typed by message, so nothing here imports
//! an actor: ids → messages and protocols → maths → actors.

pub mod buffer;
pub mod cell;
pub mod core;
pub mod evaluator;
pub mod execution;
pub mod packer;
pub mod proxy;
pub mod queue;
pub mod scheduler;
