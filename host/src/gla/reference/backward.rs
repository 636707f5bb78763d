//! The f64 backward of the recurrence: **the specification of the gradients**.
//!
//! # Semantics
//! Per sequence and head (every sequence of a packed batch independently), with the decay as
//! the kernels compute it, `a_t[d] = exp(max(g_t[d], G_FLOOR))` (`g` clamped below at
//! [`G_FLOOR`] = -20), the forward is, for `t = 1..T`,
//!
//! - `S_t = diag(a_t) S_{t-1} + k_t^T v_t` (`S_0` the initial state, or 0),
//! - `o_t = scale q_t S_t`, and the final state is `S_T`.
//!
//! [`clamped_recurrence`] computes it on f64 inputs; it equals [`recurrence`](super::recurrence)
//! wherever every `g >= G_FLOOR` (`recurrence` uses `g` as given, without the clamp).
//!
//! Given `dO_t = dL/do_t` and `dS^final = dL/dS_T` (zero when absent) for a scalar loss `L`,
//! let `dS_t` be the total derivative of `L` with respect to `S_t`. `S_t` reaches `L` through
//! `o_t`, through `S_{t+1}` and (for `t = T`) directly, so
//!
//! - `dS_T = dS^final + scale q_T^T dO_T`,
//! - `dS_t = diag(a_{t+1}) dS_{t+1} + scale q_t^T dO_t` for `t < T`,
//! - `dS_0 = diag(a_1) dS_1`: the gradient of the initial state (the same whether or not an
//!   initial state was given: the recurrence is linear in `S_0`).
//!
//! Each input of step `t` enters `L` only through `o_t` (for `q_t`) or through `S_t` (for
//! `k_t`, `v_t`, `g_t`), hence, with `S_{t-1}` and `dS_t` as above:
//!
//! - `dq_t[d] = scale sum_e dO_t[e] S_t[d][e]` (from `o_t[e] = scale sum_d q_t[d] S_t[d][e]`),
//! - `dk_t[d] = sum_e dS_t[d][e] v_t[e]` and `dv_t[e] = sum_d k_t[d] dS_t[d][e]` (from the
//!   term `k_t[d] v_t[e]` of `S_t[d][e]`),
//! - `dg_t[d] = a_t[d] sum_e S_{t-1}[d][e] dS_t[d][e]` where `g_t[d] >= G_FLOOR`, and 0 where
//!   `g_t[d] < G_FLOOR` (from the term `a_t[d] S_{t-1}[d][e]`, `da/dg = a` above the floor;
//!   below it the clamp is constant). This is the gradient of the log-decay *before* the
//!   clamp; at `g = G_FLOOR` exactly it is the derivative from above (as torch's `clamp` takes
//!   it).
//!
//! [`backward`] computes every (sequence, head) by a reverse sweep over the tokens with the
//! states `S_0 .. S_T` of the forward stored (`(T + 1) dk dv` f64 per (sequence, head) at a
//! time: meant for the small problems of tests and spot checks), written for clarity, not speed.

use super::{Exact, HostInputs};
use crate::error::{Error, Result};
use crate::gla::GlaProblem;
use kernel_abi::gla::G_FLOOR;

/// Inputs in f64 (so that they can be perturbed by less than a bf16 step, as finite
/// differences need): q, k, g `[B, T, H, dk]`, v `[B, T, H, dv]`, optional initial states
/// `[N, H, dk, dv]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExactInputs {
    /// Queries.
    pub q: Vec<f64>,
    /// Keys.
    pub k: Vec<f64>,
    /// Values.
    pub v: Vec<f64>,
    /// Log-decays (natural log; clamped below at [`G_FLOOR`] when used).
    pub g: Vec<f64>,
    /// Initial states, or zero.
    pub init_state: Option<Vec<f64>>,
}

impl ExactInputs {
    /// The bf16 (and f32) inputs of the kernels, exactly, in f64.
    pub fn from_host(inp: &HostInputs) -> Self {
        let f = |x: &[half::bf16]| x.iter().map(|v| v.to_f64()).collect();
        ExactInputs {
            q: f(inp.q),
            k: f(inp.k),
            v: f(inp.v),
            g: f(inp.g),
            init_state: inp
                .init_state
                .map(|s| s.iter().map(|&x| x as f64).collect()),
        }
    }

    /// Check the lengths against `p` (and `p` itself).
    pub fn validate(&self, p: &GlaProblem) -> Result<()> {
        p.validate()?;
        let init = self.init_state.as_ref().map_or(p.state_len(), Vec::len);
        for (what, len, want) in [
            ("q", self.q.len(), p.qk_len()),
            ("k", self.k.len(), p.qk_len()),
            ("g", self.g.len(), p.qk_len()),
            ("v", self.v.len(), p.v_len()),
            ("initial state", init, p.state_len()),
        ] {
            check_len(what, len, want)?;
        }
        Ok(())
    }

    /// `a_t[d]` of token row `t`, head `h`, and whether the clamp lets the gradient of `g`
    /// through (`g >= G_FLOOR`).
    fn decay(&self, p: &GlaProblem, t: usize, h: usize, d: usize) -> (f64, bool) {
        let g = self.g[(t * p.heads + h) * p.dk + d];
        let floor = G_FLOOR as f64;
        (g.max(floor).exp(), g >= floor)
    }

    /// `S = diag(a_t) S + k_t^T v_t` for token row `t`, head `h` (`s` is `[dk][dv]`).
    fn advance(&self, p: &GlaProblem, t: usize, h: usize, s: &mut [f64]) {
        let (dk, dv) = (p.dk, p.dv);
        let qk = (t * p.heads + h) * dk;
        let vo = (t * p.heads + h) * dv;
        for d in 0..dk {
            let (a, _) = self.decay(p, t, h, d);
            let kd = self.k[qk + d];
            for e in 0..dv {
                s[d * dv + e] = a * s[d * dv + e] + kd * self.v[vo + e];
            }
        }
    }

    /// The initial state `[dk][dv]` of sequence `seq`, head `h` (zero when absent).
    fn state0(&self, p: &GlaProblem, seq: usize, h: usize) -> Vec<f64> {
        let sz = p.dk * p.dv;
        let at = (seq * p.heads + h) * sz;
        match &self.init_state {
            Some(s) => s[at..at + sz].to_vec(),
            None => vec![0.0; sz],
        }
    }
}

/// The gradients of the loss with respect to the forward's outputs: dO `[B, T, H, dv]` and,
/// optionally, the final states' `[N, H, dk, dv]` (absent: zero, as when the final states are
/// not used).
#[derive(Clone, Copy, Debug)]
pub struct OutputGrads<'a> {
    /// `dL/do`.
    pub d_o: &'a [f64],
    /// `dL/d final_state`, or zero.
    pub d_final_state: Option<&'a [f64]>,
}

impl OutputGrads<'_> {
    fn validate(&self, p: &GlaProblem) -> Result<()> {
        check_len("output gradient", self.d_o.len(), p.v_len())?;
        let fin = self.d_final_state.map_or(p.state_len(), <[f64]>::len);
        check_len("final-state gradient", fin, p.state_len())
    }
}

/// The gradients of the inputs. From [`backward`]: dq, dk, dg `[B, T, H, dk]`, dv
/// `[B, T, H, dv]`, `d_init_state` `[N, H, dk, dv]`; from [`backward_head`]: the rows of one
/// (sequence, head) in order, dq, dk, dg `[len, dk]`, dv `[len, dv]`, `d_init_state`
/// `[dk, dv]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradients {
    /// `dL/dq`.
    pub dq: Vec<f64>,
    /// `dL/dk`.
    pub dk: Vec<f64>,
    /// `dL/dv`.
    pub dv: Vec<f64>,
    /// `dL/dg` before the clamp (zero where `g < G_FLOOR`).
    pub dg: Vec<f64>,
    /// `dL/dS_0`, given for every sequence and head whether or not initial states were given
    /// (with none it is the gradient at a zero initial state).
    pub d_init_state: Vec<f64>,
}

/// The forward (see the module documentation) on f64 inputs, `g` clamped at [`G_FLOOR`]:
/// what [`backward`] differentiates.
pub fn clamped_recurrence(p: &GlaProblem, x: &ExactInputs) -> Result<Exact> {
    x.validate(p)?;
    let (h_n, dk, dv) = (p.heads, p.dk, p.dv);
    let scale = p.output_scale() as f64;
    let mut o = vec![0.0f64; p.v_len()];
    let mut final_state = vec![0.0f64; p.state_len()];
    for (n, (start, len)) in p.sequences().into_iter().enumerate() {
        for h in 0..h_n {
            let mut s = x.state0(p, n, h);
            for t in start..start + len {
                x.advance(p, t, h, &mut s);
                let qk = (t * h_n + h) * dk;
                let vo = (t * h_n + h) * dv;
                for e in 0..dv {
                    let mut acc = 0.0f64;
                    for d in 0..dk {
                        acc += x.q[qk + d] * s[d * dv + e];
                    }
                    o[vo + e] = scale * acc;
                }
            }
            let s0 = (n * h_n + h) * dk * dv;
            final_state[s0..s0 + dk * dv].copy_from_slice(&s);
        }
    }
    Ok(Exact { o, final_state })
}

/// The gradients of every input (see the module documentation) given the outputs' gradients.
pub fn backward(p: &GlaProblem, x: &ExactInputs, dy: &OutputGrads) -> Result<Gradients> {
    x.validate(p)?;
    dy.validate(p)?;
    let (h_n, dk, dv) = (p.heads, p.dk, p.dv);
    let sz = dk * dv;
    let mut out = Gradients {
        dq: vec![0.0; p.qk_len()],
        dk: vec![0.0; p.qk_len()],
        dv: vec![0.0; p.v_len()],
        dg: vec![0.0; p.qk_len()],
        d_init_state: vec![0.0; p.state_len()],
    };
    for (n, (start, len)) in p.sequences().into_iter().enumerate() {
        for h in 0..h_n {
            let one = walk_backward(p, x, dy, n, start, len, h);
            for i in 0..len {
                let qk = ((start + i) * h_n + h) * dk;
                let vo = ((start + i) * h_n + h) * dv;
                let (rk, rv) = (i * dk..(i + 1) * dk, i * dv..(i + 1) * dv);
                out.dq[qk..qk + dk].copy_from_slice(&one.dq[rk.clone()]);
                out.dk[qk..qk + dk].copy_from_slice(&one.dk[rk.clone()]);
                out.dg[qk..qk + dk].copy_from_slice(&one.dg[rk]);
                out.dv[vo..vo + dv].copy_from_slice(&one.dv[rv]);
            }
            let s0 = (n * h_n + h) * sz;
            out.d_init_state[s0..s0 + sz].copy_from_slice(&one.d_init_state);
        }
    }
    Ok(out)
}

/// The gradients of one (sequence, head) only (the layout is in [`Gradients`]), for spot
/// checks of large problems.
pub fn backward_head(
    p: &GlaProblem,
    x: &ExactInputs,
    dy: &OutputGrads,
    seq: usize,
    head: usize,
) -> Result<Gradients> {
    x.validate(p)?;
    dy.validate(p)?;
    let seqs = p.sequences();
    let (start, len) = *seqs.get(seq).ok_or_else(|| {
        Error::invalid("GLA sequence", format!("{seq} >= {} sequences", seqs.len()))
    })?;
    if head >= p.heads {
        return Err(Error::invalid(
            "GLA head",
            format!("{head} >= {} heads", p.heads),
        ));
    }
    Ok(walk_backward(p, x, dy, seq, start, len, head))
}

/// What the reverse sweep of one (sequence, head) gives without the forward's states (the
/// reverse pass of the kernels): see [`reverse_sweep`].
#[derive(Clone, Debug, PartialEq)]
pub struct ReverseSweep {
    /// For every token `i` of `ends` (sequence-relative, in its order), `G` `[dk][dv]`: the
    /// derivative of `L` with respect to the state after token `i` through everything after it
    /// (`dS^final` after the last token; `dS_t - scale q_t^T dO_t` at that token `t` in the
    /// notation of the module documentation). The kernels store it at block ends.
    pub at_ends: Vec<Vec<f64>>,
    /// `dS_0` `[dk][dv]`.
    pub d_init_state: Vec<f64>,
    /// `dL/dk` `[len, dk]`.
    pub dk: Vec<f64>,
    /// `dL/dv` `[len, dv]`.
    pub dv: Vec<f64>,
}

/// The gradients of one (sequence, head) that need only `dS_t` (not the states): the state
/// gradients after the tokens `ends` (sequence-relative indices), `dS_0`, dk and dv (the same
/// numbers as [`backward_head`]'s, computed without storing the states, so for long sequences
/// too).
pub fn reverse_sweep(
    p: &GlaProblem,
    x: &ExactInputs,
    dy: &OutputGrads,
    seq: usize,
    head: usize,
    ends: &[usize],
) -> Result<ReverseSweep> {
    x.validate(p)?;
    dy.validate(p)?;
    let seqs = p.sequences();
    let (start, len) = *seqs.get(seq).ok_or_else(|| {
        Error::invalid("GLA sequence", format!("{seq} >= {} sequences", seqs.len()))
    })?;
    if head >= p.heads || ends.iter().any(|&i| i >= len) {
        return Err(Error::invalid(
            "GLA head or token",
            format!("head {head} of {}, tokens {ends:?} of {len}", p.heads),
        ));
    }
    let (h_n, dk, dv) = (p.heads, p.dk, p.dv);
    let sz = dk * dv;
    let scale = p.output_scale() as f64;
    let at = (seq * h_n + head) * sz;
    let mut ds: Vec<f64> = match dy.d_final_state {
        Some(f) => f[at..at + sz].to_vec(),
        None => vec![0.0; sz],
    };
    let mut out = ReverseSweep {
        at_ends: vec![Vec::new(); ends.len()],
        d_init_state: Vec::new(),
        dk: vec![0.0; len * dk],
        dv: vec![0.0; len * dv],
    };
    for i in (0..len).rev() {
        for (n, _) in ends.iter().enumerate().filter(|&(_, &e)| e == i) {
            out.at_ends[n] = ds.clone();
        }
        let t = start + i;
        let qk = (t * h_n + head) * dk;
        let vo = (t * h_n + head) * dv;
        // dS_t: add the output term of t.
        for d in 0..dk {
            for e in 0..dv {
                ds[d * dv + e] += scale * x.q[qk + d] * dy.d_o[vo + e];
            }
        }
        for d in 0..dk {
            let mut acc = 0.0f64;
            for e in 0..dv {
                acc += ds[d * dv + e] * x.v[vo + e];
            }
            out.dk[i * dk + d] = acc;
        }
        for e in 0..dv {
            let mut acc = 0.0f64;
            for d in 0..dk {
                acc += x.k[qk + d] * ds[d * dv + e];
            }
            out.dv[i * dv + e] = acc;
        }
        for d in 0..dk {
            let (a, _) = x.decay(p, t, head, d);
            for e in 0..dv {
                ds[d * dv + e] *= a;
            }
        }
    }
    out.d_init_state = ds;
    Ok(out)
}

/// The reverse sweep over one (sequence, head) (validated inputs), in the layout of
/// [`backward_head`].
fn walk_backward(
    p: &GlaProblem,
    x: &ExactInputs,
    dy: &OutputGrads,
    seq: usize,
    start: usize,
    len: usize,
    h: usize,
) -> Gradients {
    let (h_n, dk, dv) = (p.heads, p.dk, p.dv);
    let sz = dk * dv;
    let scale = p.output_scale() as f64;
    // states[i] = S_i (after i tokens of the sequence), i = 0..=len.
    let mut states = x.state0(p, seq, h);
    states.reserve(len * sz);
    for i in 0..len {
        let mut s = states[i * sz..(i + 1) * sz].to_vec();
        x.advance(p, start + i, h, &mut s);
        states.extend_from_slice(&s);
    }
    let at = (seq * h_n + h) * sz;
    // dS_T = dS^final (+ scale q_T^T dO_T below).
    let mut ds: Vec<f64> = match dy.d_final_state {
        Some(f) => f[at..at + sz].to_vec(),
        None => vec![0.0; sz],
    };
    let mut out = Gradients {
        dq: vec![0.0; len * dk],
        dk: vec![0.0; len * dk],
        dv: vec![0.0; len * dv],
        dg: vec![0.0; len * dk],
        d_init_state: Vec::new(),
    };
    for i in (0..len).rev() {
        let t = start + i;
        let qk = (t * h_n + h) * dk;
        let vo = (t * h_n + h) * dv;
        let s_prev = &states[i * sz..(i + 1) * sz];
        let s_t = &states[(i + 1) * sz..(i + 2) * sz];
        let d_o = &dy.d_o[vo..vo + dv];
        // dS_t += scale q_t^T dO_t: now the total derivative with respect to S_t.
        for d in 0..dk {
            for e in 0..dv {
                ds[d * dv + e] += scale * x.q[qk + d] * d_o[e];
            }
        }
        for d in 0..dk {
            let (mut dq, mut dkd, mut da) = (0.0f64, 0.0f64, 0.0f64);
            for e in 0..dv {
                dq += d_o[e] * s_t[d * dv + e];
                dkd += ds[d * dv + e] * x.v[vo + e];
                da += s_prev[d * dv + e] * ds[d * dv + e];
            }
            let (a, through) = x.decay(p, t, h, d);
            out.dq[i * dk + d] = scale * dq;
            out.dk[i * dk + d] = dkd;
            out.dg[i * dk + d] = if through { a * da } else { 0.0 };
        }
        for e in 0..dv {
            let mut acc = 0.0f64;
            for d in 0..dk {
                acc += x.k[qk + d] * ds[d * dv + e];
            }
            out.dv[i * dv + e] = acc;
        }
        // dS_{t-1} = diag(a_t) dS_t (+ the output term of t - 1, next iteration).
        for d in 0..dk {
            let (a, _) = x.decay(p, t, h, d);
            for e in 0..dv {
                ds[d * dv + e] *= a;
            }
        }
    }
    out.d_init_state = ds;
    out
}

fn check_len(what: &str, len: usize, want: usize) -> Result<()> {
    if len != want {
        return Err(Error::shape(
            format!("GLA {what}"),
            format!("{want} elements"),
            len,
        ));
    }
    Ok(())
}
