//! The watermark rule (2) and the burst-end rule (3).
//!
//! w(t) = d(t) − f(t) counts executions dispatched and not finished. Under
//! boundary dispatch it never rises inside a burst, so once the rollout
//! capacity left after a switch covers w, it keeps covering it until the
//! next publication, and no execution displaced by a switch waits for room.

/// Rule (2), for moving `cells` more cells (each of capacity C_e) out of
/// rollout at once: w ≤ C_R − cells·C_e. The elastic policy moves one cell at
/// a time (`cells = 1`); Colocate moves all K together.
pub fn may_move(watermark: u64, rollout_capacity: u64, cell_capacity: u32, cells: u32) -> bool {
    let leaving = u64::from(cell_capacity) * u64::from(cells);
    watermark.saturating_add(leaving) <= rollout_capacity
}

/// Inputs of the burst-end decision, SPEC 2.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstEnd {
    /// Ready groups the next batch already has (capped at what it needs).
    pub ready: u64,
    /// ⌈ρ_min·B⌉.
    pub threshold: u64,
    /// w at the end of the burst, before the next dispatch.
    pub watermark: u64,
    /// μ·N·B: executions about to be dispatched.
    pub next_dispatch: u64,
    pub pool_capacity: u32,
    pub cells: u32,
    pub cell_capacity: u32,
}

/// Whether the core stays in training after publishing: the next batch
/// already has ρ_min·B ready groups, and (3)
/// w + μ·N·B ≤ C_s + (K − 1)·C_e.
pub fn core_stays(b: &BurstEnd) -> bool {
    let room = u64::from(b.pool_capacity)
        + u64::from(b.cells.saturating_sub(1)) * u64::from(b.cell_capacity);
    b.ready >= b.threshold && b.watermark.saturating_add(b.next_dispatch) <= room
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_two_keeps_room_for_all_unfinished_work() {
        // C_R = 12, C_e = 4: the next cell may go while w ≤ 8.
        assert!(may_move(8, 12, 4, 1));
        assert!(!may_move(9, 12, 4, 1));
        // The last rollout cell without a pool: only with nothing unfinished.
        assert!(may_move(0, 4, 4, 1));
        assert!(!may_move(1, 4, 4, 1));
        // Colocate: all K = 3 cells at once, pool of 2.
        assert!(may_move(2, 14, 4, 3));
        assert!(!may_move(3, 14, 4, 3));
        // Nothing to give: C_R already zero.
        assert!(!may_move(0, 0, 4, 1));
    }

    fn end(ready: u64, watermark: u64, pool: u32, cells: u32) -> BurstEnd {
        BurstEnd {
            ready,
            threshold: 2,
            watermark,
            next_dispatch: 8,
            pool_capacity: pool,
            cells,
            cell_capacity: 4,
        }
    }

    #[test]
    fn core_stays_only_with_supply_and_room() {
        // Room = 0 + 3·4 = 12; w + 8 ≤ 12 ⇔ w ≤ 4.
        assert!(core_stays(&end(2, 4, 0, 4)));
        assert!(!core_stays(&end(2, 5, 0, 4)));
        // Not enough ready groups for the next batch: the core returns.
        assert!(!core_stays(&end(1, 0, 0, 4)));
        // K = 1 without a pool: the core must return to serve rollout.
        assert!(!core_stays(&end(5, 0, 0, 1)));
        // K = 1 with a pool big enough for everything: it may stay.
        assert!(core_stays(&end(5, 0, 8, 1)));
    }
}
