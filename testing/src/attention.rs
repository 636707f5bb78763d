//! Attention: random inputs and whole forward passes on the GPU, for the tests and benchmarks.

use kernels::attention::{self, AttentionElem, AttentionProblem, View};
use kernels::data::rng;
use kernels::memory::{download, poisoned, upload};
use kernels::{Gpu, Result};
use rand::Rng;

/// Q, K, V of `p` (contiguous), uniform in `[-range, range)` from `seed`.
pub fn random_inputs<T: AttentionElem>(
    p: &AttentionProblem,
    range: f32,
    seed: u64,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let mut r = rng(seed);
    let mut draw = |n: usize| -> Vec<T> {
        (0..n)
            .map(|_| T::from_f32(r.random_range(-range..range)))
            .collect()
    };
    let qn = p.batch * p.seq_q * p.heads_q * p.head_dim;
    let kn = p.batch * p.seq_k * p.heads_kv * p.head_dim;
    (draw(qn), draw(kn), draw(kn))
}

/// The forward pass of `p` on the GPU with contiguous tensors (outputs poisoned before the
/// launch), the default kernels or the tuning variant `variant`; returns O and LSE.
pub fn device_forward<T: AttentionElem>(
    g: &Gpu,
    p: &AttentionProblem,
    (q, k, v): (&[T], &[T], &[T]),
    variant: Option<&str>,
) -> Result<(Vec<T>, Vec<f32>)> {
    let stream = g.stream()?;
    let (dq, dk, dv) = (upload(q)?, upload(k)?, upload(v)?);
    let dout = poisoned::<T>(q.len())?;
    let mut dlse = poisoned::<f32>(p.lse_len())?;
    let (qv, kv, vv) = (
        View::contiguous(&dq, p.q_shape()),
        View::contiguous(&dk, p.kv_shape()),
        View::contiguous(&dv, p.kv_shape()),
    );
    let mut ov = View::contiguous(&dout, p.q_shape());
    attention::forward_variant(g, &stream, p, &qv, &kv, &vv, &mut ov, &mut dlse, variant)?;
    g.sync(&stream, "attention forward")?;
    Ok((download(&dout)?, download(&dlse)?))
}
