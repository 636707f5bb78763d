//! The reverse pass's walk of one segment: the `cp.async` ring of steps (issued from the
//! segment's end), the chunks of each step (last first) through the element-wise phase, dv
//! and the gradient update, the gradient stored before every block of
//! [`G_BLOCK`](kernel_abi::gla::backward::G_BLOCK) tokens, and the gradient of the segment's
//! initial state at the end (barrier protocol: the module documentation).

use super::super::baseline::matrix::{Lane, matrix, state_index};
use super::super::baseline::tiles::{Variants, load_tile};
use super::dv::dv_chunk;
use super::elementwise::elementwise;
use crate::arch::{cp_async, index, smem, sync};
use kernel_abi::gla::backward::{CHUNKS_PER_G_BLOCK, DhdvParams, grad_slot};
use kernel_abi::gla::{
    CHUNK, CHUNKS_PER_STEP, GlaConfig, GlaLayout, SEG_FIRST, SEG_LAST, STEP, Segment,
};

/// Store the warp's part of the gradient `st` (the `S^T` accumulator layout of the forward's
/// state) into the `DK x DV` slice at `dst`.
///
/// # Safety
/// `dst` is a `DK * DV` slice of f32 that only this block writes.
#[inline(always)]
unsafe fn store_state<const DV: u32, const NJ: usize>(
    l: &Lane,
    st: &[[f32; 4]; NJ],
    dst: *mut f32,
) {
    for j in 0..NJ {
        for e in 0..4 {
            // SAFETY: state_index < DK * DV (the caller's slice).
            unsafe { *dst.add(state_index::<DV>(l, j, e)) = st[j][e] };
        }
    }
}

/// The reverse walk of one segment (see the module documentation). `FULL`: `gla_bwd_dhdv`
/// (from the segment's end gradient: dv, stored gradients, the initial-state gradient of a
/// first segment); else `gla_bwd_states` (from zero: `delta` and `decay_log2`; blocks of first
/// segments exit at once).
///
/// # Safety
/// Launched as documented on [`DhdvParams`] with the configuration whose layout is `lay` and whose
/// fields the const parameters repeat; the segment table holds consecutive disjoint segments.
#[inline(always)]
pub(super) unsafe fn walk_dhdv<
    const DK: u32,
    const DV: u32,
    const THREADS: u32,
    const STAGES: u32,
    const WAIT: u32,
    const P: u32,
    const TPT: usize,
    const NKK: usize,
    const NJ: usize,
    const FULL: bool,
>(
    p: &DhdvParams,
    lay: &GlaLayout,
) {
    const { assert!(STAGES >= 2 && WAIT == STAGES - 2 && THREADS == DV * 2) };
    let (slot, head) = (index::block_idx_x(), index::block_idx_y());
    // SAFETY: slot < gridDim.x = entries of the segment table.
    let seg: Segment = unsafe { *p.segments.add(slot as usize) };
    if !FULL && seg.flags & SEG_FIRST != 0 {
        return;
    }
    let lane = index::lane_id();
    let l = Lane {
        lane,
        g: lane / 4,
        t: lane % 4,
        dv0: index::warp_id() * 16,
    };
    let heads = p.heads as u64;
    let state_len = (DK * DV) as usize;
    let pair_head = (seg.seq as u64 * heads + head as u64) as usize * state_len;
    let slot_head = (slot as u64 * heads + head as u64) as usize;
    let grad_at = |j: u32| {
        let s = grad_slot(seg.start, slot, j) as u64;
        p.grad
            .wrapping_add((s * heads + head as u64) as usize * state_len)
    };

    // The gradient of the segment's end state.
    let mut st = [[0.0f32; 4]; NJ];
    let end: *const f32 = if !FULL {
        core::ptr::null()
    } else if seg.flags & SEG_LAST != 0 {
        if p.has_d_final != 0 {
            p.d_final_state.wrapping_add(pair_head)
        } else {
            core::ptr::null()
        }
    } else {
        p.seg_end.wrapping_add(slot_head * state_len)
    };
    if !end.is_null() {
        for j in 0..NJ {
            for e in 0..4 {
                // SAFETY: the state slice of (seq, head) or (slot, head) has DK * DV elements
                // (host-checked sizes); state_index < DK * DV.
                st[j][e] = unsafe { *end.add(state_index::<DV>(&l, j, e)) };
            }
        }
    }

    let smem = smem::aligned_base();
    let raw = |s: u32| {
        let at = smem + s * lay.stage_bytes;
        (at + lay.q, at + lay.k, at + lay.g, at + lay.v)
    };
    let len = seg.len;
    let steps = len.div_ceil(STEP);
    let chunks = len.div_ceil(CHUNK);
    let (sk, sv) = (heads * DK as u64, heads * DV as u64);
    let off = head as usize;
    // The i-th step of the walk is step `steps - 1 - i` of the segment.
    let load = |i: u32, stage: u32| {
        let step = steps - 1 - i;
        let first = seg.start as u64 + (step * STEP) as u64;
        let valid = (len - step * STEP).min(STEP);
        let (q_s, k_s, g_s, o_s) = raw(stage);
        load_tile::<DK, STEP, THREADS>(
            q_s,
            p.q.wrapping_add(off * DK as usize),
            first * sk,
            sk,
            valid,
        );
        load_tile::<DK, STEP, THREADS>(
            k_s,
            p.k.wrapping_add(off * DK as usize),
            first * sk,
            sk,
            valid,
        );
        load_tile::<DK, STEP, THREADS>(
            g_s,
            p.g.wrapping_add(off * DK as usize),
            first * sk,
            sk,
            valid,
        );
        load_tile::<DV, STEP, THREADS>(
            o_s,
            p.d_o.wrapping_add(off * DV as usize),
            first * sv,
            sv,
            valid,
        );
    };
    for s in 0..STAGES - 1 {
        if s < steps {
            load(s, s);
        }
        cp_async::commit_group();
    }
    let rb = const { GlaConfig::row_bytes(DK) };
    let rbv = const { GlaConfig::row_bytes(DV) };
    let mut total = [0.0f32; 2];
    for i in 0..steps {
        cp_async::wait_group::<WAIT>();
        // SAFETY: barrier A of the protocol; every thread reaches it `steps` times.
        unsafe { sync::sync_threads() };
        let issue = i + STAGES - 1;
        if issue < steps {
            load(issue, issue % STAGES);
        }
        cp_async::commit_group();
        let step = steps - 1 - i;
        let (q_s, k_s, g_s, o_s) = raw(i % STAGES);
        for cc in (0..CHUNKS_PER_STEP).rev() {
            let chunk = step * CHUNKS_PER_STEP + cc;
            if chunk >= chunks {
                continue;
            }
            // Before the last chunk of a block (walking backward: its first), `st` is the
            // gradient at the block's end from everything after it.
            if FULL && (chunk % CHUNKS_PER_G_BLOCK == CHUNKS_PER_G_BLOCK - 1 || chunk == chunks - 1)
            {
                // SAFETY: the slot of block chunk / 4 of this segment, this block's own.
                unsafe { store_state::<DV, NJ>(&l, &st, grad_at(chunk / CHUNKS_PER_G_BLOCK)) };
            }
            let var = Variants::new(smem, lay, chunk % 2);
            let r0 = cc * CHUNK;
            // SAFETY: all threads (uniform: `chunk` is block-uniform); raw rows published by
            // barrier A (zero-filled past the segment's end); the buffer's last readers
            // finished before barrier B of the previous chunk of the walk.
            let b15 = unsafe {
                elementwise::<DK, P, TPT>(
                    index::thread_idx_x(),
                    [q_s + r0 * rb, k_s + r0 * rb, g_s + r0 * rb],
                    &var,
                    p.scale,
                )
            };
            total[0] += b15[0];
            total[1] += b15[1];
            // SAFETY: barrier B of the protocol (uniform).
            unsafe { sync::sync_threads() };
            let token = seg.start as u64 + (chunk * CHUNK) as u64;
            let dv_rows = p
                .d_v
                .wrapping_add(((token * heads + head as u64) * DV as u64 + l.dv0 as u64) as usize);
            if FULL {
                // SAFETY: whole warps, uniform; tiles and dO rows published by barrier B;
                // dv_rows is column dv0 of this head in the chunk's first row of dv, rows <
                // valid exist.
                unsafe {
                    dv_chunk::<DK, DV, NKK, NJ>(
                        &l,
                        &var,
                        o_s + r0 * rbv,
                        &st,
                        dv_rows,
                        (heads * DV as u64) as usize,
                        (len - chunk * CHUNK).min(CHUNK),
                    )
                };
            }
            // G^T = 2^{b_15} G^T + dO^T (scale q 2^b): the forward's state update with dO for
            // v and the scaled decayed queries for k_state.
            // SAFETY: whole warps, uniform; tiles published by barrier B; no output rows.
            unsafe {
                matrix::<DK, DV, NKK, NJ, false>(
                    &l,
                    &var,
                    o_s + r0 * rbv,
                    &mut st,
                    core::ptr::null_mut(),
                    0,
                    0,
                    1.0,
                )
            };
        }
    }
    cp_async::wait_all();

    if !FULL {
        // SAFETY: this block's own slice of delta, DK * DV elements (host-checked size).
        unsafe { store_state::<DV, NJ>(&l, &st, p.delta.wrapping_add(slot_head * state_len)) };
        let tid = index::thread_idx_x();
        if tid % P == P - 1 {
            let dst = p
                .decay_log2
                .wrapping_add(slot_head * DK as usize + 2 * (tid / P) as usize);
            // SAFETY: channels 2 (tid / P), +1 < DK of this segment's decay row; one writer.
            unsafe {
                *dst = total[0];
                *dst.add(1) = total[1];
            }
        }
    } else if seg.flags & SEG_FIRST != 0 {
        // SAFETY: the (seq, head) slice of the initial-state gradients, DK * DV elements
        // (host-checked size), written only by this sequence's first segment.
        unsafe { store_state::<DV, NJ>(&l, &st, p.d_init_state.wrapping_add(pair_head)) };
    }
}
