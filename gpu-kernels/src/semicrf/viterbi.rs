//! `semicrf_viterbi`: the forward scan in the max semiring, backpointers, traceback.
//!
//! # Parameters
//! [`ViterbiParams`]: the scan's inputs; outputs the best score `[B]`, backpointers
//! `[B, T + 1, C]` and the best segmentation as `seg_start/seg_dur/seg_label [B, T]` (the first
//! `seg_count[b]` entries, in order of position).
//!
//! # Tiling
//! One block per sequence, as the forward direction of `semicrf_scan` (same shared-memory
//! layout and staging), without checkpoints.
//!
//! # Thread mapping
//! As in `semicrf_scan`; reductions are maxima with the first index attaining them (smallest
//! duration, then smallest previous label). The group leader of label `c` writes the
//! backpointer of `(position, c)`: the best duration of a segment ending there (phase A) and
//! the best previous label of a segment starting there (phase B).
//!
//! # Barrier protocol (`bar.sync 0`, uniform)
//! - Setup and steps as in `semicrf_scan` (B0; per step B1, B2; chunk ends B3 with the rebase,
//!   which shifts every value by the same amount and so changes no decision).
//! - After the last step's B2, thread 0 reads the backpointers (global memory written by the
//!   leaders before that barrier, which orders them for the block) and traces the best path
//!   back from the best final label, writing the segments last-first; barrier E1; then all
//!   threads reverse the written prefix in place (disjoint index pairs).

use super::Sweep;
use crate::arch::{cp_async, index, smem, sync};
use kernel_abi::semicrf::{CHUNK, THREADS, ViterbiParams, scan_layout};

/// See the module documentation.
///
/// # Safety
/// Launched as documented on [`ViterbiParams`] (grid `B`, `THREADS` threads,
/// `scan_layout(k, c).bytes` of shared memory), every pointer holding its documented size,
/// lengths in `1..=T`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn semicrf_viterbi(p: ViterbiParams) {
    crate::launch_bounds!(semicrf_viterbi in kernel_abi::semicrf::KERNELS);
    let b = index::block_idx_x();
    let (k, c) = (p.k, p.c);
    let cz = c as usize;
    // SAFETY: b < B.
    let len = unsafe { *p.lengths.add(b as usize) };
    let base = smem::aligned_base();
    let lay = scan_layout(k, c);
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
    let srows = smem::SmemArray::<f32>::new(base + lay.srows as u32, 2 * CHUNK * c);
    let row_len = (p.t_max + 1) as usize * cz;
    // SAFETY: b < B.
    let seq = unsafe { p.cumsum.add(b as usize * row_len) };
    // SAFETY: b < B.
    let bp = unsafe { p.backptr.add(b as usize * row_len) };

    let stage = |chunk: u32| {
        let buf = (chunk % 2) * CHUNK * c;
        let mut e = sw.tid;
        while e < CHUNK * c {
            let r = chunk * CHUNK + e / c;
            if r <= len {
                // SAFETY: r <= L <= T, e % c < C; destination inside the staging buffers.
                unsafe {
                    cp_async::copy_4(
                        srows.addr_of(buf + e),
                        seq.add(r as usize * cz + (e % c) as usize) as *const u8,
                    )
                };
            }
            e += THREADS;
        }
        cp_async::commit_group();
    };

    // SAFETY: tables of K C and C C values; own elements until B0.
    unsafe {
        sw.load_dur(p.dur);
        sw.load_trans(p.trans, false);
        sw.clear_ring();
    }
    stage(0);
    cp_async::wait_all();
    // SAFETY: B0.
    unsafe { sync::sync_threads() };

    let mut norm = 0.0f64;
    let mut r = 0u32;
    loop {
        if r.is_multiple_of(CHUNK) {
            stage(r / CHUNK + 1);
        }
        let row = (r / CHUNK % 2) * CHUNK * c + (r % CHUNK) * c;
        let s = if sw.valid {
            // SAFETY: staged and published.
            unsafe { srows.load(row + sw.label) as f64 }
        } else {
            0.0
        };
        // SAFETY: uniform; protocol as in the module docs.
        let st = unsafe {
            if r == 0 {
                sw.first_forward::<true>(s)
            } else {
                sw.step::<true, false>(r, s, 1.0)
            }
        };
        if sw.leader() {
            // SAFETY: r <= T, label < C.
            unsafe {
                *bp.add(r as usize * cz + sw.label as usize) =
                    (st.arg_k & 0xffff) | ((st.arg_c & 0xffff) << 16)
            };
        }
        if r == len {
            break;
        }
        if (r + 1).is_multiple_of(CHUNK) {
            cp_async::wait_all();
            // SAFETY: qrow published by B2; own ring entries.
            let d = unsafe { sw.rebase(r) };
            // SAFETY: B3, uniform.
            unsafe { sync::sync_threads() };
            norm += d;
        }
        r += 1;
    }
    cp_async::wait_all();
    // SAFETY: the P row of step L was published by B1 and not written since.
    let (best, label) = unsafe { sw.lse_labels::<true>(|i| sw.prow.load(i)) };
    // The leaders' backpointer stores of the last step precede the barrier below.
    // SAFETY: uniform.
    unsafe { sync::sync_threads() };
    let out = b as usize * p.t_max as usize;
    if sw.tid == 0 {
        // SAFETY: b < B.
        unsafe { *p.score.add(b as usize) = (norm + best) as f32 };
        let (mut t, mut lab, mut count) = (len, label.min(c - 1), 0u32);
        while t > 0 && count < len {
            // SAFETY: t <= T, lab < C (clamped below).
            let e = unsafe { *bp.add(t as usize * cz + lab as usize) };
            let dur = (e & 0xffff).clamp(1, t);
            let start = t - dur;
            // SAFETY: count < L <= T.
            unsafe {
                *p.seg_start.add(out + count as usize) = start;
                *p.seg_dur.add(out + count as usize) = dur;
                *p.seg_label.add(out + count as usize) = lab;
            }
            count += 1;
            // SAFETY: start < T, lab < C.
            let prev = unsafe { *bp.add(start as usize * cz + lab as usize) } >> 16;
            lab = prev.min(c - 1);
            t = start;
        }
        // SAFETY: b < B.
        unsafe { *p.seg_count.add(b as usize) = count };
    }
    // SAFETY: E1, uniform; publishes the segments (global memory, block scope).
    unsafe { sync::sync_threads() };
    // SAFETY: b < B; written by thread 0 before E1.
    let count = unsafe { *p.seg_count.add(b as usize) };
    let mut i = sw.tid;
    while i < count / 2 {
        let (x, y) = (out + i as usize, out + (count - 1 - i) as usize);
        // SAFETY: x, y < out + count <= out + T; each pair (i, count - 1 - i) is touched by
        // one thread only.
        unsafe {
            swap(p.seg_start, x, y);
            swap(p.seg_dur, x, y);
            swap(p.seg_label, x, y);
        }
        i += THREADS;
    }
}

/// Swap elements `x` and `y` of a global array.
///
/// # Safety
/// Both indices are inside the array and no other thread accesses them concurrently.
#[inline(always)]
unsafe fn swap(arr: *mut u32, x: usize, y: usize) {
    // SAFETY: forwarded to the caller.
    unsafe {
        let (a, b) = (*arr.add(x), *arr.add(y));
        *arr.add(x) = b;
        *arr.add(y) = a;
    }
}
