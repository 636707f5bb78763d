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
//! `(b, j)` of `partials`. Its workspace (the recomputed alpha, `u - S` and `S + beta` rows of
//! its positions, their normalizers, its S rows, its ring and its count accumulators) is its own
//! dynamic shared memory: no two segments share a workspace, so the seed's cross-segment race
//! cannot occur, and no buffer is ever reset for reuse. Its inputs are read-only: the alpha
//! checkpoint `j` (written by the forward scan at position `s0`) and, when `s1 = s0 + S <= L`,
//! the beta checkpoint `j` (written by the reverse scan at `s1`); when `s1 > L` the reverse
//! sweep starts at `L` from `beta[L, .] = 0` instead. Segments with `s0 > L` only write zeros.
//!
//! # Thread mapping
//! As in `semicrf_scan` ([`super::Sweep`]): thread `tid` works for label `tid / G` on
//! durations `k ≡ tid + 1` and previous labels `c_in ≡ tid (mod G)`. The count accumulator of
//! `(label, k)` and of `(label, c_in)` is owned by that one thread.
//!
//! # Barrier protocol (`bar.sync 0`, uniform)
//! 1. Setup: every thread stores its share of the tables, the S rows, zeros for the
//!    accumulators, and (from the alpha checkpoint) its own ring entries; leaders store the
//!    checkpoint's alpha and `u - S` rows and `qrow`; barrier C0 publishes them (this is the
//!    barrier the seed's Triton kernel lacked after loading a checkpoint). If the checkpoint's
//!    step ends a chunk, the scan rebased there: the same rebase follows, then a barrier.
//! 2. Alpha sweep, positions `s0 + 1 .. s1`: steps with barriers B1/B2 as in the scan; after
//!    B2 the leaders store the step's alpha and `u - S` into the workspace row (written once,
//!    read only in step 5), thread 0 the normalizer; rebases with B3 at chunk ends.
//! 3. Beta setup: the transition table is reloaded in reverse orientation and the ring from the
//!    beta checkpoint (or cleared), after the alpha sweep's last B2 (the last reads of both);
//!    barrier C1 publishes them (and the alpha sweep's last workspace rows).
//! 4. Beta sweep, positions `s1 - 1` down to `s0`: as in 2, storing `S + beta` rows.
//! 5. Barrier C2 publishes the last rows; then every thread combines positions independently
//!    (reads of the workspace only, writes to its owned accumulators and to global outputs).
//!    Each thread writes its own accumulators to `partials` (no barrier: the owner wrote them).

use super::{NEG_INF, Sweep, group_sum};
use crate::arch::math::exp;
use crate::arch::{index, smem, sync};
use core::cmp::min;
use kernel_abi::semicrf::{CHUNK, MarginalParams, THREADS, partial_len, segment_layout};
use smem::SmemArray;

/// See the module documentation.
///
/// # Safety
/// Launched as documented on [`MarginalParams`] (grid `(nseg, B)`, `THREADS` threads,
/// `segment_layout(ckpt, k, c).bytes` of shared memory) after `semicrf_scan` ran both
/// directions on the same inputs, checkpoint interval and normalizer buffers.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn semicrf_marginals(p: MarginalParams) {
    crate::launch_bounds!(semicrf_marginals, THREADS, 1);
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
    let srows = SmemArray::<f32>::new(base + lay.srows as u32, ckpt * c);
    let alpha = SmemArray::<f32>::new(base + lay.alpha as u32, ckpt * c);
    let vrows = SmemArray::<f32>::new(base + lay.v as u32, ckpt * c);
    let wrow = SmemArray::<f32>::new(base + lay.w as u32, c * wrows);
    let (label, lead) = (sw.label, sw.leader());
    let nseg = p.nseg as usize;
    let seg = b as usize * nseg + j as usize;

    // 1. Setup.
    // SAFETY: the tables hold K C and C C values; own elements only until C0.
    unsafe {
        sw.load_dur(p.dur);
        sw.load_trans(p.trans, false);
    }
    let mut e = tid;
    while e < n * c {
        let src = (b as usize * (tz + 1) + s0 as usize) * cz + e as usize;
        // SAFETY: rows s0 .. s1 <= L + 1 <= T + 1 of sequence b; e < n C <= S C.
        unsafe { srows.store(e, *p.cumsum.add(src)) };
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
        // SAFETY: label < C; rows 0 (age 0: u - S at s0) and K (alpha at s0) of checkpoint j.
        unsafe {
            let v0 = *ack.add(label as usize);
            sw.qrow.store(label, v0);
            vrows.store(label, v0);
            alpha.store(label, *ack.add(kz * cz + label as usize));
        }
    }
    // SAFETY: seg < B nseg.
    let mut norm = unsafe { *p.alpha_norm.add(seg) };
    if tid == 0 {
        // SAFETY: index 0 < S.
        unsafe { norm_a.store(0, norm) };
    }
    // SAFETY: C0, uniform.
    unsafe { sync::sync_threads() };

    // 2. Alpha sweep (the scan's steps, including its rebase schedule, so values match it).
    if (s0 + 1).is_multiple_of(CHUNK) && s0 + 1 < s1 {
        // SAFETY: qrow and the ring were published by C0; own entries.
        let d = unsafe { sw.rebase(s0) };
        // SAFETY: uniform (block-uniform condition).
        unsafe { sync::sync_threads() };
        norm += d as f64;
    }
    for r in s0 + 1..s1 {
        let i = r - s0;
        let s = if sw.valid {
            // SAFETY: i < n, label < C; published by C0.
            unsafe { srows.load(i * c + label) }
        } else {
            0.0
        };
        // SAFETY: uniform; the ring holds steps r - K .. r.
        let st = unsafe { sw.step::<false>(r, s, 1.0) };
        if lead {
            // SAFETY: row i < S written once, read only after C2.
            unsafe {
                alpha.store(i * c + label, st.p);
                vrows.store(i * c + label, st.q);
            }
        }
        if tid == 0 {
            // SAFETY: i < S.
            unsafe { norm_a.store(i, norm) };
        }
        if (r + 1).is_multiple_of(CHUNK) && r + 1 < s1 {
            // SAFETY: qrow published by B2; own entries.
            let d = unsafe { sw.rebase(r) };
            // SAFETY: uniform.
            unsafe { sync::sync_threads() };
            norm += d as f64;
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
        let mut e = tid;
        while e < k * c {
            let (i, l) = (e / c, e % c);
            // SAFETY: w row n + i < S + K, l < C.
            unsafe { wrow.store(l * wrows + n + i, *bck.add(e as usize)) };
            e += THREADS;
        }
        if lead {
            // SAFETY: label < C; age 0 row.
            unsafe { sw.qrow.store(label, *bck.add(label as usize)) };
        }
        // SAFETY: seg < B nseg.
        norm = unsafe { *p.beta_norm.add(seg) };
    } else {
        // SAFETY: own ring entries.
        unsafe { sw.clear_ring() };
        let mut e = tid;
        while e < k * c {
            let (i, l) = (e / c, e % c);
            // SAFETY: as above.
            unsafe { wrow.store(l * wrows + n + i, NEG_INF) };
            e += THREADS;
        }
    }
    let mut i = tid;
    while i < k {
        // SAFETY: n + i < S + K.
        unsafe { norm_b.store(n + i, norm) };
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
        norm += d as f64;
    }
    let mut pos = s1;
    while pos > s0 {
        pos -= 1;
        let r = len - pos;
        let i = pos - s0;
        let s = if sw.valid {
            // SAFETY: i < n, label < C.
            unsafe { srows.load(i * c + label) }
        } else {
            0.0
        };
        // SAFETY: uniform; the ring holds steps r - K .. r (or step 0 starts it).
        let st = unsafe {
            if r == 0 {
                sw.first_reverse(s)
            } else {
                sw.step::<false>(r, s, -1.0)
            }
        };
        if lead {
            // SAFETY: label < C, i < S: written once, read after C2.
            unsafe { wrow.store(label * wrows + i, st.q) };
        }
        if tid == 0 {
            // SAFETY: i < S + K.
            unsafe { norm_b.store(i, norm) };
        }
        if (r + 1).is_multiple_of(CHUNK) && pos > s0 {
            // SAFETY: qrow published by B2; own entries.
            let d = unsafe { sw.rebase(r) };
            // SAFETY: uniform.
            unsafe { sync::sync_threads() };
            norm += d as f64;
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
        let na = unsafe { norm_a.load(i) };
        let kmax = min(k, len - pos);
        let (mut v_c, mut a_c, mut s_c) = (0.0f32, 0.0f32, 0.0f32);
        let mut st = 0.0f32;
        if sw.valid {
            // SAFETY: row i < S, label < C.
            unsafe {
                v_c = vrows.load(i * c + label);
                a_c = alpha.load(i * c + label);
                s_c = srows.load(i * c + label);
            }
            let mut kk = 1 + sw.sub;
            while kk <= k {
                let mu = if kk <= kmax {
                    // SAFETY: i + kk < S + K; label < C; kk - 1 < K.
                    let (wv, dv, nb) = unsafe {
                        (
                            wrow.load(label * wrows + i + kk),
                            sw.dur.load(label * k + kk - 1),
                            norm_b.load(i + kk),
                        )
                    };
                    let mu = exp(v_c + wv + dv + ((na - log_z) + nb) as f32);
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
        let st = unsafe { group_sum(st, g) };
        if lead {
            let end_marginal = if pos == 0 {
                0.0
            } else {
                // SAFETY: w row i < S + K.
                let (wv, nb) = unsafe { (wrow.load(label * wrows + i), norm_b.load(i)) };
                exp(a_c + wv - s_c + ((na - log_z) + nb) as f32)
            };
            let dst = (b as usize * (tz + 1) + pos as usize) * cz + label as usize;
            // SAFETY: pos <= L <= T, label < C.
            unsafe { *p.grad_cumsum.add(dst) = end_marginal - st };
        }
        if sw.valid && st > 0.0 {
            // P(previous label c_in | a segment with `label` starts at pos) times its
            // probability; u = (u - S) + S.
            let u_c = v_c + s_c;
            let mut ci = sw.sub;
            while ci < c {
                // SAFETY: row i, ci < C; reverse table m[from][to] = trans[ci][label].
                let t = unsafe {
                    exp(alpha.load(i * c + ci) + sw.trans.load(ci * c + label) - u_c) * st
                };
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
    let part = seg * partial_len(k, c);
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
