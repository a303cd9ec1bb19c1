//! Record and replay: a run's record (what its executions, cells and
//! steps did, [`schema`]) drives the simulated cluster with that workload
//! and those costs ([`run`]), so a user can see how far the simulator's
//! step times and role changes are from their cluster's before trusting
//! it with a scheduling study.
//!
//! - [`schema`]: the versioned JSON-lines record, written by `gyre train
//!   --record` and checked line by line on reading;
//! - [`workload`] and [`costs`]: the record as the simulated backends'
//!   workload source and cost model;
//! - [`observe`]: the scheduling plane's dispatches and role changes, read
//!   after every simulator event without adding any;
//! - [`run`]: the replay and its comparison; [`plot`]: both timelines.

pub mod costs;
pub mod observe;
pub mod plot;
pub mod run;
pub mod schema;
pub mod workload;

pub use run::{ReplayReport, replay};
pub use schema::{Outcome, Recording, read};
pub use workload::ReplayWorkload;
