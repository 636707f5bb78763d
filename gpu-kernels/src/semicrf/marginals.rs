//! `semicrf_marginals`: segment marginals, the gradient with respect to the cumulative scores,
//! and partial expected counts, one checkpoint segment per block.
//!
//! # Parameters
//! [`MarginalParams`]: the inputs of the scans, the forward log Z (f64), the alpha and beta
//! checkpoints, and the outputs `grad_cumsum [B, T + 1, C]`, optional `marginals [B, T, K, C]`
//! (`mu[b, t, k - 1, c]`: probability of a segment `[t, t + k)` with label `c`), and
//! `partials [B, nseg, K C + C C]` (f64 expected counts of durations and transitions).
//!
//! # Tiling
//! Block `(j, b)` owns segment `j` of sequence `b`: positions `s0 = j S .. s0 + S` of the
//! outputs (rows of `grad_cumsum` up to `T`, rows of `marginals` up to `T - 1`) and slice
//! `(b, j)` of `partials`. Its workspace (the recomputed alpha, u and beta rows of its
//! positions, their normalizers, its S rows, its ring and its count accumulators) is its own
//! dynamic shared memory: no two segments share a workspace, so no race between segments can
//! occur, and no buffer is ever reset for reuse. Its inputs are read-only: the alpha
//! checkpoint `j` (written by the forward scan at position `s0`) and, when `s1 = s0 + S <= L`,
//! the beta checkpoint `j` (written by the reverse scan at `s1`); when `s1 > L` the reverse
//! sweep starts at `L` from `beta[L, .] = 0` instead. Segments with `s0 > L` only write zeros.
//!
//! # Numerics
//! The sweeps are the scans' f64 steps (so they reproduce the scans' values bitwise). The rows
//! kept for the combination are f32, each position's relative to its own f64 normalizer
//! `norm = N + shift`: `N` the sweep's normalizer, `shift` the maximum over the labels of the
//! step's P row (alpha forward, g in reverse; every thread gets it in phase B, see
//! [`super::Sweep`]), so that the stored `alpha - norm_a`, `u - norm_a` and `beta - norm_b`
//! are within a few units of 0 whatever the position and the scores (`u` and `beta` are
//! log-sum-exps of the P row through the transitions), and their rounding is ~1e-7. The
//! combination forms each exponent in f64 from these rows, the exact f32 scores (the segment's
//! own score as `S[t + k] - S[t]`) and the normalizers (`norm_a + norm_b - log Z`, where the
//! large magnitudes cancel), then takes one f32 exponential:
//! - `mu[t, k, c] = exp(u[t, c] + beta[t + k, c] + S[t + k, c] - S[t, c] + dur[k - 1, c]
//!   - log Z)`;
//! - the probability that a segment with label `c` ends at `t` is
//!   `exp(alpha[t, c] + beta[t, c] - log Z)`;
//! - the expected `c' -> c` transitions at `t` are `exp(alpha[t, c'] + trans[c', c] - u[t, c])`
//!   times the probability that a segment with label `c` starts at `t`.
//!
//! # Thread mapping
//! As in `semicrf_scan` ([`super::Sweep`]): thread `tid` works for label `tid / G` on
//! durations `k ≡ tid + 1` and previous labels `c_in ≡ tid (mod G)`. The count accumulator of
//! `(label, k)` and of `(label, c_in)` is owned by that one thread.
//!
//! # Barrier protocol (`bar.sync 0`, uniform)
//! 1. Setup: every thread stores its share of the tables, the S rows, zeros for the
//!    accumulators, and (from the alpha checkpoint) its own ring entries; leaders store
//!    `qrow`; thread 0 stores the alpha and u rows of `s0` and their normalizer; barrier C0
//!    publishes them (every thread's first step reads the checkpoint rows that other threads
//!    stored). If the checkpoint's step ends a chunk, the scan rebased there: the same
//!    rebase follows, then a barrier.
//! 2. Alpha sweep, positions `s0 + 1 .. s1`: steps with barriers B1/B2 as in the scan; after
//!    B2 the leaders store the step's alpha and u into the workspace row (written once, read
//!    only in step 5), thread 0 the normalizer; rebases with B3 at chunk ends.
//! 3. Beta setup: the transition table is reloaded in reverse orientation and the ring from the
//!    beta checkpoint (or cleared), after the alpha sweep's last B2 (the last reads of both);
//!    thread `i` stores the beta row of position `s1 + i` (from the checkpoint, or `-inf`) and
//!    its normalizer, reading the checkpoint and S from global memory; barrier C1 publishes
//!    them (and the alpha sweep's last workspace rows).
//! 4. Beta sweep, positions `s1 - 1` down to `s0`: as in 2, storing beta rows.
//! 5. Barrier C2 publishes the last rows; then every thread combines positions independently
//!    (reads of the workspace only, writes to its owned accumulators and to global outputs).
//!    Each thread writes its own accumulators to `partials` (no barrier: the owner wrote them).

use super::{NEG_INF, Sweep, group_sum_f32};
use crate::arch::math::exp;
use crate::arch::{index, smem, sync};
use core::cmp::min;
use kernel_abi::semicrf::{CHUNK, MarginalParams, THREADS, partial_len, segment_layout};
use smem::SmemArray;

/// The normalizer shift of a row whose maximum is `m` (0 when the row is all `-inf`).
#[inline(always)]
fn shift(m: f64) -> f64 {
    if m == NEG_INF { 0.0 } else { m }
}

/// See the module documentation.
///
/// # Safety
/// Launched as documented on [`MarginalParams`] (grid `(nseg, B)`, `THREADS` threads,
/// `segment_layout(ckpt, k, c).bytes` of shared memory) after `semicrf_scan` ran both
/// directions on the same inputs, checkpoint interval and normalizer buffers.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn semicrf_marginals(p: MarginalParams) {
    crate::launch_bounds!(semicrf_marginals in kernel_abi::semicrf::KERNELS);
    // SAFETY: forwarded to the caller.
    unsafe { marginals::<false>(p) }
}

/// The body of `semicrf_marginals`. `ALIAS_SEGMENTS = true` is the negative control
/// `negative_semicrf_marginals_aliased` (`crate::negative`), never launched by the library:
/// segments `2i` and `2i + 1` of a sequence share the `partials` slice of segment `2i` (a
/// workspace shared between segments), so one segment's counts overwrite the other's and the slice of
/// segment `2i + 1` is never written.
///
/// # Safety
/// As for `semicrf_marginals`.
#[inline(always)]
pub(crate) unsafe fn marginals<const ALIAS_SEGMENTS: bool>(p: MarginalParams) {
    let j = index::block_idx_x();
    let b = index::block_idx_y();
    let (k, c, ckpt) = (p.k, p.c, p.ckpt);
    let (kz, cz) = (k as usize, c as usize);
    let tz = p.t_max as usize;
    // SAFETY: b < B (grid).
    let len = unsafe { *p.lengths.add(b as usize) };
    let s0 = j * ckpt;
    let end_rows = min(s0 + ckpt, p.t_max + 1);
    let tid = index::thread_idx_x();

    // Zeros for the positions past the sequence (rows of grad up to T, of marginals up to T-1).
    let zero_rows = |from: u32| {
        let mut e = tid;
        while from + e / c < end_rows {
            let row = (from + e / c) as usize;
            // SAFETY: row <= T, e % c < C.
            unsafe {
                *p.grad_cumsum
                    .add((b as usize * (tz + 1) + row) * cz + (e % c) as usize) = 0.0
            };
            e += THREADS;
        }
        if !p.marginals.is_null() {
            let per_row = k * c;
            let mut e = tid;
            while from + e / per_row < min(end_rows, p.t_max) {
                let row = (from + e / per_row) as usize;
                let dst = (b as usize * tz + row) * kz * cz + (e % per_row) as usize;
                // SAFETY: row < T, e % per_row < K C.
                unsafe { *p.marginals.add(dst) = 0.0 };
                e += THREADS;
            }
        }
    };
    if s0 > len {
        zero_rows(s0);
        return;
    }
    let s1 = min(s0 + ckpt, len + 1);
    let n = s1 - s0;
    let wrows = ckpt + k;
    // S rows kept: positions s0 .. s0 + n + K that exist (<= L).
    let nrows = min(n + k, len + 1 - s0);

    let base = smem::aligned_base();
    let lay = segment_layout(ckpt, k, c);
    let sw = Sweep::new(
        k,
        c,
        p.lanes,
        base + lay.dur as u32,
        base + lay.trans as u32,
        base + lay.ring as u32,
        base + lay.prow as u32,
        base + lay.qrow as u32,
    );
    let norm_a = SmemArray::<f64>::new(base + lay.norm_a as u32, ckpt);
    let norm_b = SmemArray::<f64>::new(base + lay.norm_b as u32, wrows);
    let dur_acc = SmemArray::<f64>::new(base + lay.dur_acc as u32, k * c);
    let trans_acc = SmemArray::<f64>::new(base + lay.trans_acc as u32, c * c);
    let srows = SmemArray::<f32>::new(base + lay.srows as u32, wrows * c);
    let arow = SmemArray::<f32>::new(base + lay.alpha as u32, ckpt * c);
    let urow = SmemArray::<f32>::new(base + lay.u as u32, ckpt * c);
    let brow = SmemArray::<f32>::new(base + lay.beta as u32, c * wrows);
    let (label, lead) = (sw.label, sw.leader());
    let nseg = p.nseg as usize;
    let seg = b as usize * nseg + j as usize;
    // SAFETY: b < B: the sequence's rows of S.
    let seq = unsafe { p.cumsum.add(b as usize * (tz + 1) * cz) };

    // 1. Setup.
    // SAFETY: the tables hold K C and C C values; own elements only until C0.
    unsafe {
        sw.load_dur(p.dur);
        sw.load_trans(p.trans, false);
    }
    let mut e = tid;
    while e < nrows * c {
        // SAFETY: rows s0 .. s0 + nrows <= L + 1 <= T + 1 of sequence b; e < (S + K) C.
        unsafe { srows.store(e, *seq.add(s0 as usize * cz + e as usize)) };
        e += THREADS;
    }
    let mut e = tid;
    while e < k * c + c * c {
        // SAFETY: e indexes dur_acc (K C) then trans_acc (C C).
        unsafe {
            if e < k * c {
                dur_acc.store(e, 0.0)
            } else {
                trans_acc.store(e - k * c, 0.0)
            }
        };
        e += THREADS;
    }
    // SAFETY: seg < B nseg; segment j has s0 <= L, so the forward scan wrote checkpoint j.
    let ack = unsafe { p.alpha_ckpt.add(seg * (kz + 1) * cz) };
    sw.for_owned_ring(s0, |e, l, age| {
        // SAFETY: age < K, l < C: inside checkpoint j; e is this thread's ring entry.
        unsafe { sw.ring.store(e, *ack.add(age as usize * cz + l as usize)) };
    });
    if lead {
        // SAFETY: label < C; row 0 (age 0: u - S at s0) of checkpoint j.
        unsafe { sw.qrow.store(label, *ack.add(label as usize)) };
    }
    // SAFETY: seg < B nseg.
    let mut norm = unsafe { *p.alpha_norm.add(seg) };
    if tid == 0 {
        // Row 0 (position s0): alpha is checkpoint row K, u = (u - S) + S.
        let mut m = NEG_INF;
        for l in 0..cz {
            // SAFETY: row K of checkpoint j, l < C.
            m = m.max(unsafe { *ack.add(kz * cz + l) });
        }
        let sh = shift(m);
        for l in 0..cz {
            // SAFETY: checkpoint rows 0 and K, l < C; row s0 <= L of S; row 0 of the
            // workspace, l < C (nobody else writes row 0 or reads it before C2).
            unsafe {
                let a = *ack.add(kz * cz + l);
                let u = *ack.add(l) + *seq.add(s0 as usize * cz + l) as f64;
                arow.store(l as u32, (a - sh) as f32);
                urow.store(l as u32, (u - sh) as f32);
            }
        }
        // SAFETY: index 0 < S.
        unsafe { norm_a.store(0, norm + sh) };
    }
    // SAFETY: C0, uniform.
    unsafe { sync::sync_threads() };

    // 2. Alpha sweep (the scan's steps, including its rebase schedule, so values match it).
    if (s0 + 1).is_multiple_of(CHUNK) && s0 + 1 < s1 {
        // SAFETY: qrow and the ring were published by C0; own entries.
        let d = unsafe { sw.rebase(s0) };
        // SAFETY: uniform (block-uniform condition).
        unsafe { sync::sync_threads() };
        norm += d;
    }
    for r in s0 + 1..s1 {
        let i = r - s0;
        let s = if sw.valid {
            // SAFETY: i < n, label < C; published by C0.
            unsafe { srows.load(i * c + label) as f64 }
        } else {
            0.0
        };
        // SAFETY: uniform; the ring holds steps r - K .. r.
        let st = unsafe { sw.step::<false, true>(r, s, 1.0) };
        let sh = shift(st.pmax);
        if lead {
            // SAFETY: row i < S written once, read only after C2.
            unsafe {
                arow.store(i * c + label, (st.p - sh) as f32);
                urow.store(i * c + label, (st.q + s - sh) as f32);
            }
        }
        if tid == 0 {
            // SAFETY: i < S.
            unsafe { norm_a.store(i, norm + sh) };
        }
        if (r + 1).is_multiple_of(CHUNK) && r + 1 < s1 {
            // SAFETY: qrow published by B2; own entries.
            let d = unsafe { sw.rebase(r) };
            // SAFETY: uniform.
            unsafe { sync::sync_threads() };
            norm += d;
        }
    }

    // 3. Beta setup.
    // SAFETY: the last reads of the forward table and the ring were before the last barrier.
    unsafe { sw.load_trans(p.trans, true) };
    let from_ckpt = s1 <= len;
    let r1 = len - s1.min(len);
    let mut norm = 0.0f64;
    if from_ckpt {
        // SAFETY: (j + 1) S = s1 <= L, so the reverse scan wrote beta checkpoint j.
        let bck = unsafe { p.beta_ckpt.add(seg * kz * cz) };
        sw.for_owned_ring(r1, |e, l, age| {
            // SAFETY: age < K, l < C; own ring entry.
            unsafe { sw.ring.store(e, *bck.add(age as usize * cz + l as usize)) };
        });
        if lead {
            // SAFETY: label < C; age 0 row.
            unsafe { sw.qrow.store(label, *bck.add(label as usize)) };
        }
        // SAFETY: seg < B nseg.
        norm = unsafe { *p.beta_norm.add(seg) };
    } else {
        // SAFETY: own ring entries.
        unsafe { sw.clear_ring() };
    }
    // Beta rows of positions s1 + i (i < K): thread i owns row i. beta = (S + beta) - S.
    let mut i = tid;
    while i < k {
        let at = s1 + i;
        let row = (n + i) as usize;
        // The workspace row n + i < S + K (l < C below) is this thread's until C1.
        if from_ckpt && at <= len {
            // SAFETY: checkpoint j exists (s1 <= L); its row i < K, l < C.
            let beta = |l: usize| unsafe { *p.beta_ckpt.add((seg * kz + i as usize) * cz + l) };
            // SAFETY: row at <= L <= T of the sequence's S, l < C.
            let s_at = |l: usize| unsafe { *seq.add(at as usize * cz + l) as f64 };
            let mut m = NEG_INF;
            for l in 0..cz {
                m = m.max(beta(l) - s_at(l));
            }
            let sh = shift(m);
            for l in 0..cz {
                let v = ((beta(l) - s_at(l)) - sh) as f32;
                // SAFETY: workspace row n + i, l < C (see above).
                unsafe { brow.store(l as u32 * wrows + row as u32, v) };
            }
            // SAFETY: n + i < S + K.
            unsafe { norm_b.store(row as u32, norm + sh) };
        } else {
            for l in 0..c {
                // SAFETY: workspace row n + i, l < C (see above).
                unsafe { brow.store(l * wrows + row as u32, NEG_INF as f32) };
            }
            // SAFETY: n + i < S + K.
            unsafe { norm_b.store(row as u32, norm) };
        }
        i += THREADS;
    }
    // SAFETY: C1, uniform.
    unsafe { sync::sync_threads() };

    // 4. Beta sweep.
    if from_ckpt && (r1 + 1).is_multiple_of(CHUNK) {
        // SAFETY: qrow and ring published by C1; own entries.
        let d = unsafe { sw.rebase(r1) };
        // SAFETY: uniform.
        unsafe { sync::sync_threads() };
        norm += d;
    }
    let mut pos = s1;
    while pos > s0 {
        pos -= 1;
        let r = len - pos;
        let i = pos - s0;
        let s = if sw.valid {
            // SAFETY: i < n, label < C.
            unsafe { srows.load(i * c + label) as f64 }
        } else {
            0.0
        };
        // SAFETY: uniform; the ring holds steps r - K .. r (or step 0 starts it).
        let st = unsafe {
            if r == 0 {
                sw.first_reverse(s)
            } else {
                sw.step::<false, true>(r, s, -1.0)
            }
        };
        let sh = shift(st.pmax);
        if lead {
            // SAFETY: label < C, i < S: written once, read after C2.
            unsafe { brow.store(label * wrows + i, ((st.q - s) - sh) as f32) };
        }
        if tid == 0 {
            // SAFETY: i < S + K.
            unsafe { norm_b.store(i, norm + sh) };
        }
        if (r + 1).is_multiple_of(CHUNK) && pos > s0 {
            // SAFETY: qrow published by B2; own entries.
            let d = unsafe { sw.rebase(r) };
            // SAFETY: uniform.
            unsafe { sync::sync_threads() };
            norm += d;
        }
    }
    // SAFETY: C2, uniform.
    unsafe { sync::sync_threads() };

    // 5. Combine.
    // SAFETY: b < B.
    let log_z = unsafe { *p.log_z64.add(b as usize) };
    let g = sw.g;
    for pos in s0..s1 {
        let i = pos - s0;
        // SAFETY: i < S (published by C2).
        let sa = unsafe { norm_a.load(i) } - log_z;
        let kmax = min(k, len - pos);
        let (u_c, a_c, s_c) = if sw.valid {
            // SAFETY: row i < S, label < C.
            unsafe {
                (
                    urow.load(i * c + label) as f64,
                    arow.load(i * c + label) as f64,
                    srows.load(i * c + label) as f64,
                )
            }
        } else {
            (0.0, 0.0, 0.0)
        };
        let mut st = 0.0f32;
        if sw.valid {
            let mut kk = 1 + sw.sub;
            while kk <= k {
                let mu = if kk <= kmax {
                    // SAFETY: i + kk <= L - s0 < nrows and < S + K; label < C; kk - 1 < K.
                    let (bv, sk, nb, dv) = unsafe {
                        (
                            brow.load(label * wrows + i + kk) as f64,
                            srows.load((i + kk) * c + label) as f64,
                            norm_b.load(i + kk),
                            sw.dur.load(label * k + kk - 1) as f64,
                        )
                    };
                    let mu = exp(((((u_c + bv) + (sk - s_c)) + dv) + (sa + nb)) as f32);
                    let at = label * k + kk - 1;
                    // SAFETY: the accumulator of (label, kk) is owned by this thread.
                    unsafe { dur_acc.store(at, dur_acc.load(at) + mu as f64) };
                    mu
                } else {
                    0.0
                };
                st += mu;
                if !p.marginals.is_null() && pos < p.t_max {
                    let dst = ((b as usize * tz + pos as usize) * kz + (kk - 1) as usize) * cz
                        + label as usize;
                    // SAFETY: pos < T, kk - 1 < K, label < C.
                    unsafe { *p.marginals.add(dst) = mu };
                }
                kk += g;
            }
        }
        // SAFETY: every thread of the block runs this loop uniformly (full warps).
        let st = unsafe { group_sum_f32(st, g) };
        if lead {
            let end_marginal = if pos == 0 {
                0.0
            } else {
                // SAFETY: beta row i < S + K.
                let (bv, nb) = unsafe { (brow.load(label * wrows + i) as f64, norm_b.load(i)) };
                exp(((a_c + bv) + (sa + nb)) as f32)
            };
            let dst = (b as usize * (tz + 1) + pos as usize) * cz + label as usize;
            // SAFETY: pos <= L <= T, label < C.
            unsafe { *p.grad_cumsum.add(dst) = end_marginal - st };
        }
        if sw.valid && st > 0.0 {
            // P(previous label c_in | a segment with `label` starts at pos) times its
            // probability.
            let mut ci = sw.sub;
            while ci < c {
                // SAFETY: row i, ci < C; reverse table m[from][to] = trans[ci][label].
                let x =
                    unsafe { arow.load(i * c + ci) as f64 + sw.trans.load(ci * c + label) as f64 };
                let t = exp((x - u_c) as f32) * st;
                let at = label * c + ci;
                // SAFETY: owned accumulator.
                unsafe { trans_acc.store(at, trans_acc.load(at) + t as f64) };
                ci += g;
            }
        }
    }
    if s1 == len + 1 {
        zero_rows(s1);
    }

    // Partials: each thread writes the accumulators it owns.
    let slice = if ALIAS_SEGMENTS { seg & !1 } else { seg };
    let part = slice * partial_len(k, c);
    if sw.valid {
        let mut kk = 1 + sw.sub;
        while kk <= k {
            // SAFETY: owned entry; the slice (b, j) holds partial_len values.
            unsafe {
                *p.partials.add(part + ((kk - 1) * c + label) as usize) =
                    dur_acc.load(label * k + kk - 1)
            };
            kk += g;
        }
        let mut ci = sw.sub;
        while ci < c {
            // SAFETY: as above (transition block after the K C duration counts).
            unsafe {
                *p.partials.add(part + (k * c + ci * c + label) as usize) =
                    trans_acc.load(label * c + ci)
            };
            ci += g;
        }
    }
}
