//! `cp.async` (sm_80+): asynchronous 16-byte copies from global to shared memory, tracked in
//! per-thread groups. A thread sees its copies' data after `wait_group`; other threads see it
//! only after a barrier that follows the writer's `wait_group`.

use core::arch::asm;

/// `cp.async.cg.shared.global [dst], [src], 16`: copy 16 bytes, bypassing L1.
///
/// # Safety
/// `dst` is a 16-byte aligned shared-window address of 16 writable bytes; `src` is a 16-byte
/// aligned pointer to 16 readable bytes of global memory.
#[inline(always)]
pub unsafe fn copy_16(dst: u32, src: *const u8) {
    // SAFETY: the caller guarantees both addresses (alignment, bounds).
    unsafe {
        asm!("cp.async.cg.shared.global [{0}], [{1}], 16;", in(reg32) dst, in(reg64) src,
             options(nostack))
    };
}

/// `cp.async.cg.shared.global [dst], [src], 16, src_bytes`: copy the first `src_bytes` (0..=16)
/// bytes of `src` and zero-fill the rest of the 16 at `dst`. With `src_bytes == 0` nothing is
/// read (use it for out-of-bounds rows, with any valid `src`).
///
/// # Safety
/// As for [`copy_16`] for `dst`; `src` is 16-byte aligned and its first `src_bytes` are readable.
#[inline(always)]
pub unsafe fn copy_16_zfill(dst: u32, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller guarantees both addresses and the readable prefix.
    unsafe {
        asm!("cp.async.cg.shared.global [{0}], [{1}], 16, {2};", in(reg32) dst, in(reg64) src,
             in(reg32) src_bytes, options(nostack))
    };
}

/// `cp.async.ca.shared.global [dst], [src], 4`: copy one 4-byte word (cached in L1), for rows
/// whose length is not a multiple of 16 bytes.
///
/// # Safety
/// `dst` is a 4-byte aligned shared-window address of 4 writable bytes; `src` is a 4-byte aligned
/// pointer to 4 readable bytes of global memory.
#[inline(always)]
pub unsafe fn copy_4(dst: u32, src: *const u8) {
    // SAFETY: the caller guarantees both addresses (alignment, bounds).
    unsafe {
        asm!("cp.async.ca.shared.global [{0}], [{1}], 4;", in(reg32) dst, in(reg64) src,
             options(nostack))
    };
}

/// `cp.async.commit_group`: close the group of this thread's copies issued since the last commit.
#[inline(always)]
pub fn commit_group() {
    // SAFETY: has no preconditions (an empty group is allowed).
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_group N`: wait until at most `N` of this thread's committed groups are pending.
#[inline(always)]
pub fn wait_group<const N: u32>() {
    // SAFETY: has no preconditions.
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) };
}

/// `cp.async.wait_all`: wait for all of this thread's copies.
#[inline(always)]
pub fn wait_all() {
    // SAFETY: has no preconditions.
    unsafe { asm!("cp.async.wait_all;", options(nostack)) };
}
