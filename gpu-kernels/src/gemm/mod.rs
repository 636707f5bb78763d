//! `gemm_bf16_tn`: `C = A B^T` in bf16 with f32 accumulation on Hopper (TMA, mbarrier ring,
//! `wgmma`, warp specialization).
//!
//! # Parameters
//! [`GemmParams`]: tensor maps of A `[M, K]` and B `[N, K]` (bf16, K contiguous, boxes
//! `[BM, BK]` and `[BN, BK]`, 128-byte swizzle), C `[M, N]` bf16 with row stride `ldc`, and the
//! sizes. `N` and `K` are multiples of 8; `M` is any. Out-of-bounds rows and K columns of a box
//! load as zero (TMA), so partial tiles need no special path; C is written under bounds checks.
//!
//! # Tiling
//! One block computes a `BM x BN` = 128 x 256 tile of C, walking K in `BK` = 64 steps through a
//! `STAGES`-deep ring of shared-memory stages (A 16 KiB + B 32 KiB each). A stage's K extent is
//! one 128-byte swizzle row, so the four k16 slices are the stage's descriptors advanced by 32
//! bytes. Blocks take tiles in grouped order (`kernel_abi::gemm::tile_of_block`).
//!
//! # Thread mapping
//! 384 threads. Warpgroup 0 is the producer: it drops to `PRODUCER_REGS` registers and its
//! thread 0 issues the TMA loads. Warpgroups 1 and 2 are consumers (`CONSUMER_REGS` registers):
//! consumer `c` owns rows `64 c .. 64 c + 64` of the tile and issues `wgmma.m64n256k16` into 128
//! f32 accumulators per thread (layout in `arch::wgmma`), then converts and stores them.
//!
//! # Barrier protocol
//! - Start: thread 0 initializes `full[s]` (count 1) and `empty[s]` (count `CONSUMER_WARPS`),
//!   `fence.mbarrier_init`, then `sync_threads` publishes them. No other block-wide barrier
//!   follows (the warpgroups never meet again).
//! - `full[s]`: the producer waits until `empty[s]` completed the previous use of the stage
//!   (parity `phase ^ 1`, which passes at once on the first pass), arrives with
//!   `expect_tx(STAGE_BYTES)` and issues the two loads on `full[s]`; the phase completes when the
//!   bytes land. Consumers wait on `full[s]` with the stage's parity before reading it.
//! - `empty[s]`: after issuing the products of k-step `i`, a consumer waits for at most one
//!   outstanding `wgmma` group (`wait_group 1`), so the products of step `i - 1` are complete
//!   and their stage is no longer read; lane 0 of each consumer warp then arrives on that
//!   stage's `empty` (8 arrivals per phase).
//! - End: consumers `wait_group 0` before reading the accumulators.

use crate::arch::mbarrier::{Mbarrier, RingPos};
use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{convert, fence, index, regs, smem, sync};
use crate::tensor_map_ptr;
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gemm::{
    BARRIERS_OFFSET, BK, BM, BN, CONSUMER_REGS, CONSUMERS, GemmParams, PRODUCER_REGS, STAGE_BYTES,
    STAGES, a_offset, b_offset, tile_of_block,
};

type Pos = RingPos<STAGES>;

/// Warps that arrive on an `empty` barrier per phase (every consumer warp once).
const CONSUMER_WARPS: u32 = CONSUMERS * WARPGROUP_SIZE / 32;

/// Rows of A one consumer warpgroup multiplies.
const WG_ROWS: u32 = BM / CONSUMERS;

/// Accumulator registers per consumer thread (64 x 256 f32 over 128 threads).
const ACC: usize = (WG_ROWS * BN / WARPGROUP_SIZE) as usize;

/// See the module documentation.
///
/// # Safety
/// Grid of `grid_blocks(m, n)` blocks of `THREADS` threads, `smem_bytes()` of dynamic shared
/// memory; valid tensor maps over A and B as documented; C holds `m` rows of `ldc >= n`
/// elements.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gemm_bf16_tn(p: GemmParams) {
    crate::launch_bounds!(gemm_bf16_tn in kernel_abi::gemm::KERNELS);
    let tmap_a = tensor_map_ptr!(gemm_bf16_tn, 0, GemmParams, tmap_a);
    let tmap_b = tensor_map_ptr!(gemm_bf16_tn, 0, GemmParams, tmap_b);
    let tid = index::thread_idx_x();
    let wg = index::warpgroup_id();
    let base = smem::aligned_base();
    let full = |s: u32| Mbarrier::at(base + BARRIERS_OFFSET as u32 + 8 * s);
    let empty = |s: u32| Mbarrier::at(base + BARRIERS_OFFSET as u32 + 8 * (STAGES + s));
    let (tile_m, tile_n) = tile_of_block(index::block_idx_x(), p.m, p.n);
    let k_steps = p.k.div_ceil(BK);

    if tid == 0 {
        tmap_a.prefetch();
        tmap_b.prefetch();
        for s in 0..STAGES {
            // SAFETY: single initializer before any use; published by the barrier below.
            unsafe {
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
        unsafe { regs::decrease::<PRODUCER_REGS>() };
        if tid == 0 {
            let mut pos = Pos::of(0);
            for i in 0..k_steps {
                let kx = (i * BK) as i32;
                // SAFETY: ring protocol (module docs): the stage is free once `empty` completed
                // its previous phase; `full` expects exactly the two boxes' bytes (out-of-bounds
                // parts count: TMA always delivers whole boxes); destinations are 1024-aligned
                // stage buffers sized by the ABI, untouched until the phase completes. kx is a
                // multiple of 64 elements (128 bytes), as TMA requires.
                unsafe {
                    empty(pos.stage).wait_parity(pos.phase ^ 1);
                    full(pos.stage).arrive_expect_tx(STAGE_BYTES);
                    tmap_a.load_2d(
                        base + a_offset(pos.stage) as u32,
                        kx,
                        (tile_m * BM) as i32,
                        full(pos.stage),
                    );
                    tmap_b.load_2d(
                        base + b_offset(pos.stage) as u32,
                        kx,
                        (tile_n * BN) as i32,
                        full(pos.stage),
                    );
                }
                pos = pos.next();
            }
        }
    } else {
        // SAFETY: the whole consumer warpgroup executes this, uniformly.
        unsafe { regs::increase::<CONSUMER_REGS>() };
        let c = wg - 1;
        let lane = index::lane_id();
        let mut acc = [0.0f32; ACC];
        let mut pos = Pos::of(0);
        let mut prev = pos;
        for i in 0..k_steps {
            // SAFETY: the producer issues every k-step, so this phase completes.
            unsafe { full(pos.stage).wait_parity(pos.phase) };
            let a =
                Descriptor::k_major_sw128(base + a_offset(pos.stage) as u32 + c * WG_ROWS * 128);
            let b = Descriptor::k_major_sw128(base + b_offset(pos.stage) as u32);
            // SAFETY: whole warpgroup, uniform control flow; the stage was published by the
            // completed `full` phase and is not released before `wait_group` retires these.
            unsafe {
                wgmma::fence();
                for k in 0..BK / 16 {
                    // `acc` starts at zero (set before the loop, outside any wgmma batch).
                    wgmma::m64n256k16_bf16_ss::<0, 0, true>(
                        &mut acc,
                        a.offset(32 * k),
                        b.offset(32 * k),
                    );
                }
                wgmma::commit_group();
                wgmma::wait_group::<1>();
            }
            if i > 0 && lane == 0 {
                // SAFETY: `wait_group 1` retired the products of step i - 1, the last reads of
                // `prev`; one arrival per consumer warp and phase.
                unsafe { empty(prev.stage).arrive() };
            }
            prev = pos;
            pos = pos.next();
        }
        // SAFETY: whole warpgroup, uniform control flow.
        unsafe { wgmma::wait_group::<0>() };
        wgmma::fence_operands_128(&mut acc);
        store_tile(&acc, &p, tile_m * BM + c * WG_ROWS, tile_n * BN, lane);
    }
}

/// Convert one consumer's 64 x 256 accumulator to bf16 and store it at `(row0, col0)` of C,
/// skipping rows and columns outside `m x n` (`n` is even, so column pairs are all in or out).
#[inline(always)]
fn store_tile(acc: &[f32; ACC], p: &GemmParams, row0: u32, col0: u32, lane: u32) {
    let warp_in_wg = index::warp_id() % 4;
    let row = row0 + warp_in_wg * 16 + lane / 4;
    for j in 0..ACC / 4 {
        let col = col0 + 8 * j as u32 + 2 * (lane % 4);
        if col >= p.n {
            continue;
        }
        for h in 0..2 {
            let r = row + 8 * h as u32;
            if r < p.m {
                let v = convert::pack_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
                let idx = r as usize * p.ldc as usize + col as usize;
                // SAFETY: r < m and col + 1 < n <= ldc: inside C; idx is even (ldc and col are
                // even), so the u32 store is 4-byte aligned.
                unsafe { *(p.c.add(idx) as *mut u32) = v };
            }
        }
    }
}
