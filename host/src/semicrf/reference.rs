//! The f64 CPU reference of the semi-Markov CRF: **the specification** of every kernel of the
//! family, written for clarity (the literal recurrences over `(k, c_prev)`), plus a
//! brute-force enumerator for tiny problems and a factored forward for long sequences.
//!
//! # Model
//! A sequence of length `L` (positions `0..L`) is split into consecutive segments `[s, s + k)`,
//! `1 <= k <= K`, each with a label `c < C`. Before position 0 there is a *virtual label*
//! `c_0`, summed over (log semiring) or maximized (max semiring): `alpha[0, c] = 0` for every
//! `c`, the convention of flash-semicrf and torch-struct. A segment `[s, s + k)` with label `c`
//! following a segment (or the virtual label) with label `c'` scores
//! `edge(s, k, c', c) = (S[s + k, c] - S[s, c]) + dur[k - 1, c] + trans[c', c]`
//! where `S [T + 1, C]` is the cumulative sum of per-position label scores.
//!
//! - `alpha[t, c] = lse_{k <= min(K, t), c'} alpha[t - k, c'] + edge(t - k, k, c', c)`,
//!   `log Z = lse_c alpha[L, c]`.
//! - `beta[L, c] = 0`, `beta[t, c'] = lse_{k <= min(K, L - t), c} edge(t, k, c', c) +
//!   beta[t + k, c]`.
//! - Marginal of segment `(t, k, c)`: `mu = exp(lse_{c'} (alpha[t, c'] + edge(t, k, c', c)) +
//!   beta[t + k, c] - log Z)`.
//! - Gradients of `sum_b log Z_b`: wrt `S[t, c]`: (probability that a segment with label `c`
//!   ends at `t`) - (that one starts at `t`); wrt `dur[k - 1, c]`: expected number of segments
//!   of duration `k` and label `c`; wrt `trans[c', c]`: expected number of `c' -> c`
//!   transitions, the one from the virtual label included.
//! - Viterbi: the same with max; ties go to the smallest `(k, c')` in the order the loops visit
//!   them.

// The formulas are written as index loops over (t, k, c', c), as on paper.
#![allow(clippy::needless_range_loop)]

use super::{SemiCrfInputs, SemiCrfProblem};

/// A segment of a segmentation: positions `start .. start + dur`, label `label`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First position.
    pub start: usize,
    /// Duration (1..=K).
    pub dur: usize,
    /// Label (0..C).
    pub label: usize,
}

/// The problem in f64 (so tests can perturb it for finite differences).
#[derive(Clone, Debug)]
pub struct Model {
    /// Sequences B.
    pub batch: usize,
    /// Positions T.
    pub t: usize,
    /// Largest duration K.
    pub k: usize,
    /// Labels C.
    pub c: usize,
    /// `S [B, T + 1, C]`.
    pub cumsum: Vec<f64>,
    /// `[K, C]`.
    pub dur: Vec<f64>,
    /// `[C (from), C (to)]`.
    pub trans: Vec<f64>,
    /// `[B]`.
    pub lengths: Vec<usize>,
}

impl Model {
    /// The f64 model of f32 inputs (assumed valid for `problem`).
    pub fn new(problem: &SemiCrfProblem, inputs: &SemiCrfInputs) -> Model {
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect();
        Model {
            batch: problem.batch,
            t: problem.t,
            k: problem.k,
            c: problem.c,
            cumsum: f(inputs.cumsum),
            dur: f(inputs.dur),
            trans: f(inputs.trans),
            lengths: inputs.lengths.iter().map(|&l| l as usize).collect(),
        }
    }

    /// `S[b, t, c]`.
    pub fn s(&self, b: usize, t: usize, c: usize) -> f64 {
        self.cumsum[(b * (self.t + 1) + t) * self.c + c]
    }

    /// `edge(s, k, c', c)` of sequence `b` (see the module docs).
    pub fn edge(&self, b: usize, s: usize, k: usize, cp: usize, c: usize) -> f64 {
        self.s(b, s + k, c) - self.s(b, s, c)
            + self.dur[(k - 1) * self.c + c]
            + self.trans[cp * self.c + c]
    }
}

/// `ln(sum exp(x))`, `-inf` for no terms.
pub fn lse(xs: impl IntoIterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.into_iter().collect();
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// `alpha [L + 1, C]` of sequence `b`.
pub fn alpha(m: &Model, b: usize) -> Vec<Vec<f64>> {
    let len = m.lengths[b];
    let mut a = vec![vec![0.0; m.c]; len + 1];
    for t in 1..=len {
        for c in 0..m.c {
            a[t][c] = lse((1..=m.k.min(t)).flat_map(|k| {
                let a = &a;
                (0..m.c).map(move |cp| a[t - k][cp] + m.edge(b, t - k, k, cp, c))
            }));
        }
    }
    a
}

/// `beta [L + 1, C]` of sequence `b`.
pub fn beta(m: &Model, b: usize) -> Vec<Vec<f64>> {
    let len = m.lengths[b];
    let mut be = vec![vec![0.0; m.c]; len + 1];
    for t in (0..len).rev() {
        for cp in 0..m.c {
            be[t][cp] = lse((1..=m.k.min(len - t)).flat_map(|k| {
                let be = &be;
                (0..m.c).map(move |c| m.edge(b, t, k, cp, c) + be[t + k][c])
            }));
        }
    }
    be
}

/// log Z of every sequence.
pub fn log_partition(m: &Model) -> Vec<f64> {
    (0..m.batch)
        .map(|b| lse(alpha(m, b)[m.lengths[b]].iter().copied()))
        .collect()
}

/// Everything the backward computes, in f64.
#[derive(Clone, Debug)]
pub struct Posterior {
    /// `[B]`.
    pub log_z: Vec<f64>,
    /// `[B, T, K, C]`: `mu[b, t, k - 1, c]`, zero where `t + k > L_b`.
    pub marginals: Vec<f64>,
    /// `[B, T + 1, C]`: probability that a segment with label `c` ends at `t`.
    pub end: Vec<f64>,
    /// `[B, T + 1, C]`: probability that a segment with label `c` starts at `t`.
    pub start: Vec<f64>,
    /// `[B, T + 1, C]`: d log Z_b / d S[b, t, c] = `end - start`.
    pub grad_cumsum: Vec<f64>,
    /// `[K, C]`: d (sum_b log Z_b) / d dur.
    pub grad_dur: Vec<f64>,
    /// `[C, C]`: d (sum_b log Z_b) / d trans.
    pub grad_trans: Vec<f64>,
}

/// Forward-backward: log Z, marginals and gradients (literal O(T K C^2) per sequence).
pub fn posterior(m: &Model) -> Posterior {
    let (t_max, kk, cc) = (m.t, m.k, m.c);
    let mut p = Posterior {
        log_z: vec![0.0; m.batch],
        marginals: vec![0.0; m.batch * t_max * kk * cc],
        end: vec![0.0; m.batch * (t_max + 1) * cc],
        start: vec![0.0; m.batch * (t_max + 1) * cc],
        grad_cumsum: vec![0.0; m.batch * (t_max + 1) * cc],
        grad_dur: vec![0.0; kk * cc],
        grad_trans: vec![0.0; cc * cc],
    };
    for b in 0..m.batch {
        let len = m.lengths[b];
        let (a, be) = (alpha(m, b), beta(m, b));
        let z = lse(a[len].iter().copied());
        p.log_z[b] = z;
        for t in 0..len {
            for k in 1..=kk.min(len - t) {
                for c in 0..cc {
                    let mut mu = 0.0;
                    for cp in 0..cc {
                        let x = (a[t][cp] + m.edge(b, t, k, cp, c) + be[t + k][c] - z).exp();
                        p.grad_trans[cp * cc + c] += x;
                        mu += x;
                    }
                    p.marginals[((b * t_max + t) * kk + k - 1) * cc + c] = mu;
                    p.grad_dur[(k - 1) * cc + c] += mu;
                    p.start[(b * (t_max + 1) + t) * cc + c] += mu;
                    p.end[(b * (t_max + 1) + t + k) * cc + c] += mu;
                }
            }
        }
        for i in b * (t_max + 1) * cc..(b + 1) * (t_max + 1) * cc {
            p.grad_cumsum[i] = p.end[i] - p.start[i];
        }
    }
    p
}

/// Score of a segmentation of sequence `b` (maximized over the virtual label), or `None` if it
/// does not tile `0..L_b` with durations in `1..=K` and labels below C.
pub fn segmentation_score(m: &Model, b: usize, segs: &[Segment]) -> Option<f64> {
    let mut pos = 0;
    let mut score = 0.0;
    let mut prev: Option<usize> = None;
    for s in segs {
        if s.start != pos || s.dur == 0 || s.dur > m.k || s.label >= m.c {
            return None;
        }
        let tr = match prev {
            Some(cp) => m.trans[cp * m.c + s.label],
            None => (0..m.c)
                .map(|cp| m.trans[cp * m.c + s.label])
                .fold(f64::NEG_INFINITY, f64::max),
        };
        score += tr + m.s(b, s.start + s.dur, s.label) - m.s(b, s.start, s.label)
            + m.dur[(s.dur - 1) * m.c + s.label];
        pos += s.dur;
        prev = Some(s.label);
    }
    (pos == m.lengths[b]).then_some(score)
}

/// The best segmentation of every sequence and its score (max semiring, backpointers).
pub fn viterbi(m: &Model) -> Vec<(f64, Vec<Segment>)> {
    (0..m.batch)
        .map(|b| {
            let len = m.lengths[b];
            let mut a = vec![vec![0.0; m.c]; len + 1];
            let mut bp = vec![vec![(0usize, 0usize); m.c]; len + 1];
            for t in 1..=len {
                for c in 0..m.c {
                    let mut best = (f64::NEG_INFINITY, (0, 0));
                    for k in 1..=m.k.min(t) {
                        for cp in 0..m.c {
                            let x = a[t - k][cp] + m.edge(b, t - k, k, cp, c);
                            if x > best.0 {
                                best = (x, (k, cp));
                            }
                        }
                    }
                    a[t][c] = best.0;
                    bp[t][c] = best.1;
                }
            }
            let (mut score, mut c) = (f64::NEG_INFINITY, 0);
            for (i, &x) in a[len].iter().enumerate() {
                if x > score {
                    (score, c) = (x, i);
                }
            }
            let mut segs = Vec::new();
            let mut t = len;
            while t > 0 {
                let (k, cp) = bp[t][c];
                segs.push(Segment {
                    start: t - k,
                    dur: k,
                    label: c,
                });
                t -= k;
                c = cp;
            }
            segs.reverse();
            (score, segs)
        })
        .collect()
}

/// What enumerating every segmentation of one sequence gives.
#[derive(Clone, Debug)]
pub struct BruteForce {
    /// log Z.
    pub log_z: f64,
    /// `[T, K, C]` marginals.
    pub marginals: Vec<f64>,
    /// Best score (over segmentations and the virtual label).
    pub best: f64,
    /// Number of (virtual label, segmentation) pairs enumerated.
    pub paths: usize,
}

/// Enumerate every (virtual label, segmentation) of sequence `b`: exponential, tiny problems
/// only (T <= 8, K <= 3, C <= 3 gives at most ~1.4e5 paths).
pub fn brute_force(m: &Model, b: usize) -> BruteForce {
    let len = m.lengths[b];
    let mut scores: Vec<(f64, Vec<Segment>)> = Vec::new();
    #[allow(clippy::too_many_arguments)]
    fn rec(
        m: &Model,
        b: usize,
        len: usize,
        pos: usize,
        prev: usize,
        acc: f64,
        segs: &mut Vec<Segment>,
        out: &mut Vec<(f64, Vec<Segment>)>,
    ) {
        if pos == len {
            out.push((acc, segs.clone()));
            return;
        }
        for k in 1..=m.k.min(len - pos) {
            for c in 0..m.c {
                segs.push(Segment {
                    start: pos,
                    dur: k,
                    label: c,
                });
                rec(
                    m,
                    b,
                    len,
                    pos + k,
                    c,
                    acc + m.edge(b, pos, k, prev, c),
                    segs,
                    out,
                );
                segs.pop();
            }
        }
    }
    for c0 in 0..m.c {
        rec(m, b, len, 0, c0, 0.0, &mut Vec::new(), &mut scores);
    }
    let log_z = lse(scores.iter().map(|s| s.0));
    let mut marginals = vec![0.0; m.t * m.k * m.c];
    for (score, segs) in &scores {
        let w = (score - log_z).exp();
        for s in segs {
            marginals[(s.start * m.k + s.dur - 1) * m.c + s.label] += w;
        }
    }
    let best = scores.iter().map(|s| s.0).fold(f64::NEG_INFINITY, f64::max);
    BruteForce {
        log_z,
        marginals,
        best,
        paths: scores.len(),
    }
}

/// log Z by the factored recurrence the kernels use (`v[s, c] = lse_c' alpha[s, c'] +
/// trans[c', c] - S[s, c]`, `alpha[t, c] = S[t, c] + lse_k v[t - k, c] + dur[k - 1, c]`), in
/// f64: O(T (K C + C^2)) per sequence, for problems too long for [`log_partition`]. Tested
/// equal to it.
pub fn log_partition_factored(m: &Model) -> Vec<f64> {
    (0..m.batch)
        .map(|b| {
            let len = m.lengths[b];
            let mut v = vec![vec![0.0; m.c]; len + 1];
            let mut a = vec![0.0; m.c];
            for t in 0..=len {
                if t > 0 {
                    for (c, at) in a.iter_mut().enumerate() {
                        *at = m.s(b, t, c)
                            + lse((1..=m.k.min(t)).map(|k| v[t - k][c] + m.dur[(k - 1) * m.c + c]));
                    }
                }
                for c in 0..m.c {
                    v[t][c] = lse((0..m.c).map(|cp| a[cp] + m.trans[cp * m.c + c])) - m.s(b, t, c);
                }
            }
            lse(a.iter().copied())
        })
        .collect()
}

/// [`posterior`] by the factored recurrences (forward as in [`log_partition_factored`], the
/// reverse `g[s, c] = lse_k (S[s + k, c] + beta[s + k, c] + dur[k - 1, c]) - S[s, c]`,
/// `beta[s, c'] = lse_c trans[c', c] + g[s, c]`), in f64: O(T (K C + C^2)) per sequence, for
/// sequences too long for the literal one. The marginals are not kept (`marginals` is empty);
/// everything else is as in [`posterior`]. Tested equal to it.
pub fn posterior_factored(m: &Model) -> Posterior {
    let (t_max, kk, cc) = (m.t, m.k, m.c);
    let mut p = Posterior {
        log_z: vec![0.0; m.batch],
        marginals: Vec::new(),
        end: vec![0.0; m.batch * (t_max + 1) * cc],
        start: vec![0.0; m.batch * (t_max + 1) * cc],
        grad_cumsum: vec![0.0; m.batch * (t_max + 1) * cc],
        grad_dur: vec![0.0; kk * cc],
        grad_trans: vec![0.0; cc * cc],
    };
    for b in 0..m.batch {
        let len = m.lengths[b];
        let s = |t: usize, c: usize| m.s(b, t, c);
        // Forward: alpha and u (the score of a segment starting at t with label c, up to the
        // segment's own scores).
        let mut alpha = vec![vec![0.0; cc]; len + 1];
        let mut u = vec![vec![0.0; cc]; len + 1];
        for t in 0..=len {
            if t > 0 {
                for c in 0..cc {
                    alpha[t][c] = lse((1..=kk.min(t))
                        .map(|k| u[t - k][c] - s(t - k, c) + m.dur[(k - 1) * cc + c]))
                        + s(t, c);
                }
            }
            for c in 0..cc {
                u[t][c] = lse((0..cc).map(|cp| alpha[t][cp] + m.trans[cp * cc + c]));
            }
        }
        let z = lse(alpha[len].iter().copied());
        p.log_z[b] = z;
        // Reverse: beta.
        let mut beta = vec![vec![0.0; cc]; len + 1];
        for t in (0..len).rev() {
            let g: Vec<f64> = (0..cc)
                .map(|c| {
                    lse((1..=kk.min(len - t))
                        .map(|k| s(t + k, c) + beta[t + k][c] + m.dur[(k - 1) * cc + c]))
                        - s(t, c)
                })
                .collect();
            for cp in 0..cc {
                beta[t][cp] = lse((0..cc).map(|c| m.trans[cp * cc + c] + g[c]));
            }
        }
        // Marginals of segments [t, t + k) with label c, summed as the gradients need them.
        let row = |t: usize, c: usize| (b * (t_max + 1) + t) * cc + c;
        for t in 0..len {
            for c in 0..cc {
                let mut st = 0.0;
                for k in 1..=kk.min(len - t) {
                    let mu = (u[t][c] - s(t, c)
                        + s(t + k, c)
                        + beta[t + k][c]
                        + m.dur[(k - 1) * cc + c]
                        - z)
                        .exp();
                    p.grad_dur[(k - 1) * cc + c] += mu;
                    p.end[row(t + k, c)] += mu;
                    st += mu;
                }
                p.start[row(t, c)] = st;
                for cp in 0..cc {
                    p.grad_trans[cp * cc + c] +=
                        (alpha[t][cp] + m.trans[cp * cc + c] - u[t][c]).exp() * st;
                }
            }
        }
        for i in row(0, 0)..row(t_max + 1, 0) {
            p.grad_cumsum[i] = p.end[i] - p.start[i];
        }
    }
    p
}
