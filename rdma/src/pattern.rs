//! Deterministic byte patterns: two processes that agree on a seed agree on
//! a segment's bytes without shipping them, which lets tests and benchmarks
//! check transfers byte for byte.

/// The `len` bytes of pattern `seed` (splitmix64, little-endian words).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut state = seed;
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn patterns_are_deterministic_prefix_stable_and_seed_dependent() {
        let a = super::pattern(1, 100);
        assert_eq!(a, super::pattern(1, 100));
        assert_eq!(&a[..37], &super::pattern(1, 37)[..]);
        assert_ne!(a, super::pattern(2, 100));
    }
}
