//! Block-level barriers (`bar.sync`, named barriers) and warp synchronization.
//!
//! These use LLVM's NVVM barrier intrinsics (convergent to the optimizer), never inline asm.
//! Barrier 0 is the one `sync_threads` uses; named barriers take ids 1..=15, and the thread
//! count of a named barrier is a multiple of 32 (whole warps).
//!
//! Memory ordering: a completed barrier orders the shared and global memory accesses that the
//! participating threads made before it before those they make after it (the PTX memory model's
//! `bar.sync` semantics). `arrive` publishes the arriving threads' earlier accesses to the
//! threads that `sync` on the same barrier, but does not wait.

unsafe extern "C" {
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.all"]
    fn barrier_sync_all(id: u32);
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.count"]
    fn barrier_sync_count(id: u32, threads: u32);
    #[link_name = "llvm.nvvm.barrier.cta.arrive.aligned.count"]
    fn barrier_arrive_count(id: u32, threads: u32);
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn bar_warp_sync(mask: u32);
    #[link_name = "llvm.nvvm.barrier.cta.red.or.aligned.all"]
    fn barrier_red_or_all(id: u32, pred: bool) -> bool;
}

/// The highest named-barrier id (the hardware has 16, id 0 included).
pub const MAX_BARRIER_ID: u32 = 15;

/// `bar.sync 0`: wait until every thread of the block has arrived (`__syncthreads`).
///
/// # Safety
/// Every thread of the block reaches this call the same number of times, in warp-uniform
/// control flow; otherwise the block deadlocks or the behaviour is undefined.
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: forwarded to the caller (all threads, uniform control flow).
    unsafe { barrier_sync_all(0) }
}

/// `bar.red.or.pred 0`: [`sync_threads`] that also returns whether `pred` is true in any thread
/// of the block (`__syncthreads_or`).
///
/// # Safety
/// As for [`sync_threads`] (it is the same barrier 0).
#[inline(always)]
pub unsafe fn sync_threads_or(pred: bool) -> bool {
    // SAFETY: forwarded to the caller (all threads, uniform control flow).
    unsafe { barrier_red_or_all(0, pred) }
}

/// `bar.sync id, threads`: wait until `threads` threads (this one included) have arrived at
/// named barrier `id` by `sync` or [`named_arrive`].
///
/// # Safety
/// `1 <= id <= 15`, `threads` is a multiple of 32, whole warps call it in uniform control flow,
/// and exactly `threads` threads arrive at `id` per phase (else deadlock).
#[inline(always)]
pub unsafe fn named_sync(id: u32, threads: u32) {
    // SAFETY: forwarded to the caller (valid id and count, matched arrivals).
    unsafe { barrier_sync_count(id, threads) }
}

/// `bar.arrive id, threads`: count this thread's arrival at named barrier `id` and go on.
///
/// # Safety
/// As for [`named_sync`]; the arriving threads must not be among those that `sync` on the same
/// phase.
#[inline(always)]
pub unsafe fn named_arrive(id: u32, threads: u32) {
    // SAFETY: forwarded to the caller (valid id and count, matched arrivals).
    unsafe { barrier_arrive_count(id, threads) }
}

/// `bar.warp.sync mask`: reconverge the lanes of `mask` and order their memory accesses.
///
/// # Safety
/// Every lane named in `mask` executes a `sync_warp` with the same mask.
#[inline(always)]
pub unsafe fn sync_warp(mask: u32) {
    // SAFETY: forwarded to the caller (all lanes of mask participate).
    unsafe { bar_warp_sync(mask) }
}
