//! The baseline's walk of one segment: the `cp.async` ring of steps, the chunks of each step
//! through the element-wise and matrix phases, and the state in and out (barrier protocol: the
//! baseline's module documentation).

use super::elementwise::elementwise;
use super::matrix::{Lane, matrix, state_index};
use super::tiles::{PaddedChunk, Variants, load_tile};
use crate::arch::{cp_async, index, smem, sync};
use kernel_abi::gla::{
    CHUNK, CHUNKS_PER_STEP, GlaConfig, GlaLayout, GlaParams, SEG_FIRST, SEG_LAST, STEP, Segment,
};

/// The walk of one segment (see the baseline's module documentation). `OUT`: `gla_fwd`
/// (outputs, from the segment's initial state, final state at the end of a sequence); else
/// `gla_states` (from zero, writes `delta` and `decay_log2`; blocks of last segments exit at
/// once).
///
/// # Safety
/// Launched as documented on [`GlaParams`] with the configuration whose layout is `lay` and whose
/// fields the const parameters repeat.
#[inline(always)]
pub(super) unsafe fn walk<
    const DK: u32,
    const DV: u32,
    const THREADS: u32,
    const STAGES: u32,
    const WAIT: u32,
    const P: u32,
    const TPT: usize,
    const NKK: usize,
    const NJ: usize,
    const OUT: bool,
>(
    p: &GlaParams,
    lay: &GlaLayout,
) {
    const { assert!(STAGES >= 2 && WAIT == STAGES - 2 && THREADS == DV * 2) };
    let (slot, head) = (index::block_idx_x(), index::block_idx_y());
    // SAFETY: slot < gridDim.x = entries of the segment table.
    let seg: Segment = unsafe { *p.segments.add(slot as usize) };
    if !OUT && seg.flags & SEG_LAST != 0 {
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

    // Initial state.
    let mut st = [[0.0f32; 4]; NJ];
    let init: *const f32 = if !OUT {
        core::ptr::null()
    } else if seg.flags & SEG_FIRST != 0 {
        if p.has_init != 0 {
            p.init_state.wrapping_add(pair_head)
        } else {
            core::ptr::null()
        }
    } else {
        p.seg_init.wrapping_add(slot_head * state_len)
    };
    if !init.is_null() {
        for j in 0..NJ {
            for e in 0..4 {
                // SAFETY: the state slice of (seq, head) or (slot, head) has DK * DV elements
                // (host-checked sizes); state_index < DK * DV.
                st[j][e] = unsafe { *init.add(state_index::<DV>(&l, j, e)) };
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
    let load = |step: u32, stage: u32| {
        let first = seg.start as u64 + (step * STEP) as u64;
        let valid = (len - step * STEP).min(STEP);
        let (q_s, k_s, g_s, v_s) = raw(stage);
        if OUT {
            load_tile::<DK, STEP, THREADS>(
                q_s,
                p.q.wrapping_add(off * DK as usize),
                first * sk,
                sk,
                valid,
            );
        }
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
            v_s,
            p.v.wrapping_add(off * DV as usize),
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
    let mut total = [0.0f32; 2];
    let rb = const { GlaConfig::row_bytes(DK) };
    let rbv = const { GlaConfig::row_bytes(DV) };
    for step in 0..steps {
        cp_async::wait_group::<WAIT>();
        // SAFETY: barrier A of the protocol; every thread reaches it `steps` times.
        unsafe { sync::sync_threads() };
        let issue = step + STAGES - 1;
        if issue < steps {
            load(issue, issue % STAGES);
        }
        cp_async::commit_group();
        let (q_s, k_s, g_s, v_s) = raw(step % STAGES);
        for cc in 0..CHUNKS_PER_STEP {
            let chunk = step * CHUNKS_PER_STEP + cc;
            if chunk >= chunks {
                break;
            }
            let var = Variants::new(smem, lay, chunk % 2);
            let r0 = cc * CHUNK;
            let tiles = PaddedChunk::<DK> {
                q: q_s + r0 * rb,
                k: k_s + r0 * rb,
                g: g_s + r0 * rb,
                var,
            };
            // SAFETY: all threads (uniform: chunk < chunks is block-uniform); raw rows
            // published by barrier A (zero-filled past the segment's end); the buffer's last
            // readers finished before barrier B of the previous chunk.
            let b15 = unsafe {
                elementwise::<DK, P, TPT, OUT, false>(index::thread_idx_x(), &tiles, CHUNK)
            };
            total[0] += b15[0];
            total[1] += b15[1];
            // SAFETY: barrier B of the protocol (uniform).
            unsafe { sync::sync_threads() };
            let token = seg.start as u64 + (chunk * CHUNK) as u64;
            let o_rows = p
                .o
                .wrapping_add(((token * heads + head as u64) * DV as u64 + l.dv0 as u64) as usize);
            let valid = (len - chunk * CHUNK).min(CHUNK);
            // SAFETY: whole warps, uniform; tiles published by barrier B; o_rows is column dv0 of
            // this head in the chunk's first output row (used only with OUT), rows < valid exist.
            unsafe {
                matrix::<DK, DV, NKK, NJ, OUT>(
                    &l,
                    &var,
                    v_s + r0 * rbv,
                    &mut st,
                    o_rows,
                    (heads * DV as u64) as usize,
                    valid,
                    p.scale,
                )
            };
        }
    }
    cp_async::wait_all();

    let out: *mut f32 = if OUT {
        if seg.flags & SEG_LAST != 0 && p.has_final != 0 {
            p.final_state.wrapping_add(pair_head)
        } else {
            core::ptr::null_mut()
        }
    } else {
        p.delta.wrapping_add(slot_head * state_len)
    };
    if !out.is_null() {
        for j in 0..NJ {
            for e in 0..4 {
                // SAFETY: this block's own state slice (final state of its sequence, or its
                // segment's delta), DK * DV elements; state_index < DK * DV.
                unsafe { *out.add(state_index::<DV>(&l, j, e)) = st[j][e] };
            }
        }
    }
    if !OUT {
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
    }
}
