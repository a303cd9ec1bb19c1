//! The K−1 prefix groups of one cell, built up front: the cell's member
//! handle in every prefix {0..p−1} (p = 2..=K) that contains it.

use std::collections::BTreeMap;
use std::time::Duration;

use super::host::{HostComm, HostGroup};
use super::{Collective, CollectiveError};

/// Cell `cell`'s handles, by prefix size.
pub struct PrefixGroups<C> {
    cell: usize,
    cells: usize,
    groups: BTreeMap<usize, C>,
}

impl<C: Collective> PrefixGroups<C> {
    /// From handles already built (e.g. NCCL communicators), keyed by
    /// prefix size.
    pub fn from_groups(cell: usize, cells: usize, groups: BTreeMap<usize, C>) -> Self {
        PrefixGroups {
            cell,
            cells,
            groups,
        }
    }

    pub fn cell(&self) -> usize {
        self.cell
    }

    /// The handle for a training prefix of `members` cells; `None` when the
    /// core trains alone (nothing to reduce).
    pub fn group(&self, members: usize) -> Result<Option<&C>, CollectiveError> {
        if members <= 1 {
            return Ok(None);
        }
        if self.cell >= members {
            return Err(CollectiveError::NotMember {
                cell: self.cell,
                members,
            });
        }
        self.groups
            .get(&members)
            .map(Some)
            .ok_or(CollectiveError::NoGroup {
                members,
                max: self.cells,
            })
    }

    /// Sums `buf` across the prefix of `members` cells.
    pub fn all_reduce_sum(&self, members: usize, buf: &mut [f32]) -> Result<(), CollectiveError> {
        match self.group(members)? {
            Some(c) => c.all_reduce_sum(buf),
            None => Ok(()),
        }
    }

    /// The core's (rank 0) buffer to every cell of the prefix.
    pub fn broadcast_from_core(
        &self,
        members: usize,
        buf: &mut [f32],
    ) -> Result<(), CollectiveError> {
        match self.group(members)? {
            Some(c) => c.broadcast(buf, 0),
            None => Ok(()),
        }
    }
}

impl PrefixGroups<HostComm> {
    /// Host groups for `cells` cells: element `c` belongs to cell `c`.
    pub fn host(cells: usize, timeout: Duration) -> Vec<PrefixGroups<HostComm>> {
        let mut per_cell: Vec<BTreeMap<usize, HostComm>> =
            (0..cells).map(|_| BTreeMap::new()).collect();
        for p in 2..=cells {
            for (c, comm) in HostGroup::members(p, timeout).into_iter().enumerate() {
                per_cell[c].insert(p, comm);
            }
        }
        per_cell
            .into_iter()
            .enumerate()
            .map(|(cell, groups)| PrefixGroups {
                cell,
                cells,
                groups,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_prefix_reduces_over_its_members_only() {
        let cells = PrefixGroups::host(4, Duration::from_secs(10));
        assert_eq!(cells[0].groups.len(), 3);
        assert_eq!(cells[3].groups.len(), 1);
        assert!(matches!(
            cells[3].group(2),
            Err(CollectiveError::NotMember { .. })
        ));
        assert!(cells[0].group(1).unwrap().is_none());
        assert!(matches!(
            cells[0].group(5),
            Err(CollectiveError::NoGroup { .. })
        ));
        for members in [3, 2, 4] {
            let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
                let hs: Vec<_> = cells[..members]
                    .iter()
                    .map(|g| {
                        s.spawn(move || {
                            let mut b = vec![1.0, g.cell() as f32];
                            g.all_reduce_sum(members, &mut b).unwrap();
                            let mut p = vec![g.cell() as f32 + 10.0];
                            g.broadcast_from_core(members, &mut p).unwrap();
                            b.extend(p);
                            b
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let tri = (members * (members - 1) / 2) as f32;
            for s in sums {
                assert_eq!(s, vec![members as f32, tri, 10.0]);
            }
        }
    }
}
