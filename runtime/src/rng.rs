//! Per-actor random numbers derived from the run seed and the actor id.
//!
//! Each actor gets its own stream so that adding an actor or reordering
//! unrelated events does not perturb another actor's draws; ChaCha8 is
//! portable across platforms and versions, which replay needs.

use rand::SeedableRng;

use crate::id::ActorId;

/// The random number generator an actor reaches through `cx.rng()`.
pub type ActorRng = rand_chacha::ChaCha8Rng;

/// SplitMix64's finaliser: a bijective, well-mixing step.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of `actor`'s stream in the run seeded with `run_seed`.
pub fn derive_seed(run_seed: u64, actor: ActorId) -> u64 {
    mix64(mix64(run_seed ^ mix64(u64::from(actor.node.0))) ^ actor.local)
}

/// The generator of `actor` in the run seeded with `run_seed`.
pub fn actor_rng(run_seed: u64, actor: ActorId) -> ActorRng {
    ActorRng::seed_from_u64(derive_seed(run_seed, actor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn streams_differ_by_actor_and_seed_and_repeat() {
        let a = ActorId::new(0, 1);
        let b = ActorId::new(0, 2);
        let x: u64 = actor_rng(7, a).random();
        assert_eq!(x, actor_rng(7, a).random::<u64>());
        assert_ne!(x, actor_rng(7, b).random::<u64>());
        assert_ne!(x, actor_rng(8, a).random::<u64>());
    }
}
