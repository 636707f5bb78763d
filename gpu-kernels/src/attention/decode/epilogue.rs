//! The decode kernel's epilogue: the four warps' online-softmax states (each over its own
//! slices of the keys) merged through shared memory, then O and LSE written (one split), or the
//! split's normalized partial output and LSE (several). With `CAPSINK` and one split, the row's
//! sink joins here ([`finish_row`]); with several, in the combine kernel.

use super::super::elem::Elem;
use super::super::logits::{self, finish_row};
use super::pages::Place;
use crate::arch::smem::SmemArray;
use crate::arch::{index, math, sync, warp};
use kernel_abi::attention::decode::{
    AttentionDecodeParams, DECODE_BLOCK_M, DECODE_THREADS, DECODE_WARPS, DecodeConfig,
};

/// Merge the warps' states and write the block's rows. `o`, `row_max`, `row_sum`: this
/// thread's accumulators (rows `g`, `g + 8` of the block, columns `8 d + 2 t`, `+ 1`), the
/// maxima in base-2 units, the sums not yet reduced across the quad.
///
/// # Safety
/// Called by every thread of the block after its last `cp.async` group completed
/// (`wait_all`); the ring's memory is then reused (the first barrier here orders every warp's
/// last reads of it before the writes).
#[inline(always)]
pub(super) unsafe fn finish<E: Elem, const D: u32, const DT: usize, const CAPSINK: bool>(
    p: &AttentionDecodeParams,
    cfg: &DecodeConfig,
    smem: u32,
    at: &Place,
    o: &[[f32; 4]; DT],
    row_max: &[f32; 2],
    row_sum: &[f32; 2],
) {
    let (lane, w, split) = (index::lane_id(), index::warp_id(), index::block_idx_x());
    let (g, t) = (lane / 4, lane % 4);
    let stride = cfg.partial_row_floats();
    let rows = DECODE_BLOCK_M;
    let po = SmemArray::<f32>::new(smem + cfg.partial_o_offset(), DECODE_WARPS * rows * stride);
    let ml = SmemArray::<f32>::new(smem + cfg.partial_ml_offset(), 2 * DECODE_WARPS * rows);
    // SAFETY: every thread of the block arrives here once (uniform control flow).
    unsafe { sync::sync_threads() };
    for h in 0..2 {
        let mut sum = row_sum[h];
        // SAFETY: all 32 lanes execute these shuffles.
        unsafe {
            sum += warp::shfl_xor_f32(warp::FULL_MASK, sum, 1);
            sum += warp::shfl_xor_f32(warp::FULL_MASK, sum, 2);
        }
        let r = g + 8 * h as u32;
        // SAFETY: indices inside the arrays (w < 4, r < 16, columns < D); each element has one
        // writer; the barrier above ordered the ring's last reads, the one below publishes.
        unsafe {
            if t == 0 {
                ml.store(w * rows + r, row_max[h]);
                ml.store((DECODE_WARPS + w) * rows + r, sum);
            }
            for d in 0..DT {
                let at = (w * rows + r) * stride + 8 * d as u32 + 2 * t;
                po.store(at, o[d][2 * h]);
                po.store(at + 1, o[d][2 * h + 1]);
            }
        }
    }
    // SAFETY: as above.
    unsafe { sync::sync_threads() };
    // Thread `tid` writes column pairs `tid + k THREADS` of the block's rows in row-major order.
    let pairs = D / 2;
    let tid = index::thread_idx_x();
    const { assert!((DECODE_BLOCK_M * (D / 2)).is_multiple_of(DECODE_THREADS)) };
    for k in 0..rows * pairs / DECODE_THREADS {
        let i = tid + k * DECODE_THREADS;
        let (r, c) = (i / pairs, 2 * (i % pairs));
        if r >= at.rows_valid {
            continue;
        }
        let (mut m, mut l, mut acc) = (f32::NEG_INFINITY, 0.0f32, [0.0f32; 2]);
        // SAFETY: reads of the arrays published by the barrier above, indices inside them.
        unsafe {
            for v in 0..DECODE_WARPS {
                m = m.max(ml.load(v * rows + r));
            }
            let reference = if m == f32::NEG_INFINITY { 0.0 } else { m };
            for v in 0..DECODE_WARPS {
                let f = math::exp2(ml.load(v * rows + r) - reference);
                l += f * ml.load((DECODE_WARPS + v) * rows + r);
                let at = (v * rows + r) * stride + c;
                acc[0] += f * po.load(at);
                acc[1] += f * po.load(at + 1);
            }
            m = reference;
        }
        let (token, head) = at.row(r);
        let (inv, lse) = if CAPSINK && p.num_splits == 1 {
            // SAFETY: head < heads_q: inside `sinks` when it is not null (the contract).
            finish_row(m, l, unsafe { logits::sink_log2(&p.logits, head) })
        } else if l > 0.0 {
            (1.0 / l, (m + math::log2(l)) * math::LN_2)
        } else {
            (0.0, f32::NEG_INFINITY)
        };
        let row_index = (at.b * p.heads_q + head) * p.seq_q + token;
        if p.num_splits == 1 {
            let dst = p.o.wrapping_add(
                (at.b as u64 * p.o_strides[0]
                    + token as u64 * p.o_strides[1]
                    + head as u64 * p.o_strides[2]
                    + c as u64) as usize,
            );
            // SAFETY: b < batch, token < seq_q, head < heads_q, c + 1 < D: inside O (host-checked
            // view), 4-byte aligned (aligned rows, even column); the LSE index is inside
            // `[batch, heads_q, seq_q]`.
            unsafe {
                *(dst as *mut u32) = E::pack(acc[0] * inv, acc[1] * inv);
                if c == 0 {
                    *p.lse.add(row_index as usize) = lse;
                }
            }
        } else {
            let row = split as u64 * (p.batch * p.heads_q * p.seq_q) as u64 + row_index as u64;
            // SAFETY: split < num_splits and the row inside `[batch, heads_q, seq_q]`: inside the
            // partial buffers the host sized for `num_splits`; 8-byte aligned (even column, D
            // even).
            unsafe {
                let dst = p.o_partial.add((row * D as u64) as usize + c as usize);
                *dst = acc[0] * inv;
                *dst.add(1) = acc[1] * inv;
                if c == 0 {
                    *p.lse_partial.add(row as usize) = lse;
                }
            }
        }
    }
}
