//! The row-wise kernels of the backward: the preprocess (`delta'` and the zeroed dQ
//! accumulator) and the dQ conversion (accumulator times the scale to the element type).
//!
//! # Thread mapping (both)
//! A block covers [`ROW_BLOCK`] query rows of one (sequence, head) with `L` lanes per row (`D /
//! 8` rounded up to a power of two, at most 32): thread `tid` handles 16-byte chunk `c = tid %
//! L` (8 elements; none when `c >= D / 8`) of rows `tid / L + k (ROW_THREADS / L)`. The lanes of
//! a row are consecutive lanes of one warp, so the row's dot product reduces with `xor`
//! shuffles. No shared memory, no barrier.

use super::super::elem::Elem;
use super::layout::BwdLayout;
use crate::arch::{global, index, warp};
use kernel_abi::attention::backward::{ROW_BLOCK, ROW_THREADS};

/// Lanes per row of the row kernels: `D / 8` 16-byte chunks, rounded up to a power of two.
const fn row_lanes(d: u32) -> u32 {
    (d / 8).next_power_of_two()
}

/// `delta'[b, h, i] = sum_d dO O - dLSE` (0 where LSE is -inf: such a row has no allowed key,
/// its P is 0, and a non-finite dLSE must not reach its `dS = P (dP - delta')`); the dQ
/// accumulator's rows zeroed when it is not null.
///
/// # Safety
/// Launched with grid `(ceil(seq_q / ROW_BLOCK), heads_q, batch)` (`seq_q` the longest
/// sequence's for a packed layout) and [`ROW_THREADS`] threads on parameters satisfying their
/// type's contract (O, dO, LSE, dLSE, delta and the accumulator of the sizes documented there).
#[inline(always)]
pub(super) unsafe fn preprocess<L: BwdLayout, E: Elem, const D: u32>(pp: &L::Params) {
    let p = L::base(pp);
    let (chunks, lanes) = (D / 8, row_lanes(D));
    const { assert!(row_lanes(D) <= 32 && ROW_BLOCK.is_multiple_of(ROW_THREADS / row_lanes(D))) };
    let per_pass = ROW_THREADS / lanes;
    let tid = index::thread_idx_x();
    let (r0, c) = (tid / lanes, tid % lanes);
    let h = index::block_idx_y();
    // SAFETY: the grid's z is the batch (the caller's contract).
    let seq = unsafe { L::locate(pp, index::block_idx_z()) };
    let seq_q = seq.seq_q(pp);
    let m0 = index::block_idx_x() * ROW_BLOCK;
    for k in 0..ROW_BLOCK / per_pass {
        let i = m0 + r0 + k * per_pass;
        let mut acc = 0.0f32;
        if i < seq_q && c < chunks {
            let o =
                p.o.wrapping_add(seq.q_row(&p.o_strides, h, i) as usize + 8 * c as usize);
            let d_o = p
                .d_o
                .wrapping_add(seq.q_row(&p.do_strides, h, i) as usize + 8 * c as usize);
            // SAFETY: row i < seq_q of the sequence, elements 8 c .. 8 c + 8 < D: inside O and dO, 16-byte
            // aligned (host-checked start and strides).
            let (ov, dv) = unsafe {
                (
                    global::load_nc_v4(o as *const u32),
                    global::load_nc_v4(d_o as *const u32),
                )
            };
            for w in 0..4 {
                let (o0, o1) = E::unpack(ov[w]);
                let (d0, d1) = E::unpack(dv[w]);
                acc += o0 * d0 + o1 * d1;
            }
        }
        let mut step = 1;
        while step < lanes {
            // SAFETY: all 32 lanes execute these shuffles (uniform trip count).
            acc += unsafe { warp::shfl_xor_f32(warp::FULL_MASK, acc, step) };
            step *= 2;
        }
        if i < seq_q {
            let idx = (seq.lse_base(pp, h) + i as u64) as usize;
            if c == 0 {
                // SAFETY: row i < seq_q of this (sequence, head): inside LSE, dLSE (when not null),
                // delta.
                unsafe {
                    let lse = global::load_nc_f32(p.lse.wrapping_add(idx));
                    let d_lse = if p.d_lse.is_null() {
                        0.0
                    } else {
                        global::load_nc_f32(p.d_lse.wrapping_add(idx))
                    };
                    let delta = if lse == f32::NEG_INFINITY {
                        0.0
                    } else {
                        acc - d_lse
                    };
                    *p.delta.wrapping_add(idx) = delta;
                }
            }
            if !p.dq_accum.is_null() && c < chunks {
                let dst = p.dq_accum.wrapping_add(idx * D as usize + 8 * c as usize);
                // SAFETY: row idx of the `[.., D]` f32 accumulator, elements 8 c .. 8 c + 8:
                // inside it, 16-byte aligned (host-allocated, D a multiple of 8).
                unsafe {
                    global::store_v4(dst as *mut u32, [0; 4]);
                    global::store_v4(dst.wrapping_add(4) as *mut u32, [0; 4]);
                }
            }
        }
    }
}

/// `dQ = scale * accumulator`, in the element type, into the strided dQ view.
///
/// # Safety
/// As for [`preprocess`] (grid, threads), with the accumulator and dQ of the sizes documented
/// on the parameters' type.
#[inline(always)]
pub(super) unsafe fn convert<L: BwdLayout, E: Elem, const D: u32>(pp: &L::Params) {
    let p = L::base(pp);
    let (chunks, lanes) = (D / 8, row_lanes(D));
    let per_pass = ROW_THREADS / lanes;
    let tid = index::thread_idx_x();
    let (r0, c) = (tid / lanes, tid % lanes);
    let h = index::block_idx_y();
    // SAFETY: the grid's z is the batch (the caller's contract).
    let seq = unsafe { L::locate(pp, index::block_idx_z()) };
    let seq_q = seq.seq_q(pp);
    let m0 = index::block_idx_x() * ROW_BLOCK;
    for k in 0..ROW_BLOCK / per_pass {
        let i = m0 + r0 + k * per_pass;
        if i < seq_q && c < chunks {
            let idx = (seq.lse_base(pp, h) + i as u64) as usize;
            let src = p.dq_accum.wrapping_add(idx * D as usize + 8 * c as usize);
            // SAFETY: inside the accumulator (as in `preprocess`), 16-byte aligned.
            let (lo, hi) = unsafe {
                (
                    global::load_nc_v4(src as *const u32),
                    global::load_nc_v4(src.wrapping_add(4) as *const u32),
                )
            };
            let x = |w: u32| f32::from_bits(w) * p.scale;
            let out = [
                E::pack(x(lo[0]), x(lo[1])),
                E::pack(x(lo[2]), x(lo[3])),
                E::pack(x(hi[0]), x(hi[1])),
                E::pack(x(hi[2]), x(hi[3])),
            ];
            let dst =
                p.dq.wrapping_add(seq.q_row(&p.dq_strides, h, i) as usize + 8 * c as usize);
            // SAFETY: row i < seq_q of the sequence, elements 8 c .. 8 c + 8: inside dQ, 16-byte aligned.
            unsafe { global::store_v4(dst as *mut u32, out) };
        }
    }
}
