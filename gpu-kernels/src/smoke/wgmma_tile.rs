//! `smoke_wgmma_n{64,128,256}`: one 64 x N x 64 bf16 tile on `wgmma`, operands loaded by TMA
//! with 128-byte swizzle and read through K-major shared-memory descriptors.
//!
//! # Parameters
//! [`WgmmaTileParams`]: tensor maps of A `[64, 64]` and B `[N, 64]` (bf16, K contiguous, box the
//! whole matrix, 128B swizzle), `c [64, N]` f32 = `a b^T`.
//!
//! # Tiling
//! A at the 1024-aligned base, B after it (8 KiB later, 1024-aligned). The K extent (64) is one
//! swizzle row of 128 bytes; the four k16 slices are the descriptors advanced by 32 bytes.
//!
//! # Thread mapping
//! One warpgroup (128 threads) issues 4 `wgmma.m64nNk16` into one accumulator of N/2 registers
//! per thread; each thread then writes its accumulator elements (module `arch::wgmma` layout).
//!
//! # Barrier protocol
//! 1. Thread 0: `mbarrier.init(1)`, `fence.mbarrier_init`; `sync_threads` publishes it.
//! 2. Thread 0: `arrive_expect_tx(A + B bytes)`, TMA loads of A and B on that barrier.
//! 3. All threads: `wait_parity(0)`: both tiles have landed and are visible.
//! 4. `wgmma.fence`, 4 x `wgmma`, `commit_group`, `wait_group 0`: the products are complete and
//!    the accumulators final (pinned by `fence_operands`).
//! 5. `sync_threads`, thread 0 invalidates the barrier.

use crate::arch::wgmma::{self, Descriptor};
use crate::arch::{fence, index, mbarrier::Mbarrier, smem, sync};
use crate::tensor_map_ptr;
use kernel_abi::smoke::{
    WGMMA_K, WGMMA_M, WGMMA_MN_BAR_OFFSET, WGMMA_MN_BLOCK_BYTES, WGMMA_SMEM_B_OFFSET,
    WgmmaMnParams, WgmmaTileParams, wgmma_smem_bar_offset,
};

/// Load both tiles and wait for them (steps 1-3). Returns the shared addresses of A and B.
#[inline(always)]
fn load_tiles(
    tmap_a: crate::arch::tma::TensorMapPtr,
    tmap_b: crate::arch::tma::TensorMapPtr,
    n: u32,
) -> (u32, u32) {
    let tid = index::thread_idx_x();
    let base = smem::aligned_base();
    let (a_s, b_s) = (base, base + WGMMA_SMEM_B_OFFSET as u32);
    let bar = Mbarrier::at(base + wgmma_smem_bar_offset(n) as u32);
    if tid == 0 {
        // SAFETY: step 1, single initializer before any use.
        unsafe { bar.init(1) };
        fence::fence_mbarrier_init();
    }
    // SAFETY: all threads reach this barrier once.
    unsafe { sync::sync_threads() };
    if tid == 0 {
        let bytes = (WGMMA_M + n) * WGMMA_K * 2;
        // SAFETY: step 2: the barrier expects exactly both boxes' bytes; destinations are
        // 1024-aligned and sized by wgmma_smem_bytes(n), untouched until the phase completes.
        unsafe {
            bar.arrive_expect_tx(bytes);
            tmap_a.load_2d(a_s, 0, 0, bar);
            tmap_b.load_2d(b_s, 0, 0, bar);
        }
    }
    // SAFETY: step 3: phase 0 is completed by the copies above.
    unsafe { bar.wait_parity(0) };
    (a_s, b_s)
}

/// Write the accumulator of a 64 x N tile to `c` (row-major, N columns).
#[inline(always)]
fn store_acc<const R: usize>(acc: &[f32; R], c: *mut f32) {
    let n = 2 * R as u32;
    let lane = index::lane_id();
    let row = (index::warp_id() % 4) * 16 + lane / 4;
    for j in 0..R / 4 {
        let col = 8 * j as u32 + 2 * (lane % 4);
        for h in 0..2 {
            let idx = ((row + 8 * h as u32) * n + col) as usize;
            // SAFETY: row + 8 < 64 and col + 1 < n: inside `c` (launch contract).
            unsafe {
                *c.add(idx) = acc[4 * j + 2 * h];
                *c.add(idx + 1) = acc[4 * j + 2 * h + 1];
            }
        }
    }
}

/// Step 5.
#[inline(always)]
fn finish(n: u32) {
    // SAFETY: all threads reach this barrier once.
    unsafe { sync::sync_threads() };
    if index::thread_idx_x() == 0 {
        let bar = Mbarrier::at(smem::aligned_base() + wgmma_smem_bar_offset(n) as u32);
        // SAFETY: nobody uses the barrier after the barrier above.
        unsafe { bar.inval() };
    }
}

macro_rules! wgmma_smoke {
    ($kernel:ident, $n:literal, $regs:literal, $mma:ident, $fence_ops:ident) => {
        /// See the module documentation (N =
        #[doc = stringify!($n)]
        /// ).
        ///
        /// # Safety
        /// One block of `WGMMA_THREADS` threads, `wgmma_smem_bytes(N)` of dynamic shared memory,
        /// valid tensor maps as documented, `c` holding 64 x N f32.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $kernel(p: WgmmaTileParams) {
            crate::launch_bounds!($kernel in kernel_abi::smoke::KERNELS);
            let tmap_a = tensor_map_ptr!($kernel, 0, WgmmaTileParams, tmap_a);
            let tmap_b = tensor_map_ptr!($kernel, 0, WgmmaTileParams, tmap_b);
            let (a_s, b_s) = load_tiles(tmap_a, tmap_b, $n);
            let mut acc = [0.0f32; $regs];
            // SAFETY: step 4, whole warpgroup in uniform control flow; the operands were
            // published by the completed mbarrier phase and stay until the kernel ends.
            unsafe {
                wgmma::fence();
                for k in 0..WGMMA_K / 16 {
                    let da = Descriptor::k_major_sw128(a_s + 32 * k);
                    let db = Descriptor::k_major_sw128(b_s + 32 * k);
                    wgmma::$mma::<0, 0, true>(&mut acc, da, db);
                }
                wgmma::commit_group();
                wgmma::wait_group::<0>();
            }
            wgmma::$fence_ops(&mut acc);
            store_acc(&acc, p.c);
            finish($n);
        }
    };
}

wgmma_smoke!(
    smoke_wgmma_n64,
    64,
    32,
    m64n64k16_bf16_ss,
    fence_operands_32
);
wgmma_smoke!(
    smoke_wgmma_n128,
    128,
    64,
    m64n128k16_bf16_ss,
    fence_operands_64
);
wgmma_smoke!(
    smoke_wgmma_n256,
    256,
    128,
    m64n256k16_bf16_ss,
    fence_operands_128
);

/// `smoke_wgmma_mn`: `c [64, 128] = a [64, 64] b [64, 128]` with B **MN-major** (row-major
/// `[k, n]`, N contiguous), loaded by TMA as two 128B-swizzled column blocks and read with
/// `trans-b = 1` through [`Descriptor::mn_major_sw128`].
///
/// Barrier protocol: as the module's, with three loads (A and the two column blocks of B) on
/// the one mbarrier phase.
///
/// # Safety
/// One block of `WGMMA_THREADS` threads, `wgmma_mn_smem_bytes()` of dynamic shared memory,
/// valid tensor maps as documented, `c` holding 64 x 128 f32.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_wgmma_mn(p: WgmmaMnParams) {
    crate::launch_bounds!(smoke_wgmma_mn in kernel_abi::smoke::KERNELS);
    let tmap_a = tensor_map_ptr!(smoke_wgmma_mn, 0, WgmmaMnParams, tmap_a);
    let tmap_b = tensor_map_ptr!(smoke_wgmma_mn, 0, WgmmaMnParams, tmap_b);
    let tid = index::thread_idx_x();
    let base = smem::aligned_base();
    let (a_s, b_s) = (base, base + WGMMA_SMEM_B_OFFSET as u32);
    let bar = Mbarrier::at(base + WGMMA_MN_BAR_OFFSET as u32);
    if tid == 0 {
        // SAFETY: single initializer before any use.
        unsafe { bar.init(1) };
        fence::fence_mbarrier_init();
    }
    // SAFETY: all threads reach this barrier once.
    unsafe { sync::sync_threads() };
    if tid == 0 {
        let bytes = WGMMA_M * WGMMA_K * 2 + 2 * WGMMA_MN_BLOCK_BYTES;
        // SAFETY: the barrier expects exactly the three boxes' bytes; destinations are
        // 1024-aligned and sized by wgmma_mn_smem_bytes(); column coordinates 0 and 64 are
        // multiples of 16 bytes.
        unsafe {
            bar.arrive_expect_tx(bytes);
            tmap_a.load_2d(a_s, 0, 0, bar);
            tmap_b.load_2d(b_s, 0, 0, bar);
            tmap_b.load_2d(b_s + WGMMA_MN_BLOCK_BYTES, 64, 0, bar);
        }
    }
    // SAFETY: phase 0 is completed by the copies above.
    unsafe { bar.wait_parity(0) };
    let mut acc = [0.0f32; 64];
    // SAFETY: whole warpgroup, uniform control flow; operands published by the phase.
    unsafe {
        wgmma::fence();
        for k in 0..WGMMA_K / 16 {
            let da = Descriptor::k_major_sw128(a_s + 32 * k);
            let db = Descriptor::mn_major_sw128(b_s + 2048 * k, WGMMA_MN_BLOCK_BYTES);
            wgmma::m64n128k16_bf16_ss::<0, 1, true>(&mut acc, da, db);
        }
        wgmma::commit_group();
        wgmma::wait_group::<0>();
    }
    wgmma::fence_operands_64(&mut acc);
    store_acc(&acc, p.c);
    // SAFETY: all threads reach this barrier once.
    unsafe { sync::sync_threads() };
    if tid == 0 {
        // SAFETY: nobody uses the barrier after the barrier above.
        unsafe { bar.inval() };
    }
}
