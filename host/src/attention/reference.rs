//! CPU implementations of attention: the f64 reference (the specification) of the forward and
//! of the backward, and a naive forward in the input precision (what the tolerance rule
//! compares against).
//!
//! Inputs are contiguous host tensors: Q `[batch, seq_q, heads_q, D]`, K and V
//! `[batch, seq_k, heads_kv, D]`. The forward spreads its work over (batch, head) pairs on all
//! CPU cores; the backward is written for clarity only.
//!
//! # Backward semantics
//!
//! For query row `i` of query head `h` (key/value head `hk = h / (heads_q / heads_kv)`):
//!
//! - logits `s_j = scale q_i . k_j` over the allowed keys `j` (the forward's mask,
//!   [`AttentionProblem::allowed`]), probabilities `P_j = exp(s_j - LSE_i)`,
//!   `LSE_i = log sum_j exp(s_j)`, output `O_i = sum_j P_j v_j`: one function,
//!   [`row_softmax`], gives `P` and `LSE` to the forward and the backward.
//! - Given the gradients of a scalar loss with respect to the outputs, `dO` (shape of O) and
//!   `dLSE` (shape of LSE; absent = zero):
//!   - `dP_j = dO_i . v_j`, `delta_i = dO_i . O_i` (`= sum_j P_j dP_j`),
//!   - `dS_j = P_j (dP_j - delta_i + dLSE_i)`: the softmax's Jacobian
//!     `dP_j / ds_l = P_j (1[j = l] - P_l)` gives `P_l (dP_l - delta_i)`, and
//!     `dLSE_i / ds_l = P_l` gives `P_l dLSE_i`,
//!   - `dq_i = scale sum_j dS_j k_j`, `dk_j += scale dS_j q_i`, `dv_j += P_j dO_i`.
//! - `dK` and `dV` of a key/value head sum the contributions of every query head of its group
//!   (grouped-query and multi-query attention) and of every query row.
//! - A row with no allowed key (`O = 0`, `LSE = -inf`) contributes nothing: its `dQ` row is
//!   exactly 0, whatever its `dO` and `dLSE`, and no gradient is NaN.

use super::varlen::{AttentionVarlenProblem, CuSeqlens};
use super::{AttentionElem, AttentionProblem};

/// O `[batch, seq_q, heads_q, D]` and LSE `[batch, heads_q, seq_q]`.
#[derive(Clone, Debug)]
pub struct AttentionOutput {
    /// Output.
    pub o: Vec<f64>,
    /// Row log-sum-exp (natural log; -inf for rows with no allowed key).
    pub lse: Vec<f64>,
}

/// Row `i` of head `h` of batch `b` of a contiguous `[batch, seq, heads, d]` tensor.
fn row<T: Copy>(x: &[T], seq: usize, heads: usize, d: usize, b: usize, i: usize, h: usize) -> &[T] {
    let start = ((b * seq + i) * heads + h) * d;
    &x[start..start + d]
}

/// [`row`], mutable.
fn row_mut(
    x: &mut [f64],
    seq: usize,
    heads: usize,
    d: usize,
    b: usize,
    i: usize,
    h: usize,
) -> &mut [f64] {
    let start = ((b * seq + i) * heads + h) * d;
    &mut x[start..start + d]
}

/// O rows and LSE of one (batch, head).
type HeadOutput = (Vec<f64>, Vec<f64>);

/// Run `f(b, h)` for every (batch, head) on all cores; each call returns the rows of O for
/// that pair (`seq_q * D` values) and its LSE (`seq_q` values), which are scattered into place.
fn per_head(
    p: &AttentionProblem,
    f: impl Fn(usize, usize) -> (Vec<f64>, Vec<f64>) + Sync,
) -> AttentionOutput {
    let pairs: Vec<(usize, usize)> = (0..p.batch)
        .flat_map(|b| (0..p.heads_q).map(move |h| (b, h)))
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(pairs.len().max(1));
    let chunk = pairs.len().div_ceil(threads);
    let results: Vec<((usize, usize), HeadOutput)> = std::thread::scope(|s| {
        let handles: Vec<_> = pairs
            .chunks(chunk.max(1))
            .map(|part| {
                s.spawn(|| {
                    part.iter()
                        .map(|&(b, h)| ((b, h), f(b, h)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("reference thread"))
            .collect()
    });
    let d = p.head_dim;
    let mut o = vec![0.0; p.batch * p.seq_q * p.heads_q * d];
    let mut lse = vec![0.0; p.lse_len()];
    for ((b, h), (oh, lh)) in results {
        for i in 0..p.seq_q {
            let start = ((b * p.seq_q + i) * p.heads_q + h) * d;
            o[start..start + d].copy_from_slice(&oh[i * d..(i + 1) * d]);
            lse[(b * p.heads_q + h) * p.seq_q + i] = lh[i];
        }
    }
    AttentionOutput { o, lse }
}

/// Inputs read as f64 (exact for bf16 and f16).
fn widen<T: AttentionElem>(x: &[T]) -> Vec<f64> {
    x.iter().map(|x| x.to_f32() as f64).collect()
}

/// The softmax of query row `i` of query head `h` of batch `b` over every key, from the logits
/// `l_j = logit(q_i . k_j)` of the allowed keys ([`AttentionProblem::logit`]: the scale, then
/// the softcap if any): writes `P_j = exp(l_j - max) / sum_l exp(l_l - max)` (`= exp(l_j -
/// LSE)`) into `probs` (`seq_k` values, 0 where the mask forbids key `j`) and returns `LSE = log
/// sum_j exp(l_j)`; `-inf` (and `P = 0`) for a row with no allowed key. Q and K are contiguous
/// f64 tensors.
pub fn row_softmax(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    idx: (usize, usize, usize),
    probs: &mut [f64],
) -> f64 {
    row_softmax_sink(p, q, k, idx, None, probs)
}

/// [`row_softmax`] with the sink logit `sink` joining the softmax (no value; `P` then sums to
/// less than 1, and a row with no allowed key has `LSE = sink`).
pub fn row_softmax_sink(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    (b, i, h): (usize, usize, usize),
    sink: Option<f64>,
    probs: &mut [f64],
) -> f64 {
    let d = p.head_dim;
    let hk = h / (p.heads_q / p.heads_kv);
    let qi = row(q, p.seq_q, p.heads_q, d, b, i, h);
    for (j, s) in probs.iter_mut().enumerate() {
        *s = if p.allowed(i, j) {
            let kj = row(k, p.seq_k, p.heads_kv, d, b, j, hk);
            p.logit(qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>())
        } else {
            f64::NEG_INFINITY
        };
    }
    let sink = sink.unwrap_or(f64::NEG_INFINITY);
    let max = probs.iter().copied().fold(sink, f64::max);
    if max == f64::NEG_INFINITY {
        probs.iter_mut().for_each(|x| *x = 0.0);
        return f64::NEG_INFINITY;
    }
    // Normalized by the sum rather than as `exp(s_j - LSE)`: `LSE` rounds to `max` once the
    // logits are so large that `ln sum` is below their ulp.
    probs.iter_mut().for_each(|x| *x = (*x - max).exp());
    let sum: f64 = probs.iter().sum::<f64>() + (sink - max).exp();
    probs.iter_mut().for_each(|x| *x /= sum);
    max + sum.ln()
}

/// The f64 reference: exact softmax of the logits ([`AttentionProblem::logit`]: `scale q.k`,
/// soft-capped if the problem says so) over the allowed keys of each row, computed in f64 from
/// the (already rounded) inputs. For a problem without sinks ([`reference_with_sinks`]).
pub fn reference<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> AttentionOutput {
    reference_f64(p, &widen(q), &widen(k), &widen(v))
}

/// [`reference`] of a problem with sinks: `sinks[h]` joins the softmax of every row of query
/// head `h`.
pub fn reference_with_sinks<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    sinks: &[f32],
) -> AttentionOutput {
    let sinks: Vec<f64> = sinks.iter().map(|&x| x as f64).collect();
    reference_f64_sinks(p, &widen(q), &widen(k), &widen(v), Some(&sinks))
}

/// [`reference`] on f64 inputs (e.g. for finite differences, which need unrounded inputs).
pub fn reference_f64(p: &AttentionProblem, q: &[f64], k: &[f64], v: &[f64]) -> AttentionOutput {
    reference_f64_sinks(p, q, k, v, None)
}

/// [`reference_f64`] with the sink logits `sinks` (`[heads_q]`; `Some` exactly when the problem
/// has sinks).
pub fn reference_f64_sinks(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sinks: Option<&[f64]>,
) -> AttentionOutput {
    assert_eq!(
        p.sinks,
        sinks.is_some(),
        "sink values are given exactly for a problem with sinks"
    );
    let d = p.head_dim;
    let group = p.heads_q / p.heads_kv;
    per_head(p, |b, h| {
        let hk = h / group;
        let sink = sinks.map(|s| s[h]);
        let mut o = vec![0.0; p.seq_q * d];
        let mut lse = vec![f64::NEG_INFINITY; p.seq_q];
        let mut probs = vec![0.0; p.seq_k];
        for i in 0..p.seq_q {
            lse[i] = row_softmax_sink(p, q, k, (b, i, h), sink, &mut probs);
            let oi = &mut o[i * d..(i + 1) * d];
            for (j, &pj) in probs.iter().enumerate() {
                if !p.allowed(i, j) {
                    continue; // O = 0 for a row with no allowed key
                }
                let vj = row(v, p.seq_k, p.heads_kv, d, b, j, hk);
                for (x, y) in oi.iter_mut().zip(vj) {
                    *x += pj * y;
                }
            }
        }
        (o, lse)
    })
}

/// A straightforward implementation in the input precision T, as a framework's unfused path
/// computes it: `Q scale` rounded to T; scores `(Q scale) K^T` with f32 accumulation rounded to
/// T; softmax in f32 rounded to T; `P V` with f32 accumulation rounded to T. Its error against
/// [`reference`] sets the tolerance of the kernel (FlashAttention's rule).
pub fn naive_same_precision<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> AttentionOutput {
    naive_same_precision_sinks(p, q, k, v, None)
}

/// [`naive_same_precision`] with the sink logits `sinks` (`[heads_q]`; `Some` exactly when the
/// problem has sinks). The softcap, when the problem has one, is applied in f32 to the rounded
/// scores and rounded to T.
pub fn naive_same_precision_sinks<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    sinks: Option<&[f32]>,
) -> AttentionOutput {
    assert_eq!(
        p.sinks,
        sinks.is_some(),
        "sink values are given exactly for a problem with sinks"
    );
    let d = p.head_dim;
    let group = p.heads_q / p.heads_kv;
    let scale = p.softmax_scale();
    let round = |x: f32| T::from_f32(x).to_f32();
    let cap = |x: f32| match p.softcap {
        Some(c) => round(c * (x / c).tanh()),
        None => x,
    };
    let qs: Vec<f32> = q.iter().map(|x| round(x.to_f32() * scale)).collect();
    let k32: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
    let v32: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
    per_head(p, |b, h| {
        let hk = h / group;
        let sink = sinks.map_or(f32::NEG_INFINITY, |s| s[h]);
        let mut o = vec![0.0; p.seq_q * d];
        let mut lse = vec![f64::NEG_INFINITY; p.seq_q];
        let mut scores = vec![0.0f32; p.seq_k];
        let mut acc = vec![0.0f32; d];
        for i in 0..p.seq_q {
            let qi = row(&qs, p.seq_q, p.heads_q, d, b, i, h);
            let mut max = sink;
            for (j, s) in scores.iter_mut().enumerate() {
                *s = if p.allowed(i, j) {
                    let kj = row(&k32, p.seq_k, p.heads_kv, d, b, j, hk);
                    cap(round(qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>()))
                } else {
                    f32::NEG_INFINITY
                };
                max = max.max(*s);
            }
            if max == f32::NEG_INFINITY {
                continue;
            }
            let sum: f32 =
                scores.iter().map(|&s| (s - max).exp()).sum::<f32>() + (sink - max).exp();
            acc.iter_mut().for_each(|x| *x = 0.0);
            for (j, &s) in scores.iter().enumerate() {
                let w = round((s - max).exp() / sum);
                if w == 0.0 {
                    continue;
                }
                let vj = row(&v32, p.seq_k, p.heads_kv, d, b, j, hk);
                for (x, y) in acc.iter_mut().zip(vj) {
                    *x += w * y;
                }
            }
            for (x, y) in o[i * d..(i + 1) * d].iter_mut().zip(&acc) {
                *x = round(*y) as f64;
            }
            lse[i] = (max + sum.ln()) as f64;
        }
        (o, lse)
    })
}

/// The f64 reference for selected rows only, `(batch, query, head)` each: O's row (`D` values)
/// and LSE. For validating large problems on a sample.
pub fn reference_rows<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    rows: &[(usize, usize, usize)],
) -> Vec<(Vec<f64>, f64)> {
    assert!(!p.sinks, "reference_rows covers problems without sinks");
    let d = p.head_dim;
    let group = p.heads_q / p.heads_kv;
    rows.iter()
        .map(|&(b, i, h)| {
            let hk = h / group;
            let qi: Vec<f64> = row(q, p.seq_q, p.heads_q, d, b, i, h)
                .iter()
                .map(|x| x.to_f32() as f64)
                .collect();
            let logits: Vec<f64> = (0..p.seq_k)
                .map(|j| {
                    if p.allowed(i, j) {
                        let kj = row(k, p.seq_k, p.heads_kv, d, b, j, hk);
                        p.logit(
                            qi.iter()
                                .zip(kj)
                                .map(|(a, b)| a * b.to_f32() as f64)
                                .sum::<f64>(),
                        )
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut o = vec![0.0; d];
            if max == f64::NEG_INFINITY {
                return (o, f64::NEG_INFINITY);
            }
            let mut sum = 0.0;
            for (j, &l) in logits.iter().enumerate() {
                if l == f64::NEG_INFINITY {
                    continue;
                }
                let w = (l - max).exp();
                sum += w;
                let vj = row(v, p.seq_k, p.heads_kv, d, b, j, hk);
                for (x, y) in o.iter_mut().zip(vj) {
                    *x += w * y.to_f32() as f64;
                }
            }
            o.iter_mut().for_each(|x| *x /= sum);
            (o, max + sum.ln())
        })
        .collect()
}

/// dQ, dK and dV of a scalar loss, in the layouts of Q, K and V.
#[derive(Clone, Debug)]
pub struct AttentionGrads {
    /// `[batch, seq_q, heads_q, D]`.
    pub dq: Vec<f64>,
    /// `[batch, seq_k, heads_kv, D]`, summed over the query heads of each group.
    pub dk: Vec<f64>,
    /// `[batch, seq_k, heads_kv, D]`, summed over the query heads of each group.
    pub dv: Vec<f64>,
}

/// The f64 reference of the backward (see the module's "Backward semantics"): the gradients
/// with respect to Q, K and V of a loss whose gradients with respect to O and LSE are `d_o`
/// (`[batch, seq_q, heads_q, D]`) and `d_lse` (`[batch, heads_q, seq_q]`; `None` = zero).
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
    let d = p.head_dim;
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
                let oi = row(&forward.o, p.seq_q, p.heads_q, d, b, i, h);
                let doi = row(d_o, p.seq_q, p.heads_q, d, b, i, h);
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
                    let vj = row(v, p.seq_k, p.heads_kv, d, b, j, hk);
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
                    let dvj = row_mut(&mut dv, p.seq_k, p.heads_kv, d, b, j, hk);
                    dvj.iter_mut().zip(doi).for_each(|(x, y)| *x += pj * y);
                }
            }
        }
    }
    (AttentionGrads { dq, dk, dv }, dsinks)
}

/// The backward computed the way a straightforward implementation in the input precision T
/// would (an unfused framework path through its autograd): the forward of
/// [`naive_same_precision`] (`Q scale`, the scores, P and O rounded to T), then `dP = dO V^T`
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
/// problem has them), the backward of [`naive_same_precision_sinks`]: under a softcap `c` the
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
    let d = p.head_dim;
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
                let doi = row(&do32, p.seq_q, p.heads_q, d, b, i, h);
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
                        round(dot(doi, row(&v32, p.seq_k, p.heads_kv, d, b, j, hk)))
                    };
                    delta += probs[j] * *ds;
                }
                let dlse = d_lse.map_or(0.0, |g| g[(b * p.heads_q + h) * p.seq_q + i]);
                if let Some(dsinks) = dsinks.as_mut() {
                    // From the layer's output O rounded to T: `rowsum(dO O)`.
                    let mut o = vec![0.0f32; d];
                    for (j, &pj) in probs.iter().enumerate().filter(|(_, p)| **p != 0.0) {
                        let vj = row(&v32, p.seq_k, p.heads_kv, d, b, j, hk);
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

/// The f64 reference over packed sequences: for each sequence `b` of `seqlens`, [`reference`]
/// of its dense problem ([`AttentionVarlenProblem::sequence`], batch 1) on its rows of Q, K, V
/// (contiguous `[total, heads, D]`). O `[total_q, heads_q, D]`, LSE `[heads_q, total_q]`.
pub fn reference_varlen<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    q: &[T],
    k: &[T],
    v: &[T],
) -> AttentionOutput {
    per_sequence(p, seqlens, |sp, q, k, v| reference(sp, q, k, v), (q, k, v))
}

/// [`reference_varlen`] of a problem with sinks (`sinks[h]` joins every row of query head `h`,
/// in every sequence).
pub fn reference_varlen_with_sinks<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    q: &[T],
    k: &[T],
    v: &[T],
    sinks: &[f32],
) -> AttentionOutput {
    per_sequence(
        p,
        seqlens,
        |sp, q, k, v| reference_with_sinks(sp, q, k, v, sinks),
        (q, k, v),
    )
}

/// [`naive_same_precision`] per sequence, as [`reference_varlen`].
pub fn naive_varlen_same_precision<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    q: &[T],
    k: &[T],
    v: &[T],
) -> AttentionOutput {
    naive_varlen_same_precision_sinks(p, seqlens, q, k, v, None)
}

/// [`naive_varlen_same_precision`] with the sink logits `sinks` (`Some` exactly when the problem
/// has sinks).
pub fn naive_varlen_same_precision_sinks<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    q: &[T],
    k: &[T],
    v: &[T],
    sinks: Option<&[f32]>,
) -> AttentionOutput {
    per_sequence(
        p,
        seqlens,
        |sp, q, k, v| naive_same_precision_sinks(sp, q, k, v, sinks),
        (q, k, v),
    )
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

/// Run `f` on each sequence's dense problem and rows, and place its outputs in the packed
/// layout (a sequence without query rows has none; one without key rows gets `O = 0`,
/// `LSE = -inf` from `f`).
fn per_sequence<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    f: impl Fn(&AttentionProblem, &[T], &[T], &[T]) -> AttentionOutput,
    (q, k, v): (&[T], &[T], &[T]),
) -> AttentionOutput {
    let d = p.head_dim;
    let (hq, hkv) = (p.heads_q, p.heads_kv);
    let mut o = vec![0.0; p.total_q * hq * d];
    let mut lse = vec![f64::NEG_INFINITY; p.lse_len()];
    for b in 0..seqlens.batch() {
        let (sq, sk) = (seqlens.seq_q(b), seqlens.seq_k(b));
        if sq == 0 {
            continue;
        }
        let (q0, k0) = (seqlens.q_start(b), seqlens.k_start(b));
        let out = f(
            &p.sequence(sq, sk),
            &q[q0 * hq * d..(q0 + sq) * hq * d],
            &k[k0 * hkv * d..(k0 + sk) * hkv * d],
            &v[k0 * hkv * d..(k0 + sk) * hkv * d],
        );
        o[q0 * hq * d..(q0 + sq) * hq * d].copy_from_slice(&out.o);
        for h in 0..hq {
            for i in 0..sq {
                lse[h * p.total_q + q0 + i] = out.lse[h * sq + i];
            }
        }
    }
    AttentionOutput { o, lse }
}

/// The f64 reference of the backward over packed sequences: for each sequence, [`backward`] of
/// its dense problem ([`AttentionVarlenProblem::sequence`]) on its rows. Q, dO, dQ
/// `[total_q, heads_q, D]`; K, V, dK, dV `[total_k, heads_kv, D]` (each key row belongs to one
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
    let d = p.head_dim;
    let (hq, hkv) = (p.heads_q, p.heads_kv);
    let mut dq = vec![0.0; p.total_q * hq * d];
    let mut dk = vec![0.0; p.total_k * hkv * d];
    let mut dv = vec![0.0; p.total_k * hkv * d];
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
            &v[kr.clone()],
            &d_o[qr.clone()],
            seq_d_lse.as_deref(),
        );
        dq[qr].copy_from_slice(&grads.dq);
        dk[kr.clone()].copy_from_slice(&grads.dk);
        dv[kr].copy_from_slice(&grads.dv);
    }
    AttentionGrads { dq, dk, dv }
}
