//! The capacity ledger: which engine may serve how many executions, and
//! where each running execution is placed.
//!
//! With k cells out of the rollout role the rollout capacity is
//! C_R = C_s + (K − k)·C_e (SPEC 2.1, equation (1)). The ledger is the
//! scheduler's single account of that capacity: every start places an
//! execution on an engine with a free slot, and every rollout→training
//! transition first reserves a slot elsewhere for each execution it displaces
//! (SPEC 2.5 step 2), so the sum of placements never exceeds C_R.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::sched::ids::{EngineIx, ExecId};

/// C_R = C_s + (K − k)·C_e, equation (1).
pub fn rollout_capacity(pool: u32, cells: u32, training: u32, cell_capacity: u32) -> u64 {
    u64::from(pool) + u64::from(cells.saturating_sub(training)) * u64::from(cell_capacity)
}

/// A cell's role as the scheduler accounts for it. Only `Rollout` cells
/// serve executions and count towards C_R; `ToTraining` and `Training` cells
/// form the training set, which must be a prefix {0..k−1}.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Rollout,
    /// Between the decision to switch and joining the batch.
    ToTraining,
    Training,
    /// Between leaving training and its engine serving again.
    Returning,
    /// Its node was lost (see `scheduler::loss`): it offers no slot until
    /// it rejoins.
    Lost,
}

impl Role {
    /// In the training set (switching in, or training).
    pub fn is_training_side(self) -> bool {
        matches!(self, Role::ToTraining | Role::Training)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("cell {0} does not exist")]
    NoSuchCell(u32),
    #[error("cell {cell} is {role:?}, not in rollout")]
    NotRollout { cell: u32, role: Role },
    #[error("{need} displaced executions do not fit the {free} free slots elsewhere")]
    NoRoom { need: u64, free: u64 },
    #[error("cell {cell} cannot go from {from:?} to {to:?}")]
    BadRole { cell: u32, from: Role, to: Role },
}

/// One execution displaced by a switch, with the slot reserved for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evacuation {
    pub exec: ExecId,
    pub from: u32,
    pub to: EngineIx,
}

/// Rollout capacity and placements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    cell_capacity: u32,
    pool_capacity: u32,
    roles: Vec<Role>,
    used: Vec<u32>,
    pool_used: u32,
    placements: BTreeMap<ExecId, EngineIx>,
    /// The pool's node was lost: it offers no slot until it rejoins.
    pool_lost: bool,
    /// Running executions whose engine was lost and for which no slot was
    /// free: counted as running (p − f), placed again as slots free up.
    unplaced: BTreeSet<ExecId>,
}

impl Ledger {
    /// K cells of capacity C_e, all in rollout, and a pool of capacity C_s.
    pub fn new(cells: u32, cell_capacity: u32, pool_capacity: u32) -> Self {
        Self {
            cell_capacity,
            pool_capacity,
            roles: vec![Role::Rollout; cells as usize],
            used: vec![0; cells as usize],
            pool_used: 0,
            placements: BTreeMap::new(),
            pool_lost: false,
            unplaced: BTreeSet::new(),
        }
    }

    pub fn cells(&self) -> u32 {
        self.roles.len() as u32
    }

    pub fn role(&self, cell: u32) -> Option<Role> {
        self.roles.get(cell as usize).copied()
    }

    pub fn roles(&self) -> &[Role] {
        &self.roles
    }

    /// k: cells not serving rollout (switching, training, returning).
    pub fn out_of_rollout(&self) -> u32 {
        self.roles.iter().filter(|r| **r != Role::Rollout).count() as u32
    }

    /// C_R, equation (1).
    pub fn rollout_capacity(&self) -> u64 {
        rollout_capacity(
            self.pool_offer(),
            self.cells(),
            self.out_of_rollout(),
            self.cell_capacity,
        )
    }

    /// C_s as offered now: 0 while the pool's node is lost.
    pub fn pool_offer(&self) -> u32 {
        if self.pool_lost {
            0
        } else {
            self.pool_capacity
        }
    }

    /// Cells whose node is lost.
    pub fn lost_cells(&self) -> u32 {
        self.roles.iter().filter(|r| **r == Role::Lost).count() as u32
    }

    pub fn pool_lost(&self) -> bool {
        self.pool_lost
    }

    /// p − f as the ledger sees it: executions placed on some engine, and
    /// those a lost engine left without one.
    pub fn running(&self) -> u64 {
        (self.placements.len() + self.unplaced.len()) as u64
    }

    /// Running executions waiting for a slot since their engine was lost.
    pub fn unplaced(&self) -> usize {
        self.unplaced.len()
    }

    /// C_R − (p − f).
    pub fn free_slots(&self) -> u64 {
        self.rollout_capacity().saturating_sub(self.running())
    }

    /// The slots `engine` offers now (0 for a cell out of rollout).
    pub fn capacity_of(&self, engine: EngineIx) -> u32 {
        match engine {
            EngineIx::Pool => self.pool_offer(),
            EngineIx::Cell(c) => match self.role(c) {
                Some(Role::Rollout) => self.cell_capacity,
                _ => 0,
            },
        }
    }

    pub fn used_of(&self, engine: EngineIx) -> u32 {
        match engine {
            EngineIx::Pool => self.pool_used,
            EngineIx::Cell(c) => self.used.get(c as usize).copied().unwrap_or(0),
        }
    }

    pub fn placement(&self, exec: ExecId) -> Option<EngineIx> {
        self.placements.get(&exec).copied()
    }

    /// Engines in destination preference order (SPEC 2.5 step 2): the
    /// standalone pool first, then rollout cells by descending index, the
    /// ones expected to stay in rollout longest, so an execution is rerouted
    /// as rarely as possible within a burst.
    pub fn preference(&self) -> Vec<EngineIx> {
        let mut order = Vec::with_capacity(self.roles.len() + 1);
        if self.pool_capacity > 0 {
            order.push(EngineIx::Pool);
        }
        for c in (0..self.cells()).rev() {
            if self.roles[c as usize] == Role::Rollout {
                order.push(EngineIx::Cell(c));
            }
        }
        order
    }

    /// Engines serving rollout now (in rollout, node not lost), in
    /// preference order, whatever their free slots.
    pub fn serving(&self) -> Vec<EngineIx> {
        self.preference()
            .into_iter()
            .filter(|e| self.capacity_of(*e) > 0)
            .collect()
    }

    fn first_free(&self) -> Option<EngineIx> {
        self.preference()
            .into_iter()
            .find(|e| self.used_of(*e) < self.capacity_of(*e))
    }

    fn add(&mut self, engine: EngineIx, delta: i64) {
        let slot = match engine {
            EngineIx::Pool => &mut self.pool_used,
            EngineIx::Cell(c) => match self.used.get_mut(c as usize) {
                Some(u) => u,
                None => return,
            },
        };
        *slot = (i64::from(*slot) + delta).max(0) as u32;
    }

    /// Places a starting execution on the preferred engine with a free slot.
    pub fn place(&mut self, exec: ExecId) -> Option<EngineIx> {
        if let Some(e) = self.placement(exec) {
            return Some(e);
        }
        let engine = self.first_free()?;
        self.add(engine, 1);
        self.placements.insert(exec, engine);
        Some(engine)
    }

    /// Frees the slot of a finished execution.
    pub fn release(&mut self, exec: ExecId) -> Option<EngineIx> {
        let engine = self.placements.remove(&exec)?;
        self.add(engine, -1);
        Some(engine)
    }

    /// A finished execution that had no slot since its engine was lost.
    pub fn release_unplaced(&mut self, exec: ExecId) -> bool {
        self.unplaced.remove(&exec)
    }

    /// `engine`'s node is lost: it offers no slot from now on (a cell's
    /// role becomes `Lost` whatever it was), and every execution placed
    /// on it moves to the preferred engine with a free slot, or waits
    /// unplaced (`None`) for one. False if it was lost already.
    pub fn lose(&mut self, engine: EngineIx) -> Option<Vec<(ExecId, Option<EngineIx>)>> {
        match engine {
            EngineIx::Pool if self.pool_capacity > 0 && !self.pool_lost => self.pool_lost = true,
            EngineIx::Cell(c) if self.role(c).is_some_and(|r| r != Role::Lost) => {
                self.roles[c as usize] = Role::Lost;
            }
            _ => return None,
        }
        let displaced: Vec<ExecId> = self
            .placements
            .iter()
            .filter(|(_, e)| **e == engine)
            .map(|(x, _)| *x)
            .collect();
        let mut moves = Vec::with_capacity(displaced.len());
        for exec in displaced {
            self.release(exec);
            match self.first_free() {
                Some(to) => {
                    self.add(to, 1);
                    self.placements.insert(exec, to);
                    moves.push((exec, Some(to)));
                }
                None => {
                    self.unplaced.insert(exec);
                    moves.push((exec, None));
                }
            }
        }
        Some(moves)
    }

    /// `engine` serves again after its node was lost (a cell rejoins in
    /// rollout). False if it was not lost.
    pub fn rejoin(&mut self, engine: EngineIx) -> bool {
        match engine {
            EngineIx::Pool if self.pool_lost => self.pool_lost = false,
            EngineIx::Cell(c) if self.role(c) == Some(Role::Lost) => {
                self.roles[c as usize] = Role::Rollout;
            }
            _ => return false,
        }
        true
    }

    /// Places unplaced executions where slots are free, oldest first.
    pub fn place_unplaced(&mut self) -> Vec<(ExecId, EngineIx)> {
        let mut placed = Vec::new();
        while let Some(exec) = self.unplaced.first().copied() {
            let Some(to) = self.first_free() else {
                break;
            };
            self.unplaced.remove(&exec);
            self.add(to, 1);
            self.placements.insert(exec, to);
            placed.push((exec, to));
        }
        placed
    }

    /// Takes `cells` out of rollout (role `ToTraining`) and reserves a slot
    /// elsewhere for every execution placed on them, in execution order and
    /// destination preference order. Nothing changes unless every displaced
    /// execution fits: the watermark rule (2) is what guarantees it does.
    pub fn evacuate(&mut self, cells: &[u32]) -> Result<Vec<Evacuation>, LedgerError> {
        for &c in cells {
            match self.role(c) {
                None => return Err(LedgerError::NoSuchCell(c)),
                Some(Role::Rollout) => {}
                Some(role) => return Err(LedgerError::NotRollout { cell: c, role }),
            }
        }
        let displaced: Vec<(ExecId, u32)> = self
            .placements
            .iter()
            .filter_map(|(x, e)| match e {
                EngineIx::Cell(c) if cells.contains(c) => Some((*x, *c)),
                _ => None,
            })
            .collect();
        let mut after = self.clone();
        for &c in cells {
            after.roles[c as usize] = Role::ToTraining;
        }
        let need = displaced.len() as u64;
        let free: u64 = after
            .preference()
            .iter()
            .map(|e| u64::from(after.capacity_of(*e).saturating_sub(after.used_of(*e))))
            .sum();
        if need > free {
            return Err(LedgerError::NoRoom { need, free });
        }
        let mut moves = Vec::with_capacity(displaced.len());
        for (exec, from) in displaced {
            after.release(exec);
            let to = after
                .first_free()
                .ok_or(LedgerError::NoRoom { need, free })?;
            after.add(to, 1);
            after.placements.insert(exec, to);
            moves.push(Evacuation { exec, from, to });
        }
        *self = after;
        Ok(moves)
    }

    /// Moves a cell between non-rollout roles, or back to rollout. Leaving
    /// rollout goes through [`Ledger::evacuate`] only.
    pub fn set_role(&mut self, cell: u32, to: Role) -> Result<(), LedgerError> {
        let from = self.role(cell).ok_or(LedgerError::NoSuchCell(cell))?;
        let ok = match (from, to) {
            (Role::ToTraining, Role::Training | Role::Returning) => true,
            (Role::Training, Role::Returning) => true,
            (Role::Returning, Role::Rollout) => true,
            (a, b) => a == b,
        };
        if !ok {
            return Err(LedgerError::BadRole { cell, from, to });
        }
        self.roles[cell as usize] = to;
        Ok(())
    }

    /// The ledger's own consistency: per-engine counts match placements,
    /// no engine holds more than it offers, nothing sits on a cell out of
    /// rollout, and so Σ placements ≤ C_R.
    pub fn check(&self) -> Result<(), String> {
        let mut count: BTreeMap<EngineIx, u32> = BTreeMap::new();
        for e in self.placements.values() {
            *count.entry(*e).or_default() += 1;
        }
        let mut engines = vec![EngineIx::Pool];
        engines.extend((0..self.cells()).map(EngineIx::Cell));
        for e in engines {
            let placed = count.get(&e).copied().unwrap_or(0);
            if placed != self.used_of(e) {
                return Err(format!(
                    "{e:?}: {placed} placed but {} counted",
                    self.used_of(e)
                ));
            }
            if placed > self.capacity_of(e) {
                return Err(format!(
                    "{e:?} holds {placed} executions but offers {} slots",
                    self.capacity_of(e)
                ));
            }
        }
        if self.placements.len() as u64 > self.rollout_capacity() {
            return Err(format!(
                "{} placed executions exceed C_R = {}",
                self.placements.len(),
                self.rollout_capacity()
            ));
        }
        if !self.unplaced.is_empty() && self.first_free().is_some() {
            return Err(format!(
                "{} executions wait unplaced beside a free slot",
                self.unplaced.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_follows_equation_one() {
        assert_eq!(rollout_capacity(0, 4, 0, 3), 12);
        assert_eq!(rollout_capacity(5, 4, 1, 3), 14);
        assert_eq!(rollout_capacity(0, 1, 1, 3), 0); // K = 1, C_s = 0, core training
        assert_eq!(rollout_capacity(2, 2, 5, 3), 2); // never negative
    }

    #[test]
    fn starts_prefer_the_pool_then_high_cells() {
        let mut l = Ledger::new(3, 1, 1);
        let placed: Vec<_> = (0..4).map(|i| l.place(ExecId(i))).collect();
        assert_eq!(
            placed,
            vec![
                Some(EngineIx::Pool),
                Some(EngineIx::Cell(2)),
                Some(EngineIx::Cell(1)),
                Some(EngineIx::Cell(0))
            ]
        );
        assert_eq!(l.place(ExecId(9)), None);
        assert_eq!(l.free_slots(), 0);
        assert_eq!(l.release(ExecId(2)), Some(EngineIx::Cell(1)));
        assert_eq!(l.place(ExecId(9)), Some(EngineIx::Cell(1)));
        l.check().unwrap();
    }

    #[test]
    fn a_lost_engine_gives_up_its_slots_and_its_executions_move_or_wait() {
        let mut l = Ledger::new(2, 2, 1);
        let placed: Vec<_> = (0..5).filter_map(|i| l.place(ExecId(i))).collect();
        assert_eq!(placed.len(), 5);
        assert_eq!(l.release(ExecId(0)), Some(EngineIx::Pool));
        // Cell 1 holds executions 1 and 2; one fits on the pool.
        let moves = l.lose(EngineIx::Cell(1)).unwrap();
        assert_eq!(
            moves,
            vec![(ExecId(1), Some(EngineIx::Pool)), (ExecId(2), None)]
        );
        assert_eq!(l.role(1), Some(Role::Lost));
        assert_eq!(l.rollout_capacity(), 3, "C_R = C_s + (K − 1)·C_e");
        assert_eq!((l.running(), l.unplaced()), (4, 1));
        assert_eq!(l.lose(EngineIx::Cell(1)), None, "lost once");
        l.check().unwrap();
        // A slot frees: the waiting execution takes it.
        l.release(ExecId(3));
        assert_eq!(l.place_unplaced(), vec![(ExecId(2), EngineIx::Cell(0))]);
        assert!(l.rejoin(EngineIx::Cell(1)));
        assert_eq!(l.rollout_capacity(), 5);
        assert!(l.lose(EngineIx::Pool).is_some());
        assert_eq!((l.pool_offer(), l.rollout_capacity()), (0, 4));
        assert_eq!(l.unplaced(), 0, "the pool's execution moved to cell 1");
        assert!(l.rejoin(EngineIx::Pool) && !l.rejoin(EngineIx::Pool));
        l.check().unwrap();
    }

    #[test]
    fn evacuation_reserves_in_preference_order() {
        let mut l = Ledger::new(3, 2, 1);
        // Fill cell 0 only: pool and cells 2, 1 get the first starts, so
        // place then release to leave executions on cell 0.
        for i in 0..7 {
            l.place(ExecId(i));
        }
        for i in 0..5 {
            l.release(ExecId(i));
        }
        assert_eq!(l.placement(ExecId(5)), Some(EngineIx::Cell(0)));
        let moves: Vec<_> = l
            .evacuate(&[0])
            .unwrap()
            .iter()
            .map(|m| (m.exec, m.from, m.to))
            .collect();
        assert_eq!(
            moves,
            vec![
                (ExecId(5), 0, EngineIx::Pool),
                (ExecId(6), 0, EngineIx::Cell(2))
            ]
        );
        assert_eq!(l.role(0), Some(Role::ToTraining));
        assert_eq!(l.rollout_capacity(), 5);
        l.check().unwrap();
    }

    #[test]
    fn evacuation_refuses_when_the_rest_cannot_hold_it() {
        // K = 1, C_s = 0: the core can only leave an empty engine.
        let mut l = Ledger::new(1, 2, 0);
        l.place(ExecId(0));
        let before = l.clone();
        assert_eq!(
            l.evacuate(&[0]),
            Err(LedgerError::NoRoom { need: 1, free: 0 })
        );
        assert_eq!(l, before);
        l.release(ExecId(0));
        assert_eq!(l.evacuate(&[0]), Ok(vec![]));
        assert_eq!(l.rollout_capacity(), 0);
    }

    #[test]
    fn evacuating_several_cells_never_targets_one_of_them() {
        let mut l = Ledger::new(3, 2, 2);
        for i in 0..6 {
            l.place(ExecId(i));
        }
        // pool: e0,e1; cell2: e2,e3; cell1: e4,e5
        for i in 0..4 {
            l.release(ExecId(i));
        }
        let moves = l.evacuate(&[0, 1, 2]).unwrap();
        assert!(moves.iter().all(|m| m.to == EngineIx::Pool && m.from == 1));
        assert_eq!(l.out_of_rollout(), 3);
        assert!(l.check().is_ok());
        // Four displaced executions, two pool slots: refused as a whole.
        let mut l = Ledger::new(3, 2, 2);
        for i in 0..6 {
            l.place(ExecId(i));
        }
        assert!(matches!(
            l.evacuate(&[1, 2]),
            Err(LedgerError::NoRoom { .. })
        ));
    }

    #[test]
    fn a_destination_about_to_switch_is_evacuated_again() {
        // Cell 0 moves its execution to cell 1 (the only room); when cell 1
        // switches next, that execution moves a second time.
        let mut l = Ledger::new(3, 1, 0);
        for i in 0..3 {
            l.place(ExecId(i)); // e0 -> cell2, e1 -> cell1, e2 -> cell0
        }
        l.release(ExecId(1));
        let first = l.evacuate(&[0]).unwrap();
        assert_eq!((first[0].exec, first[0].to), (ExecId(2), EngineIx::Cell(1)));
        l.release(ExecId(0));
        let second = l.evacuate(&[1]).unwrap();
        assert_eq!(
            (second[0].exec, second[0].from, second[0].to),
            (ExecId(2), 1, EngineIx::Cell(2))
        );
        l.check().unwrap();
    }

    #[test]
    fn roles_move_only_along_the_cycle() {
        let mut l = Ledger::new(2, 1, 0);
        assert!(matches!(
            l.set_role(0, Role::Training),
            Err(LedgerError::BadRole { .. })
        ));
        l.evacuate(&[0]).unwrap();
        assert!(matches!(
            l.evacuate(&[0]),
            Err(LedgerError::NotRollout { .. })
        ));
        l.set_role(0, Role::Training).unwrap();
        assert!(l.role(0).unwrap().is_training_side());
        l.set_role(0, Role::Returning).unwrap();
        assert_eq!(l.rollout_capacity(), 1);
        l.set_role(0, Role::Rollout).unwrap();
        assert_eq!(l.rollout_capacity(), 2);
        assert_eq!(
            l.set_role(7, Role::Rollout),
            Err(LedgerError::NoSuchCell(7))
        );
    }
}
