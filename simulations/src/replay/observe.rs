//! What the scheduling plane did, observed from outside: after every
//! simulator event, the dispatch counter and every cell's role are read
//! through the simulator's read-only view. Nothing is sent, so observing
//! adds no event and leaves the trace hash as it is; the embedded run
//! (`gyre train --record`) and the replay use the same observer, so their
//! role changes are read the same way.

use std::cell::RefCell;
use std::rc::Rc;

use gyre_actors::sched::cell::CellRole;
use gyre_actors::sched::scheduler::Scheduler;
use gyre_runtime::sim::{Sim, SimView};
use gyre_runtime::{Addr, Nanos};

use super::schema::{Op, Role, Switch};

/// A cell's role changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleChange {
    pub cell: u32,
    pub from: CellRole,
    pub to: CellRole,
    pub at: Nanos,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// When execution `i` was dispatched.
    pub dispatch: Vec<Nanos>,
    pub changes: Vec<RoleChange>,
    roles: Vec<CellRole>,
}

impl Observed {
    fn look(&mut self, view: &SimView<'_>, sched: Addr<Scheduler>) {
        let Some(s) = view.actor(sched) else {
            return;
        };
        let now = view.now();
        let d = s.counters().dispatched();
        while (self.dispatch.len() as u64) < d {
            self.dispatch.push(now);
        }
        let Some(peers) = s.peers() else {
            return;
        };
        for (c, addr) in peers.cells.iter().enumerate() {
            let Some(role) = view.actor(*addr).map(|cell| cell.role()) else {
                continue;
            };
            match self.roles.get_mut(c) {
                Some(old) if *old != role => {
                    self.changes.push(RoleChange {
                        cell: c as u32,
                        from: *old,
                        to: role,
                        at: now,
                    });
                    *old = role;
                }
                Some(_) => {}
                None => self.roles.push(role),
            }
        }
    }
}

/// Observes `sim`'s scheduling plane from now on.
pub fn observe(sim: &mut Sim, sched: Addr<Scheduler>) -> Rc<RefCell<Observed>> {
    let seen = Rc::new(RefCell::new(Observed::default()));
    let s = Rc::clone(&seen);
    sim.set_invariant(move |view| {
        s.borrow_mut().look(view, sched);
        Ok(())
    });
    seen
}

/// The role switches of `changes`: a cell leaving rollout begins a switch
/// to training, which ends when it trains; leaving training begins one
/// back, which ends when it serves again. `step_ends` (sorted) say how many
/// steps were done when each began; `ops` price it.
pub fn switches(changes: &[RoleChange], step_ends: &[Nanos], mu: u32, ops: &[Op]) -> Vec<Switch> {
    let mut out = Vec::new();
    let mut open: Vec<Option<(Role, Nanos)>> = Vec::new();
    for ch in changes {
        let c = ch.cell as usize;
        if open.len() <= c {
            open.resize(c + 1, None);
        }
        let leaving = match (ch.from, ch.to) {
            (CellRole::Rollout, _) => Some(Role::Training),
            (CellRole::Training, _) => Some(Role::Rollout),
            _ => None,
        };
        let arrived = match ch.to {
            CellRole::Training => Some(Role::Training),
            CellRole::Rollout => Some(Role::Rollout),
            _ => None,
        };
        if let (Some(to), Some((want, begin))) = (arrived, open[c])
            && to == want
        {
            out.push(switch(ch.cell, to, begin, ch.at, step_ends, mu, ops));
            open[c] = None;
        } else if arrived.is_some() {
            open[c] = None;
        }
        if let Some(to) = leaving {
            if arrived == Some(to) {
                // Straight into the other role within one event.
                out.push(switch(ch.cell, to, ch.at, ch.at, step_ends, mu, ops));
            } else {
                open[c] = Some((to, ch.at));
            }
        }
    }
    out
}

fn switch(
    cell: u32,
    to: Role,
    begin: Nanos,
    end: Nanos,
    step_ends: &[Nanos],
    mu: u32,
    ops: &[Op],
) -> Switch {
    let step = step_ends.partition_point(|e| *e <= begin) as u64;
    let costs = ops
        .iter()
        .filter(|o| o.cell == Some(cell) && o.start_ns >= begin && o.start_ns <= end)
        .map(|o| (o.op.clone(), o.end_ns - o.start_ns))
        .collect();
    Switch {
        cell,
        to,
        begin_ns: begin,
        end_ns: end,
        step,
        burst: step / u64::from(mu.max(1)),
        costs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(cell: u32, from: CellRole, to: CellRole, at: Nanos) -> RoleChange {
        RoleChange { cell, from, to, at }
    }

    #[test]
    fn role_changes_pair_into_switches_with_their_burst_and_costs() {
        use CellRole::*;
        let changes = [
            ch(1, Rollout, Draining, 10),
            ch(1, Draining, Switching, 12),
            ch(1, Switching, Training, 15),
            ch(1, Training, Returning, 40),
            ch(1, Returning, Rollout, 45),
        ];
        let ops = [Op {
            cell: Some(1),
            op: "engine.load".into(),
            start_ns: 41,
            end_ns: 44,
            step: None,
            tokens: None,
            queued_ns: None,
            execs: None,
        }];
        let s = switches(&changes, &[5, 30, 38], 2, &ops);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].to, s[0].begin_ns, s[0].end_ns),
            (Role::Training, 10, 15)
        );
        assert_eq!((s[0].step, s[0].burst), (1, 0));
        assert_eq!((s[1].to, s[1].step, s[1].burst), (Role::Rollout, 3, 1));
        assert_eq!(s[1].costs, vec![("engine.load".to_owned(), 3)]);
    }
}
