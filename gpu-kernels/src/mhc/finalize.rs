//! `mhc_bwd_finalize_n{N}`: the second, fixed-order pass of the backward's reductions.
//!
//! # Parameters
//! [`FinalizeParams`]: partials `part_w [w_splits, K, M]` and `part_coef [coef_blocks,
//! COEF_PARTIAL]`, `phi [K, M]`, `gamma [K]` (or null); outputs `dphi [K, M]`, `dgamma [K]` (or
//! null), `dbias [M]`, `dalpha [3]`.
//!
//! # Thread mapping
//! Blocks `0 .. ceil(K / FIN_THREADS)` (row blocks): thread `k` sums
//! `W[k][m] = sum_s part_w[s][k][m]` (split order; the `M` loads of a split are independent and
//! issued together, `M` being a compile-time constant) and writes `dphi[k][m] = gamma[k] W[k][m]`
//! (or `W`), then `dgamma[k] = sum_m phi[k][m] W[k][m]` (`m` order).
//!
//! The next `M + 3` blocks (column blocks): block `m` reduces column `m` of `part_coef` (`dbias[m]`
//! for `m < M`, then `dalpha[m - M]`): thread `t` sums the rows `t, t + FIN_THREADS, ...` in
//! order, then a butterfly over each warp and the warps' sums in warp order.
//!
//! # Barrier protocol
//! Row blocks: none. Column blocks: lane 0 of each warp writes its warp's sum to `sums[warp]`
//! (shared); `sync_threads` publishes them; thread 0 adds them in warp order and writes the
//! output. Nothing else touches shared memory.

use crate::arch::{index, smem, sync, warp};
use kernel_abi::WARP_SIZE;
use kernel_abi::mhc::*;

/// See the module documentation.
///
/// # Safety
/// Grid of `finalize_blocks(N, K)` blocks of `FIN_THREADS` threads, `finalize_smem_bytes()` of
/// dynamic shared memory; the pointers hold the documented sizes (`dgamma` null exactly when
/// `gamma` is).
#[inline(always)]
pub unsafe fn run<const N: usize, const M: usize>(p: FinalizeParams) {
    const {
        assert!(M == m_of(N as u32) as usize);
    }
    let tid = index::thread_idx_x();
    let b = index::block_idx_x();
    let kk = p.k as usize;
    let row_blocks = p.k.div_ceil(FIN_THREADS);
    if b < row_blocks {
        let k = (b * FIN_THREADS + tid) as usize;
        if k >= kk {
            return;
        }
        let mut w = [0.0f32; M];
        for s in 0..p.w_splits as usize {
            for m in 0..M {
                // SAFETY: s < w_splits, k < K, m < M: inside `part_w`.
                w[m] += unsafe { *p.part_w.add((s * kk + k) * M + m) };
            }
        }
        let g = if p.gamma.is_null() {
            1.0
        } else {
            // SAFETY: k < K: inside `gamma`, which is given.
            unsafe { *p.gamma.add(k) }
        };
        let mut dg = 0.0f32;
        for m in 0..M {
            // SAFETY: k < K, m < M: inside `phi` and `dphi`.
            unsafe {
                *p.dphi.add(k * M + m) = g * w[m];
                dg += *p.phi.add(k * M + m) * w[m];
            }
        }
        if !p.dgamma.is_null() {
            // SAFETY: k < K: inside `dgamma`.
            unsafe { *p.dgamma.add(k) = dg };
        }
        return;
    }
    // Column block: every thread of the block runs this part (b is block-uniform).
    let m = (b - row_blocks) as usize;
    let mut acc = 0.0f32;
    let mut row = tid;
    while row < p.coef_blocks {
        // SAFETY: row < coef_blocks, m < M + 3 <= COEF_PARTIAL: inside `part_coef`.
        acc += unsafe { *p.part_coef.add(row as usize * COEF_PARTIAL as usize + m) };
        row += FIN_THREADS;
    }
    // SAFETY: all 32 lanes of every warp execute this (uniform control flow).
    let acc = unsafe { warp::sum_f32(acc) };
    let sums = smem::SmemArray::<f32>::new(smem::aligned_base(), FIN_THREADS / WARP_SIZE);
    if index::lane_id() == 0 {
        // SAFETY: warp < FIN_THREADS / 32 = sums.len(); one writer per word.
        unsafe { sums.store(index::warp_id(), acc) };
    }
    // SAFETY: every thread of a column block reaches this barrier once.
    unsafe { sync::sync_threads() };
    if tid == 0 {
        let mut total = 0.0f32;
        for w in 0..FIN_THREADS / WARP_SIZE {
            // SAFETY: written before the barrier.
            total += unsafe { sums.load(w) };
        }
        // SAFETY: m < M: inside `dbias`; otherwise m - M < 3: inside `dalpha`.
        unsafe {
            if m < M {
                *p.dbias.add(m) = total;
            } else {
                *p.dalpha.add(m - M) = total;
            }
        }
    }
}
