//! What every cell (and the standalone pool) was doing over a run, sampled
//! at a fixed virtual-time tick, and the GPU-time shares it adds up to.
//!
//! A rollout cell's GPU time is weighted by slot occupancy (executions
//! placed on it / C_e): a cell serving half its slots spends half its time
//! rolling out and half idle. A training-side cell is training while its
//! trainer computes (warm-up, micro-steps, drain, and for the core the
//! reduce, optimizer step and broadcast) and idle while it waits for data
//! or for the core. Draining, switching and returning cells are switching.
//! Each cell counts by its nodes. Sampling at a tick much shorter than a
//! step is an unbiased estimate of the shares; segments merge consecutive
//! samples of the same state, so memory grows with role changes, not time.

use gyre_runtime::Nanos;
use serde::Serialize;

/// A cell's state at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CellState {
    /// Serving, with this many tenths of its slots occupied (0..=10).
    Rollout(u8),
    Switching,
    Training,
    /// In the training role, waiting.
    Idle,
}

/// A run of samples in one state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Segment {
    pub from: Nanos,
    pub to: Nanos,
    pub state: CellState,
}

/// One row of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// `cell 0 (core)`, `cell 3`, `pool`.
    pub label: String,
    pub nodes: u32,
    pub segments: Vec<Segment>,
}

/// GPU-time shares; they add up to 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Shares {
    pub rollout: f64,
    pub training: f64,
    pub switching: f64,
    pub idle: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    pub tick: Nanos,
    pub rows: Vec<Row>,
    /// Node-weighted sums of samples, by state.
    rollout: f64,
    training: f64,
    switching: f64,
    idle: f64,
}

impl Timeline {
    pub fn new(tick: Nanos, rows: Vec<(String, u32)>) -> Self {
        Self {
            tick,
            rows: rows
                .into_iter()
                .map(|(label, nodes)| Row {
                    label,
                    nodes,
                    segments: Vec::new(),
                })
                .collect(),
            ..Self::default()
        }
    }

    /// Records row `row`'s state over the tick ending at `at`;
    /// `occupancy` in [0, 1] for a rollout state.
    pub fn record(&mut self, row: usize, at: Nanos, occupancy: f64, state: CellState) {
        let Some(r) = self.rows.get_mut(row) else {
            return;
        };
        let w = f64::from(r.nodes);
        match state {
            CellState::Rollout(_) => {
                let u = occupancy.clamp(0.0, 1.0);
                self.rollout += w * u;
                self.idle += w * (1.0 - u);
            }
            CellState::Switching => self.switching += w,
            CellState::Training => self.training += w,
            CellState::Idle => self.idle += w,
        }
        let from = at.saturating_sub(self.tick);
        match r.segments.last_mut() {
            Some(last) if last.state == state && last.to == from => last.to = at,
            _ => r.segments.push(Segment {
                from,
                to: at,
                state,
            }),
        }
    }

    pub fn shares(&self) -> Shares {
        let total = self.rollout + self.training + self.switching + self.idle;
        if total <= 0.0 {
            return Shares::default();
        }
        Shares {
            rollout: self.rollout / total,
            training: self.training / total,
            switching: self.switching / total,
            idle: self.idle / total,
        }
    }
}

/// Occupancy in tenths, for merging samples.
pub fn tenths(occupancy: f64) -> u8 {
    (occupancy.clamp(0.0, 1.0) * 10.0).round() as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_merge_and_shares_weigh_nodes_and_occupancy() {
        let mut t = Timeline::new(10, vec![("cell 0".into(), 4), ("pool".into(), 2)]);
        for i in 1..=4 {
            t.record(0, i * 10, 0.5, CellState::Rollout(5));
            t.record(1, i * 10, 1.0, CellState::Rollout(10));
        }
        t.record(0, 50, 0.0, CellState::Switching);
        t.record(0, 60, 0.0, CellState::Training);
        assert_eq!(t.rows[0].segments.len(), 3);
        assert_eq!(t.rows[0].segments[0].from, 0);
        assert_eq!(t.rows[0].segments[0].to, 40);
        // Cell 0: 4 samples half busy (2 rollout + 2 idle) + switch + train,
        // times 4 nodes; pool: 4 full samples times 2 nodes.
        let s = t.shares();
        let total = 4.0 * 6.0 + 2.0 * 4.0;
        assert!((s.rollout - (4.0 * 2.0 + 8.0) / total).abs() < 1e-12);
        assert!((s.idle - 8.0 / total).abs() < 1e-12);
        assert!((s.switching - 4.0 / total).abs() < 1e-12);
        assert!((s.rollout + s.training + s.switching + s.idle - 1.0).abs() < 1e-12);
        assert_eq!(tenths(0.44), 4);
    }
}
