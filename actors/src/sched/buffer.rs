//! The trajectory buffer: execution outcomes, grouped by query.
//!
//! A group is ready only when all N of its executions are closed and
//! resolved (SPEC 3.3): a valid score (a valid zero included, and partial
//! credit for unfinished work), a zero-reward dummy for a complete failure,
//! or excluded when no valid reward came within the time budget. Pending
//! evaluations hold the group back; exclusion does not, since an excluded
//! execution simply contributes nothing to the loss, and a group that never
//! became ready would starve boundary dispatch, which dispatches exactly the
//! groups a burst consumes. Each group is handed to the stream packer once.

use std::collections::BTreeMap;

use gyre_runtime::{Actor, ActorId, Addr, Cx};
use serde::{Deserialize, Serialize};

use crate::sched::ids::{ExecId, GroupId, Version};
use crate::sched::packer::{Packer, PackerMsg};

/// What an execution contributes to training.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Resolution {
    Valid {
        reward: f64,
        partial: bool,
    },
    /// Placeholder for a complete failure: zero reward, no tokens.
    Dummy,
    /// No valid reward within the budget: its trajectories are dropped.
    Excluded,
}

/// One execution of a group handed to the packer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub exec: ExecId,
    pub resolution: Resolution,
    pub tokens: u64,
}

impl Sample {
    /// Trainable tokens: only a valid execution's sampled tokens train.
    pub fn trainable_tokens(&self) -> u64 {
        match self.resolution {
            Resolution::Valid { .. } => self.tokens,
            Resolution::Dummy | Resolution::Excluded => 0,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub enum BufferMsg {
    /// The stream packer asks to hear about ready groups.
    Subscribe { packer: Addr<Packer> },
    /// An evaluation failed and will be retried.
    Pending {
        exec: ExecId,
        group: GroupId,
        v_d: Version,
    },
    Resolved {
        exec: ExecId,
        group: GroupId,
        v_d: Version,
        resolution: Resolution,
        tokens: u64,
    },
    /// Hand a ready group to the packer.
    Take {
        group: GroupId,
        reply_to: Addr<Packer>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Filling,
    Ready,
    Taken,
}

#[derive(Debug, Clone)]
struct Entry {
    v_d: Version,
    /// `None` while the evaluation is pending.
    execs: BTreeMap<ExecId, Option<Sample>>,
    state: GroupState,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferStats {
    pub ready: u64,
    pub taken: u64,
    pub valid: u64,
    pub dummies: u64,
    pub excluded: u64,
    pub pending_events: u64,
    /// Messages that contradict the protocol (a result for a taken group,
    /// a take of a group that is not ready).
    pub violations: u64,
}

#[derive(Debug)]
pub struct Buffer {
    group_size: u32,
    groups: BTreeMap<GroupId, Entry>,
    packer: Option<Addr<Packer>>,
    stats: BufferStats,
}

/// Whether a group of `n` executions with these slots is ready.
pub fn group_ready(n: u32, slots: &BTreeMap<ExecId, Option<Sample>>) -> bool {
    slots.len() as u64 == u64::from(n) && slots.values().all(Option::is_some)
}

impl Buffer {
    pub fn new(group_size: u32) -> Self {
        Self {
            group_size,
            groups: BTreeMap::new(),
            packer: None,
            stats: BufferStats::default(),
        }
    }

    pub fn stats(&self) -> BufferStats {
        self.stats
    }

    pub fn state_of(&self, group: GroupId) -> Option<GroupState> {
        self.groups.get(&group).map(|e| e.state)
    }

    fn entry(&mut self, group: GroupId, v_d: Version) -> &mut Entry {
        self.groups.entry(group).or_insert_with(|| Entry {
            v_d,
            execs: BTreeMap::new(),
            state: GroupState::Filling,
        })
    }

    fn announce(&self, group: GroupId, v_d: Version, cx: &mut Cx<'_, Self>) {
        if let Some(p) = self.packer {
            cx.send(p, PackerMsg::Ready { group, v_d });
        }
    }
}

impl Actor for Buffer {
    type Msg = BufferMsg;
    type Timer = ();

    fn on_msg(&mut self, _from: ActorId, msg: BufferMsg, cx: &mut Cx<'_, Self>) {
        match msg {
            BufferMsg::Subscribe { packer } => {
                self.packer = Some(packer);
                let ready: Vec<_> = self
                    .groups
                    .iter()
                    .filter(|(_, e)| e.state == GroupState::Ready)
                    .map(|(g, e)| (*g, e.v_d))
                    .collect();
                for (g, v) in ready {
                    self.announce(g, v, cx);
                }
            }
            BufferMsg::Pending { exec, group, v_d } => {
                self.stats.pending_events += 1;
                let e = self.entry(group, v_d);
                if e.state == GroupState::Filling {
                    e.execs.entry(exec).or_insert(None);
                }
            }
            BufferMsg::Resolved {
                exec,
                group,
                v_d,
                resolution,
                tokens,
            } => {
                let n = self.group_size;
                let e = self.entry(group, v_d);
                if e.state != GroupState::Filling {
                    self.stats.violations += 1;
                    return;
                }
                e.execs.insert(
                    exec,
                    Some(Sample {
                        exec,
                        resolution,
                        tokens,
                    }),
                );
                let ready = group_ready(n, &e.execs);
                if ready {
                    e.state = GroupState::Ready;
                }
                match resolution {
                    Resolution::Valid { .. } => self.stats.valid += 1,
                    Resolution::Dummy => self.stats.dummies += 1,
                    Resolution::Excluded => self.stats.excluded += 1,
                }
                if ready {
                    self.stats.ready += 1;
                    self.announce(group, v_d, cx);
                }
            }
            BufferMsg::Take { group, reply_to } => {
                let Some(e) = self.groups.get_mut(&group) else {
                    self.stats.violations += 1;
                    cx.send(reply_to, PackerMsg::NotReady { group });
                    return;
                };
                if e.state != GroupState::Ready {
                    self.stats.violations += 1;
                    cx.send(reply_to, PackerMsg::NotReady { group });
                    return;
                }
                e.state = GroupState::Taken;
                self.stats.taken += 1;
                let samples: Vec<Sample> = e.execs.values().flatten().copied().collect();
                let v_d = e.v_d;
                // The samples now live in the packer; keep only the state.
                e.execs.clear();
                cx.send(
                    reply_to,
                    PackerMsg::Taken {
                        group,
                        v_d,
                        samples,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(exec: u64, resolution: Option<Resolution>) -> (ExecId, Option<Sample>) {
        (
            ExecId(exec),
            resolution.map(|resolution| Sample {
                exec: ExecId(exec),
                resolution,
                tokens: 10,
            }),
        )
    }

    #[test]
    fn readiness_needs_every_execution_resolved() {
        let valid_zero = Resolution::Valid {
            reward: 0.0,
            partial: false,
        };
        let full: BTreeMap<_, _> = [
            slot(0, Some(valid_zero)),
            slot(1, Some(Resolution::Dummy)),
            slot(2, Some(Resolution::Excluded)),
        ]
        .into_iter()
        .collect();
        assert!(group_ready(3, &full));
        // One missing execution: not ready.
        assert!(!group_ready(4, &full));
        // A pending evaluation is not a zero: not ready.
        let pending: BTreeMap<_, _> = [slot(0, Some(valid_zero)), slot(1, None)]
            .into_iter()
            .collect();
        assert!(!group_ready(2, &pending));
    }

    #[test]
    fn only_valid_outcomes_carry_trainable_tokens() {
        let s = |resolution| Sample {
            exec: ExecId(0),
            resolution,
            tokens: 42,
        };
        let partial = Resolution::Valid {
            reward: 0.5,
            partial: true,
        };
        assert_eq!(s(partial).trainable_tokens(), 42);
        assert_eq!(s(Resolution::Dummy).trainable_tokens(), 0);
        assert_eq!(s(Resolution::Excluded).trainable_tokens(), 0);
    }
}
