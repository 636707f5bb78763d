//! Attention: random inputs and whole forward and backward passes on the GPU, for the tests and
//! benchmarks.

use cust::stream::Stream;
use kernels::attention::{self, AttentionElem, AttentionProblem, AttentionTensors, Target, View};
use kernels::data::rng;
use kernels::exec::OnStream;
use kernels::memory::{download, poisoned, upload};
use kernels::{DeviceBuffer, Gpu, Result};
use rand::Rng;

/// Q, K, V of `p` (contiguous; V of `p.v_dim()`), uniform in `[-range, range)` from `seed`.
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
    let vn = p.batch * p.seq_k * p.heads_kv * p.v_dim();
    (draw(qn), draw(kn), draw(vn))
}

/// The forward pass of `p` on the GPU with contiguous tensors (outputs poisoned before the
/// launch), the default kernels or the tuning variant `variant`, given a tile counter (which
/// short causal problems and the dynamic grid's variant draw their tiles from,
/// `AttentionTensors::tile_counter`) that must be zero again after the launch; returns O and
/// LSE.
pub fn device_forward<T: AttentionElem>(
    g: &Gpu,
    p: &AttentionProblem,
    (q, k, v): (&[T], &[T], &[T]),
    variant: Option<&str>,
) -> Result<(Vec<T>, Vec<f32>)> {
    let stream = g.stream()?;
    let (dq, dk, dv) = (upload(q)?, upload(k)?, upload(v)?);
    let dout = poisoned::<T>(p.o_shape().iter().product())?;
    let mut dlse = poisoned::<f32>(p.lse_len())?;
    let (qv, kv, vv) = (
        View::contiguous(&dq, p.q_shape()),
        View::contiguous(&dk, p.kv_shape()),
        View::contiguous(&dv, p.v_shape()),
    );
    let mut ov = View::contiguous(&dout, p.o_shape());
    let counter = upload(&[0u32])?;
    forward_with_counter(
        g,
        &stream,
        p,
        (qv, kv, vv),
        (&mut ov, &mut dlse),
        variant,
        &counter,
    )?;
    g.sync(&stream, "attention forward")?;
    let left = download(&counter)?[0];
    if left != 0 {
        return Err(kernels::Error::invalid(
            "tile counter",
            format!("{left} after the launch (must be 0 again)"),
        ));
    }
    Ok((download(&dout)?, download(&dlse)?))
}

/// The forward pass of `p` on `stream` (asynchronous) with the default kernels or the tuning
/// variant `variant`, given the tile counter `counter` (zero; `AttentionTensors::tile_counter`).
pub fn forward_with_counter<T: AttentionElem>(
    g: &Gpu,
    stream: &Stream,
    p: &AttentionProblem,
    (q, k, v): (View<T>, View<T>, View<T>),
    (o, lse): (&mut View<T>, &mut DeviceBuffer<f32>),
    variant: Option<&str>,
    counter: &DeviceBuffer<u32>,
) -> Result<()> {
    let tensors = AttentionTensors {
        q,
        k,
        v,
        o: *o,
        lse: (&*lse).into(),
        sinks: None,
        tile_counter: Some(counter.into()),
    };
    let plan = p.plan(Target::of(g), &tensors, variant)?;
    // SAFETY: the tensors and the counter are borrowed for the call, which enqueues the launch;
    // O and LSE are borrowed mutably; the counter is the caller's, for this stream's launches.
    unsafe { plan.run(&OnStream { gpu: g, stream }) }
}

/// The inputs of a backward pass (contiguous host tensors): Q, K, V, the forward's O and LSE,
/// dO and optionally dLSE.
pub struct BackwardInputs<'a, T> {
    /// Q `[batch, seq_q, heads_q, D]`.
    pub q: &'a [T],
    /// K `[batch, seq_k, heads_kv, D]`.
    pub k: &'a [T],
    /// V `[batch, seq_k, heads_kv, D_v]`.
    pub v: &'a [T],
    /// O `[batch, seq_q, heads_q, D_v]`.
    pub o: &'a [T],
    /// LSE `[batch, heads_q, seq_q]`.
    pub lse: &'a [f32],
    /// dO, as O.
    pub d_o: &'a [T],
    /// dLSE, as LSE.
    pub d_lse: Option<&'a [f32]>,
}

/// The backward pass of `p` on the GPU with contiguous tensors (outputs poisoned before the
/// launch); returns dQ, dK, dV.
pub fn device_backward<T: AttentionElem>(
    g: &Gpu,
    p: &AttentionProblem,
    x: &BackwardInputs<'_, T>,
    options: attention::BackwardOptions,
) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let stream = g.stream()?;
    let (q, k, v, o, d_o) = (
        upload(x.q)?,
        upload(x.k)?,
        upload(x.v)?,
        upload(x.o)?,
        upload(x.d_o)?,
    );
    let lse = upload(x.lse)?;
    let d_lse = x.d_lse.map(upload).transpose()?;
    let (dq, dk, dv) = (
        poisoned::<T>(x.q.len())?,
        poisoned::<T>(x.k.len())?,
        poisoned::<T>(x.v.len())?,
    );
    let (qs, ks) = (p.q_shape(), p.kv_shape());
    let (vs, os) = (p.v_shape(), p.o_shape());
    attention::backward(
        g,
        &stream,
        p,
        &View::contiguous(&q, qs),
        &View::contiguous(&k, ks),
        &View::contiguous(&v, vs),
        &View::contiguous(&o, os),
        &lse,
        &View::contiguous(&d_o, os),
        d_lse.as_ref(),
        &mut View::contiguous(&dq, qs),
        &mut View::contiguous(&dk, ks),
        &mut View::contiguous(&dv, vs),
        options,
    )?;
    Ok((download(&dq)?, download(&dk)?, download(&dv)?))
}
