//! The pingpong state pass (`gla_states_pp_*`): each segment's state from zero, relative to the
//! segment's end, and its total log-decay, for the forward to fold into later segments.

use super::elementwise::elementwise_states;
use super::item;
use super::tiles::{PingpongChunk, store_f32, zero_rows_past};
use crate::arch::mbarrier::Mbarrier;
use crate::arch::smem::SmemValue;
use crate::arch::tma::TensorMapPtr;
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{fence, griddep, index, math, smem, sync};
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gla::{
    CHUNK, GlaPingpongParams, PP_ATOM, PP_LOCAL_BARRIER, PP_STATE_GROUPS, PP_STATE_STAGES,
    PingpongConfig,
};

/// The state pass (`gla_states_pp_*`): block `x` is (segment `x / heads`, head `x % heads`)
/// with all `DV` value columns, no producer warpgroup and no turns. The state a segment adds
/// from a zero state is `sum_s (k_s 2^{L - b_s})^T v_s` (`b` cumulative from the segment's
/// start, `L` its total, log2): a sum, not a chain, once every factor is taken relative to the
/// segment's end. So each of the [`PP_STATE_GROUPS`] warpgroups takes a contiguous part of the
/// segment's steps (warpgroup 1 the later one) and walks it from its last step to its first,
/// carrying `C` (the total of the steps already walked) per channel; `S^T += v^T k_state`
/// accumulates in the `wgmma` accumulators, never rescaled and never waited for between steps
/// (step `i`'s batch runs while step `i + 1`'s element-wise phase does; two `k_state` tiles).
/// Each warpgroup's thread 0 issues its TMA loads `PP_STATE_STAGES - 1` steps ahead. At the
/// end warpgroup 0 adds warpgroup 1's state to its own scaled by `2^{C_1}` (`C_1` the later
/// part's total) and writes `delta` (the segment's state, relative to its end) and
/// `decay_log2` (`C_0 + C_1`, the segment's total).
///
/// # Barrier protocol
/// - Launch order: every thread first executes `griddepcontrol.launch_dependents`, so the
///   forward (launched next with `overlap_previous`) may be scheduled while this grid runs; it
///   waits for this grid's completion before reading `delta` / `decay_log2` (pingpong module
///   docs).
/// - Start: thread 0 of warpgroup `w` initializes its `full[w][s]` (count 1),
///   `fence.mbarrier_init`, issues the loads of its first `PP_STATE_STAGES` steps; the block
///   barrier (`sync_threads`) publishes the barriers.
/// - Warpgroup `w`'s walked step `i` at stage `i % PP_STATE_STAGES`, parity
///   `(i / PP_STATE_STAGES) % 2`: every thread waits on `full[w][s]` before reading the stage;
///   writes `k_state[i % 2]` (and zeroes the v rows past the segment's end); its proxy fence,
///   then barrier A (`PP_LOCAL_BARRIER + w`, 128 threads) publishes them to the `wgmma`s; the
///   batch of step `i` is committed, then `wait_group 1`: this thread's batch of step `i - 1`
///   is complete; barrier B (same id): every warp's is, so the stage and the `k_state` tile of
///   step `i - 1` are free: thread 0 then reloads the stage (step `i - 1 + PP_STATE_STAGES`),
///   and step `i + 1` rewrites that tile only after B.
/// - End: every thread waits for its last batch (`wait_group 0`); warpgroup 1 writes its state
///   and `C_1` into its own region (every load into it completed, every `wgmma` reading it
///   too); the block barrier publishes them to warpgroup 0, which alone writes the outputs.
///
/// # Safety
/// Launched as documented on [`GlaPingpongParams`] with the state pass's grid (`segments *
/// heads` blocks of `PP_STATE_THREADS`, `state_smem_bytes`).
#[inline(always)]
pub(super) unsafe fn states_walk<
    const DK: u32,
    const DV: u32,
    const STEP: u32,
    const PS: u32,
    const TPTS: usize,
    const SR: usize,
    const MH: usize,
    const NCH: u32,
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
                && NCH * CHUNK == STEP
                && PS * (DK / 8) == WARPGROUP_SIZE
                && PS * TPTS as u32 == STEP
                && PP_STATE_GROUPS == 2
                && PP_STATE_STAGES >= 2
        )
    };
    let [_, tmap_k, tmap_g, tmap_v] = tmaps;
    // The forward may be scheduled now: it waits for this grid's completion before it reads
    // what this grid writes (pingpong module docs, "Launch order").
    griddep::launch_dependents();
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let ctid = tid - wg * WARPGROUP_SIZE;
    // Block x is item x with all value columns; nothing to do for last segments.
    let it = item::<STEP, 1, DV, 1, false>(p, 0);
    if it.steps == 0 {
        // Uniform for the block, before any barrier.
        return;
    }
    let seg = it.seg;
    // This warpgroup's steps of the segment: `first .. first + n`.
    let per = it.steps.div_ceil(PP_STATE_GROUPS);
    let first = (wg * per).min(it.steps);
    let n = (first + per).min(it.steps) - first;
    let base = smem::aligned_base();
    let region = base + wg * cfg.state_region_bytes();
    let full =
        |s: u32| Mbarrier::at(base + cfg.state_barriers_offset() + 8 * (wg * PP_STATE_STAGES + s));
    let block = cfg.block_bytes();
    // Walked step i is step `first + n - 1 - i` of the segment.
    let load = |i: u32| {
        let s = i % PP_STATE_STAGES;
        let (y, z) = (
            it.head as i32,
            (seg.start + (first + n - 1 - i) * STEP) as i32,
        );
        let bar = full(s);
        // SAFETY: thread 0 of the warpgroup only; the stage is free (never used, or released
        // after barrier B of the step that last read it); `full` expects exactly the boxes'
        // bytes; the destinations are 1024-aligned column blocks of the stage.
        unsafe {
            bar.arrive_expect_tx(cfg.state_stage_bytes());
            for cb in 0..DK / PP_ATOM {
                let x = (cb * PP_ATOM) as i32;
                tmap_k.load_3d(region + cfg.state_k_offset(s) + cb * block, x, y, z, bar);
                tmap_g.load_3d(region + cfg.state_g_offset(s) + cb * block, x, y, z, bar);
            }
            for cb in 0..DV / PP_ATOM {
                let x = (cb * PP_ATOM) as i32;
                tmap_v.load_3d(region + cfg.state_v_offset(s) + cb * block, x, y, z, bar);
            }
        }
    };
    if ctid == 0 {
        for t in [tmap_k, tmap_g, tmap_v] {
            t.prefetch();
        }
        for s in 0..PP_STATE_STAGES {
            // SAFETY: single initializer before any use; published by the barrier below.
            unsafe { full(s).init(1) };
        }
        fence::fence_mbarrier_init();
        for i in 0..PP_STATE_STAGES.min(n) {
            load(i);
        }
    }
    // SAFETY: every thread of the block, once.
    unsafe { sync::sync_threads() };

    let local = PP_LOCAL_BARRIER + wg;
    let mut st = [[0.0f32; SR]; MH];
    let mut carry = [0.0f32; 8];
    // (A warpgroup without steps, the later one of a one-step segment, issues no `wgmma`:
    // its state stays zero. The branch keeps the zero initialization off the pipelined path.)
    if n > 0 {
        for i in 0..n {
            let s = i % PP_STATE_STAGES;
            let valid = (seg.len - (first + n - 1 - i) * STEP).min(STEP);
            let (k_s, g_s, v_s) = (
                region + cfg.state_k_offset(s),
                region + cfg.state_g_offset(s),
                region + cfg.state_v_offset(s),
            );
            let k_state = region + cfg.state_k_state_offset(i % 2);
            // SAFETY: thread 0 issued this step's loads (the prologue or after barrier B of step
            // i + 1 - PP_STATE_STAGES).
            unsafe { full(s).wait_parity((i / PP_STATE_STAGES) % 2) };
            // Rows past the segment's end (only in the segment's last step) are zero.
            if valid < STEP {
                // SAFETY: the stage's full phase completed; it is reloaded only after barrier B.
                unsafe { zero_rows_past(v_s, block, DV / PP_ATOM, STEP, valid, ctid) };
            }
            let tiles = PingpongChunk::<DK> {
                q: 0,
                k: k_s,
                g: g_s,
                q_inter: 0,
                k_state,
                q_diag: 0,
                k_half0: 0,
                k_half1: 0,
                decay: 0,
                r0: 0,
                block,
            };
            // SAFETY: the warpgroup's 128 threads; the stage was published by its full phase;
            // this k_state tile was last read by step i - 2's batch, complete at barrier B of
            // step i - 1.
            let e = unsafe { elementwise_states::<DK, PS, TPTS>(ctid, &tiles, valid, &carry) };
            for c in 0..8 {
                carry[c] += e[c];
            }
            fence::fence_proxy_async_shared();
            // SAFETY: barrier A (the warpgroup's 128 threads, uniformly).
            unsafe { sync::named_sync(local, WARPGROUP_SIZE) };
            for (mh, half) in st.iter_mut().enumerate() {
                st_fence(half);
                // SAFETY: whole warpgroup, uniform; k_state and the zeroed v rows were published
                // by A (with the proxy fence), the stage by its full phase; neither is rewritten
                // before barrier B of step i + 1.
                unsafe {
                    wgmma::fence();
                    for kk in 0..NCH {
                        let va =
                            Descriptor::mn_major_sw128(v_s + mh as u32 * block + 2048 * kk, block);
                        let kb = Descriptor::mn_major_sw128(k_state + 2048 * kk, block);
                        st_mma(half, va, kb);
                    }
                }
            }
            // SAFETY: whole warpgroup, uniform.
            unsafe {
                wgmma::commit_group();
                wgmma::wait_group::<1>();
            }
            for half in st.iter_mut() {
                st_fence(half);
            }
            // SAFETY: barrier B (the warpgroup's 128 threads, uniformly).
            unsafe { sync::named_sync(local, WARPGROUP_SIZE) };
            if ctid == 0 && i >= 1 && i - 1 + PP_STATE_STAGES < n {
                load(i - 1 + PP_STATE_STAGES);
            }
        }
        // SAFETY: whole warpgroup, uniform.
        unsafe { wgmma::wait_group::<0>() };
        for half in st.iter_mut() {
            st_fence(half);
        }
    }

    // Warpgroup 1's state (thread-major: word `(mh SR + r) 128 + ctid`) and its total `C_1`
    // (`[DK]` f32 after the state) in its own region.
    let xchg = base + cfg.state_region_bytes();
    let xchg_c = xchg + (MH * SR) as u32 * WARPGROUP_SIZE * 4;
    let group = ctid / PS;
    let last_lane = ctid % PS == PS - 1;
    if wg == 1 {
        for (mh, half) in st.iter().enumerate() {
            for (r, x) in half.iter().enumerate() {
                let at = xchg + (((mh * SR + r) as u32) * WARPGROUP_SIZE + ctid) * 4;
                // SAFETY: inside warpgroup 1's region (its state fits: `DK DV 4` bytes plus
                // `4 DK` <= the region, asserted by the host's layout), no load or `wgmma`
                // in flight there; one writer per word; read after the block barrier.
                unsafe { f32::store(at, *x) };
            }
        }
        if last_lane {
            // SAFETY: channels 8 group .. + 8 of the total; one writer (the group's last lane).
            unsafe { store_f32::<8>(xchg_c + 32 * group, &carry) };
        }
    }
    // SAFETY: every thread of the block, once.
    unsafe { sync::sync_threads() };
    if wg == 1 {
        return;
    }
    let (lane, warp) = (index::lane_id(), ctid / 32);
    let (g, t) = (lane / 4, lane % 4);
    let heads = p.base.heads as u64;
    let slot_head = (it.slot as u64 * heads + it.head as u64) as usize;
    let out = p.base.delta.wrapping_add(slot_head * (DK * DV) as usize);
    for (mh, half) in st.iter().enumerate() {
        for j in 0..SR / 4 {
            // SAFETY: C_1 of channels 8 j + 2 t, +1, published by the block barrier.
            let c1 = unsafe { u64::load(xchg_c + 4 * (8 * j as u32 + 2 * t)) };
            let f = [
                math::exp2(f32::from_bits(c1 as u32)),
                math::exp2(f32::from_bits((c1 >> 32) as u32)),
            ];
            for e in 0..4u32 {
                let r = 4 * j + e as usize;
                // SAFETY: warpgroup 1's word of this element, published by the block barrier.
                let later = unsafe {
                    f32::load(xchg + (((mh * SR + r) as u32) * WARPGROUP_SIZE + ctid) * 4)
                };
                // Element (j, e) of half mh of S^T: S[8 j + 2 t + e % 2][dv].
                let dk = 8 * j as u32 + 2 * t + e % 2;
                let dv = 64 * mh as u32 + 16 * warp + g + 8 * (e / 2);
                // SAFETY: this segment's delta slice (DK * DV elements); one writer per
                // element.
                unsafe {
                    *out.add((dk * DV + dv) as usize) = half[r] * f[e as usize % 2] + later;
                }
            }
        }
    }
    if last_lane {
        // SAFETY: C_1 of channels 8 group .., published by the block barrier.
        let c1 = unsafe {
            [
                <[u32; 4]>::load(xchg_c + 32 * group),
                <[u32; 4]>::load(xchg_c + 32 * group + 16),
            ]
        };
        let mut total = [0.0f32; 8];
        for c in 0..8 {
            total[c] = carry[c] + f32::from_bits(c1[c / 4][c % 4]);
        }
        let dst = p
            .base
            .decay_log2
            .wrapping_add(slot_head * DK as usize + 8 * group as usize);
        // SAFETY: channels 8 group .. + 8 <= DK of this segment's decay row, 32-byte aligned
        // (a multiple of 8 floats into a 16-byte aligned buffer); one writer.
        unsafe {
            let dst = dst as *mut [f32; 4];
            *dst = [total[0], total[1], total[2], total[3]];
            *dst.add(1) = [total[4], total[5], total[6], total[7]];
        }
    }
}
