//! Identifiers of the scheduling plane.
//!
//! Every id is derived from a counter the owning actor keeps (the dispatch
//! counter for executions, the packer's sequence for micro-steps), never
//! drawn at random, so a simulation seed reproduces every one of them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A policy version: incremented by each optimizer step.
pub type Version = u64;

/// A training step index; step `s` trains on version `s` and produces `s + 1`.
pub type Step = u64;

/// One execution: the value of the dispatch counter `d` when it was accepted.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ExecId(pub u64);

/// One query's group of N executions: executions `g·N .. g·N + N − 1`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupId(pub u64);

impl ExecId {
    /// The group this execution belongs to, for groups of `n` executions.
    pub fn group(self, n: u32) -> GroupId {
        GroupId(self.0 / u64::from(n.max(1)))
    }
}

/// One model call of one execution; `seq` counts the execution's calls.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CallId {
    pub exec: ExecId,
    pub seq: u32,
}

/// An inference engine the proxy can route to: one per cell, plus the
/// standalone pool (capacity C_s) when there is one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EngineIx {
    Pool,
    Cell(u32),
}

/// One role change of one cell, numbered by the scheduler; messages of an
/// older switch are recognised and ignored.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SwitchId(pub u64);

/// One micro-step of one training step.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MicroStepId {
    pub step: Step,
    pub seq: u32,
}

macro_rules! debug_as {
    ($t:ty, $fmt:literal, $($field:tt)+) => {
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.$($field)+)
            }
        }
    };
}

debug_as!(ExecId, "e{}", 0);
debug_as!(GroupId, "g{}", 0);
debug_as!(SwitchId, "sw{}", 0);

impl fmt::Debug for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}.c{}", self.exec, self.seq)
    }
}

impl fmt::Debug for MicroStepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}.m{}", self.step, self.seq)
    }
}

impl fmt::Debug for EngineIx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineIx::Pool => write!(f, "pool"),
            EngineIx::Cell(c) => write!(f, "cell{c}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executions_group_by_consecutive_runs_of_n() {
        assert_eq!(ExecId(0).group(4), GroupId(0));
        assert_eq!(ExecId(3).group(4), GroupId(0));
        assert_eq!(ExecId(4).group(4), GroupId(1));
        // A zero group size is treated as one rather than dividing by zero.
        assert_eq!(ExecId(7).group(0), GroupId(7));
    }

    #[test]
    fn ids_render_compactly() {
        let call = CallId {
            exec: ExecId(5),
            seq: 2,
        };
        assert_eq!(format!("{call:?}"), "e5.c2");
        assert_eq!(format!("{:?}", EngineIx::Cell(3)), "cell3");
        assert_eq!(format!("{:?}", MicroStepId { step: 1, seq: 9 }), "s1.m9");
    }
}
