//! `semicrf_reduce`: the gradients of `sum_b log Z_b` with respect to `dur` and `trans`, summed
//! from the per-(sequence, segment) partial counts of `semicrf_marginals`.
//!
//! # Parameters
//! [`ReduceParams`]: `partials [B, nseg, K C + C C]` f64, `lengths [B]`, outputs
//! `grad_dur [K, C]` and `grad_trans [C, C]` f32.
//!
//! # Thread mapping
//! One thread per output element `e`: it adds `partials[b][j][e]` for `b = 0..B` and, for each
//! `b`, the segments `j <= L_b / S` that exist, in that fixed order, in f64: the result does not
//! depend on scheduling (bitwise deterministic).
//!
//! # Barrier protocol
//! None: threads share nothing.

use crate::arch::index;
use kernel_abi::semicrf::{REDUCE_THREADS, ReduceParams, partial_len};

/// See the module documentation.
///
/// # Safety
/// Grid `ceil(partial_len(k, c) / REDUCE_THREADS)` blocks of `REDUCE_THREADS` threads; the
/// partials written by `semicrf_marginals` for the same lengths and interval.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn semicrf_reduce(p: ReduceParams) {
    crate::launch_bounds!(semicrf_reduce in kernel_abi::semicrf::KERNELS);
    let e = index::block_idx_x() * REDUCE_THREADS + index::thread_idx_x();
    let n = partial_len(p.k, p.c);
    if e as usize >= n {
        return;
    }
    let mut acc = 0.0f64;
    for b in 0..p.batch as usize {
        // SAFETY: b < B.
        let len = unsafe { *p.lengths.add(b) };
        let segs = (len / p.ckpt + 1).min(p.nseg) as usize;
        for j in 0..segs {
            // SAFETY: (b, j) < (B, nseg), e < partial_len.
            acc += unsafe { *p.partials.add((b * p.nseg as usize + j) * n + e as usize) };
        }
    }
    let kc = (p.k * p.c) as usize;
    // SAFETY: e < K C indexes grad_dur, else e - K C < C C indexes grad_trans.
    unsafe {
        if (e as usize) < kc {
            *p.grad_dur.add(e as usize) = acc as f32;
        } else {
            *p.grad_trans.add(e as usize - kc) = acc as f32;
        }
    }
}
