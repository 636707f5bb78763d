//! The pingpong forward walk (`gla_fwd_pp_*`): barrier set-up, the role split, the producer's
//! TMA loads, and per consumer the initial state, its steps (element-wise phase, intra-chunk
//! scores, GEMM phase in turn) and the final state. Work split and barrier protocol: the
//! pingpong module documentation.

use super::super::chunk::intra_scores;
use super::elementwise::{elementwise_chunk, elementwise_step};
use super::tiles::{PingpongChunk, swizzled, zero_rows_past};
use super::turns::{ORDER_THREADS, turn_next, turn_waits};
use super::{Item, item};
use crate::arch::mbarrier::{Mbarrier, RingPos};
use crate::arch::smem::SmemValue;
use crate::arch::tma::TensorMapPtr;
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{convert, fence, griddep, index, math, regs, smem, sync};
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gla::{
    CHUNK, GlaConfig, GlaPingpongParams, PP_ATOM, PP_LOCAL_BARRIER, PP_MAX_CONSUMERS,
    PP_ORDER_BARRIER, PP_PAIR_BARRIER, PP_PRODUCER_REGS, PingpongConfig, SEG_FIRST, SEG_LAST,
    Segment,
};

/// The intra-chunk scores of chunk `cc` of the step (one warp): `P[t][s]` as in the baseline's
/// matrix phase, stored as bf16 in the swizzled score tile at K offset `16 cc`.
///
/// # Safety
/// Whole warp, uniform control flow; the padded operand tiles were published by a barrier;
/// this warp is the only writer of the chunk's part of the score tile until the next barrier.
#[inline(always)]
unsafe fn scores<const DK: u32, const NKK: usize>(
    lane: u32,
    q_diag: u32,
    k_half0: u32,
    k_half1: u32,
    p_tile: u32,
    cc: u32,
) {
    let rb = const { GlaConfig::row_bytes(DK) };
    let at = |base: u32| base + 16 * cc * rb;
    // SAFETY: whole warp, uniform; the tiles were published (the caller's contract).
    let pa = unsafe { intra_scores::<DK, NKK>(lane, at(q_diag), at(k_half0), at(k_half1)) };
    let (g, t) = (lane / 4, lane % 4);
    // The A-fragment words at their (row t, column s) places of P (written out, not iterated
    // over an array, which LLVM left in local memory).
    let put = |row: u32, col: u32, w: u32| {
        // SAFETY: row < 16, column 16 cc + col + 1 < 64 of the score tile; 4-byte aligned; one
        // writer per element (this warp, this lane).
        unsafe { u32::store(swizzled(p_tile, 0, row, 32 * cc + 2 * col), w) }
    };
    put(g, 2 * t, pa[0]);
    put(g + 8, 2 * t, pa[1]);
    put(g, 8 + 2 * t, pa[2]);
    put(g + 8, 8 + 2 * t, pa[3]);
}

/// The pingpong forward walk; see the pingpong module documentation. `SR = DK / 2`
/// accumulator registers per m64 half of `S^T`, `MH = DV / 64` halves, `NKK = DK / 16`,
/// `NCH = STEP / 16`. `st_mma` is `wgmma.m64n{DK}k16` (A MN-major, B MN-major), `st_fence`
/// pins its accumulators.
///
/// One function in named steps (moving them into functions of their own changed the
/// generated code): set-up (rings, barriers, every consumer's item) and the barriers'
/// initialization; the producer role; the consumer role: its item, the initial state (earlier
/// segments folded in), then per step the wait on `full`, 1. the element-wise phase, 2. the
/// intra-chunk scores, 3. the GEMM phase in turn, barrier L3 and the release of the stage; the
/// final state.
///
/// # Safety
/// Launched as documented on [`GlaPingpongParams`] with the configuration `cfg`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn walk<
    const DK: u32,
    const DV: u32,
    const DVT: u32,
    const PARTS: u32,
    const STEP: u32,
    const STAGES: u32,
    const CPT: usize,
    const PE: u32,
    const TPTE: usize,
    const NKK: usize,
    const SR: usize,
    const MH: usize,
    const NCH: u32,
    const NC: u32,
    const CREGS: u32,
>(
    p: &GlaPingpongParams,
    cfg: &PingpongConfig,
    tmaps: [TensorMapPtr; 4],
    st_mma: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    st_fence: impl Fn(&mut [f32; SR]),
) {
    const {
        assert!(
            SR as u32 * 2 == DK
                && MH as u32 * PP_ATOM == DV
                && DV * PARTS == DVT
                && NKK as u32 * 16 == DK
                && NCH * CHUNK == STEP
                && NCH <= 4
                && (PE * (DK / CPT as u32) * NCH).is_multiple_of(WARPGROUP_SIZE)
                && NC >= 2
                && NC <= PP_MAX_CONSUMERS
                && (PARTS == 1 || (PARTS == NC && NC == 2))
        )
    };
    // Set-up.
    // Shared-item mode (`PingpongConfig::shares_item`): the consumers are the value parts of
    // one item, with one ring and the element-wise phase of step `i` done by consumer `i % 2`.
    let shared = PARTS > 1;
    // Value columns of a ring stage, rings (and their barrier pairs).
    let ring_dv = if shared { DVT } else { DV };
    let rings = if shared { 1 } else { NC };
    let [tmap_q, tmap_k, tmap_g, tmap_v] = tmaps;
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let base = smem::aligned_base();
    let bars = base + cfg.barriers_offset();
    // Ring of consumer c's steps.
    let ring = |c: u32| if shared { 0 } else { c };
    let full = |c: u32, s: u32| Mbarrier::at(bars + 8 * (ring(c) * STAGES + s));
    let empty = |c: u32, s: u32| Mbarrier::at(bars + 8 * ((NC + ring(c)) * STAGES + s));
    // Region of consumer c's ring and operand set (shared mode: the one ring, and set `b`).
    let region = |c: u32, b: u32| {
        if shared {
            base + cfg.shared_region(b)
        } else {
            base + c * cfg.consumer_bytes()
        }
    };
    let block = cfg.block_bytes();
    // Every consumer's item (unused entries have no steps).
    let mut items = [Item {
        seg: Segment::default(),
        slot: 0,
        head: 0,
        dv0: 0,
        steps: 0,
    }; PP_MAX_CONSUMERS as usize];
    for (c, it) in items.iter_mut().enumerate() {
        if (c as u32) < NC {
            *it = item::<STEP, NC, DV, PARTS, true>(p, c as u32);
        }
    }
    let mut n = [0u32; PP_MAX_CONSUMERS as usize];
    for (nc, it) in n.iter_mut().zip(items.iter()) {
        *nc = it.steps;
    }
    let max_steps = n[0].max(n[1]).max(n[2]);

    // The barriers' initialization.
    if tid == 0 {
        for t in tmaps {
            t.prefetch();
        }
        // SAFETY: single initializer before any use; published by the barrier below.
        unsafe {
            for c in 0..rings {
                for s in 0..STAGES {
                    full(c, s).init(1);
                    // Shared mode: both consumers release the stage.
                    empty(c, s).init(if shared { NC } else { 1 });
                }
            }
        }
        fence::fence_mbarrier_init();
    }
    // SAFETY: all threads reach this barrier once, before the role split.
    unsafe { sync::sync_threads() };

    // Producer role.
    if wg == 0 {
        // SAFETY: the whole producer warpgroup executes this, uniformly.
        unsafe { regs::decrease::<PP_PRODUCER_REGS>() };
        if tid == 0 {
            // Every consumer's steps `i` advance together, so one ring position serves all.
            let mut pos = RingPos::<STAGES>::of(0);
            for i in 0..max_steps {
                for c in 0..rings {
                    let it = items[c as usize];
                    if i >= it.steps {
                        continue;
                    }
                    let s = pos.stage;
                    let r = region(c, 0);
                    let (x, y, z) = (0i32, it.head as i32, (it.seg.start + i * STEP) as i32);
                    // SAFETY: ring protocol (pingpong module docs): the stage is free once `empty`
                    // completed its previous phase; `full` expects exactly the boxes' bytes;
                    // the destinations are 1024-aligned column blocks of this consumer's
                    // stage, untouched until the phase completes.
                    unsafe {
                        empty(c, s).wait_parity(pos.phase ^ 1);
                        let bar = full(c, s);
                        bar.arrive_expect_tx(cfg.load_bytes(true));
                        for cb in 0..DK / PP_ATOM {
                            let xo = x + (cb * PP_ATOM) as i32;
                            tmap_q.load_3d(r + cfg.q_offset(s) + cb * block, xo, y, z, bar);
                            tmap_k.load_3d(r + cfg.k_offset(s) + cb * block, xo, y, z, bar);
                            tmap_g.load_3d(r + cfg.g_offset(s) + cb * block, xo, y, z, bar);
                        }
                        for cb in 0..ring_dv / PP_ATOM {
                            let xo = (it.dv0 + cb * PP_ATOM) as i32;
                            tmap_v.load_3d(r + cfg.v_offset(s) + cb * block, xo, y, z, bar);
                        }
                    }
                }
                pos = pos.next();
            }
        }
        return;
    }

    // Consumer role.
    // SAFETY: the whole consumer warpgroup executes this, uniformly.
    unsafe { regs::increase::<CREGS>() };
    // The state pass (this launch's primary when a sequence is split) may still be running:
    // every consumer thread waits for it before its first read of delta / decay_log2 and its
    // first write (pingpong module docs, "Launch order").
    griddep::wait_primary();
    let c = wg - 1;
    // (Recomputed rather than indexed by the runtime `c`, which would put the array in local
    // memory.)
    let it = item::<STEP, NC, DV, PARTS, true>(p, c);
    if it.steps == 0 {
        return;
    }
    let ctid = tid - wg * WARPGROUP_SIZE;
    let warp = ctid / 32;
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let heads = p.base.heads as u64;
    // States and outputs have all DVT = DV PARTS value columns; this item owns DV of them.
    let state_len = (DK * DVT) as usize;
    let seg = it.seg;
    let pair_head = (seg.seq as u64 * heads + it.head as u64) as usize * state_len;
    // Element (j, e) of half mh of S^T: S[8 j + 2 t + e % 2][64 mh + 16 warp + g + 8 (e / 2)].
    let state_index = |mh: usize, j: usize, e: usize| {
        let dk = 8 * j as u32 + 2 * t + (e as u32 % 2);
        let dv = it.dv0 + 64 * mh as u32 + 16 * warp + g + 8 * (e as u32 / 2);
        (dk * DVT + dv) as usize
    };

    // The initial state: the sequence's (or zero), with, for a segment that is not first, every
    // earlier segment of the sequence folded in (`gla_combine`'s recurrence
    // `S <- 2^{D_m} S + delta_m`, done here per item instead of in a launch of its own), walked
    // backwards: `S = W S_init + sum_m W_m delta_m`, `W_m` the product of `2^{D_l}` over the
    // segments between m and this one. Each segment's loads (its flags, delta and decay) are
    // independent of the previous one's, so the walk costs one round trip per segment.
    let mut st = [[0.0f32; SR]; MH];
    // W of channels 8 j + 2 t, + 1 (j < SR / 4 <= 16).
    const { assert!(SR / 4 <= 16) };
    let mut w = [[1.0f32; 2]; 16];
    if seg.flags & SEG_FIRST == 0 {
        // The sequence's segments are consecutive in the table, its first one flagged (so
        // slot >= 1 here, and the walk stops at the sequence's first segment).
        let mut m = it.slot;
        loop {
            m -= 1;
            let mh_slot = (m as u64 * heads + it.head as u64) as usize;
            let delta = p.base.delta.wrapping_add(mh_slot * state_len);
            let decay = p.base.decay_log2.wrapping_add(mh_slot * DK as usize);
            // SAFETY: m < slot < segments, inside the table.
            let flags = unsafe { (*p.base.segments.add(m as usize)).flags };
            for (mh, half) in st.iter_mut().enumerate() {
                for j in 0..SR / 4 {
                    for e in 0..4 {
                        // SAFETY: segment m < slot is not last, so `gla_states_pp` wrote its
                        // delta slice (DK * DVT elements, host-checked sizes) before this
                        // launch; state_index < DK * DVT.
                        let d = unsafe { *delta.add(state_index(mh, j, e)) };
                        half[4 * j + e] = math::fma(w[j][e % 2], d, half[4 * j + e]);
                    }
                }
            }
            for j in 0..SR / 4 {
                let dk = 8 * j + 2 * t as usize;
                // SAFETY: as for delta: its decay slice (DK elements), channels dk, dk + 1 < DK.
                let (d0, d1) = unsafe { (*decay.add(dk), *decay.add(dk + 1)) };
                w[j][0] *= math::exp2(d0);
                w[j][1] *= math::exp2(d1);
            }
            if flags & SEG_FIRST != 0 {
                break;
            }
        }
    }
    if p.base.has_init != 0 {
        let init = p.base.init_state.wrapping_add(pair_head);
        for (mh, half) in st.iter_mut().enumerate() {
            for j in 0..SR / 4 {
                for e in 0..4 {
                    // SAFETY: the state slice of (seq, head) has DK * DVT elements
                    // (host-checked sizes); state_index < DK * DVT.
                    let x = unsafe { *init.add(state_index(mh, j, e)) };
                    half[4 * j + e] = math::fma(w[j][e % 2], x, half[4 * j + e]);
                }
            }
        }
    }

    let mut o = [[0.0f32; 8]; MH];
    let row_stride = (heads * DVT as u64) as usize;
    // Store o^T of chunk `cc` of step `step` (valid rows only), scaled, as bf16. The values are
    // converted and pinned before any branch: a read of `wgmma` accumulators on a divergent
    // path makes ptxas serialize the products.
    let store_o = |o: &[[f32; 8]; MH], step: u32, cc: u32, valid: u32| {
        let row0 = seg.start as u64 + (step * STEP + cc * CHUNK) as u64;
        let dst = p
            .base
            .o
            .wrapping_add(((row0 * heads + it.head as u64) * DVT as u64 + it.dv0 as u64) as usize);
        for (mh, half) in o.iter().enumerate() {
            let sc = p.base.scale;
            let mut w = [
                convert::pack_bf16x2(half[0] * sc, half[1] * sc),
                convert::pack_bf16x2(half[2] * sc, half[3] * sc),
                convert::pack_bf16x2(half[4] * sc, half[5] * sc),
                convert::pack_bf16x2(half[6] * sc, half[7] * sc),
            ];
            wgmma::pin_fragment(&mut w);
            for j in 0..2u32 {
                for e in 0..4u32 {
                    let token = 8 * j + 2 * t + e % 2;
                    let dv = 64 * mh as u32 + 16 * warp + g + 8 * (e / 2);
                    let word = w[(2 * j + e / 2) as usize];
                    let v = (word >> (16 * (e % 2))) as u16;
                    if cc * CHUNK + token < valid {
                        // SAFETY: token row < valid rows of the segment's step, dv < DV:
                        // inside o; this thread is the element's only writer.
                        unsafe { *dst.wrapping_add(token as usize * row_stride + dv as usize) = v };
                    }
                }
            }
        }
    };

    // The steps.
    let mut pos = RingPos::<STAGES>::of(0);
    for step in 0..it.steps {
        let s = pos.stage;
        let valid = (seg.len - step * STEP).min(STEP);
        let nchunks = valid.div_ceil(CHUNK);
        // The operand set of this step (shared mode: set `step % 2`, written by both consumers)
        // and the ring.
        let b = step % 2;
        let (rs, r) = (region(c, 0), region(c, b));
        let q_inter = r + cfg.q_inter_offset();
        let k_state = r + cfg.k_state_offset();
        let p_tile = r + cfg.p_offset();
        let q_diag = r + cfg.q_diag_offset();
        let k_half0 = r + cfg.k_half0_offset();
        let k_half1 = r + cfg.k_half1_offset();
        let decay = r + cfg.decay_offset();
        let (q_s, k_s, g_s, v_s) = (
            rs + cfg.q_offset(s),
            rs + cfg.k_offset(s),
            rs + cfg.g_offset(s),
            rs + cfg.v_offset(s),
        );
        // This consumer's value columns of the stage (shared mode: column block c).
        let v_own = if shared { v_s + c * block } else { v_s };
        // SAFETY: the producer issues every step of this item, so the phase completes.
        unsafe { full(c, s).wait_parity(pos.phase) };

        let tiles = PingpongChunk::<DK> {
            q: q_s,
            k: k_s,
            g: g_s,
            q_inter,
            k_state,
            q_diag,
            k_half0,
            k_half1,
            decay,
            r0: 0,
            block,
        };
        if shared {
            // Both consumers, in step: consumer c computes chunk c of the step (its
            // element-wise phase and scores); two barriers of both consumers (256 threads)
            // publish the set. The set the step writes was last read by the GEMM phases of
            // step - 2, which both consumers finished before the first of these barriers in
            // step - 1.
            const { assert!(PARTS == 1 || (NCH == 2 && PE * (DK / CPT as u32) == WARPGROUP_SIZE)) };
            if valid < STEP && c == 0 {
                // SAFETY: the stage's full phase completed; it is released only after both
                // consumers' L3; consumer 0 alone writes these rows.
                unsafe { zero_rows_past(v_s, block, ring_dv / PP_ATOM, STEP, valid, ctid) };
            }
            let part = ctid % PE;
            let group = (ctid / PE) % (DK / CPT as u32);
            // SAFETY: the consumer's 128 threads, chunk c (warp-uniform); the stage was
            // published by its full phase; the set is not read before the barrier below.
            unsafe { elementwise_chunk::<DK, CPT, PE, TPTE>(c, part, group, &tiles, valid) };
            fence::fence_proxy_async_shared();
            // SAFETY: both consumers' 256 threads, uniformly.
            unsafe { sync::named_sync(PP_PAIR_BARRIER, ORDER_THREADS) };
            if warp == 0 && c < nchunks {
                // SAFETY: whole warp; tiles published by the barrier above; this warp writes
                // only chunk c's part of the score tile.
                unsafe { scores::<DK, NKK>(lane, q_diag, k_half0, k_half1, p_tile, c) };
            }
            fence::fence_proxy_async_shared();
            // SAFETY: both consumers' 256 threads, uniformly.
            unsafe { sync::named_sync(PP_PAIR_BARRIER, ORDER_THREADS) };
        } else {
            // 1. Element-wise phase; rows past the segment's end are zero.
            if valid < STEP {
                // SAFETY: this consumer's stage (full phase completed, released only after
                // barrier L3).
                unsafe { zero_rows_past(v_s, block, ring_dv / PP_ATOM, STEP, valid, ctid) };
            }
            // SAFETY: the consumer's 128 threads (chunks are warp-uniform); the stage was
            // published by its full phase; the operand tiles are not read before L1.
            unsafe { elementwise_step::<DK, CPT, PE, TPTE, NCH>(ctid, &tiles, valid) };
            fence::fence_proxy_async_shared();
            // SAFETY: barrier L1 of the protocol (the consumer's 128 threads, uniformly).
            unsafe { sync::named_sync(PP_LOCAL_BARRIER + c, WARPGROUP_SIZE) };

            // 2. Intra-chunk scores.
            let mut cc = warp;
            while cc < nchunks {
                // SAFETY: whole warp (cc is warp-uniform); tiles published by L1; this warp
                // writes only chunk cc's part of the score tile.
                unsafe { scores::<DK, NKK>(lane, q_diag, k_half0, k_half1, p_tile, cc) };
                cc += 4;
            }
            fence::fence_proxy_async_shared();
            // SAFETY: barrier L2 of the protocol.
            unsafe { sync::named_sync(PP_LOCAL_BARRIER + c, WARPGROUP_SIZE) };
        }

        // 3. GEMM phase, in turn.
        // (No turns in the shared mode: the sets' hand-offs order the consumers.)
        let (sync_turn, arrive_turn) = if shared {
            (false, None)
        } else {
            (turn_waits::<NC>(&n, step, c), turn_next::<NC>(&n, step, c))
        };
        if sync_turn {
            // SAFETY: turn protocol (pingpong module docs): matched by one arrival of the other
            // consumer.
            unsafe { sync::named_sync(PP_ORDER_BARRIER + c, ORDER_THREADS) };
        }
        for cc in 0..nchunks {
            // The previous chunk's outputs (final after its wait), stored while this chunk's
            // batch runs.
            let o_prev = o;
            let drow = decay + cc * DK * 4;
            // One batch per m64 half of S^T (its fragments are the only ones live: with
            // DK = DV = 128 both halves' would not fit in the registers beside S^T).
            for mh in 0..MH {
                // S^T (before this chunk's update) as bf16 A fragments, read by the in-flight
                // `o^T = S^T q_inter^T`: pinned after its wait so their registers are not
                // reused before.
                let mut frag = [[0u32; 4]; NKK];
                for (kk, f) in frag.iter_mut().enumerate() {
                    let a = &st[mh][8 * kk..8 * kk + 8];
                    *f = [
                        convert::pack_bf16x2(a[0], a[1]),
                        convert::pack_bf16x2(a[2], a[3]),
                        convert::pack_bf16x2(a[4], a[5]),
                        convert::pack_bf16x2(a[6], a[7]),
                    ];
                }
                // S^T *= decay (per key channel, the accumulator column).
                for j in 0..SR / 4 {
                    // SAFETY: channels 8 j + 2 t, +1 < DK of the published decay row.
                    let d = unsafe { u64::load(drow + 4 * (8 * j as u32 + 2 * t)) };
                    let d = [f32::from_bits(d as u32), f32::from_bits((d >> 32) as u32)];
                    for e in 0..4 {
                        st[mh][4 * j + e] *= d[e % 2];
                    }
                }
                // The scaled state and the fragments are final here: keep the compiler from
                // sinking their definitions between the `wgmma`s of the batch (which would
                // serialize it).
                st_fence(&mut st[mh]);
                wgmma::fence_operands_8(&mut o[mh]);
                for f in frag.iter_mut() {
                    wgmma::pin_fragment(f);
                }
                // SAFETY: whole warpgroup, uniform; the operand tiles were published by L1/L2
                // (shared mode: the pair barriers), with the proxy fence, and the stage by its
                // full phase; none is rewritten before L3 of this step.
                unsafe {
                    wgmma::fence();
                    let va =
                        Descriptor::mn_major_sw128(v_own + mh as u32 * block + 2048 * cc, block);
                    for (kk, f) in frag.iter().enumerate() {
                        let (cb, within) = (kk as u32 / 4, 32 * (kk as u32 % 4));
                        let b =
                            Descriptor::k_major_sw128(q_inter + cb * block + 2048 * cc + within);
                        if kk == 0 {
                            wgmma::m64n16k16_bf16_rs::<0, false>(&mut o[mh], *f, b);
                        } else {
                            wgmma::m64n16k16_bf16_rs::<0, true>(&mut o[mh], *f, b);
                        }
                    }
                    let pb = Descriptor::k_major_sw128(p_tile + 32 * cc);
                    wgmma::m64n16k16_bf16_ss::<1, 0, true>(&mut o[mh], va, pb);
                    let kb = Descriptor::mn_major_sw128(k_state + 2048 * cc, block);
                    st_mma(&mut st[mh], va, kb);
                    wgmma::commit_group();
                    // The turn ends with the issue of the step's last batch: the next consumer
                    // may issue while this one waits and stores its outputs.
                    if cc + 1 == nchunks
                        && mh + 1 == MH
                        && let Some(next) = arrive_turn
                    {
                        // SAFETY: turn protocol: the next consumer in the turn order syncs once
                        // for this arrival (uniform: the whole warpgroup is here).
                        sync::named_arrive(PP_ORDER_BARRIER + next, ORDER_THREADS);
                    }
                    if cc > 0 && mh + 1 == MH {
                        store_o(&o_prev, step, cc - 1, valid);
                    }
                    // The next chunk needs this state: wait here (uniformly, so ptxas keeps
                    // the batch pipelined).
                    wgmma::wait_group::<0>();
                }
                for f in frag.iter_mut() {
                    wgmma::pin_fragment(f);
                }
                st_fence(&mut st[mh]);
                wgmma::fence_operands_8(&mut o[mh]);
            }
        }
        store_o(&o, step, nchunks - 1, valid);
        // SAFETY: barrier L3 of the protocol.
        unsafe { sync::named_sync(PP_LOCAL_BARRIER + c, WARPGROUP_SIZE) };
        if ctid == 0 {
            // SAFETY: every read of the stage by this consumer is complete (L3); one arrival
            // per phase and consumer of the ring.
            unsafe { empty(c, s).arrive() };
        }
        pos = pos.next();
    }

    // The final state.
    if seg.flags & SEG_LAST != 0 && p.base.has_final != 0 {
        let out = p.base.final_state.wrapping_add(pair_head);
        for (mh, half) in st.iter().enumerate() {
            for j in 0..SR / 4 {
                for e in 0..4 {
                    // SAFETY: this item's columns of its sequence's final state, DK * DVT
                    // elements; state_index < DK * DVT.
                    unsafe { *out.add(state_index(mh, j, e)) = half[4 * j + e] };
                }
            }
        }
    }
}
