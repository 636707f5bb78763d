//! `gla_bwd_dqkg`: dq, dk and dg of one segment, token by token, with the state (then its
//! gradient) in registers: a forward walk for dq and a reverse walk for dk and dg (see the
//! module documentation and `kernel_abi::gla::backward`).
//!
//! # Thread mapping
//! [`DQKG_LANES`] consecutive lanes per key channel: thread `tid` owns row `d = tid /
//! DQKG_LANES` of the `DK x DV` state and its columns `e = tid % DQKG_LANES + DQKG_LANES j`,
//! `j < DV / DQKG_LANES` (`NE`). A row's dot products over the value columns are summed over its
//! lanes with `shfl.xor`; the row's first lane writes its dq, dk and dg.
//!
//! # Barrier protocol (all `bar.sync 0`, reached uniformly by every thread of the block)
//! Per staged step (forward walk, then reverse walk), two barriers: the first says that every
//! thread finished reading the previous step's rows, so the block overwrites them; the second
//! publishes the new rows (f32, zero past the segment's end). Between them the threads only
//! load and store staged rows; after the second they only read them. Global memory is written
//! only by the row's first lane (its channel's dq, dk, dg of the segment's tokens): the reverse
//! walk reads back the `q dq` the same thread left in dg during the forward walk (program
//! order, no other writer).

use crate::arch::smem::SmemValue;
use crate::arch::{convert, index, math, smem, sync, warp};
use kernel_abi::gla::backward::{DQKG_LANES, DQKG_STEP, DqkgParams, dqkg_layout};
use kernel_abi::gla::{G_FLOOR, SEG_FIRST, SEG_LAST, Segment};

/// Sum of `v` over the [`DQKG_LANES`] lanes of a key channel, returned to each of them.
///
/// # Safety
/// All 32 lanes of the warp execute the call.
#[inline(always)]
unsafe fn row_sum(mut v: f32) -> f32 {
    let mut m = 1;
    while m < DQKG_LANES {
        // SAFETY: forwarded to the caller (full warp).
        v += unsafe { warp::shfl_xor_f32(warp::FULL_MASK, v, m) };
        m *= 2;
    }
    v
}

/// Stage the rows of tokens `first .. first + DQKG_STEP` of the segment (token rows
/// `seg.start + first ..`, `valid` of them inside it) of q, k, g, v, dO as f32 at `base`
/// (layout [`dqkg_layout`]), zero past `valid`.
///
/// # Safety
/// Every thread of the block calls it between the two barriers of the step; the tensors have
/// the rows of the segment (host-checked sizes).
#[inline(always)]
unsafe fn stage<const DK: u32, const DV: u32, const THREADS: u32>(
    p: &DqkgParams,
    head: u32,
    row0: u64,
    valid: u32,
    base: u32,
) {
    let lay = const { dqkg_layout(DK, DV) };
    let heads = p.heads as u64;
    // Pairs of elements per token: q, k, g (DK / 2 each), v, dO (DV / 2 each).
    let (pk, pv) = (DK / 2, DV / 2);
    let per_token = 3 * pk + 2 * pv;
    let mut i = index::thread_idx_x();
    while i < DQKG_STEP * per_token {
        let (tok, w) = (i / per_token, i % per_token);
        let (src, d, c, dst) = if w < 3 * pk {
            let which = w / pk;
            let src = match which {
                0 => p.q,
                1 => p.k,
                _ => p.g,
            };
            (src, DK, 2 * (w % pk), which * lay[1])
        } else {
            let which = (w - 3 * pk) / pv;
            let src = if which == 0 { p.v } else { p.d_o };
            (
                src,
                DV,
                2 * ((w - 3 * pk) % pv),
                lay[3] + which * (lay[4] - lay[3]),
            )
        };
        let (lo, hi) = if tok < valid {
            let at = ((row0 + tok as u64) * heads + head as u64) * d as u64 + c as u64;
            // SAFETY: token row inside the segment, channel pair c, c + 1 < d of this head:
            // inside the tensor (host-checked sizes); 4-byte aligned (even element of a
            // contiguous, aligned tensor).
            convert::unpack_bf16x2(unsafe { *(src.wrapping_add(at as usize) as *const u32) })
        } else {
            (0.0, 0.0)
        };
        let at = base + dst + 4 * (tok * d + c);
        // SAFETY: inside the staged rows (`tok < DQKG_STEP`, `c + 1 < d`); one writer per
        // element between the step's barriers.
        unsafe {
            f32::store(at, lo);
            f32::store(at + 4, hi);
        }
        i += THREADS;
    }
}

/// The body of `gla_bwd_dqkg` for one head-dimension pair (`NE = DV / DQKG_LANES`).
///
/// # Safety
/// Launched as documented on [`DqkgParams`]; the segment table holds consecutive disjoint
/// segments; `seg_init` (segments that are not first) and `seg_end` (segments that are not
/// last) were written by the launches before.
#[inline(always)]
pub(super) unsafe fn dqkg<const DK: u32, const DV: u32, const THREADS: u32, const NE: usize>(
    p: &DqkgParams,
) {
    const { assert!(THREADS == DK * DQKG_LANES && NE as u32 * DQKG_LANES == DV) };
    let lay = const { dqkg_layout(DK, DV) };
    let (slot, head) = (index::block_idx_x(), index::block_idx_y());
    // SAFETY: slot < gridDim.x = entries of the segment table.
    let seg: Segment = unsafe { *p.segments.add(slot as usize) };
    let tid = index::thread_idx_x();
    let (row, part) = (tid / DQKG_LANES, tid % DQKG_LANES);
    let heads = p.heads as u64;
    let state_len = (DK * DV) as usize;
    let pair_head = (seg.seq as u64 * heads + head as u64) as usize * state_len;
    let slot_head = (slot as u64 * heads + head as u64) as usize * state_len;
    let elem = |j: usize| (row * DV + part + DQKG_LANES * j as u32) as usize;
    let col = |j: usize| 4 * (part + DQKG_LANES * j as u32);
    let base = smem::aligned_base();
    let (q_s, k_s, g_s, v_s, o_s) = (
        base + lay[0] + 4 * row,
        base + lay[1] + 4 * row,
        base + lay[2] + 4 * row,
        base + lay[3],
        base + lay[4],
    );
    let floor2 = G_FLOOR * math::LOG2_E;
    let len = seg.len;
    let steps = len.div_ceil(DQKG_STEP);
    // The element of this row's channel in a `[rows, heads, DK]` tensor at token row `t`.
    let at_qk = |t: u64| ((t * heads + head as u64) * DK as u64 + row as u64) as usize;
    // Barriers of a step (uniform: `step` and `len` are block-uniform).
    let load_step = |step: u32| {
        // SAFETY: first barrier of the step (every thread, uniformly).
        unsafe { sync::sync_threads() };
        let first = step * DQKG_STEP;
        // SAFETY: between the step's barriers, every thread; rows of the segment.
        unsafe {
            stage::<DK, DV, THREADS>(
                p,
                head,
                seg.start as u64 + first as u64,
                (len - first).min(DQKG_STEP),
                base,
            )
        };
        // SAFETY: second barrier of the step.
        unsafe { sync::sync_threads() };
    };

    // The gradient of the segment's end state (`G_E`: from everything after the segment).
    let end: *const f32 = if seg.flags & SEG_LAST == 0 {
        p.seg_end.wrapping_add(slot_head)
    } else if p.has_d_final != 0 {
        p.d_final_state.wrapping_add(pair_head)
    } else {
        core::ptr::null()
    };

    // Forward walk: S from the segment's initial state; dq, and `q dq'` into dg.
    let mut s = [0.0f32; NE];
    let init: *const f32 = if seg.flags & SEG_FIRST == 0 {
        p.seg_init.wrapping_add(slot_head)
    } else if p.has_init != 0 {
        p.init_state.wrapping_add(pair_head)
    } else {
        core::ptr::null()
    };
    if !init.is_null() {
        for j in 0..NE {
            // SAFETY: the (segment or sequence, head) state slice has DK * DV elements
            // (host-checked sizes), elem(j) < DK * DV.
            s[j] = unsafe { *init.add(elem(j)) };
        }
    }
    let mut gs = [0.0f32; NE];
    // rowsum(a_E S_{E-1} * G_E): what the segment's log-decays give through its end state,
    // less the last token's own term (`k_E dk'_E`, left out of the reverse sum too).
    let mut through_end = 0.0f32;
    for step in 0..steps {
        load_step(step);
        let first = step * DQKG_STEP;
        for i in 0..(len - first).min(DQKG_STEP) {
            // SAFETY: staged rows, published by the step's second barrier.
            let (q, k, g) = unsafe {
                (
                    f32::load(q_s + 4 * i * DK),
                    f32::load(k_s + 4 * i * DK),
                    f32::load(g_s + 4 * i * DK),
                )
            };
            let a = math::exp2((g * math::LOG2_E).max(floor2));
            let last = first + i == len - 1;
            if last && !end.is_null() {
                for j in 0..NE {
                    // SAFETY: as for `init`.
                    gs[j] = unsafe { *end.add(elem(j)) };
                }
            }
            let (mut past, mut own) = (0.0f32, 0.0f32);
            for j in 0..NE {
                // SAFETY: staged rows, published.
                let (v, d_o) = unsafe {
                    (
                        f32::load(v_s + 4 * i * DV + col(j)),
                        f32::load(o_s + 4 * i * DV + col(j)),
                    )
                };
                let decayed = a * s[j];
                past = math::fma(d_o, decayed, past);
                own = math::fma(d_o, v, own);
                if last {
                    through_end = math::fma(decayed, gs[j], through_end);
                }
                s[j] = math::fma(k, v, decayed);
            }
            // SAFETY: every lane of the warp (uniform loop bounds).
            let (past, own) = unsafe { (row_sum(past), row_sum(own)) };
            // dq' (the past's part of dq) and dq = dq' + scale k (dO . v).
            let dq_past = p.scale * past;
            let dq = math::fma(p.scale * k, own, dq_past);
            if part == 0 {
                let t = at_qk(seg.start as u64 + (first + i) as u64);
                // SAFETY: this row's channel of a token row of the segment: inside dq and dg
                // (host-checked sizes); the row's first lane is its only writer.
                unsafe {
                    *p.d_q.add(t) = convert::f32_to_bf16(dq);
                    *p.d_g.add(t) = q * dq_past;
                }
            }
        }
    }
    // SAFETY: every lane of the warp (uniform).
    let mut acc_dg = unsafe { row_sum(through_end) };

    // Reverse walk: G from the segment's end; dk, and dg as the reverse cumulative sum.
    for step in (0..steps).rev() {
        load_step(step);
        let first = step * DQKG_STEP;
        for i in (0..(len - first).min(DQKG_STEP)).rev() {
            // SAFETY: staged rows, published by the step's second barrier.
            let (q, k, g) = unsafe {
                (
                    f32::load(q_s + 4 * i * DK),
                    f32::load(k_s + 4 * i * DK),
                    f32::load(g_s + 4 * i * DK),
                )
            };
            let qs = p.scale * q;
            let a = math::exp2((g * math::LOG2_E).max(floor2));
            let (mut future, mut own) = (0.0f32, 0.0f32);
            for j in 0..NE {
                // SAFETY: staged rows, published.
                let (v, d_o) = unsafe {
                    (
                        f32::load(v_s + 4 * i * DV + col(j)),
                        f32::load(o_s + 4 * i * DV + col(j)),
                    )
                };
                future = math::fma(gs[j], v, future);
                own = math::fma(d_o, v, own);
                gs[j] = a * math::fma(qs, d_o, gs[j]);
            }
            // SAFETY: every lane of the warp (uniform loop bounds).
            let (future, own) = unsafe { (row_sum(future), row_sum(own)) };
            // dk' (the future's part of dk) and dk = dk' + scale q (dO . v).
            let dk = math::fma(qs, own, future);
            if part == 0 {
                let t = at_qk(seg.start as u64 + (first + i) as u64);
                let last = first + i == len - 1;
                // SAFETY: as in the forward walk; dg[t] holds this thread's own `q dq'`.
                unsafe {
                    acc_dg += *p.d_g.add(t) - if last { 0.0 } else { k * future };
                    *p.d_k.add(t) = convert::f32_to_bf16(dk);
                    *p.d_g.add(t) = if g >= G_FLOOR { acc_dg } else { 0.0 };
                }
            }
        }
    }
}
