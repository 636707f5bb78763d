//! Register reallocation between warpgroups (`setmaxnreg`, sm_90a).
//!
//! Takes effect only in a kernel with a register cap at entry: declare its launch bounds with
//! [`crate::launch_bounds!`] (the PTX builder writes `.maxntid`/`.minnctapersm`). Counts are
//! multiples of 8 in 24..=256; every warp of a warpgroup executes the same call.

use core::arch::asm;

/// `setmaxnreg.inc.sync.aligned.u32 N`: raise this warpgroup's per-thread register limit to `N`
/// (waits until registers are free).
///
/// # Safety
/// All warps of the warpgroup execute it in uniform control flow; `N` is a multiple of 8 in
/// 24..=256 and the block's total stays within the register file.
#[inline(always)]
pub unsafe fn increase<const N: u32>() {
    // SAFETY: forwarded to the caller (whole warpgroup, valid count).
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: lower this warpgroup's per-thread register limit to `N`,
/// releasing the rest to the block's pool.
///
/// # Safety
/// As for [`increase`].
#[inline(always)]
pub unsafe fn decrease<const N: u32>() {
    // SAFETY: forwarded to the caller (whole warpgroup, valid count).
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}

/// `x`, through an instruction the compiler cannot see through: values derived from the result
/// are computed where they are used instead of being hoisted out of a loop and kept in
/// registers across it (e.g. the `wgmma` descriptors of a loop-invariant tile, when registers
/// are short).
#[inline(always)]
pub fn opaque(x: u32) -> u32 {
    let mut x = x;
    // SAFETY: a register move; no memory, no other effect.
    unsafe { asm!("mov.b32 {0}, {0};", inout(reg32) x, options(pure, nomem, nostack)) };
    x
}
