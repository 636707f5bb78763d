//! Atomic read-modify-write on global memory.

use core::arch::asm;

/// `atom.global.add.u32`: add `v` to `*ptr` atomically, returning the old value.
///
/// # Safety
/// `ptr` is a valid, 4-byte aligned pointer to global memory.
#[inline(always)]
pub unsafe fn add_u32(ptr: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr` is a valid global address.
    unsafe {
        asm!("atom.global.add.u32 {0}, [{1}], {2};", out(reg32) old, in(reg64) ptr, in(reg32) v,
             options(nostack))
    };
    old
}
