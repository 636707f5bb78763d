//! The f64 reference of the backward (the specification of dQ, dK, dV and the sinks' gradient;
//! the semantics are in the parent module's documentation), its naive form in the input
//! precision, the tolerance rule that compares them, and both over packed sequences.

use super::{reference_f64_sinks, row, row_mut, row_softmax_sink, widen};
use crate::attention::varlen::{AttentionVarlenProblem, CuSeqlens};
use crate::attention::{AttentionElem, AttentionProblem};

/// dQ, dK and dV of a scalar loss, in the layouts of Q, K and V.
#[derive(Clone, Debug)]
pub struct AttentionGrads {
    /// `[batch, seq_q, heads_q, D]`.
    pub dq: Vec<f64>,
    /// `[batch, seq_k, heads_kv, D]`, summed over the query heads of each group.
    pub dk: Vec<f64>,
    /// `[batch, seq_k, heads_kv, D_v]`, summed over the query heads of each group.
    pub dv: Vec<f64>,
}

/// The f64 reference of the backward (see the module's "Backward semantics"): the gradients
/// with respect to Q, K and V of a loss whose gradients with respect to O and LSE are `d_o`
/// (`[batch, seq_q, heads_q, D_v]`) and `d_lse` (`[batch, heads_q, seq_q]`; `None` = zero).
/// Inputs are read as f64.
pub fn backward<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    d_lse: Option<&[f32]>,
) -> AttentionGrads {
    let d_lse: Option<Vec<f64>> = d_lse.map(|g| g.iter().map(|&x| x as f64).collect());
    backward_f64(
        p,
        &widen(q),
        &widen(k),
        &widen(v),
        &widen(d_o),
        d_lse.as_deref(),
    )
}

/// [`backward`] of a problem with a softcap and sinks (`sinks` `Some` exactly when the problem
/// has them): [`backward_f64_sinks`] on the widened inputs; the gradients of Q, K, V and of
/// the sinks.
#[allow(clippy::too_many_arguments)]
pub fn backward_sinks<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    d_lse: Option<&[f32]>,
    sinks: Option<&[f32]>,
) -> (AttentionGrads, Option<Vec<f64>>) {
    let wide32 = |x: &[f32]| -> Vec<f64> { x.iter().map(|&x| x as f64).collect() };
    let d_lse = d_lse.map(wide32);
    let sinks = sinks.map(wide32);
    backward_f64_sinks(
        p,
        &widen(q),
        &widen(k),
        &widen(v),
        &widen(d_o),
        d_lse.as_deref(),
        sinks.as_deref(),
    )
}

/// [`backward`] on f64 inputs (for a problem without sinks; [`backward_f64_sinks`]).
pub fn backward_f64(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    d_lse: Option<&[f64]>,
) -> AttentionGrads {
    backward_f64_sinks(p, q, k, v, d_o, d_lse, None).0
}

/// [`backward_f64`] with a softcap and sinks (`sinks` `Some` exactly when the problem has them):
/// the gradients of Q, K, V and of the sinks (`[heads_q]`, summed over batch and rows; `None`
/// without sinks). With a softcap `c`, `l = c tanh(x / c)` of `x = scale q.k`, so the logit's
/// gradient `dL = P (dP - delta + dLSE)` becomes `dx = dL (1 - tanh^2(x / c))` before the
/// products with K and Q. The sink `s` of head `h` joins every row's LSE, so `dP_j / ds = -P_j
/// P_sink` and `dLSE / ds = P_sink` (`P_sink = exp(s - LSE)`): `d s = sum_rows P_sink (dLSE -
/// delta)`.
#[allow(clippy::too_many_arguments)]
pub fn backward_f64_sinks(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    d_lse: Option<&[f64]>,
    sinks: Option<&[f64]>,
) -> (AttentionGrads, Option<Vec<f64>>) {
    let (d, e) = (p.head_dim, p.v_dim());
    let group = p.heads_q / p.heads_kv;
    let scale = p.softmax_scale() as f64;
    let forward = reference_f64_sinks(p, q, k, v, sinks);
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    let mut dsinks = sinks.map(|s| vec![0.0; s.len()]);
    let mut probs = vec![0.0; p.seq_k];
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let hk = h / group;
            let sink = sinks.map(|s| s[h]);
            for i in 0..p.seq_q {
                let lse = row_softmax_sink(p, q, k, (b, i, h), sink, &mut probs);
                if lse == f64::NEG_INFINITY {
                    continue; // no allowed key and no sink: P = 0, the row contributes nothing
                }
                let qi = row(q, p.seq_q, p.heads_q, d, b, i, h);
                let oi = row(&forward.o, p.seq_q, p.heads_q, e, b, i, h);
                let doi = row(d_o, p.seq_q, p.heads_q, e, b, i, h);
                let dlse_i = d_lse.map_or(0.0, |g| g[(b * p.heads_q + h) * p.seq_q + i]);
                let delta = dot(doi, oi);
                if let (Some(ds), Some(s)) = (dsinks.as_mut(), sink) {
                    ds[h] += (s - lse).exp() * (dlse_i - delta);
                }
                for (j, &pj) in probs.iter().enumerate() {
                    if !p.allowed(i, j) {
                        continue;
                    }
                    let kj = row(k, p.seq_k, p.heads_kv, d, b, j, hk);
                    let vj = row(v, p.seq_k, p.heads_kv, e, b, j, hk);
                    let dpj = dot(doi, vj);
                    let dlj = pj * (dpj - delta + dlse_i);
                    let dsj = match p.softcap {
                        Some(c) => {
                            let t = (scale * dot(qi, kj) / c as f64).tanh();
                            dlj * (1.0 - t * t)
                        }
                        None => dlj,
                    };
                    let dqi = row_mut(&mut dq, p.seq_q, p.heads_q, d, b, i, h);
                    dqi.iter_mut()
                        .zip(kj)
                        .for_each(|(x, y)| *x += scale * dsj * y);
                    let dkj = row_mut(&mut dk, p.seq_k, p.heads_kv, d, b, j, hk);
                    dkj.iter_mut()
                        .zip(qi)
                        .for_each(|(x, y)| *x += scale * dsj * y);
                    let dvj = row_mut(&mut dv, p.seq_k, p.heads_kv, e, b, j, hk);
                    dvj.iter_mut().zip(doi).for_each(|(x, y)| *x += pj * y);
                }
            }
        }
    }
    (AttentionGrads { dq, dk, dv }, dsinks)
}

/// The backward computed the way a straightforward implementation in the input precision T
/// would (an unfused framework path through its autograd): the forward of
/// [`naive_same_precision`](super::naive_same_precision) (`Q scale`, the scores, P and O rounded to T), then `dP = dO V^T`
/// rounded to T, `delta = sum_j P_j dP_j` in f32, `dS = P (dP - delta + dLSE)` rounded to T, and
/// `dQ = dS K`, `dK = dS^T (Q scale)`, `dV = P^T dO` with f32 accumulation rounded to T (dK and dV
/// summed over the query heads of a group in f32 before rounding). Its error against
/// [`backward`] sets the tolerance of the kernels' gradients (FlashAttention's rule).
pub fn naive_backward_same_precision<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    d_lse: Option<&[f32]>,
) -> AttentionGrads {
    naive_backward_same_precision_sinks(p, q, k, v, d_o, d_lse, None).0
}

/// [`naive_backward_same_precision`] with a softcap and sinks (`sinks` `Some` exactly when the
/// problem has them), the backward of [`naive_same_precision_sinks`](super::naive_same_precision_sinks): under a softcap `c` the
/// capped logit `round(c tanh(x / c))` of the rounded score `x`, and `dS` times `1 - tanh^2(x /
/// c)` rounded to T; the sinks' gradient `sum_rows P_sink (dLSE - rowsum(dO O))` in f32 with
/// the row's output O rounded to T (as a framework computes it from the layer's saved output;
/// the kernels' `delta'` is that of the O they are given, also in T).
pub fn naive_backward_same_precision_sinks<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    d_lse: Option<&[f32]>,
    sinks: Option<&[f32]>,
) -> (AttentionGrads, Option<Vec<f64>>) {
    assert_eq!(
        p.sinks,
        sinks.is_some(),
        "sink values are given exactly for a problem with sinks"
    );
    let (d, e) = (p.head_dim, p.v_dim());
    let group = p.heads_q / p.heads_kv;
    let scale = p.softmax_scale();
    let round = |x: f32| T::from_f32(x).to_f32();
    // The capped logit and the derivative of the cap at the rounded score `x`.
    let cap = |x: f32| match p.softcap {
        Some(c) => {
            let t = (x / c).tanh();
            (round(c * t), 1.0 - t * t)
        }
        None => (x, 1.0),
    };
    let f32s = |x: &[T]| -> Vec<f32> { x.iter().map(|x| x.to_f32()).collect() };
    let qs: Vec<f32> = q.iter().map(|x| round(x.to_f32() * scale)).collect();
    let (k32, v32, do32) = (f32s(k), f32s(v), f32s(d_o));
    let mut dq = vec![0.0f64; q.len()];
    let mut dk32 = vec![0.0f32; k.len()];
    let mut dv32 = vec![0.0f32; v.len()];
    let mut dsinks = sinks.map(|s| vec![0.0f32; s.len()]);
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let mut probs = vec![0.0f32; p.seq_k];
    let mut dcap = vec![1.0f32; p.seq_k];
    let mut ds = vec![0.0f32; p.seq_k];
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let hk = h / group;
            let sink = sinks.map_or(f32::NEG_INFINITY, |s| s[h]);
            for i in 0..p.seq_q {
                let qi = row(&qs, p.seq_q, p.heads_q, d, b, i, h);
                let doi = row(&do32, p.seq_q, p.heads_q, e, b, i, h);
                let mut max = sink;
                for (j, s) in probs.iter_mut().enumerate() {
                    *s = if p.allowed(i, j) {
                        let x = round(dot(qi, row(&k32, p.seq_k, p.heads_kv, d, b, j, hk)));
                        let (l, dl) = cap(x);
                        dcap[j] = dl;
                        l
                    } else {
                        f32::NEG_INFINITY
                    };
                    max = max.max(*s);
                }
                if max == f32::NEG_INFINITY {
                    continue; // no allowed key and no sink: the row contributes nothing
                }
                let sum: f32 =
                    probs.iter().map(|&s| (s - max).exp()).sum::<f32>() + (sink - max).exp();
                let p_sink = (sink - max).exp() / sum;
                probs
                    .iter_mut()
                    .for_each(|s| *s = round((*s - max).exp() / sum));
                let mut delta = 0.0f32;
                for (j, ds) in ds.iter_mut().enumerate() {
                    *ds = if probs[j] == 0.0 {
                        0.0
                    } else {
                        round(dot(doi, row(&v32, p.seq_k, p.heads_kv, e, b, j, hk)))
                    };
                    delta += probs[j] * *ds;
                }
                let dlse = d_lse.map_or(0.0, |g| g[(b * p.heads_q + h) * p.seq_q + i]);
                if let Some(dsinks) = dsinks.as_mut() {
                    // From the layer's output O rounded to T: `rowsum(dO O)`.
                    let mut o = vec![0.0f32; e];
                    for (j, &pj) in probs.iter().enumerate().filter(|(_, p)| **p != 0.0) {
                        let vj = row(&v32, p.seq_k, p.heads_kv, e, b, j, hk);
                        o.iter_mut().zip(vj).for_each(|(x, y)| *x += pj * y);
                    }
                    let row_delta: f32 = o.iter().zip(doi).map(|(x, y)| round(*x) * y).sum();
                    dsinks[h] += p_sink * (dlse - row_delta);
                }
                for (j, ds) in ds.iter_mut().enumerate() {
                    *ds = round(round(probs[j] * (*ds - delta + dlse)) * dcap[j]);
                }
                let mut acc = vec![0.0f32; d];
                for j in 0..p.seq_k {
                    if probs[j] == 0.0 && ds[j] == 0.0 {
                        continue;
                    }
                    let kj = row(&k32, p.seq_k, p.heads_kv, d, b, j, hk);
                    for (x, y) in acc.iter_mut().zip(kj) {
                        *x += ds[j] * y;
                    }
                    let start = ((b * p.seq_k + j) * p.heads_kv + hk) * d;
                    for c in 0..d {
                        dk32[start + c] += ds[j] * qi[c];
                    }
                    let start = ((b * p.seq_k + j) * p.heads_kv + hk) * e;
                    for c in 0..e {
                        dv32[start + c] += probs[j] * doi[c];
                    }
                }
                let start = ((b * p.seq_q + i) * p.heads_q + h) * d;
                for c in 0..d {
                    dq[start + c] = round(round(acc[c]) * scale) as f64;
                }
            }
        }
    }
    (
        AttentionGrads {
            dq,
            dk: dk32.iter().map(|&x| round(x) as f64).collect(),
            dv: dv32.iter().map(|&x| round(x) as f64).collect(),
        },
        dsinks.map(|s| s.iter().map(|&x| x as f64).collect()),
    )
}

/// Relative floor of the backward's tolerance (times `max |ref|` of the gradient).
pub const BACKWARD_REL_FLOOR: f64 = 1e-3;

/// Absolute floor of the backward's tolerance: f32 rounding of O(1) sums where the exact
/// gradient is 0 (one key: P = 1 and dP = delta, so dQ = dK = 0 exactly, and the kernels' dP
/// (tensor cores) and delta (the preprocess) round differently, by about 1e-8 on inputs in
/// `[-1, 1)`, while [`naive_backward_same_precision`] sums both in one order and gets 0).
pub const BACKWARD_ABS_FLOOR: f64 = 1e-6;

/// The largest error against [`backward`] that one gradient (dQ, dK or dV) of a kernel may
/// have (FlashAttention's rule): `2 naive_err + BACKWARD_REL_FLOOR max_ref +
/// BACKWARD_ABS_FLOOR`, where `naive_err` is the max error of the same gradient from
/// [`naive_backward_same_precision`] and `max_ref` its largest magnitude in the reference.
pub fn backward_tolerance(naive_err: f64, max_ref: f64) -> f64 {
    2.0 * naive_err + BACKWARD_REL_FLOOR * max_ref + BACKWARD_ABS_FLOOR
}

/// [`backward_varlen`] of a problem with a softcap and sinks: [`backward_sinks`] per sequence,
/// the sinks' gradient summed over the sequences.
#[allow(clippy::too_many_arguments)]
pub fn backward_varlen_sinks<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    d_lse: Option<&[f32]>,
    sinks: Option<&[f32]>,
) -> (AttentionGrads, Option<Vec<f64>>) {
    per_sequence_grads_sinks(p, seqlens, (q, k, v, d_o), d_lse, sinks, backward_sinks)
}

/// [`naive_backward_same_precision_sinks`] per sequence, as [`backward_varlen_sinks`] (the
/// sinks' gradient summed over the sequences in f64).
#[allow(clippy::too_many_arguments)]
pub fn naive_backward_varlen_same_precision_sinks<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    d_lse: Option<&[f32]>,
    sinks: Option<&[f32]>,
) -> (AttentionGrads, Option<Vec<f64>>) {
    per_sequence_grads_sinks(
        p,
        seqlens,
        (q, k, v, d_o),
        d_lse,
        sinks,
        naive_backward_same_precision_sinks,
    )
}

/// The backward of a dense problem with its sinks, as [`backward_sinks`] computes it.
type DenseGradsSinks<T> = fn(
    &AttentionProblem,
    &[T],
    &[T],
    &[T],
    &[T],
    Option<&[f32]>,
    Option<&[f32]>,
) -> (AttentionGrads, Option<Vec<f64>>);

/// [`per_sequence_grads`] of `f` with the sinks `sinks`: the sinks' gradients of the sequences
/// summed.
fn per_sequence_grads_sinks<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    tensors: (&[T], &[T], &[T], &[T]),
    d_lse: Option<&[f32]>,
    sinks: Option<&[f32]>,
    f: DenseGradsSinks<T>,
) -> (AttentionGrads, Option<Vec<f64>>) {
    let total = std::cell::RefCell::new(sinks.map(|s| vec![0.0; s.len()]));
    let grads = per_sequence_grads(p, seqlens, tensors, d_lse, |sp, q, k, v, d_o, dl| {
        let (g, ds) = f(sp, q, k, v, d_o, dl, sinks);
        if let (Some(t), Some(ds)) = (total.borrow_mut().as_mut(), ds) {
            t.iter_mut().zip(ds).for_each(|(t, x)| *t += x);
        }
        g
    });
    (grads, total.into_inner())
}

/// The f64 reference of the backward over packed sequences: for each sequence, [`backward`] of
/// its dense problem ([`AttentionVarlenProblem::sequence`]) on its rows. Q, dQ `[total_q,
/// heads_q, D]`, dO `[total_q, heads_q, D_v]`; K, dK `[total_k, heads_kv, D]`, V, dV
/// `[total_k, heads_kv, D_v]` (each key row belongs to one
/// sequence, so dK and dV sum over the query heads of its group only); dLSE `[heads_q,
/// total_q]`. A sequence without query rows has dK = dV = 0, one without key rows dQ = 0.
#[allow(clippy::too_many_arguments)]
pub fn backward_varlen<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    d_lse: Option<&[f32]>,
) -> AttentionGrads {
    per_sequence_grads(
        p,
        seqlens,
        (q, k, v, d_o),
        d_lse,
        |sp, q, k, v, d_o, d_lse| backward(sp, q, k, v, d_o, d_lse),
    )
}

/// [`naive_backward_same_precision`] per sequence, as [`backward_varlen`].
#[allow(clippy::too_many_arguments)]
pub fn naive_backward_varlen_same_precision<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    d_lse: Option<&[f32]>,
) -> AttentionGrads {
    per_sequence_grads(
        p,
        seqlens,
        (q, k, v, d_o),
        d_lse,
        |sp, q, k, v, d_o, d_lse| naive_backward_same_precision(sp, q, k, v, d_o, d_lse),
    )
}

/// Run `f` on each sequence's dense problem and rows (dLSE gathered from `[heads_q, total_q]`
/// into the sequence's `[1, heads_q, seq_q]`), and place its gradients in the packed layout.
fn per_sequence_grads<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    (q, k, v, d_o): (&[T], &[T], &[T], &[T]),
    d_lse: Option<&[f32]>,
    f: impl Fn(&AttentionProblem, &[T], &[T], &[T], &[T], Option<&[f32]>) -> AttentionGrads,
) -> AttentionGrads {
    let (d, e) = (p.head_dim, p.v_dim());
    let (hq, hkv) = (p.heads_q, p.heads_kv);
    let mut dq = vec![0.0; p.total_q * hq * d];
    let mut dk = vec![0.0; p.total_k * hkv * d];
    let mut dv = vec![0.0; p.total_k * hkv * e];
    for b in 0..seqlens.batch() {
        let (sq, sk) = (seqlens.seq_q(b), seqlens.seq_k(b));
        if sq == 0 || (sk == 0 && !p.sinks) {
            // No query row attends a key (nor a sink): every gradient of the sequence is 0.
            continue;
        }
        let (q0, k0) = (seqlens.q_start(b), seqlens.k_start(b));
        let (qr, kr) = (
            q0 * hq * d..(q0 + sq) * hq * d,
            k0 * hkv * d..(k0 + sk) * hkv * d,
        );
        // The rows of V, dV (keys) and of dO (queries), D_v wide.
        let (or, vr) = (
            q0 * hq * e..(q0 + sq) * hq * e,
            k0 * hkv * e..(k0 + sk) * hkv * e,
        );
        let seq_d_lse: Option<Vec<f32>> = d_lse.map(|g| {
            (0..hq)
                .flat_map(|h| {
                    g[h * p.total_q + q0..h * p.total_q + q0 + sq]
                        .iter()
                        .copied()
                })
                .collect()
        });
        let grads = f(
            &p.sequence(sq, sk),
            &q[qr.clone()],
            &k[kr.clone()],
            &v[vr.clone()],
            &d_o[or],
            seq_d_lse.as_deref(),
        );
        dq[qr].copy_from_slice(&grads.dq);
        dk[kr].copy_from_slice(&grads.dk);
        dv[vr].copy_from_slice(&grads.dv);
    }
    AttentionGrads { dq, dk, dv }
}
