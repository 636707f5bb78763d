//! CPU implementations of attention: the f64 reference (the specification) and a naive
//! implementation in the input precision (what the tolerance rule compares against).
//!
//! Inputs are contiguous host tensors: Q `[batch, seq_q, heads_q, D]`, K and V
//! `[batch, seq_k, heads_kv, D]`. Work is spread over (batch, head) pairs on all CPU cores.

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

/// The f64 reference: exact softmax of `scale q.k` over the allowed keys of each row, computed
/// in f64 from the (already rounded) inputs.
pub fn reference<T: AttentionElem>(
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> AttentionOutput {
    let d = p.head_dim;
    let group = p.heads_q / p.heads_kv;
    let scale = p.softmax_scale() as f64;
    let q64: Vec<f64> = q.iter().map(|x| x.to_f32() as f64).collect();
    let k64: Vec<f64> = k.iter().map(|x| x.to_f32() as f64).collect();
    let v64: Vec<f64> = v.iter().map(|x| x.to_f32() as f64).collect();
    per_head(p, |b, h| {
        let hk = h / group;
        let mut o = vec![0.0; p.seq_q * d];
        let mut lse = vec![f64::NEG_INFINITY; p.seq_q];
        let mut logits = vec![0.0; p.seq_k];
        for i in 0..p.seq_q {
            let qi = row(&q64, p.seq_q, p.heads_q, d, b, i, h);
            let mut max = f64::NEG_INFINITY;
            for (j, l) in logits.iter_mut().enumerate() {
                *l = if p.allowed(i, j) {
                    let kj = row(&k64, p.seq_k, p.heads_kv, d, b, j, hk);
                    scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>()
                } else {
                    f64::NEG_INFINITY
                };
                max = max.max(*l);
            }
            if max == f64::NEG_INFINITY {
                continue; // no allowed key: O = 0, LSE = -inf
            }
            let mut sum = 0.0;
            let oi = &mut o[i * d..(i + 1) * d];
            for (j, &l) in logits.iter().enumerate() {
                if l == f64::NEG_INFINITY {
                    continue;
                }
                let w = (l - max).exp();
                sum += w;
                let vj = row(&v64, p.seq_k, p.heads_kv, d, b, j, hk);
                for (x, y) in oi.iter_mut().zip(vj) {
                    *x += w * y;
                }
            }
            oi.iter_mut().for_each(|x| *x /= sum);
            lse[i] = max + sum.ln();
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
    let d = p.head_dim;
    let group = p.heads_q / p.heads_kv;
    let scale = p.softmax_scale();
    let round = |x: f32| T::from_f32(x).to_f32();
    let qs: Vec<f32> = q.iter().map(|x| round(x.to_f32() * scale)).collect();
    let k32: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
    let v32: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
    per_head(p, |b, h| {
        let hk = h / group;
        let mut o = vec![0.0; p.seq_q * d];
        let mut lse = vec![f64::NEG_INFINITY; p.seq_q];
        let mut scores = vec![0.0f32; p.seq_k];
        let mut acc = vec![0.0f32; d];
        for i in 0..p.seq_q {
            let qi = row(&qs, p.seq_q, p.heads_q, d, b, i, h);
            let mut max = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                *s = if p.allowed(i, j) {
                    let kj = row(&k32, p.seq_k, p.heads_kv, d, b, j, hk);
                    round(qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>())
                } else {
                    f32::NEG_INFINITY
                };
                max = max.max(*s);
            }
            if max == f32::NEG_INFINITY {
                continue;
            }
            let sum: f32 = scores.iter().map(|&s| (s - max).exp()).sum();
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
    let d = p.head_dim;
    let group = p.heads_q / p.heads_kv;
    let scale = p.softmax_scale() as f64;
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
                        scale
                            * qi.iter()
                                .zip(kj)
                                .map(|(a, b)| a * b.to_f32() as f64)
                                .sum::<f64>()
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
