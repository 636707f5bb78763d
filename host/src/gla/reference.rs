//! CPU references of the GLA forward, and the f64 backward of the recurrence.
//!
//! - [`recurrence`]: **the specification**, in f64, written as the recurrence itself:
//!   per sequence and head, `S = S0` (or 0), then for each token `t`
//!   `S[d][e] = exp(g[t][d]) S[d][e] + k[t][d] v[t][e]` and
//!   `o[t][e] = scale sum_d q[t][d] S[d][e]`; the final state is the last `S`.
//! - [`chunked`]: the kernels' algorithm on the CPU in f32, with the kernels' chunking,
//!   clamping, reference points, flushes to zero of `ex2`, bf16 roundings and segment passes (on
//!   the segments of [`GlaProblem::segments`] or any other [`SegmentPlan`]), so the algorithm
//!   (not only its GPU implementation) is checked against the recurrence; see
//!   `gpu-kernels/src/gla` for the derivation of each factor.
//! - [`backward()`]: **the specification of the gradients** (dq, dk, dv, dg, the initial
//!   states'), in f64, of the recurrence with `g` clamped at `G_FLOOR` ([`clamped_recurrence`]);
//!   derived in `reference/backward.rs`.

// The formulas are index loops over (token, key channel, value channel), as on paper.
#![allow(clippy::needless_range_loop)]

mod backward;

pub use backward::{
    ExactInputs, Gradients, OutputGrads, ReverseSweep, backward, backward_head, clamped_recurrence,
    reverse_sweep,
};

use super::{GlaProblem, SegmentPlan};
use crate::error::{Error, Result};
use half::bf16;
use kernel_abi::gla::{CHUNK, G_FLOOR, HALF, SEG_FIRST, SEG_LAST};

/// Host inputs: q, k, g `[B, T, H, dk]`, v `[B, T, H, dv]` (bf16), optional initial states
/// `[N, H, dk, dv]` (f32).
#[derive(Clone, Copy, Debug)]
pub struct HostInputs<'a> {
    /// Queries.
    pub q: &'a [bf16],
    /// Keys.
    pub k: &'a [bf16],
    /// Values.
    pub v: &'a [bf16],
    /// Log-decays (natural log).
    pub g: &'a [bf16],
    /// Initial states, or zero.
    pub init_state: Option<&'a [f32]>,
}

impl HostInputs<'_> {
    /// Check the slice lengths against `p` (and `p` itself).
    pub fn validate(&self, p: &GlaProblem) -> Result<()> {
        p.validate()?;
        for (what, len, want) in [
            ("q", self.q.len(), p.qk_len()),
            ("k", self.k.len(), p.qk_len()),
            ("g", self.g.len(), p.qk_len()),
            ("v", self.v.len(), p.v_len()),
            (
                "initial state",
                self.init_state.map_or(p.state_len(), |s| s.len()),
                p.state_len(),
            ),
        ] {
            if len != want {
                return Err(Error::shape(
                    format!("GLA {what}"),
                    format!("{want} elements"),
                    len,
                ));
            }
        }
        Ok(())
    }
}

/// The f64 result: o `[B, T, H, dv]` and the final states `[N, H, dk, dv]`.
#[derive(Clone, Debug)]
pub struct Exact {
    /// Outputs.
    pub o: Vec<f64>,
    /// Final states.
    pub final_state: Vec<f64>,
}

/// The specification (see the module documentation). `g` is used as given (no clamping).
pub fn recurrence(p: &GlaProblem, inp: &HostInputs) -> Result<Exact> {
    inp.validate(p)?;
    let (h_n, dk, dv) = (p.heads, p.dk, p.dv);
    let mut o = vec![0.0f64; p.v_len()];
    let mut final_state = vec![0.0f64; p.state_len()];
    for (n, (start, len)) in p.sequences().into_iter().enumerate() {
        for h in 0..h_n {
            let (rows, state) = walk_exact(p, inp, n, start, len, h);
            for i in 0..len {
                let at = ((start + i) * h_n + h) * dv;
                o[at..at + dv].copy_from_slice(&rows[i * dv..(i + 1) * dv]);
            }
            let s0 = (n * h_n + h) * dk * dv;
            final_state[s0..s0 + dk * dv].copy_from_slice(&state);
        }
    }
    Ok(Exact { o, final_state })
}

/// The specification for one (sequence, head) only: its outputs `[len, dv]` (the sequence's
/// rows of that head, in order) and its final state `[dk, dv]` (for spot checks of large
/// problems).
pub fn recurrence_head(
    p: &GlaProblem,
    inp: &HostInputs,
    seq: usize,
    head: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    inp.validate(p)?;
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
    Ok(walk_exact(p, inp, seq, start, len, head))
}

/// The recurrence over one (sequence, head) (validated inputs).
fn walk_exact(
    p: &GlaProblem,
    inp: &HostInputs,
    seq: usize,
    start: usize,
    len: usize,
    h: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (h_n, dk, dv) = (p.heads, p.dk, p.dv);
    let scale = p.output_scale() as f64;
    let state0 = (seq * h_n + h) * dk * dv;
    let mut s: Vec<f64> = (0..dk * dv)
        .map(|i| inp.init_state.map_or(0.0, |x| x[state0 + i] as f64))
        .collect();
    let mut o = vec![0.0f64; len * dv];
    for i in 0..len {
        let t = start + i;
        let qk = (t * h_n + h) * dk;
        let vo = (t * h_n + h) * dv;
        for d in 0..dk {
            let a = inp.g[qk + d].to_f64().exp();
            let kd = inp.k[qk + d].to_f64();
            for e in 0..dv {
                s[d * dv + e] = a * s[d * dv + e] + kd * inp.v[vo + e].to_f64();
            }
        }
        for e in 0..dv {
            let mut acc = 0.0f64;
            for d in 0..dk {
                acc += inp.q[qk + d].to_f64() * s[d * dv + e];
            }
            o[i * dv + e] = scale * acc;
        }
    }
    (o, s)
}

/// The result of [`chunked`]: o as the kernels round it (bf16) and the final states (f32).
#[derive(Clone, Debug)]
pub struct Chunked {
    /// Outputs `[B, T, H, dv]`.
    pub o: Vec<bf16>,
    /// Final states `[N, H, dk, dv]`.
    pub final_state: Vec<f32>,
}

/// Relative L2 error `||got - want|| / ||want||` (absolute `||got - want||` when `want` is all
/// zeros); infinite if `got` has a NaN or an infinity.
pub fn rel_l2(got: impl IntoIterator<Item = f64>, want: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    let mut n = 0usize;
    for (g, w) in got.into_iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        num += (g - w) * (g - w);
        den += w * w;
        n += 1;
    }
    if n != want.len() {
        return f64::INFINITY;
    }
    if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    }
}

fn round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// `2^x` as the kernels' `ex2.approx.ftz.f32` gives it (to within its rounding): subnormal
/// inputs and results are flushed to zero. (Without the flush this model hid the kernels'
/// former loss of the cross-half factor `2^{M_1 - M_0}` below `2^-126`.)
fn exp2(x: f32) -> f32 {
    let ftz = |v: f32| {
        if v.is_subnormal() {
            0.0f32.copysign(v)
        } else {
            v
        }
    };
    ftz(ftz(x).exp2())
}

/// One chunk's factors and bf16 operand tiles, as the kernels' element-wise phase makes them
/// (rows past the end of the segment are zero inputs with `g = 0`).
struct ChunkTiles {
    /// `q_t exp(b_t)`, `[16][dk]`.
    q_inter: Vec<f32>,
    /// `q_t exp(b_t - M_half(t))`, `[16][dk]`.
    q_diag: Vec<f32>,
    /// `k_s exp(M_0 - b_s)`, `[8][dk]`.
    k_half0: Vec<f32>,
    /// `k_s exp(M_1 - b_s)`, `[16][dk]`.
    k_half1: Vec<f32>,
    /// `k_s exp(b_15 - b_s)`, `[16][dk]`.
    k_state: Vec<f32>,
    /// `exp(b_15)` per key channel (f32).
    decay: Vec<f32>,
    /// `b_15` in log2 units per key channel.
    decay_log2: Vec<f32>,
}

/// Everything of one (segment, head) the chunk loop reads.
struct SegmentView<'a> {
    inp: &'a HostInputs<'a>,
    p: &'a GlaProblem,
    head: usize,
    start: usize,
    len: usize,
}

impl SegmentView<'_> {
    fn qk_at(&self, x: &[bf16], row: usize, d: usize) -> f32 {
        if row < self.len {
            x[((self.start + row) * self.p.heads + self.head) * self.p.dk + d].to_f32()
        } else {
            0.0
        }
    }

    fn v_at(&self, row: usize, e: usize) -> f32 {
        if row < self.len {
            self.inp.v[((self.start + row) * self.p.heads + self.head) * self.p.dv + e].to_f32()
        } else {
            0.0
        }
    }

    /// The element-wise phase of the chunk starting at segment row `c0`. With `states_only`,
    /// `k_state` is formed directly as `k exp2(b_15 - b)` (as `gla_states` does), else through
    /// the half-chunk variants (as `gla_fwd` does).
    fn tiles(&self, c0: usize, states_only: bool) -> ChunkTiles {
        let dk = self.p.dk;
        let (ch, half) = (CHUNK as usize, HALF as usize);
        let floor2 = G_FLOOR * std::f32::consts::LOG2_E;
        let mut t = ChunkTiles {
            q_inter: vec![0.0; ch * dk],
            q_diag: vec![0.0; ch * dk],
            k_half0: vec![0.0; half * dk],
            k_half1: vec![0.0; ch * dk],
            k_state: vec![0.0; ch * dk],
            decay: vec![0.0; dk],
            decay_log2: vec![0.0; dk],
        };
        for d in 0..dk {
            let mut b = [0.0f32; CHUNK as usize];
            let mut acc = 0.0f32;
            for i in 0..ch {
                let g = if c0 + i < self.len {
                    (self.qk_at(self.inp.g, c0 + i, d) * std::f32::consts::LOG2_E).max(floor2)
                } else {
                    0.0
                };
                acc += g;
                b[i] = acc;
            }
            let b15 = b[ch - 1];
            t.decay[d] = exp2(b15);
            t.decay_log2[d] = b15;
            let m = [0.5 * (b[0] + b[half - 1]), 0.5 * (b[half] + b[ch - 1])];
            for i in 0..ch {
                let q = self.qk_at(self.inp.q, c0 + i, d);
                let k = self.qk_at(self.inp.k, c0 + i, d);
                if states_only {
                    t.k_state[i * dk + d] = round(k * exp2(b15 - b[i]));
                    continue;
                }
                let hh = i / half;
                let x = b[i] - m[hh];
                let qd = q * exp2(x);
                t.q_diag[i * dk + d] = round(qd);
                t.q_inter[i * dk + d] = round(qd * exp2(m[hh]));
                let kd = k * exp2(-x);
                let k1 = if hh == 0 {
                    t.k_half0[i * dk + d] = round(kd);
                    // 2^{M_1 - M_0} as two factors of at least 2^-115.4 (see the kernel).
                    let r = exp2(0.5 * (m[1] - m[0]));
                    kd * r * r
                } else {
                    kd
                };
                t.k_half1[i * dk + d] = round(k1);
                t.k_state[i * dk + d] = round(k1 * exp2(b15 - m[1]));
            }
        }
        t
    }

    /// Walk the segment's chunks from state `s` (`[dk][dv]`, updated in place); with `o`, write
    /// the outputs of the segment's rows into it (`[B, T, H, dv]`).
    fn walk(&self, s: &mut [f32], mut o: Option<&mut [bf16]>, decay_total: &mut [f32]) {
        let (dk, dv) = (self.p.dk, self.p.dv);
        let (ch, half) = (CHUNK as usize, HALF as usize);
        let scale = self.p.output_scale();
        let states_only = o.is_none();
        for c0 in (0..self.len).step_by(ch) {
            let t = self.tiles(c0, states_only);
            if let Some(o) = o.as_deref_mut() {
                // Intra-chunk scores: three products of q_diag with the half variants of k,
                // full tiles (as the tensor cores compute them, overflow included), then the
                // kept entries selected.
                let dot = |a: &[f32], ra: usize, b: &[f32], rb: usize| -> f32 {
                    (0..dk).map(|d| a[ra * dk + d] * b[rb * dk + d]).sum()
                };
                let mut a = vec![0.0f32; ch * ch];
                for i in 0..ch {
                    for j in 0..ch {
                        let (ih, jh) = (i / half, j / half);
                        let v = match (ih, jh) {
                            (0, 0) => dot(&t.q_diag, i, &t.k_half0, j),
                            (1, 0) => dot(&t.q_diag, i, &t.k_half1, j),
                            (1, 1) => dot(&t.q_diag, i, &t.k_half1, j),
                            _ => 0.0,
                        };
                        let keep = ih > jh || (ih == jh && j % half <= i % half);
                        a[i * ch + j] = if keep { round(v) } else { 0.0 };
                    }
                }
                for i in 0..ch.min(self.len - c0) {
                    let row = ((self.start + c0 + i) * self.p.heads + self.head) * dv;
                    for e in 0..dv {
                        let mut acc = 0.0f32;
                        for j in 0..ch {
                            acc += a[i * ch + j] * self.v_at(c0 + j, e);
                        }
                        for d in 0..dk {
                            acc += t.q_inter[i * dk + d] * round(s[d * dv + e]);
                        }
                        o[row + e] = bf16::from_f32(acc * scale);
                    }
                }
            }
            for d in 0..dk {
                decay_total[d] += t.decay_log2[d];
                for e in 0..dv {
                    let mut acc = s[d * dv + e] * t.decay[d];
                    for j in 0..ch {
                        acc += t.k_state[j * dk + d] * self.v_at(c0 + j, e);
                    }
                    s[d * dv + e] = acc;
                }
            }
        }
    }
}

/// The kernels' algorithm on the CPU (see the module documentation) for the segments of
/// `plan`: the state pass of every segment that is not last, the combination along each
/// sequence, and the output pass of every segment from its initial state.
pub fn chunked(p: &GlaProblem, inp: &HostInputs, plan: &SegmentPlan) -> Result<Chunked> {
    inp.validate(p)?;
    let (h_n, dk, dv) = (p.heads, p.dk, p.dv);
    let nseg = plan.segments.len();
    let sz = dk * dv;
    let mut delta = vec![0.0f32; nseg * h_n * sz];
    let mut decay_log2 = vec![0.0f32; nseg * h_n * dk];
    let mut seg_init = vec![0.0f32; nseg * h_n * sz];
    let view = |i: usize, head: usize| {
        let seg = plan.segments[i];
        SegmentView {
            inp,
            p,
            head,
            start: seg.start as usize,
            len: seg.len as usize,
        }
    };
    // gla_states.
    if !plan.combine.is_empty() {
        for (i, seg) in plan.segments.iter().enumerate() {
            if seg.flags & SEG_LAST != 0 {
                continue;
            }
            for h in 0..h_n {
                let slot = i * h_n + h;
                let mut s = vec![0.0f32; sz];
                let mut dl = vec![0.0f32; dk];
                view(i, h).walk(&mut s, None, &mut dl);
                delta[slot * sz..(slot + 1) * sz].copy_from_slice(&s);
                decay_log2[slot * dk..(slot + 1) * dk].copy_from_slice(&dl);
            }
        }
    }
    // gla_combine.
    for c in &plan.combine {
        for h in 0..h_n {
            let init0 = (c.seq as usize * h_n + h) * sz;
            let mut s: Vec<f32> = (0..sz)
                .map(|e| inp.init_state.map_or(0.0, |x| x[init0 + e]))
                .collect();
            for i in 0..c.count as usize - 1 {
                let slot = (c.first as usize + i) * h_n + h;
                for e in 0..sz {
                    let a = exp2(decay_log2[slot * dk + e / dv]);
                    s[e] = a * s[e] + delta[slot * sz + e];
                }
                let next = slot + h_n;
                seg_init[next * sz..(next + 1) * sz].copy_from_slice(&s);
            }
        }
    }
    // gla_fwd.
    let mut o = vec![bf16::ZERO; p.v_len()];
    let mut final_state = vec![0.0f32; p.state_len()];
    for (i, seg) in plan.segments.iter().enumerate() {
        for h in 0..h_n {
            let slot = i * h_n + h;
            let state0 = (seg.seq as usize * h_n + h) * sz;
            let mut s: Vec<f32> = if seg.flags & SEG_FIRST != 0 {
                (0..sz)
                    .map(|e| inp.init_state.map_or(0.0, |x| x[state0 + e]))
                    .collect()
            } else {
                seg_init[slot * sz..(slot + 1) * sz].to_vec()
            };
            let mut dl = vec![0.0f32; dk];
            view(i, h).walk(&mut s, Some(&mut o), &mut dl);
            if seg.flags & SEG_LAST != 0 {
                final_state[state0..state0 + sz].copy_from_slice(&s);
            }
        }
    }
    Ok(Chunked { o, final_state })
}
