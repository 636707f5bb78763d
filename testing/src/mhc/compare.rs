//! Comparing kernel outputs with the reference, output by output, within the tolerances of
//! the reference's `tol_bf16`, `tol_f32` and `tol_proj`.

use half::bf16;
use kernels::mhc::MhcProblem;
use kernels::mhc::reference::{
    MhcData, ParamGrads, fold_tokens, token_backward, token_forward, tol_bf16, tol_f32, tol_proj,
};

/// Error statistics of one output tensor.
#[derive(Clone, Debug, Default)]
pub struct Stat {
    /// Values compared.
    pub values: usize,
    /// Largest absolute error (infinite for NaN).
    pub max_err: f64,
    /// Largest error / tolerance (the margin: below 1 passes).
    pub max_ratio: f64,
    /// Values out of tolerance.
    pub bad: usize,
    /// The worst violation: error / tolerance, and a description.
    pub worst: Option<(f64, String)>,
}

impl Stat {
    /// Compare one value.
    pub fn add(&mut self, got: f64, want: f64, tol: f64, at: impl FnOnce() -> String) {
        self.values += 1;
        let err = (got - want).abs();
        let err = if err.is_finite() { err } else { f64::INFINITY };
        self.max_err = self.max_err.max(err);
        let ratio = if tol.is_nan() {
            f64::INFINITY
        } else {
            err / tol
        };
        self.max_ratio = self.max_ratio.max(ratio);
        // `err > tol` is false for NaN; a NaN error (never from `err` above, but from `tol`)
        // must fail too.
        if err > tol || tol.is_nan() {
            self.bad += 1;
            if self.worst.as_ref().is_none_or(|(r, _)| ratio > *r) {
                self.worst = Some((
                    ratio,
                    format!(
                        "{}: got {got}, want {want}, |err| {err:.3e} > tol {tol:.3e}",
                        at()
                    ),
                ));
            }
        }
    }

    /// Add another partial comparison.
    pub fn merge(&mut self, o: &Stat) {
        self.values += o.values;
        self.max_err = self.max_err.max(o.max_err);
        self.max_ratio = self.max_ratio.max(o.max_ratio);
        self.bad += o.bad;
        if let Some((r, w)) = &o.worst
            && self.worst.as_ref().is_none_or(|(s, _)| r > s)
        {
            self.worst = Some((*r, w.clone()));
        }
    }
}

/// Every output of the forward and the backward, copied to the host: what [`compare`] checks.
#[derive(Clone, Debug)]
pub struct MhcHostOutputs {
    /// `[T, C]`.
    pub x_in: Vec<bf16>,
    /// `[T, n, C]`.
    pub x_next: Vec<bf16>,
    /// `[T, n]`.
    pub h_pre: Vec<f32>,
    /// `[T, n]`.
    pub h_post: Vec<f32>,
    /// `[T, n, n]`.
    pub h_res: Vec<f32>,
    /// `[T, M]`.
    pub hproj: Vec<f32>,
    /// `[T]`.
    pub rms: Vec<f32>,
    /// `[T, n, C]`.
    pub dx: Vec<bf16>,
    /// `[T, C]`.
    pub dy: Vec<bf16>,
    /// `[n C, M]`.
    pub dphi: Vec<f32>,
    /// `[n C]`, with gamma.
    pub dgamma: Option<Vec<f32>>,
    /// `[3]`.
    pub dalpha: Vec<f32>,
    /// `[M]`.
    pub dbias: Vec<f32>,
}

impl MhcHostOutputs {
    /// Whether two runs produced the same bits in every output.
    pub fn same_bits(&self, o: &MhcHostOutputs) -> bool {
        fn f(a: &[f32], b: &[f32]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        fn h(a: &[bf16], b: &[bf16]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        h(&self.x_in, &o.x_in)
            && h(&self.x_next, &o.x_next)
            && h(&self.dx, &o.dx)
            && h(&self.dy, &o.dy)
            && f(&self.h_pre, &o.h_pre)
            && f(&self.h_post, &o.h_post)
            && f(&self.h_res, &o.h_res)
            && f(&self.hproj, &o.hproj)
            && f(&self.rms, &o.rms)
            && f(&self.dphi, &o.dphi)
            && f(&self.dalpha, &o.dalpha)
            && f(&self.dbias, &o.dbias)
            && match (&self.dgamma, &o.dgamma) {
                (Some(a), Some(b)) => f(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

/// The outputs [`compare`] checks, each on its own (`dbias` in its three parts).
pub const OUTPUTS: [&str; 15] = [
    "x_in",
    "x_next",
    "h_pre",
    "h_post",
    "h_res",
    "hproj",
    "rms",
    "dx",
    "dy",
    "dphi",
    "dgamma",
    "dalpha",
    "dbias_pre",
    "dbias_post",
    "dbias_res",
];

fn slot(name: &str) -> usize {
    OUTPUTS
        .iter()
        .position(|n| *n == name)
        .expect("a known output")
}

/// The result of [`compare`]: one [`Stat`] per entry of [`OUTPUTS`].
#[derive(Clone, Debug)]
pub struct Comparison {
    /// Per output, in the order of [`OUTPUTS`].
    pub stats: Vec<Stat>,
}

impl Comparison {
    /// The statistics of output `name`.
    pub fn get(&self, name: &str) -> &Stat {
        &self.stats[slot(name)]
    }

    /// Whether every compared value is within tolerance.
    pub fn ok(&self) -> bool {
        self.stats.iter().all(|s| s.bad == 0)
    }

    /// One line per compared output: `label name: max |err| = ... over N values`.
    pub fn lines(&self, label: &str) -> Vec<String> {
        OUTPUTS
            .iter()
            .zip(&self.stats)
            .filter(|(_, s)| s.values > 0)
            .map(|(n, s)| {
                format!(
                    "{label} {n}: max |err| = {:.3e} (at most {:.3} of the tolerance) over {} values",
                    s.max_err, s.max_ratio, s.values
                )
            })
            .collect()
    }

    /// One line per output with values out of tolerance, with its worst one.
    pub fn failures(&self) -> Vec<String> {
        OUTPUTS
            .iter()
            .zip(&self.stats)
            .filter_map(|(n, s)| {
                s.worst.as_ref().map(|(_, w)| {
                    format!("{n}: {} of {} out of tolerance; worst {w}", s.bad, s.values)
                })
            })
            .collect()
    }
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Compare kernel outputs with the reference, with [`tol_bf16`] and [`tol_f32`] (for per-token
/// f32 outputs the scale is the token's largest value of that output). With `tokens`, only
/// those tokens' outputs are compared (weight gradients need every token: they are compared
/// only when `tokens` is `None`). Tokens are processed on all CPU cores.
pub fn compare(data: &MhcData, out: &MhcHostOutputs, tokens: Option<&[usize]>) -> Comparison {
    let p = &data.problem;
    let w = data.weights();
    let (n, c, k, m) = (p.n, p.c, p.k(), p.m());
    let all = tokens.is_none();
    let list: Vec<usize> = tokens.map_or_else(|| (0..p.tokens()).collect(), |t| t.to_vec());
    let bf = |v: bf16| v.to_f64();
    let accs = fold_tokens(
        list.len(),
        || {
            (
                vec![Stat::default(); OUTPUTS.len()],
                all.then(|| ParamGrads::zeros(p)),
            )
        },
        |(st, grads), i| {
            let t = list[i];
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
            if let Some(g) = grads.as_mut() {
                g.add_token(p, &w, &x, &b);
            }
            for i in 0..c {
                let at = || format!("token {t} channel {i}");
                st[slot("x_in")].add(
                    bf(out.x_in[t * c + i]),
                    f.x_in[i],
                    tol_bf16(f.x_in[i], f.x_in_abs[i]),
                    at,
                );
                st[slot("dy")].add(
                    bf(out.dy[t * c + i]),
                    b.dy[i],
                    tol_bf16(b.dy[i], b.dy_abs[i]),
                    at,
                );
            }
            for i in 0..k {
                let at = || format!("token {t} element {i}");
                let (r, a) = (f.x_next[i], f.x_next_abs[i]);
                st[slot("x_next")].add(bf(out.x_next[t * k + i]), r, tol_bf16(r, a), at);
                st[slot("dx")].add(
                    bf(out.dx[t * k + i]),
                    b.dx[i],
                    tol_bf16(b.dx[i], b.dx_abs[i]),
                    at,
                );
            }
            let per_token = |st: &mut Stat, got: &[f32], want: &[f64]| {
                let scale = max_abs(want);
                for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
                    st.add(g as f64, r, tol_f32(r, scale), || {
                        format!("token {t} index {i}")
                    });
                }
            };
            per_token(
                &mut st[slot("h_pre")],
                &out.h_pre[t * n..(t + 1) * n],
                &f.h_pre,
            );
            per_token(
                &mut st[slot("h_post")],
                &out.h_post[t * n..(t + 1) * n],
                &f.h_post,
            );
            per_token(
                &mut st[slot("h_res")],
                &out.h_res[t * n * n..(t + 1) * n * n],
                &f.h_res,
            );
            let scale = max_abs(&f.hproj);
            for i in 0..m {
                st[slot("hproj")].add(
                    out.hproj[t * m + i] as f64,
                    f.hproj[i],
                    tol_proj(f.hproj[i], scale, f.hproj_abs[i]),
                    || format!("token {t} index {i}"),
                );
            }
            per_token(&mut st[slot("rms")], &out.rms[t..t + 1], &[f.rms]);
        },
    );
    let mut stats = vec![Stat::default(); OUTPUTS.len()];
    let mut grads = all.then(|| ParamGrads::zeros(p));
    for (st, g) in &accs {
        for (s, o) in stats.iter_mut().zip(st) {
            s.merge(o);
        }
        if let (Some(total), Some(g)) = (grads.as_mut(), g) {
            total.merge(g);
        }
    }
    if let Some(grads) = grads {
        let whole = |st: &mut Stat, got: &[f32], want: &[f64], what: &str| {
            let scale = max_abs(want);
            for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
                st.add(g as f64, r, tol_f32(r, scale), || {
                    format!("{what} index {i}")
                });
            }
        };
        whole(&mut stats[slot("dphi")], &out.dphi, &grads.dphi, "dphi");
        if let (Some(got), Some(want)) = (&out.dgamma, &grads.dgamma) {
            whole(&mut stats[slot("dgamma")], got, want, "dgamma");
        }
        whole(
            &mut stats[slot("dalpha")],
            &out.dalpha,
            &grads.dalpha,
            "dalpha",
        );
        whole(
            &mut stats[slot("dbias_pre")],
            &out.dbias[..n],
            &grads.dbias[..n],
            "dbias_pre",
        );
        whole(
            &mut stats[slot("dbias_post")],
            &out.dbias[n..2 * n],
            &grads.dbias[n..2 * n],
            "dbias_post",
        );
        whole(
            &mut stats[slot("dbias_res")],
            &out.dbias[2 * n..],
            &grads.dbias[2 * n..],
            "dbias_res",
        );
    }
    Comparison { stats }
}

/// `count` tokens spread evenly over the problem (first and last included).
pub fn sample_tokens(p: &MhcProblem, count: usize) -> Vec<usize> {
    let t = p.tokens();
    if count >= t {
        return (0..t).collect();
    }
    (0..count)
        .map(|i| i * (t - 1) / (count - 1).max(1))
        .collect()
}
