//! `smoke_tma_load`: one 2D TMA box into shared memory, completing on an mbarrier.
//!
//! # Parameters
//! [`TmaLoadParams`]: a bf16 tensor map with box `[TMA_BOX_ROWS, TMA_BOX_COLS]` (any swizzle),
//! box coordinates `(x, y)`, and `out`, which receives the shared-memory bytes of the box as they
//! lie there (so the host can check the swizzle pattern and the zero fill out of bounds).
//!
//! # Thread mapping
//! One block of `TMA_THREADS`; thread 0 initializes the barrier and issues the copy; all threads
//! wait on the barrier and copy `TMA_BOX_BYTES / 16` 16-byte chunks out, strided.
//!
//! # Barrier protocol
//! 1. Thread 0: `mbarrier.init(count = 1)`, `fence.mbarrier_init`.
//! 2. `sync_threads`: the initialized barrier is visible to all threads.
//! 3. Thread 0: `arrive_expect_tx(TMA_BOX_BYTES)` then the TMA load, which completes the phase
//!    when its bytes land (`complete_tx`).
//! 4. All threads: `wait_parity(0)`: the phase is complete, so the box is visible to them
//!    (acquire), and they read it.
//! 5. `sync_threads`, then thread 0 invalidates the barrier (nobody uses it afterwards).

use crate::arch::{fence, index, mbarrier::Mbarrier, smem, sync};
use crate::tensor_map_ptr;
use kernel_abi::smoke::{TMA_BOX_BYTES, TMA_SMEM_BAR_OFFSET, TMA_THREADS, TmaLoadParams};

/// See the module documentation.
///
/// # Safety
/// One block of `TMA_THREADS` threads, `tma_smem_bytes()` of dynamic shared memory; `out` holds
/// `TMA_BOX_BYTES` bytes; the tensor map is valid and its box matches the constants.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_tma_load(p: TmaLoadParams) {
    crate::launch_bounds!(smoke_tma_load in kernel_abi::smoke::KERNELS);
    let tmap = tensor_map_ptr!(smoke_tma_load, 0, TmaLoadParams, tmap);
    let tid = index::thread_idx_x();
    let base = smem::aligned_base();
    let bar = Mbarrier::at(base + TMA_SMEM_BAR_OFFSET as u32);

    if tid == 0 {
        tmap.prefetch();
        // SAFETY: step 1, one initializing thread before any use.
        unsafe { bar.init(1) };
        fence::fence_mbarrier_init();
    }
    // SAFETY: all threads reach this barrier once (step 2).
    unsafe { sync::sync_threads() };
    if tid == 0 {
        // SAFETY: step 3: the barrier expects exactly the box's bytes; the destination is the
        // 1024-aligned base, which holds TMA_BOX_BYTES, untouched until the phase completes.
        unsafe {
            bar.arrive_expect_tx(TMA_BOX_BYTES);
            tmap.load_2d(base, p.x, p.y, bar);
        }
    }
    // SAFETY: step 4: the barrier is initialized and thread 0's copy completes phase 0.
    unsafe { bar.wait_parity(0) };

    let out = p.out as *mut [u32; 4];
    let mut c = tid;
    while c < TMA_BOX_BYTES / 16 {
        // SAFETY: chunk c < TMA_BOX_BYTES / 16 lies inside the box (shared) and inside `out`
        // (launch contract); the box was published by the completed phase.
        unsafe {
            let v = <[u32; 4] as smem::SmemValue>::load(base + 16 * c);
            *out.add(c as usize) = v;
        }
        c += TMA_THREADS;
    }
    // SAFETY: all threads reach this barrier once (step 5).
    unsafe { sync::sync_threads() };
    if tid == 0 {
        // SAFETY: no thread uses the barrier after the barrier above.
        unsafe { bar.inval() };
    }
}
