//! `mhc_bwd_finalize`: the second, fixed-order pass of the backward's reductions.
//!
//! # Parameters
//! [`FinalizeParams`]: partials `part_w [w_splits, K, M]` and `part_coef [coef_blocks,
//! COEF_PARTIAL]`, `phi [K, M]`, `gamma [K]` (or null); outputs `dphi [K, M]`, `dgamma [K]` (or
//! null), `dbias [M]`, `dalpha [3]`.
//!
//! # Thread mapping
//! Blocks `0 .. ceil(K / FIN_THREADS)`: thread `k` sums `W[k][m] = sum_s part_w[s][k][m]` (split
//! order) and writes `dphi[k][m] = gamma[k] W[k][m]` (or `W`), then
//! `dgamma[k] = sum_m phi[k][m] W[k][m]` (`m` order). The last block: thread `m < M + 3` sums
//! column `m` of `part_coef` over the blocks in order: `dbias[m]`, then `dalpha[m - M]`.
//!
//! # Barrier protocol
//! None: every output has exactly one writer.

use crate::arch::index;
use kernel_abi::mhc::*;

/// See the module documentation.
///
/// # Safety
/// Grid of `finalize_blocks(K)` blocks of `FIN_THREADS` threads; the pointers hold the
/// documented sizes (`dgamma` null exactly when `gamma` is).
#[inline(always)]
pub unsafe fn run(p: FinalizeParams) {
    let mm = m_of(p.n) as usize;
    let tid = index::thread_idx_x();
    let b = index::block_idx_x();
    let kk = p.k as usize;
    if b < p.k.div_ceil(FIN_THREADS) {
        let k = (b * FIN_THREADS + tid) as usize;
        if k >= kk {
            return;
        }
        let g = if p.gamma.is_null() {
            1.0
        } else {
            // SAFETY: k < K: inside `gamma`, which is given.
            unsafe { *p.gamma.add(k) }
        };
        let mut dg = 0.0f32;
        for m in 0..mm {
            let mut w = 0.0f32;
            for s in 0..p.w_splits as usize {
                // SAFETY: s < w_splits, k < K, m < M: inside `part_w`.
                w += unsafe { *p.part_w.add((s * kk + k) * mm + m) };
            }
            // SAFETY: k < K, m < M: inside `phi` and `dphi`.
            unsafe {
                *p.dphi.add(k * mm + m) = g * w;
                dg += *p.phi.add(k * mm + m) * w;
            }
        }
        if !p.dgamma.is_null() {
            // SAFETY: k < K: inside `dgamma`.
            unsafe { *p.dgamma.add(k) = dg };
        }
    } else if (tid as usize) < mm + 3 {
        let mut acc = 0.0f32;
        for blk in 0..p.coef_blocks as usize {
            // SAFETY: blk < coef_blocks, tid < M + 3 <= COEF_PARTIAL: inside `part_coef`.
            acc += unsafe { *p.part_coef.add(blk * COEF_PARTIAL as usize + tid as usize) };
        }
        let m = tid as usize;
        // SAFETY: m < M: inside `dbias`; otherwise m - M < 3: inside `dalpha`.
        unsafe {
            if m < mm {
                *p.dbias.add(m) = acc;
            } else {
                *p.dalpha.add(m - mm) = acc;
            }
        }
    }
}
