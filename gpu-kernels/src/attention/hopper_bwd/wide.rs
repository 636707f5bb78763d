//! `attention_bwd_hopper_dkdvq_{bf16,f16}_d256` (and their `softcap_` and `varlen_` forms,
//! `VARLEN` over packed sequences as in [`super::dkdv`]): the dK/dV/dQ
//! kernel of the attention backward for wide heads on Hopper (sm_90a), TMA, an mbarrier ring,
//! `wgmma` and warp specialization. The semantics are
//! [`AttentionBwdParams`](kernel_abi::attention::backward::AttentionBwdParams)'; dQ is added
//! into the tiled f32 accumulator (`dq_accum_tile_base`, `dq_tile_vector`) and converted by
//! `attention_bwd_hopper_dq_convert_*` as for [`super::dkdv`]'s dK/dV/dQ kernel.
//!
//! # Parameters
//! [`HopperBwdParams`]: tensor maps of Q, dO (box rows `HOPPER_BWD_BLOCK_M`), K and V (box rows
//! `HOPPER_BWD_WIDE_BLOCK_N`), all `[D, heads, seq, batch]` with 128-byte swizzle, then the
//! backward's parameters (LSE, `delta'`, the dQ accumulator, dK, dV and their strides, sizes,
//! scale, window, softcap); `VARLEN`: the packed tensors and boundaries, as for
//! [`super::dkdv`].
//!
//! # Tiling
//! One block per `BN = 64` keys of one key/value head of one sequence (grid `(ceil(seq_k /
//! 64), heads_kv, batch)`, positions as in `grid_position`): dK and dV of 128 keys would need
//! D f32 registers per thread each, so both consumers cover the same 64 keys and split the
//! columns instead. K and V are loaded once; the steps are the walk of [`Walk`] (64-row query
//! blocks of every query head of the group), their Q and dO tiles through a 2-stage ring.
//! Tiles are `D / 64` column blocks of 128-byte swizzled rows. Per step, consumer `c`:
//! - `S^T = K Q^T` and `dP^T = V dO^T` over its 32 queries `32 c ..` of the step
//!   (`m64n32k16`, keys as M, both operands K-major);
//! - `P^T = exp2(S^T scale_log2 - LSE log2 e)` (0 where masked or LSE = -inf) and `dS^T = P^T
//!   (dP^T - delta')` (with `SOFTCAP`, `S^T` replaced by `t = tanh(S^T softcap_scale)` and `dS^T`
//!   scaled by `1 - t^2`), stored in the element type into this step's `P^T` and `dS^T` buffers
//!   (keys as 128-byte swizzled rows of the 64 queries: the layout TMA gives a Q tile), so
//!   that each consumer then reads both halves;
//! - over its columns `c D / 2 ..` (`m64n{D/2}k16`, every operand in shared memory):
//!   `dQ_step = dS K` (A = the `dS^T` buffer M-major, B = the K tile N-major, 64 keys), `dV +=
//!   P^T dO` and `dK += dS^T Q` (A = the buffers K-major, B = dO and Q MN-major, 64 queries);
//! - adds `dQ_step` into the accumulator's tile with `red.global.add.v4.f32` from registers
//!   (16 bytes per thread, consecutive across the warp, in the tile's order); in deterministic
//!   mode (`dq_order` set) after the key block before it in the order ([`DqOrder`]), so the
//!   sums are the same bit for bit from run to run.
//!
//! The epilogue stores `dK scale` and `dV` of the consumer's columns.
//!
//! # Thread mapping
//! 384 threads. Warpgroup 0 produces ([`produce`]): thread 0 issues every TMA load, warp 1
//! writes each step's row values (LSE in base 2, `delta'`), and in deterministic mode warp 2
//! orders the block's dQ additions ([`order_dq`]). Warpgroups 1 and 2 consume
//! (`HOPPER_CONSUMER_REGS` registers): consumer `c` owns columns `c D / 2 .. (c + 1) D / 2` of
//! the block's dK and dV (`D / 4` f32 registers each) for the whole walk. A thread holds, per
//! accumulator, keys (or, for dQ, query rows) `16 w + g` and `16 w + g + 8` (warp `w` of its
//! warpgroup, `g = lane / 4`) and columns `8 j + 2 t, + 1` (`t = lane % 4`) of the product.
//!
//! # Barrier protocol
//! - Start: with `VARLEN` in deterministic mode every thread first checks some of the
//!   boundaries and `sync_threads_or` gives the block whether any is out of order
//!   ([`Walk::of`]: then the block adds without order, consumers and order warp alike). Then
//!   ([`Walk::publish`], [`Ring::init`]) thread 0 stores the sequence (`VARLEN`) and the
//!   block's position, initializes
//!   `kv_full` (count 1), `full[s]` (count 33: thread 0's and the 32 lanes of warp 1's) and
//!   `empty[s]` (count 256: every consumer thread), `fence.mbarrier_init`, then
//!   `sync_threads`. The warpgroups never meet at a block
//!   barrier again. A block without steps loads nothing and waits for nothing: it stores zero
//!   gradients.
//! - `kv_full` (phase 0 only): the producer arrives expecting K's and V's bytes and issues
//!   their loads; consumers wait for it before their first product.
//! - The Q/dO ring: step `i` uses stage `s = i % 2` with parity `(i / 2) % 2`. The producer's
//!   thread 0 and warp 1 each wait until `empty[s]` completed the stage's previous use (parity
//!   `^ 1`: the first pass does not wait); thread 0 arrives on `full[s]` expecting the step's Q
//!   and dO bytes and issues the loads; each lane of warp 1 stores its two rows' values into
//!   the stage and arrives (release). Consumers wait on `full[s]` before the step's first
//!   product and their row reads.
//! - `empty[s]`: every consumer thread arrives once the `wgmma.wait_group 0` that completes the
//!   step's dV and dK products (the last to read Q and dO) has returned; its reads of the
//!   step's row values were before.
//! - The `P^T` and `dS^T` buffers: step `i` writes buffers `i % 2`. Each consumer thread stores
//!   its values, fences the async proxy and syncs on named barrier `DS_BARRIER` (both
//!   consumers, 256 threads); then both issue their dQ, dV and dK products reading the whole
//!   buffers, and wait for them (`wait_group 0`) before their next step. A consumer writes
//!   buffers `i % 2` again at step `i + 2`, after passing step `i + 1`'s barrier, which the
//!   other consumer reached only after its own step-`i` wait: no product still reads them.
//! - Within a step, `wgmma` groups: `S^T`, `dP^T` (`wait_group 1`: `S^T` done, then 0); after
//!   the barrier dQ, dV, dK in that order (`wait_group 2`: dQ done, its additions issued while
//!   dV and dK run; then 0). Every batch starts with `wgmma.fence`; accumulators are pinned
//!   around every wait (`fence_operands`).
//! - dQ: reductions into global memory; the conversion kernel runs after this kernel on the
//!   same stream. In the default mode no barrier. In deterministic mode, per step, named
//!   barriers `DQ_READY` and `DQ_DONE` of both consumers and the order warp (288 threads): the
//!   order warp's lane 0 acquires the step's tile ([`DqOrder::acquire`]) and the warp arrives
//!   on `DQ_READY`; the consumers sync on `DQ_READY` before their reductions and arrive on
//!   `DQ_DONE` after them; the order warp syncs on `DQ_DONE` and lane 0 releases the tile
//!   (`st.release.gpu`, cumulative: it orders the reductions the barrier published). Neither
//!   barrier can run a phase ahead: the order warp arrives on `DQ_READY` for step `i + 1` only
//!   after step `i`'s `DQ_DONE`, and the consumers arrive on `DQ_DONE` for step `i + 1` only
//!   after step `i + 1`'s `DQ_READY`.
//!
//! NaN safety: as the other backward kernels (masked entries and rows whose LSE is -inf give P
//! = 0 exactly; rows past `seq_q` and keys past `seq_k` read zeros from TMA and are masked).

use super::super::elem::Elem;
use super::super::{logits, mask};
use super::producer::{DqOrder, Ring, Walk, produce, store_dk_dv};
use super::{CONSUMER_THREADS, DS_BARRIER};
use crate::arch::mbarrier::RingPos;
use crate::arch::tma::TensorMapPtr;
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{atomic, fence, index, math, regs, smem, sync, warp};
use kernel_abi::attention::hopper_bwd::{
    HOPPER_BWD_BLOCK_M as BM, HOPPER_BWD_STAGES as STAGES, HOPPER_BWD_WIDE_BLOCK_N as BN,
    HOPPER_DQ_TILE_ROWS, HopperBwdConfig, HopperBwdParams, dq_accum_tile_base, dq_tile_vector,
};
use kernel_abi::attention::{HOPPER_ATOM, HOPPER_CONSUMER_REGS, HOPPER_CONSUMERS};
use kernel_abi::{WARP_SIZE, WARPGROUP_SIZE};

/// Queries of one consumer's `S^T` and `dP^T` per step (their `wgmma` N).
const QC: u32 = BM / HOPPER_CONSUMERS;
/// Accumulator registers of `S^T` and `dP^T` (`m64n32`).
const WR: usize = (QC / 2) as usize;
/// 8-column blocks of `S^T`.
const NTC: usize = (QC / 8) as usize;
/// 16-query K slices of `dV += P^T dO` and `dK += dS^T Q`.
const KQ: u32 = BM / 16;
/// 16-key K slices of `dQ = dS K`.
const KN: u32 = BN / 16;
/// Named barrier (deterministic mode): the step's tile is acquired, the consumers may add.
const DQ_READY: u32 = DS_BARRIER + 1;
/// Named barrier (deterministic mode): the consumers' additions of the step are issued.
const DQ_DONE: u32 = DS_BARRIER + 2;
/// Threads at `DQ_READY` and `DQ_DONE`: both consumers and the order warp.
const ORDER_THREADS: u32 = CONSUMER_THREADS + WARP_SIZE;
/// The producer warpgroup's warp that orders the dQ additions in deterministic mode.
const ORDER_WARP: u32 = 2;

/// The kernel body; see the module documentation. `HR = D / 4` accumulator registers of dK, dV
/// and dQ (`m64n{D/2}`), `DK = D / 16` K slices of `S^T` and `dP^T`; the `wgmma` shapes come in
/// as functions so one body serves both element types. `EARLY_EMPTY` is the negative control
/// `negative_attention_bwd_hopper_early_empty` only: each consumer thread arrives on `empty[s]`
/// as soon as `full[s]` completes, before it reads the stage's row values and before the
/// products read its Q and dO, so the producer may refill the stage under them (a
/// write-after-read race on shared memory that racecheck must report).
///
/// # Safety
/// Launched with grid `(ceil(seq_k / BN), heads_kv, batch)`, `HOPPER_THREADS` threads, the
/// configuration's shared memory, and parameters as documented on [`HopperBwdParams`]
/// (validated by the host), after the preprocess that wrote `delta'` and zeroed the tiled dQ
/// accumulator (`dq_accum_len` elements).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn wide<
    E: Elem,
    const D: u32,
    const HR: usize,
    const DK: usize,
    const SOFTCAP: bool,
    const EARLY_EMPTY: bool,
    const VARLEN: bool,
>(
    p: &HopperBwdParams,
    cfg: &HopperBwdConfig,
    tmaps: [TensorMapPtr; 4],
    s_zero: impl Fn(&mut [f32; WR], Descriptor, Descriptor),
    s_mma: impl Fn(&mut [f32; WR], Descriptor, Descriptor),
    s_fence: impl Fn(&mut [f32; WR]),
    g_mma: impl Fn(&mut [f32; HR], Descriptor, Descriptor),
    q_zero: impl Fn(&mut [f32; HR], Descriptor, Descriptor),
    q_mma: impl Fn(&mut [f32; HR], Descriptor, Descriptor),
    h_fence: impl Fn(&mut [f32; HR]),
) {
    const {
        assert!(HR as u32 * 4 == D && DK as u32 * 16 == D && (D / 2).is_multiple_of(HOPPER_ATOM));
        assert!(BN == 64 && BM == HOPPER_DQ_TILE_ROWS && QC.is_multiple_of(8));
    };
    debug_assert!(cfg.fused_dq && cfg.wide() && cfg.block_n() == BN && cfg.block_m == BM);
    let ring = Ring::new(cfg);
    let base = ring.base;
    // SAFETY: the parameters' contract (the caller's).
    let walk = unsafe { Walk::<VARLEN>::of(p, cfg) };
    let (steps, n0) = (walk.steps, walk.n0);
    // Dense: the lengths of the parameters (packed sequences read theirs where used: `Walk`).
    let (seq_q, seq_k, heads_q) = (p.base.seq_q, p.base.seq_k, p.base.heads_q);
    let (wl, wr) = (p.base.window_left, p.base.window_right);
    let (off32, sk32) = ((seq_k as i64 - seq_q as i64) as i32, seq_k as i32);

    // SAFETY: every thread, once, before the role split (`init`'s barrier publishes the
    // sequence).
    unsafe {
        walk.publish();
        ring.init(&tmaps);
    }
    if index::warpgroup_id() == 0 {
        // SAFETY: the whole producer warpgroup, after `init`.
        unsafe { produce(p, cfg, &ring, &walk, tmaps) };
        let order = DqOrder::of(p, &walk);
        if order.ordered() && index::warp_id() == ORDER_WARP && steps > 0 {
            // SAFETY: the order warp, once, with the consumers' barriers every step.
            unsafe { order_dq(&walk, &order) };
        }
        return;
    }

    // Consumers.
    // SAFETY: the whole consumer warpgroup executes this, uniformly.
    unsafe { regs::increase::<HOPPER_CONSUMER_REGS>() };
    let c = index::warpgroup_id() - 1;
    let tid = index::thread_idx_x() % WARPGROUP_SIZE;
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let w = index::warp_id() % 4;
    // The thread's keys: `key0` and `key0 + 8`.
    let key0 = n0 + 16 * w + g;
    // The consumer's queries of `S^T` (within a step) and its columns of dK, dV, dQ.
    let (q0c, col0) = (c * QC, c * D / 2);
    let (scale_log2, softcap_scale) = (p.base.scale_log2, p.base.logits.softcap_scale);
    let ordered = walk.ordered(p);
    let mut dk = [0.0f32; HR];
    let mut dv = [0.0f32; HR];

    if steps > 0 {
        // SAFETY: the producer issues K and V when `steps > 0`, completing this phase.
        unsafe { ring.kv_full().wait_parity(0) };
        for step in 0..steps {
            let pos = RingPos::<STAGES>::of(step);
            let m0 = walk.m0(step);
            // SAFETY: the producer issues every step's Q and dO, so this phase completes.
            unsafe { ring.full(pos.stage).wait_parity(pos.phase) };
            if EARLY_EMPTY {
                // SAFETY: one arrival per consumer thread and phase, as below; releasing the
                // stage before its reads is the negative control's deliberate bug.
                unsafe { ring.empty(pos.stage).arrive() };
            }
            // Recomputed each step rather than held across the loop: the descriptors of these
            // loop-invariant operands would otherwise take registers the products need.
            let o = regs::opaque;
            let (kt, vt) = (o(ring.k()), o(ring.v()));
            let (qt, dot) = (o(ring.q(pos.stage)), o(ring.d_o(pos.stage)));

            // S^T = K Q^T and dP^T = V dO^T for the consumer's 32 queries (two groups).
            let mut s = [0.0f32; WR];
            let mut dp = [0.0f32; WR];
            // SAFETY: whole warpgroup, uniform control flow; K, V and this stage were
            // published by their completed phases and are not overwritten before this step's
            // `empty` arrival.
            unsafe {
                wgmma::fence();
                for kk in 0..DK as u32 {
                    let (cb, within) = (kk / 4, 32 * (kk % 4));
                    let a = Descriptor::k_major_sw128(kt + cb * cfg.block_bytes(BN) + within);
                    let rows = cb * cfg.block_bytes(BM) + q0c * 128 + within;
                    let b = Descriptor::k_major_sw128(qt + rows);
                    if kk == 0 {
                        s_zero(&mut s, a, b);
                    } else {
                        s_mma(&mut s, a, b);
                    }
                }
                wgmma::commit_group();
                for kk in 0..DK as u32 {
                    let (cb, within) = (kk / 4, 32 * (kk % 4));
                    let a = Descriptor::k_major_sw128(vt + cb * cfg.block_bytes(BN) + within);
                    let rows = cb * cfg.block_bytes(BM) + q0c * 128 + within;
                    let b = Descriptor::k_major_sw128(dot + rows);
                    if kk == 0 {
                        s_zero(&mut dp, a, b);
                    } else {
                        s_mma(&mut dp, a, b);
                    }
                }
                wgmma::commit_group();
                // Groups complete in order: S^T is done, dP^T may still run.
                wgmma::wait_group::<1>();
            }
            s_fence(&mut s);

            // P^T in `s` and the softcap's factor in `f`: the thread's query columns
            // `q0c + 8 j + 2 t + e` of the step.
            let rows_s = ring.rows(pos.stage);
            // Packed sequences: the sizes loaded where used (`Walk::mask_sizes_or`).
            let needs_mask = {
                let (seq_q, off32, sk32) = walk.mask_sizes_or((seq_q, off32, sk32));
                m0 + q0c + QC > seq_q
                    || mask::step_needs_mask::<QC, BN>(m0 + q0c, n0, off32, wl, wr, sk32)
            };
            let mut f = [1.0f32; WR];
            for j in 0..NTC {
                let col = q0c + 8 * j as u32 + 2 * t;
                // SAFETY: the stage's row values, published by `full` (waited for above); `col`
                // even: 8-byte aligned.
                let lse2: [f32; 2] = unsafe { smem::SmemValue::load(rows_s + 4 * col) };
                for e in 0..4 {
                    let x = 4 * j + e;
                    let (l, factor) = logits::backward_logit::<SOFTCAP>(s[x], softcap_scale);
                    s[x] = math::exp2(math::fma(l, scale_log2, -lse2[e % 2]));
                    if SOFTCAP {
                        f[x] = factor;
                    }
                }
            }
            if needs_mask {
                let (seq_q, off32, sk32) = walk.mask_sizes_or((seq_q, off32, sk32));
                // The query columns each of the thread's keys may see, counted from its first
                // column `m0 + q0c + 2 t`; P^T is 0 outside them.
                let range = |h: u32| {
                    let key = (key0 + 8 * h) as i32;
                    let (lo, hi) = mask::query_range(key, seq_q, off32, wl, wr, sk32);
                    let base = (m0 + q0c + 2 * t) as i32;
                    (lo - base, hi - base)
                };
                let ((lo0, hi0), (lo1, hi1)) = (range(0), range(1));
                mask::fill_outside(&mut s, [lo0, lo1], [hi0, hi1], 0.0);
            }
            // SAFETY: whole warpgroup, uniform control flow.
            unsafe { wgmma::wait_group::<0>() };
            s_fence(&mut dp);
            // dS^T = P^T (dP^T - delta') (times the softcap's factor).
            for j in 0..NTC {
                let col = q0c + 8 * j as u32 + 2 * t;
                // SAFETY: as for LSE.
                let delta: [f32; 2] = unsafe { smem::SmemValue::load(rows_s + 4 * (BM + col)) };
                for e in 0..4 {
                    let x = 4 * j + e;
                    dp[x] = s[x] * f[x] * (dp[x] - delta[e % 2]);
                }
            }
            let pt_buf = o(base + cfg.pt_offset(step % 2));
            let ds_buf = o(base + cfg.ds_offset(step % 2));
            // SAFETY: the buffers' previous readers (step - 2's products of both consumers)
            // completed before their arrivals on the previous step's barrier.
            unsafe {
                store_t::<E>(pt_buf, &s, c, w, g, t);
                store_t::<E>(ds_buf, &dp, c, w, g, t);
            }
            fence::fence_proxy_async_shared();
            // SAFETY: both consumer warpgroups, every thread, once per step (the same number
            // of steps in both).
            unsafe { sync::named_sync(DS_BARRIER, CONSUMER_THREADS) };

            // dQ_step = dS K, dV += P^T dO, dK += dS^T Q over the consumer's columns.
            let mut dq = [0.0f32; HR];
            let cb0 = col0 / HOPPER_ATOM;
            // SAFETY: whole warpgroup, uniform control flow; the buffers were published by the
            // barrier after each writer's proxy fence; the tiles as above.
            unsafe {
                wgmma::fence();
                for kk in 0..KN {
                    let a = Descriptor::mn_major_sw128(ds_buf + 2048 * kk, cfg.block_bytes(BN));
                    let at = kt + cb0 * cfg.block_bytes(BN) + 2048 * kk;
                    let b = Descriptor::mn_major_sw128(at, cfg.block_bytes(BN));
                    if kk == 0 {
                        q_zero(&mut dq, a, b);
                    } else {
                        q_mma(&mut dq, a, b);
                    }
                }
                wgmma::commit_group();
                for kk in 0..KQ {
                    let a = Descriptor::k_major_sw128(pt_buf + 32 * kk);
                    let at = dot + cb0 * cfg.block_bytes(BM) + 2048 * kk;
                    g_mma(
                        &mut dv,
                        a,
                        Descriptor::mn_major_sw128(at, cfg.block_bytes(BM)),
                    );
                }
                wgmma::commit_group();
                for kk in 0..KQ {
                    let a = Descriptor::k_major_sw128(ds_buf + 32 * kk);
                    let at = qt + cb0 * cfg.block_bytes(BM) + 2048 * kk;
                    g_mma(
                        &mut dk,
                        a,
                        Descriptor::mn_major_sw128(at, cfg.block_bytes(BM)),
                    );
                }
                wgmma::commit_group();
                // dQ is done; dV and dK may still run.
                wgmma::wait_group::<2>();
            }
            h_fence(&mut dq);
            let tile = if VARLEN {
                (walk.accum_row0(p, walk.head(step)) + m0 as u64) * D as u64
            } else {
                dq_accum_tile_base(walk.batch(), walk.head(step), heads_q, seq_q, m0, D)
            };
            let dst = p.base.dq_accum.wrapping_add(tile as usize);
            if ordered {
                // SAFETY: both consumers and the order warp, once per step (the protocol).
                unsafe { sync::named_sync(DQ_READY, ORDER_THREADS) };
            }
            for v in 0..HR / 4 {
                let at = dst.wrapping_add(dq_tile_vector(D, c, v as u32, tid) as usize);
                // SAFETY: inside the accumulator's tile of this step (the host sized it for
                // every (sequence, head, tile)), 16-byte aligned (aligned base, 4-element
                // vectors).
                unsafe {
                    atomic::red_add_v4_f32(
                        at,
                        [dq[4 * v], dq[4 * v + 1], dq[4 * v + 2], dq[4 * v + 3]],
                    )
                };
            }
            if ordered {
                // SAFETY: as for `DQ_READY`; the arrival publishes the reductions above.
                unsafe { sync::named_arrive(DQ_DONE, ORDER_THREADS) };
            }
            // SAFETY: whole warpgroup, uniform control flow.
            unsafe { wgmma::wait_group::<0>() };
            h_fence(&mut dv);
            h_fence(&mut dk);
            if !EARLY_EMPTY {
                // SAFETY: every product reading this stage is complete (the wait above) and
                // this thread's reads of its row values were before; one arrival per consumer
                // thread and phase.
                unsafe { ring.empty(pos.stage).arrive() };
            }
        }
    }

    // SAFETY: the thread's keys and the consumer's columns of dK and dV (validated by the
    // host), one writer per element.
    unsafe { store_dk_dv::<E, HR, VARLEN>(p, &walk, key0, col0, &dk, &dv) };
}

/// The order warp (deterministic mode): for each step of the walk, lane 0 waits until the
/// step's tile may receive this block's additions ([`DqOrder::acquire`]), the warp lets the
/// consumers add (`DQ_READY`), waits until they have issued their reductions (`DQ_DONE`), and
/// lane 0 publishes them ([`DqOrder::release`]: a release store at GPU scope, after the
/// barrier that ordered the consumers' reductions before it).
///
/// # Safety
/// Warp [`ORDER_WARP`] of the producer warpgroup calls it once, in deterministic mode, when the
/// walk has steps; the consumers sync on `DQ_READY` and arrive on `DQ_DONE` once per step.
#[inline(always)]
unsafe fn order_dq<const VARLEN: bool>(walk: &Walk<VARLEN>, order: &DqOrder<VARLEN>) {
    let lane = index::lane_id();
    for step in 0..walk.steps {
        let (h, m0) = (walk.head(step), walk.m0(step));
        if lane == 0 {
            // SAFETY: ordered mode, one thread before the block's additions into the step's
            // tile; the counters were sized by the host and zeroed by the preprocess.
            unsafe { order.acquire(h, m0) };
        }
        // SAFETY: every lane of the warp.
        unsafe { sync::sync_warp(warp::FULL_MASK) };
        // SAFETY: the whole warp, once per step (the protocol on the module).
        unsafe {
            sync::named_arrive(DQ_READY, ORDER_THREADS);
            sync::named_sync(DQ_DONE, ORDER_THREADS);
        }
        if lane == 0 {
            // SAFETY: the consumers' additions of the step precede their `DQ_DONE` arrivals.
            unsafe { order.release(h, m0) };
        }
    }
}

/// Store a consumer's `m64n32` values `x` (keys `16 w + g` and `16 w + g + 8`; query columns
/// `32 c + 8 j + 2 t` and the next) in the element type into the `P^T` or `dS^T` buffer at
/// `buf`: key `r` of the block is row `r`, 128 bytes of 64 queries, its 16-byte chunk `k` at
/// chunk `k ^ (r % 8)` (128-byte swizzle; `r % 8 = g`). For a warp instruction the 32 lanes
/// write 32 distinct banks.
///
/// # Safety
/// `buf` is a buffer of the configuration that no product reads until the barrier after these
/// stores.
#[inline(always)]
unsafe fn store_t<E: Elem>(buf: u32, x: &[f32; WR], c: u32, w: u32, g: u32, t: u32) {
    for j in 0..NTC as u32 {
        let chunk = c * NTC as u32 + j;
        for h in 0..2u32 {
            let r = 16 * w + g + 8 * h;
            let e = (4 * j + 2 * h) as usize;
            // SAFETY: r < BN and chunk < BM / 8: inside the buffer (the caller's); each word
            // has one writer.
            unsafe {
                smem::SmemValue::store(
                    buf + 128 * r + ((chunk ^ g) << 4) + 4 * t,
                    E::pack(x[e], x[e + 1]),
                )
            };
        }
    }
}
