//! The row-wise kernels of the backward: the preprocess (`delta'` and the zeroed dQ
//! accumulator), the dQ conversion (accumulator times the scale to the element type) and the
//! sinks' gradient ([`dsinks`], whose mapping and barrier protocol are documented there).
//!
//! # Thread mapping (preprocess and conversion)
//! A block covers [`ROW_BLOCK`] query rows of one (sequence, head) with `L` lanes per row (`D /
//! 8` rounded up to a power of two, at most 32): thread `tid` handles 16-byte chunk `c = tid %
//! L` (8 elements; none when `c >= D / 8`) of rows `tid / L + k (ROW_THREADS / L)`. The lanes of
//! a row are consecutive lanes of one warp, so the row's dot product reduces with `xor`
//! shuffles. No shared memory, no barrier.

use super::super::elem::Elem;
use super::super::logits;
use super::layout::BwdLayout;
use crate::arch::{global, index, math, smem, sync, warp};
use kernel_abi::WARP_SIZE;
use kernel_abi::attention::backward::{DSINKS_THREADS, ROW_BLOCK, ROW_THREADS};
use kernel_abi::attention::hopper_bwd::{HOPPER_DQ_TILE_ROWS, dq_accum_rows};

/// Lanes per row of the row kernels: `D / 8` 16-byte chunks, rounded up to a power of two.
const fn row_lanes(d: u32) -> u32 {
    (d / 8).next_power_of_two()
}

/// `delta'[b, h, i] = sum_d dO O - dLSE` (0 where LSE is -inf: such a row has no allowed key,
/// its P is 0, and a non-finite dLSE must not reach its `dS = P (dP - delta')`); the dQ
/// accumulator's rows zeroed when it is not null (in the tiled layout with the padding rows
/// of the last tile: `ROW_BLOCK` is the tiles' height, so the grid covers them), and the
/// tile's order counter when `dq_order` is not null. Over packed sequences the tiled layout
/// is [`kernel_abi::attention::hopper_bwd::dq_accum_varlen_row0`]'s, its tiles those of the
/// sequence's rows up to the longest length (as the Hopper kernels clamp it).
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
        let idx = (seq.lse_base(pp, h) + i as u64) as usize;
        if i < seq_q && c == 0 {
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
        // The accumulator's row of query row i: as LSE's, or in the tiled layout one of
        // `dq_accum_rows(seq_q)` rows per (sequence, head), padding rows included (they
        // receive the padded tiles' zero rows).
        // The tiled layout's rows are `dq_accum_tiled` wide (the Hopper kernel's head
        // dimension, above D in a padded plan): the row's lanes zero its chunks in turn.
        let (acc_row, acc_rows, width) = if p.dq_accum_tiled != 0 {
            (
                seq.accum_row0(pp, h) + i as u64,
                dq_accum_rows(seq_q.min(p.seq_q)),
                p.dq_accum_tiled,
            )
        } else {
            (idx as u64, seq_q, D)
        };
        if !p.dq_accum.is_null() && i < acc_rows {
            let mut chunk = c;
            while chunk < width / 8 {
                let dst = p
                    .dq_accum
                    .wrapping_add(acc_row as usize * width as usize + 8 * chunk as usize);
                // SAFETY: row `acc_row` of the `[.., width]` f32 accumulator, elements 8 chunk
                // .. 8 chunk + 8: inside it (the tiled layout's rows per head cover the grid's
                // rows), 16-byte aligned (host-allocated, the width a multiple of 8).
                unsafe {
                    global::store_v4(dst as *mut u32, [0; 4]);
                    global::store_v4(dst.wrapping_add(4) as *mut u32, [0; 4]);
                }
                chunk += lanes;
            }
        }
    }
    // A block of a packed sequence past its tiles has no counter.
    let has_tile = !L::MAY_BE_PAST_END || m0 < seq_q.min(p.seq_q);
    if !p.dq_order.is_null() && tid == 0 && has_tile {
        // The counter of the block's accumulator tile (deterministic mode: the tiled layout,
        // whose tiles are the blocks' rows).
        const { assert!(ROW_BLOCK == HOPPER_DQ_TILE_ROWS) };
        let at = (seq.accum_row0(pp, h) + m0 as u64) / HOPPER_DQ_TILE_ROWS as u64;
        // SAFETY: the counters cover every tile of every (sequence, head) (host-sized), one
        // writer each.
        unsafe { *p.dq_order.wrapping_add(at as usize) = 0 };
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

/// The sinks' gradient of query head `blockIdx.x`: `d_sinks[h] = -sum exp(sink_h - LSE_i)
/// delta'_i` over every row `i` of head `h` in every sequence (rows below `seq_q`, the longest
/// length, as the preprocess; `delta' = rowsum(dO O) - dLSE`,
/// so each term is `P_sink (dLSE - rowsum(dO O))`; a row whose LSE is -inf adds nothing).
///
/// # Thread mapping
/// Thread `tid` sums rows `tid, tid + DSINKS_THREADS, ..` of each sequence in turn; each warp
/// reduces its lanes with `xor` shuffles, and thread 0 adds the warps' sums in warp order: the
/// order of every addition is fixed, so the result is bitwise reproducible.
///
/// # Barrier protocol
/// Lane 0 of each warp stores the warp's sum into shared word `warp`; one `sync_threads`
/// publishes the words; thread 0 reads them. Every thread reaches the barrier once.
///
/// # Safety
/// Launched with grid `(heads_q, 1, 1)`, [`DSINKS_THREADS`] threads and one f32 of shared
/// memory per warp, after the preprocess of the same launch sequence, on parameters satisfying
/// their type's contract with sinks and `d_sinks` of `heads_q` values.
#[inline(always)]
pub(super) unsafe fn dsinks<L: BwdLayout>(pp: &L::Params) {
    let p = L::base(pp);
    let tid = index::thread_idx_x();
    let h = index::block_idx_x();
    // SAFETY: `h < heads_q` (the grid) and the sinks hold `heads_q` values (the contract).
    let sink2 = unsafe { logits::sink_log2(&p.logits, h) };
    let mut acc = 0.0f32;
    for b in 0..p.batch {
        // SAFETY: `b < batch`.
        let seq = unsafe { L::locate(pp, b) };
        let base = seq.lse_base(pp, h);
        // Rows past the longest length (contents longer than stated) have no `delta'`.
        let rows = seq.seq_q(pp).min(p.seq_q);
        let mut i = tid;
        while i < rows {
            let idx = (base + i as u64) as usize;
            // SAFETY: row i < seq_q of this (sequence, head): inside LSE and delta'.
            let (lse, delta) = unsafe {
                (
                    global::load_nc_f32(p.lse.wrapping_add(idx)),
                    global::load_nc_f32(p.delta.wrapping_add(idx)),
                )
            };
            if lse != f32::NEG_INFINITY {
                acc = math::fma(-math::exp2(sink2 - lse * math::LOG2_E), delta, acc);
            }
            i += DSINKS_THREADS;
        }
    }
    let mut step = 16;
    while step > 0 {
        // SAFETY: all 32 lanes execute these shuffles (uniform trip count).
        acc += unsafe { warp::shfl_xor_f32(warp::FULL_MASK, acc, step) };
        step /= 2;
    }
    let sums = smem::dynamic_base();
    let w = tid / WARP_SIZE;
    if tid.is_multiple_of(WARP_SIZE) {
        // SAFETY: word `w` < DSINKS_THREADS / 32 of the block's shared memory; one writer.
        unsafe { smem::SmemValue::store(sums + 4 * w, acc) };
    }
    // SAFETY: the protocol's one barrier, reached by every thread.
    unsafe { sync::sync_threads() };
    if tid == 0 {
        let mut total = 0.0f32;
        for k in 0..DSINKS_THREADS / WARP_SIZE {
            // SAFETY: published by the barrier.
            total += unsafe { <f32 as smem::SmemValue>::load(sums + 4 * k) };
        }
        // SAFETY: `h < heads_q`: inside `d_sinks` (the contract).
        unsafe { *p.d_sinks.add(h as usize) = total };
    }
}
