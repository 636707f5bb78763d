//! Semi-Markov CRF kernels: forward and reverse scans, Viterbi, segment marginals, reduction.
//!
//! # The recurrence, factored
//! With cumulative scores `S`, duration scores `dur [K, C]` and transitions `trans [C, C]`,
//! `alpha[t, c] = lse_{k, c'} alpha[t - k, c'] + trans[c', c] + S[t, c] - S[t - k, c]
//! + dur[k - 1, c]` (with `alpha[0, .] = 0`) factors into two O(K C + C^2) halves per position:
//! - `v[s, c] = lse_{c'} (alpha[s, c'] + trans[c', c]) - S[s, c]` (the transition into a
//!   segment that starts at `s`),
//! - `alpha[t, c] = S[t, c] + lse_{k <= min(K, t)} (v[t - k, c] + dur[k - 1, c])`.
//!
//! The reverse recurrence has the same shape with the transition applied on the other side:
//! `w[t, c] = S[t, c] + beta[t, c]`, `g[s, c] = lse_{k <= min(K, L - s)} (w[s + k, c] +
//! dur[k - 1, c]) - S[s, c]`, `beta[s, c'] = lse_c (trans[c', c] + g[s, c])`, `beta[L, .] = 0`.
//! Both are "scans" over steps `r = 0..=L` (position `r` forward, `L - r` in reverse): a
//! *P* row (alpha, or g) from the ring of the last K *Q* rows (v, or w), then the next Q row
//! from the P row through the C x C transition table. [`Sweep`] implements one step for both.
//!
//! # Numerics
//! The scans' state (ring, P and Q rows) and their log-sum-exps are f64, natural-log units,
//! log-sum-exp as `m + ln(sum exp(x - m))` with `m` the exact maximum (a group of all `-inf`
//! gives `-inf`, never `-inf - -inf`), with the accurate f64 `exp` and `ln` of
//! [`crate::arch::math64`]. Why f64: a scan is a chain of up to ~1e5 dependent steps, and the
//! backward combines the forward scan with the reverse one through `alpha + beta - log Z`;
//! every step's rounding stays in both, so in f32 (with `ex2.approx`/`lg2.approx`) the two
//! directions drift apart (the reverse scan's log Z differs from the forward one by ~1e-2 at
//! T = 1e5), and every marginal is off by that factor. In f64 the drift is ~1e-9.
//!
//! alpha and beta grow linearly with the position (to ~1e5 at T = 1e5), so every `CHUNK` steps
//! a scan subtracts the maximum `d` of its newest Q row from the whole ring and adds `d` to an
//! f64 normalizer `N` that every thread tracks identically ("rebase"): stored values are the
//! true values minus `N`, and consumers add normalizers back.
//!
//! Inputs (`S`, `dur`, `trans`) are f32 and enter the f64 sums exactly.

pub(crate) mod marginals;
mod reduce;
mod scan;
mod viterbi;

use crate::arch::math64::{exp, ln};
use crate::arch::smem::SmemArray;
use crate::arch::{index, sync, warp};
use core::cmp::min;
use kernel_abi::semicrf::THREADS;

pub(crate) const NEG_INF: f64 = f64::NEG_INFINITY;

/// Maximum over the `g` lanes of this lane's aligned group (butterfly; the result is in every
/// lane of the group).
///
/// # Safety
/// All 32 lanes of the warp execute the call with the same `g` (a power of two dividing 32).
#[inline(always)]
unsafe fn group_max(mut v: f64, g: u32) -> f64 {
    let mut off = g / 2;
    while off > 0 {
        // SAFETY: forwarded to the caller (full warp).
        v = v.max(unsafe { warp::shfl_xor_f64(warp::FULL_MASK, v, off) });
        off /= 2;
    }
    v
}

/// Sum over the group (butterfly).
///
/// # Safety
/// As for [`group_max`].
#[inline(always)]
unsafe fn group_sum(mut v: f64, g: u32) -> f64 {
    let mut off = g / 2;
    while off > 0 {
        // SAFETY: forwarded to the caller (full warp).
        v += unsafe { warp::shfl_xor_f64(warp::FULL_MASK, v, off) };
        off /= 2;
    }
    v
}

/// Sum of an f32 over the group (butterfly).
///
/// # Safety
/// As for [`group_max`].
#[inline(always)]
pub(crate) unsafe fn group_sum_f32(mut v: f32, g: u32) -> f32 {
    let mut off = g / 2;
    while off > 0 {
        // SAFETY: forwarded to the caller (full warp).
        v += unsafe { warp::shfl_xor_f32(warp::FULL_MASK, v, off) };
        off /= 2;
    }
    v
}

/// Maximum with its index over the group; ties go to the smaller index, so the result is the
/// first maximum in index order whatever the lane layout.
///
/// # Safety
/// As for [`group_max`].
#[inline(always)]
unsafe fn group_argmax(mut v: f64, mut i: u32, g: u32) -> (f64, u32) {
    let mut off = g / 2;
    while off > 0 {
        // SAFETY: forwarded to the caller (full warp).
        let (ov, oi) = unsafe {
            (
                warp::shfl_xor_f64(warp::FULL_MASK, v, off),
                warp::shfl_xor_u32(warp::FULL_MASK, i, off),
            )
        };
        if ov > v || (ov == v && oi < i) {
            v = ov;
            i = oi;
        }
        off /= 2;
    }
    (v, i)
}

/// Reduce the terms `term(i)` for `i = sub, sub + g, ... < end` held by the `g` lanes of a
/// group: log-sum-exp (`MAX = false`) or maximum with the first index attaining it
/// (`MAX = true`). The result is in every lane of the group; an empty or all `-inf` group
/// gives `-inf`.
///
/// # Safety
/// As for [`group_max`]; `term(i)` is safe to call for every `i < end` of this lane.
#[inline(always)]
unsafe fn group_reduce<const MAX: bool>(
    sub: u32,
    g: u32,
    end: u32,
    term: impl Fn(u32) -> f64,
) -> (f64, u32) {
    let mut m = NEG_INF;
    let mut arg = u32::MAX;
    let mut i = sub;
    while i < end {
        let x = term(i);
        if x > m {
            m = x;
            arg = i;
        }
        i += g;
    }
    if MAX {
        // SAFETY: forwarded to the caller (full warp, uniform g).
        return unsafe { group_argmax(m, arg, g) };
    }
    // SAFETY: forwarded to the caller.
    let gm = unsafe { group_max(m, g) };
    let mut s = 0.0f64;
    if gm != NEG_INF {
        let mut i = sub;
        while i < end {
            s += exp(term(i) - gm);
            i += g;
        }
    }
    // SAFETY: forwarded to the caller (every lane reaches this after the divergent loop).
    let s = unsafe { group_sum(s, g) };
    (if gm == NEG_INF { NEG_INF } else { gm + ln(s) }, 0)
}

/// The result of one scan step, in every lane of the label's group.
#[derive(Clone, Copy)]
pub(crate) struct Step {
    /// The P row's value for this label (alpha, or g in reverse).
    pub p: f64,
    /// The Q row's value (v, or w in reverse), also stored into the ring.
    pub q: f64,
    /// With `PMAX`: the maximum of the P row over the labels (the same in every thread of
    /// the block; `-inf` if all are, or at a step without a P row); otherwise `-inf`.
    pub pmax: f64,
    /// Max semiring: the duration attaining P (0 at step 0).
    pub arg_k: u32,
    /// Max semiring: the previous label attaining Q.
    pub arg_c: u32,
}

/// One block's view of a scan: geometry, thread mapping, and its shared-memory tables.
///
/// Thread `tid` works for label `tid / g` (`valid` if below C) on the terms `tid % g`,
/// `tid % g + g`, ... of each reduction; the group's lane with `sub == 0` is its *leader* and
/// does the group's shared-memory stores.
#[derive(Clone, Copy)]
pub(crate) struct Sweep {
    pub k: u32,
    pub c: u32,
    pub g: u32,
    pub tid: u32,
    pub label: u32,
    pub sub: u32,
    pub valid: bool,
    /// `[C][K]`: `dur[label][k - 1]`.
    pub dur: SmemArray<f32>,
    /// `[C][C]`: `m[label][c_in]`.
    pub trans: SmemArray<f32>,
    /// `[C][K]`: `ring[label][step % K]`.
    pub ring: SmemArray<f64>,
    /// `[C]`: the current P row.
    pub prow: SmemArray<f64>,
    /// `[C]`: the newest Q row.
    pub qrow: SmemArray<f64>,
}

impl Sweep {
    /// The view for this thread; `g = lanes_per_label(k, c)`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        k: u32,
        c: u32,
        g: u32,
        dur: u32,
        trans: u32,
        ring: u32,
        prow: u32,
        qrow: u32,
    ) -> Self {
        let tid = index::thread_idx_x();
        let label = tid / g;
        Sweep {
            k,
            c,
            g,
            tid,
            label,
            sub: tid % g,
            valid: label < c,
            dur: SmemArray::new(dur, k * c),
            trans: SmemArray::new(trans, c * c),
            ring: SmemArray::new(ring, k * c),
            prow: SmemArray::new(prow, c),
            qrow: SmemArray::new(qrow, c),
        }
    }

    /// Whether this thread is its group's leader for a real label.
    #[inline(always)]
    pub fn leader(&self) -> bool {
        self.valid && self.sub == 0
    }

    /// Copy `dur [K, C]` (global) into `[C][K]`. Each thread writes its own elements; a barrier
    /// must follow before anyone reads them.
    ///
    /// # Safety
    /// `dur` holds `K C` f32.
    #[inline(always)]
    pub unsafe fn load_dur(&self, dur: *const f32) {
        let mut e = self.tid;
        while e < self.k * self.c {
            let (kk, cc) = (e / self.c, e % self.c);
            // SAFETY: e < K C (caller's contract); the smem index cc K + kk < K C.
            unsafe { self.dur.store(cc * self.k + kk, *dur.add(e as usize)) };
            e += THREADS;
        }
    }

    /// Copy `trans [C (from), C (to)]` into `m[label][c_in]`: forward `m[to][from]`, reverse
    /// `m[from][to]`. Each thread writes its own elements; a barrier must follow.
    ///
    /// # Safety
    /// `trans` holds `C C` f32; no thread reads the table until the next barrier.
    #[inline(always)]
    pub unsafe fn load_trans(&self, trans: *const f32, reverse: bool) {
        let mut e = self.tid;
        while e < self.c * self.c {
            let (from, to) = (e / self.c, e % self.c);
            let dst = if reverse { e } else { to * self.c + from };
            // SAFETY: e < C C (caller's contract); dst < C C.
            unsafe { self.trans.store(dst, *trans.add(e as usize)) };
            e += THREADS;
        }
    }

    /// Set every ring entry to `-inf` (the thread's own entries; a barrier must follow).
    ///
    /// # Safety
    /// No other thread accesses the ring until the next barrier.
    #[inline(always)]
    pub unsafe fn clear_ring(&self) {
        let mut e = self.tid;
        while e < self.k * self.c {
            // SAFETY: e < K C.
            unsafe { self.ring.store(e, NEG_INF) };
            e += THREADS;
        }
    }

    /// The ring entries this thread owns for copies and rebases: `e = tid, tid + THREADS, ...`
    /// over `[C][K]`, as `(e, label, age)` where `age` is how many steps before step `r` the
    /// entry was written (slot `(r - age) mod K`).
    #[inline(always)]
    pub fn for_owned_ring(&self, r: u32, mut f: impl FnMut(u32, u32, u32)) {
        let base = r % self.k;
        let mut e = self.tid;
        while e < self.k * self.c {
            let (cc, slot) = (e / self.k, e % self.k);
            let age = if base >= slot {
                base - slot
            } else {
                base + self.k - slot
            };
            f(e, cc, age);
            e += THREADS;
        }
    }

    /// Phase A of step `r >= 1`: the reduction over durations `k <= min(K, r)` of
    /// `ring(r - k) + dur[k - 1]` for this thread's label.
    ///
    /// # Safety
    /// All threads of the block call it uniformly; the ring rows of steps `r - min(K, r)..r` were
    /// published by a barrier.
    #[inline(always)]
    unsafe fn durations<const MAX: bool>(&self, r: u32) -> (f64, u32) {
        let (k, label) = (self.k, self.label);
        let kmax = if self.valid { min(k, r) } else { 0 };
        let base = r % k;
        let term = |i: u32| {
            let kk = i + 1;
            let slot = if base >= kk { base - kk } else { base + k - kk };
            // SAFETY: label < C and slot, i < K: both indices are inside [C][K].
            unsafe { self.ring.load(label * k + slot) + self.dur.load(label * k + i) as f64 }
        };
        // SAFETY: forwarded to the caller (uniform call by the whole block).
        let (v, i) = unsafe { group_reduce::<MAX>(self.sub, self.g, kmax, term) };
        (v, i.wrapping_add(1))
    }

    /// Phase B: the reduction over previous labels `c_in` of `prow[c_in] + m[label][c_in]`.
    ///
    /// # Safety
    /// All threads call it uniformly; the P row was published by a barrier.
    #[inline(always)]
    unsafe fn labels<const MAX: bool>(&self) -> (f64, u32) {
        let (c, label) = (self.c, self.label);
        let end = if self.valid { c } else { 0 };
        // SAFETY: label < C and i < C.
        let term = |i: u32| unsafe { self.prow.load(i) + self.trans.load(label * c + i) as f64 };
        // SAFETY: forwarded to the caller.
        unsafe { group_reduce::<MAX>(self.sub, self.g, end, term) }
    }

    /// The maximum of the published P row over the labels, in every thread: each lane of a
    /// group reads the labels `sub, sub + G, ...`, then a butterfly over the group (every group
    /// covers all labels, so every thread gets the same value).
    ///
    /// # Safety
    /// All threads call it uniformly, between the barrier that published the P row and the
    /// next one.
    #[inline(always)]
    unsafe fn prow_max(&self) -> f64 {
        let mut m = NEG_INF;
        let mut i = self.sub;
        while i < self.c {
            // SAFETY: i < C.
            m = m.max(unsafe { self.prow.load(i) });
            i += self.g;
        }
        // SAFETY: forwarded to the caller (uniform call, full warps).
        unsafe { group_max(m, self.g) }
    }

    /// Phase B and the ring update of step `r`, given this label's P value; `sgn` is +1 forward
    /// (Q = B - S) and -1 in reverse (Q = B + S); with `PMAX` also the maximum of the P row.
    /// Ends with a barrier.
    ///
    /// # Safety
    /// All threads call it uniformly, after the P row was stored and published by a barrier.
    #[inline(always)]
    unsafe fn finish<const MAX: bool, const PMAX: bool>(
        &self,
        r: u32,
        p: f64,
        arg_k: u32,
        s: f64,
        sgn: f64,
    ) -> Step {
        let pmax = if PMAX {
            // SAFETY: forwarded to the caller (uniform: PMAX is a constant); P was published
            // and is not written before the barrier that ends this step.
            unsafe { self.prow_max() }
        } else {
            NEG_INF
        };
        // SAFETY: forwarded to the caller.
        let (b, arg_c) = unsafe { self.labels::<MAX>() };
        let q = if b == NEG_INF { NEG_INF } else { b - sgn * s };
        if self.leader() {
            // SAFETY: label < C, r % K < K. Phase A of this step read the slot being overwritten
            // (as age K) before the barrier that preceded this call; qrow's readers (rebase) ran
            // before that barrier too.
            unsafe {
                self.ring.store(self.label * self.k + r % self.k, q);
                self.qrow.store(self.label, q);
            }
        }
        // SAFETY: uniform: every thread of the block reaches this barrier once per step.
        unsafe { sync::sync_threads() };
        Step {
            p,
            q,
            pmax,
            arg_k,
            arg_c,
        }
    }

    /// A regular step `r >= 1` with this label's cumulative score `s` at the step's position:
    /// phase A, store P, barrier, phase B (and with `PMAX` the P row's maximum), store Q,
    /// barrier.
    ///
    /// # Safety
    /// All threads call it uniformly; the ring holds steps `r - K..r` (published); no thread
    /// still reads the P row of the previous step.
    #[inline(always)]
    pub unsafe fn step<const MAX: bool, const PMAX: bool>(&self, r: u32, s: f64, sgn: f64) -> Step {
        // SAFETY: forwarded to the caller.
        let (a, arg_k) = unsafe { self.durations::<MAX>(r) };
        let p = if a == NEG_INF { NEG_INF } else { a + sgn * s };
        if self.leader() {
            // SAFETY: label < C; the previous readers of prow finished before the last barrier.
            unsafe { self.prow.store(self.label, p) };
        }
        // SAFETY: uniform barrier; publishes the P row.
        unsafe { sync::sync_threads() };
        // SAFETY: forwarded to the caller; P published.
        unsafe { self.finish::<MAX, PMAX>(r, p, arg_k, s, sgn) }
    }

    /// Step 0 of the forward scan: alpha[0, .] = 0, then phase B (two barriers).
    ///
    /// # Safety
    /// As for [`Sweep::step`].
    #[inline(always)]
    pub unsafe fn first_forward<const MAX: bool>(&self, s: f64) -> Step {
        if self.leader() {
            // SAFETY: label < C.
            unsafe { self.prow.store(self.label, 0.0) };
        }
        // SAFETY: uniform barrier; publishes the P row.
        unsafe { sync::sync_threads() };
        // SAFETY: forwarded to the caller.
        unsafe { self.finish::<MAX, false>(0, 0.0, 0, s, 1.0) }
    }

    /// Step 0 of the reverse scan (position L): beta[L, .] = 0, so Q = S[L] (one barrier).
    ///
    /// # Safety
    /// As for [`Sweep::step`].
    #[inline(always)]
    pub unsafe fn first_reverse(&self, s: f64) -> Step {
        if self.leader() {
            // SAFETY: label < C, slot 0 < K.
            unsafe {
                self.ring.store(self.label * self.k, s);
                self.qrow.store(self.label, s);
            }
        }
        // SAFETY: uniform barrier; publishes the ring row.
        unsafe { sync::sync_threads() };
        Step {
            p: NEG_INF,
            q: s,
            pmax: NEG_INF,
            arg_k: 0,
            arg_c: 0,
        }
    }

    /// Rebase after step `r`: `d = max_c qrow[c]` (0 if all `-inf`), subtracted from the
    /// thread's own ring entries. Returns `d` (the same in every thread). A barrier must follow
    /// before the ring is read again; the caller adds `d` to its normalizer.
    ///
    /// # Safety
    /// The newest Q row was published by a barrier and is not written before the next one; no
    /// other thread accesses this thread's ring entries until the next barrier.
    #[inline(always)]
    pub unsafe fn rebase(&self, r: u32) -> f64 {
        let mut d = NEG_INF;
        for i in 0..self.c {
            // SAFETY: i < C.
            d = d.max(unsafe { self.qrow.load(i) });
        }
        if d == NEG_INF {
            d = 0.0;
        }
        self.for_owned_ring(r, |e, _, _| {
            // SAFETY: e < K C, owned by this thread (see `for_owned_ring`).
            unsafe { self.ring.store(e, self.ring.load(e) - d) };
        });
        d
    }

    /// `lse_c (row(c))` (or the maximum with its first index) over the labels, computed by
    /// warp 0 and valid in lane 0 of warp 0 (other threads get unspecified values).
    ///
    /// # Safety
    /// All 32 lanes of warp 0 call it (other warps may too); `row(c)` is safe for `c < C`.
    #[inline(always)]
    pub unsafe fn lse_labels<const MAX: bool>(&self, row: impl Fn(u32) -> f64) -> (f64, u32) {
        let lane = index::lane_id();
        let end = if index::warp_id() == 0 { self.c } else { 0 };
        // SAFETY: forwarded to the caller (the whole warp calls, g = 32).
        unsafe { group_reduce::<MAX>(lane, 32, end, row) }
    }
}
