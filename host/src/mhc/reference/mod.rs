//! The f64 reference of mHC: the specification, written for clarity.
//!
//! Per token ([`token_forward`], [`token_backward`]) in f64, with Sinkhorn-Knopp as the plain
//! alternating row and column normalisation of `exp(z)`; the backward is derived by hand
//! through every iteration (stored iterates, no recomputation tricks) and is checked against
//! finite differences of [`loss`] by the CPU tests. Parameter gradients are sums over tokens
//! ([`ParamGrads`]). The kernels compute the same functions in f32 (and bf16 for the
//! activations); [`tol_bf16`] and [`tol_f32`] state how close they must be.

use super::MhcProblem;
use crate::data::{rng, uniform_bf16, uniform_f32};
use half::bf16;
use rand::Rng;

/// The weights in f64.
#[derive(Clone, Debug)]
pub struct Weights {
    /// `[K, M]`.
    pub phi: Vec<f64>,
    /// `[K]`, if given.
    pub gamma: Option<Vec<f64>>,
    /// `a_pre, a_post, a_res`.
    pub alpha: [f64; 3],
    /// `[M]`.
    pub bias: Vec<f64>,
}

impl Weights {
    /// `phi'[k][m] = gamma[k] phi[k][m]` (or `phi`).
    pub fn phi_eff(&self, m: usize, k: usize, j: usize) -> f64 {
        let g = self.gamma.as_ref().map_or(1.0, |g| g[k]);
        g * self.phi[k * m + j]
    }
}

/// Host inputs of one problem, in the kernels' dtypes.
#[derive(Clone, Debug)]
pub struct MhcData {
    /// The problem.
    pub problem: MhcProblem,
    /// `[T, n, C]`.
    pub x: Vec<bf16>,
    /// `[T, C]`: the layer's output.
    pub y: Vec<bf16>,
    /// `[n C, M]`.
    pub phi: Vec<f32>,
    /// `[n C]`, when the problem has `gamma`.
    pub gamma: Option<Vec<f32>>,
    /// `a_pre, a_post, a_res`.
    pub alpha: [f32; 3],
    /// `[M]`.
    pub bias: Vec<f32>,
    /// `[T, C]`: upstream gradient of `x_in`.
    pub d_xin: Vec<bf16>,
    /// `[T, n, C]`: upstream gradient of `x_next`.
    pub d_xnext: Vec<bf16>,
}

impl MhcData {
    /// Random inputs from `seed`: activations and upstream gradients uniform in `[-1, 1)`;
    /// `phi` uniform with `h~` of unit variance (`|phi| < sqrt(3 / K)`); `gamma` in
    /// `[0.5, 1.5)`; gains in `[0.5, 1)` (pre, post) and `[0.5, 1.5)` (res), so `exp` spans a
    /// few e-folds and Sinkhorn has work to do; biases in `[-0.5, 0.5)`.
    pub fn random(problem: &MhcProblem, seed: u64) -> MhcData {
        let mut r = rng(seed);
        let (t, c, k, m) = (problem.tokens(), problem.c, problem.k(), problem.m());
        let s = (3.0 / k as f32).sqrt();
        MhcData {
            problem: *problem,
            x: uniform_bf16(&mut r, t * k, -1.0, 1.0),
            y: uniform_bf16(&mut r, t * c, -1.0, 1.0),
            phi: uniform_f32(&mut r, k * m, -s, s),
            gamma: problem.gamma.then(|| uniform_f32(&mut r, k, 0.5, 1.5)),
            alpha: [
                r.random_range(0.5..1.0),
                r.random_range(0.5..1.0),
                r.random_range(0.5..1.5),
            ],
            bias: uniform_f32(&mut r, m, -0.5, 0.5),
            d_xin: uniform_bf16(&mut r, t * c, -1.0, 1.0),
            d_xnext: uniform_bf16(&mut r, t * k, -1.0, 1.0),
        }
    }

    /// The weights in f64.
    pub fn weights(&self) -> Weights {
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        Weights {
            phi: f(&self.phi),
            gamma: self.gamma.as_deref().map(f),
            alpha: self.alpha.map(|a| a as f64),
            bias: f(&self.bias),
        }
    }

    /// Token `t`'s slice of a `[T, len]` bf16 tensor, in f64.
    pub fn token(v: &[bf16], t: usize, len: usize) -> Vec<f64> {
        v[t * len..(t + 1) * len]
            .iter()
            .map(|x| x.to_f64())
            .collect()
    }
}

/// What the forward computes for one token.
#[derive(Clone, Debug)]
pub struct TokenForward {
    /// `r`.
    pub rms: f64,
    /// `h~ [M]`.
    pub hproj: Vec<f64>,
    /// `sum_k |x_k phi'[k][m]| / r` per coefficient (for tolerances: a projection of `nC`
    /// terms cancels, so its rounding error scales with this, not with `|h~|`).
    pub hproj_abs: Vec<f64>,
    /// `H_pre [n]`.
    pub h_pre: Vec<f64>,
    /// `H_post [n]`.
    pub h_post: Vec<f64>,
    /// `H_res [n, n]`.
    pub h_res: Vec<f64>,
    /// `exp(z_res) [n, n]`.
    pub p0: Vec<f64>,
    /// Per iteration: the row-normalised matrix, then the column-normalised one.
    pub iterates: Vec<(Vec<f64>, Vec<f64>)>,
    /// `x_in [C]`.
    pub x_in: Vec<f64>,
    /// `sum_i |H_pre[i] x_i|` per channel (for tolerances).
    pub x_in_abs: Vec<f64>,
    /// `x_next [n, C]`.
    pub x_next: Vec<f64>,
    /// `sum_j |H_res[i][j] x_j| + |H_post[i] y|` per element.
    pub x_next_abs: Vec<f64>,
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Sinkhorn-Knopp of `p0` (`n x n`, positive): `iters` times, normalise the rows to sum 1,
/// then the columns. Returns every iterate (row-normalised, column-normalised).
pub fn sinkhorn(p0: &[f64], n: usize, iters: usize) -> Vec<(Vec<f64>, Vec<f64>)> {
    let mut p = p0.to_vec();
    let mut out = Vec::with_capacity(iters);
    for _ in 0..iters {
        let mut r = p.clone();
        for i in 0..n {
            let s: f64 = (0..n).map(|j| p[i * n + j]).sum();
            for j in 0..n {
                r[i * n + j] = p[i * n + j] / s;
            }
        }
        let mut q = r.clone();
        for j in 0..n {
            let s: f64 = (0..n).map(|i| r[i * n + j]).sum();
            for i in 0..n {
                q[i * n + j] = r[i * n + j] / s;
            }
        }
        out.push((r, q.clone()));
        p = q;
    }
    out
}

/// The forward of one token: `x [n C]`, `y [C]`.
pub fn token_forward(p: &MhcProblem, w: &Weights, x: &[f64], y: &[f64]) -> TokenForward {
    let (n, c, k, m) = (p.n, p.c, p.k(), p.m());
    let sumsq: f64 = x.iter().map(|v| v * v).sum();
    let rms = (sumsq / k as f64 + p.eps as f64).sqrt();
    let hproj: Vec<f64> = (0..m)
        .map(|j| (0..k).map(|kk| x[kk] * w.phi_eff(m, kk, j)).sum::<f64>() / rms)
        .collect();
    let hproj_abs: Vec<f64> = (0..m)
        .map(|j| {
            (0..k)
                .map(|kk| (x[kk] * w.phi_eff(m, kk, j)).abs())
                .sum::<f64>()
                / rms
        })
        .collect();
    let h_pre: Vec<f64> = (0..n)
        .map(|i| sigmoid(w.alpha[0] * hproj[i] + w.bias[i]))
        .collect();
    let h_post: Vec<f64> = (0..n)
        .map(|i| 2.0 * sigmoid(w.alpha[1] * hproj[n + i] + w.bias[n + i]))
        .collect();
    let p0: Vec<f64> = (0..n * n)
        .map(|ij| (w.alpha[2] * hproj[2 * n + ij] + w.bias[2 * n + ij]).exp())
        .collect();
    let iterates = sinkhorn(&p0, n, p.sinkhorn_iters as usize);
    let h_res = iterates.last().expect("at least one iteration").1.clone();
    let mut x_in = vec![0.0; c];
    let mut x_in_abs = vec![0.0; c];
    let mut x_next = vec![0.0; n * c];
    let mut x_next_abs = vec![0.0; n * c];
    for cc in 0..c {
        for i in 0..n {
            x_in[cc] += h_pre[i] * x[i * c + cc];
            x_in_abs[cc] += (h_pre[i] * x[i * c + cc]).abs();
            let mut v = h_post[i] * y[cc];
            let mut a = v.abs();
            for j in 0..n {
                v += h_res[i * n + j] * x[j * c + cc];
                a += (h_res[i * n + j] * x[j * c + cc]).abs();
            }
            x_next[i * c + cc] = v;
            x_next_abs[i * c + cc] = a;
        }
    }
    TokenForward {
        rms,
        hproj,
        hproj_abs,
        h_pre,
        h_post,
        h_res,
        p0,
        iterates,
        x_in,
        x_in_abs,
        x_next,
        x_next_abs,
    }
}

/// What the backward computes for one token.
#[derive(Clone, Debug)]
pub struct TokenBackward {
    /// `dL/dH [M]` (coefficient order).
    pub dh: Vec<f64>,
    /// `dL/dz [M]`: the logits' gradient, this token's share of `dbias`.
    pub dz: Vec<f64>,
    /// `dL/d(x~ phi') [M]` (`u` of the kernels).
    pub dproj: Vec<f64>,
    /// The norm's coefficient: `dx += xcoef x`.
    pub xcoef: f64,
    /// This token's share of `dalpha`.
    pub dalpha: [f64; 3],
    /// `dx [n C]`.
    pub dx: Vec<f64>,
    /// Sum of the absolute values of `dx`'s terms.
    pub dx_abs: Vec<f64>,
    /// `dy [C]`.
    pub dy: Vec<f64>,
    /// Sum of the absolute values of `dy`'s terms.
    pub dy_abs: Vec<f64>,
}

/// Backward of [`sinkhorn`]: `dL/dp0` from `g = dL/d(last iterate)`.
pub fn sinkhorn_backward(
    p0: &[f64],
    iterates: &[(Vec<f64>, Vec<f64>)],
    g: &[f64],
    n: usize,
) -> Vec<f64> {
    let mut g = g.to_vec();
    for t in (0..iterates.len()).rev() {
        let (r, q) = &iterates[t];
        let p_in = if t == 0 { p0 } else { &iterates[t - 1].1 };
        // Columns: q[i][j] = r[i][j] / c_j, c_j = sum_i r[i][j].
        let mut dr = vec![0.0; n * n];
        for j in 0..n {
            let cj: f64 = (0..n).map(|i| r[i * n + j]).sum();
            let dot: f64 = (0..n).map(|i| g[i * n + j] * q[i * n + j]).sum();
            for i in 0..n {
                dr[i * n + j] = (g[i * n + j] - dot) / cj;
            }
        }
        // Rows: r[i][j] = p_in[i][j] / s_i, s_i = sum_j p_in[i][j].
        for i in 0..n {
            let si: f64 = (0..n).map(|j| p_in[i * n + j]).sum();
            let dot: f64 = (0..n).map(|j| dr[i * n + j] * r[i * n + j]).sum();
            for j in 0..n {
                g[i * n + j] = (dr[i * n + j] - dot) / si;
            }
        }
    }
    g
}

/// The backward of one token (`d_xin [C]`, `d_xnext [n C]`) given its forward `f`.
pub fn token_backward(
    p: &MhcProblem,
    w: &Weights,
    x: &[f64],
    y: &[f64],
    d_xin: &[f64],
    d_xnext: &[f64],
    f: &TokenForward,
) -> TokenBackward {
    let (n, c, k, m) = (p.n, p.c, p.k(), p.m());
    // Through the applications.
    let mut dh = vec![0.0; m];
    let mut dx = vec![0.0; n * c];
    let mut dx_abs = vec![0.0; n * c];
    let mut dy = vec![0.0; c];
    let mut dy_abs = vec![0.0; c];
    for cc in 0..c {
        for i in 0..n {
            dh[i] += d_xin[cc] * x[i * c + cc];
            dh[n + i] += d_xnext[i * c + cc] * y[cc];
            dy[cc] += f.h_post[i] * d_xnext[i * c + cc];
            dy_abs[cc] += (f.h_post[i] * d_xnext[i * c + cc]).abs();
            for j in 0..n {
                dh[2 * n + i * n + j] += d_xnext[i * c + cc] * x[j * c + cc];
            }
            let mut v = f.h_pre[i] * d_xin[cc];
            let mut a = v.abs();
            for j in 0..n {
                let t = f.h_res[j * n + i] * d_xnext[j * c + cc];
                v += t;
                a += t.abs();
            }
            dx[i * c + cc] = v;
            dx_abs[i * c + cc] = a;
        }
    }
    // Through the sigmoids, Sinkhorn and exp.
    let mut dz = vec![0.0; m];
    for i in 0..n {
        let s = f.h_pre[i];
        dz[i] = dh[i] * s * (1.0 - s);
        let s = f.h_post[i] / 2.0;
        dz[n + i] = dh[n + i] * 2.0 * s * (1.0 - s);
    }
    let dp0 = sinkhorn_backward(&f.p0, &f.iterates, &dh[2 * n..], n);
    for ij in 0..n * n {
        dz[2 * n + ij] = dp0[ij] * f.p0[ij];
    }
    // Through the gains, the division by r and the norm.
    let group = |j: usize| {
        if j < n {
            0
        } else if j < 2 * n {
            1
        } else {
            2
        }
    };
    let mut dalpha = [0.0; 3];
    let mut dr = 0.0;
    let mut dproj = vec![0.0; m];
    for j in 0..m {
        dalpha[group(j)] += dz[j] * f.hproj[j];
        let dhp = w.alpha[group(j)] * dz[j];
        dproj[j] = dhp / f.rms;
        dr -= dhp * f.hproj[j] / f.rms;
    }
    let xcoef = dr / (k as f64 * f.rms);
    for kk in 0..k {
        let mut v = xcoef * x[kk];
        let mut a = v.abs();
        for (j, u) in dproj.iter().enumerate() {
            let t = w.phi_eff(m, kk, j) * u;
            v += t;
            a += t.abs();
        }
        dx[kk] += v;
        dx_abs[kk] += a;
    }
    TokenBackward {
        dh,
        dz,
        dproj,
        xcoef,
        dalpha,
        dx,
        dx_abs,
        dy,
        dy_abs,
    }
}

/// Gradients of the weights: sums over tokens.
#[derive(Clone, Debug)]
pub struct ParamGrads {
    /// `[K, M]`.
    pub dphi: Vec<f64>,
    /// `[K]`, when the problem has `gamma`.
    pub dgamma: Option<Vec<f64>>,
    /// `[3]`.
    pub dalpha: [f64; 3],
    /// `[M]`: pre `[0, n)`, post `[n, 2n)`, res `[2n, M)`.
    pub dbias: Vec<f64>,
}

impl ParamGrads {
    /// All zero.
    pub fn zeros(p: &MhcProblem) -> Self {
        ParamGrads {
            dphi: vec![0.0; p.k() * p.m()],
            dgamma: p.gamma.then(|| vec![0.0; p.k()]),
            dalpha: [0.0; 3],
            dbias: vec![0.0; p.m()],
        }
    }

    /// Add one token's contributions: `dphi[k][m] += gamma[k] x[k] u[m]`,
    /// `dgamma[k] += x[k] sum_m phi[k][m] u[m]`, `dbias += dz`, `dalpha += ...`.
    pub fn add_token(&mut self, p: &MhcProblem, w: &Weights, x: &[f64], b: &TokenBackward) {
        let (k, m) = (p.k(), p.m());
        for kk in 0..k {
            let g = w.gamma.as_ref().map_or(1.0, |g| g[kk]);
            let mut dg = 0.0;
            for j in 0..m {
                self.dphi[kk * m + j] += g * x[kk] * b.dproj[j];
                dg += w.phi[kk * m + j] * b.dproj[j];
            }
            if let Some(d) = self.dgamma.as_mut() {
                d[kk] += x[kk] * dg;
            }
        }
        for j in 0..m {
            self.dbias[j] += b.dz[j];
        }
        for (a, v) in self.dalpha.iter_mut().zip(b.dalpha) {
            *a += v;
        }
    }

    /// Add another partial sum.
    pub fn merge(&mut self, other: &ParamGrads) {
        let add = |a: &mut [f64], b: &[f64]| a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        add(&mut self.dphi, &other.dphi);
        if let (Some(a), Some(b)) = (self.dgamma.as_mut(), other.dgamma.as_ref()) {
            add(a, b);
        }
        add(&mut self.dalpha, &other.dalpha);
        add(&mut self.dbias, &other.dbias);
    }
}

/// The reference of every token (forward and backward) and the weight gradients.
pub struct Reference {
    /// Per token.
    pub forward: Vec<TokenForward>,
    /// Per token.
    pub backward: Vec<TokenBackward>,
    /// Weight gradients.
    pub grads: ParamGrads,
}

/// Split the tokens into contiguous ranges, one per CPU core; for each range, start from
/// `init()` and call `f(&mut acc, t)` for its tokens in order. Returns the accumulators in
/// range order.
pub fn fold_tokens<A: Send>(
    tokens: usize,
    init: impl Fn() -> A + Sync,
    f: impl Fn(&mut A, usize) + Sync,
) -> Vec<A> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(tokens.max(1));
    let chunk = tokens.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (f, init) = (&f, &init);
                s.spawn(move || {
                    let mut acc = init();
                    for t in i * chunk..((i + 1) * chunk).min(tokens) {
                        f(&mut acc, t);
                    }
                    acc
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reference worker panicked"))
            .collect()
    })
}

/// Run `f(t)` for every token on all CPU cores; returns the results in token order.
pub fn map_tokens<R: Send>(tokens: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    fold_tokens(tokens, Vec::new, |acc, t| acc.push(f(t)))
        .into_iter()
        .flatten()
        .collect()
}

/// The full reference of a (small) problem.
pub fn reference(data: &MhcData) -> Reference {
    let p = &data.problem;
    let w = data.weights();
    let (c, k) = (p.c, p.k());
    let per_token = map_tokens(p.tokens(), |t| {
        let x = MhcData::token(&data.x, t, k);
        let y = MhcData::token(&data.y, t, c);
        let f = token_forward(p, &w, &x, &y);
        let b = token_backward(
            p,
            &w,
            &x,
            &y,
            &MhcData::token(&data.d_xin, t, c),
            &MhcData::token(&data.d_xnext, t, k),
            &f,
        );
        (f, b)
    });
    let mut grads = ParamGrads::zeros(p);
    for (t, (_, b)) in per_token.iter().enumerate() {
        grads.add_token(p, &w, &MhcData::token(&data.x, t, k), b);
    }
    let (forward, backward) = per_token.into_iter().unzip();
    Reference {
        forward,
        backward,
        grads,
    }
}

/// `L = sum_t (d_xin . x_in + d_xnext . x_next)` in f64 for continuous inputs (all tokens,
/// `[T, n C]` and `[T, C]` row-major): the scalar whose gradient the backward computes.
pub fn loss(
    p: &MhcProblem,
    w: &Weights,
    x: &[f64],
    y: &[f64],
    d_xin: &[f64],
    d_xnext: &[f64],
) -> f64 {
    let (c, k) = (p.c, p.k());
    (0..p.tokens())
        .map(|t| {
            let f = token_forward(p, w, &x[t * k..(t + 1) * k], &y[t * c..(t + 1) * c]);
            let a: f64 = f
                .x_in
                .iter()
                .zip(&d_xin[t * c..(t + 1) * c])
                .map(|(u, v)| u * v)
                .sum();
            let b: f64 = f
                .x_next
                .iter()
                .zip(&d_xnext[t * k..(t + 1) * k])
                .map(|(u, v)| u * v)
                .sum();
            a + b
        })
        .sum()
}

/// Tolerance of one bf16 output (`x_in`, `x_next`, `dx`, `dy`) against the f64 reference `r`
/// whose terms have absolute sum `abs`: one rounding of the f32 result to bf16 (unit roundoff
/// `2^-8`, times 2 for margin: `2^-7 |r|`) plus `2^-13 abs` for the f32 computation and the
/// relative error of the f32 coefficients it used (about `1e-5`, so about 10x margin).
pub fn tol_bf16(r: f64, abs: f64) -> f64 {
    r.abs() / 128.0 + abs / 8192.0 + 1e-30
}

/// Tolerance of one f32 output (coefficients, saved `h~` and `r`, weight gradients) against the
/// f64 reference `r`, in a tensor whose largest reference magnitude is `scale`: relative error
/// `1e-3`, with the denominator floored at 1% of `scale` (elements that cancel to nearly zero
/// are held to `1e-5 scale`).
pub fn tol_f32(r: f64, scale: f64) -> f64 {
    1e-3 * (r.abs() + 0.01 * scale) + 1e-30
}

/// Tolerance of one projection coefficient `h~[m]` (f32) against the f64 reference `r`, with
/// `abs = sum_k |x_k phi'[k][m]| / r_rms` and `scale` as in [`tol_f32`]: [`tol_f32`] plus
/// `2^-15 abs`. The kernel represents `phi'` as `hi + lo` bf16 (`2^-17` relative per term,
/// errors of either sign) and accumulates in f32, so its error is bounded by a fraction of the
/// terms' absolute sum, which for `nC = 16384` random terms is ~100x `|h~|`; elements that
/// cancel to nearly zero were otherwise held to `1e-5 scale`, below what the split can give
/// (measured on the H200: `1.33e-5` against `1.12e-5` for 3 of 393216 values at
/// `B=4, S=4096, n=4, C=4096`).
pub fn tol_proj(r: f64, scale: f64, abs: f64) -> f64 {
    tol_f32(r, scale) + abs / 32768.0
}
