//! `attention_bwd_hopper_dkdv_{bf16,f16}_d{64,128}`: the dK/dV kernel of the attention backward
//! on Hopper (sm_90a) with TMA, an mbarrier ring, `wgmma` and warp specialization. Same results
//! as the `mma.sync` dK/dV kernel of the deterministic mode; the semantics are
//! [`AttentionBwdParams`](kernel_abi::attention::backward::AttentionBwdParams)'.
//! `attention_bwd_hopper_dkdvq_*` is the same body with `FUSED`: each step also computes its
//! share of dQ and adds it into the tiled f32 accumulator (below);
//! `attention_bwd_hopper_dkdvq_varlen_*` that body with `VARLEN`, over packed sequences.
//!
//! # Parameters
//! [`HopperBwdParams`]: tensor maps of Q, dO (box rows `BM`, the configuration's `block_m`), K
//! and V (box rows `HOPPER_BWD_BLOCK_N`), all `[D, heads, seq, batch]` with 128-byte swizzle,
//! then the backward's parameters (LSE, `delta'`, dK, dV and their strides, sizes, scale,
//! window). `VARLEN`: the maps describe the packed tensors `[D, heads, total, 1]`; each block
//! locates its sequence (`Walk`), loads the boxes from the sequence's first rows (a box
//! reaching past a sequence's end reads the next one's rows, masked: their LSE is +inf and
//! their keys are past `seq_k`), stores its keys of dK and dV from the sequence's first key
//! row, and adds dQ into the packed tiled accumulator (`dq_accum_varlen_row0`).
//!
//! # Tiling
//! One block per `BN = 128` keys of one key/value head of one sequence (grid `(ceil(seq_k /
//! 128), heads_kv, batch)`; in deterministic mode block `x` takes the key block `nb - 1 - x`
//! of `nb` and the (head, sequence) pairs are interleaved in launch order, see `Walk` and
//! `grid_position`); its K and V tiles are loaded once. The steps are, for each query
//! head of the group in turn, the `BM`-row query blocks that may see a key of the block (causal
//! and window bounds; the others are skipped), their Q and dO tiles streamed through a 2-stage
//! ring. `BM` is 64, or 128 in the dK/dV/dQ kernel at D = 64 (`HopperBwdConfig::block_m`).
//! Tiles are `D / 64` column blocks of 128-byte swizzled rows. Keys are the rows of every
//! product (`wgmma` M):
//! - `S^T = K Q^T` and `dP^T = V dO^T` (`m64n{BM}k16`, both operands K-major in shared memory);
//! - `P^T = exp2(S^T scale_log2 - LSE log2 e)` (0 where masked or LSE = -inf), `dS^T = P^T
//!   (dP^T - delta')` (with `SOFTCAP`, `S^T` replaced by `t = tanh(S^T softcap_scale)` and
//!   `dS^T` scaled by `1 - t^2`), both rounded to the element type as register A fragments
//!   (LSE in base 2 and `delta'` of the step's rows come from shared memory, written by the
//!   producer);
//! - `dV += P^T dO` and `dK += dS^T Q` (`m64n{D}k16`, dO and Q MN-major: the 16-row K slice `kk`
//!   at `2048 kk` bytes, column blocks one swizzle atom apart).
//!
//! The epilogue stores `dK scale` and `dV` (element type) from the accumulators.
//!
//! With `FUSED`, per step after `dS^T`: each consumer stores its `dS^T` fragments into the
//! step's `dS^T` buffer (of two, alternating; keys as 128-byte swizzled rows of 64 queries, the
//! layout TMA gives a Q tile, one such column block per 64 queries), and `dQ_step = dS K` over
//! the 128 keys (A = the buffer M-major, B = the K tile N-major) gives the consumer's part of
//! the step's dQ (`HopperBwdConfig::dq_part`): with 64-row steps its `D / 2` columns of the
//! step's rows (`m64n{D/2}k16`), with 128-row steps every column of the step's rows `64 c ..`
//! (`m64n{D}k16`, A = column block `c`): one whole accumulator tile. The consumer writes it
//! into its part buffer in shared memory and the writer warp of the producer warpgroup adds it
//! with a bulk reduce-add into the accumulator (`dq_accum_tile_base`, `dq_tile_vector`); the
//! conversion kernel scales it into dQ. In deterministic mode (`dq_order` set) the writer adds
//! each tile after the key block before it in the order (`write_dq`), so the sums are the same
//! bit for bit from run to run.
//!
//! # Thread mapping
//! 384 threads. Warpgroup 0 produces: it drops to `HOPPER_PRODUCER_REGS` registers, its
//! thread 0 issues every TMA load, its warp 1 writes each step's row values (LSE in base 2,
//! `delta'`; `BM / 32` rows per lane) into the stage, and with `FUSED` its warp 2 adds the dQ
//! parts into the accumulator. Warpgroups 1 and 2 consume (`HOPPER_CONSUMER_REGS`
//! registers): consumer `c` owns keys `64 c .. 64 c + 64` of the block, with their dK and dV
//! accumulators (`D / 2` f32 registers each) for the whole block's walk. A thread holds, per
//! accumulator, rows `16 w + g` and `16 w + g + 8` (warp `w` of its warpgroup, `g = lane / 4`)
//! and columns `8 j + 2 t, + 1` (`t = lane % 4`).
//!
//! # Barrier protocol
//! - Start (`VARLEN`, deterministic mode): every thread checks some of the boundaries and
//!   `sync_threads_or` gives the block whether any is out of order (`Walk::of`). Then thread 0
//!   stores the sequence (`VARLEN`) and the block's position (`Walk::publish`) and
//!   initializes `kv_full` (count 1), `full[s]` (count 33: thread 0's and the 32 lanes of warp
//!   1's) and `empty[s]` (count 256: one arrival per consumer thread), `fence.mbarrier_init`,
//!   then `sync_threads` publishes them; the sequence's and position's words are never
//!   written again.
//!   The warpgroups never meet at a block barrier again. A block without steps (no query row
//!   sees its keys) loads nothing and waits for nothing: it stores zero gradients.
//! - `kv_full` (phase 0 only): the producer arrives expecting K's and V's bytes and issues
//!   their loads; consumers wait for it before their first product.
//! - The Q/dO ring: step `i` uses stage `s = i % 2` with parity `(i / 2) % 2`. The producer's
//!   thread 0 and warp 1 each wait until `empty[s]` completed the stage's previous use (parity
//!   `^ 1`: the first pass does not wait); thread 0 arrives on `full[s]` expecting the step's Q
//!   and dO bytes and issues the loads; each lane of warp 1 stores its rows' values into the
//!   stage and arrives (release: the stores are visible to whoever completes the phase's
//!   wait). Consumers wait on `full[s]` before the step's first product and their row reads.
//! - `empty[s]`: every consumer thread arrives once the `wgmma.wait_group 0` that completes the
//!   step's dV and dK products (the last to read Q and dO) has returned; its reads of the
//!   step's row values were before, and its own arrival (release) orders them before the
//!   producer's next stores there (an arrival by one lane per warp would not order the other
//!   lanes' reads: racecheck reports that as a write-after-read hazard).
//! - Within a step, four `wgmma` groups: S^T, dP^T, then dV once P^T is packed (S^T waited
//!   for with `wait_group 1`, dP^T still running), then dK once dS^T is (`wait_group 1`: dV
//!   may still run), with `FUSED` a fifth, dQ: without a softcap issued before dK (once the
//!   `dS^T` buffer is published, dV possibly running), then a `wait_group 1` retires dV and
//!   dQ and the consumer stages its dQ part while dK runs; under a softcap (more registers in
//!   use) issued after a `wait_group 0` that retires dV and dK. `wait_group 0` ends the step.
//! - `FUSED`, the `dS^T` buffers: step `i` writes buffer `i % 2`. Each consumer thread
//!   stores its fragments, fences the async proxy and syncs on named barrier `DS_BARRIER`
//!   (both consumers, 256 threads); then both issue their dQ products reading the buffer (the
//!   other consumer's keys too), and wait for them (`wait_group 0`) before their next step. A
//!   consumer writes buffer `i % 2` again at step `i + 2`, after passing step `i + 1`'s
//!   barrier, which the other consumer reached only after its own step-`i` wait: no product
//!   still reads it.
//! - `FUSED`, the dQ parts: per consumer, named barriers `DQ_EMPTY + c` and `DQ_FULL +
//!   c` between its 128 threads and the writer warp's 32, as documented on `stage_dq` and
//!   `write_dq`: the consumer stores after `DQ_EMPTY` (the writer done reading), publishes
//!   with `DQ_FULL`; the writer issues the reduce after `DQ_FULL` and arrives on `DQ_EMPTY`
//!   once it has been read; before the block exits the writer waits for its last reduce
//!   (`bulk_wait_group 0`). In deterministic mode the tiles' counters order the writers of
//!   the blocks (acquire before the step's first reduce, release after its reduces are
//!   performed).
//! - Registers: the P^T and dS^T fragments of the in-flight products are pinned until their
//!   wait; every `wgmma` batch starts with `wgmma.fence` (the accumulators of dK and dV and the
//!   fragments were written by ordinary instructions before it); accumulators are pinned
//!   around every wait (`fence_operands`).
//!
//! NaN safety: as the `mma.sync` kernels (masked entries and rows whose LSE is -inf give P = 0
//! exactly; rows past `seq_q` and keys past `seq_k` read zeros from TMA and are masked).

use super::super::elem::Elem;
use super::super::hopper::softmax::pack_p;
use super::super::{logits, mask};
use super::producer::{DqOrder, Ring, Walk, produce, store_dk_dv};
use super::{CONSUMER_THREADS, DS_BARRIER, softcap_grad_of_p};
use crate::arch::mbarrier::RingPos;
use crate::arch::tma::TensorMapPtr;
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{fence, index, math, regs, smem, sync, tma, warp};
use kernel_abi::attention::hopper_bwd::{
    HOPPER_BWD_BLOCK_N as BN, HOPPER_BWD_STAGES as STAGES, HOPPER_DQ_TILE_ROWS, HopperBwdConfig,
    HopperBwdParams, dq_accum_rows, dq_accum_tile_base, dq_tile_vector,
};
use kernel_abi::attention::{HOPPER_ATOM, HOPPER_CONSUMER_REGS, HOPPER_CONSUMERS};
use kernel_abi::{WARP_SIZE, WARPGROUP_SIZE};

/// Keys of one consumer warpgroup (the M of its products).
const WG_KEYS: u32 = BN / HOPPER_CONSUMERS;
/// Named barriers `DQ_FULL + c`: consumer `c` stored its dQ part.
const DQ_FULL: u32 = 2;
/// Named barriers `DQ_EMPTY + c`: the writer warp is done reading consumer `c`'s part.
const DQ_EMPTY: u32 = DQ_FULL + HOPPER_CONSUMERS;
/// Threads at the dQ parts' barriers: a consumer warpgroup and the writer warp.
const DQ_SYNC_THREADS: u32 = WARPGROUP_SIZE + WARP_SIZE;
/// The producer warpgroup's warp that adds the dQ parts into the accumulator.
const DQ_WRITER_WARP: u32 = 2;

/// The kernel body; see the module documentation. `DR = D / 2` accumulator registers of dK and
/// dV, `DK = D / 16` K slices of `S^T` and `dP^T`, `BM` query rows per step (the
/// configuration's), `SR = BM / 2` accumulator registers of `S^T` and `dP^T`, `KQ = BM / 16` K
/// slices of `dV` and `dK` (the A fragments of `P^T` and `dS^T`), `QR = D BM / 256` of a
/// consumer's dQ; the `wgmma` shapes come in as functions so one body serves every head
/// dimension and element type.
///
/// # Safety
/// Launched with grid `(ceil(seq_k / BN), heads_kv, batch)`, `HOPPER_THREADS` threads, the
/// configuration's shared memory, and parameters as documented on [`HopperBwdParams`]
/// (validated by the host), after the preprocess that wrote `delta'`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dkdv<
    E: Elem,
    const D: u32,
    const DR: usize,
    const DK: usize,
    const SOFTCAP: bool,
    const FUSED: bool,
    const BM: u32,
    const SR: usize,
    const KQ: usize,
    const QR: usize,
    const VARLEN: bool,
>(
    p: &HopperBwdParams,
    cfg: &HopperBwdConfig,
    tmaps: [TensorMapPtr; 4],
    s_zero: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    s_mma: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    s_fence: impl Fn(&mut [f32; SR]),
    g_mma: impl Fn(&mut [f32; DR], [u32; 4], Descriptor),
    g_fence: impl Fn(&mut [f32; DR]),
    q_mma: DqProducts<
        impl Fn(&mut [f32; QR], Descriptor, Descriptor),
        impl Fn(&mut [f32; QR], Descriptor, Descriptor),
        impl Fn(&mut [f32; QR]),
    >,
) {
    const {
        assert!(DR as u32 * 2 == D && DK as u32 * 16 == D && WG_KEYS == 64 && SR as u32 * 2 == BM);
        assert!(KQ as u32 * 16 == BM && (!FUSED || QR as u32 * 256 == D * BM));
        // A step's dQ is half a tile per consumer, or a whole one each.
        assert!(BM == HOPPER_DQ_TILE_ROWS || BM == HOPPER_CONSUMERS * HOPPER_DQ_TILE_ROWS);
    };
    debug_assert!(cfg.fused_dq == FUSED && cfg.block_m == BM && cfg.block_n() == BN);
    let ring = Ring::new(cfg);
    let base = ring.base;
    let (kv_full, k_s, v_s) = (ring.kv_full(), ring.k(), ring.v());
    // SAFETY: the parameters' contract (the caller's).
    let walk = unsafe { Walk::<VARLEN>::of(p, cfg) };
    let (steps, n0) = (walk.steps, walk.n0);
    // Dense: the lengths of the parameters (packed sequences read theirs where used: `Walk`).
    let (seq_q, seq_k) = (p.base.seq_q, p.base.seq_k);
    let (wl, wr) = (p.base.window_left, p.base.window_right);
    let off = seq_k as i64 - seq_q as i64;

    // SAFETY: every thread, once, before the role split (`init`'s barrier publishes the
    // sequence).
    unsafe {
        walk.publish();
        ring.init(&tmaps);
    }
    if index::warpgroup_id() == 0 {
        // SAFETY: the whole producer warpgroup, after `init`.
        unsafe { produce(p, cfg, &ring, &walk, tmaps) };
        if FUSED && index::warp_id() == DQ_WRITER_WARP && steps > 0 {
            // SAFETY: the writer warp, once, with the consumers' `stage_dq` every step.
            unsafe { write_dq(p, cfg, &walk) };
        }
        return;
    }

    // Consumers.
    // SAFETY: the whole consumer warpgroup executes this, uniformly.
    unsafe { regs::increase::<HOPPER_CONSUMER_REGS>() };
    let c = index::warpgroup_id() - 1;
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let wk0 = n0 + c * WG_KEYS;
    // The thread's keys: `key0` and `key0 + 8`.
    let key0 = wk0 + (index::warp_id() % 4) * 16 + g;
    let (scale_log2, off32, sk32) = (p.base.scale_log2, off as i32, seq_k as i32);
    let softcap_scale = p.base.logits.softcap_scale;
    let inv_scale_log2 = 1.0 / scale_log2;
    let mut dk = [0.0f32; DR];
    let mut dv = [0.0f32; DR];

    if steps > 0 {
        // SAFETY: the producer issues K and V when `steps > 0`, completing this phase.
        unsafe { kv_full.wait_parity(0) };
        for step in 0..steps {
            let pos = RingPos::<STAGES>::of(step);
            let m0 = walk.m0(step);
            // SAFETY: the producer issues every step's Q and dO, so this phase completes.
            unsafe { ring.full(pos.stage).wait_parity(pos.phase) };
            let (qt, dot) = (ring.q(pos.stage), ring.d_o(pos.stage));
            // The tiles' descriptors are recomputed each step rather than held in registers
            // across the loop (the products need the registers).
            let o = regs::opaque;
            let (kt, vt, qt, dot) = (o(k_s), o(v_s), o(qt), o(dot));

            // S^T = K Q^T and dP^T = V dO^T for the consumer's 64 keys (two groups).
            let mut s = [0.0f32; SR];
            let mut dp = [0.0f32; SR];
            // SAFETY: whole warpgroup, uniform control flow; K, V and this stage were
            // published by their completed phases and are not overwritten before this step's
            // `empty` arrival.
            unsafe {
                wgmma::fence();
                for kk in 0..DK as u32 {
                    let (cb, within) = (kk / 4, 32 * (kk % 4));
                    let rows = c * WG_KEYS * 128 + within;
                    let a = Descriptor::k_major_sw128(kt + cb * cfg.block_bytes(BN) + rows);
                    let b = Descriptor::k_major_sw128(qt + cb * cfg.block_bytes(BM) + within);
                    if kk == 0 {
                        s_zero(&mut s, a, b);
                    } else {
                        s_mma(&mut s, a, b);
                    }
                }
                wgmma::commit_group();
                for kk in 0..DK as u32 {
                    let (cb, within) = (kk / 4, 32 * (kk % 4));
                    let rows = c * WG_KEYS * 128 + within;
                    let a = Descriptor::k_major_sw128(vt + cb * cfg.block_bytes(BN) + rows);
                    let b = Descriptor::k_major_sw128(dot + cb * cfg.block_bytes(BM) + within);
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

            // P^T (f32 in `s`, then A fragments): the thread's query columns m0 + 8 j + 2 t + e.
            let rows_s = ring.rows(pos.stage);
            // Packed sequences: the sizes loaded where used (`Walk::mask_sizes_or`).
            let needs_mask = {
                let (seq_q, off32, sk32) = walk.mask_sizes_or((seq_q, off32, sk32));
                m0 + BM > seq_q
                    || mask::step_needs_mask::<BM, WG_KEYS>(m0, wk0, off32, wl, wr, sk32)
            };
            for j in 0..2 * KQ {
                let col = 8 * j as u32 + 2 * t;
                // SAFETY: the stage's row values, published by `full` (waited for above); `col`
                // even: 8-byte aligned.
                let lse2: [f32; 2] = unsafe { smem::SmemValue::load(rows_s + 4 * col) };
                for e in 0..4 {
                    let x = 4 * j + e;
                    let (l, _) = logits::backward_logit::<SOFTCAP>(s[x], softcap_scale);
                    s[x] = math::exp2(math::fma(l, scale_log2, -lse2[e % 2]));
                }
            }
            if needs_mask {
                let (seq_q, off32, sk32) = walk.mask_sizes_or((seq_q, off32, sk32));
                // The query columns each of the thread's keys may see, counted from its first
                // column `m0 + 2 t`; P^T is 0 outside them.
                let range = |h: u32| {
                    let key = (key0 + 8 * h) as i32;
                    let (lo, hi) = mask::query_range(key, seq_q, off32, wl, wr, sk32);
                    let base = (m0 + 2 * t) as i32;
                    (lo - base, hi - base)
                };
                let ((lo0, hi0), (lo1, hi1)) = (range(0), range(1));
                mask::fill_outside(&mut s, [lo0, lo1], [hi0, hi1], 0.0);
            }
            let mut pa = pack_p::<E, SR, KQ>(&s);
            if SOFTCAP {
                // P^T (1 - t^2) in `s`, the factor of dS^T, with `t` back from P^T (`P = 2^(t
                // scale_log2 - LSE2)`): no register holds `t` across the products.
                for j in 0..2 * KQ {
                    let col = 8 * j as u32 + 2 * t;
                    // SAFETY: as above.
                    let lse2: [f32; 2] = unsafe { smem::SmemValue::load(rows_s + 4 * col) };
                    for e in 0..4 {
                        let x = 4 * j + e;
                        s[x] *= softcap_grad_of_p(s[x], lse2[e % 2], inv_scale_log2);
                    }
                }
            }
            // dV += P^T dO while dS^T is computed.
            // SAFETY: as above; the fence orders the writes of the fragments and of the
            // accumulators before the products.
            unsafe {
                wgmma::fence();
                for kk in 0..KQ {
                    let b = Descriptor::mn_major_sw128(dot + 2048 * kk as u32, cfg.block_bytes(BM));
                    g_mma(&mut dv, pa[kk], b);
                }
                wgmma::commit_group();
                // dP^T is done, dV may still run.
                wgmma::wait_group::<1>();
            }
            s_fence(&mut dp);
            // dS^T = P^T (dP^T - delta').
            for j in 0..2 * KQ {
                let col = 8 * j as u32 + 2 * t;
                // SAFETY: as for LSE.
                let delta: [f32; 2] = unsafe { smem::SmemValue::load(rows_s + 4 * (BM + col)) };
                for e in 0..4 {
                    let x = 4 * j + e;
                    dp[x] = s[x] * (dp[x] - delta[e % 2]);
                }
            }
            let mut da = pack_p::<E, SR, KQ>(&dp);
            // dQ = dS K over the block's keys: both consumers' dS^T through this step's buffer.
            // The consumer's part (`cfg.dq_part`): with 64-row steps columns `c D / 2 ..` of
            // the step's rows, else every column of rows `64 c ..` (column block `c` of the
            // buffer). Without a softcap dQ is issued before dK (while dV may still run) and
            // staged while dK runs; under a softcap (more registers in use) after dK, once dV
            // and dK are done.
            let early_dq = FUSED && !SOFTCAP;
            let mut dq = [0.0f32; QR];
            let ds_buf = regs::opaque(base + cfg.ds_offset(step % 2));
            let issue_dq = |dq: &mut [f32; QR], da: &[[u32; 4]; KQ]| {
                // SAFETY: the buffer's previous readers (step - 2's dQ products of both
                // consumers) completed before their arrivals on the previous step's barrier.
                unsafe { store_ds_t(ds_buf, cfg.block_bytes(BN), da, c, g, t) };
                fence::fence_proxy_async_shared();
                // SAFETY: both consumer warpgroups, every thread, once per step (the same
                // number of steps in both).
                unsafe { sync::named_sync(DS_BARRIER, CONSUMER_THREADS) };
                let (ds_cols, n0) = if BM == HOPPER_DQ_TILE_ROWS {
                    (ds_buf, c * D / 2)
                } else {
                    (ds_buf + c * cfg.block_bytes(BN), 0)
                };
                // Opaque: the 8 descriptors of this loop-invariant operand would otherwise be
                // hoisted out of the step loop and held in registers throughout (they spill).
                let k_cols = regs::opaque(
                    k_s + (n0 / HOPPER_ATOM) * cfg.block_bytes(BN) + (n0 % HOPPER_ATOM) * 2,
                );
                // SAFETY: whole warpgroup, uniform control flow; K is resident for the walk and
                // the buffer was published by the barrier after each writer's proxy fence.
                unsafe {
                    wgmma::fence();
                    for kk in 0..BN / 16 {
                        let a =
                            Descriptor::mn_major_sw128(ds_cols + 2048 * kk, cfg.block_bytes(BN));
                        let b = Descriptor::mn_major_sw128(k_cols + 2048 * kk, cfg.block_bytes(BN));
                        if kk == 0 {
                            (q_mma.first)(dq, a, b);
                        } else {
                            (q_mma.rest)(dq, a, b);
                        }
                    }
                    wgmma::commit_group();
                }
            };
            if early_dq {
                issue_dq(&mut dq, &da);
            }
            // dK += dS^T Q.
            // SAFETY: as above.
            unsafe {
                wgmma::fence();
                for kk in 0..KQ {
                    let b = Descriptor::mn_major_sw128(qt + 2048 * kk as u32, cfg.block_bytes(BM));
                    g_mma(&mut dk, da[kk], b);
                }
                wgmma::commit_group();
            }
            if FUSED && !early_dq {
                // dV and dK are done: P^T's and dS^T's registers are free for dQ's.
                // SAFETY: whole warpgroup, uniform control flow.
                unsafe { wgmma::wait_group::<0>() };
                for kk in 0..KQ {
                    wgmma::pin_fragment(&mut pa[kk]);
                    wgmma::pin_fragment(&mut da[kk]);
                }
                issue_dq(&mut dq, &da);
            }
            if early_dq {
                // Groups complete in order: dV and dQ are done, dK may still run.
                // SAFETY: whole warpgroup, uniform control flow.
                unsafe { wgmma::wait_group::<1>() };
                (q_mma.fence)(&mut dq);
                for kk in 0..KQ {
                    wgmma::pin_fragment(&mut pa[kk]);
                }
                // SAFETY: every thread of the consumer warpgroup, once per step, as the
                // writer warp's steps.
                unsafe { stage_dq::<QR>(cfg, c, &dq) };
            }
            // SAFETY: whole warpgroup, uniform control flow.
            unsafe { wgmma::wait_group::<0>() };
            g_fence(&mut dv);
            g_fence(&mut dk);
            if FUSED && !early_dq {
                (q_mma.fence)(&mut dq);
            }
            for kk in 0..KQ {
                // The products read the fragments until the wait above (with `FUSED`, P^T's
                // until the earlier one; under a softcap dS^T's too).
                if !FUSED {
                    wgmma::pin_fragment(&mut pa[kk]);
                }
                if !(FUSED && SOFTCAP) {
                    wgmma::pin_fragment(&mut da[kk]);
                }
            }
            // SAFETY: every product reading this stage is complete (the wait above) and this
            // thread's reads of its row values were before; one arrival per consumer thread
            // and phase.
            unsafe { ring.empty(pos.stage).arrive() };
            if FUSED && !early_dq {
                // SAFETY: every thread of the consumer warpgroup, once per step, as the
                // writer warp's steps.
                unsafe { stage_dq::<QR>(cfg, c, &dq) };
            }
        }
    }

    // SAFETY: the thread's keys and columns of dK and dV (validated by the host), one writer
    // per element.
    unsafe { store_dk_dv::<E, DR, VARLEN>(p, &walk, key0, 0, &dk, &dv) };
}

/// The dQ products of the dK/dV/dQ kernel, `m64n{D/2}k16` (64-row steps) or `m64n{D}k16` with
/// both operands M/N-major in shared memory: `first` overwrites the accumulator, `rest` adds;
/// `fence` pins it.
pub(super) struct DqProducts<M0, M1, F> {
    pub first: M0,
    pub rest: M1,
    pub fence: F,
}

/// Store this thread's `dS^T` fragments `da` (consumer `c`, lane `g = lane / 4`, `t = lane %
/// 4`) into the `dS^T` buffer at `buf`, column blocks of 64 queries `block_bytes` apart: key
/// `r` (of the block) is row `r` of each, 128 bytes of 64 queries, its 16-byte chunk `j` at
/// chunk `j ^ (r % 8)` (128-byte swizzle, `r % 8 = g`). Fragment `da[kk]` holds, as the
/// `m16n8k16` A fragment, rows `g` and `g + 8` of its warp's 16 keys and query columns
/// `16 kk + 2 t` and `16 kk + 8 + 2 t` (two values each). For a warp instruction the 32 lanes
/// write 32 distinct banks.
///
/// # Safety
/// `buf` is a `dS^T` buffer of the configuration (`block_bytes` its column blocks' stride)
/// that no product reads until the barrier after these stores.
#[inline(always)]
unsafe fn store_ds_t<const KQ: usize>(
    buf: u32,
    block_bytes: u32,
    da: &[[u32; 4]; KQ],
    c: u32,
    g: u32,
    t: u32,
) {
    let w = index::warp_id() % 4;
    for kk in 0..KQ as u32 {
        for q in 0..4u32 {
            let r = c * WG_KEYS + 16 * w + g + 8 * (q % 2);
            let (cb, chunk) = (kk / 4, 2 * (kk % 4) + q / 2);
            // SAFETY: r < BN, chunk < 8 and cb < BM / 64: inside the buffer (the caller's);
            // each word has one writer.
            unsafe {
                smem::SmemValue::store(
                    buf + cb * block_bytes + 128 * r + ((chunk ^ g) << 4) + 4 * t,
                    da[kk as usize][q as usize],
                )
            };
        }
    }
}

/// Store consumer `c`'s dQ accumulator `dq` into its part in shared memory in the order of
/// [`dq_tile_vector`] (16 bytes per thread and instruction, consecutive across the warp: no
/// bank conflict), for the writer warp ([`write_dq`]) to add.
///
/// Barrier protocol (named barriers `DQ_EMPTY + c` and `DQ_FULL + c`, the consumer's 128
/// threads and the writer's 32): the warpgroup syncs on `DQ_EMPTY + c` (the writer is done
/// reading the part), stores, each thread fences the async proxy, and arrives on `DQ_FULL +
/// c`.
///
/// # Safety
/// Every thread of consumer warpgroup `c` calls it, in uniform control flow, once per step of
/// the walk (the writer warp's steps).
#[inline(always)]
unsafe fn stage_dq<const QR: usize>(cfg: &HopperBwdConfig, c: u32, dq: &[f32; QR]) {
    let tid = index::thread_idx_x() % WARPGROUP_SIZE;
    // Opaque: the stores' addresses are not kept in registers across the step loop.
    let part = regs::opaque(smem::aligned_base() + cfg.dq_offset(c));
    let d = cfg.head_dim;
    // Vectors per half tile: an `m64n{D}` accumulator covers both halves.
    let per_half = d / 16;
    // SAFETY: the consumer's 128 threads and the writer warp, once per step (the caller's
    // contract; the writer's first arrival is before its first step).
    unsafe { sync::named_sync(DQ_EMPTY + c, DQ_SYNC_THREADS) };
    for v in 0..QR as u32 / 4 {
        let at = part + 4 * dq_tile_vector(d, v / per_half, v % per_half, tid);
        let v = v as usize;
        let x = [dq[4 * v], dq[4 * v + 1], dq[4 * v + 2], dq[4 * v + 3]].map(f32::to_bits);
        // SAFETY: inside the consumer's part (the configuration's), 16-byte aligned; free since
        // the barrier above.
        unsafe { smem::SmemValue::store(at, x) };
    }
    fence::fence_proxy_async_shared();
    // SAFETY: as above.
    unsafe { sync::named_arrive(DQ_FULL + c, DQ_SYNC_THREADS) };
}

/// The writer warp of the dK/dV/dQ kernel: for each step of the walk, lane 0 adds both
/// consumers' dQ parts into the accumulator's tiles with bulk reduce-adds (a part in a tile
/// past the accumulator's rows, all of whose rows are past `seq_q`, is not added).
///
/// Barrier protocol: the warp arrives on `DQ_EMPTY + c` once before the first step (the parts
/// start free); at each step it syncs on `DQ_FULL + c` before lane 0 issues part `c`'s reduce;
/// once lane 0 has waited for both reduces to have read their sources (in order mode: to be
/// performed), the warp arrives on `DQ_EMPTY + c`, except after the last step (the consumers
/// sync once per step). Lane 0 waits for every reduce to be performed before the block exits.
///
/// Order (deterministic mode, `dq_order` not null; [`DqOrder`]): lane 0 acquires the step's
/// tiles before its first reduce of the step, and releases them once its reduces are performed.
///
/// # Safety
/// Warp [`DQ_WRITER_WARP`] of the producer warpgroup of a dK/dV/dQ kernel calls it once, when
/// the walk has steps, with the kernel's parameters (the accumulator, and the counters when
/// `dq_order` is set, sized by the host for every tile) and configuration.
#[inline(always)]
unsafe fn write_dq<const VARLEN: bool>(
    p: &HopperBwdParams,
    cfg: &HopperBwdConfig,
    walk: &Walk<VARLEN>,
) {
    let lane = index::lane_id();
    let (seq_q, heads_q, d) = (p.base.seq_q, p.base.heads_q, cfg.head_dim);
    let order = DqOrder::of(p, walk);
    let ordered = order.ordered();
    let base = smem::aligned_base();
    let dense_rows = dq_accum_rows(seq_q);
    for c in 0..HOPPER_CONSUMERS {
        // SAFETY: the writer warp's arrival of the first phase (the protocol above).
        unsafe { sync::named_arrive(DQ_EMPTY + c, DQ_SYNC_THREADS) };
    }
    for step in 0..walk.steps {
        let (h, m0) = (walk.head(step), walk.m0(step));
        let rows = if VARLEN {
            dq_accum_rows(walk.seq_q(p))
        } else {
            dense_rows
        };
        if ordered && lane == 0 {
            // SAFETY: ordered mode, lane 0 before the step's first reduce; the counters were
            // sized by the host and zeroed by the preprocess.
            unsafe { order.acquire(h, m0) };
            // The predecessor's additions, acquired above, before this block's async ones.
            fence::fence_proxy_async();
        }
        for c in 0..HOPPER_CONSUMERS {
            // SAFETY: once per step (the consumers arrive once per step).
            unsafe { sync::named_sync(DQ_FULL + c, DQ_SYNC_THREADS) };
            let (row, within) = cfg.dq_part(c);
            if lane == 0 && m0 + row < rows {
                let tile = if VARLEN {
                    (walk.accum_row0(p, h) + (m0 + row) as u64) * d as u64
                } else {
                    dq_accum_tile_base(walk.batch(), h, heads_q, seq_q, m0 + row, d)
                };
                let dst = tile + within as u64;
                // SAFETY: the part was published by the barrier above after each writer's
                // proxy fence and is not overwritten before this warp's next arrival; the
                // destination is inside the accumulator (host-sized for every (sequence,
                // head, tile), and the tile is one of them), 16-byte aligned.
                unsafe {
                    tma::bulk_reduce_add_f32(
                        p.base.dq_accum.wrapping_add(dst as usize),
                        base + cfg.dq_offset(c),
                        cfg.dq_part_bytes(),
                    )
                };
                tma::bulk_commit_group();
            }
        }
        if lane == 0 {
            if ordered {
                tma::bulk_wait_group::<0>();
                fence::fence_proxy_async();
                // SAFETY: as for the acquire above; this block's additions are performed.
                unsafe { order.release(h, m0) };
            } else {
                tma::bulk_wait_group_read::<0>();
            }
        }
        // SAFETY: every lane of the warp.
        unsafe { sync::sync_warp(warp::FULL_MASK) };
        if step + 1 < walk.steps {
            for c in 0..HOPPER_CONSUMERS {
                // SAFETY: lane 0's wait above: the parts are read; one arrival per step.
                unsafe { sync::named_arrive(DQ_EMPTY + c, DQ_SYNC_THREADS) };
            }
        }
    }
    if lane == 0 {
        tma::bulk_wait_group::<0>();
    }
}
