//! The trajectory buffer: execution outcomes, grouped by query.
//!
//! A group is ready only when all N of its executions are closed and their
//! results final (SPEC 3.3), in the trajectory plane's terms
//! ([`Outcome`], [`group_ready`]): a valid score (a valid zero included,
//! and partial credit for unfinished work), a zero-reward dummy for a
//! complete failure, or excluded when no valid reward came within the time
//! budget. Pending evaluations hold the group back; exclusion does not,
//! since an excluded execution simply contributes nothing to the loss, and
//! a group that never became ready would starve boundary dispatch, which
//! dispatches exactly the groups a burst consumes. A final result is bound
//! for good: a second one for the same execution is refused. Each group is
//! handed to the stream packer once.
//!
//! The buffer holds what decides readiness and weighting, one small
//! [`Sample`] per execution; a recorded execution's calls go to the
//! packer's sample source, where its rows are made, so no trajectory tree
//! ever travels in a message.

use std::collections::BTreeMap;

use gyre_runtime::{Actor, ActorId, Cx, Recipient};

use crate::sched::ids::{ExecId, GroupId, Version};
pub use crate::sched::msg::buffer::BufferMsg;
use crate::sched::msg::packer::PackerMsg;
pub use crate::sched::samples::Sample;
use crate::trajectory::scoring::{Outcome, group_ready};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Filling,
    Ready,
    Taken,
}

#[derive(Debug, Clone)]
struct Entry {
    v_d: Version,
    execs: BTreeMap<ExecId, Sample>,
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
    /// a second final result for one execution, a take of a group that is
    /// not ready).
    pub violations: u64,
}

#[derive(Debug)]
pub struct Buffer {
    group_size: u32,
    groups: BTreeMap<GroupId, Entry>,
    packer: Option<Recipient<PackerMsg>>,
    stats: BufferStats,
}

fn entry(groups: &mut BTreeMap<GroupId, Entry>, group: GroupId, v_d: Version) -> &mut Entry {
    groups.entry(group).or_insert_with(|| Entry {
        v_d,
        execs: BTreeMap::new(),
        state: GroupState::Filling,
    })
}

/// Whether a group of `n` executions with these samples is ready.
fn is_ready(n: u32, execs: &BTreeMap<ExecId, Sample>) -> bool {
    execs.len() as u64 == u64::from(n) && group_ready(execs.values().map(|s| &s.outcome))
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

    /// The result recorded for `exec` of `group`, until the group is taken.
    pub fn outcome(&self, group: GroupId, exec: ExecId) -> Option<&Outcome> {
        Some(&self.groups.get(&group)?.execs.get(&exec)?.outcome)
    }

    fn announce(&self, group: GroupId, v_d: Version, cx: &mut Cx<'_, Self>) {
        if let Some(p) = self.packer {
            cx.send(p, PackerMsg::Ready { group, v_d });
        }
    }

    fn pending(&mut self, exec: ExecId, group: GroupId, v_d: Version) {
        self.stats.pending_events += 1;
        let e = entry(&mut self.groups, group, v_d);
        if e.state != GroupState::Filling {
            self.stats.violations += 1;
            return;
        }
        let slot = e.execs.entry(exec).or_insert(Sample {
            exec,
            outcome: Outcome::Pending { attempts: 0 },
            tokens: 0,
            records: Vec::new(),
        });
        match &mut slot.outcome {
            Outcome::Pending { attempts } => *attempts += 1,
            Outcome::Open => slot.outcome = Outcome::Pending { attempts: 1 },
            _ => self.stats.violations += 1,
        }
    }

    /// Records a result; returns whether it made the group ready.
    fn resolved(&mut self, sample: Sample, group: GroupId, v_d: Version) -> bool {
        let n = self.group_size;
        let e = entry(&mut self.groups, group, v_d);
        let bound = e
            .execs
            .get(&sample.exec)
            .is_some_and(|s| s.outcome.is_final());
        if e.state != GroupState::Filling || bound {
            self.stats.violations += 1;
            return false;
        }
        let outcome = sample.outcome.clone();
        e.execs.insert(sample.exec, sample);
        let ready = is_ready(n, &e.execs);
        if ready {
            e.state = GroupState::Ready;
        }
        match outcome {
            Outcome::Valid { .. } => self.stats.valid += 1,
            Outcome::Dummy => self.stats.dummies += 1,
            Outcome::Excluded { .. } => self.stats.excluded += 1,
            Outcome::Open | Outcome::Pending { .. } => self.stats.pending_events += 1,
        }
        if ready {
            self.stats.ready += 1;
        }
        ready
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
            BufferMsg::Pending { exec, group, v_d } => self.pending(exec, group, v_d),
            BufferMsg::Resolved {
                exec,
                group,
                v_d,
                outcome,
                tokens,
                records,
            } => {
                let sample = Sample {
                    exec,
                    outcome,
                    tokens,
                    records,
                };
                if self.resolved(sample, group, v_d) {
                    self.announce(group, v_d, cx);
                }
            }
            BufferMsg::Take { group, reply_to } => {
                let Some(e) = self
                    .groups
                    .get_mut(&group)
                    .filter(|e| e.state == GroupState::Ready)
                else {
                    self.stats.violations += 1;
                    cx.send(reply_to, PackerMsg::NotReady { group });
                    return;
                };
                e.state = GroupState::Taken;
                self.stats.taken += 1;
                // The samples now live in the packer; keep only the state.
                let samples: Vec<Sample> = std::mem::take(&mut e.execs).into_values().collect();
                let v_d = e.v_d;
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

    fn buffer_with(n: u32, results: &[(u64, Outcome)]) -> (Buffer, Vec<bool>) {
        let mut b = Buffer::new(n);
        let ready = results
            .iter()
            .map(|(exec, outcome)| {
                let sample = Sample {
                    exec: ExecId(*exec),
                    outcome: outcome.clone(),
                    tokens: 10,
                    records: Vec::new(),
                };
                b.resolved(sample, GroupId(0), 0)
            })
            .collect();
        (b, ready)
    }

    fn valid_zero() -> Outcome {
        Outcome::Valid {
            score: 0.0,
            partial: false,
        }
    }

    #[test]
    fn readiness_needs_every_execution_final() {
        let full = [
            (0, valid_zero()),
            (1, Outcome::Dummy),
            (2, Outcome::Excluded { attempts: 1 }),
        ];
        let (b, ready) = buffer_with(3, &full);
        assert_eq!(ready, vec![false, false, true]);
        assert_eq!(b.state_of(GroupId(0)), Some(GroupState::Ready));
        assert_eq!(
            (b.stats().valid, b.stats().dummies, b.stats().excluded),
            (1, 1, 1)
        );
        // One execution missing: not ready.
        let (b, _) = buffer_with(4, &full);
        assert_eq!(b.state_of(GroupId(0)), Some(GroupState::Filling));
    }

    #[test]
    fn pending_is_not_a_zero_and_blocks_until_resolved() {
        let mut b = Buffer::new(2);
        assert!(!b.resolved(
            Sample {
                exec: ExecId(0),
                outcome: valid_zero(),
                tokens: 3,
                records: Vec::new(),
            },
            GroupId(0),
            0
        ));
        b.pending(ExecId(1), GroupId(0), 0);
        b.pending(ExecId(1), GroupId(0), 0);
        assert_eq!(
            b.outcome(GroupId(0), ExecId(1)),
            Some(&Outcome::Pending { attempts: 2 })
        );
        assert_eq!(b.state_of(GroupId(0)), Some(GroupState::Filling));
        let late = Sample {
            exec: ExecId(1),
            outcome: valid_zero(),
            tokens: 3,
            records: Vec::new(),
        };
        assert!(b.resolved(late.clone(), GroupId(0), 0));
        // A second final result is refused, and so is anything once ready.
        assert!(!b.resolved(late, GroupId(0), 0));
        b.pending(ExecId(1), GroupId(0), 0);
        assert_eq!(b.stats().violations, 2);
        assert_eq!(b.outcome(GroupId(0), ExecId(1)), Some(&valid_zero()));
    }

    #[test]
    fn only_outcomes_that_train_carry_trainable_tokens() {
        let s = |outcome| Sample {
            exec: ExecId(0),
            outcome,
            tokens: 42,
            records: Vec::new(),
        };
        let partial = Outcome::Valid {
            score: 0.5,
            partial: true,
        };
        assert_eq!(s(partial).trainable_tokens(), 42);
        assert_eq!(s(Outcome::Dummy).trainable_tokens(), 0);
        assert_eq!(s(Outcome::Excluded { attempts: 0 }).trainable_tokens(), 0);
        assert_eq!(s(Outcome::Pending { attempts: 1 }).trainable_tokens(), 0);
    }
}
