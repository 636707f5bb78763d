//! CPU model of the semi-CRF kernels' algorithm: the same steps, ring slots, checkpoint layouts
//! (ages), rebase schedule, segment ranges, per-position row shifts, lane partition of every
//! reduction and combination as `gpu-kernels/src/semicrf`, with the kernels' precision made
//! explicit ([`Numerics`]).
//!
//! With [`Numerics::EXACT`] everything is f64 and the model checks the algorithm and its
//! indexing against the reference without a GPU. [`Numerics::KERNEL`] rounds where the kernels
//! round (f64 scans; f32 workspace rows, exponentials and outputs in the combination, the
//! `ex2.approx` exponential modelled with its documented error bound). [`Numerics::F32_SCAN`]
//! is the same algorithm with the scans' state and log-sum-exps in f32 (`ex2.approx`,
//! `lg2.approx`), as in the first version of the kernels: the forward and reverse scans then
//! drift apart over long sequences and every marginal with them, which breaks the gradient's
//! identities (`sum_c dlogZ/dS[0, c] = -1` becomes `-exp(logZ_reverse - logZ_forward)`).

use kernel_abi::semicrf::{CHUNK, lanes_per_label};
use kernels::semicrf::reference::Model;

const NEG: f64 = f64::NEG_INFINITY;

/// How a kernel version rounds.
#[derive(Clone, Copy, Debug)]
pub struct Numerics {
    /// The scans' state (ring, P and Q rows), their log-sum-exps and the checkpoints are f32
    /// (`true`) or f64.
    pub state_f32: bool,
    /// The segment workspace rows, the combination's exponentials, its per-position sums and
    /// the outputs are rounded to f32 (`true`), or exact.
    pub outputs_f32: bool,
    /// Model of the error of the f32 exponential (`ex2.approx.ftz.f32`): a deterministic
    /// pseudo-random relative error uniform in `[-amp, amp]`, plus `bias` (relative). The
    /// hardware documents a maximum relative error of 2^-22; its distribution is not
    /// documented, so the tests use both an unbiased and a biased model.
    pub ex2_err: (f64, f64),
    /// The same for `lg2.approx.ftz.f32` (absolute error).
    pub lg2_err: (f64, f64),
}

impl Numerics {
    /// Everything exact (f64).
    pub const EXACT: Numerics = Numerics {
        state_f32: false,
        outputs_f32: false,
        ex2_err: (0.0, 0.0),
        lg2_err: (0.0, 0.0),
    };
    /// The kernels: f64 scans; f32 exponentials (modelled as `ex2.approx`) and outputs in the
    /// combination.
    pub const KERNEL: Numerics = Numerics {
        state_f32: false,
        outputs_f32: true,
        ex2_err: (EX2_MAX_REL, 0.0),
        lg2_err: (0.0, 0.0),
    };
    /// The first kernels: f32 scans (`ex2.approx`, `lg2.approx`), f32 combination.
    pub const F32_SCAN: Numerics = Numerics {
        state_f32: true,
        outputs_f32: true,
        ex2_err: (EX2_MAX_REL, 0.0),
        lg2_err: (LG2_MAX_ABS, 0.0),
    };

    /// The same with the approximation errors biased by `frac` of their maximum (a worst case
    /// for error accumulation: the hardware's error distribution is not documented).
    pub const fn biased(self, frac: f64) -> Numerics {
        Numerics {
            ex2_err: (self.ex2_err.0 * (1.0 - frac), self.ex2_err.0 * frac),
            lg2_err: (self.lg2_err.0 * (1.0 - frac), self.lg2_err.0 * frac),
            ..self
        }
    }

    /// Round a state value.
    fn s(&self, x: f64) -> f64 {
        if self.state_f32 { x as f32 as f64 } else { x }
    }

    /// Round an output value.
    fn o(&self, x: f64) -> f64 {
        if self.outputs_f32 { x as f32 as f64 } else { x }
    }

    /// `exp` of the scans' log-sum-exp.
    fn exp_state(&self, x: f64) -> f64 {
        if self.state_f32 {
            self.exp32(x)
        } else {
            x.exp()
        }
    }

    /// `ln` of the scans' log-sum-exp.
    fn ln_state(&self, x: f64) -> f64 {
        if self.state_f32 {
            // ln(x) = lg2.approx(x) * LN_2 (f32).
            let l = f32_of(x.log2() + pseudo(x, self.lg2_err));
            (l * core::f32::consts::LN_2) as f64
        } else {
            x.ln()
        }
    }

    /// `exp(x) = ex2.approx(x * LOG2_E)` in f32 (`arch::math::exp`), or exact.
    fn exp32(&self, x: f64) -> f64 {
        if !self.outputs_f32 && !self.state_f32 {
            return x.exp();
        }
        if x == NEG {
            return 0.0;
        }
        let y = (x as f32) * core::f32::consts::LOG2_E;
        let v = (y as f64).exp2();
        f32_of(v * (1.0 + pseudo(y as f64, self.ex2_err))) as f64
    }
}

/// The documented maximum relative error of `ex2.approx.ftz.f32`.
pub const EX2_MAX_REL: f64 = 2.384185791015625e-7; // 2^-22
/// The documented maximum absolute error of `lg2.approx.ftz.f32` (on [0.5, 2]).
pub const LG2_MAX_ABS: f64 = 1.5848931924611134e-7; // 2^-22.6

fn f32_of(x: f64) -> f32 {
    x as f32
}

/// A deterministic pseudo-random error `bias + amp * u(x)`, `u` uniform in [-1, 1] (a hash of
/// the argument's bits, so the same argument always gets the same error, as in hardware).
fn pseudo(x: f64, (amp, bias): (f64, f64)) -> f64 {
    if amp == 0.0 && bias == 0.0 {
        return 0.0;
    }
    let mut h = (x as f32).to_bits() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    let u = (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    bias + amp * u
}

/// One scan: ring [C][K] (slot = step % K), P and Q rows, normalizer.
struct Scan<'a> {
    m: &'a Model,
    n: Numerics,
    b: usize,
    len: usize,
    g: usize,
    reverse: bool,
    ring: Vec<f64>,
    prow: Vec<f64>,
    qrow: Vec<f64>,
    /// The maximum of the last step's P row (`-inf` at the reverse scan's step 0).
    pmax: f64,
    norm: f64,
    terms: Vec<f64>,
    part: Vec<f64>,
}

impl<'a> Scan<'a> {
    fn new(m: &'a Model, n: Numerics, b: usize, reverse: bool) -> Self {
        Scan {
            m,
            n,
            b,
            len: m.lengths[b],
            g: lanes_per_label(m.k as u32, m.c as u32) as usize,
            reverse,
            ring: vec![NEG; m.k * m.c],
            prow: vec![0.0; m.c],
            qrow: vec![NEG; m.c],
            pmax: NEG,
            norm: 0.0,
            terms: Vec::with_capacity(m.k.max(m.c)),
            part: Vec::with_capacity(32),
        }
    }

    fn pos(&self, r: usize) -> usize {
        if self.reverse { self.len - r } else { r }
    }

    fn table(&self, label: usize, cin: usize) -> f64 {
        let c = self.m.c;
        if self.reverse {
            self.m.trans[label * c + cin]
        } else {
            self.m.trans[cin * c + label]
        }
    }

    /// The kernels' `group_reduce` (log-sum-exp) of `self.terms`: term `i` belongs to lane
    /// `i % G`, lanes sum their exponentials in order, then a butterfly over the G lanes.
    fn group_lse(&mut self) -> f64 {
        let n = self.n;
        let m = self.terms.iter().copied().fold(NEG, f64::max);
        if m == NEG {
            return NEG;
        }
        self.part.clear();
        self.part.resize(self.g, 0.0);
        for (i, &x) in self.terms.iter().enumerate() {
            let l = i % self.g;
            self.part[l] = n.s(self.part[l] + n.exp_state(n.s(x - m)));
        }
        let mut off = self.g / 2;
        while off > 0 {
            for l in 0..self.g {
                if l & off == 0 {
                    let v = n.s(self.part[l] + self.part[l + off]);
                    self.part[l] = v;
                }
            }
            off /= 2;
        }
        n.s(m + n.ln_state(self.part[0]))
    }

    /// Step r (the kernels' `first_forward`, `first_reverse` or `step`).
    fn step(&mut self, r: usize) {
        let (k, c) = (self.m.k, self.m.c);
        let sgn = if self.reverse { -1.0 } else { 1.0 };
        let at = self.pos(r);
        let (m, b) = (self.m, self.b);
        let s = |l: usize| m.s(b, at, l);
        if r == 0 && self.reverse {
            for l in 0..c {
                self.ring[l * k] = s(l);
                self.qrow[l] = s(l);
            }
            self.pmax = NEG;
            return;
        }
        let mut prow = vec![0.0; c];
        if r > 0 {
            let base = r % k;
            for (l, p) in prow.iter_mut().enumerate() {
                self.terms.clear();
                for kk in 1..=k.min(r) {
                    let slot = (base + k - kk) % k;
                    let x = self.n.s(self.ring[l * k + slot] + m.dur[(kk - 1) * c + l]);
                    self.terms.push(x);
                }
                let a = self.group_lse();
                *p = if a == NEG {
                    NEG
                } else {
                    self.n.s(a + sgn * s(l))
                };
            }
        }
        self.pmax = prow.iter().copied().fold(NEG, f64::max);
        self.prow = prow;
        for l in 0..c {
            self.terms.clear();
            for ci in 0..c {
                let x = self.n.s(self.prow[ci] + self.table(l, ci));
                self.terms.push(x);
            }
            let bq = self.group_lse();
            let q = if bq == NEG {
                NEG
            } else {
                self.n.s(bq - sgn * s(l))
            };
            self.ring[l * k + r % k] = q;
            self.qrow[l] = q;
        }
    }

    fn rebase(&mut self) {
        let mut d = self.qrow.iter().copied().fold(NEG, f64::max);
        if d == NEG {
            d = 0.0;
        }
        let n = self.n;
        self.ring.iter_mut().for_each(|x| *x = n.s(*x - d));
        self.norm += d;
    }

    /// Ring rows by age at step r: [K][C].
    fn by_age(&self, r: usize) -> Vec<f64> {
        let (k, c) = (self.m.k, self.m.c);
        let mut out = vec![NEG; k * c];
        for l in 0..c {
            for slot in 0..k {
                let age = (r % k + k - slot) % k;
                out[age * c + l] = self.ring[l * k + slot];
            }
        }
        out
    }

    fn load_by_age(&mut self, r: usize, rows: &[f64]) {
        let (k, c) = (self.m.k, self.m.c);
        for l in 0..c {
            for slot in 0..k {
                let age = (r % k + k - slot) % k;
                self.ring[l * k + slot] = rows[age * c + l];
            }
            self.qrow[l] = rows[l];
        }
    }
}

/// Checkpoints of one direction: per segment index, (rows, normalizer).
pub type Ckpts = Vec<Option<(Vec<f64>, f64)>>;

/// `semicrf_scan` for sequence b: (log Z, checkpoints).
pub fn scan(m: &Model, n: Numerics, b: usize, reverse: bool, ckpt: usize) -> (f64, Ckpts) {
    let mut sc = Scan::new(m, n, b, reverse);
    let nseg = m.t / ckpt + 1;
    let mut ck: Ckpts = vec![None; nseg];
    let len = sc.len;
    for r in 0..=len {
        sc.step(r);
        let at = sc.pos(r);
        if at.is_multiple_of(ckpt) && (!reverse || at >= ckpt) {
            let mut rows = sc.by_age(r);
            if !reverse {
                rows.extend_from_slice(&sc.prow);
            }
            let j = if reverse { at / ckpt - 1 } else { at / ckpt };
            ck[j] = Some((rows, sc.norm));
        }
        if r == len {
            break;
        }
        if (r + 1).is_multiple_of(CHUNK as usize) {
            sc.rebase();
        }
    }
    // Warp 0's log-sum-exp over the labels (32 lanes), then the normalizer in f64.
    sc.g = 32;
    sc.terms.clear();
    for l in 0..m.c {
        let x = if reverse {
            n.s(sc.qrow[l] - m.s(b, 0, l))
        } else {
            sc.prow[l]
        };
        sc.terms.push(x);
    }
    let lse = sc.group_lse();
    (sc.norm + lse, ck)
}

/// What `semicrf_marginals` writes for segment j of sequence b: grad rows, marginal rows
/// (positions s0..), duration and transition counts.
pub struct SegmentOut {
    pub grad: Vec<(usize, usize, f64)>,
    pub mu: Vec<(usize, usize, usize, f64)>,
    pub dur: Vec<f64>,
    pub trans: Vec<f64>,
}

/// The normalizer shift of a row whose maximum is `m` (the kernel's `shift`).
fn shift(m: f64) -> f64 {
    if m == NEG { 0.0 } else { m }
}

/// `semicrf_marginals` for segment j of sequence b (`keep_mu`: also list the marginals).
#[allow(clippy::too_many_arguments)]
pub fn segment(
    m: &Model,
    n: Numerics,
    b: usize,
    j: usize,
    ckpt: usize,
    log_z: f64,
    a: &Ckpts,
    be: &Ckpts,
    keep_mu: bool,
) -> SegmentOut {
    let (k, c, len) = (m.k, m.c, m.lengths[b]);
    let g = lanes_per_label(k as u32, c as u32) as usize;
    let s0 = j * ckpt;
    let mut out = SegmentOut {
        grad: vec![],
        mu: vec![],
        dur: vec![0.0; k * c],
        trans: vec![0.0; c * c],
    };
    if s0 > len {
        return out;
    }
    let s1 = (s0 + ckpt).min(len + 1);
    let cnt = s1 - s0;
    let (st, o) = (|x| n.s(x), |x| n.o(x));
    let sv = |pos: usize, l: usize| m.s(b, pos, l);
    // Workspace rows (f32 in the kernel), each relative to its position's normalizer.
    let (mut arow, mut urow, mut na) = (
        vec![vec![0.0; c]; cnt],
        vec![vec![0.0; c]; cnt],
        vec![0.0; cnt],
    );
    let mut brow = vec![vec![NEG; c]; cnt + k];
    let mut nb = vec![0.0; cnt + k];
    // Alpha sweep from checkpoint j (rows by age, then alpha).
    let (rows, norm) = a[j].clone().expect("forward checkpoint written");
    let mut sc = Scan::new(m, n, b, false);
    sc.load_by_age(s0, &rows[..k * c]);
    sc.norm = norm;
    let sh = shift(rows[k * c..].iter().copied().fold(NEG, f64::max));
    for l in 0..c {
        arow[0][l] = o(st(rows[k * c + l] - sh));
        urow[0][l] = o(st(st(rows[l] + sv(s0, l)) - sh));
    }
    na[0] = norm + sh;
    if (s0 + 1).is_multiple_of(CHUNK as usize) && s0 + 1 < s1 {
        sc.rebase();
    }
    for r in s0 + 1..s1 {
        sc.step(r);
        let (i, sh) = (r - s0, shift(sc.pmax));
        for l in 0..c {
            arow[i][l] = o(st(sc.prow[l] - sh));
            urow[i][l] = o(st(st(sc.qrow[l] + sv(r, l)) - sh));
        }
        na[i] = sc.norm + sh;
        if (r + 1).is_multiple_of(CHUNK as usize) && r + 1 < s1 {
            sc.rebase();
        }
    }
    // Beta sweep from checkpoint j at s1, or from L.
    let mut sc = Scan::new(m, n, b, true);
    if s1 <= len {
        let (rows, norm) = be[j].clone().expect("reverse checkpoint written");
        let r1 = len - s1;
        sc.load_by_age(r1, &rows);
        sc.norm = norm;
        for i in 0..k {
            nb[cnt + i] = norm;
            if s1 + i <= len {
                let beta: Vec<f64> = (0..c)
                    .map(|l| st(rows[i * c + l] - sv(s1 + i, l)))
                    .collect();
                let sh = shift(beta.iter().copied().fold(NEG, f64::max));
                for l in 0..c {
                    brow[cnt + i][l] = o(st(beta[l] - sh));
                }
                nb[cnt + i] = norm + sh;
            }
        }
        if (r1 + 1).is_multiple_of(CHUNK as usize) {
            sc.rebase();
        }
    }
    for pos in (s0..s1).rev() {
        let r = len - pos;
        sc.step(r);
        let (i, sh) = (pos - s0, shift(sc.pmax));
        for l in 0..c {
            brow[i][l] = o(st(st(sc.qrow[l] - sv(pos, l)) - sh));
        }
        nb[i] = sc.norm + sh;
        if (r + 1).is_multiple_of(CHUNK as usize) && pos > s0 {
            sc.rebase();
        }
    }
    // Combine: exponents in f64 from the rows, the scores and the normalizers; one f32
    // exponential per term; f32 sums and outputs.
    let mut lane = vec![0.0; g];
    for pos in s0..s1 {
        let i = pos - s0;
        let sa = na[i] - log_z;
        let kmax = k.min(len - pos);
        for l in 0..c {
            let (u_c, a_c, s_c) = (urow[i][l], arow[i][l], sv(pos, l));
            lane.iter_mut().for_each(|x| *x = 0.0);
            for kk in 1..=k {
                let mu = if kk <= kmax {
                    let x = (((u_c + brow[i + kk][l]) + (sv(pos + kk, l) - s_c))
                        + m.dur[(kk - 1) * c + l])
                        + (sa + nb[i + kk]);
                    let mu = n.exp32(x);
                    out.dur[(kk - 1) * c + l] += mu;
                    mu
                } else {
                    0.0
                };
                lane[(kk - 1) % g] = o(lane[(kk - 1) % g] + mu);
                if keep_mu {
                    out.mu.push((pos, kk, l, mu));
                }
            }
            let mut off = g / 2;
            while off > 0 {
                for x in 0..g {
                    if x & off == 0 {
                        lane[x] = o(lane[x] + lane[x + off]);
                    }
                }
                off /= 2;
            }
            let start = lane[0];
            let end = if pos == 0 {
                0.0
            } else {
                n.exp32((a_c + brow[i][l]) + (sa + nb[i]))
            };
            out.grad.push((pos, l, o(end - start)));
            if start > 0.0 {
                for ci in 0..c {
                    let x = arow[i][ci] + m.trans[ci * c + l];
                    out.trans[ci * c + l] += o(n.exp32(x - u_c) * start);
                }
            }
        }
    }
    out
}

/// Everything a forward+backward of the kernels produces, from the model.
pub struct Run {
    /// `[B]` forward and reverse log Z.
    pub log_z: Vec<(f64, f64)>,
    /// `[B, T + 1, C]`.
    pub grad_cumsum: Vec<f64>,
    /// `[K, C]`.
    pub grad_dur: Vec<f64>,
    /// `[C, C]`.
    pub grad_trans: Vec<f64>,
}

/// The model's forward+backward of every sequence with checkpoint interval `ckpt`.
pub fn run(m: &Model, n: Numerics, ckpt: usize) -> Run {
    let (t, k, c) = (m.t, m.k, m.c);
    let mut out = Run {
        log_z: vec![],
        grad_cumsum: vec![0.0; m.batch * (t + 1) * c],
        grad_dur: vec![0.0; k * c],
        grad_trans: vec![0.0; c * c],
    };
    for b in 0..m.batch {
        let (z, a) = scan(m, n, b, false, ckpt);
        let (zr, be) = scan(m, n, b, true, ckpt);
        out.log_z.push((z, zr));
        for j in 0..t / ckpt + 1 {
            let o = segment(m, n, b, j, ckpt, z, &a, &be, false);
            for (pos, l, g) in o.grad {
                out.grad_cumsum[(b * (t + 1) + pos) * c + l] = g;
            }
            out.grad_dur
                .iter_mut()
                .zip(&o.dur)
                .for_each(|(x, y)| *x += y);
            out.grad_trans
                .iter_mut()
                .zip(&o.trans)
                .for_each(|(x, y)| *x += y);
        }
    }
    out
}

/// The identities of the gradient (as `kbench semicrf` checks them): the largest of
/// `|sum_c dlogZ/dS[t, c] - (-1 at 0, +1 at L, 0 between)|` and the relative difference of the
/// duration and transition counts.
pub fn identity_error(m: &Model, r: &Run) -> (f64, f64) {
    let (t, c) = (m.t, m.c);
    let mut worst = 0.0f64;
    for b in 0..m.batch {
        let len = m.lengths[b];
        for ti in 0..=t {
            let sum: f64 = (0..c)
                .map(|l| r.grad_cumsum[(b * (t + 1) + ti) * c + l])
                .sum();
            let want = if ti == 0 {
                -1.0
            } else if ti == len {
                1.0
            } else {
                0.0
            };
            worst = worst.max((sum - want).abs());
        }
    }
    let nd: f64 = r.grad_dur.iter().sum();
    let nt: f64 = r.grad_trans.iter().sum();
    (worst, (nd - nt).abs() / nd.max(1.0))
}
