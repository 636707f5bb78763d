//! `attention_fwd_hopper_{bf16,f16}_d{D}` (D every multiple of 16 from 32 to 256, and
//! `_d{D}_v{D_v}` for the pairs of [`kernel_abi::attention::VALUE_DIMS`], whose V and O have
//! a head dimension `D_v` of their own): the attention
//! forward pass on Hopper (sm_90a) with TMA, an mbarrier ring, `wgmma` and warp specialization. Same semantics as the
//! `mma.sync` path ([`AttentionParams`](kernel_abi::attention::AttentionParams) documents the
//! masking and the outputs); chosen automatically on Hopper GPUs. The `varlen` entries take
//! packed sequences of different lengths, as the `mma.sync` path's `attention_fwd_varlen_*`.
//!
//! # Parameters
//! [`HopperParams`]: 4-D tensor maps of Q, K, V (dims `[D, heads, seq, batch]`, box
//! `[64, 1, rows, 1]`, 128-byte swizzle; any strides with D contiguous), O with its strides,
//! LSE, sizes, scale, window. Packed sequences: the maps describe `[D, heads, total, 1]`; a
//! tile's sequence is found in `cu_seqlens_q` (the slots of [`scheduler`]), its boxes start at
//! the sequence's first row and may reach into the next sequence's rows (masked keys; query
//! rows not stored). With a tile counter the grid is persistent and a scheduler warp draws the
//! block's tiles; without, one block per tile, and a block whose slot is empty leaves at once.
//!
//! # Tiling
//! A tile is 128 query rows of one (batch, head); its block walks the keys the rows may attend
//! in steps of `block_n` ([`kernel_abi::attention::hopper_config`]). The grid is persistent:
//! block `b` computes tiles `b`, `b + grid`, ... (one block per SM by default; the order of
//! [`tile`]); Q of the next tile loads while the last P V of the current
//! one runs, and the K/V rings carry on across tiles. Every tile is stored as
//! `D / 64` column blocks of 128-byte swizzled rows (one TMA box each; V's tiles `D_v / 64`). S = Q K^T reads Q and
//! K as K-major `wgmma` operands (the 16-wide K slice `kk` is column block `kk / 4` advanced by
//! `32 (kk % 4)` bytes); O += P V reads V as an MN-major operand (`trans-b`, the 16-row K slice
//! `kk` at `2048 kk` bytes, column blocks one swizzle atom apart), P from registers.
//!
//! # Thread mapping
//! 384 threads. Warpgroup 0 produces: it drops to `HOPPER_PRODUCER_REGS` registers, and its
//! thread 0 issues the TMA loads (Q once, then K and V of each step, K one step ahead); in the
//! packed kernels and those of `HopperGrid::Dynamic` its warp 1 schedules the tiles
//! ([`scheduler::schedule`]).
//! Warpgroups 1 and 2 consume (`HOPPER_CONSUMER_REGS` registers): consumer `c` owns query rows `64 c .. 64 c + 64`
//! of the block; per step it issues `wgmma.m64n{block_n}k16` for S (`block_n / 2` f32
//! registers), does the online softmax on its accumulators (a row is held by the 4 lanes of a
//! quad), converts P to A fragments in registers, and issues `wgmma.m64n{D_v}k16` (register A)
//! into O (`D_v / 2` f32 registers; `D_v` = D but for the pairs).
//!
//! # Barrier protocol
//! - Start: thread 0 initializes `q_full`, `q_empty`, `full_k[s]`, `full_v[s]` (count 1) and
//!   `empty_k[s]`, `empty_v[s]` (count 8: one arrival per consumer warp) and, in the scheduled
//!   kernels (`SCHEDULED`), the handoff's barriers, `fence.mbarrier_init`,
//!   then `sync_threads` publishes them. The warpgroups never meet at a block barrier again.
//! - `q_full` / `q_empty` (counts 1 / 8), phase `k` for the block's `k`-th tile with a step
//!   (tiles without one load nothing, on both sides): the producer waits until `q_empty`
//!   completed phase `k - 1` (parity `^ 1`: the first tile does not wait), arrives on `q_full`
//!   with the Q tile's bytes and issues its loads; consumers wait on `q_full` before the
//!   tile's first `wgmma`, and lane 0 of each consumer warp arrives on `q_empty` once the
//!   tile's last S is complete (before its last P V, which does not read Q).
//! - K and V have rings of their own (slot `s = i % stages` for the block's `i`-th K/V tile
//!   over all its tiles, parity
//!   `(i / stages) % 2`), so that a K slot turns over as soon as S has read it, a full P V
//!   earlier than its V. The producer loads in the order the consumers read: with the overlap
//!   K_0, then K_{i+1} before V_i; without, K_i then V_i. For each tile it waits until
//!   `empty_*[s]` completed the slot's previous use (parity `^ 1`: the first pass does not
//!   wait), arrives on `full_*[s]` expecting the tile's bytes, and issues the loads; consumers
//!   wait on `full_*[s]` before the `wgmma`s that read the tile.
//! - `empty_k[s]` / `empty_v[s]`: lane 0 of every consumer warp arrives once the
//!   `wgmma.wait_group` that completes the last product reading the tile has returned: S_i's
//!   (`wait_group 1` in the overlapped loop, which leaves only the later P V pending) for K_i,
//!   P_i V_i's (`wait_group 0`) for V_i.
//! - Overlap (`HopperConfig::overlap`): consumers issue S_i and P_{i-1} V_{i-1} together. The P
//!   fragments of an in-flight product are pinned in their registers until its wait; the next P
//!   is packed into fragments only after it (the softmax itself runs on f32 registers while the
//!   product is in flight). O is rescaled by the factor of step `i - 1` between the issue of
//!   S_i and that of P_{i-1} V_{i-1} (no product that touches O is in flight then).
//! - Pingpong turns (`HopperConfig::pingpong`; named barriers `HOPPER_SCHED_BARRIER + c`, 256
//!   threads: consumer `c` syncs, the other arrives). Before each of its `wgmma` batches
//!   consumer `c` syncs on its barrier; after issuing the batch it arrives on the other's.
//!   Both consumers of a block have the same tiles and steps, hence per tile the same number
//!   `n` of batches (`steps + 1` with the overlap, `2 steps` without). Per tile, consumer 1
//!   arrives once before its first batch (consumer 0's first turn) and skips the arrival after
//!   its last batch; so each barrier sees exactly `n` syncs and `n` arrivals, and the batches
//!   alternate strictly: 0, 1, 0, 1, ... Across tiles too: consumer 1 reaches its next tile's
//!   first arrival only after its last batch, whose turn came from consumer 0's last batch, so
//!   consumer 0 has passed its last sync of the tile and never sees two arrivals in one phase.
//!   No wait on the rings happens between a sync and its arrival, and the producer issues the
//!   tiles in the order both consumers read them (each tile it waits for was released by both
//!   consumers at an earlier batch), so the turns cannot deadlock with the rings.
//! - Scheduled kernels (the packed ones, and the dense ones of `HopperGrid::Dynamic`): the
//!   producer's thread and the consumers take each tile from the scheduler warp through
//!   [`scheduler::Handoff`] (its own protocol), in the same order, so they walk the same tiles
//!   as the other kernels' `b, b + grid, ...` walk theirs.
//! - Accumulator registers are pinned around every `wgmma.wait_group` (`fence_operands`) and a
//!   `wgmma.fence` precedes every `wgmma` batch whose accumulators ordinary instructions wrote
//!   (the O rescale).
//!
//! NaN safety: as in the `mma.sync` path ([`super::softmax`]: masked logits -inf; a row whose
//! maximum is -inf uses 0 as its reference; O = 0 and LSE = -inf for rows with no allowed key).
//!
//! # Files
//! - this file: the entry points (`hopper_kernel!`) and [`forward`]: barrier setup and the role
//!   split;
//! - [`producer`]: the producer's TMA loop (`load_tiles!`);
//! - [`consumer`]: the consumers' tile loop, both main loops (`consume_tiles!`, with the
//!   step halves `s_step!` and `pv_step!` and the `wgmma` batches `issue_s!` and `issue_pv!`);
//! - [`epilogue`]: O and LSE stored per consumer and tile (`store_tile!`);
//! - [`named_barrier`]: the pingpong turn barriers;
//! - [`scheduler`]: the persistent grid's tiles;
//! - [`fp8`]: the FP8 entries and the transpose of V they read;
//! - [`mask`], [`softmax`]: the family's mask and online softmax on `wgmma` accumulators.
//!
//! The producer, the consumers and the epilogue are macros expanded in [`forward`], not
//! functions: as `#[inline(always)]` functions (taking the same values and closures) they
//! changed the kernels' PTX, which the expansions keep unchanged.

mod consumer;
mod epilogue;
mod fp8;
mod mask;
mod named_barrier;
mod producer;
mod scheduler;
pub(in crate::attention) mod softmax;

use super::elem::{Bf16, Elem, F16};
use crate::arch::mbarrier::Mbarrier;
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{fence, index, regs, smem, sync};
use crate::tensor_map_ptr;
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::attention::{
    HOPPER_CONSUMER_REGS, HOPPER_CONSUMERS, HOPPER_PRODUCER_REGS, HOPPER_VARIANTS, HopperConfig,
    HopperParams, hopper_config_of, hopper_varlen_config_of,
};

/// Consumer warps arriving on an `empty` barrier per phase.
const CONSUMER_WARPS: u32 = HOPPER_CONSUMERS * WARPGROUP_SIZE / 32;

/// The forward pass: barrier setup and the role split; see the module documentation. `DV` is
/// the head dimension of V and O (D but for the pairs of `VALUE_DIMS`). `SR = block_n / 2`
/// and `OR = DV / 2` are the
/// accumulator registers of S and O; `NT = block_n / 8`, `NK = block_n / 16`, `DK = D / 16`;
/// `OVERLAP` selects the intra-warpgroup software pipeline (`HopperConfig::overlap`),
/// `PINGPONG` the turns between the consumers, `MODE` the softmax (`Softmax::code`), `CAPSINK`
/// the softcap and sinks of `HopperParams::logits` (`super::logits`), `VARLEN` packed sequences
/// (`HopperParams::cu_seqlens_q`), `FP8` e4m3 inputs (`kernel_abi::attention::fp8`: k32
/// slices, so `NK = block_n / 32` and `DK = D / 32`; V's map describes `V^T`; `E` is then the
/// output's bf16), `SCHEDULED` the tiles drawn by a scheduler warp (`VARLEN`, or the grid of
/// `HopperGrid::Dynamic`). The `wgmma` shapes come in as functions so one body serves every head
/// dimension and type.
///
/// # Safety
/// Launched as documented on [`HopperParams`] with the configuration `cfg`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn forward<
    E: Elem,
    const D: u32,
    const DV: u32,
    const BN: u32,
    const STAGES: u32,
    const SR: usize,
    const OR: usize,
    const NT: usize,
    const NK: usize,
    const DK: usize,
    const OVERLAP: bool,
    const PINGPONG: bool,
    const MODE: u32,
    const CAPSINK: bool,
    const VARLEN: bool,
    const FP8: bool,
    const SCHEDULED: bool,
>(
    p: &HopperParams,
    cfg: &HopperConfig,
    tmaps: [crate::arch::tma::TensorMapPtr; 3],
    s_zero: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    s_mma: impl Fn(&mut [f32; SR], Descriptor, Descriptor),
    o_mma: impl Fn(&mut [f32; OR], [u32; 4], Descriptor),
    s_fence: impl Fn(&mut [f32; SR]),
    o_fence: impl Fn(&mut [f32; OR]),
) {
    const {
        let k = if FP8 { 32 } else { 16 };
        assert!(
            SR as u32 * 2 == BN
                && OR as u32 * 2 == DV
                && (DV == D || (!FP8 && !CAPSINK))
                && NT as u32 * 8 == BN
                && NK as u32 * k == BN
                && DK as u32 * k == D
                && (!FP8 || (BN == 128 && !CAPSINK && !VARLEN))
                && (!VARLEN || SCHEDULED)
        )
    };
    let [tmap_q, tmap_k, tmap_v] = tmaps;
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let base = smem::aligned_base();
    let bars = base + cfg.barriers_offset() as u32;
    let q_full = Mbarrier::at(bars);
    let q_empty = Mbarrier::at(bars + 8 * (1 + 4 * STAGES));
    let full_k = |s: u32| Mbarrier::at(bars + 8 * (1 + s));
    let full_v = |s: u32| Mbarrier::at(bars + 8 * (1 + STAGES + s));
    let empty_k = |s: u32| Mbarrier::at(bars + 8 * (1 + 2 * STAGES + s));
    let empty_v = |s: u32| Mbarrier::at(bars + 8 * (1 + 3 * STAGES + s));
    let q_s = base + cfg.q_offset() as u32;
    let k_s = |s: u32| base + cfg.k_offset(s) as u32;
    let v_s = |s: u32| base + cfg.v_offset(s) as u32;
    let (cblocks, v_cblocks) = (cfg.column_blocks(), cfg.value_column_blocks());

    // Packed sequences: the scheduler warp hands the tiles to the producer and the consumers
    // (`scheduler::Handoff`). With one block per tile (no tile counter), every warp finds the
    // block's sequence first, and a block whose slot holds no query row leaves before any
    // barrier (uniformly).
    let handoff = scheduler::Handoff {
        slots: crate::arch::smem::SmemArray::new(
            base + cfg.handoff_offset() as u32,
            2 * kernel_abi::attention::HOPPER_HANDOFF_SLOTS,
        ),
        bars: bars + 8 * (2 + 4 * STAGES),
    };
    if VARLEN && p.tile_counter.is_null() {
        let block = index::block_idx_x();
        // SAFETY: every lane of every warp, uniformly; the kernel's parameters.
        let seq = unsafe { scheduler::packed_sequence(p, block) };
        // SAFETY: the kernel's parameters; `seq < batch`.
        let tl = unsafe { scheduler::tile::<BN, true>(p, block, seq) };
        if tl.rows_valid == 0 {
            return;
        }
    }

    if tid == 0 {
        for t in tmaps {
            t.prefetch();
        }
        // SAFETY: single initializer before any use; published by the barrier below.
        unsafe {
            q_full.init(1);
            q_empty.init(CONSUMER_WARPS);
            for s in 0..STAGES {
                full_k(s).init(1);
                full_v(s).init(1);
                empty_k(s).init(CONSUMER_WARPS);
                empty_v(s).init(CONSUMER_WARPS);
            }
            if SCHEDULED {
                handoff.init(kernel_abi::attention::HOPPER_HANDOFF_TAKERS);
            }
        }
        fence::fence_mbarrier_init();
    }
    // SAFETY: all threads reach this barrier once, before the role split.
    unsafe { sync::sync_threads() };

    if wg == 0 {
        // SAFETY: the whole producer warpgroup executes this, uniformly.
        unsafe { regs::decrease::<HOPPER_PRODUCER_REGS>() };
        if tid == 0 {
            producer::load_tiles!(
                p, cfg, (cblocks, v_cblocks), handoff, [tmap_q, tmap_k, tmap_v],
                q: (q_s, q_full, q_empty),
                k: (k_s, full_k, empty_k),
                v: (v_s, full_v, empty_v)
            );
        } else if SCHEDULED && index::warp_id() == 1 {
            // SAFETY: every lane of warp 1, uniformly; the handoff's barriers are published.
            unsafe { scheduler::schedule::<VARLEN>(p, handoff) };
        }
        return;
    }

    // Consumers.
    // SAFETY: the whole consumer warpgroup executes this, uniformly.
    unsafe { regs::increase::<HOPPER_CONSUMER_REGS>() };
    consumer::consume_tiles!(
        p, cfg, wg, handoff,
        q: (q_s, q_full, q_empty),
        k: (k_s, full_k, empty_k),
        v: (v_s, full_v, empty_v),
        s: (s_zero, s_mma, s_fence),
        o: (o_mma, o_fence)
    );
}

macro_rules! hopper_kernel {
    ($name:expr, $elem:ty, $cfg:expr, $s_zero:ident, $s_mma:ident, $s_fence:ident, $o_mma:ident, $o_fence:ident) => {
        hopper_kernel!(
            $name, $elem, $cfg, false, false, $s_zero, $s_mma, $s_fence, $o_mma, $o_fence
        );
    };
    ($name:expr, $elem:ty, $cfg:expr, $capsink:expr, $varlen:expr, $s_zero:ident, $s_mma:ident, $s_fence:ident, $o_mma:ident, $o_fence:ident) => {
        const _: () = {
            /// See the module documentation (the configuration
            #[doc = stringify!($cfg)]
            /// ).
            ///
            /// # Safety
            /// Grid `(blocks, 1, 1)` with any `blocks >= 1` (persistent: each block walks the
            /// tiles `blockIdx.x + k gridDim.x`), `HOPPER_THREADS` threads, the configuration's
            /// shared memory, parameters as documented on [`HopperParams`] (validated by the
            /// host).
            #[unsafe(export_name = $name)]
            pub unsafe extern "ptx-kernel" fn kernel(p: HopperParams) {
                const CFG: HopperConfig = $cfg;
                crate::launch_bounds!(name = $name, kernel_abi::attention::KERNELS);
                let tmaps = [
                    tensor_map_ptr!(name = $name, 0, HopperParams, tmap_q),
                    tensor_map_ptr!(name = $name, 0, HopperParams, tmap_k),
                    tensor_map_ptr!(name = $name, 0, HopperParams, tmap_v),
                ];
                // SAFETY: forwarded to the caller; the closures are the wgmma shapes of this
                // configuration, called by whole warpgroups in uniform control flow.
                unsafe {
                    forward::<
                        $elem,
                        { CFG.head_dim },
                        { CFG.value_dim },
                        { CFG.block_n },
                        { CFG.stages },
                        { (CFG.block_n / 2) as usize },
                        { (CFG.value_dim / 2) as usize },
                        { (CFG.block_n / 8) as usize },
                        { (CFG.block_n / 16) as usize },
                        { (CFG.head_dim / 16) as usize },
                        { CFG.overlap },
                        { CFG.pingpong },
                        { CFG.softmax.code() },
                        $capsink,
                        $varlen,
                        false,
                        { CFG.grid.scheduled() || $varlen },
                    >(
                        &p,
                        &CFG,
                        tmaps,
                        |acc, a, b| wgmma::$s_zero::<0, 0>(acc, a, b),
                        |acc, a, b| wgmma::$s_mma::<0, 0, true>(acc, a, b),
                        |acc, a, b| wgmma::$o_mma::<1, true>(acc, a, b),
                        wgmma::$s_fence,
                        wgmma::$o_fence,
                    )
                }
            }
        };
    };
}

/// An entry of the default configuration of head dimension `D` for element type `E`
/// (`hopper_config_of(D)`, or `hopper_varlen_config_of(D)` for packed sequences, and its `wgmma`
/// shapes): `hopper_default!(name, E, D, capsink, varlen)`. S = Q K^T takes `m64n{block_n}` (128 up to D = 128, 112 up to 192, 80 above), O += P V
/// `m64n{D}`.
macro_rules! hopper_default {
    ($name:expr, $elem:ident, $d:tt, $capsink:expr, false) => {
        hopper_shapes!(@$elem $d => $name, $elem, hopper_config_of($d), $capsink, false);
    };
    ($name:expr, $elem:ident, $d:tt, $capsink:expr, true) => {
        hopper_shapes!(
            @$elem $d varlen => $name, $elem, hopper_varlen_config_of($d), $capsink, true
        );
    };
}

/// `hopper_kernel!` with the `wgmma` shapes of `(E, D)` (`varlen`: of the packed configuration)
/// appended to the arguments after `=>`.
macro_rules! hopper_shapes {
    (@Bf16 32 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, fence_operands_64, m64n32k16_bf16_rs, fence_operands_16);
    };
    (@Bf16 48 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, fence_operands_64, m64n48k16_bf16_rs, fence_operands_24);
    };
    (@Bf16 64 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, fence_operands_64, m64n64k16_bf16_rs, fence_operands_32);
    };
    (@Bf16 80 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, fence_operands_64, m64n80k16_bf16_rs, fence_operands_40);
    };
    (@Bf16 96 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, fence_operands_64, m64n96k16_bf16_rs, fence_operands_48);
    };
    (@Bf16 112 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, fence_operands_64, m64n112k16_bf16_rs, fence_operands_56);
    };
    (@Bf16 128 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, fence_operands_64, m64n128k16_bf16_rs, fence_operands_64);
    };
    (@Bf16 144 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n112k16_bf16_ss_zero, m64n112k16_bf16_ss, fence_operands_56, m64n144k16_bf16_rs, fence_operands_72);
    };
    (@Bf16 160 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n112k16_bf16_ss_zero, m64n112k16_bf16_ss, fence_operands_56, m64n160k16_bf16_rs, fence_operands_80);
    };
    (@Bf16 176 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n112k16_bf16_ss_zero, m64n112k16_bf16_ss, fence_operands_56, m64n176k16_bf16_rs, fence_operands_88);
    };
    (@Bf16 192 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n112k16_bf16_ss_zero, m64n112k16_bf16_ss, fence_operands_56, m64n192k16_bf16_rs, fence_operands_96);
    };
    (@Bf16 208 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n80k16_bf16_ss_zero, m64n80k16_bf16_ss, fence_operands_40, m64n208k16_bf16_rs, fence_operands_104);
    };
    (@Bf16 224 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n80k16_bf16_ss_zero, m64n80k16_bf16_ss, fence_operands_40, m64n224k16_bf16_rs, fence_operands_112);
    };
    (@Bf16 240 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n80k16_bf16_ss_zero, m64n80k16_bf16_ss, fence_operands_40, m64n240k16_bf16_rs, fence_operands_120);
    };
    (@Bf16 256 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n80k16_bf16_ss_zero, m64n80k16_bf16_ss, fence_operands_40, m64n256k16_bf16_rs, fence_operands_128);
    };
    (@F16 32 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_f16_ss_zero, m64n128k16_f16_ss, fence_operands_64, m64n32k16_f16_rs, fence_operands_16);
    };
    (@F16 48 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_f16_ss_zero, m64n128k16_f16_ss, fence_operands_64, m64n48k16_f16_rs, fence_operands_24);
    };
    (@F16 64 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_f16_ss_zero, m64n128k16_f16_ss, fence_operands_64, m64n64k16_f16_rs, fence_operands_32);
    };
    (@F16 80 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_f16_ss_zero, m64n128k16_f16_ss, fence_operands_64, m64n80k16_f16_rs, fence_operands_40);
    };
    (@F16 96 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_f16_ss_zero, m64n128k16_f16_ss, fence_operands_64, m64n96k16_f16_rs, fence_operands_48);
    };
    (@F16 112 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_f16_ss_zero, m64n128k16_f16_ss, fence_operands_64, m64n112k16_f16_rs, fence_operands_56);
    };
    (@F16 128 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n128k16_f16_ss_zero, m64n128k16_f16_ss, fence_operands_64, m64n128k16_f16_rs, fence_operands_64);
    };
    (@F16 144 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n112k16_f16_ss_zero, m64n112k16_f16_ss, fence_operands_56, m64n144k16_f16_rs, fence_operands_72);
    };
    (@F16 160 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n112k16_f16_ss_zero, m64n112k16_f16_ss, fence_operands_56, m64n160k16_f16_rs, fence_operands_80);
    };
    (@F16 176 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n112k16_f16_ss_zero, m64n112k16_f16_ss, fence_operands_56, m64n176k16_f16_rs, fence_operands_88);
    };
    (@F16 192 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n112k16_f16_ss_zero, m64n112k16_f16_ss, fence_operands_56, m64n192k16_f16_rs, fence_operands_96);
    };
    (@F16 208 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n80k16_f16_ss_zero, m64n80k16_f16_ss, fence_operands_40, m64n208k16_f16_rs, fence_operands_104);
    };
    (@F16 224 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n80k16_f16_ss_zero, m64n80k16_f16_ss, fence_operands_40, m64n224k16_f16_rs, fence_operands_112);
    };
    (@F16 240 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n80k16_f16_ss_zero, m64n80k16_f16_ss, fence_operands_40, m64n240k16_f16_rs, fence_operands_120);
    };
    (@F16 256 => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n80k16_f16_ss_zero, m64n80k16_f16_ss, fence_operands_40, m64n256k16_f16_rs, fence_operands_128);
    };
    (@Bf16 144 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_bf16_ss_zero, m64n64k16_bf16_ss, fence_operands_32, m64n144k16_bf16_rs, fence_operands_72);
    };
    (@Bf16 160 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_bf16_ss_zero, m64n64k16_bf16_ss, fence_operands_32, m64n160k16_bf16_rs, fence_operands_80);
    };
    (@Bf16 176 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_bf16_ss_zero, m64n64k16_bf16_ss, fence_operands_32, m64n176k16_bf16_rs, fence_operands_88);
    };
    (@Bf16 192 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_bf16_ss_zero, m64n64k16_bf16_ss, fence_operands_32, m64n192k16_bf16_rs, fence_operands_96);
    };
    (@Bf16 208 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_bf16_ss_zero, m64n64k16_bf16_ss, fence_operands_32, m64n208k16_bf16_rs, fence_operands_104);
    };
    (@Bf16 224 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_bf16_ss_zero, m64n64k16_bf16_ss, fence_operands_32, m64n224k16_bf16_rs, fence_operands_112);
    };
    (@Bf16 240 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_bf16_ss_zero, m64n64k16_bf16_ss, fence_operands_32, m64n240k16_bf16_rs, fence_operands_120);
    };
    (@Bf16 256 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_bf16_ss_zero, m64n64k16_bf16_ss, fence_operands_32, m64n256k16_bf16_rs, fence_operands_128);
    };
    (@F16 144 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_f16_ss_zero, m64n64k16_f16_ss, fence_operands_32, m64n144k16_f16_rs, fence_operands_72);
    };
    (@F16 160 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_f16_ss_zero, m64n64k16_f16_ss, fence_operands_32, m64n160k16_f16_rs, fence_operands_80);
    };
    (@F16 176 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_f16_ss_zero, m64n64k16_f16_ss, fence_operands_32, m64n176k16_f16_rs, fence_operands_88);
    };
    (@F16 192 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_f16_ss_zero, m64n64k16_f16_ss, fence_operands_32, m64n192k16_f16_rs, fence_operands_96);
    };
    (@F16 208 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_f16_ss_zero, m64n64k16_f16_ss, fence_operands_32, m64n208k16_f16_rs, fence_operands_104);
    };
    (@F16 224 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_f16_ss_zero, m64n64k16_f16_ss, fence_operands_32, m64n224k16_f16_rs, fence_operands_112);
    };
    (@F16 240 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_f16_ss_zero, m64n64k16_f16_ss, fence_operands_32, m64n240k16_f16_rs, fence_operands_120);
    };
    (@F16 256 varlen => $($args:tt)*) => {
        hopper_kernel!($($args)*, m64n64k16_f16_ss_zero, m64n64k16_f16_ss, fence_operands_32, m64n256k16_f16_rs, fence_operands_128);
    };
    // Packed sequences up to D = 128: the dense kernels' shapes.
    (@$elem:ident $d:tt varlen => $($args:tt)*) => {
        hopper_shapes!(@$elem $d => $($args)*);
    };
}

/// The default entries for the head dimensions' tokens
/// ([`kernel_abi::with_attention_head_dims!`]): dense batches, softcap and sinks
/// (`kernel_abi::attention::LogitOptions`), packed sequences (`HopperParams::cu_seqlens_q`),
/// packed sequences with softcap and sinks.
macro_rules! default_kernels {
    ($($d:tt),*) => {
        $(
            hopper_default!(concat!("attention_fwd_hopper_bf16_d", $d), Bf16, $d, false, false);
            hopper_default!(concat!("attention_fwd_hopper_f16_d", $d), F16, $d, false, false);
            hopper_default!(concat!("attention_fwd_hopper_capsink_bf16_d", $d), Bf16, $d, true, false);
            hopper_default!(concat!("attention_fwd_hopper_capsink_f16_d", $d), F16, $d, true, false);
            hopper_default!(concat!("attention_fwd_hopper_varlen_bf16_d", $d), Bf16, $d, false, true);
            hopper_default!(concat!("attention_fwd_hopper_varlen_f16_d", $d), F16, $d, false, true);
            hopper_default!(
                concat!("attention_fwd_hopper_varlen_capsink_bf16_d", $d), Bf16, $d, true, true
            );
            hopper_default!(
                concat!("attention_fwd_hopper_varlen_capsink_f16_d", $d), F16, $d, true, true
            );
        )*
    };
}

kernel_abi::with_attention_head_dims!(default_kernels!());

// The head-dimension pairs of `kernel_abi::attention::VALUE_DIMS` (dense, packed): S =
// Q K^T over D = 192 in steps of 128 keys (`m64n128`), O += P V with N = D_v = 128.
macro_rules! value_dim_kernels {
    ($($name:expr, $elem:ident, $varlen:expr, $s_zero:ident, $s_mma:ident, $o_mma:ident;)*) => {
        $(
            hopper_kernel!(
                $name,
                $elem,
                kernel_abi::attention::hopper_value_config_of(192, 128),
                false,
                $varlen,
                $s_zero,
                $s_mma,
                fence_operands_64,
                $o_mma,
                fence_operands_64
            );
        )*
    };
}
value_dim_kernels!(
    "attention_fwd_hopper_bf16_d192_v128", Bf16, false,
        m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, m64n128k16_bf16_rs;
    "attention_fwd_hopper_f16_d192_v128", F16, false,
        m64n128k16_f16_ss_zero, m64n128k16_f16_ss, m64n128k16_f16_rs;
    "attention_fwd_hopper_varlen_bf16_d192_v128", Bf16, true,
        m64n128k16_bf16_ss_zero, m64n128k16_bf16_ss, m64n128k16_bf16_rs;
    "attention_fwd_hopper_varlen_f16_d192_v128", F16, true,
        m64n128k16_f16_ss_zero, m64n128k16_f16_ss, m64n128k16_f16_rs;
);

// Tuning variants (`kernel_abi::attention::HOPPER_VARIANTS`, in order), bf16.
hopper_kernel!(
    "attention_fwd_hopper_bf16_d128_hscaled",
    Bf16,
    HOPPER_VARIANTS[0].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n128k16_bf16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d128_hpp",
    Bf16,
    HOPPER_VARIANTS[1].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n128k16_bf16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d128_h176",
    Bf16,
    HOPPER_VARIANTS[2].1,
    m64n176k16_bf16_ss_zero,
    m64n176k16_bf16_ss,
    fence_operands_88,
    m64n128k16_bf16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d128_h3",
    Bf16,
    HOPPER_VARIANTS[3].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n128k16_bf16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d128_hnp",
    Bf16,
    HOPPER_VARIANTS[4].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n128k16_bf16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d128_hstatic",
    Bf16,
    HOPPER_VARIANTS[5].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n128k16_bf16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d128_hgrid3",
    Bf16,
    HOPPER_VARIANTS[6].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n128k16_bf16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d64_hpp64",
    Bf16,
    HOPPER_VARIANTS[7].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n64k16_bf16_rs,
    fence_operands_32
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d256_hpp256",
    Bf16,
    HOPPER_VARIANTS[8].1,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    fence_operands_32,
    m64n256k16_bf16_rs,
    fence_operands_128
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d256_hscaled256",
    Bf16,
    HOPPER_VARIANTS[9].1,
    m64n80k16_bf16_ss_zero,
    m64n80k16_bf16_ss,
    fence_operands_40,
    m64n256k16_bf16_rs,
    fence_operands_128
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d192_h64",
    Bf16,
    HOPPER_VARIANTS[10].1,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    fence_operands_32,
    m64n192k16_bf16_rs,
    fence_operands_96
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d256_h64",
    Bf16,
    HOPPER_VARIANTS[11].1,
    m64n64k16_bf16_ss_zero,
    m64n64k16_bf16_ss,
    fence_operands_32,
    m64n256k16_bf16_rs,
    fence_operands_128
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d64_hdyn",
    Bf16,
    HOPPER_VARIANTS[12].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n64k16_bf16_rs,
    fence_operands_32
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d128_hdyn",
    Bf16,
    HOPPER_VARIANTS[13].1,
    m64n128k16_bf16_ss_zero,
    m64n128k16_bf16_ss,
    fence_operands_64,
    m64n128k16_bf16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_bf16_d64_hn192",
    Bf16,
    HOPPER_VARIANTS[14].1,
    m64n192k16_bf16_ss_zero,
    m64n192k16_bf16_ss,
    fence_operands_96,
    m64n64k16_bf16_rs,
    fence_operands_32
);
// The f16 kernels of the variants the plan picks by the problem: the dynamic grid (short
// causal problems), the long key steps.
hopper_kernel!(
    "attention_fwd_hopper_f16_d64_hdyn",
    F16,
    HOPPER_VARIANTS[12].1,
    m64n128k16_f16_ss_zero,
    m64n128k16_f16_ss,
    fence_operands_64,
    m64n64k16_f16_rs,
    fence_operands_32
);
hopper_kernel!(
    "attention_fwd_hopper_f16_d128_hdyn",
    F16,
    HOPPER_VARIANTS[13].1,
    m64n128k16_f16_ss_zero,
    m64n128k16_f16_ss,
    fence_operands_64,
    m64n128k16_f16_rs,
    fence_operands_64
);
hopper_kernel!(
    "attention_fwd_hopper_f16_d64_hn192",
    F16,
    HOPPER_VARIANTS[14].1,
    m64n192k16_f16_ss_zero,
    m64n192k16_f16_ss,
    fence_operands_96,
    m64n64k16_f16_rs,
    fence_operands_32
);
