//! Seeded random test and benchmark data.

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A seeded generator (the seed is printed by tests so failures reproduce).
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in `[lo, hi)`.
pub fn uniform_f32(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// `n` bf16 values, rounded from uniform `[lo, hi)`.
pub fn uniform_bf16(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(lo..hi)))
        .collect()
}

/// `n` f16 values, rounded from uniform `[lo, hi)`.
pub fn uniform_f16(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(lo..hi)))
        .collect()
}
