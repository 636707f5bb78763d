//! Semi-CRF scaffolding: random inputs of a problem.

use kernels::semicrf::{SemiCrfInputs, SemiCrfProblem, cumulative_scores};

/// Seeded random inputs for tests, benchmarks and examples: per-position scores uniform in
/// `[-1, 1)` centred per (sequence, label) over the sequence (as flash-semicrf recommends),
/// their cumulative sums, `dur` and `trans` uniform in `[-0.5, 0.5)`, lengths `T` or uniform in
/// `[T/2, T]` (the first sequence always `T`).
pub fn random_inputs(problem: &SemiCrfProblem, seed: u64, varied_lengths: bool) -> RandomInputs {
    use rand::Rng;
    let (b, t, k, c) = (problem.batch, problem.t, problem.k, problem.c);
    let mut r = kernels::data::rng(seed);
    let mut scores = kernels::data::uniform_f32(&mut r, b * t * c, -1.0, 1.0);
    for bi in 0..b {
        for ci in 0..c {
            let mean = (0..t)
                .map(|ti| scores[(bi * t + ti) * c + ci] as f64)
                .sum::<f64>()
                / t as f64;
            for ti in 0..t {
                scores[(bi * t + ti) * c + ci] -= mean as f32;
            }
        }
    }
    let cumsum = cumulative_scores(&scores, b, t, c).expect("sizes match");
    let dur = kernels::data::uniform_f32(&mut r, k * c, -0.5, 0.5);
    let trans = kernels::data::uniform_f32(&mut r, c * c, -0.5, 0.5);
    let lengths = (0..b)
        .map(|i| {
            if varied_lengths && i > 0 {
                r.random_range(t.div_ceil(2).max(1)..=t) as u32
            } else {
                t as u32
            }
        })
        .collect();
    RandomInputs {
        cumsum,
        dur,
        trans,
        lengths,
    }
}

/// Owned inputs (see [`random_inputs`]).
#[derive(Clone, Debug)]
pub struct RandomInputs {
    /// `[B, T + 1, C]`.
    pub cumsum: Vec<f32>,
    /// `[K, C]`.
    pub dur: Vec<f32>,
    /// `[C, C]`.
    pub trans: Vec<f32>,
    /// `[B]`.
    pub lengths: Vec<u32>,
}

impl RandomInputs {
    /// Borrowed view.
    pub fn view(&self) -> SemiCrfInputs<'_> {
        SemiCrfInputs {
            cumsum: &self.cumsum,
            dur: &self.dur,
            trans: &self.trans,
            lengths: &self.lengths,
        }
    }
}
