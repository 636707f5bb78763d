//! `smoke_mma_tile`: one 64x64x64 bf16 GEMM tile with `cp.async`, `ldmatrix` and `mma.sync`.
//!
//! # Parameters
//! [`MmaTileParams`]: `a [64, 64]`, `b [64, 64]` bf16 (row-major, K contiguous), `c [64, 64]` f32;
//! computes `c = a b^T`.
//!
//! # Tiling
//! A and B are staged in shared memory with a padded row stride of `MMA_SMEM_STRIDE` elements
//! (144 bytes), so the 8 rows an `ldmatrix` phase reads fall into distinct 16-byte bank groups.
//!
//! # Thread mapping
//! 4 warps; warp `w` computes rows `16w..16w+16` and all 64 columns: 8 `m16n8` accumulators,
//! 4 k16 steps. Loads: 1024 16-byte chunks (512 per operand), 8 per thread.
//!
//! # Barrier protocol
//! 1. Every thread issues its `cp.async` copies, commits, and waits for its own group.
//! 2. `sync_threads`: every thread's copies are complete and visible to all (each thread's wait
//!    precedes its arrival).
//! 3. `ldmatrix`/`mma.sync` read shared memory only; results go to global memory. Nothing is
//!    written to shared memory after step 2, so no further barrier is needed.

use crate::arch::{cp_async, index, ldmatrix, mma, smem, sync};
use kernel_abi::smoke::{MMA_SMEM_B_OFFSET, MMA_SMEM_STRIDE, MMA_THREADS, MMA_TILE, MmaTileParams};

/// See the module documentation.
///
/// # Safety
/// Launched with one block of `MMA_THREADS` threads and `mma_smem_bytes()` of dynamic shared
/// memory; the pointers hold the documented tiles, 16-byte aligned.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_mma_tile(p: MmaTileParams) {
    crate::launch_bounds!(smoke_mma_tile in kernel_abi::smoke::KERNELS);
    let tid = index::thread_idx_x();
    let lane = index::lane_id();
    let warp = index::warp_id();
    let base = smem::aligned_base();
    let a_s = base;
    let b_s = base + MMA_SMEM_B_OFFSET as u32;

    // Step 1: 64 rows x 8 chunks of 16 bytes per operand.
    const CHUNKS_PER_ROW: u32 = MMA_TILE * 2 / 16;
    let mut c = tid;
    while c < MMA_TILE * CHUNKS_PER_ROW {
        let (row, chunk) = (c / CHUNKS_PER_ROW, c % CHUNKS_PER_ROW);
        let src = (row * MMA_TILE + chunk * 8) as usize;
        let dst = (row * MMA_SMEM_STRIDE + chunk * 8) * 2;
        // SAFETY: src is inside the 64x64 tiles (row < 64, chunk < 8); dst inside the padded
        // smem tiles; both 16-byte aligned (tiles 16-byte aligned, offsets multiples of 16).
        unsafe {
            cp_async::copy_16(a_s + dst, p.a.add(src) as *const u8);
            cp_async::copy_16(b_s + dst, p.b.add(src) as *const u8);
        }
        c += MMA_THREADS;
    }
    cp_async::commit_group();
    cp_async::wait_group::<0>();
    // SAFETY: every thread reaches this barrier once (step 2).
    unsafe { sync::sync_threads() };

    let mut acc = [[0.0f32; 4]; 8];
    let row0 = warp * 16;
    for k in 0..MMA_TILE / 16 {
        // A fragment: lane supplies row (lane % 16), column block (lane / 16) of the 16x16 tile.
        let a_addr = a_s + ((row0 + lane % 16) * MMA_SMEM_STRIDE + k * 16 + (lane / 16) * 8) * 2;
        // SAFETY: whole warp, uniform control flow; rows published by the barrier.
        let a = unsafe { ldmatrix::x4(a_addr) };
        for j in 0..4u32 {
            // B fragments of n-tiles 2j and 2j+1: n = lane % 8 + 8 (lane / 16), k block (lane / 8) % 2.
            let n = j * 16 + lane % 8 + (lane / 16) * 8;
            let b_addr = b_s + (n * MMA_SMEM_STRIDE + k * 16 + ((lane / 8) % 2) * 8) * 2;
            // SAFETY: whole warp, uniform control flow; rows published by the barrier.
            let b = unsafe { ldmatrix::x4(b_addr) };
            // SAFETY: whole warp, uniform control flow.
            unsafe {
                mma::m16n8k16_bf16(&mut acc[2 * j as usize], a, [b[0], b[1]]);
                mma::m16n8k16_bf16(&mut acc[2 * j as usize + 1], a, [b[2], b[3]]);
            }
        }
    }

    let (g, t) = (lane / 4, lane % 4);
    for j in 0..8 {
        let col = j as u32 * 8 + 2 * t;
        for h in 0..2 {
            let idx = ((row0 + g + 8 * h as u32) * MMA_TILE + col) as usize;
            // SAFETY: row < 64 and col + 1 < 64: inside the 64x64 output tile.
            unsafe {
                *p.c.add(idx) = acc[j][2 * h];
                *p.c.add(idx + 1) = acc[j][2 * h + 1];
            }
        }
    }
}
