//! The decision maths of the scheduling plane, as plain functions and
//! structs the actors call: the capacity ledger (1), the counters and launch
//! rule, boundary and continuous dispatch, the watermark rule (2), the supply
//! check, the burst-end rule (3), prefix membership and staleness
//! statistics (micro-step packing is the trajectory plane's, see
//! `trajectory::packing`). Everything here is pure and unit-tested on its
//! own, so the actors only decide when to apply it.

pub mod counters;
pub mod dispatch;
pub mod ledger;
pub mod prefix;
pub mod staleness;
pub mod supply;
pub mod watermark;

pub use counters::Counters;
pub use dispatch::Dispatcher;
pub use ledger::{Evacuation, Ledger, LedgerError, Role};
pub use staleness::Staleness;
pub use supply::SupplyCheck;
