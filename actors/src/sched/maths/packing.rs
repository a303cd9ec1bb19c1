//! Packing token rows into micro-steps.
//!
//! The stream packer turns one group's admitted trajectories into token rows
//! and packs them into micro-steps of a fixed token capacity. Rows are
//! reordered longest first and placed first-fit, which keeps micro-steps full
//! without splitting a row that fits; a row longer than the capacity is cut
//! into capacity-sized pieces. Only token counts matter here: which rows land
//! together never changes an execution's loss weight (SPEC 3.7).

/// The token count of each micro-step, for rows of the given lengths.
/// Empty rows are dropped; no micro-step exceeds `capacity` (at least 1).
pub fn pack(rows: &[u64], capacity: u64) -> Vec<u64> {
    let capacity = capacity.max(1);
    let mut pieces: Vec<u64> = Vec::with_capacity(rows.len());
    for &r in rows {
        let mut left = r;
        while left > capacity {
            pieces.push(capacity);
            left -= capacity;
        }
        if left > 0 {
            pieces.push(left);
        }
    }
    pieces.sort_unstable_by(|a, b| b.cmp(a));
    let mut bins: Vec<u64> = Vec::new();
    for p in pieces {
        match bins.iter_mut().find(|b| **b + p <= capacity) {
            Some(b) => *b += p,
            None => bins.push(p),
        }
    }
    bins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_every_token_and_respects_capacity() {
        let rows = [700, 300, 1_000, 2_500, 0, 40];
        let bins = pack(&rows, 1_000);
        assert_eq!(bins.iter().sum::<u64>(), rows.iter().sum::<u64>());
        assert!(bins.iter().all(|b| *b <= 1_000 && *b > 0));
        // 4,540 tokens need at least 5 micro-steps of 1,000.
        assert_eq!(bins.len(), 5);
    }

    #[test]
    fn reordering_beats_arrival_order() {
        // First-fit in arrival order would fill one bin with 3+3+3 and
        // leave each 7 alone (4 bins); longest first pairs every 7 with a 3.
        assert_eq!(pack(&[3, 3, 3, 7, 7, 7], 10), vec![10, 10, 10]);
    }

    #[test]
    fn empty_input_and_zero_capacity() {
        assert!(pack(&[], 10).is_empty());
        assert!(pack(&[0, 0], 10).is_empty());
        assert_eq!(pack(&[3], 0), vec![1, 1, 1]);
    }
}
