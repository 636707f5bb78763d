//! GLA inputs for benchmarks and examples.

use half::bf16;
use rand::Rng;

/// Log-decays `log(sigmoid(x))`, `x` uniform in `[-3, 3)`, rounded to bf16 (fla's tests use
/// `logsigmoid(randn)`).
pub fn log_sigmoid_decays(r: &mut impl Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| {
            let x: f64 = r.random_range(-3.0..3.0);
            bf16::from_f64(-(1.0 + (-x).exp()).ln())
        })
        .collect()
}
