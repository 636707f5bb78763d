//! CPU implementations of attention: the f64 reference (the specification) of the forward and
//! of the backward, and a naive forward in the input precision (what the tolerance rule
//! compares against).
//!
//! Inputs are contiguous host tensors: Q `[batch, seq_q, heads_q, D]`, K
//! `[batch, seq_k, heads_kv, D]`, V `[batch, seq_k, heads_kv, D_v]` (`D_v` = D but for a problem
//! with [`AttentionProblem::value_dim`]). The forward spreads its work over (batch, head) pairs on all
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

mod backward;
pub use backward::{
    AttentionGrads, BACKWARD_ABS_FLOOR, BACKWARD_REL_FLOOR, backward, backward_f64,
    backward_f64_sinks, backward_sinks, backward_tolerance, backward_varlen, backward_varlen_sinks,
    naive_backward_same_precision, naive_backward_same_precision_sinks,
    naive_backward_varlen_same_precision, naive_backward_varlen_same_precision_sinks,
};

/// O `[batch, seq_q, heads_q, D_v]` and LSE `[batch, heads_q, seq_q]`.
#[derive(Clone, Debug)]
pub struct AttentionOutput {
    /// Output.
    pub o: Vec<f64>,
    /// Row log-sum-exp (natural log; -inf for rows with no allowed key).
    pub lse: Vec<f64>,
}

/// Row `i` of head `h` of batch `b` of a contiguous `[batch, seq, heads, d]` tensor.
pub(super) fn row<T: Copy>(
    x: &[T],
    seq: usize,
    heads: usize,
    d: usize,
    b: usize,
    i: usize,
    h: usize,
) -> &[T] {
    let start = ((b * seq + i) * heads + h) * d;
    &x[start..start + d]
}

/// [`row`], mutable.
pub(super) fn row_mut(
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
/// that pair (`seq_q * D_v` values) and its LSE (`seq_q` values), which are scattered into place.
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
    let d = p.v_dim();
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
pub(super) fn widen<T: AttentionElem>(x: &[T]) -> Vec<f64> {
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
    let dv = p.v_dim();
    let group = p.heads_q / p.heads_kv;
    per_head(p, |b, h| {
        let hk = h / group;
        let sink = sinks.map(|s| s[h]);
        let mut o = vec![0.0; p.seq_q * dv];
        let mut lse = vec![f64::NEG_INFINITY; p.seq_q];
        let mut probs = vec![0.0; p.seq_k];
        for i in 0..p.seq_q {
            lse[i] = row_softmax_sink(p, q, k, (b, i, h), sink, &mut probs);
            let oi = &mut o[i * dv..(i + 1) * dv];
            for (j, &pj) in probs.iter().enumerate() {
                if !p.allowed(i, j) {
                    continue; // O = 0 for a row with no allowed key
                }
                let vj = row(v, p.seq_k, p.heads_kv, dv, b, j, hk);
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
    let (d, dv) = (p.head_dim, p.v_dim());
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
        let mut o = vec![0.0; p.seq_q * dv];
        let mut lse = vec![f64::NEG_INFINITY; p.seq_q];
        let mut scores = vec![0.0f32; p.seq_k];
        let mut acc = vec![0.0f32; dv];
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
                let vj = row(&v32, p.seq_k, p.heads_kv, dv, b, j, hk);
                for (x, y) in acc.iter_mut().zip(vj) {
                    *x += w * y;
                }
            }
            for (x, y) in o[i * dv..(i + 1) * dv].iter_mut().zip(&acc) {
                *x = round(*y) as f64;
            }
            lse[i] = (max + sum.ln()) as f64;
        }
        (o, lse)
    })
}

/// The f64 reference for selected rows only, `(batch, query, head)` each: O's row (`D_v` values)
/// and LSE. For validating large problems on a sample.
pub fn reference_rows<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    rows: &[(usize, usize, usize)],
) -> Vec<(Vec<f64>, f64)> {
    assert!(!p.sinks, "reference_rows covers problems without sinks");
    let (d, dv) = (p.head_dim, p.v_dim());
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
            let mut o = vec![0.0; dv];
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
                let vj = row(v, p.seq_k, p.heads_kv, dv, b, j, hk);
                for (x, y) in o.iter_mut().zip(vj) {
                    *x += w * y.to_f32() as f64;
                }
            }
            o.iter_mut().for_each(|x| *x /= sum);
            (o, max + sum.ln())
        })
        .collect()
}

/// The f64 reference over packed sequences: for each sequence `b` of `seqlens`, [`reference`]
/// of its dense problem ([`AttentionVarlenProblem::sequence`], batch 1) on its rows of Q, K, V
/// (contiguous `[total, heads, D]`, V's of `D_v`). O `[total_q, heads_q, D_v]`, LSE
/// `[heads_q, total_q]`.
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

/// Run `f` on each sequence's dense problem and rows, and place its outputs in the packed
/// layout (a sequence without query rows has none; one without key rows gets `O = 0`,
/// `LSE = -inf` from `f`).
fn per_sequence<T: AttentionElem>(
    p: &AttentionVarlenProblem,
    seqlens: &CuSeqlens,
    f: impl Fn(&AttentionProblem, &[T], &[T], &[T]) -> AttentionOutput,
    (q, k, v): (&[T], &[T], &[T]),
) -> AttentionOutput {
    let (d, dv) = (p.head_dim, p.v_dim());
    let (hq, hkv) = (p.heads_q, p.heads_kv);
    let mut o = vec![0.0; p.total_q * hq * dv];
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
            &v[k0 * hkv * dv..(k0 + sk) * hkv * dv],
        );
        o[q0 * hq * dv..(q0 + sq) * hq * dv].copy_from_slice(&out.o);
        for h in 0..hq {
            for i in 0..sq {
                lse[h * p.total_q + q0 + i] = out.lse[h * sq + i];
            }
        }
    }
    AttentionOutput { o, lse }
}
