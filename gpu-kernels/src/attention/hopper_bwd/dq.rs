//! `attention_bwd_hopper_dq_{bf16,f16}_d{64,128}`: the dQ kernel of the attention backward on
//! Hopper (sm_90a), the forward's structure with one more product: per query block it
//! recomputes `S = Q K^T`, `P`, `dP = dO V^T` and `dS` over the keys its rows may see and
//! accumulates `dQ = dS K` in registers. Every element of dQ is summed by one thread in a fixed
//! order: bitwise reproducible. Same results as the `mma.sync` deterministic dQ kernel.
//!
//! # Tiling
//! One block per `BM = 128` query rows of one query head of one sequence (grid `(ceil(seq_q /
//! 128), heads_q, batch)`): Q and dO tiles loaded once, K and V tiles of `BN = 64` keys through
//! a 2-stage ring over the key blocks some row of the block may attend (causal and window
//! bounds; the others are skipped). Query rows are the rows of every product:
//! - `S = Q K^T` and `dP = dO V^T` (`m64n64k16`, both operands K-major in shared memory);
//! - `P = exp2(S scale_log2 - LSE log2 e)` (0 where masked or LSE = -inf), `dS = P (dP -
//!   delta')` (with `SOFTCAP`, `S` replaced by `t = tanh(S softcap_scale)` and `dS` scaled by
//!   `1 - t^2`), rounded to the element type as register A fragments;
//! - `dQ += dS K` (`m64n{D}k16`, K MN-major: the 16-row K slice `kk` at `2048 kk` bytes).
//!
//! The epilogue stores `dQ scale` (element type) from the accumulators.
//!
//! # Thread mapping
//! As the dK/dV kernel: warpgroup 0 produces (thread 0 issues every TMA load), consumer `c`
//! owns query rows `64 c .. 64 c + 64` of the block; a thread holds rows `16 w + g` and
//! `16 w + g + 8` of its warpgroup's, whose LSE and `delta'` it loads once.
//!
//! # Barrier protocol
//! - Start: thread 0 initializes `qdo_full` and `full[s]` (count 1) and `empty[s]` (count 8),
//!   `fence.mbarrier_init`, then `sync_threads` publishes them. A block without steps (no key
//!   for its rows) loads nothing, waits for nothing and stores zeros.
//! - `qdo_full` (phase 0 only): the producer arrives expecting Q's and dO's bytes and issues
//!   their loads; consumers wait for it before their first product.
//! - The K/V ring: step `i` uses stage `s = i % 2` with parity `(i / 2) % 2`. The producer waits
//!   until `empty[s]` completed the stage's previous use (parity `^ 1`: the first pass does not
//!   wait), arrives on `full[s]` expecting the step's K and V bytes, and issues the loads;
//!   consumers wait on `full[s]` before the step's first product.
//! - `empty[s]`: lane 0 of every consumer warp arrives once the `wgmma.wait_group 0` that
//!   completes the step's dQ product (the last to read K; V's last reader, dP, completed
//!   before it) has returned.
//! - Registers: the dS fragments are pinned until their product's wait; every batch starts
//!   with `wgmma.fence`; accumulators are pinned around every wait.

use super::super::elem::Elem;
use super::super::hopper::softmax::pack_p;
use super::super::{logits, mask};
use super::{CONSUMER_WARPS, SR};
use crate::arch::mbarrier::{Mbarrier, RingPos};
use crate::arch::tma::TensorMapPtr;
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{fence, global, index, math, regs, smem, sync};
use kernel_abi::attention::hopper_bwd::{
    HOPPER_BWD_STAGES as STAGES, HOPPER_DQ_BLOCK_M as BM, HOPPER_DQ_BLOCK_N as BN, HopperBwdParams,
    HopperDqConfig,
};
use kernel_abi::attention::{
    HOPPER_ATOM, HOPPER_CONSUMER_REGS, HOPPER_CONSUMERS, HOPPER_PRODUCER_REGS,
};

/// Query rows of one consumer warpgroup (the M of its products).
const WG_ROWS: u32 = BM / HOPPER_CONSUMERS;
/// 8-column blocks of a key tile.
const NT: usize = (BN / 8) as usize;
/// 16-key K slices of a key tile (the A fragments of dS).
const KN: usize = (BN / 16) as usize;

/// The kernel body; see the module documentation. `DR = D / 2` accumulator registers of dQ,
/// `DK = D / 16` K slices of `S` and `dP`.
///
/// # Safety
/// Launched with grid `(ceil(seq_q / BM), heads_q, batch)`, `HOPPER_THREADS` threads, the
/// configuration's shared memory, and parameters as documented on [`HopperBwdParams`] (maps
/// with box rows `BM` for Q and dO, `BN` for K and V; validated by the host), after the
/// preprocess that wrote `delta'`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dq<
    E: Elem,
    const D: u32,
    const DR: usize,
    const DK: usize,
    const SOFTCAP: bool,
>(
    p: &HopperBwdParams,
    cfg: &HopperDqConfig,
    tmaps: [TensorMapPtr; 4],
    s_zero: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    s_mma: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    s_fence: impl Fn(&mut [f32; SR]),
    g_mma: impl Fn(&mut [f32; DR], [u32; 4], Descriptor),
    g_fence: impl Fn(&mut [f32; DR]),
) {
    const { assert!(DR as u32 * 2 == D && DK as u32 * 16 == D && WG_ROWS == 64 && SR as u32 * 2 == BN) };
    let [tmap_q, tmap_do, tmap_k, tmap_v] = tmaps;
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let base = smem::aligned_base();
    let bars = base + cfg.barriers_offset();
    let qdo_full = Mbarrier::at(bars);
    let full = |s: u32| Mbarrier::at(bars + 8 * (1 + s));
    let empty = |s: u32| Mbarrier::at(bars + 8 * (1 + STAGES + s));
    let q_s = base + cfg.q_offset();
    let do_s = base + cfg.do_offset();
    let k_s = |s: u32| base + cfg.k_offset(s);
    let v_s = |s: u32| base + cfg.v_offset(s);
    let cblocks = cfg.column_blocks();

    // The block's walk, the same in every thread.
    let (seq_q, seq_k) = (p.base.seq_q, p.base.seq_k);
    let (heads_q, heads_kv) = (p.base.heads_q, p.base.heads_kv);
    let (wl, wr) = (p.base.window_left, p.base.window_right);
    let (m_block, head, batch) = (
        index::block_idx_x(),
        index::block_idx_y(),
        index::block_idx_z(),
    );
    let head_kv = head / (heads_q / heads_kv);
    let m0 = m_block * BM;
    let rows_valid = (seq_q - m0).min(BM);
    // Keys some row of the block may attend: [k_lo, k_hi).
    let off = seq_k as i64 - seq_q as i64;
    let k_lo = if wl >= 0 {
        (m0 as i64 + off - wl as i64).max(0)
    } else {
        0
    };
    let k_hi = if wr >= 0 {
        ((m0 + rows_valid) as i64 - 1 + off + wr as i64 + 1).min(seq_k as i64)
    } else {
        seq_k as i64
    };
    let (nb_lo, steps) = if k_hi > k_lo {
        let lo = k_lo as u32 / BN;
        (lo, (k_hi as u32).div_ceil(BN) - lo)
    } else {
        (0, 0)
    };

    if tid == 0 {
        for t in tmaps {
            t.prefetch();
        }
        // SAFETY: single initializer before any use; published by the barrier below.
        unsafe {
            qdo_full.init(1);
            for s in 0..STAGES {
                full(s).init(1);
                empty(s).init(CONSUMER_WARPS);
            }
        }
        fence::fence_mbarrier_init();
    }
    // SAFETY: all threads reach this barrier once, before the role split.
    unsafe { sync::sync_threads() };

    if wg == 0 {
        // SAFETY: the whole producer warpgroup executes this, uniformly.
        unsafe { regs::decrease::<HOPPER_PRODUCER_REGS>() };
        if tid == 0 && steps > 0 {
            let (h, hk, b) = (head as i32, head_kv as i32, batch as i32);
            // SAFETY: `qdo_full` expects exactly Q's and dO's bytes; the destinations are
            // 1024-aligned column blocks sized by the ABI, read only after the phase
            // completes; the D coordinates are multiples of 64 elements.
            unsafe {
                qdo_full.arrive_expect_tx(cfg.qdo_bytes());
                for cb in 0..cblocks {
                    let x = (cb * HOPPER_ATOM) as i32;
                    let at = cb * cfg.block_bytes(BM);
                    tmap_q.load_4d(q_s + at, x, h, m0 as i32, b, qdo_full);
                    tmap_do.load_4d(do_s + at, x, h, m0 as i32, b, qdo_full);
                }
            }
            for step in 0..steps {
                let pos = RingPos::<STAGES>::of(step);
                let n0 = ((nb_lo + step) * BN) as i32;
                // SAFETY: ring protocol (module docs): the stage is free once `empty` completed
                // its previous phase; `full` expects exactly the step's bytes; the destinations
                // are untouched until that phase completes.
                unsafe {
                    empty(pos.stage).wait_parity(pos.phase ^ 1);
                    full(pos.stage).arrive_expect_tx(cfg.step_bytes());
                    for cb in 0..cblocks {
                        let x = (cb * HOPPER_ATOM) as i32;
                        let at = cb * cfg.block_bytes(BN);
                        let bar = full(pos.stage);
                        tmap_k.load_4d(k_s(pos.stage) + at, x, hk, n0, b, bar);
                        tmap_v.load_4d(v_s(pos.stage) + at, x, hk, n0, b, bar);
                    }
                }
            }
        }
        return;
    }

    // Consumers.
    // SAFETY: the whole consumer warpgroup executes this, uniformly.
    unsafe { regs::increase::<HOPPER_CONSUMER_REGS>() };
    let c = wg - 1;
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let wm0 = m0 + c * WG_ROWS;
    // The thread's rows: `row0` and `row0 + 8`, their LSE (base 2, +inf where P must be 0)
    // and delta'.
    let row0 = wm0 + (index::warp_id() % 4) * 16 + g;
    let (scale_log2, off32, sk32) = (p.base.scale_log2, off as i32, seq_k as i32);
    let softcap_scale = p.base.logits.softcap_scale;
    let row_base = (batch as u64 * heads_q as u64 + head as u64) * seq_q as u64;
    let mut lse2 = [f32::INFINITY; 2];
    let mut delta = [0.0f32; 2];
    for h in 0..2 {
        let i = row0 + 8 * h as u32;
        if i < seq_q {
            let idx = (row_base + i as u64) as usize;
            // SAFETY: row i < seq_q of this (batch, head): inside LSE and delta'.
            let (l, d) = unsafe {
                (
                    global::load_nc_f32(p.base.lse.wrapping_add(idx)),
                    global::load_nc_f32(p.base.delta.wrapping_add(idx)),
                )
            };
            if l != f32::NEG_INFINITY {
                lse2[h] = l * math::LOG2_E;
            }
            delta[h] = d;
        }
    }
    let mut dq = [0.0f32; DR];

    if steps > 0 {
        // SAFETY: the producer issues Q and dO when `steps > 0`, completing this phase.
        unsafe { qdo_full.wait_parity(0) };
        let rows_past_end = wm0 + WG_ROWS > seq_q;
        for step in 0..steps {
            let pos = RingPos::<STAGES>::of(step);
            let n0 = (nb_lo + step) * BN;
            // SAFETY: the producer issues every step's K and V, so this phase completes.
            unsafe { full(pos.stage).wait_parity(pos.phase) };
            let (kt, vt) = (k_s(pos.stage), v_s(pos.stage));

            // S = Q K^T and dP = dO V^T for the consumer's 64 rows (two groups).
            let mut s = [0.0f32; SR];
            let mut dp = [0.0f32; SR];
            // SAFETY: whole warpgroup, uniform control flow; Q, dO and this stage were
            // published by their completed phases and are not overwritten before this step's
            // `empty` arrival.
            unsafe {
                wgmma::fence();
                for kk in 0..DK as u32 {
                    let (cb, within) = (kk / 4, 32 * (kk % 4));
                    let rows = c * WG_ROWS * 128 + within;
                    let a = Descriptor::k_major_sw128(q_s + cb * cfg.block_bytes(BM) + rows);
                    let b = Descriptor::k_major_sw128(kt + cb * cfg.block_bytes(BN) + within);
                    if kk == 0 {
                        s_zero(&mut s, a, b);
                    } else {
                        s_mma(&mut s, a, b);
                    }
                }
                wgmma::commit_group();
                for kk in 0..DK as u32 {
                    let (cb, within) = (kk / 4, 32 * (kk % 4));
                    let rows = c * WG_ROWS * 128 + within;
                    let a = Descriptor::k_major_sw128(do_s + cb * cfg.block_bytes(BM) + rows);
                    let b = Descriptor::k_major_sw128(vt + cb * cfg.block_bytes(BN) + within);
                    if kk == 0 {
                        s_zero(&mut dp, a, b);
                    } else {
                        s_mma(&mut dp, a, b);
                    }
                }
                wgmma::commit_group();
                // Groups complete in order: S is done, dP may still run.
                wgmma::wait_group::<1>();
            }
            s_fence(&mut s);

            // P (in `s`) while dP runs, then dS: the thread's key columns n0 + 8 j + 2 t + e.
            let needs_mask =
                rows_past_end || mask::step_needs_mask::<WG_ROWS, BN>(wm0, n0, off32, wl, wr, sk32);
            for j in 0..NT {
                for e in 0..4 {
                    let x = 4 * j + e;
                    let (l, dx) = logits::backward_logit::<SOFTCAP>(s[x], softcap_scale);
                    let pr = math::exp2(math::fma(l, scale_log2, -lse2[e / 2]));
                    // With `SOFTCAP`, P (1 - t^2): dS's factor (P itself feeds no product here).
                    s[x] = if SOFTCAP { pr * dx } else { pr };
                }
            }
            if needs_mask {
                // The keys each of the thread's rows may attend (none past `seq_q`), counted
                // from its first column `n0 + 2 t`; P is 0 outside them.
                let range = |h: u32| {
                    let i = row0 + 8 * h;
                    let (lo, hi) = mask::key_range(i, wl, wr, sk32, off32);
                    let hi = if i < seq_q { hi } else { -1 };
                    let base = (n0 + 2 * t) as i32;
                    (lo - base, hi - base)
                };
                let ((lo0, hi0), (lo1, hi1)) = (range(0), range(1));
                mask::fill_outside(&mut s, [lo0, lo1], [hi0, hi1], 0.0);
            }
            // SAFETY: whole warpgroup.
            unsafe { wgmma::wait_group::<0>() };
            s_fence(&mut dp);
            for x in 0..SR {
                dp[x] = s[x] * (dp[x] - delta[(x % 4) / 2]);
            }
            let mut da = pack_p::<E, SR, KN>(&dp);

            // dQ += dS K.
            // SAFETY: as above; the fence orders the writes of the fragments and of the
            // accumulators before the products.
            unsafe {
                wgmma::fence();
                for kk in 0..KN {
                    let b = Descriptor::mn_major_sw128(kt + 2048 * kk as u32, cfg.block_bytes(BN));
                    g_mma(&mut dq, da[kk], b);
                }
                wgmma::commit_group();
                wgmma::wait_group::<0>();
            }
            g_fence(&mut dq);
            for kk in 0..KN {
                // The product read the fragments until the wait above.
                wgmma::pin_fragment(&mut da[kk]);
            }
            if lane == 0 {
                // SAFETY: every product reading this stage is complete (the waits above); one
                // arrival per consumer warp and phase.
                unsafe { empty(pos.stage).arrive() };
            }
        }
    }

    // dQ (times the scale) of the thread's rows.
    let st = p.base.dq_strides;
    let dq_base = p
        .base
        .dq
        .wrapping_add((batch as u64 * st[0] + head as u64 * st[2]) as usize);
    let scale = p.base.scale;
    for h in 0..2 {
        let i = row0 + 8 * h as u32;
        if i < seq_q {
            let row = dq_base.wrapping_add((i as u64 * st[1]) as usize);
            for j in 0..DR / 4 {
                let col = 8 * j as u32 + 2 * t;
                // Columns past the tensors' head dimension (a padded plan) are not stored.
                if col >= p.base.head_dim {
                    continue;
                }
                let x = 4 * j + 2 * h;
                let v2 = E::pack(dq[x] * scale, dq[x + 1] * scale);
                // SAFETY: row i < seq_q, column + 1 < head_dim (even, a multiple of 16): inside
                // dQ; 4-byte aligned (16-byte aligned rows, even column); each element has one
                // writer.
                unsafe { *(row.wrapping_add(col as usize) as *mut u32) = v2 };
            }
        }
    }
}
