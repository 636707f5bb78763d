//! `attention_decode_combine_{bf16,f16}_d{D}`: the splits of a decode step merged by their LSE
//! (flash-decoding's second pass). One warp per output row `(sequence, head, token)`: the lanes
//! take the splits' LSE 32 at a time for the maximum and the weights' sum, then each lane sums
//! its columns of the splits' partial outputs with weights `exp(lse_s - max) / sum`.
//!
//! With `CAPSINK` the row's sink (if any) joins as one more split whose output is 0.
//!
//! No barrier: each warp reads and writes only its own row.

use super::super::elem::Elem;
use crate::arch::{index, math, warp};
use kernel_abi::attention::decode::{AttentionDecodeCombineParams, COMBINE_WARPS};

/// The combine kernel's body; see the module documentation.
///
/// # Safety
/// Launched with `ceil(rows / COMBINE_WARPS)` blocks of `COMBINE_THREADS` on parameters
/// satisfying [`AttentionDecodeCombineParams`]'s contract.
#[inline(always)]
pub(super) unsafe fn combine<E: Elem, const D: u32, const CAPSINK: bool>(
    p: &AttentionDecodeCombineParams,
) {
    let lane = index::lane_id();
    let rows = p.batch * p.heads_q * p.seq_q;
    let row = index::block_idx_x() * COMBINE_WARPS + index::warp_id();
    // Warp-uniform: a warp past the last row has nothing to do (no shuffle is skipped by part
    // of a warp).
    if row >= rows {
        return;
    }
    let splits = p.num_splits;
    // Row `(b, head, token)` of the `[batch, heads_q, seq_q]` order.
    let token = row % p.seq_q;
    let head = (row / p.seq_q) % p.heads_q;
    let b = row / (p.seq_q * p.heads_q);
    // The sink (natural log; -inf without sinks) joins as one more split with no value.
    let sink = if CAPSINK && !p.logits.sinks.is_null() {
        // SAFETY: head < heads_q: inside `sinks` (the contract).
        unsafe { *p.logits.sinks.add(head as usize) }
    } else {
        f32::NEG_INFINITY
    };
    let lse_of = |s: u32| {
        // SAFETY: s < num_splits and row < rows: inside `[num_splits, rows]`.
        unsafe {
            *p.lse_partial
                .add((s as u64 * rows as u64 + row as u64) as usize)
        }
    };
    let mut m = sink;
    let mut s = lane;
    while s < splits {
        m = m.max(lse_of(s));
        s += 32;
    }
    // SAFETY: all 32 lanes of the warp execute it (uniform control flow).
    m = unsafe { warp::max_f32(m) };
    let reference = if m == f32::NEG_INFINITY { 0.0 } else { m };
    let mut l = 0.0f32;
    let mut s = lane;
    while s < splits {
        l += math::exp(lse_of(s) - reference);
        s += 32;
    }
    // SAFETY: as above.
    l = unsafe { warp::sum_f32(l) };
    if CAPSINK {
        l += math::exp(sink - reference);
    }
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
    let dst = p.o.wrapping_add(
        (b as u64 * p.o_strides[0] + token as u64 * p.o_strides[1] + head as u64 * p.o_strides[2])
            as usize,
    );
    let mut c = 2 * lane;
    while c < D {
        let mut acc = [0.0f32; 2];
        for s in 0..splits {
            let w = math::exp(lse_of(s) - reference) * inv;
            let at = (s as u64 * rows as u64 + row as u64) * D as u64 + c as u64;
            // SAFETY: inside `[num_splits, rows, D]` (c + 1 < D).
            unsafe {
                acc[0] += w * *p.o_partial.add(at as usize);
                acc[1] += w * *p.o_partial.add(at as usize + 1);
            }
        }
        // SAFETY: b < batch, token < seq_q, head < heads_q, c + 1 < D: inside O, 4-byte aligned.
        unsafe { *(dst.wrapping_add(c as usize) as *mut u32) = E::pack(acc[0], acc[1]) };
        c += 64;
    }
    if lane == 0 {
        let lse = if l > 0.0 {
            reference + math::ln(l)
        } else {
            f32::NEG_INFINITY
        };
        // SAFETY: row < rows: inside LSE `[batch, heads_q, seq_q]`.
        unsafe { *p.lse.add(row as usize) = lse };
    }
}
