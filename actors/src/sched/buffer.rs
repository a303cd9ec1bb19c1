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
//! Over-sampling (`SchedConfig::oversample` = M > 0): N + M executions are
//! dispatched per group and the group is formed by the first N that close
//! with a valid outcome, in the order their results arrive. Dummies and
//! excluded executions never take a slot ahead of a valid one: they fill
//! the group (earliest first) only once all N + M have a final result and
//! fewer than N are valid, so a group still always forms and counts stay
//! complete. At formation the buffer tells the scheduler which executions
//! are surplus (still queued, running or being evaluated), and it hands
//! every surplus result, now and later, to the packer to be discarded:
//! surplus records never train. With M = 0 this is exactly the rule above.
//!
//! The buffer holds what decides readiness and weighting, one small
//! [`Sample`] per execution; a recorded execution's calls go to the
//! packer's sample source, where its rows are made, so no trajectory tree
//! ever travels in a message.

use std::collections::BTreeMap;

use gyre_runtime::{Actor, ActorId, Addr, Cx, Recipient};

use crate::sched::ids::{ExecId, GroupId, Version};
pub use crate::sched::msg::buffer::BufferMsg;
use crate::sched::msg::packer::PackerMsg;
pub use crate::sched::samples::Sample;
use crate::sched::scheduler::{SchedMsg, Scheduler};
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
    /// Executions with a final result, in the order the results came.
    order: Vec<ExecId>,
    /// The N executions that form the group, once formed.
    members: Vec<ExecId>,
    state: GroupState,
}

/// What one result did to its group.
#[derive(Debug, Default)]
struct Resolution {
    ready: bool,
    /// Surplus executions without a final result yet: to be cancelled.
    cancel: Vec<ExecId>,
    /// Surplus results: to be discarded untrained.
    discard: Vec<Sample>,
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
    /// Over-sampling: surplus executions named for cancellation at
    /// formation, and surplus results discarded.
    pub surplus_cancelled: u64,
    pub surplus_discarded: u64,
}

#[derive(Debug)]
pub struct Buffer {
    group_size: u32,
    /// N + M: executions dispatched per group.
    dispatched: u32,
    groups: BTreeMap<GroupId, Entry>,
    packer: Option<Recipient<PackerMsg>>,
    sched: Option<Addr<Scheduler>>,
    stats: BufferStats,
}

fn entry(groups: &mut BTreeMap<GroupId, Entry>, group: GroupId, v_d: Version) -> &mut Entry {
    groups.entry(group).or_insert_with(|| Entry {
        v_d,
        execs: BTreeMap::new(),
        order: Vec::new(),
        members: Vec::new(),
        state: GroupState::Filling,
    })
}

/// The members of a group of `n` out of `dispatched` executions, if it is
/// formed: the first `n` valid results, or, once all `dispatched` are final
/// with fewer valid, the valid ones plus the earliest other final results.
fn members(n: u32, dispatched: u32, e: &Entry) -> Option<Vec<ExecId>> {
    let n = n as usize;
    let valid = |x: &ExecId| {
        e.execs
            .get(x)
            .is_some_and(|s| matches!(s.outcome, Outcome::Valid { .. }))
    };
    let mut chosen: Vec<ExecId> = e.order.iter().copied().filter(valid).take(n).collect();
    if chosen.len() < n {
        let all_final = e.order.len() >= dispatched as usize
            && group_ready(e.execs.values().map(|s| &s.outcome));
        if !all_final {
            return None;
        }
        let rest = e.order.iter().copied().filter(|x| !valid(x));
        chosen.extend(rest.take(n - chosen.len()));
    }
    Some(chosen)
}

impl Buffer {
    pub fn new(group_size: u32) -> Self {
        Self {
            group_size,
            dispatched: group_size,
            groups: BTreeMap::new(),
            packer: None,
            sched: None,
            stats: BufferStats::default(),
        }
    }

    /// Groups of N + M dispatched executions (over-sampling); `dispatched`
    /// below N is taken as N.
    pub fn with_dispatched(mut self, dispatched: u32) -> Self {
        self.dispatched = dispatched.max(self.group_size);
        self
    }

    /// Where surplus executions are reported for cancellation.
    pub fn with_sched(mut self, sched: Addr<Scheduler>) -> Self {
        self.sched = Some(sched);
        self
    }

    fn oversampled(&self) -> bool {
        self.dispatched > self.group_size
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
        let oversampled = self.oversampled();
        let e = entry(&mut self.groups, group, v_d);
        if e.state != GroupState::Filling {
            // A surplus execution still being evaluated is no violation.
            if !oversampled || e.members.contains(&exec) {
                self.stats.violations += 1;
            }
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

    /// Records a result: whether it formed the group, and what became
    /// surplus.
    fn resolved(&mut self, sample: Sample, group: GroupId, v_d: Version) -> Resolution {
        let (n, dispatched, oversampled) = (self.group_size, self.dispatched, self.oversampled());
        let e = entry(&mut self.groups, group, v_d);
        let mut out = Resolution::default();
        if e.state != GroupState::Filling {
            if oversampled && !e.members.contains(&sample.exec) {
                self.stats.surplus_discarded += 1;
                out.discard.push(sample);
            } else {
                self.stats.violations += 1;
            }
            return out;
        }
        let bound = e
            .execs
            .get(&sample.exec)
            .is_some_and(|s| s.outcome.is_final());
        if bound {
            self.stats.violations += 1;
            return out;
        }
        let outcome = sample.outcome.clone();
        if outcome.is_final() {
            e.order.push(sample.exec);
        }
        e.execs.insert(sample.exec, sample);
        match outcome {
            Outcome::Valid { .. } => self.stats.valid += 1,
            Outcome::Dummy => self.stats.dummies += 1,
            Outcome::Excluded { .. } => self.stats.excluded += 1,
            Outcome::Open | Outcome::Pending { .. } => self.stats.pending_events += 1,
        }
        let Some(chosen) = members(n, dispatched, e) else {
            return out;
        };
        e.state = GroupState::Ready;
        self.stats.ready += 1;
        out.ready = true;
        if oversampled {
            let first = group.0 * u64::from(dispatched);
            out.cancel = (first..first + u64::from(dispatched))
                .map(ExecId)
                .filter(|x| !e.execs.contains_key(x))
                .collect();
            let execs = std::mem::take(&mut e.execs);
            for (id, s) in execs {
                if chosen.contains(&id) {
                    e.execs.insert(id, s);
                } else if s.outcome.is_final() {
                    out.discard.push(s);
                } else {
                    // Still being evaluated: its result comes later.
                    out.cancel.push(id);
                }
            }
            self.stats.surplus_cancelled += out.cancel.len() as u64;
            self.stats.surplus_discarded += out.discard.len() as u64;
        }
        e.members = chosen;
        out
    }

    /// Sends what a result made surplus to the scheduler and the packer.
    fn hand_off_surplus(&self, out: &mut Resolution, cx: &mut Cx<'_, Self>) {
        if let Some(sched) = self.sched
            && !out.cancel.is_empty()
        {
            let execs = std::mem::take(&mut out.cancel);
            cx.send(sched, SchedMsg::Surplus { execs });
        }
        if let Some(p) = self.packer
            && !out.discard.is_empty()
        {
            let samples = std::mem::take(&mut out.discard);
            cx.send(p, PackerMsg::Discard { samples });
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
                let mut out = self.resolved(sample, group, v_d);
                self.hand_off_surplus(&mut out, cx);
                if out.ready {
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
                b.resolved(sample, GroupId(0), 0).ready
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
        assert!(
            !b.resolved(
                Sample {
                    exec: ExecId(0),
                    outcome: valid_zero(),
                    tokens: 3,
                    records: Vec::new(),
                },
                GroupId(0),
                0
            )
            .ready
        );
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
        assert!(b.resolved(late.clone(), GroupId(0), 0).ready);
        // A second final result is refused, and so is anything once ready.
        assert!(!b.resolved(late, GroupId(0), 0).ready);
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

    fn sample(exec: u64, outcome: Outcome) -> Sample {
        Sample {
            exec: ExecId(exec),
            outcome,
            tokens: 5,
            records: Vec::new(),
        }
    }

    fn valid(score: f32) -> Outcome {
        Outcome::Valid {
            score,
            partial: false,
        }
    }

    #[test]
    fn oversampled_group_forms_from_the_first_n_valid() {
        // N = 2 of 4 dispatched (group 1: executions 4..8). A dummy and an
        // excluded result arrive first; they take no slot ahead of valid ones.
        let mut b = Buffer::new(2).with_dispatched(4);
        let g = GroupId(1);
        let out = b.resolved(sample(5, Outcome::Dummy), g, 0);
        assert!(!out.ready && out.cancel.is_empty() && out.discard.is_empty());
        assert!(
            !b.resolved(sample(7, Outcome::Excluded { attempts: 1 }), g, 0)
                .ready
        );
        assert!(!b.resolved(sample(6, valid(1.0)), g, 0).ready);
        let out = b.resolved(sample(4, valid(0.0)), g, 0);
        assert!(out.ready);
        assert!(out.cancel.is_empty(), "all four closed: nothing to cancel");
        let mut dropped: Vec<u64> = out.discard.iter().map(|s| s.exec.0).collect();
        dropped.sort_unstable();
        assert_eq!(dropped, vec![5, 7]);
        assert_eq!(b.groups[&g].members, vec![ExecId(6), ExecId(4)]);
        assert_eq!(b.stats().surplus_discarded, 2);
    }

    #[test]
    fn surplus_still_open_is_named_for_cancellation_and_discarded_later() {
        let mut b = Buffer::new(2).with_dispatched(5);
        let g = GroupId(0);
        b.pending(ExecId(3), g, 0);
        assert!(!b.resolved(sample(1, valid(0.5)), g, 0).ready);
        let out = b.resolved(sample(4, valid(0.0)), g, 0);
        assert!(out.ready);
        // 0 and 2 never closed; 3 is being evaluated: all three are surplus.
        assert_eq!(out.cancel, vec![ExecId(0), ExecId(2), ExecId(3)]);
        assert_eq!(b.stats().surplus_cancelled, 3);
        // Their late results (and a late pending) are discarded, no violation.
        b.pending(ExecId(3), g, 0);
        let late = b.resolved(sample(0, valid(1.0)), g, 0);
        assert!(!late.ready && late.discard.len() == 1);
        assert_eq!(b.stats().violations, 0);
        // A second result for a member is still a violation.
        assert!(b.resolved(sample(4, valid(1.0)), g, 0).discard.is_empty());
        assert_eq!(b.stats().violations, 1);
    }

    #[test]
    fn failures_fill_the_group_only_when_every_execution_is_final() {
        // N = 3 of 4: one valid, three failures. The group forms only with
        // the fourth result, from the valid one and the earliest failures.
        let mut b = Buffer::new(3).with_dispatched(4);
        let g = GroupId(0);
        assert!(!b.resolved(sample(2, Outcome::Dummy), g, 0).ready);
        assert!(!b.resolved(sample(0, valid(1.0)), g, 0).ready);
        assert!(
            !b.resolved(sample(3, Outcome::Excluded { attempts: 0 }), g, 0)
                .ready
        );
        let out = b.resolved(sample(1, Outcome::Dummy), g, 0);
        assert!(out.ready);
        assert_eq!(b.groups[&g].members, vec![ExecId(0), ExecId(2), ExecId(3)]);
        assert_eq!(out.discard.len(), 1);
        assert_eq!(out.discard[0].exec, ExecId(1));
    }
}
