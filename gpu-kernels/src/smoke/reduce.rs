//! `smoke_block_reduce`: a block reduction through warp shuffles, shared memory and `bar.sync`.
//!
//! # Parameters
//! [`ReduceParams`]: `input [n]` f32, `partial [gridDim.x]` f32, `n`.
//!
//! # Thread mapping
//! `REDUCE_THREADS` threads per block, one-dimensional grid. Thread `t` of block `b` sums
//! `input[i]` for `i = b * REDUCE_THREADS + t + k * gridDim.x * REDUCE_THREADS` (grid-stride),
//! then the warp sums by butterfly shuffles.
//!
//! # Barrier protocol
//! 1. Lane 0 of warp `w` stores the warp's sum to `sums[w]` (shared).
//! 2. `sync_threads` (barrier 0, all threads): the stores of step 1 are visible to every thread.
//! 3. Warp 0 loads all `sums`, reduces them by shuffles, and lane 0 writes `partial[b]`.
//!
//! No shared word is written after step 1, so one barrier suffices.

use crate::arch::{index, smem, sync, warp};
use kernel_abi::WARP_SIZE;
use kernel_abi::smoke::{REDUCE_THREADS, ReduceParams};

/// See the module documentation.
///
/// # Safety
/// Launched with `REDUCE_THREADS` threads per block and `reduce_smem_bytes()` of dynamic shared
/// memory; `input` holds `n` f32 and `partial` `gridDim.x` f32.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_block_reduce(p: ReduceParams) {
    crate::launch_bounds!(smoke_block_reduce in kernel_abi::smoke::KERNELS);
    // SAFETY: forwarded to the caller.
    unsafe { block_reduce::<true>(p) }
}

/// The body of `smoke_block_reduce`. `BARRIER = false` leaves out the barrier of step 2: the
/// negative control `negative_block_reduce_no_barrier` (`crate::negative`), never launched by
/// the library.
///
/// # Safety
/// As for `smoke_block_reduce`.
#[inline(always)]
pub(crate) unsafe fn block_reduce<const BARRIER: bool>(p: ReduceParams) {
    let tid = index::thread_idx_x();
    let lane = index::lane_id();
    let wid = index::warp_id();
    let stride = index::grid_dim_x() * REDUCE_THREADS;

    let mut acc = 0.0f32;
    let mut i = index::block_idx_x() * REDUCE_THREADS + tid;
    while i < p.n {
        // SAFETY: i < n, and `input` holds n values (launch contract).
        acc += unsafe { *p.input.add(i as usize) };
        i += stride;
    }
    // SAFETY: every lane of every warp reaches this point (no early exit above).
    acc = unsafe { warp::sum_f32(acc) };

    let sums = smem::SmemArray::<f32>::new(smem::aligned_base(), REDUCE_THREADS / WARP_SIZE);
    if lane == 0 {
        // SAFETY: wid < REDUCE_THREADS / 32 = sums.len(); each warp writes its own word.
        unsafe { sums.store(wid, acc) };
    }
    if BARRIER {
        // SAFETY: all threads of the block reach this barrier once, in uniform control flow.
        unsafe { sync::sync_threads() };
    }
    if wid == 0 {
        let v = if lane < sums.len() {
            // SAFETY: lane < len; the stores were published by the barrier above.
            unsafe { sums.load(lane) }
        } else {
            0.0
        };
        // SAFETY: all 32 lanes of warp 0 execute this.
        let total = unsafe { warp::sum_f32(v) };
        if lane == 0 {
            // SAFETY: block_idx < gridDim.x = length of `partial` (launch contract).
            unsafe { *p.partial.add(index::block_idx_x() as usize) = total };
        }
    }
}

/// The block reduction and its negative control, for the CPU emulator (`crate::emu`).
#[cfg(not(target_arch = "nvptx64"))]
pub const EMU_KERNELS: &[crate::emu::EmuKernel] = &[
    crate::emu::EmuKernel {
        name: "smoke_block_reduce",
        params: core::mem::size_of::<ReduceParams>(),
        threads: REDUCE_THREADS,
        run: {
            unsafe fn run(p: *const u8) {
                // SAFETY: the emulator passes a parameter struct of this kernel's type (it
                // checks the size), whose contract the caller upholds.
                unsafe { block_reduce::<true>(core::ptr::read_unaligned(p as *const ReduceParams)) }
            }
            run
        },
    },
    crate::emu::EmuKernel {
        name: "negative_block_reduce_no_barrier",
        params: core::mem::size_of::<ReduceParams>(),
        threads: REDUCE_THREADS,
        run: {
            unsafe fn run(p: *const u8) {
                // SAFETY: as above.
                unsafe {
                    block_reduce::<false>(core::ptr::read_unaligned(p as *const ReduceParams))
                }
            }
            run
        },
    },
];
